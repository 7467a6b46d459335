"""The chapter's analysis: every table and number of the page, from a recorded run."""

from __future__ import annotations

import statistics
from dataclasses import dataclass

import pandas as pd

from labsupport import runs
from labsupport.chapters.kernels_in_one_token.params import TRACE_FILE
from labsupport.measure import hardware, harness, models
from labsupport.traces import kernels, trace

_TEXT_COLUMNS = ["name", "stream", "grid", "block", "launch_api", "op", "module", "kind", "short_name", "part"]


def kernel_table(run: runs.Run) -> pd.DataFrame:
    """The run's kernel table, with the column types it was written with."""
    k = run.table("kernels", dtype={c: str for c in _TEXT_COLUMNS})
    k[_TEXT_COLUMNS] = k[_TEXT_COLUMNS].fillna("")
    k["kind"] = k["name"].map(kernels.classify)  # today's rules, also for runs recorded before them
    return k.astype({"layer": "Int64"})


def recompute_census(run: runs.Run) -> pd.DataFrame:
    """The census recomputed from the raw trace, with today's classification rules."""
    device = run.provenance.get("device", "cuda")
    return kernels.census(kernels.annotate(trace.read_kernels(run.file(TRACE_FILE), device=device)))


@dataclass
class Summary:
    """The chapter's headline numbers, all from one run."""

    gpu: str
    kernels: int
    kernel_ms: float  # sum of kernel durations
    gpu_busy_ms: float  # union of kernel intervals
    wall_ms: float  # the timed steps (no profiler) by the book's estimator (harness.estimate)
    wall_median_ms: float  # the median of all the trials, slow-host ones included
    wall_q1_ms: float  # the quartiles and minimum of the trials the estimator rests on
    wall_q3_ms: float
    wall_min_ms: float
    wall_max_ms: float
    trials: int  # every clean trial
    fast_trials: int  # the trials the estimator rests on (fast-host ones; all, in older runs)
    estimator: str  # harness.ESTIMATOR, or the minimum for runs without per-trial probe readings
    issue_ms: float  # time until the CPU had queued the whole step (same estimator, same trials)
    idle_ms: float
    busy_fraction: float
    kernel_interval_us: float  # the unprofiled wall time (minimum) per kernel
    kernel_mean_us: float
    matmul_kernels: int
    matmul_ms: float
    matmul_gb: float
    matmul_tbs: float
    datasheet_tbs: float | None
    datasheet_name: str | None
    matmul_fraction_datasheet: float | None
    best_case_ms: float | None  # all weights at datasheet bandwidth
    copy_tbs: float | None
    gemm_tflops: float | None
    matmul_fraction_copy: float | None
    best_case_copy_ms: float | None
    read_tbs: float | None  # read stream measured in the run (shown beside the practical ceiling)
    matmul_fraction_read: float | None
    best_case_read_ms: float | None
    decode_gb: float
    math_ms_datasheet: float | None
    layers: int
    kernels_per_layer: int
    attention_kernels: int


def clean_times(run: runs.Run) -> pd.DataFrame:
    """step_times.csv's trials taken before any profile in the process (all of them in runs
    that did not record it)."""
    t = run.table("step_times")
    if "clean" in t:
        t = t[t["clean"].astype(str).str.lower() == "true"]
    return t


