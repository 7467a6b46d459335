"""Chapter "The kernels in one token": record a run live, and analyse a run.

Live: profile one steady-state decode step (trace + kernel table + census),
time the step without the profiler, measure the GPU's copy bandwidth and GEMM
rate, and repeat a shorter profile at several context lengths.
Replay: every table and number of the chapter is computed from the run here.
"""
from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field

import pandas as pd

from . import hardware, kernels, runs, trace

CHAPTER = "kernels-in-one-token"
TRACE_FILE = "trace.json.gz"


@dataclass
class Params:
    """What one run of the chapter measures."""

    preset: str = "qwen3-8b"
    batch: int = 1
    prompt_len: int = 256
    contexts: list[int] = field(default_factory=lambda: [256, 1024, 4096, 8192, 16384, 32768])
    repeats: int = 20
    context_repeats: int = 5
    fresh_processes: int = 3   # fresh processes that time the eager step (none of them profiles)
    device: str = "cuda"


def _progress(msg: str) -> None:
    print(f"[{CHAPTER}] {msg}", flush=True)


def annotate_kernels(df: pd.DataFrame) -> pd.DataFrame:
    """Add kind, a readable short name, and the decoder layer and part of the model
    (self_attn, mlp, a norm, lm_head, ...) that launched each kernel."""
    df = df.copy()
    df["kind"] = df["name"].map(kernels.classify)
    df["short_name"] = df["name"].map(kernels.short_name)
    layer = df["module"].str.extract(r"^layers\.(\d+)(?:\.|$)")[0]
    df["layer"] = pd.to_numeric(layer, errors="coerce").astype("Int64")
    part = df["module"].str.extract(r"^layers\.\d+\.([A-Za-z_]+)")[0]
    df["part"] = part.fillna(df["module"].where(df["layer"].isna(), "residual add"))
    df.loc[df["module"] == "", "part"] = "outside modules"
    return df


