"""Every torch.compile pins inductor's data-dependent choices, and a run records what the
compiler did and how its caches were set."""

import os
import re
from dataclasses import dataclass

import pytest

from labsupport import chapters, runs
from labsupport.measure import compiling, recording
from labsupport.ops import live

from .conftest import REPO

pytestmark = pytest.mark.unit


def test_a_mode_becomes_its_options_with_shape_padding_off():
    from torch._inductor import list_mode_options

    for mode in ("reduce-overhead", "max-autotune"):
        assert compiling.options(mode) == {**list_mode_options(mode), "shape_padding": False}
    assert compiling.options() == compiling.options("default") == {"shape_padding": False}


def test_torch_compile_gets_options_never_a_mode(monkeypatch):
    """torch.compile takes a mode or options, not both: the helper passes the mode as options,
    which torch accepts (it checks every option's name when compile is called)."""
    import torch

    fn = compiling.torch_compile(lambda x: x + 1, "max-autotune", fullgraph=True)
    assert callable(fn)
    seen = {}
    monkeypatch.setattr(torch, "compile", lambda f, **kw: seen.update(kw) or f)
    compiling.torch_compile(len, "reduce-overhead", dynamic=False)
    assert seen == {"options": {"triton.cudagraphs": True, "shape_padding": False}, "dynamic": False}


def test_no_code_calls_torch_compile_but_the_helper():
    """The package, the notebooks and the benchmarks compile only through measure/compiling.py."""
    found = []
    for path in [*REPO.glob("labsupport/**/*.py"), *REPO.glob("notebooks/*.ipynb"), *REPO.glob("benchmarks/*.py")]:
        if path.name == "compiling.py":
            continue
        for i, line in enumerate(path.read_text().splitlines(), 1):
            if re.search(r"torch\.compile\(", line):
                found.append(f"{path.relative_to(REPO)}:{i}: {line.strip()}")
    assert not found, "\n".join(found)


def test_the_record_holds_the_counters_and_the_cache_state(monkeypatch):
    from torch._dynamo.utils import counters

    monkeypatch.setenv("TORCHINDUCTOR_FORCE_DISABLE_CACHES", "1")
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.setitem(counters["inductor"], "pad_mm_bench", 2)
    r = compiling.record()
    assert set(compiling.COUNTERS) <= set(r["counters"]) and r["counters"]["pad_mm_bench"] == 2
    assert all(isinstance(v, int) for v in r["counters"].values())
    assert r["pinned"] == {"shape_padding": False}
    assert r["caches"]["TORCHINDUCTOR_FORCE_DISABLE_CACHES"] == "1"
    assert r["caches"]["TORCHINDUCTOR_CACHE_DIR"] == "unset"


def test_live_and_nightly_compile_with_the_caches_off(monkeypatch):
    monkeypatch.setenv("TORCHINDUCTOR_FORCE_DISABLE_CACHES", "0")
    monkeypatch.delenv("LABSUPPORT_GIT_COMMIT", raising=False)
    live.set_environment()
    assert os.environ["TORCHINDUCTOR_FORCE_DISABLE_CACHES"] == "1"


@dataclass
class _Params:
    preset: str = "tiny"
    device: str = "cpu"


def test_a_recorded_run_holds_what_the_compiler_did(runs_root):
    w = recording.PendingRun(chapters.by_slug("what-a-kernel"), _Params(), ceilings=False)
    run = runs.load_run(chapters.by_slug("what-a-kernel"), w.write(), runs_root)
    assert set(compiling.COUNTERS) <= set(run.results["compile"]["counters"])
    assert run.results["compile"]["caches"].keys() == {*compiling.CACHE_VARIABLES, "force_disable_caches"}
