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

from labsupport.measure import hardware
from labsupport.traces import kernels, trace
from labsupport import runs
from labsupport.measure import recording

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




def record(params: Params | None = None, run_id: str | None = None, allow_cpu: bool = False,
           progress=_progress) -> runs.Run:
    """Measure this GPU now and write a new run (not published). Returns the run.

    Every wall time is taken before the first profile of the process (labsupport.measure.harness),
    or in fresh processes; then the steps are profiled; then the step is timed once more,
    with CUPTI attached, to show what the profiler does to the measurement."""
    import torch

    from labsupport.measure import decode, fresh, harness, models

    params = params or Params()
    device = params.device
    harness.for_chapter(CHAPTER)
    with recording.writer(CHAPTER, params, run_id, allow_cpu=allow_cpu) as w:
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

        sweep = ContextSweep(model, params, progress)
        sweep.time(prompt, times)

        progress(f"profiling one decode step (batch {params.batch}, prompt {params.prompt_len})")
        trace_path = w.path / TRACE_FILE
        table = kernels.annotate(decode.profile_decode_step(model, prompt, device, trace_path))
        w.write_table("kernels", table)
        w.write_table("census", kernels.census(table))
        progress(f"  {len(table)} kernels")

        progress("timing the same step again, now that the process has profiled")
        after = decode.time_decode_steps(model, prompt, device, repeats=params.repeats, allow_after_profile=True)
        span_ms = trace.origin_span_ns(trace.load_events(trace_path), "decode_step") / 1e6
        w.write_table("profiler_effect", profiler_effect_table(procs, times, after, span_ms))

        sweep.profile(w.path, table)
        w.write_table("context_sweep", sweep.table())
        w.write_table("context_census", pd.DataFrame(sweep.census_rows))
        del model
    return runs.load_run(CHAPTER, w.run_id)


class ContextSweep:
    """The decode step at several context lengths, with transformers' dynamic cache (as written)
    and with a static cache (preallocated: the new token's keys and values are written in
    place instead of concatenated). Everything is timed first, then profiled."""

    def __init__(self, model, params: Params, progress):
        self.model, self.params, self.progress = model, params, progress
        self.prompts, self.dynamic, self.static, self.static_steps = {}, {}, {}, {}
        self.rows: dict[int, dict] = {}
        self.census_rows: list[dict] = []

    def _oom(self, ctx: int, what: str) -> None:
        import torch

        self.rows.setdefault(ctx, {"context": ctx})["status"] = f"out of memory ({what})"
        self.progress(f"  context {ctx}: out of GPU memory ({what}), recorded as such")
        for d in (self.prompts, self.dynamic, self.static, self.static_steps):
            d.pop(ctx, None)
        torch.cuda.empty_cache()

    def time(self, prompt, prompt_times) -> None:
        """Time both caches at every context; the prompt's own dynamic step was timed already."""
        import torch

        from labsupport.measure import decode, harness, steps

        p, device = self.params, self.params.device
        for ctx in p.contexts:
            self.progress(f"context {ctx}: timing (dynamic and static cache)")
            try:
                if ctx == p.prompt_len:  # the step measured above: one configuration, one measurement
                    self.prompts[ctx], self.dynamic[ctx] = prompt, prompt_times
                else:
                    self.prompts[ctx] = decode.Prompt.random(self.model.config.vocab_size, p.batch, ctx, device,
                                                             seed=ctx)
                    self.dynamic[ctx] = decode.time_decode_steps(self.model, self.prompts[ctx], device,
                                                                 repeats=p.context_repeats, warmup=1)
                step = self.static_steps[ctx] = steps.StaticStep(self.model, self.prompts[ctx].ids)
                self.static[ctx] = harness.time_region(step, setup=steps.setup(step), device=device,
                                                       what=f"static-cache step, {ctx} tokens",
                                                       repeats=p.context_repeats, warmup=1)
            except torch.OutOfMemoryError:
                self._oom(ctx, "timing")

    def profile(self, folder, prompt_table: pd.DataFrame) -> None:
        """Profile both caches at every context that was timed."""
        import torch

        from labsupport.measure import decode, harness, steps

        p, device = self.params, self.params.device
        for ctx in list(self.prompts):
            self.progress(f"context {ctx}: profiling (dynamic and static cache)")
            tmp = folder / f".ctx-{ctx}.json.gz"
            try:
                if ctx == p.prompt_len:
                    dyn = prompt_table  # the step profiled above
                else:
                    dyn = kernels.annotate(decode.profile_decode_step(self.model, self.prompts[ctx], device, tmp,
                                                                      warmup=1))
                step = self.static_steps.pop(ctx)
                stat = kernels.annotate(harness.profile_region(step, tmp, region="decode_step", device=device,
                                                               setup=steps.setup(step), warmup=1))
                tmp.unlink(missing_ok=True)
                del step
            except torch.OutOfMemoryError:
                self._oom(ctx, "profile")
                continue
            for cache, k in (("dynamic", dyn), ("static", stat)):
                for r in kernels.census(k).itertuples():
                    self.census_rows.append({"context": ctx, "cache": cache, "kind": r.kind,
                                             "kernels": r.kernels, "gpu_ns": r.gpu_ns})
            self.rows[ctx] = {"context": ctx, "status": "ok", **_context_row(dyn, self.dynamic[ctx]),
                              **{f"static_{k}": v for k, v in _context_row(stat, self.static[ctx]).items()
                                 if k != "attention_names"}}

    def table(self) -> pd.DataFrame:
        return pd.DataFrame([self.rows[c] for c in self.params.contexts if c in self.rows])


