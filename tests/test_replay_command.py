"""`python -m labsupport replay CHAPTER [--runs PATH_OR_ZIP] [--out DIR]` (labsupport.ops.replay):
a chapter's headline and figures from its runs folder or the zip the book serves, bad input in one
line with nothing written, a hostile zip read member by member; and the light install it needs:
the wheel without torch or transformers (their `live` extra), in a fresh venv, from an empty folder."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import socket
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest
import tomllib

from labsupport import chapters, runs
from labsupport.__main__ import main
from labsupport.measure import environment
from labsupport.ops import replay

from .conftest import FIXTURES, REPO

pytestmark = pytest.mark.unit

CHAPTER = "kernels-in-one-token"
FIGURES = {"census.png", "gemv.png", "layer_parts.png", "attention_share.png", "kv_cache.png"}
VENV_LIMIT_MB = 400


def _serve_runs():
    """book/_ext/serve_runs.py, the extension that packs each chapter's runs as the book serves them."""
    spec = importlib.util.spec_from_file_location("serve_runs", REPO / "book" / "_ext" / "serve_runs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _fixture_manifest() -> dict[str, str]:
    return {p.name: sorted(r.name for r in p.iterdir() if r.is_dir())[-1] for p in FIXTURES.iterdir() if p.is_dir()}


@pytest.fixture(scope="module")
def zips(tmp_path_factory) -> dict[str, Path]:
    """The zips the book would serve for the fixture runs (serve_runs.chapter_archives)."""
    return _serve_runs().chapter_archives(FIXTURES, tmp_path_factory.mktemp("download"), _fixture_manifest())


def _replay(capsys, *args) -> tuple[int, str, str]:
    rc = main(["replay", *args])
    got = capsys.readouterr()
    return rc, got.out, got.err


def test_replay_from_the_served_zip_prints_the_headline_and_writes_the_figures(zips, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("LABSUPPORT_RUNS", raising=False)
    monkeypatch.chdir(tmp_path)
    rc, out, err = _replay(capsys, CHAPTER, "--runs", str(zips[CHAPTER]), "--out", "figs")
    assert rc == 0, err
    run = runs.load_run(chapters.by_slug(CHAPTER), _fixture_manifest()[CHAPTER], FIXTURES)
    from labsupport.chapters import kernels_in_one_token as ch

    for name, value in ch.headline(run).items():
        assert f"  {name}: {value:.4g}" in out if isinstance(value, float) else f"  {name}: {value}" in out
    assert run.run_id in out.splitlines()[0]
    assert {p.name for p in (tmp_path / "figs").iterdir()} == FIGURES
    assert all((tmp_path / "figs" / f).read_bytes().startswith(b"\x89PNG") for f in FIGURES)
    assert "left to the notebook" in out and "bandwidth_figure" in out  # said, not silently dropped
    assert "LABSUPPORT_RUNS" not in os.environ  # the zip's scratch runs folder was named for the replay only
    assert [p.name for p in tmp_path.iterdir()] == ["figs"]  # no scratch left beside it


def test_replay_from_a_runs_folder(tmp_path, capsys):
    root = tmp_path / "runs"
    zipfile.ZipFile(
        _serve_runs().chapter_archives(FIXTURES, tmp_path / "z", _fixture_manifest())["why-a-gpu"]
    ).extractall(tmp_path)
    rc, out, err = _replay(capsys, "why-a-gpu", "--runs", str(root), "--out", str(tmp_path / "f"))
    assert rc == 0, err
    assert {p.name for p in (tmp_path / "f").iterdir()} == {
        "arithmetic.png",
        "bytes.png",
        "limits.png",
        "throughput.png",
    }


def _refused(capsys, tmp_path, *args) -> str:
    out = tmp_path / "figs"
    rc, printed, err = _replay(capsys, *args, "--out", str(out))
    assert rc == 1 and printed == ""
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert not out.exists()
    assert not [p for p in out.parent.iterdir() if p.name.startswith(".figs-")]  # no scratch left
    return err.strip()


def test_bad_input_is_one_line_and_writes_nothing(zips, tmp_path, capsys):
    assert "unknown chapter 'no-such'" in _refused(capsys, tmp_path, "no-such", "--runs", str(zips[CHAPTER]))
    missing = _refused(capsys, tmp_path, CHAPTER, "--runs", str(tmp_path / "gone.zip"))
    assert "gone.zip is not a zip file" in missing
    cut = tmp_path / "cut.zip"
    cut.write_bytes(zips[CHAPTER].read_bytes()[: zips[CHAPTER].stat().st_size // 2])
    assert "not a readable zip" in _refused(capsys, tmp_path, CHAPTER, "--runs", str(cut))
    other = _refused(capsys, tmp_path, "closing-the-gap", "--runs", str(zips[CHAPTER]))
    assert "holds no published run of closing-the-gap" in other and CHAPTER in other
    assert "neither a runs folder" in _refused(capsys, tmp_path, CHAPTER, "--runs", str(tmp_path / "nowhere"))
    bare = tmp_path / "bare.zip"
    with zipfile.ZipFile(zips[CHAPTER]) as src, zipfile.ZipFile(bare, "w") as dst:
        for info in src.infolist():
            if info.filename != "runs/published.json":
                dst.writestr(info, src.read(info))
    assert "holds no runs/published.json" in _refused(capsys, tmp_path, CHAPTER, "--runs", str(bare))


def test_an_unwritable_out_is_one_line(zips, tmp_path, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    rc, printed, err = _replay(capsys, CHAPTER, "--runs", str(zips[CHAPTER]), "--out", str(blocker / "figs"))
    assert rc == 1 and printed == "" and len(err.strip().splitlines()) == 1
    assert "cannot write figures to" in err
    for unwritable in (tmp_path / "no-such" / "figs", Path("/proc/figs")):  # no folder; one nothing can be made in
        rc, printed, err = _replay(capsys, CHAPTER, "--runs", str(zips[CHAPTER]), "--out", str(unwritable))
        assert rc == 1 and printed == "" and err.startswith(f"replay refused: cannot write figures to {unwritable}")
        assert len(err.strip().splitlines()) == 1
    assert not (tmp_path / "no-such").exists()
    rc, _, err = _replay(capsys, CHAPTER, "--runs", str(zips[CHAPTER]), "--out", str(blocker))
    assert rc == 1 and "is a file, not a folder" in err and blocker.read_text() == "not a folder"


def test_a_figure_that_fails_leaves_out_as_it_was(zips, tmp_path, capsys, monkeypatch):
    """The figures are drawn into a scratch folder and moved in only when all are drawn."""
    out = tmp_path / "figs"
    out.mkdir()
    (out / "mine.txt").write_text("kept")
    real = replay.figures_of

    def failing_last(slug):
        figs = real(slug)
        last = list(figs.drawn)[-1]
        figs.drawn[last] = lambda run: (_ for _ in ()).throw(runs.RunError(f"{last}: a table is damaged"))
        return figs

    monkeypatch.setattr(replay, "figures_of", failing_last)
    rc, _, err = _replay(capsys, CHAPTER, "--runs", str(zips[CHAPTER]), "--out", str(out))
    assert rc == 1 and "a table is damaged" in err
    assert [p.name for p in out.iterdir()] == ["mine.txt"]
    assert [p.name for p in tmp_path.iterdir()] == ["figs"]


def _hostile(tmp_path: Path, good: Path, name: str, data: bytes = b"x", link: bool = False) -> Path:
    path = tmp_path / f"hostile-{len(list(tmp_path.glob('hostile-*')))}.zip"
    with zipfile.ZipFile(good) as src, zipfile.ZipFile(path, "w") as dst:
        for info in src.infolist():
            dst.writestr(info, src.read(info))
        member = zipfile.ZipInfo(name)
        if link:
            member.external_attr = (0o120777 << 16) | 0
        dst.writestr(member, data)
    return path


@pytest.mark.parametrize(
    ("name", "link", "said"),
    [
        ("../../escaped.txt", False, "is not under runs/"),
        ("/tmp/absolute.txt", False, "is not under runs/"),
        ("runs/kernels-in-one-token/../../escaped.txt", False, "is not under runs/"),
        ("runs/kernels-in-one-token/20261202T103752Z-h200/link", True, "symbolic link"),
        ("runs/Bad_Chapter/20261202T103752Z-h200/x.csv", False, "is not a chapter name"),
        ("runs/kernels-in-one-token/not-a-run/x.csv", False, "is not a run id"),
        ("runs/kernels-in-one-token/20261202T103752Z-h200/.hidden", False, "is not runs/<chapter>/<run id>/<file>"),
        ("runs/published.json", False, "appears twice"),
    ],
)
@pytest.mark.filterwarnings("ignore:Duplicate name")  # the member written twice, on purpose
def test_a_zip_is_read_member_by_member(zips, tmp_path, capsys, name, link, said):
    bad = _hostile(tmp_path, zips[CHAPTER], name, b"/etc/passwd" if link else b"x", link)
    assert said in _refused(capsys, tmp_path, CHAPTER, "--runs", str(bad))
    assert not (tmp_path.parent / "escaped.txt").exists() and not Path("/tmp/absolute.txt").exists()


def test_a_zip_whose_file_was_changed_is_refused_by_its_checksum(zips, tmp_path, capsys):
    changed = tmp_path / "changed.zip"
    with zipfile.ZipFile(zips[CHAPTER]) as src, zipfile.ZipFile(changed, "w") as dst:
        for info in src.infolist():
            data = src.read(info)
            if info.filename.endswith(f"/{CHAPTER}/{_fixture_manifest()[CHAPTER]}/census.csv"):
                data = data.replace(b"1", b"2", 1)
            dst.writestr(info, data)
    assert "does not match its checksum" in _refused(capsys, tmp_path, CHAPTER, "--runs", str(changed))


def test_a_zip_too_large_is_refused_before_it_is_copied(zips, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(replay, "MAX_TOTAL_BYTES", 1 << 20)
    assert "exceed 1 MiB in all" in _refused(capsys, tmp_path, CHAPTER, "--runs", str(zips[CHAPTER]))


# The light install ---------------------------------------------------------------------------


def _oldest(requirements: list[str]) -> dict[str, str]:
    return dict(r.split(">=") for r in requirements)


def test_the_wheel_leaves_torch_and_transformers_to_its_live_extra():
    """The wheel needs what a replay imports; its `live` extra what a live run adds, at the oldest
    versions the environment check accepts and requirements-gpubox.txt pins."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    base = _oldest(project["dependencies"])
    assert set(base) == {"numpy", "pandas", "matplotlib", "jinja2"}
    live = _oldest(project["optional-dependencies"]["live"])
    assert {"torch", "transformers", "papermill", "ipykernel", "fla-core"} <= set(live)
    assert {**base, **live}.items() >= environment.PACKAGES.items()
    lines = (REPO / "requirements-gpubox.txt").read_text().splitlines()
    gpubox = dict(line.split("==") for line in lines if line.strip() and not line.startswith("#"))
    assert not {"torch", "transformers"} & set(gpubox)  # a GPU box keeps its own
    assert {d: live[d] for d in gpubox} == gpubox


def test_replay_asks_for_neither_torch_nor_transformers_and_live_does(monkeypatch, capsys):
    real = environment.installed
    monkeypatch.setattr(environment, "installed", lambda d: None if d in ("torch", "transformers") else real(d))
    assert environment.check(CHAPTER, "replay", "qwen3-8b") == []
    assert capsys.readouterr().out == ""
    with pytest.raises(environment.EnvironmentProblem) as e:
        environment.check(CHAPTER, "live", "qwen3-8b")
    line = str(e.value)
    assert "\n" not in line and line.startswith("torch is not installed") and "[live] extra" in line


def _ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def _index_reachable() -> bool:
    try:
        socket.create_connection(("pypi.org", 443), timeout=5).close()
        return True
    except OSError:
        return False


def _size_mb(path: Path) -> float:
    return sum(f.lstat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink()) / 1e6


@pytest.mark.live
def test_the_served_wheel_alone_replays_from_an_empty_folder(tmp_path):
    """The wheel built as serve_package builds it, installed by pip in a fresh venv with what it
    declares (from the package index): from an empty folder, `replay` on the zip serve_runs
    makes writes the figures, with neither torch nor transformers importable, in under 400 MB;
    and the chapter's notebook, run by a Jupyter kernel from that install, replays."""
    if not _index_reachable() and not _ci():
        pytest.skip("pypi.org cannot be reached from this machine: the wheel's dependencies cannot be installed")
    src = tmp_path / "src"  # as book/_ext/serve_package.py builds the served wheel
    shutil.copytree(REPO / "labsupport", src / "labsupport", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", src / "pyproject.toml")
    pip_wheel = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q"]
    subprocess.run([*pip_wheel, "-w", str(tmp_path / "wheel"), str(src)], check=True, capture_output=True, timeout=300)
    (wheel,) = (tmp_path / "wheel").glob("labsupport-*.whl")
    manifest = runs.published(REPO / "runs")
    served = _serve_runs().chapter_archives(REPO / "runs", tmp_path / "download", manifest)[CHAPTER]

    venv.EnvBuilder(with_pip=True).create(tmp_path / "venv")
    python = tmp_path / "venv" / "bin" / "python"
    clean = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    clean.update({k: v for k, v in os.environ.items() if k.startswith("PIP_") or k.endswith("_PROXY")})
    installed = subprocess.run(
        [str(python), "-m", "pip", "install", "-q", str(wheel)], env=clean, capture_output=True, text=True, timeout=600
    )
    assert installed.returncode == 0, installed.stderr[-3000:]
    empty = tmp_path / "reader"
    empty.mkdir()
    r = subprocess.run(
        [str(python), "-m", "labsupport", "replay", CHAPTER, "--runs", str(served), "--out", "figs"],
        cwd=empty,
        env=clean,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert manifest[CHAPTER] in r.stdout and "wall ms:" in r.stdout
    assert {p.name for p in (empty / "figs").iterdir()} == FIGURES
    heavy = (
        "import importlib.util as u, json; print(json.dumps([m for m in ('torch', 'transformers') if u.find_spec(m)]))"
    )
    found = subprocess.run([str(python), "-c", heavy], env=clean, capture_output=True, text=True, check=True)
    assert json.loads(found.stdout) == []
    size = _size_mb(tmp_path / "venv")
    print(f"the venv holds {size:.0f} MB")
    assert size < VENV_LIMIT_MB, f"the venv is {size:.0f} MB"

    # The chapter's notebook, opened from the same install with a Jupyter kernel added, replays
    # with the served zip unpacked beside it (runs/ in its folder, as the page says).
    kernel = [str(python), "-m", "pip", "install", "-q", "ipykernel", "nbclient"]
    assert subprocess.run(kernel, env=clean, capture_output=True, timeout=600).returncode == 0
    shutil.copy(REPO / "notebooks" / "kernels_in_one_token.ipynb", empty)
    zipfile.ZipFile(served).extractall(empty)
    nb = subprocess.run(
        [str(python), "-c", NOTEBOOK], cwd=empty, env=clean, capture_output=True, text=True, timeout=600
    )
    assert nb.returncode == 0, nb.stderr[-3000:]
    assert json.loads(nb.stdout.strip().splitlines()[-1]) == {"figures": True, "heavy": []}


NOTEBOOK = """
import importlib.util, json, sys
import nbclient, nbformat
nb = nbformat.read("kernels_in_one_token.ipynb", as_version=4)
nbclient.NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": "."}}).execute()
images = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if "image/png" in o.get("data", {})]
heavy = [m for m in ("torch", "transformers") if importlib.util.find_spec(m)]
print(json.dumps({"figures": len(images) > 0, "heavy": heavy}))
"""


def test_the_page_gives_the_light_install_and_the_live_extra():
    """The install lines on "Run a chapter yourself" are the wheel alone (replay) and the wheel
    with the extra pyproject.toml declares (live), named as serve_package names the wheel."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    wheel = f"labsupport-{project['version']}-py3-none-any.whl"
    lines = [line.strip() for line in (REPO / "book" / "run_it_yourself.md").read_text().splitlines()]
    assert f"pip install {wheel}" in lines
    (extra,) = project["optional-dependencies"]
    assert f'pip install "{wheel}[{extra}]"' in lines
    assert f"python -m labsupport replay {CHAPTER} --runs {CHAPTER}.zip --out figs" in lines