def record(params: Params | None = None, run_id: str | None = None, allow_cpu: bool = False,
           progress=_progress) -> runs.Run:
    """Measure this GPU now and write a new run (not published). Returns the run.

    Every wall time is taken before the first profile of the process (labsupport.harness),
    or in fresh processes; then the steps are profiled; then the step is timed once more,
    with CUPTI attached, to show what the profiler does to the measurement."""
    import torch

    from . import decode, fresh, harness, models

    params = params or Params()
    device = params.device
    harness.for_chapter(CHAPTER)
    with runs.live_writer(CHAPTER, params, run_id, allow_cpu=allow_cpu) as w:
        w.extra["method"] = harness.method()
        if device == "cuda":
            hardware.record_ceilings(w, progress)
        progress(f"timing the eager step in {params.fresh_processes} fresh processes")
        procs = fresh.in_fresh_processes(params.fresh_processes, params.preset, params.prompt_len,
                                         params.repeats, params.batch, device, progress)
        w.write_table("fresh_processes", pd.DataFrame([asdict(p) for p in procs]))

        progress(f"building {params.preset} with random BF16 weights on {device}")
        model = models.build_model(params.preset, device=device)
        counts = models.count_model(model, params.preset)
        w.extra["model"] = counts.as_record()
        prompt = decode.Prompt.random(model.config.vocab_size, params.batch, params.prompt_len, device)

        progress(f"timing {params.repeats} decode steps (no profile yet in this process)")
        times = decode.time_decode_steps(model, prompt, device, repeats=params.repeats)
        w.write_table("step_times", pd.DataFrame(times.rows()))
        progress(f"  median {times.median:.2f} ms")

        prompts, ctx_times, rows = {}, {}, {}
        for ctx in params.contexts:
            if ctx == params.prompt_len:  # the step measured above: one configuration, one measurement
                prompts[ctx], ctx_times[ctx] = prompt, times
                continue
            progress(f"context {ctx}: timing")
            try:
                prompts[ctx] = decode.Prompt.random(model.config.vocab_size, params.batch, ctx, device, seed=ctx)
                ctx_times[ctx] = decode.time_decode_steps(model, prompts[ctx], device,
                                                          repeats=params.context_repeats, warmup=1)
            except torch.OutOfMemoryError:
                prompts.pop(ctx, None)
                rows[ctx] = {"context": ctx, "status": "out of memory"}
                progress(f"  context {ctx}: out of GPU memory, recorded as such")
                torch.cuda.empty_cache()

        progress(f"profiling one decode step (batch {params.batch}, prompt {params.prompt_len})")
        trace_path = w.path / TRACE_FILE
        table = annotate_kernels(decode.profile_decode_step(model, prompt, device, trace_path))
        w.write_table("kernels", table)
        w.write_table("census", kernels.census(table))
        progress(f"  {len(table)} kernels")

        progress("timing the same step again, now that the process has profiled")
        after = decode.time_decode_steps(model, prompt, device, repeats=params.repeats, allow_after_profile=True)
        span_ms = trace.origin_span_ns(trace.load_events(trace_path), "decode_step") / 1e6
        w.write_table("profiler_effect", profiler_effect_table(procs, times, after, span_ms))

        census_rows = []
        for ctx, p in prompts.items():
            progress(f"context {ctx}: profiling")
            try:
                if ctx == params.prompt_len:
                    kt = table  # the step profiled above
                else:
                    tmp = w.path / f".ctx-{ctx}.json.gz"
                    kt = annotate_kernels(decode.profile_decode_step(model, p, device, tmp, warmup=1))
                    tmp.unlink()
            except torch.OutOfMemoryError:
                rows[ctx] = {"context": ctx, "status": "out of memory"}
                torch.cuda.empty_cache()
                continue
            c = kernels.census(kt)
            for r in c.itertuples():
                census_rows.append({"context": ctx, "kind": r.kind, "kernels": r.kernels, "gpu_ns": r.gpu_ns})
            att = c.set_index("kind").loc["attention"]
            t = ctx_times[ctx]
            rows[ctx] = {"context": ctx, "status": "ok", "kernels": len(kt),
                         "gpu_busy_ns": trace.busy_ns(kt.start_ns, kt.end_ns),
                         "kernel_ns": int(kt.dur_ns.sum()), "attention_ns": int(att.gpu_ns),
                         "attention_kernels": int(att.kernels),
                         "attention_names": ";".join(sorted(set(kt.loc[kt.kind == "attention", "short_name"]))),
                         "wall_ms_median": t.median, "wall_ms_min": t.low, "wall_ms_max": t.high,
                         "wall_clean": t.clean}
        w.write_table("context_sweep", pd.DataFrame([rows[c] for c in params.contexts if c in rows]))
        w.write_table("context_census", pd.DataFrame(census_rows))
        del model
    return runs.load_run(CHAPTER, w.run_id)


def profiler_effect_table(procs, clean, after, span_ms: float) -> pd.DataFrame:
    """The same eager step measured four ways: in fresh processes, in this process before its
    first profile, in this process after it, and as the span of the profiled step itself."""
    rows = [{"condition": "fresh process", "process": p.process, "wall_ms_median": p.wall_ms_median,
             "wall_ms_min": p.wall_ms_min, "wall_ms_max": p.wall_ms_max, "repeats": p.repeats} for p in procs]
    for cond, t in (("before profiling", clean), ("after profiling", after)):
        rows.append({"condition": cond, "process": -1, "wall_ms_median": t.median, "wall_ms_min": t.low,
                     "wall_ms_max": t.high, "repeats": len(t.wall_ms)})
    rows.append({"condition": "inside the profiler", "process": -1, "wall_ms_median": span_ms,
                 "wall_ms_min": span_ms, "wall_ms_max": span_ms, "repeats": 1})
    return pd.DataFrame(rows)


def load(run_id: str | None = None) -> runs.Run:
    """The published run (or `run_id`) of this chapter."""
    return runs.load_run(CHAPTER, run_id)


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
    return kernels.census(annotate_kernels(trace.read_kernels(run.file(TRACE_FILE), device=device)))