def _context_row(k: pd.DataFrame, t) -> dict:
    """One cache's step at one context: kernels, GPU time by what matters for the KV cache, wall."""
    attention = k.kind == "attention"
    return {"kernels": len(k), "gpu_busy_ns": trace.busy_ns(k.start_ns, k.end_ns),
            "kernel_ns": int(k.dur_ns.sum()), "attention_ns": int(k.loc[attention, "dur_ns"].sum()),
            "attention_kernels": int(attention.sum()),
            "attention_names": ";".join(sorted(set(k.loc[attention, "short_name"]))),
            "copy_ns": int(k.loc[k.kind == "copy/convert/concat", "dur_ns"].sum()),
            "cat_ns": int(k.loc[k.op == "aten::cat", "dur_ns"].sum()),
            "wall_ms_median": t.median, "wall_ms_min": t.low, "wall_ms_max": t.high, "wall_clean": t.clean}


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
    return kernels.census(kernels.annotate(trace.read_kernels(run.file(TRACE_FILE), device=device)))


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
    from labsupport.chapters.published import QWEN3_8B_H100_CENSUS as pub

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
    from labsupport.measure import models

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

    from labsupport import figures as plots

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
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.22), ncol=2, fontsize=8, frameon=False)
    ax.set_xlabel("TB/s read (weights / kernel time per call; light bars: split-K)")
    ax.set_title("Read bandwidth of each matrix-vector product of the step")
    return plots.finish(fig, run.label)


def kv_bytes_per_token(preset: str) -> int:
    """Bytes of keys and values one token adds to the cache, over all layers (BF16)."""
    from labsupport.measure import models

    c = models.preset_config(preset)
    return 2 * c["num_hidden_layers"] * c["num_key_value_heads"] * c["head_dim"] * 2


def kv_cache_traffic(run: runs.Run) -> pd.DataFrame:
    """Per context: the KV cache's size; what transformers' dynamic cache does with it every
    step (concatenate the new token: read the whole cache and write it again, 2x its bytes)
    and what attention does (read it once); the time and bandwidth of each; and, where the run
    measured it, the same step with a static cache, which writes the new token in place.

    `cat ms` is every concatenation in the step (aten::cat); at long contexts they are almost
    all the cache's (the rotary embedding's small ones stay constant)."""
    s = run.table("context_sweep")
    s = s[s.status == "ok"].copy()
    per_token = kv_bytes_per_token(run.parameters["preset"]) * int(run.parameters.get("batch", 1))
    out = pd.DataFrame({"context": s.context})
    out["cache GB"] = s.context * per_token / 1e9
    out["concat GB moved"] = 2 * out["cache GB"]
    out["copy ms"] = s.copy_ns / 1e6 if "copy_ns" in s else _census_copy_ms(run, s.context)
    out["cat ms"] = s.cat_ns / 1e6 if "cat_ns" in s else float("nan")
    out["concat TB/s"] = out["concat GB moved"] / out["cat ms"]
    out["attention ms"] = s.attention_ns / 1e6
    out["attention TB/s"] = out["cache GB"] / out["attention ms"]
    out["GPU ms, dynamic"] = s.kernel_ns / 1e6
    has_static = "static_kernel_ns" in s
    out["GPU ms, static"] = s.static_kernel_ns / 1e6 if has_static else float("nan")
    out["cat ms, static"] = s.static_cat_ns / 1e6 if has_static else float("nan")
    out["copy ms, static"] = s.static_copy_ns / 1e6 if has_static else float("nan")
    out["attention ms, static"] = s.static_attention_ns / 1e6 if has_static else float("nan")
    out["wall ms, dynamic"] = s.wall_ms_median
    out["wall ms, static"] = s.static_wall_ms_median if has_static else float("nan")
    return out.reset_index(drop=True)


