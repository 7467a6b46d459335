"""Each phase of a loaded run measured and set against the ceilings: time, kernels, work,
MFU and MBU; the prefill's one timing; the kernels counted by kind."""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass

import pandas as pd

from labsupport import runs
from labsupport.measure import harness
from labsupport.traces import kernels, trace

from .names import MATMUL, PHASES
from .tables import bandwidth, kernel_table, limits, ratio, shape
from .work import phase_work


@dataclass
class Phase:
    """One phase measured: its time, its kernels, its work, and the rates it reached.

    Rates use the wall time (what a user waits for) and, marked `busy`, the time the GPU
    was busy in the profiled pass (what the kernels alone reached). MFU: FLOP/s reached
    over the peak FLOP/s; MBU: bytes per second reached over the peak bandwidth, against
    the datasheet and against the measured bandwidth() (read stream, or copy in older runs).
    """

    phase: str
    new_tokens: int
    cached_tokens: int  # tokens in the KV cache before the pass
    kernels: int
    wall_ms: float  # the book's estimator: the minimum of the interleaved trials (no profiler)
    wall_min_ms: float
    wall_max_ms: float
    wall_repeats: int
    wall_median_ms: float
    wall_q1_ms: float
    wall_q3_ms: float
    gpu_busy_ms: float  # union of kernel intervals in the profiled pass
    kernel_ms: float  # sum of kernel durations
    matmul_kernels: int
    matmul_ms: float
    attention_ms: float
    matmul_flops: int
    attention_flops: int
    flops: int
    bytes: int
    flop_per_byte: float
    tflops: float  # model FLOPs / wall time
    tflops_busy: float
    tbs: float  # bytes that must move / wall time
    tbs_busy: float
    matmul_tflops: float  # matmul FLOPs / matmul kernel time
    mfu_datasheet: float | None
    mfu_gemm: float | None
    mfu_busy_datasheet: float | None
    mfu_busy_gemm: float | None
    mbu_datasheet: float | None
    mbu_measured: float | None
    mbu_busy_datasheet: float | None
    mbu_busy_measured: float | None
    ms_per_token: float  # wall time / new tokens


def phases(run: runs.Run) -> dict[str, Phase]:
    """Both phases of the run, measured and set against the limits."""
    sh, lim = shape(run), limits(run)
    bw = bandwidth(lim).tbs
    n = int(run.parameters["prompt_len"])
    times = run.table("phase_times")
    out = {}
    for ph in PHASES:
        k = kernel_table(run, ph)
        walls = times.loc[times["phase"] == ph, "wall_ms"]
        wall = float(walls.min())  # harness.ESTIMATOR: the minimum
        busy = trace.busy_ns(k.start_ns, k.end_ns) / 1e6
        mm = k[k.kind == MATMUL]
        work = phase_work(sh, ph, n)
        tflops, tflops_busy = work.flops / wall / 1e9, work.flops / busy / 1e9  # FLOP/ms / 1e9 = TFLOP/s
        tbs, tbs_busy = work.bytes / wall / 1e9, work.bytes / busy / 1e9
        mm_ms = mm.dur_ns.sum() / 1e6
        new = n if ph == "prefill" else 1
        out[ph] = Phase(
            phase=ph,
            new_tokens=new,
            cached_tokens=0 if ph == "prefill" else n,
            kernels=len(k),
            wall_ms=wall,
            wall_min_ms=float(walls.min()),
            wall_max_ms=float(walls.max()),
            wall_repeats=len(walls),
            wall_median_ms=float(statistics.median(walls)),
            wall_q1_ms=harness.quantile(list(walls), 0.25),
            wall_q3_ms=harness.quantile(list(walls), 0.75),
            gpu_busy_ms=busy,
            kernel_ms=k.dur_ns.sum() / 1e6,
            matmul_kernels=len(mm),
            matmul_ms=mm_ms,
            attention_ms=k.loc[k.kind == "attention", "dur_ns"].sum() / 1e6,
            matmul_flops=work.matmul_flops,
            attention_flops=work.attention_flops,
            flops=work.flops,
            bytes=work.bytes,
            flop_per_byte=work.flop_per_byte,
            tflops=tflops,
            tflops_busy=tflops_busy,
            tbs=tbs,
            tbs_busy=tbs_busy,
            matmul_tflops=work.matmul_flops / mm_ms / 1e9 if mm_ms else float("nan"),
            mfu_datasheet=ratio(tflops, lim.datasheet_tflops),
            mfu_gemm=ratio(tflops, lim.gemm_tflops),
            mfu_busy_datasheet=ratio(tflops_busy, lim.datasheet_tflops),
            mfu_busy_gemm=ratio(tflops_busy, lim.gemm_tflops),
            mbu_datasheet=ratio(tbs, lim.datasheet_tbs),
            mbu_measured=ratio(tbs, bw),
            mbu_busy_datasheet=ratio(tbs_busy, lim.datasheet_tbs),
            mbu_busy_measured=ratio(tbs_busy, bw),
            ms_per_token=wall / new,
        )
    return out


