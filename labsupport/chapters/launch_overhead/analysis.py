"""The chapter's analysis: the fixes side by side, the eager step's summary and where each
profiled step's time went, from a recorded run. Variants are named by their data key
(params.VARIANTS maps each to the label the page shows)."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from labsupport import runs
from labsupport.chapters.launch_overhead.params import SHARED_PREFIX, trace_file
from labsupport.measure import hardware, harness
from labsupport.traces import kernels, trace


def kernel_table(run: runs.Run, variant: str) -> pd.DataFrame:
    """Kernels of one variant's profiled step (from its raw trace), with kind and layer."""

    device = run.provenance.get("device", "cuda")
    return kernels.annotate(trace.read_kernels(run.file(trace_file(variant)), device=device))


def one_layer(k: pd.DataFrame, layers: int) -> tuple[pd.DataFrame, str]:
    """The kernels of the middle decoder layer, and a title for them. Runs recorded without
    module labels get the same number of consecutive kernels from the middle of the step."""
    if k.layer.notna().any():
        layer = int(k.layer.max()) // 2
        return k[k.layer == layer], f"decoder layer {layer}"
    n = len(k) // layers
    start = (len(k) - n) // 2
    return k.iloc[start : start + n], f"{n} consecutive kernels from the middle of the step (one layer's worth)"


def measured_column(run: runs.Run, lim: hardware.Limits | None = None) -> str:
    """The name of the fixes table's column for the fraction of the practical ceiling."""
    return "of practical ceiling"


def wall_stats(run: runs.Run) -> pd.DataFrame:
    """Each timed variant's wall time by the book's estimator (the fast-host median; the minimum in
    runs without per-trial probe readings) with the quartiles of the same trials, the median of
    all of them, and the count of the trials the estimator rests on."""
    t = run.table("step_times")
    rows = {}
    for variant, g in t.groupby("variant"):
        e = harness.table_estimate(g)
        rows[variant] = {
            "wall ms": e.value,
            "wall q1 ms": e.q1,
            "wall median ms": harness.quantile([float(x) for x in g.wall_ms], 0.5),
            "wall q3 ms": e.q3,
            "trials": e.trials,
        }
    cols = ["wall ms", "wall q1 ms", "wall median ms", "wall q3 ms", "trials"]
    return pd.DataFrame.from_dict(rows, orient="index", columns=cols)


def variants(run: runs.Run, vals: dict | None = None, lim: hardware.Limits | None = None) -> pd.DataFrame:
    """The fixes side by side, one row per variant (by its key): kernels, launch calls, GPU-busy,
    wall (minimum, quartiles), tokens/s, and the fraction of the memory-bandwidth limit each
    reaches (weights read / wall time) by the datasheet and by the practical ceiling.

    `vals` (shared.values()): the eager steps' kernels, GPU busy and wall times are then the
    shared ones (measured by "The kernels in one token"), not this run's; `lim`: the ceilings
    (shared.limits(); without it, the run's own)."""
    v = run.table("variants")
    lim = lim or hardware.run_limits(run)
    tbs = lim.ceiling_tbs
    nbytes = run.results["model"]["decode_bytes"]
    ok = v.status == "ok"
    w = wall_stats(run)
    out = pd.DataFrame({"variant": v.variant, "status": v.status})
    out["kernels"] = v.get("kernels")
    out["launch calls"] = v.get("launch_calls")
    out["GPU busy ms"] = v.get("gpu_busy_ns") / 1e6
    for c in ("wall ms", "wall q1 ms", "wall median ms", "wall q3 ms"):
        out[c] = v.variant.map(w[c]).astype(float)
    out["from"] = "this run"
    if vals is not None:
        for key in ("eager", "eager-static"):
            pre, row = SHARED_PREFIX[key], out.variant == key
            if not row.any() or f"{pre}_wall_ms" not in vals:
                continue
            out.loc[row, "kernels"] = vals[f"{pre}_kernels"].value
            out.loc[row, "GPU busy ms"] = vals[f"{pre}_gpu_busy_ms"].value
            out.loc[row, "wall ms"] = vals[f"{pre}_wall_ms"].value
            quartiles = {"wall q1 ms": "q1", "wall median ms": "median", "wall q3 ms": "q3"}
            for c, q in quartiles.items():
                name = f"{pre}_wall_{q}_ms"
                out.loc[row, c] = vals[name].value if name in vals else float("nan")
            out.loc[row, "from"] = vals[f"{pre}_wall_ms"].run.run_id
    out["tokens/s"] = 1e3 / out["wall ms"]
    out["of datasheet limit"] = hardware.of_bandwidth(nbytes, out["wall ms"], lim.datasheet_tbs)
    out[measured_column(run, lim)] = hardware.of_bandwidth(nbytes, out["wall ms"], tbs)
    out["compile s"] = v.get("compile_s") if "compile_s" in v else float("nan")
    cols = ["kernels", "launch calls", "GPU busy ms", "wall ms", "wall q1 ms", "wall median ms", "wall q3 ms"]
    out.loc[~ok, [*cols, "tokens/s"]] = float("nan")
    return out


