"""`--param` is checked against the chapter's Params (each field's type and check, in the chapter's
declaration.py) before anything runs, into the overrides its notebook receives; each problem is one
line naming the parameter."""

import json
import os
import subprocess
import sys

import pytest

from labsupport import chapters
from labsupport.ops import params

from .conftest import REPO, tree_bytes

pytestmark = pytest.mark.unit

TOKEN = chapters.by_slug("kernels-in-one-token")


def resolve(*pairs, names=("kernels-in-one-token",)):
    return params.resolve(chapters.find(list(names)), params.parse_cli(list(pairs)))


def test_every_default_smoke_and_cpu_value_passes_its_check():
    for ch in chapters.CHAPTERS:
        # The defaults, the smoke values and the CPU values all pass the fields' checks.
        assert params.for_chapter(ch, ch.defaults) == ch.defaults
        params.for_chapter(ch, {**ch.smoke, **ch.cpu})


def test_an_unknown_override_in_a_notebook_is_one_line_naming_the_parameters():
    """What papermill hands a notebook goes to ch.Params(**overrides): a name it has no field for
    stops there in one line naming the fields, not in a bare "unexpected keyword argument"."""
    from labsupport.chapters import launch_overhead

    with pytest.raises(TypeError) as e:
        launch_overhead.Params(repeat=3)
    assert str(e.value) == (
        "'repeat' is not a parameter of launch-overhead "
        "(parameters: preset, model, prompt_len, dtype, repeats, max_autotune, device)"
    )


def numeric(default) -> bool:
    """A number, or a list of numbers (the defaults whose size the checks must bound)."""
    values = default if isinstance(default, list) else [default]
    return bool(values) and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)


@pytest.mark.parametrize("ch", chapters.CHAPTERS, ids=lambda c: c.slug)
def test_every_numeric_parameter_has_a_check_with_an_upper_bound(ch):
    """Every number a chapter takes (or list of numbers) has a declared check with a finite upper
    bound: the bound passes, one above it is one ParamError line, and so is NaN; no rule is of a
    kind check_rule does not know."""
    for name, rule in ch.checks.items():
        assert rule.kind in ("between", "each_between", "one_of", "subset_of", "preset", "model_folder"), (name, rule)
    for name, default in ch.defaults.items():
        if not numeric(default):
            continue
        rule = ch.checks.get(name)
        assert rule is not None and rule.kind in ("between", "each_between"), f"{ch.slug}: {name} has no bounds"
        lo, hi = rule.arg
        assert lo <= hi < float("inf") and type(hi) is type(lo) is int, (name, rule)
        wrap = (lambda x: [x]) if rule.kind == "each_between" else (lambda x: x)
        assert params.for_chapter(ch, {name: json.dumps(wrap(hi))}) == {name: wrap(hi)}
        for bad in (hi + 1, lo - 1, float("nan"), float("inf")):
            with pytest.raises(params.ParamError) as e:
                params.for_chapter(ch, {name: wrap(bad)})
            assert f"--param {name}=" in str(e.value) and "\n" not in str(e.value)
            assert f"from {lo} to {hi}" in str(e.value) or isinstance(bad, float)


MODEL_CHAPTERS = (
    "kernels-in-one-token",
    "launch-overhead",
    "prefill-vs-decode",
    "model-code-to-kernels",
    "where-kernels-come-from",
    "why-a-gpu",
)


@pytest.mark.parametrize("slug", MODEL_CHAPTERS)
def test_a_model_folder_without_a_config_is_one_line_naming_it(slug, tmp_path):
    """`--param model=DIR` of every chapter whose model is a transformers decoder: a folder with a
    config.json passes (empty: the preset), anything else is one ParamError line naming the folder."""
    ch = chapters.by_slug(slug)
    assert ch.defaults["model"] == ""
    (tmp_path / "config.json").write_text("{}")
    assert params.for_chapter(ch, {"model": str(tmp_path)}) == {"model": str(tmp_path)}
    assert params.for_chapter(ch, {"model": ""}) == {"model": ""}
    (tmp_path / "empty").mkdir()
    for folder, why in ((tmp_path / "empty", "it has no config.json"), (tmp_path / "nowhere", "is not a folder")):
        with pytest.raises(params.ParamError) as e:
            params.for_chapter(ch, {"model": str(folder)})
        assert str(folder) in str(e.value) and why in str(e.value) and "\n" not in str(e.value)


def test_a_parameter_given_twice_counts_once_the_last_time():
    assert resolve("repeats=3", "repeats=4")["kernels-in-one-token"] == {"repeats": 4}


def test_good_values():
    got = resolve("preset=tiny", "repeats=3", "contexts=[8, 32]", "prompt_len=16")["kernels-in-one-token"]
    assert got == {"preset": "tiny", "repeats": 3, "contexts": [8, 32], "prompt_len": 16}
    assert resolve('preset="tiny"')["kernels-in-one-token"] == {"preset": "tiny"}
    assert resolve("max_autotune=false", names=["launch-overhead"])["launch-overhead"] == {"max_autotune": False}