@dataclass
class Summary:
    """The chapter's headline numbers, all from one run."""

    gpu: str
    kernels: int
    kernel_ms: float          # sum of kernel durations
    gpu_busy_ms: float        # union of kernel intervals
    wall_ms: float            # median of the timed steps (no profiler)
    wall_min_ms: float
    wall_max_ms: float
    issue_ms: float           # median time until the CPU had queued the whole step
    idle_ms: float
    busy_fraction: float
    kernel_interval_us: float  # mean time between kernel starts, over the unprofiled wall time
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
    read_tbs: float | None     # read stream measured in the run (the ceiling for weight reads)
    matmul_fraction_read: float | None
    best_case_read_ms: float | None
    decode_gb: float
    math_ms_datasheet: float | None
    layers: int
    kernels_per_layer: int
    attention_kernels: int


def summary(run: runs.Run) -> Summary:
    k = kernel_table(run)
    times = run.table("step_times")
    model = run.results["model"]
    busy = trace.busy_ns(k.start_ns, k.end_ns) / 1e6
    wall = statistics.median(times.wall_ms)
    mm = k[k.kind == "matrix multiply"]
    mm_ms = mm.dur_ns.sum() / 1e6
    gb = model["matmul_bytes"] / 1e9
    tbs = gb / mm_ms if mm_ms else float("nan")  # GB/ms == TB/s
    sheet = hardware.datasheet_or_none(run.provenance["gpu"])
    lim = hardware.run_limits(run)
    per_layer = k.dropna(subset=["layer"]).groupby("layer").size()
    return Summary(
        gpu=run.provenance["gpu"],
        kernels=len(k),
        kernel_ms=k.dur_ns.sum() / 1e6,
        gpu_busy_ms=busy,
        wall_ms=wall,
        wall_min_ms=float(times.wall_ms.min()),
        wall_max_ms=float(times.wall_ms.max()),
        issue_ms=statistics.median(times.issue_ms),
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
        math_ms_datasheet=model["decode_flops"] / (sheet.bf16_tflops * 1e12) * 1e3 if sheet else None,
        layers=model["layers"],
        kernels_per_layer=int(per_layer.mode().iloc[0]) if len(per_layer) else 0,
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


def census_beside_published(run: runs.Run) -> pd.DataFrame:
    """Our census and the published H100 one, side by side, each under its own heading."""
    from .published import QWEN3_8B_H100_CENSUS as pub

    ours = run.table("census").set_index("kind")
    theirs = pub.set_index("kind")
    gpu = run.provenance["gpu"].replace("NVIDIA ", "")
    out = pd.DataFrame({
        (f"{gpu} (this run)", "kernels"): ours["kernels"],
        (f"{gpu} (this run)", "GPU ms"): (ours["gpu_ns"] / 1e6).round(2),
        (f"{gpu} (this run)", "share"): (ours["share"] * 100).round(0).astype(int).astype(str) + "%",
        ("H100 (published)", "kernels"): theirs["kernels"],
        ("H100 (published)", "GPU ms"): theirs["gpu_ms"],
        ("H100 (published)", "share"): (theirs["share"] * 100).round(0).astype(int).astype(str) + "%",
    })
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
    return pd.DataFrame({
        "start µs": ((k.start_ns - t0) / 1e3).round(2),
        "module": k.module.str.replace(rf"^layers\.{layer}\.?", "", regex=True).replace("", "(layer)"),
        "operator": k.op,
        "kernel": k.name.map(lambda n: kernels.short_name(n, width=48)),
        "kind": k.kind,
        "µs": (k.dur_ns / 1e3).round(2),
    }).reset_index(drop=True)


def context_sweep(run: runs.Run) -> pd.DataFrame:
    """Attention's share of GPU time at each context length."""
    s = run.table("context_sweep")
    ok = s[s.status == "ok"].copy()
    ok["attention share"] = ok.attention_ns / ok.kernel_ns
    ok["attention ms"] = ok.attention_ns / 1e6
    ok["GPU ms"] = ok.kernel_ns / 1e6
    return ok


def attention_kernel_names(run: runs.Run) -> list[str]:
    """Distinct (short) names of the attention kernels in the profiled step."""
    k = kernel_table(run)
    return sorted(set(k.loc[k.kind == "attention", "name"].map(lambda n: kernels.short_name(n, width=44))))


def middle_layer(run: runs.Run) -> int:
    return int(run.results["model"]["layers"]) // 2



def headline(run: runs.Run) -> dict:
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


# The weight matrices of a decoder layer and the LM head, by the name of their module.
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "lm_head")