def breakdown(run: runs.Run, walls: pd.Series | None = None) -> pd.DataFrame:
    """Where each profiled step's time went: before the first kernel started, kernels
    running (busy), gaps between kernels, and after the last kernel ended; with `walls`
    (variant -> unprofiled wall ms), the profiled step's span against it."""
    v = run.table("variants")
    v = v[v.status == "ok"]
    span = v.last_kernel_end_ns - v.first_kernel_ns
    # The step is over when the CPU has returned and the GPU has finished, whichever is later.
    step_ns = v[["profiled_step_ns", "last_kernel_end_ns"]].max(axis=1)
    out = pd.DataFrame(
        {
            "variant": v.variant,
            "before first kernel ms": v.first_kernel_ns / 1e6,
            "kernels running ms": v.gpu_busy_ns / 1e6,
            "gaps between kernels ms": (span - v.gpu_busy_ns) / 1e6,
            "after last kernel ms": (step_ns - v.last_kernel_end_ns) / 1e6,
            "profiled step ms": step_ns / 1e6,
        }
    ).reset_index(drop=True)
    if walls is not None:
        out["unprofiled wall ms"] = out.variant.map(walls).astype(float)
        out["profiled / unprofiled"] = out["profiled step ms"] / out["unprofiled wall ms"]
    return out


@dataclass
class EagerSummary:
    kernels: int
    gpu_busy_ms: float
    wall_ms: float  # unprofiled, by the book's estimator (harness.estimate)
    idle_ms: float
    issue_ms: float  # unprofiled: until the CPU had launched the whole step
    wall_per_kernel_us: float  # unprofiled wall time / kernels
    cpu_per_kernel_us: float  # unprofiled: the CPU's whole time per kernel (issue / kernels)
    kernel_mean_us: float
    kernel_interval_us: float  # profiled: mean gap between kernel starts
    launch_call_us: float  # profiled: median duration of one CUDA launch call (runtime API)
    profiled_span_ms: float  # profiled: the step's span under the profiler
    profiled_ratio: float  # the profiled span over the unprofiled wall time
    launch_share: float  # profiled: the launch call's share of the CPU's time per kernel


def eager_summary(run: runs.Run, vals: dict | None = None) -> EagerSummary:
    """The eager step: its unprofiled numbers (wall, issue, busy, kernels) from `vals`
    (shared.values(): "The kernels in one token"'s run) or, without them, from this run's own
    trials where it has them; its profiled numbers (launch call, interval between kernel
    starts, span) from this run's profiled eager step."""
    nan = float("nan")
    k = kernel_table(run, "eager")
    starts = k.start_ns.sort_values()
    v = run.table("variants").set_index("variant")
    span = float(v.loc["eager", "profiled_step_ns"]) / 1e6 if "eager" in v.index else nan
    if vals is not None:
        count, busy = int(vals["eager_kernels"].value), float(vals["eager_gpu_busy_ms"].value)
        wall, issue = float(vals["eager_wall_ms"].value), float(vals["eager_issue_ms"].value)
        mean = float(vals["eager_kernel_mean_us"].value)
    else:
        t = run.table("step_times")
        t = t[t.variant == "eager"]
        count, busy = len(k), kernels.gpu_busy_ns(k) / 1e6
        wall = harness.table_estimate(t).value if len(t) else nan
        issue = harness.table_estimate(t, "issue_ms").value if len(t) else nan
        mean = float(k.dur_ns.mean() / 1e3)
    interval = float(starts.diff().dropna().mean() / 1e3)
    launch = float(k.launch_dur_ns.median() / 1e3)
    return EagerSummary(
        kernels=count,
        gpu_busy_ms=busy,
        wall_ms=wall,
        idle_ms=wall - busy,
        issue_ms=issue,
        wall_per_kernel_us=wall * 1e3 / count,
        cpu_per_kernel_us=issue * 1e3 / count,
        kernel_mean_us=mean,
        kernel_interval_us=interval,
        launch_call_us=launch,
        profiled_span_ms=span,
        profiled_ratio=span / wall,
        launch_share=launch / interval,
    )


def headline(run: runs.Run, vals: dict | None = None) -> dict:
    v = variants(run, vals).set_index("variant")
    ok = v[v.status == "ok"]
    out = {"best wall ms": float(ok["wall ms"].min())}
    eager = float(ok.loc["eager", "wall ms"]) if "eager" in ok.index else float("nan")
    if eager == eager:  # runs recorded before the eager step became the census chapter's (shared)
        out["eager wall ms"] = eager
    if "cuda-graph" in ok.index:
        out["CUDA graph wall ms"] = float(ok.loc["cuda-graph", "wall ms"])
    return out


def shared(run: runs.Run) -> dict:
    """The steps this chapter measures for the whole book (labsupport.chapters.shared): the
    CUDA-graph and the compiled steps (reduce-overhead, max-autotune), wall time by the book's estimator (the
    median of the fast-host trials, interleaved in rounds; the minimum in runs without per-trial probe
    readings), GPU busy time
    and kernels of the profiled step."""
    v = run.table("variants").set_index("variant")
    t = run.table("step_times")
    out = {}
    for key, name in (
        ("cuda-graph", "graph"),
        ("compile-reduce-overhead", "compiled"),
        ("compile-max-autotune", "autotune"),
    ):
        ok = key in v.index and v.loc[key, "status"] == "ok"
        trials = t[t.variant == key]
        out[f"{name}_wall_ms"] = harness.table_estimate(trials).value if ok and len(trials) else float("nan")
        out[f"{name}_gpu_busy_ms"] = float(v.loc[key, "gpu_busy_ns"]) / 1e6 if ok else float("nan")
        out[f"{name}_kernels"] = int(v.loc[key, "kernels"]) if ok else float("nan")
    return out
