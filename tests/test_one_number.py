"""One number per configuration, checked on the fixture runs: a configuration that the book
shows twice is one measurement, or two measurements that agree within their own spread.

The fixtures are frozen copies of harnessed H200 runs (tests/fixtures/runs); the published
runs that replace them every night are checked by validation, not here."""

from __future__ import annotations

import pytest

from labsupport import runs
from labsupport.chapters import kernels_in_one_token as one_token

from .conftest import fixture_run


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


def test_eager_256_token_step_agrees_across_chapters():
    """The eager step at the same prompt length: the census chapter's (fresh processes and its own
    process) and launch overhead's eager variant overlap within the spread of their repeats."""
    census = _harnessed("kernels-in-one-token")
    launch = _harnessed("launch-overhead")
    assert census.parameters["prompt_len"] == launch.parameters["prompt_len"] == 256
    effect = census.table("profiler_effect")
    clean = effect[effect.condition.isin(["fresh process", "before profiling"])]
    band = (float(clean.wall_ms_min.min()), float(clean.wall_ms_max.max()))
    t = launch.table("step_times")
    eager = t.loc[t.variant == "eager", "wall_ms"]
    assert t.loc[t.variant == "eager", "clean"].all()
    assert _overlap(band, (float(eager.min()), float(eager.max()))), (band, eager.describe())
