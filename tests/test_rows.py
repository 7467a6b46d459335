"""Every chapter writes its timing row with Timing.summary() and its profile row with
kernels.profile_row(): each table keeps the columns (and the values) it has always recorded, so
that the recorded runs, read by the same pages, stay what they were."""

import math
import statistics

import pandas as pd
import pytest

from labsupport.chapters import closing_the_gap, kernels_in_one_token, launch_overhead, prefill_vs_decode, why_a_gpu
from labsupport.measure import harness
from labsupport.traces import kernels, trace

pytestmark = pytest.mark.unit

# Three kernels, two of them overlapping: the GPU is busy 20 ns; their durations add up to 25.
K = pd.DataFrame(
    {
        "name": ["ampere_bf16_gemm", "flash_fwd_kernel", "copy_kernel"],
        "start_ns": [0, 5, 20],
        "end_ns": [10, 15, 25],
        "dur_ns": [10, 10, 5],
        "kind": ["matrix multiply", "attention", "copy/convert/concat"],
        "short_name": ["gemm", "flash", "copy"],
        "op": ["aten::mm", "aten::sdpa", "aten::cat"],
    }
)
WALLS = [5.0, 4.0, 6.0, 4.5, 5.5, 4.2, 5.1, 4.8]
# Per-trial probe readings: the host was slow (20 ms) for one trial, the estimator leaves it out.
T = harness.Timing("step", WALLS, [w / 2 for w in WALLS], probe_ms=[10.0] * 7 + [20.0])


def quartiles(t: harness.Timing) -> dict:
    """The five numbers the chapters have always written from a Timing's properties."""
    return {
        "wall_ms_median": t.median,
        "wall_ms_min": t.low,
        "wall_ms_q1": t.q1,
        "wall_ms_q3": t.q3,
        "wall_ms_max": t.high,
    }


def estimator(t: harness.Timing) -> dict:
    e = t.fast
    return {
        "wall_ms_estimate": e.value,
        "wall_ms_fast_min": e.low,
        "wall_ms_fast_q1": e.q1,
        "wall_ms_fast_q3": e.q3,
        "wall_ms_fast_trials": e.trials,
    }


def same(row: dict, expected: dict) -> None:
    assert set(row) == set(expected), f"columns: {sorted(set(row) ^ set(expected))}"
    for name, value in expected.items():
        got = row[name]
        both_nan = isinstance(value, float) and math.isnan(value) and isinstance(got, float) and math.isnan(got)
        assert both_nan or got == value, f"{name}: {got!r} != {value!r}"


def test_the_profile_row_counts_overlaps_once():
    same(kernels.profile_row(K), {"kernels": 3, "gpu_busy_ns": 20, "kernel_ns": 25})
    assert kernels.gpu_busy_ns(K) == trace.busy_ns(K.start_ns, K.end_ns) == 20
    same(
        kernels.profile_row(K, total=False, bounds=True),
        {"kernels": 3, "gpu_busy_ns": 20, "first_kernel_ns": 0, "last_kernel_end_ns": 25},
    )


def test_the_timing_row_keeps_each_tables_names():
    assert T.fast.basis == harness.ESTIMATOR and T.fast.trials == 7
    same(T.summary(), {**quartiles(T), **estimator(T), "wall_ms_repeats": 8, "clean": True})
    same(
        T.summary(fast=False, issue=True, count="wall_repeats", clean="wall_clean"),
        {**quartiles(T), "issue_ms_median": statistics.median(T.issue_ms), "wall_repeats": 8, "wall_clean": True},
    )
    same(T.summary(fast=False, count="repeats", clean=None), {**quartiles(T), "repeats": 8})


def test_prefill_vs_decode_sweep_row():
    by_kind = {col: 0 for col in prefill_vs_decode.measuring.KIND_COLUMNS.values()}
    by_kind |= {"matmul_ns": 10, "attention_ns": 10, "copy_ns": 5}
    expected = {
        "prompt_len": 64,
        "status": "ok",
        "kernels": 3,
        "gpu_busy_ns": 20,
        "kernel_ns": 25,
        **by_kind,
        **quartiles(T),
        **estimator(T),
        "wall_repeats": 8,
        "issue_ms_median": statistics.median(T.issue_ms),
        "wall_clean": True,
    }
    same(prefill_vs_decode.measuring.sweep_row(64, K, T), expected)


def test_the_kernels_in_one_token_context_row():
    expected = {
        "kernels": 3,
        "gpu_busy_ns": 20,
        "kernel_ns": 25,
        "attention_ns": 10,
        "attention_kernels": 1,
        "attention_names": "flash",
        "copy_ns": 5,
        "cat_ns": 5,
        **quartiles(T),
        **estimator(T),
        "wall_repeats": 8,
        "wall_clean": True,
    }
    same(kernels_in_one_token.measuring.context_row(K, T), expected)


def test_why_a_gpu_sweep_row_takes_the_profiled_context_once():
    expected = {
        "batch": 4,
        "status": "ok",
        "kernels": 3,
        "gpu_busy_ns": 20,
        "kernel_ns": 25,
        "matmul_ns": 10,
        "attention_ns": 10,
        **quartiles(T),
        "issue_ms_median": statistics.median(T.issue_ms),
        "wall_repeats": 8,
        "wall_clean": True,
        "context_end": 129,
        "context_profiled": 129,
    }
    same(why_a_gpu.sweep_row(4, T, K, 129), expected)


def test_launch_overhead_variant_row_timed_and_untimed():
    profile = {"kernels": 3, "gpu_busy_ns": 20, "first_kernel_ns": 0, "last_kernel_end_ns": 25}
    head = {"variant": "cuda-graph", "status": "ok", **profile, "profiled_step_ns": 30, "launch_calls": 3}
    tail = {"graphs_compiled_while_profiling": 0}
    timed = {**quartiles(T), "issue_ms_median": statistics.median(T.issue_ms), "clean": True}
    row = launch_overhead.measuring.variant_row
    same(row("cuda-graph", K, T, 30, 0, object(), "cpu"), {**head, **timed, **tail})
    untimed = {**dict.fromkeys(timed, float("nan")), "clean": ""}
    same(row("cuda-graph", K, None, 30, 0, object(), "cpu"), {**head, **untimed, **tail})


def test_closing_the_gap_rung_row():
    t = harness.Timing("step", WALLS, WALLS, gpu_ms=[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0], probe_ms=T.probe_ms)
    g = t.gpu_ms
    gpu = {"gpu_ms_min": 1.0, "gpu_ms_max": 8.0}
    gpu |= {f"gpu_ms_{q}": harness.quantile(g, x) for q, x in (("q1", 0.25), ("median", 0.5), ("q3", 0.75))}
    expected = {
        "rung": "own-compiled",
        "status": "ok",
        "kernels": 3,
        "gpu_busy_ns": 20,
        "first_kernel_ns": 0,
        "last_kernel_end_ns": 25,
        "profiled_step_ns": 30,
        **quartiles(t),
        **estimator(t),
        "wall_ms_repeats": 8,
        "clean": True,
        **gpu,
        "compile_s": float("nan"),
        "max_abs_error": 0.5,
    }
    same(closing_the_gap.measuring.rung_row("own-compiled", K, t, 30, object(), {"max_abs_error": 0.5}), expected)