def phase_table(run: runs.Run) -> pd.DataFrame:
    """Both phases side by side, one row per number (numeric; None where no limit is known)."""
    p = phases(run)
    return pd.DataFrame({ph: asdict(v) for ph, v in p.items()}).drop(index="phase")


@dataclass
class PrefillTiming:
    """The wall time of the prefill of `prompt_len` tokens (the minimum of its trials), as the
    phase table and the prompt-length sweep show it: one measurement (`shared`) in runs recorded
    since the chapter times each configuration once; older runs timed it twice."""

    prompt_len: int
    phase_ms: float
    phase_repeats: int
    sweep_ms: float | None  # None when the sweep has no row (that ran) for prompt_len
    sweep_repeats: int | None
    shared: bool


def prefill_timing(run: runs.Run) -> PrefillTiming:
    n = int(run.parameters["prompt_len"])
    t = run.table("phase_times")
    walls = t.loc[t["phase"] == "prefill", "wall_ms"]
    s = run.table("prompt_sweep")
    row = s[(s["prompt_len"] == n) & (s["status"] == "ok")].set_index("prompt_len")
    same = lambda a, b: math.isclose(float(a), float(b), rel_tol=1e-12)  # noqa: E731 (CSV round trip)
    if row.empty:
        return PrefillTiming(n, float(walls.min()), len(walls), None, None, False)
    r = row.loc[n]
    reps = int(r["wall_repeats"]) if "wall_repeats" in row.columns else None
    shared = (
        reps == len(walls)
        and same(r["wall_ms_median"], statistics.median(walls))
        and same(r["wall_ms_min"], walls.min())
        and same(r["wall_ms_max"], walls.max())
    )
    return PrefillTiming(n, float(walls.min()), len(walls), float(r["wall_ms_min"]), reps, shared)


# Display labels of utilisation()'s `time` keys.
TIME_LABELS = {"wall": "wall time", "busy": "GPU busy"}


def utilisation(run: runs.Run) -> pd.DataFrame:
    """MFU and MBU of both phases, on wall time and on GPU-busy time, against the datasheet
    and against the ceilings measured in the run (NaN where a limit is unknown). The last
    column is named after the measured bandwidth used ("MBU vs measured read", or copy).
    `time` is "wall" or "busy" (TIME_LABELS names them for display)."""
    nan = float("nan")
    mbu_col = f"MBU vs {bandwidth(limits(run)).short}"
    rows = []
    for ph, p in phases(run).items():
        rows.append(
            {
                "phase": ph,
                "time": "wall",
                "MFU vs datasheet": p.mfu_datasheet or nan,
                "MFU vs measured GEMM": p.mfu_gemm or nan,
                "MBU vs datasheet": p.mbu_datasheet or nan,
                mbu_col: p.mbu_measured or nan,
            }
        )
        rows.append(
            {
                "phase": ph,
                "time": "busy",
                "MFU vs datasheet": p.mfu_busy_datasheet or nan,
                "MFU vs measured GEMM": p.mfu_busy_gemm or nan,
                "MBU vs datasheet": p.mbu_busy_datasheet or nan,
                mbu_col: p.mbu_busy_measured or nan,
            }
        )
    return pd.DataFrame(rows)


