"""One number per configuration, checked on the fixture runs: a configuration that the book
shows twice is one measurement, or two measurements that agree within their own spread.

The fixtures are frozen copies of harnessed H200 runs (tests/fixtures/runs); the published
runs that replace them every night are checked by validation, not here."""

from __future__ import annotations

import pytest

from labsupport import runs
from labsupport.chapters import kernels_in_one_token as one_token

from .conftest import fixture_run

pytestmark = pytest.mark.unit


def _harnessed(chapter: str) -> runs.Run:
    run = fixture_run(chapter)
    assert "method" in run.results, f"the fixture run of {chapter} predates the measuring harness"
    return run


def _overlap(a: tuple[float, float], b: tuple[float, float]) -> bool:
    return a[0] <= b[1] and b[0] <= a[1]


def test_context_sweep_row_at_the_prompt_length_is_the_step_itself():
    run = _harnessed("kernels-in-one-token")
    s = one_token.summary(run)
    sweep = run.table("context_sweep").set_index("context")
    n = int(run.parameters["prompt_len"])
    assert sweep.loc[n, "wall_ms_min"] == pytest.approx(s.wall_ms, rel=1e-12)  # the estimator: the minimum
    assert sweep.loc[n, "kernels"] == s.kernels


def test_a_page_that_shows_a_shared_quantity_reads_its_owner():
    """Every notebook that shows a shared quantity (glue name of labsupport.chapters.shared) is its
    owner's or declares the owner in `reads`: the value comes from the owner's run."""
    import json
    import re

    from labsupport import chapters
    from labsupport.chapters import shared

    for ch in chapters.CHAPTERS:
        nb = json.loads(ch.path.read_text())
        text = "\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "markdown")
        shown = set(re.findall(r"\{glue(?::\w+)?\}`([a-z0-9_]+)", text)) & set(shared.QUANTITIES)
        owners = {shared.QUANTITIES[n].owner for n in shown}
        assert owners <= {ch.slug, *ch.reads}, f"{ch.slug} shows {sorted(shown)} without reading {owners}"


def test_the_readers_no_longer_time_the_eager_step():
    """Launch overhead times only the forms it owns: its eager numbers are the shared ones."""
    import inspect
    import json

    from labsupport import chapters
    from labsupport.chapters import launch_overhead

    nb = json.loads(chapters.by_slug("launch-overhead").path.read_text())
    src = inspect.getsource(launch_overhead.measuring) + "".join(
        "".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code"
    )
    assert "time_decode_steps" not in src