def summary(run: runs.Run, lim: hardware.Limits | None = None) -> Summary:
    """The headline numbers; `lim`: the ceilings to compare with (the page passes
    shared.limits(), the ceilings owner's; without it, the run's own or the datasheet's)."""
    k = kernel_table(run)
    times = clean_times(run)
    walls = [float(w) for w in times.wall_ms]
    est = harness.table_estimate(times)
    model = run.results["model"]
    busy = kernels.gpu_busy_ns(k) / 1e6
    wall = est.value
    mm = k[k.kind == "matrix multiply"]
    mm_ms = mm.dur_ns.sum() / 1e6
    gb = model["matmul_bytes"] / 1e9
    tbs = gb / mm_ms if mm_ms else float("nan")  # GB/ms == TB/s
    sheet = hardware.datasheet_or_none(run.provenance["gpu"])
    lim = lim or hardware.run_limits(run)
    per_layer = k.dropna(subset=["layer"]).groupby("layer").size()
    return Summary(
        gpu=run.provenance["gpu"],
        kernels=len(k),
        kernel_ms=k.dur_ns.sum() / 1e6,
        gpu_busy_ms=busy,
        wall_ms=wall,
        wall_median_ms=statistics.median(walls),
        wall_q1_ms=est.q1,
        wall_q3_ms=est.q3,
        wall_min_ms=est.low,
        wall_max_ms=max(walls),
        trials=len(walls),
        fast_trials=est.trials,
        estimator=est.basis,
        issue_ms=harness.table_estimate(times, "issue_ms").value,
        idle_ms=max(wall - busy, 0.0),
        busy_fraction=busy / wall,
        kernel_interval_us=wall * 1e3 / len(k),
        kernel_mean_us=k.dur_ns.mean() / 1e3,
        matmul_kernels=len(mm),
        matmul_ms=mm_ms,
        matmul_gb=gb,
        matmul_tbs=tbs,
        datasheet_tbs=sheet.bandwidth_tbs if sheet else None,
        datasheet_name=sheet.name if sheet else None,
        matmul_fraction_datasheet=tbs / sheet.bandwidth_tbs if sheet else None,
        best_case_ms=model["decode_bytes"] / 1e9 / sheet.bandwidth_tbs if sheet else None,
        copy_tbs=lim.copy_tbs,
        gemm_tflops=lim.gemm_tflops,
        matmul_fraction_copy=tbs / lim.copy_tbs if lim.copy_tbs else None,
        best_case_copy_ms=model["decode_bytes"] / 1e9 / lim.copy_tbs if lim.copy_tbs else None,
        read_tbs=lim.read_tbs,
        matmul_fraction_read=tbs / lim.read_tbs if lim.read_tbs else None,
        best_case_read_ms=model["decode_bytes"] / 1e9 / lim.read_tbs if lim.read_tbs else None,
        decode_gb=model["decode_bytes"] / 1e9,
        math_ms_datasheet=model["decode_flops"] / (rate * 1e12) * 1e3
        if sheet and (rate := sheet.tensor_tflops(models.run_dtype(run)))
        else None,
        layers=model["layers"],
        kernels_per_layer=int(min(per_layer.mode())) if len(per_layer) else 0,  # the most common count
        attention_kernels=int((k.kind == "attention").sum()),
    )


def fresh_processes(run: runs.Run) -> pd.DataFrame | None:
    """The eager step timed in fresh processes, one row each (None for older runs)."""
    if "fresh_processes.csv" not in run.meta["files"]:
        return None
    return run.table("fresh_processes")


def profiler_effect(run: runs.Run) -> pd.DataFrame | None:
    """The same step: in fresh processes, before and after this process profiled, and the
    span of the profiled step (None for runs recorded before this was measured)."""
    if "profiler_effect.csv" not in run.meta["files"]:
        return None
    return run.table("profiler_effect")


@dataclass(frozen=True)
class PlainStep:
    """The book's shared eager step beside the same step timed by the plain script
    (benchmarks/plain_eager_step.py, plain_eager_step.csv), both by the book's estimator."""

    book: harness.Estimate
    plain: harness.Estimate

    @property
    def ratio(self) -> float:
        """The plain script's step over the book's (1: they agree)."""
        return self.plain.value / self.book.value

    @property
    def agree(self) -> bool:
        return abs(self.ratio - 1) <= PLAIN_AGREEMENT


PLAIN_AGREEMENT = 0.10  # the plain script and the book's step agree within this, by the same estimator


def plain_step(run: runs.Run) -> PlainStep | None:
    """The plain script's step beside the book's (None for runs recorded before the script ran
    in the chapter), both by the fast-host trials judged against the best probe reading of the two:
    trials taken while the host was at the same speed."""
    if "plain_eager_step.csv" not in run.meta["files"]:
        return None
    book, plain = clean_times(run), run.table("plain_eager_step")
    best = min(book.probe_ms.min(), plain.probe_ms.min()) if "probe_ms" in book else None  # one host, one yardstick
    return PlainStep(harness.table_estimate(book, best_ms=best), harness.table_estimate(plain, best_ms=best))