def census(run: runs.Run) -> pd.DataFrame:
    """Kernels and GPU time by kind, prefill beside decode (the kinds by today's rules, from
    the recorded kernel tables; census.csv holds those of the rules at recording time)."""
    parts = {}
    for ph in PHASES:
        x = kernels.census(kernel_table(run, ph)).set_index("kind")
        parts[(ph, "kernels")] = x["kernels"]
        parts[(ph, "GPU ms")] = x["gpu_ns"] / 1e6
        parts[(ph, "share")] = x["share"]
    out = pd.DataFrame(parts)
    out.columns = pd.MultiIndex.from_tuples(out.columns)
    out.index.name = "kind"
    return out


def passes_table(run: runs.Run) -> pd.DataFrame:
    """Every number of the page's table "One prefill against one decode step", unrounded, one
    row per quantity (the page shows them rounded, two to a row where they pair): the full
    table its CSV link downloads."""
    p = phases(run)
    lim, bw = limits(run), bandwidth(limits(run))
    rows = [
        ("new tokens", "tokens", "new_tokens"),
        ("tokens in the cache before the pass", "tokens", "cached_tokens"),
        ("wall time, the minimum of the timed passes", "ms", "wall_ms"),
        ("wall time, first quartile", "ms", "wall_q1_ms"),
        ("wall time, median", "ms", "wall_median_ms"),
        ("wall time, third quartile", "ms", "wall_q3_ms"),
        ("wall time, slowest timed pass", "ms", "wall_max_ms"),
        ("timed passes", "passes", "wall_repeats"),
        ("time the GPU was busy (profiled)", "ms", "gpu_busy_ms"),
        ("kernels", "kernels", "kernels"),
        ("model FLOPs", "FLOP", "flops"),
        ("bytes that must move", "bytes", "bytes"),
        ("FLOP per byte", "FLOP/byte", "flop_per_byte"),
        ("TFLOP/s reached, on wall time", "TFLOP/s", "tflops"),
        ("MFU against the datasheet, on wall time", "fraction", "mfu_datasheet"),
        ("MFU against the measured GEMM rate, on wall time", "fraction", "mfu_gemm"),
        ("TB/s reached, on wall time", "TB/s", "tbs"),
        ("MBU against the datasheet, on wall time", "fraction", "mbu_datasheet"),
        (f"MBU against the {bw.short}, on wall time", "fraction", "mbu_measured"),
        ("TFLOP/s reached, on GPU-busy time", "TFLOP/s", "tflops_busy"),
        ("MFU against the datasheet, on GPU-busy time", "fraction", "mfu_busy_datasheet"),
        ("MFU against the measured GEMM rate, on GPU-busy time", "fraction", "mfu_busy_gemm"),
        ("TB/s reached, on GPU-busy time", "TB/s", "tbs_busy"),
        ("MBU against the datasheet, on GPU-busy time", "fraction", "mbu_busy_datasheet"),
        (f"MBU against the {bw.short}, on GPU-busy time", "fraction", "mbu_busy_measured"),
    ]
    out = pd.DataFrame(
        [
            {"quantity": name, "unit": unit, **{ph: getattr(p[ph], field) for ph in PHASES}, "field": field}
            for name, unit, field in rows
        ]
    )
    limits_rows = pd.DataFrame(
        [
            {"quantity": f"limit: {name}", "unit": unit, **dict.fromkeys(PHASES, value), "field": field}
            for name, unit, value, field in (
                ("datasheet peak", "TFLOP/s", lim.datasheet_tflops, "datasheet_tflops"),
                ("measured GEMM rate", "TFLOP/s", lim.gemm_tflops, "gemm_tflops"),
                ("datasheet bandwidth", "TB/s", lim.datasheet_tbs, "datasheet_tbs"),
                (f"measured {bw.name}", "TB/s", bw.tbs, "measured_tbs"),
            )
        ]
    )
    return pd.concat([out, limits_rows], ignore_index=True)