def projection_shapes(preset: str) -> dict[str, tuple[int, int]]:
    """(rows, columns) of each weight matrix of a Qwen3-style model, from its configuration."""
    from . import models

    c = models.preset_config(preset)
    q, kv, h, i = c["num_attention_heads"] * c["head_dim"], c["num_key_value_heads"] * c["head_dim"], \
        c["hidden_size"], c["intermediate_size"]
    return {"q_proj": (q, h), "k_proj": (kv, h), "v_proj": (kv, h), "o_proj": (h, q),
            "gate_proj": (i, h), "up_proj": (i, h), "down_proj": (h, i), "lm_head": (c["vocab_size"], h)}


def gemv_by_shape(run: runs.Run) -> pd.DataFrame:
    """Every weight matrix of the step by shape: bytes it holds, its kernels' time per call
    (the matrix-vector kernel plus cuBLAS's split-K reduction where there is one), the read
    bandwidth that makes, and which kernel cuBLAS chose."""
    k = kernel_table(run)
    mm = k[k.kind == "matrix multiply"].copy()
    mm["projection"] = mm.module.str.extract(r"(?:^|\.)(\w+)$")[0]
    mm = mm[mm.projection.isin(PROJECTIONS)]
    mm["call"] = mm.layer.astype("string").fillna("") + ":" + mm.projection
    shapes = projection_shapes(run.parameters["preset"])
    lim = hardware.run_limits(run)
    rows = []
    for proj, g in mm.groupby("projection", sort=False):
        per_call = g.groupby("call").dur_ns.sum()
        main = g[~g.name.str.contains("splitKreduce")]
        rows_, cols = shapes[proj]
        nbytes = rows_ * cols * 2
        us = float(per_call.median()) / 1e3
        rows.append({"projection": proj, "shape": f"{rows_:,} x {cols:,}", "bytes": nbytes,
                     "calls": len(per_call), "us_per_call": us, "tbs": nbytes / (us * 1e-6) / 1e12,
                     "kernel": kernels.short_name(main.name.mode().iloc[0], width=48),
                     "split_k": bool(g.name.str.contains("splitKreduce").any()),
                     "of_datasheet": hardware.of_bandwidth(nbytes, us / 1e3, lim.datasheet_tbs),
                     "of_measured": hardware.of_bandwidth(nbytes, us / 1e3, lim.read_or_copy_tbs)})
    order = {p: i for i, p in enumerate(PROJECTIONS)}
    return pd.DataFrame(rows).sort_values("projection", key=lambda s: s.map(order)).reset_index(drop=True)


def gemv_figure(g: pd.DataFrame, run: runs.Run):
    """Read bandwidth of each weight matrix's kernels against the ceilings."""
    import matplotlib.pyplot as plt

    from . import plots

    lim = hardware.run_limits(run)
    fig, ax = plt.subplots(figsize=(8, 3.6))
    labels = [f"{p}  ({s}, {b / 1e6:,.0f} MB)" for p, s, b in zip(g.projection, g["shape"], g.bytes, strict=True)]
    ax.barh(labels, g.tbs, color=[plots.OURS if not s else "#8fb0d6" for s in g.split_k])
    for tbs, name, style in ((lim.datasheet_tbs, "datasheet", "-"),
                             (lim.read_tbs, "read stream (measured)", "--"),
                             (None if lim.read_tbs else lim.copy_tbs, "copy (measured)", ":")):
        if tbs:
            ax.axvline(tbs, color="#555", ls=style, lw=1, label=f"{name}: {tbs:.2f} TB/s")
    for y, v in enumerate(g.tbs):
        ax.text(v, y, f" {v:.2f}", va="center", fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, max(g.tbs.max(), lim.datasheet_tbs or 0) * 1.25)
    ax.legend(loc="upper right", fontsize=8)
    ax.set_xlabel("TB/s read (weights / kernel time per call; light bars: split-K)")
    ax.set_title("Read bandwidth of each matrix-vector product of the step")
    return plots._finish(fig, run.label)