@pytest.mark.parametrize(
    "pair,message",
    [
        ("repeat=50", "--param repeat: no such parameter of kernels-in-one-token (parameters: "),
        ("no_such_param=1", "--param no_such_param: no such parameter"),
        ("repeats=abc", "--param repeats=abc: not a JSON value"),
        ("repeats=-5", "--param repeats=-5: must be a number from 1 to 10000"),
        ("repeats=0", "--param repeats=0: must be a number from 1 to 10000"),
        ("repeats=100000000", "--param repeats=100000000: must be a number from 1 to 10000"),
        ("prompt_len=1000000000", "--param prompt_len=1000000000: must be a number from 1 to 131072"),
        ("repeats=2.5", "--param repeats=2.5: must be an integer"),
        ("repeats=true", "--param repeats=true: must be an integer"),
        ("repeats=", "--param repeats=: not a JSON value"),
        ("contexts=[]", "--param contexts=[]: must not be empty"),
        ("contexts=[8, 0]", "every entry must be a number from 1 to 131072 (0 is not)"),
        ("contexts=[8, 1000000000]", "every entry must be a number from 1 to 131072 (1000000000 is not)"),
        (f"contexts={[8] * 65}", "--param contexts: 65 entries, more than the 64 allowed"),
        ('contexts=[8, "x"]', "every entry must be an integer"),
        ("contexts=8", "must be a JSON list"),
        ("preset=no-such-model", "--param preset=\"no-such-model\": unknown model preset 'no-such-model' (known: "),
        ("run_id=20990101T000000Z-x", "--param run_id: not a parameter you may set (the command chooses the run id)"),
        ("run_id=", "--param run_id: not a parameter you may set"),
        ("mode=replay", "--param mode: not a parameter you may set"),
        ("overrides={}", "--param overrides: not a parameter you may set (give each parameter as --param NAME=VALUE)"),
        ("allow_cpu=true", "--param allow_cpu: no such parameter of kernels-in-one-token"),
        ("repeats", "expected NAME=VALUE"),
        ("../x=1", "expected NAME=VALUE"),
        ("repeats\n=3", "expected NAME=VALUE"),
    ],
)
def test_bad_values_are_one_line(pair, message):
    with pytest.raises(params.ParamError) as e:
        resolve(pair)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_other_chapters_checks():
    with pytest.raises(params.ParamError, match="must be true or false"):
        resolve("max_autotune=1", names=["launch-overhead"])
    with pytest.raises(params.ParamError, match='"gpu" is not one of reference, fla'):
        resolve('backends=["gpu"]', names=["hybrid-model-token"])
    with pytest.raises(params.ParamError, match="must be a number from 1 to 10000"):
        resolve("repeats=0", names=["prefill-vs-decode"])
    with pytest.raises(params.ParamError, match="an entry is given twice"):
        resolve('backends=["fla", "fla"]', names=["hybrid-model-token"])
    # A name that some selected chapter has goes to that chapter only.
    got = resolve("max_autotune=false", names=["launch-overhead", "kernels-in-one-token"])
    assert got == {"launch-overhead": {"max_autotune": False}, "kernels-in-one-token": {}}


def _command(runs_root, tmp_path, cmd: str, *args: str) -> subprocess.CompletedProcess:
    """`python -m labsupport <cmd> kernels-in-one-token --allow-cpu <args>` on `runs_root`, its logs
    under tmp_path/logs."""
    env = {**os.environ, "LABSUPPORT_RUNS": str(runs_root), "PYTHONPATH": str(REPO)}
    env["LABSUPPORT_NIGHTLY_DIR"] = str(tmp_path / "logs")
    return subprocess.run(
        [sys.executable, "-m", "labsupport", cmd, "kernels-in-one-token", "--allow-cpu", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.parametrize("cmd", ["live", "nightly"])
def test_the_command_stops_before_anything_runs(copied_runs, tmp_path, cmd):
    before = tree_bytes(copied_runs)
    r = _command(copied_runs, tmp_path, cmd, "--param", "repeat=50")
    assert r.returncode == 1 and r.stderr.strip().splitlines() == [r.stderr.strip()], r.stderr
    assert r.stderr.startswith("error: --param repeat: no such parameter")
    assert r.stderr.strip().endswith("nothing was run, the published run is unchanged")
    assert "[1/1]" not in r.stdout and not (tmp_path / "logs").exists()
    assert tree_bytes(copied_runs) == before


@pytest.mark.parametrize(
    "check,good,bad",
    [
        (
            params.timing_threshold,
            {"0.25": 0.25, 9.5: 9.5, "1e-3": 0.001},
            ["nan", "inf", "-inf", "0", "-1", "10", "abc", ""],
        ),
        (params.min_kernels, {"1": 1, "100000": 100000, 5: 5}, ["-5", "0", "1.5", "100001", "nan", "abc", 2.0, True]),
    ],
    ids=["timing-threshold", "min-kernels"],
)
def test_the_nightlys_options_take_only_sensible_finite_values(check, good, bad):
    for raw, value in good.items():
        assert check(raw) == value
    for raw in bad:
        with pytest.raises(params.ParamError) as e:
            check(raw)
        assert str(e.value).startswith(f"--{check.__name__.replace('_', '-')} {raw}: must be ") and "\n" not in str(
            e.value
        )


@pytest.mark.parametrize("option", [["--timing-threshold", "nan"], ["--min-kernels", "-5"]], ids=["nan", "-5"])
def test_the_nightly_stops_on_a_bad_option_in_one_line_before_anything_runs(copied_runs, tmp_path, option):
    before = tree_bytes(copied_runs)
    r = _command(copied_runs, tmp_path, "nightly", *option)
    assert r.returncode == 1 and r.stderr.strip().splitlines() == [r.stderr.strip()], r.stderr
    assert r.stderr.startswith(f"error: {' '.join(option)}: must be "), r.stderr
    assert not (tmp_path / "logs").exists() and tree_bytes(copied_runs) == before
