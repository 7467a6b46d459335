"""One number per configuration, checked on the published runs: a configuration that the book
shows twice is one measurement, or two measurements that agree within their own spread.

Runs recorded before the measuring harness (no `method` in their results) timed steps after
profiling and are skipped: these checks are for runs the book publishes from now on."""

from __future__ import annotations

import pytest

from labsupport import runs
from labsupport.chapters import kernels_in_one_token as one_token


def _harnessed(run: runs.Run) -> bool:
    return "method" in run.results


def _require(chapter: str) -> runs.Run:
    run = runs.load_run(chapter)
    if not _harnessed(run):
        pytest.skip(f"the published {chapter} run predates the measuring harness")
    return run


def _overlap(a: tuple[float, float], b: tuple[float, float]) -> bool:
    return a[0] <= b[1] and b[0] <= a[1]


def test_context_sweep_row_at_the_prompt_length_is_the_step_itself():
    run = _require("kernels-in-one-token")
    s = one_token.summary(run)
    sweep = run.table("context_sweep").set_index("context")
    n = int(run.parameters["prompt_len"])
    assert sweep.loc[n, "wall_ms_median"] == pytest.approx(s.wall_ms, rel=1e-12)
    assert sweep.loc[n, "kernels"] == s.kernels


def test_eager_256_token_step_agrees_across_chapters():
    """The eager step at the same prompt length: the census chapter's (fresh processes and its own
    process) and launch overhead's eager variant overlap within the spread of their repeats."""
    census = _require("kernels-in-one-token")
    launch = _require("launch-overhead")
    assert census.parameters["prompt_len"] == launch.parameters["prompt_len"]
    effect = census.table("profiler_effect")
    clean = effect[effect.condition.isin(["fresh process", "before profiling"])]
    band = (float(clean.wall_ms_min.min()), float(clean.wall_ms_max.max()))
    t = launch.table("step_times")
    eager = t.loc[t.variant == "eager", "wall_ms"]
    assert t.loc[t.variant == "eager", "clean"].all()
    assert _overlap(band, (float(eager.min()), float(eager.max()))), (band, eager.describe())
