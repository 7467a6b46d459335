"""Chapter notebooks: committed clean, executed in replay (by the session's book build) and
live (CPU, through papermill)."""

import json
import subprocess
import sys

import nbformat
import pytest

from labsupport import chapters, runs

from .conftest import REPO, cpu_args, executed_notebook, tree_bytes

pytestmark = pytest.mark.live

NOTEBOOKS = [c.path for c in chapters.CHAPTERS]


@pytest.mark.unit
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_is_committed_clean(path):
    nb = nbformat.read(path, as_version=4)
    assert nb.metadata["kernelspec"]["name"] == "python3"
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(not c.outputs and c.execution_count is None for c in code), "commit notebooks without outputs"
    params = [c for c in code if "parameters" in c.metadata.get("tags", [])]
    assert len(params) == 1 and 'mode = "replay"' in params[0].source


@pytest.mark.book
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_replays_the_published_run(path, built_book):
    """The session's book build executes every chapter in replay mode (execute_notebooks:
    force); the notebook it executed shows no traceback and draws: in a cell's output, or glued
    for the prose to paste (myst-nb keeps those in <page>.glue.json). Papermill's own path (its
    parameters cell, injected parameters) is the live tests' below and the chapters' own."""
    out = executed_notebook(built_book, path)
    nb = nbformat.read(out, as_version=4)
    text = json.dumps([c.get("outputs", []) for c in nb.cells])
    glued = out.with_suffix(".glue.json")
    assert "Traceback" not in text
    assert "image/png" in text + (glued.read_text() if glued.exists() else "")


def _live(args, env):
    return subprocess.run(
        [sys.executable, "-m", "labsupport", "live", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.fixture
def live_env(runs_root, monkeypatch):
    import os

    return {**os.environ, "LABSUPPORT_RUNS": str(runs_root), "PYTHONPATH": str(REPO)}


TINY_ARGS = cpu_args("kernels-in-one-token")


def test_live_run_through_papermill_on_cpu_records_and_publishes(live_env, copied_runs):
    # Into a copy of the published runs: the page reads the other chapters' shared quantities.
    live_env["LABSUPPORT_RUNS"] = str(copied_runs)
    r = _live(TINY_ARGS, live_env)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "[1/1] kernels-in-one-token: published run" in r.stdout
    run = runs.load_run(chapters.by_slug("kernels-in-one-token"), root=copied_runs)
    assert run.provenance["device"] == "cpu" and run.parameters["preset"] == "tiny"
    assert "labsupport live" in run.provenance["command"]


def test_failing_notebook_leaves_the_published_run_untouched(copied_runs, live_env):
    before = tree_bytes(copied_runs)
    live_env["LABSUPPORT_RUNS"] = str(copied_runs)
    r = _live(TINY_ARGS + ["--param", 'preset="no-such-model"'], live_env)
    assert r.returncode == 1
    err = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert len(err) == 1 and "unknown model preset 'no-such-model'" in err[0]
    assert "published run is unchanged" in err[0]
    assert tree_bytes(copied_runs) == before


def test_live_without_gpu_stops_with_a_clear_message(live_env):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    r = _live([], live_env)
    assert r.returncode != 0
    assert "live mode needs a CUDA GPU" in r.stderr
    assert "Traceback" not in r.stderr


def test_unknown_chapter(live_env):
    r = _live(["--allow-cpu", "no-such-chapter"], live_env)
    assert r.returncode != 0 and "unknown chapter(s) no-such-chapter" in r.stderr


@pytest.mark.unit
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_no_markdown_table_in_the_prose_is_longer_than_15_rows(path):
    """Longer tables are shown by glue.table (15 rows and a CSV link), not typed into the prose."""
    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        if cell.cell_type != "markdown":
            continue
        rows = 0
        for line in [*cell.source.splitlines(), ""]:
            if line.startswith("|"):
                rows += 1
                continue
            assert rows - 2 <= 15, f"a table of {rows - 2} rows in: {cell.source[:60]!r}"
            rows = 0