def census_beside_published(run: runs.Run) -> pd.DataFrame:
    """Our census and the published H100 one, side by side, each under its own heading."""
    from labsupport.chapters import published

    ours = run.table("census").set_index("kind")
    theirs = published.QWEN3_8B_H100_CENSUS.set_index("kind")
    gpu = run.provenance["gpu"].replace("NVIDIA ", "")
    out = pd.DataFrame(
        {
            (f"{gpu} (this run)", "kernels"): ours["kernels"],
            (f"{gpu} (this run)", "GPU ms"): (ours["gpu_ns"] / 1e6).round(2),
            (f"{gpu} (this run)", "share"): (ours["share"] * 100).round(0).astype(int).astype(str) + "%",
            ("H100 (published)", "kernels"): theirs["kernels"],
            ("H100 (published)", "GPU ms"): theirs["gpu_ms"],
            ("H100 (published)", "share"): (theirs["share"] * 100).round(0).astype(int).astype(str) + "%",
        }
    )
    out.index.name = "kind"
    out.columns = pd.MultiIndex.from_tuples(out.columns)
    # A kind neither profile has (convolution, in a model without one) is left out.
    empty = (out[(f"{gpu} (this run)", "kernels")].fillna(0) == 0) & out[("H100 (published)", "kernels")].isna()
    return out[~empty]


def per_layer(run: runs.Run) -> pd.DataFrame:
    """Kernels and GPU time of each decoder layer, split by part (attention, MLP, norms)."""
    k = kernel_table(run).dropna(subset=["layer"])
    counts = k.pivot_table(index="layer", columns="part", values="dur_ns", aggfunc="count", fill_value=0)
    counts["all kernels"] = counts.sum(axis=1)
    counts["GPU µs"] = (k.groupby("layer")["dur_ns"].sum() / 1e3).round(1)
    return counts


def outside_layers(run: runs.Run) -> pd.DataFrame:
    """Kernels that belong to no decoder layer (embedding, final norm, LM head, sampling)."""
    k = kernel_table(run)
    k = k[k["layer"].isna()]
    g = k.groupby("part", sort=False).agg(kernels=("dur_ns", "count"), gpu_us=("dur_ns", "sum"))
    g["gpu_us"] = (g["gpu_us"] / 1e3).round(1)
    return g


def layer_kernels(run: runs.Run, layer: int) -> pd.DataFrame:
    """The kernels of one decoder layer, in order, with the module and operator that launched them."""
    k = kernel_table(run)
    k = k[k["layer"] == layer].copy()
    t0 = k.start_ns.min()
    return pd.DataFrame(
        {
            "start µs": ((k.start_ns - t0) / 1e3).round(2),
            "module": k.module.str.replace(rf"^layers\.{layer}\.?", "", regex=True).replace("", "(layer)"),
            "operator": k.op,
            "kernel": k.name.map(lambda n: kernels.short_name(n, width=48)),
            "kind": k.kind,
            "µs": (k.dur_ns / 1e3).round(2),
        }
    ).reset_index(drop=True)


def context_sweep(run: runs.Run) -> pd.DataFrame:
    """Attention's share of GPU time at each context length, and each cache's wall time by the
    book's estimator (the fast-host median; the minimum in runs without per-trial probe
    readings), with the median of all its trials beside it."""
    s = run.table("context_sweep")
    ok = s[s.status == "ok"].copy()
    ok["attention share"] = ok.attention_ns / ok.kernel_ns
    ok["attention ms"] = ok.attention_ns / 1e6
    ok["GPU ms"] = ok.kernel_ns / 1e6
    ok["GPU busy ms"] = ok.gpu_busy_ns / 1e6
    ok["wall ms"] = ok[harness.estimate_column(ok.columns)]
    ok["wall ms (median)"] = ok.wall_ms_median
    has_static = "static_wall_ms_min" in ok
    ok["static wall ms"] = ok[harness.estimate_column(ok.columns, "static_wall_ms")] if has_static else float("nan")
    ok["static wall ms (median)"] = ok.static_wall_ms_median if has_static else float("nan")
    ok["static GPU busy ms"] = ok.static_gpu_busy_ns / 1e6 if has_static else float("nan")
    return ok.reset_index(drop=True)


def context_ops(run: runs.Run) -> pd.DataFrame | None:
    """context_ops.csv: every profiled step of the sweep by kind and call path (None for runs
    recorded before it)."""
    if "context_ops.csv" not in run.meta["files"]:
        return None
    return run.table("context_ops", dtype={"call": str, "kind": str, "cache": str})