def kv_cache_figure(t: pd.DataFrame, run: runs.Run):
    """Time per step spent concatenating the cache and in attention, by context, for both caches."""
    import matplotlib.pyplot as plt

    from labsupport import figures as plots

    fig, ax = plt.subplots(figsize=(7.5, 3.6))
    x = t.context
    has_cat = t["cat ms"].notna().all()
    ax.plot(x, t["cat ms"] if has_cat else t["copy ms"], "o-", color=plots.KIND_COLORS["copy/convert/concat"],
            label="concatenations, dynamic cache" if has_cat else "all copies and concatenations, dynamic cache")
    ax.plot(x, t["attention ms"], "o-", color=plots.KIND_COLORS["attention"], label="attention, dynamic cache")
    if t["GPU ms, static"].notna().any():
        ax.plot(x, t["cat ms, static"], "s--", color=plots.KIND_COLORS["copy/convert/concat"],
                label="concatenations, static cache")
        ax.plot(x, t["attention ms, static"], "s--", color=plots.KIND_COLORS["attention"],
                label="attention, static cache")
        ax.plot(x, t["copy ms, static"], "^:", color="#555", label="all copies and conversions, static cache")
        ax.set_yscale("log")
    ax.set_xscale("log", base=2)
    ax.set_xticks(list(x), [f"{v:,}" for v in x])
    ax.set_xlabel("tokens of context")
    ax.set_ylabel("GPU ms per decode step" + (" (log)" if t["GPU ms, static"].notna().any() else ""))
    ax.set_title("The KV cache: copied every step (dynamic cache) vs read once (attention)")
    ax.legend(fontsize=8)
    return plots.finish(fig, run.label)


def _census_copy_ms(run: runs.Run, contexts) -> list[float]:
    """Copy/convert/concat time per context from the context census (runs before `copy_ns`)."""
    c = run.table("context_census")
    c = c[c.kind == "copy/convert/concat"].set_index("context")
    return [float(c.gpu_ns.get(x, float("nan"))) / 1e6 for x in contexts]


def kv_cache_text(run: runs.Run) -> str:
    """What the long-context steps say about the KV cache, in two or three sentences."""
    t = kv_cache_traffic(run).iloc[-1]
    lim = hardware.run_limits(run)
    sheet = f" ({t['attention TB/s'] / lim.datasheet_tbs:.0%} of the datasheet's {lim.datasheet_tbs:.1f})" \
        if lim.datasheet_tbs else ""
    ctx = f"{int(t.context):,}"
    if t["cat ms"] == t["cat ms"]:
        concat = (f"every step it reads the whole cache and writes it again, {t['concat GB moved']:.1f} GB moved, "
                  f"and its concatenations take {t['cat ms']:.2f} ms ({t['concat TB/s']:.2f} TB/s)")
    else:
        concat = (f"every step it reads the whole cache and writes it again, {t['concat GB moved']:.1f} GB moved; "
                  f"this run recorded the copy kernels' time only as a kind, {t['copy ms']:.2f} ms")
    text = (f"At {ctx} tokens the cache holds {t['cache GB']:.1f} GB. transformers' dynamic cache appends each new "
            f"token by concatenation: {concat}. Attention itself reads the cache once, {t['cache GB']:.1f} GB in "
            f"{t['attention ms']:.2f} ms, {t['attention TB/s']:.2f} TB/s{sheet}.")
    if t["GPU ms, static"] == t["GPU ms, static"]:
        text += (f" With a static cache, allocated once at its full length so that the new token's keys and values "
                 f"are written in place, the concatenations at {ctx} tokens take {t['cat ms, static']:.2f} ms. Yet "
                 f"transformers' eager step does not get faster for it: all its copies and conversions take "
                 f"{t['copy ms, static']:.2f} ms ({t['copy ms']:.2f} ms with the dynamic cache) and attention over "
                 f"the preallocated cache {t['attention ms, static']:.2f} ms, so the step's GPU time is "
                 f"{t['GPU ms, static']:.2f} ms instead of {t['GPU ms, dynamic']:.2f} ms (wall "
                 f"{t['wall ms, static']:.1f} ms against {t['wall ms, dynamic']:.1f} ms). Which operations make "
                 "those copies is not broken down by this run; the static step's own trace at long context would "
                 "tell.")
    else:
        text += " This run did not measure the same step with a static cache; runs recorded since do."
    return text
