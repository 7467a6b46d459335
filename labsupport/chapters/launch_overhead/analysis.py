"""The chapter's analysis: the fixes side by side, the eager step's summary and where each
profiled step's time went, from a recorded run. Variants are named by their data key
(params.VARIANTS maps each to the label the page shows)."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from labsupport import runs
from labsupport.chapters.launch_overhead.params import trace_file
from labsupport.measure import hardware
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


def measured_column(run: runs.Run) -> str:
    """The name of the fixes table's column for the fraction of the measured ceiling."""
    return f"of measured {hardware.measured_read(hardware.run_limits(run))[1]}"


def timing_note(run: runs.Run) -> str:
    """How the run's wall times were taken: before any profile (the harness), or, in runs
    recorded before it, each right after its own profile, with CUPTI attached."""
    t = run.table("step_times")
    if "clean" not in t:
        return (
            "This run is older than the book's measuring harness: each variant was timed right after its "
            "own profile, in the same process, so its wall times carry the profiler's after-effect (CUPTI "
            "stays attached and every later launch pays for it; the methodology page measures how much). "
            "Runs recorded with the current code time every variant before profiling any."
        )
    if t.clean.astype(str).eq("True").all():
        return (
            "Every wall time was taken before the first profile in the process, "
            f"{int(t.groupby('variant').size().max())} repeats per variant; the table gives the median with the "
            "fastest and slowest repeat."
        )
    return (
        "Some wall times in this run were taken after a profile in the same process (see `clean` in "
        "`step_times.csv`); they carry the profiler's after-effect."
    )


def variants(run: runs.Run) -> pd.DataFrame:
    """The fixes side by side, one row per variant (by its key): kernels, launch calls, GPU-busy,
    wall (median, fastest, slowest repeat), tokens/s, and the fraction of the memory-bandwidth
    limit each reaches (weights read / wall time) by the datasheet and by the run's measured
    read ceiling."""
    v = run.table("variants")
    lim = hardware.run_limits(run)
    tbs, _ = hardware.measured_read(lim)
    nbytes = run.results["model"]["decode_bytes"]
    ok = v.status == "ok"
    wall = run.table("step_times").groupby("variant").wall_ms
    out = pd.DataFrame({"variant": v.variant, "status": v.status})
    out["kernels"] = v.get("kernels")
    out["launch calls"] = v.get("launch_calls")
    out["GPU busy ms"] = v.get("gpu_busy_ns") / 1e6
    out["wall ms"] = v.get("wall_ms_median")
    out["wall min ms"] = v.variant.map(wall.min())
    out["wall max ms"] = v.variant.map(wall.max())
    out["tokens/s"] = 1e3 / out["wall ms"]
    out["of datasheet limit"] = hardware.of_bandwidth(nbytes, out["wall ms"], lim.datasheet_tbs)
    out[measured_column(run)] = hardware.of_bandwidth(nbytes, out["wall ms"], tbs)
    out["compile s"] = v.get("compile_s") if "compile_s" in v else float("nan")
    out.loc[~ok, ["kernels", "launch calls", "GPU busy ms", "wall ms", "wall min ms", "wall max ms", "tokens/s"]] = (
        float("nan")
    )
    return out


def breakdown(run: runs.Run) -> pd.DataFrame:
    """Where each profiled step's time went: before the first kernel started, kernels
    running (busy), gaps between kernels, and after the last kernel ended."""
    v = run.table("variants")
    v = v[v.status == "ok"]
    span = v.last_kernel_end_ns - v.first_kernel_ns
    # The step is over when the CPU has returned and the GPU has finished, whichever is later.
    step_ns = v[["profiled_step_ns", "last_kernel_end_ns"]].max(axis=1)
    return pd.DataFrame(
        {
            "variant": v.variant,
            "before first kernel ms": v.first_kernel_ns / 1e6,
            "kernels running ms": v.gpu_busy_ns / 1e6,
            "gaps between kernels ms": (span - v.gpu_busy_ns) / 1e6,
            "after last kernel ms": (step_ns - v.last_kernel_end_ns) / 1e6,
            "profiled step ms": step_ns / 1e6,
        }
    ).reset_index(drop=True)


@dataclass
class EagerSummary:
    kernels: int
    gpu_busy_ms: float
    wall_ms: float
    idle_ms: float
    issue_ms: float
    kernel_interval_us: float  # mean gap between kernel starts in the profiled step
    wall_per_kernel_us: float  # unprofiled wall time / kernels
    kernel_mean_us: float
    launch_call_us: float  # median duration of one CUDA launch call (runtime API)
    cpu_per_kernel_us: float  # the CPU's whole time per kernel: Python, dispatcher, launch


def eager_summary(run: runs.Run) -> EagerSummary:
    k = kernel_table(run, "eager")
    t = run.table("step_times")
    t = t[t.variant == "eager"]
    busy = trace.busy_ns(k.start_ns, k.end_ns) / 1e6
    wall = float(t.wall_ms.median())
    issue = float(t.issue_ms.median())
    starts = k.start_ns.sort_values()
    return EagerSummary(
        kernels=len(k),
        gpu_busy_ms=busy,
        wall_ms=wall,
        idle_ms=wall - busy,
        issue_ms=issue,
        kernel_interval_us=float(starts.diff().dropna().mean() / 1e3),
        wall_per_kernel_us=wall * 1e3 / len(k),
        kernel_mean_us=float(k.dur_ns.mean() / 1e3),
        launch_call_us=float(k.launch_dur_ns.median() / 1e3),
        cpu_per_kernel_us=issue * 1e3 / len(k),
    )


def headline(run: runs.Run) -> dict:
    v = variants(run).set_index("variant")
    ok = v[v.status == "ok"]
    out = {"eager wall ms": float(ok.loc["eager", "wall ms"]), "best wall ms": float(ok["wall ms"].min())}
    if "cuda-graph" in ok.index:
        out["CUDA graph wall ms"] = float(ok.loc["cuda-graph", "wall ms"])
    return out


def shared(run: runs.Run) -> dict:
    """The steps this chapter measures for the whole book (labsupport.chapters.shared): the
    CUDA-graph and the compiled steps (reduce-overhead, max-autotune), wall time by the book's estimator (the
    least of the trials), GPU busy time and kernels of the profiled step."""
    v = run.table("variants").set_index("variant")
    t = run.table("step_times")
    out = {}
    for key, name in (
        ("cuda-graph", "graph"),
        ("compile-reduce-overhead", "compiled"),
        ("compile-max-autotune", "autotune"),
    ):
        ok = key in v.index and v.loc[key, "status"] == "ok"
        walls = t.loc[t.variant == key, "wall_ms"]
        out[f"{name}_wall_ms"] = float(walls.min()) if ok and len(walls) else float("nan")
        out[f"{name}_gpu_busy_ms"] = float(v.loc[key, "gpu_busy_ns"]) / 1e6 if ok else float("nan")
        out[f"{name}_kernels"] = int(v.loc[key, "kernels"]) if ok else float("nan")
    return out