def static_copies(run: runs.Run) -> pd.DataFrame | None:
    """The copy/convert/concat kernels of the static-cache step at the longest context, by call
    path, beside the same paths at the prompt's length and with the dynamic cache (None for
    runs without context_ops.csv)."""
    ops = context_ops(run)
    if ops is None:
        return None
    c = ops[ops.kind == "copy/convert/concat"]
    longest, short = int(c.context.max()), int(run.parameters["prompt_len"])

    def ms(cache, ctx):
        x = c[(c.cache == cache) & (c.context == ctx)].groupby("call")
        return x.gpu_ns.sum() / 1e6, x.kernels.sum()

    st_ms, st_n = ms("static", longest)
    out = pd.DataFrame({"kernels": st_n, f"ms at {longest:,}": st_ms})
    out[f"ms at {short:,}"] = ms("static", short)[0].reindex(out.index)
    out[f"dynamic cache, ms at {longest:,}"] = ms("dynamic", longest)[0].reindex(out.index)
    out["share"] = out[f"ms at {longest:,}"] / out[f"ms at {longest:,}"].sum()
    out = out.sort_values(f"ms at {longest:,}", ascending=False).reset_index().rename(columns={"call": "call path"})
    return out


def attention_kernel_names(run: runs.Run) -> list[str]:
    """Distinct (short) names of the attention kernels in the profiled step."""
    k = kernel_table(run)
    return sorted(set(k.loc[k.kind == "attention", "name"].map(lambda n: kernels.short_name(n, width=44))))


def middle_layer(run: runs.Run) -> int:
    return int(run.results["model"]["layers"]) // 2


def headline(run: runs.Run) -> dict:
    """The chapter's key numbers, by the book's estimator."""
    s = summary(run)
    return {"kernels": s.kernels, "GPU busy ms": s.gpu_busy_ms, "wall ms": s.wall_ms, "matmul TB/s": s.matmul_tbs}


def layer_parts(run: runs.Run, layer: int) -> pd.DataFrame:
    """Kernels and GPU time of each part (norms, projections, attention, MLP) of one layer,
    in the order the parts run."""
    k = kernel_table(run)
    k = k[k.layer == layer]
    part = k.module.str.replace(rf"^layers\.{layer}\.?", "", regex=True).replace("", "(residual add)")
    g = k.assign(part=part).groupby("part", sort=False).agg(kernels=("dur_ns", "size"), gpu_us=("dur_ns", "sum"))
    g["gpu_us"] = g.gpu_us / 1e3
    return g.rename(columns={"gpu_us": "GPU µs"})


def static_at_prompt(run: runs.Run) -> dict:
    """The static-cache step at the prompt's length (the context sweep's row for it): wall by
    the book's estimator, GPU busy time and kernels of its profile; NaN where the run has
    none."""
    nan = float("nan")
    s = run.table("context_sweep")
    row = s[(s.context == int(run.parameters["prompt_len"])) & (s.status == "ok")]
    if row.empty or "static_kernels" not in s:
        return {"static_wall_ms": nan, "static_gpu_busy_ms": nan, "static_kernels": nan}
    r = row.iloc[0]
    return {
        "static_wall_ms": float(r[harness.estimate_column(s.columns, "static_wall_ms")]),
        "static_gpu_busy_ms": float(r.static_gpu_busy_ns) / 1e6,
        "static_kernels": int(r.static_kernels),
    }


def shared(run: runs.Run) -> dict:
    """The eager step's numbers this chapter measures for the whole book
    (labsupport.chapters.shared): its wall time by the book's estimator (the median of the
    fast-host trials timed before any profile, interleaved with the static cache's; the minimum in
    runs without per-trial probe readings) with their quartiles, minimum and count, the median and
    count of all the trials, its issue time, and, from its profiled
    step, GPU busy time, kernels and the matrix multiplies' read rate; and the static-cache step
    at the same prompt (the context sweep's row for it)."""
    s = summary(run)
    return {
        "eager_wall_ms": s.wall_ms,
        "eager_wall_median_ms": s.wall_median_ms,
        "eager_wall_q1_ms": s.wall_q1_ms,
        "eager_wall_q3_ms": s.wall_q3_ms,
        "eager_wall_min_ms": s.wall_min_ms,
        "eager_trials": s.trials,
        "eager_fast_trials": s.fast_trials,
        "eager_issue_ms": s.issue_ms,
        "eager_gpu_busy_ms": s.gpu_busy_ms,
        "eager_kernels": s.kernels,
        "eager_matmul_tbs": s.matmul_tbs,
        "eager_kernel_mean_us": s.kernel_mean_us,
        "eager_arrival_us": s.kernel_interval_us,
        **static_at_prompt(run),
    }
