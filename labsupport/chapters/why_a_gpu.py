"""Chapter "Why a GPU": the per-token arithmetic, one matrix-vector product on the CPU
and the GPU, and a batch sweep of the decode step that finds where math, not memory,
becomes the limit (the ridge point).

Live, every time is taken before the first profile of the process (labsupport.measure.harness):
the ceilings, the sweep's wall times at every batch size, the GPU's matrix-vector product
per call and the CPU's; then the profiles that give the GPU times (one decode step per
batch size, the matrix-vector product alone)."""
from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

from labsupport.measure import hardware, harness, models
from labsupport.traces import kernels
from labsupport.chapters import published
from labsupport import runs
from labsupport.measure import recording

CHAPTER = "why-a-gpu"
DECODE_WARMUP = 2   # untimed (or traced-and-discarded) steps on each batch's fresh cache

# What each time in the matvec table is.
KERNEL_TIME = "kernel time (profiler)"
PER_CALL = "per call (CUDA events)"
HOST_CLOCK = "host clock"


@dataclass
class Params:
    preset: str = "qwen3-8b"
    prompt_len: int = 256
    batches: list[int] = field(default_factory=lambda: [1, 2, 4, 8, 16, 32, 64, 128, 160, 192, 224, 256, 384, 512])
    steps: int = 5
    matvec_repeats: int = 20
    device: str = "cuda"


def _progress(msg: str) -> None:
    print(f"[{CHAPTER}] {msg}", flush=True)


def per_token_arithmetic(counts: models.ModelCounts, sheet: hardware.Datasheet | None,
                         memory_tbs: float | None = None, gemm_tflops: float | None = None) -> pd.DataFrame:
    """Time for one token's weights at peak math and at peak memory bandwidth (the
    datasheet's, and the ceilings measured in the run: `memory_tbs` is the read stream where
    the run measured one, else the copy)."""
    rows = []
    ceilings = []
    if sheet:
        ceilings.append((f"{sheet.name} datasheet", sheet.bf16_tflops, sheet.bandwidth_tbs))
    if memory_tbs and gemm_tflops:
        ceilings.append(("measured on this GPU", gemm_tflops, memory_tbs))
    for name, tflops, tbs in ceilings:
        math_ms = counts.decode_flops / (tflops * 1e12) * 1e3
        mem_ms = counts.decode_bytes / (tbs * 1e12) * 1e3
        rows.append({"ceilings": name, "TFLOP/s": tflops, "TB/s": tbs, "math ms": math_ms,
                     "memory ms": mem_ms, "memory / math": mem_ms / math_ms,
                     "ridge FLOP/byte": tflops / tbs})
    return pd.DataFrame(rows)


# Live: the matrix-vector product -------------------------------------------------------

def _matvec_row(device: str, dtype: str, timing: str, ms: list[float], nbytes: int) -> dict:
    s = pd.Series(ms, dtype=float)
    return {"device": device, "dtype": dtype, "timing": timing, "ms_median": float(s.median()),
            "ms_min": float(s.min()), "ms_max": float(s.max()), "repeats": len(s), "bytes": nbytes}


def _matvec_table(rows: list[dict], out_features: int, in_features: int) -> pd.DataFrame:
    df = pd.DataFrame(rows)
    df["GB/s"] = df["bytes"] / (df["ms_median"] * 1e-3) / 1e9
    df["shape"] = f"{out_features} x {in_features}"
    return df


def time_matvec_cpu(out_features: int, in_features: int, repeats: int) -> list[dict]:
    """One weight matrix times one vector on the CPU, in float32 and BF16 (host clock).

    Many CPUs have no fast BF16 path for this product (PyTorch converts as it goes), so
    float32 is the fair CPU number; both are recorded."""
    import torch

    w = torch.randn(out_features, in_features, dtype=torch.bfloat16)
    x = torch.randn(in_features, dtype=torch.bfloat16)
    name = f"CPU ({torch.get_num_threads()} threads)"
    rows = []
    for dtype, (wd, xd) in (("float32", (w.float(), x.float())), ("bfloat16", (w, x))):
        t = harness.time_region(lambda wd=wd, xd=xd: torch.mv(wd, xd), what=f"CPU matrix-vector product, {dtype}",
                                device="cpu", repeats=repeats, warmup=3)
        rows.append(_matvec_row(name, dtype, HOST_CLOCK, t.wall_ms, wd.numel() * wd.element_size()))
    return rows


def _gpu_matvec_operands(out_features: int, in_features: int, device: str):
    import torch

    g = torch.Generator(device="cpu").manual_seed(0)
    w = torch.randn(out_features, in_features, dtype=torch.bfloat16, generator=g).to(device)
    x = torch.randn(in_features, dtype=torch.bfloat16, generator=g).to(device)
    return w, x


def _device_name(device: str) -> str:
    import torch

    return torch.cuda.get_device_name(0) if device == "cuda" else device


def time_matvec_gpu(w, x, repeats: int, device: str) -> dict:
    """The GPU's product per call from Python: CUDA events just before and after each call
    (the launch included)."""
    import torch

    t = harness.time_region(lambda: torch.mv(w, x), what="GPU matrix-vector product, per call",
                            device=device, repeats=max(repeats, 50), warmup=10)
    return _matvec_row(_device_name(device), "bfloat16", PER_CALL, t.gpu_ms or t.wall_ms,
                       w.numel() * w.element_size())


def profile_matvec_gpu(w, x, device: str, trace_path) -> tuple[dict, list[str]]:
    """The GPU's product as its kernels alone (one profiled call, after warm-up calls in the
    same profiler session): their summed duration, and their short names."""
    import torch

    k = harness.profile_region(lambda: torch.mv(w, x), trace_path, region="matvec", device=device, warmup=3)
    ms = float(k.dur_ns.sum()) / 1e6
    return (_matvec_row(_device_name(device), "bfloat16", KERNEL_TIME, [ms], w.numel() * w.element_size()),
            [kernels.short_name(n) for n in k.name])


# Live: the batch sweep ------------------------------------------------------------------

def _steps_on_fresh_cache(model, batch: int, prompt_len: int, device: str):
    """A fresh prefill of `batch` random prompts, and a function that runs the next decode
    step on its cache (each step adds one token to every sequence)."""
    from labsupport.measure import decode

    prompt = decode.Prompt.random(model.config.vocab_size, batch, prompt_len, device, seed=batch)
    cache, tok = decode.prefill(model, prompt)
    state = {"tok": tok}

    def step():
        state["tok"] = decode.decode_step(model, cache, state["tok"])

    return step, cache


def time_batch(model, batch: int, prompt_len: int, steps: int, device: str) -> tuple[harness.Timing, int]:
    """Wall times of `steps` decode steps at one batch size: a fresh prefill, DECODE_WARMUP
    untimed steps, then the timed ones, one after another on the same cache. Returns the
    timing and the context length after the last step."""
    step, cache = _steps_on_fresh_cache(model, batch, prompt_len, device)
    t = harness.time_region(step, what=f"decode step, batch {batch}", device=device, repeats=steps,
                            warmup=DECODE_WARMUP)
    return t, cache.get_seq_length()


def batch_matmuls(batch: int, k: pd.DataFrame) -> pd.DataFrame:
    """The matrix-multiply kernels of one batch size's profiled step, grouped by kernel name and
    launch grid (which cuBLAS kernel ran, how it tiled the work, split-K or not)."""
    mm = k[k["name"].map(kernels.classify) == "matrix multiply"]
    g = mm.groupby(["name", "grid", "block"], sort=False).dur_ns.agg(kernels="count", gpu_ns="sum").reset_index()
    g.insert(0, "batch", batch)
    g["short_name"] = g["name"].map(kernels.short_name)
    return g


def profile_batch(model, batch: int, prompt_len: int, device: str, trace_path) -> tuple[pd.DataFrame, int]:
    """The kernels of one decode step at one batch size: a fresh prefill, DECODE_WARMUP steps
    traced and discarded in the same profiler session, then the kept step. Returns the kernel
    table and the context length after the kept step."""
    step, cache = _steps_on_fresh_cache(model, batch, prompt_len, device)
    k = harness.profile_region(step, trace_path, region="decode_step", device=device, warmup=DECODE_WARMUP)
    k["kind"] = k["name"].map(kernels.classify)
    return k, cache.get_seq_length()


def sweep_row(batch: int, timing: harness.Timing, context_end: int, k: pd.DataFrame, context_profiled: int) -> dict:
    """One batch size of the sweep: GPU times from its profiled step, wall times from its
    timed steps."""
    from labsupport.traces import trace

    return {"batch": batch, "status": "ok", "kernels": len(k),
            "gpu_busy_ns": trace.busy_ns(k.start_ns, k.end_ns), "kernel_ns": int(k.dur_ns.sum()),
            "matmul_ns": int(k.loc[k.kind == "matrix multiply", "dur_ns"].sum()),
            "attention_ns": int(k.loc[k.kind == "attention", "dur_ns"].sum()),
            "wall_ms_median": timing.median, "wall_ms_min": timing.low, "wall_ms_max": timing.high,
            "issue_ms_median": float(pd.Series(timing.issue_ms).median()), "wall_repeats": len(timing.wall_ms),
            "wall_clean": timing.clean, "context_end": context_end, "context_profiled": context_profiled}


def _free(device: str) -> None:
    """Give the memory of a finished batch size back (outside any `except` block: a caught
    exception's traceback still holds the batch's cache)."""
    import gc

    gc.collect()
    if device == "cuda":
        import torch

        torch.cuda.empty_cache()


def record(params: Params | None = None, run_id: str | None = None, allow_cpu: bool = False,
           progress=_progress) -> runs.Run:
    """Measure this GPU now and write a new run (not published).

    Order: ceilings; the sweep's wall times at every batch size; the matrix-vector product
    per call on the GPU, then on the CPU; then (the process's first profiles) one decode step
    per batch size, and the GPU's product alone. A batch size that runs out of GPU memory is
    recorded as such and the larger ones are skipped."""
    import torch

    params = params or Params()
    device = params.device
    harness.for_chapter(CHAPTER)
    with recording.writer(CHAPTER, params, run_id, allow_cpu=allow_cpu) as w:
        w.extra["method"] = harness.method()
        if device == "cuda":
            hardware.record_ceilings(w, progress)
        progress(f"building {params.preset} with random BF16 weights on {device}")
        model = models.build_model(params.preset, device=device)
        counts = models.count_model(model, params.preset)
        w.extra["model"] = counts.as_record()
        cfg = model.config
        w.extra["kv_bytes_per_token"] = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * 2

        # 1. Every time first, before any profile.
        timed, stopped, step_rows = {}, {}, []
        for b in params.batches:
            progress(f"batch {b}: timing {params.steps} decode steps")
            try:
                timed[b] = time_batch(model, b, params.prompt_len, params.steps, device)
            except torch.OutOfMemoryError:
                stopped[b] = {"batch": b, "status": "out of memory"}
                progress(f"  batch {b}: out of GPU memory, recorded as such; larger batches skipped")
            _free(device)
            if b in stopped:
                break
            step_rows += timed[b][0].rows(batch=b)
            progress(f"  wall {timed[b][0].median:.2f} ms (min {timed[b][0].low:.2f}, max {timed[b][0].high:.2f})")
        if step_rows:
            w.write_table("batch_times", pd.DataFrame(step_rows))

        out_f, in_f = cfg.intermediate_size, cfg.hidden_size
        progress(f"one {out_f} x {in_f} weight matrix times one vector: the GPU per call, then the CPU")
        mw, mx = _gpu_matvec_operands(out_f, in_f, device)
        mv_rows = [time_matvec_gpu(mw, mx, params.matvec_repeats, device)]
        # The CPU product comes after every GPU wall time: it wakes a pool of CPU threads,
        # which then compete with the Python thread that launches the GPU's kernels and slow
        # the launches down. The profiles that follow measure kernels on the GPU, which the
        # pool does not touch.
        mv_rows += time_matvec_cpu(out_f, in_f, params.matvec_repeats)

        # 2. Then the profiles.
        tmp = w.path / ".profile.json.gz"
        rows, matmul_rows = [], []
        for b, (timing, context_end) in timed.items():
            progress(f"batch {b}: profiling one decode step")
            k = None
            try:
                k, context_profiled = profile_batch(model, b, params.prompt_len, device, tmp)
            except torch.OutOfMemoryError:
                stopped = {b: {"batch": b, "status": "out of memory (profile)"}}
                progress(f"  batch {b}: out of GPU memory while profiling, recorded as such; larger batches skipped")
            _free(device)
            if k is None:
                break
            rows.append(sweep_row(b, timing, context_end, k, context_profiled))
            matmul_rows.append(batch_matmuls(b, k))
            progress(f"  GPU {rows[-1]['gpu_busy_ns'] / 1e6:.2f} ms busy, {len(k)} kernels")
        w.write_table("batch_sweep", pd.DataFrame(rows + list(stopped.values())))
        if matmul_rows:
            w.write_table("batch_matmuls", pd.concat(matmul_rows, ignore_index=True))
        del model
        _free(device)

        progress("profiling the GPU's matrix-vector product")
        kernel_row, names = profile_matvec_gpu(mw, mx, device, tmp)
        w.extra["matvec_kernels"] = names
        tmp.unlink(missing_ok=True)
        w.write_table("matvec", _matvec_table([kernel_row] + mv_rows, out_f, in_f))
    return runs.load_run(CHAPTER, w.run_id)


# Replay ---------------------------------------------------------------------------------

def load(run_id: str | None = None) -> runs.Run:
    return runs.load_run(CHAPTER, run_id)


def ceilings(run: runs.Run) -> hardware.Ceilings:
    return hardware.Ceilings.from_row(run.table("ceilings").iloc[0])


def counts(run: runs.Run) -> models.ModelCounts:
    m = run.results["model"]
    return models.ModelCounts(**{k: m[k] for k in models.ModelCounts.__dataclass_fields__})


def arithmetic(run: runs.Run) -> pd.DataFrame:
    lim = hardware.run_limits(run)
    return per_token_arithmetic(counts(run), hardware.datasheet_or_none(run.provenance["gpu"]),
                                lim.read_or_copy_tbs, lim.gemm_tflops)


def matvec(run: runs.Run) -> pd.DataFrame:
    """The matrix-vector product's table, with what each time is (`timing`). Older runs
    timed the CPU with the host clock and the GPU per call with CUDA events, and did not
    profile the GPU's kernel."""
    mv = run.table("matvec")
    if "timing" not in mv:
        mv["timing"] = [HOST_CLOCK if d.startswith("CPU") else PER_CALL for d in mv.device]
    return mv


@dataclass
class Matvec:
    """The product's headline numbers (ms); `gpu_kernel_ms` is None for runs that did not
    profile it."""

    shape: str
    mb: float                  # the BF16 weight matrix
    cpu_threads: str
    cpu32_ms: float
    cpu32_gbs: float
    cpu16_ms: float
    gpu_call_ms: float
    gpu_call_gbs: float
    gpu_kernel_ms: float | None
    gpu_kernel_gbs: float | None
    kernels: list[str]

    @property
    def cpu_fair_ms(self) -> float:
        """The CPU's faster product (float32 on CPUs without a fast BF16 path)."""
        return min(self.cpu32_ms, self.cpu16_ms)

    @property
    def gpu_ms(self) -> float:
        """The GPU's kernel time where the run profiled it, else its time per call."""
        return self.gpu_kernel_ms if self.gpu_kernel_ms is not None else self.gpu_call_ms

    @property
    def speedup(self) -> float:
        return self.cpu_fair_ms / self.gpu_ms


def matvec_summary(run: runs.Run) -> Matvec:
    mv = matvec(run)
    cpu = mv[mv.device.str.startswith("CPU")].set_index("dtype")
    gpu = mv[~mv.device.str.startswith("CPU")].set_index("timing")
    call = gpu.loc[PER_CALL]
    kernel = gpu.loc[KERNEL_TIME] if KERNEL_TIME in gpu.index else None
    bf16 = mv[mv.dtype == "bfloat16"].bytes.iloc[0]
    return Matvec(shape=mv["shape"].iloc[0], mb=float(bf16) / 1e6,
                  cpu_threads=cpu.device.iloc[0].split("(")[-1].rstrip(")"),
                  cpu32_ms=float(cpu.loc["float32", "ms_median"]), cpu32_gbs=float(cpu.loc["float32", "GB/s"]),
                  cpu16_ms=float(cpu.loc["bfloat16", "ms_median"]),
                  gpu_call_ms=float(call.ms_median), gpu_call_gbs=float(call["GB/s"]),
                  gpu_kernel_ms=float(kernel.ms_median) if kernel is not None else None,
                  gpu_kernel_gbs=float(kernel["GB/s"]) if kernel is not None else None,
                  kernels=list(run.results.get("matvec_kernels", [])))


def attention_flop_per_context_token(run: runs.Run) -> int:
    """Attention's operations for one new token, per token of context it attends to: the
    scores (Q·Kᵀ) and the weighted sum of the values, a multiply and an add each, for every
    query head of every layer (the model's configuration, from its preset)."""
    cfg = models.preset_config(run.parameters["preset"])
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    return 4 * cfg["num_attention_heads"] * head_dim * cfg["num_hidden_layers"]


def sweep(run: runs.Run) -> pd.DataFrame:
    """The batch sweep with the derived rates: per-step times, tokens/s, bytes and operations
    per step (weights and KV cache), bandwidth, FLOP/s, and the step's limits.

    A step must read every weight once (`weights bytes`) and each sequence's KV cache once
    (`KV bytes`: batch x context x bytes per cached token, at the context of the profiled step,
    whose GPU time this is; older runs recorded only the context after all steps, a few tokens
    more). Its operations are the matrix multiplies' (2 per weight per sequence) plus
    attention's (grows with the context). `limit ms` is the roofline: the longer of the bytes at
    the datasheet's bandwidth and the operations at its math rate; `read floor ms` is the bytes
    at the bandwidth measured in the run (read stream, or copy in older runs)."""
    s = run.table("batch_sweep")
    ok = s[s.status == "ok"].copy()
    c = counts(run)
    kv = run.results["kv_bytes_per_token"]
    lim = hardware.run_limits(run)
    read_tbs, _ = hardware.measured_read(lim)
    nan = float("nan")
    ok["GPU ms"] = ok.gpu_busy_ns / 1e6
    ok["matmul ms"] = ok.matmul_ns / 1e6
    ok["attention ms"] = ok.attention_ns / 1e6
    ok["other ms"] = (ok.kernel_ns - ok.matmul_ns - ok.attention_ns) / 1e6
    ok["tokens/s"] = ok.batch / (ok.wall_ms_median / 1e3)
    ok["GPU tokens/s"] = ok.batch / (ok["GPU ms"] / 1e3)
    ok["context"] = ok.context_profiled if "context_profiled" in ok else ok.context_end
    ok["weights bytes"] = c.decode_bytes
    ok["KV bytes"] = ok.batch * ok.context * kv
    ok["bytes"] = ok["weights bytes"] + ok["KV bytes"]
    ok["FLOP"] = ok.batch * (c.decode_flops + ok.context * attention_flop_per_context_token(run))
    ok["FLOP/byte"] = ok["FLOP"] / ok["bytes"]
    ok["TB/s"] = ok["bytes"] / (ok["GPU ms"] / 1e3) / 1e12
    ok["attention TB/s"] = ok["KV bytes"] / (ok["attention ms"] / 1e3) / 1e12
    ok["matmul TFLOP/s"] = c.decode_flops * ok.batch / (ok["matmul ms"] / 1e3) / 1e12
    # The whole step against its limits.
    ok["memory limit ms"] = ok["bytes"] / (lim.datasheet_tbs * 1e9) if lim.datasheet_tbs else nan
    ok["math limit ms"] = ok["FLOP"] / (lim.datasheet_tflops * 1e9) if lim.datasheet_tflops else nan
    ok["limit ms"] = ok[["memory limit ms", "math limit ms"]].max(axis=1, skipna=False)
    ok["read floor ms"] = ok["bytes"] / (read_tbs * 1e9) if read_tbs else nan
    ok["of limit"] = ok["limit ms"] / ok["GPU ms"]
    # The matrix multiplies against theirs (the weight matrices' bytes; their operations).
    ok["matmul memory limit ms"] = c.matmul_bytes / (lim.datasheet_tbs * 1e9) if lim.datasheet_tbs else nan
    ok["matmul math limit ms"] = (ok.batch * c.decode_flops / (lim.datasheet_tflops * 1e9)
                                  if lim.datasheet_tflops else nan)
    ok["matmul read floor ms"] = c.matmul_bytes / (read_tbs * 1e9) if read_tbs else nan
    ok["matmul GEMM floor ms"] = ok.batch * c.decode_flops / (lim.gemm_tflops * 1e9) if lim.gemm_tflops else nan
    return ok


def wall_times_clean(run: runs.Run) -> bool:
    """Whether the sweep's wall times were taken before any profile in the process (older
    runs timed each batch size right after profiling it)."""
    s = sweep(run)
    return "wall_clean" in s and bool(s.wall_clean.astype(bool).all())


def sweep_display(run: runs.Run) -> pd.DataFrame:
    """The sweep as the chapter shows it; the wall times' range where the run recorded it."""
    s = sweep(run)
    out = s[["batch", "kernels", "matmul ms", "matmul TFLOP/s", "GPU ms", "wall_ms_median"]].rename(
        columns={"wall_ms_median": "wall ms"})
    if "wall_ms_max" in s:
        out["wall min–max"] = [f"{lo:.1f}–{hi:.1f}" for lo, hi in zip(s.wall_ms_min, s.wall_ms_max)]
    return pd.concat([out, s[["tokens/s"]]], axis=1)


def bytes_display(run: runs.Run) -> pd.DataFrame:
    """What each step of the sweep must read (weights, KV cache), its operations per byte,
    and its GPU time against its limit."""
    s = sweep(run)
    return pd.DataFrame({
        "batch": s.batch, "weights GB": s["weights bytes"] / 1e9, "KV cache GB": s["KV bytes"] / 1e9,
        "KV share": s["KV bytes"] / s["bytes"], "FLOP per byte": s["FLOP/byte"], "limit ms": s["limit ms"],
        "GPU busy ms": s["GPU ms"], "GPU busy / limit": s["GPU ms"] / s["limit ms"]})


@dataclass
class Ridge:
    """Where the matrix multiplies turn from memory-bound to compute-bound."""

    floor_ms: float          # matmul time when memory-bound (median over batch <= 8)
    ms_per_sequence: float   # matmul time per sequence when compute-bound (largest batch)
    measured_batch: float    # the batch where the two lines cross
    datasheet_batch: float | None
    ceilings_batch: float    # measured GEMM rate / measured read (older runs: copy) rate
    flat_until: int          # largest batch whose matmul time is within 25% of the floor


def ridge(run: runs.Run) -> Ridge:
    """Fit the two lines of a roofline to the matmul times of the sweep.

    For one token per sequence each weight (2 bytes) is used for 2·batch operations, so
    the arithmetic intensity is `batch` FLOP/byte and the ridge point in FLOP/byte is a
    batch size.
    """
    s = sweep(run)
    small = s[s.batch <= 8]["matmul ms"]
    floor = float(small.median()) if len(small) else float(s["matmul ms"].iloc[0])
    big = s.iloc[-1]
    per_seq = float(big["matmul ms"] / big.batch)
    sheet = hardware.datasheet_or_none(run.provenance["gpu"])
    lim = hardware.run_limits(run)
    flat = s[s["matmul ms"] <= 1.25 * floor].batch
    return Ridge(floor_ms=floor, ms_per_sequence=per_seq, measured_batch=floor / per_seq,
                 datasheet_batch=sheet.ridge_flop_per_byte if sheet else None,
                 ceilings_batch=lim.gemm_tflops / lim.read_or_copy_tbs, flat_until=int(flat.max()))


def bound_at(run: runs.Run, batch: int) -> str:
    r = ridge(run)
    return "memory-bound" if batch < r.measured_batch else "compute-bound"


def explorer(run: runs.Run):
    """An ipywidgets explorer of the sweep: pick a batch size, read time, tokens/s, bound."""
    import ipywidgets as widgets

    s = sweep(run).set_index("batch")

    def show(batch):
        r = s.loc[batch]
        return (f"<b>batch {batch}</b>: GPU time {r['GPU ms']:.2f} ms per step, wall {r.wall_ms_median:.2f} ms; "
                f"{r['tokens/s']:,.0f} tokens/s (GPU alone could do {r['GPU tokens/s']:,.0f}); "
                f"weights+KV read at {r['TB/s']:.2f} TB/s; matmuls at {r['matmul TFLOP/s']:.0f} TFLOP/s; "
                f"{bound_at(run, batch)}")

    slider = widgets.SelectionSlider(options=list(s.index), value=s.index[0], description="batch")
    out = widgets.HTML(show(s.index[0]))
    slider.observe(lambda ch: setattr(out, "value", show(ch["new"])), names="value")
    return widgets.VBox([slider, out])


def headline(run: runs.Run) -> dict:
    c, r = ceilings(run), ridge(run)
    return {"copy TB/s": c.copy_tbs, "GEMM TFLOP/s": c.gemm_tflops, "ridge batch": r.measured_batch}


# The chapter's sentences that depend on what the run measured ---------------------------

def memory_ceiling_text(run: runs.Run) -> str:
    """The measured memory ceiling: the read stream where the run measured one (a decode step
    reads its weights), else the copy."""
    lim = hardware.run_limits(run)
    if lim.read_tbs:
        return (f"a large read stream (the faster of a sum and a matrix-vector product over the same bytes: "
                f"the {ceilings(run).read_by}) read {lim.read_tbs:.2f} TB/s, the ceiling for a step that reads its "
                f"weights (a device-to-device copy, counted as bytes read plus written, moved {lim.copy_tbs:.2f} TB/s)")
    return f"a large device-to-device copy moved {lim.copy_tbs:.2f} TB/s (bytes read plus written)"


def matvec_text(run: runs.Run) -> str:
    """The product on both sides: the GPU's kernel time and time per call, the CPU in
    float32 and BF16 (runs from before had no kernel time)."""
    m, lim = matvec_summary(run), hardware.run_limits(run)
    if m.gpu_kernel_ms is not None:
        n = len(m.kernels)
        names = f" (`{'`, `'.join(m.kernels)}`)" if n else ""
        count = "one kernel" if n == 1 else f"{n} kernels" if n else "its kernels"
        vs = []
        if lim.datasheet_tbs:
            vs.append(f"{m.gpu_kernel_gbs / (lim.datasheet_tbs * 1e3):.0%} of the {lim.datasheet_name} datasheet's "
                      f"{lim.datasheet_tbs:.1f} TB/s")
        if lim.read_tbs:
            frac = m.gpu_kernel_gbs / (lim.read_tbs * 1e3)
            vs.append(f"{frac:.0%} of the read stream measured in this run"
                      + (", a rate measured in practice rather than a limit" if frac > 1 else ""))
        of_read = f" ({'; '.join(vs)})" if vs else ""
        gpu = (f"On the GPU the product ran as {count}{names} for {m.gpu_kernel_ms * 1e3:.1f} µs, reading the "
               f"matrix at {m.gpu_kernel_gbs:,.0f} GB/s{of_read}. One call from Python, timed with CUDA events just "
               f"before and after it, took {m.gpu_call_ms * 1e3:.1f} µs: the difference is the CPU getting the "
               "launch out (the chapter *What a kernel is*).")
        gpu_what = "the GPU's kernel time"
    else:
        gpu = (f"On the GPU one call from Python, timed with CUDA events just before and after it, took "
               f"{m.gpu_call_ms * 1e3:.1f} µs ({m.gpu_call_gbs:,.0f} GB/s over the whole call); this run did not "
               "profile the kernel alone, so that time includes getting the launch out.")
        gpu_what = "the GPU's time per call"
    who = f"{run.provenance.get('cpu', 'the host CPU')}, {m.cpu_threads}"
    if m.cpu16_ms > m.cpu32_ms:
        cpu = (f"The CPU ({who}) needs {m.cpu32_ms:.2f} ms in float32, reading {m.cpu32_gbs:,.0f} GB/s: "
               f"**{m.speedup:,.0f} times** {gpu_what}. In BF16 it took {m.cpu16_ms:.2f} ms, longer although it "
               "reads half the bytes: on a CPU, PyTorch's BF16 matrix-vector product is a slow path, so float32 "
               "is the fair CPU number.")
    else:
        cpu = (f"The CPU ({who}) needs {m.cpu16_ms:.2f} ms in BF16 ({m.cpu32_ms:.2f} ms in float32, "
               f"{m.cpu32_gbs:,.0f} GB/s): **{m.speedup:,.0f} times** {gpu_what}.")
    return gpu + " " + cpu


def sweep_note(run: runs.Run, census: tuple[float, float, str] | None = None) -> str:
    """How the sweep's wall times were taken (older runs timed each batch size right after
    profiling it). `census`: the same eager step's clean wall and GPU-busy ms in the chapter
    "The kernels in one token", and that run's id, to set the batch-1 step beside it."""
    if wall_times_clean(run):
        text = ("The sweep's wall times, like every wall time in the book, were taken before the process's first "
                "profile: for each batch size a fresh prefill, a few untimed steps, then the timed steps (the "
                "median, and the range of the repeats); the GPU times come from one step per batch size profiled "
                "afterwards, again after a fresh prefill.")
        s = sweep(run)
        one = s[s.batch == 1]
        if census and not one.empty:
            wall, busy = float(one.wall_ms_median.iloc[0]), float(one.gpu_busy_ns.iloc[0]) / 1e6
            text += (f" Its batch-1 step took {wall:.1f} ms, against {census[0]:.1f} ms for the same eager step at "
                     f"the same context in *The kernels in one token* (run `{census[2]}`), also timed before any "
                     f"profile, while the GPU was busy for about the same time ({busy:.2f} ms against "
                     f"{census[1]:.2f} ms). So the profiler is not the cause, and this book has not found it yet; "
                     "what differs is that this sweep runs its steps back to back on one growing cache, while that "
                     "chapter prefills afresh before each step. The ridge point uses GPU times only.")
        return text
    return ("In this run the wall times of each batch size were taken right after that batch size was profiled, in "
            "the same process, and a profile slows every later kernel launch (the methodology, under *Two "
            "instruments*): read its wall-time curve as an upper bound. The ridge point uses GPU times only.")


# The ridge point with the KV cache, and the published H100 figure -----------------------

# Published (cite as published, never ours): the Qwen3-8B H100 profile's ridge, in requests.
PUBLISHED_H100_RIDGE_REQUESTS = 295
PUBLISHED_H100_RIDGE_SOURCE = published.QWEN3_8B_H100_SOURCE
H100 = hardware.DATASHEETS["NVIDIA H100 80GB HBM3"]


@dataclass
class KVRidge:
    """Where the whole step (weights and KV cache) reaches a ridge point, at one context.

    With B sequences of `context` tokens the step does B·(F + a·context) operations on
    W + B·context·kv bytes: its intensity grows with B but never passes `cap`, the KV cache's
    share alone. `batch` is where the intensity reaches `ridge` (inf when `cap` is below it);
    `max_context` is the longest context at which any batch still reaches it."""

    gpu: str
    ridge: float          # FLOP/byte
    context: int
    batch: float
    cap: float            # FLOP/byte at an unlimited batch
    max_context: float


def kv_ridge(run: runs.Run, sheet: hardware.Datasheet, context: int | None = None) -> KVRidge:
    """The batch where the whole step reaches `sheet`'s ridge point, with this run's model and
    KV cache, at `context` (default: the context of the sweep's largest batch)."""
    c, kv, a = counts(run), run.results["kv_bytes_per_token"], attention_flop_per_context_token(run)
    context = int(context if context is not None else sweep(run).context.iloc[-1])
    r = sheet.ridge_flop_per_byte
    room = c.decode_flops + a * context - r * context * kv
    batch = r * c.decode_bytes / room if room > 0 else float("inf")
    max_context = c.decode_flops / (r * kv - a) if r * kv > a else float("inf")
    return KVRidge(gpu=sheet.name, ridge=r, context=context, batch=batch,
                   cap=(c.decode_flops + a * context) / (context * kv), max_context=max_context)


def ridge_comparison(run: runs.Run) -> pd.DataFrame:
    """The published H100 ridge (in requests) beside this run's, raw and as a share of each GPU's
    own datasheet ridge; and where the whole step, KV cache included, reaches each ridge."""
    sheet = hardware.datasheet_or_none(run.provenance["gpu"])
    r, lim = ridge(run), hardware.run_limits(run)
    _, read_name = hardware.measured_read(lim)
    gpu = sheet.name if sheet else run.provenance["gpu"]
    own = sheet.ridge_flop_per_byte if sheet else float("nan")
    rows = [("math becomes the limit (published)", H100.name, PUBLISHED_H100_RIDGE_REQUESTS,
             H100.ridge_flop_per_byte, "published (source in the text)")]
    if sheet:
        rows.append(("datasheet ridge (weights only)", gpu, own, own, f"{sheet.name} datasheet"))
    rows += [(f"measured ceilings: GEMM rate / {read_name}", gpu, r.ceilings_batch, own, "this run"),
             ("matrix multiplies' times cross (measured)", gpu, r.measured_batch, own, "this run")]
    for sh in [H100] + ([sheet] if sheet and sheet != H100 else []):
        k = kv_ridge(run, sh)
        rows.append((f"whole step with the KV cache, {k.context}-token context", sh.name, k.batch,
                     sh.ridge_flop_per_byte, f"computed here: this run's model, {sh.name} datasheet"))
    df = pd.DataFrame(rows, columns=["where math becomes the limit", "GPU", "batch", "GPU's datasheet ridge",
                                     "from"])
    df["batch / ridge"] = df["batch"] / df["GPU's datasheet ridge"]
    return df[["where math becomes the limit", "GPU", "batch", "GPU's datasheet ridge", "batch / ridge", "from"]]


def context_note(run: runs.Run) -> str:
    """Which context the KV cache is counted at."""
    s = sweep(run)
    ctx = int(s.context.iloc[-1])
    if "context_profiled" in s:
        return f"at the context of the profiled step, {ctx} tokens"
    return (f"at the context after the timed steps, {ctx} tokens (this run did not record the profiled step's own, "
            "a few tokens shorter)")


def sweep_numbers(run: runs.Run) -> dict:
    """The numbers the chapter's sweep sections quote (batch 1 and the largest batch)."""
    s = sweep(run)
    lim = hardware.run_limits(run)
    kv = run.results["kv_bytes_per_token"]
    one, big = s.iloc[0], s.iloc[-1]
    nan = float("nan")
    return {
        "kv_kb_per_token": kv / 1e3, "context": int(big.context),
        "kv_b1_mb": one["KV bytes"] / 1e6, "kv_bmax_gb": big["KV bytes"] / 1e9,
        "kv_share_bmax": big["KV bytes"] / big["bytes"],
        "bytes_bmax_gb": big["bytes"] / 1e9, "weights_gb": big["weights bytes"] / 1e9,
        "attn_fpb": attention_flop_per_context_token(run) / kv,
        "attn_tbs_bmax": big["attention TB/s"], "attn_ms_bmax": big["attention ms"],
        "attn_of_sheet": big["attention TB/s"] / lim.datasheet_tbs if lim.datasheet_tbs else nan,
        "fpb_bmax": big["FLOP/byte"], "cap": kv_cap(run),
        "mm_limit_ms": one["matmul memory limit ms"], "mm_read_ms": one["matmul read floor ms"],
        "mm_b1_ms": one["matmul ms"], "mm_b1_of_limit": one["matmul memory limit ms"] / one["matmul ms"],
        "bmax_mfu": big["matmul TFLOP/s"] / lim.datasheet_tflops if lim.datasheet_tflops else nan,
        "bmax_of_gemm": big["matmul TFLOP/s"] / lim.gemm_tflops if lim.gemm_tflops else nan,
        "lim_b1": one["limit ms"], "lim_bmax": big["limit ms"],
        "gpu_b1": one["GPU ms"], "gpu_bmax": big["GPU ms"],
        "x_b1": one["GPU ms"] / one["limit ms"], "x_bmax": big["GPU ms"] / big["limit ms"],
        "other_b1": one["other ms"], "other_bmax": big["other ms"],
        "mm_bmax": big["matmul ms"], "attn_b1_ms": one["attention ms"],
        "cat_gb_bmax": 2 * big["KV bytes"] / 1e9,
    }


def kv_cap(run: runs.Run) -> float:
    """The whole step's operations per byte at an unlimited batch, at the sweep's context."""
    c, kv = counts(run), run.results["kv_bytes_per_token"]
    ctx = int(sweep(run).context.iloc[-1])
    return (c.decode_flops + attention_flop_per_context_token(run) * ctx) / (ctx * kv)


def ridge_text(run: runs.Run) -> str:
    """The published H100 ridge beside this run's, raw and normalised, and what else differs."""
    cmp = ridge_comparison(run).set_index("where math becomes the limit")
    pub = cmp.iloc[0]
    r = ridge(run)
    sheet = hardware.datasheet_or_none(run.provenance["gpu"])
    gpu = sheet.name if sheet else run.provenance["gpu"]
    pub_text = (f"the published {PUBLISHED_H100_RIDGE_REQUESTS} is {pub['batch / ridge']:.0%} of the H100's "
                f"({H100.bf16_tflops:.0f} TFLOP/s over {H100.bandwidth_tbs:.2f} TB/s = {H100.ridge_flop_per_byte:.0f} "
                "FLOP per byte; it matches that ratio, so it reads as the datasheet's arithmetic rather than a "
                "measured crossing, and the book has no published batch sweep to set beside this one)")
    if sheet:
        share = r.measured_batch / sheet.ridge_flop_per_byte
        where = ("close to where its datasheet puts it" if abs(share - 1) <= 0.15 else
                 "beyond where its datasheet puts it" if share > 1 else "before where its datasheet puts it")
        first = (f"Raw, {PUBLISHED_H100_RIDGE_REQUESTS} against this run's measured {r.measured_batch:.0f} reads as "
                 f"if the {gpu} turned compute-bound at a much smaller batch. Normalised to each GPU's own datasheet "
                 f"ridge: {pub_text}, and this run's measured crossing is {share:.0%} of the {gpu}'s "
                 f"({sheet.ridge_flop_per_byte:.0f}), {where}.")
        if sheet.bf16_tflops == H100.bf16_tflops and sheet.bandwidth_tbs != H100.bandwidth_tbs:
            first += (f" The two GPUs have the same datasheet math rate ({sheet.bf16_tflops:.0f} TFLOP/s) and differ "
                      f"in bandwidth ({H100.bandwidth_tbs:.2f} against {sheet.bandwidth_tbs:.2f} TB/s): faster "
                      f"memory, not slower math, brings the {gpu}'s ridge to a smaller batch.")
    else:
        first = (f"Normalised to the H100's own datasheet ridge, {pub_text}. This run's GPU ({gpu}) has no datasheet "
                 f"in the book, so its measured crossing ({r.measured_batch:.0f}) cannot be set against its own ridge.")
    parts = [first]
    h100 = kv_ridge(run, H100)
    own = kv_ridge(run, sheet) if sheet and sheet != H100 else None

    def at(k: KVRidge) -> str:
        if k.batch == float("inf"):
            return f"no batch on the {k.gpu}"
        return f"about {k.batch:,.0f} sequences on the {k.gpu}"

    both = f"{at(own)} and {at(h100)}" if own else at(h100)
    ctx_max = (f"{own.max_context:.0f} tokens on the {own.gpu} ({h100.max_context:.0f} on the {h100.gpu})" if own
               else f"{h100.max_context:.0f} tokens on the {h100.gpu}")
    parts.append(f"What else differs. Neither ridge counts the KV cache. With this run's {h100.context}-token context "
                 f"the whole step reaches the ridge only at {both} (computed from the datasheets and this run's "
                 f"model, not measured); at contexts longer than about {ctx_max}, at no batch at all: there, "
                 "each sequence's own operations per byte of its cache are below the ridge, and adding sequences "
                 "cannot lift the step above it. "
                 "The software differs too: the published profile's is named in its source, above; this run "
                 f"used transformers {run.provenance.get('transformers', '?')} and PyTorch "
                 f"{run.provenance.get('torch', '?')}, eager, on an {run.provenance['gpu']}. A serving engine batches "
                 "requests of many "
                 "different contexts at once, which moves the crossing again.")
    return "\n\n".join(parts)


# Irregular points of the sweep -----------------------------------------------------------

BUMP_TOLERANCE = 0.05        # a batch's matmuls slower than a larger batch's by more than this
PREFILL_CHAPTER = "prefill-vs-decode"
SPLIT_K_REDUCE = "splitKreduce"


def irregular_batches(run: runs.Run, tol: float = BUMP_TOLERANCE) -> list[int]:
    """Batch sizes whose matrix multiplies took longer (by more than `tol`) than those of a
    larger batch, which does more of the same work."""
    s = sweep(run).reset_index(drop=True)
    mm = s["matmul ms"]
    return [int(s.batch[i]) for i in range(len(s) - 1) if mm[i] > (1 + tol) * mm[i + 1:].min()]


def kernel_count_groups(run: runs.Run) -> list[tuple[int, list[int]]]:
    """The sweep's kernel count per step, as runs of consecutive batch sizes with one count."""
    groups: list[tuple[int, list[int]]] = []
    for b, n in zip(sweep(run).batch, sweep(run).kernels):
        if groups and groups[-1][0] == n:
            groups[-1][1].append(int(b))
        else:
            groups.append((int(n), [int(b)]))
    return groups


def _batches(bs: list[int]) -> str:
    return f"batch {bs[0]}" if len(bs) == 1 else f"batches {bs[0]}–{bs[-1]}"


@dataclass
class SplitK:
    """cuBLAS's split-K reduce kernels in the matrix multiplies of the chapter *Prompt phase vs
    decode phase*: its decode step (one token) and its prefill (`tokens_many` tokens)."""

    run_id: str
    tokens_many: int
    matmul_few: int           # matrix-multiply kernels (the reduce kernels included)
    matmul_many: int
    reduce_few: int
    reduce_many: int
    modules: list[str]        # the modules (layer number dropped) whose products ran split-K at one token

    @property
    def only_reduces_differ(self) -> bool:
        """Whether the two steps' matrix-multiply kernel counts differ by their reduce kernels alone."""
        return self.matmul_few - self.reduce_few == self.matmul_many - self.reduce_many


def split_k_evidence(run: runs.Run) -> SplitK | None:
    """The split-K reduce kernels of the *Prompt phase vs decode phase* run published beside
    `run` (in the same runs folder), or None where that run (or its kernel tables) is not there
    to read."""
    try:
        pr = runs.load_run(PREFILL_CHAPTER, root=run.path.parent.parent)
        few, many = pr.table("kernels-decode"), pr.table("kernels-prefill")
        tokens = int(pr.parameters["prompt_len"])
    except (runs.RunError, OSError, KeyError, ValueError):
        return None

    def mm(k):
        k = k[k.kind == "matrix multiply"]
        names = k.short_name if "short_name" in k else k.name.map(kernels.short_name)
        return k, names.astype(str).str.contains(SPLIT_K_REDUCE)

    kf, rf = mm(few)
    km, rm = mm(many)
    modules = list(dict.fromkeys(kf.module[rf].astype(str).str.replace(r"^.*layers\.\d+\.", "", regex=True)))
    return SplitK(run_id=pr.run_id, tokens_many=tokens, matmul_few=len(kf), matmul_many=len(km),
                  reduce_few=int(rf.sum()), reduce_many=int(rm.sum()), modules=modules)


def split_k_per_layer(run: runs.Run, ev: SplitK | None) -> pd.Series | None:
    """Split-K products per layer at each batch size, read from the sweep's kernel counts: where
    the profiles of one token and of many differ by their split-K reduce kernels alone, the many
    had none, and the sweep's largest count less its smallest is the one token's reduces, each
    kernel above the sweep's smallest count is read as one split-K reduce. None where the
    evidence does not support that reading."""
    s = sweep(run)
    extra = s.kernels - s.kernels.min()
    layers = counts(run).layers
    if (ev is None or not ev.only_reduces_differ or ev.reduce_many != 0 or s.batch.iloc[0] != 1
            or int(extra.iloc[0]) != ev.reduce_few - ev.reduce_many or (extra % layers).any()):
        return None
    return pd.Series((extra // layers).to_numpy(), index=s.batch.to_numpy())


def irregular_text(run: runs.Run, ev: SplitK | None) -> str:
    """What the data says about the sweep's irregular points (matrix multiplies slower than a
    larger batch's), and what it cannot say."""
    s = sweep(run).set_index("batch")
    layers = counts(run).layers
    groups = kernel_count_groups(run)
    count_text = ", ".join(f"{n:,} at {_batches(bs)}" for n, bs in groups)
    bumps = irregular_batches(run)
    if not bumps:
        return (f"No batch size's matrix multiplies took longer than a larger batch's (by more than "
                f"{BUMP_TOLERANCE:.0%}): this sweep has no irregular point to explain. Kernels per step: {count_text}.")
    b = bumps[0]
    later = s.loc[s.index > b]
    n = int(later["matmul ms"].idxmin())
    parts = [f"At batch {b} the matrix multiplies took {s.loc[b, 'matmul ms']:.2f} ms, longer than the "
             f"{s.loc[n, 'matmul ms']:.2f} ms at batch {n}, which does {n / b:.2f} times the work: "
             f"{s.loc[b, 'matmul TFLOP/s']:.0f} TFLOP/s against {s.loc[n, 'matmul TFLOP/s']:.0f}."
             + (f" (Also irregular: {', '.join(map(str, bumps[1:]))}.)" if len(bumps) > 1 else "")]
    steps = len(groups) > 1
    parts.append(f"The number of kernels per step changes with the batch too: {count_text}."
                 + (f" Every change is a multiple of {layers}: a whole number of kernels per layer." if steps and not
                    any((g[0] - groups[0][0]) % layers for g in groups) else ""))
    per_layer = split_k_per_layer(run, ev)
    if per_layer is not None:
        where = ", ".join(f"{n_} at {_batches(bs)}" for n_, bs in _runs_of(per_layer))
        big = int(s.index.max())
        fewest = (f"batch {big}" if s.loc[big, "kernels"] == s.kernels.min()
                  else "the batch sizes with the fewest kernels")
        mods = ", ".join(f"`{m}`" for m in ev.modules)
        parts.append(
            f"The chapter *Prompt phase vs decode phase* profiled the same weight matrices with one token and with "
            f"{ev.tokens_many} (run `{ev.run_id}`). Their matrix-multiply kernels differ by "
            f"{ev.reduce_few - ev.reduce_many}, all of them cuBLAS's split-K reduce kernel "
            f"(`cublasLt::splitKreduce_kernel`): {ev.reduce_few // layers} per "
            f"layer with one token (after {mods}), none with {ev.tokens_many}. A split-K kernel cuts a product's long "
            "inner dimension into pieces, so that more thread blocks share a small product, and the reduce kernel adds "
            f"the pieces up. In this sweep, batch 1 has exactly that many kernels more than {fewest}. "
            f"Reading every kernel above the fewest as one split-K reduce, the products that ran split-K per layer "
            f"were: {where}.")
        if per_layer.get(b, 1) == 0 and per_layer.get(n, 0) > 0:
            parts[-1] += (f" So at batch {b} cuBLAS's heuristics dropped split-K, as they do for the largest batches, "
                          f"while at batch {n} they still split {int(per_layer[n])} product"
                          f"{'s' if per_layer[n] > 1 else ''} per layer; whatever kernels they chose instead ran "
                          f"slower for {b} sequences than batch {n}'s did for {n}.")
    else:
        parts.append("Which kernels were added or dropped, this run cannot say: it kept no kernel names per "
                     "batch size.")
    if "batch_matmuls.csv" in run.meta["files"]:
        parts.append(matmul_choice_text(run, b, n))
        return "\n\n".join(parts)
    sms = run.provenance.get("gpu_sms")
    tile = 128
    computed = -(-b // tile) * tile
    grid = ("a grid with fewer thread blocks than the GPU's " + (f"{sms} SMs" if sms else "SMs")
            + ", which leaves some of them idle")
    unknown = (f"Which matrix-multiply kernels ran at batch {b}, and why they are slower there, the run cannot tell: "
               "it recorded kernel counts and times per batch size, not the kernels' names or grids. ")
    if computed != b:
        tq = (f"tiles of {tile} rows, a common size, compute {computed} rows for {b} sequences, "
              f"{1 - b / computed:.0%} of the work thrown away")
        if computed in s.index and s.loc[b, "matmul ms"] > s.loc[computed, "matmul ms"]:
            why = (f"Tile quantisation alone ({tq}) would make batch {b} cost as much as batch {computed}, not "
                   f"more: the kernels chosen at {b} lose more than that, for a reason such as {grid}. ")
        else:
            why = f"Two usual causes would fit, alone or together: tile quantisation ({tq}), and {grid}. "
    else:
        why = f"One usual cause would fit: {grid}. "
    parts.append(unknown + why
                 + "**Left for a new measurement:** the matrix multiplies' kernel names and grids at batches "
                 f"{', '.join(str(int(x)) for x in _around(s.index, b, n))}.")
    return "\n\n".join(parts)


def matmul_choice(run: runs.Run, batches) -> pd.DataFrame:
    """The matrix-multiply kernels cuBLAS ran at each of `batches`, by kernel and grid: how many,
    and their GPU time per step (runs that recorded `batch_matmuls`)."""
    m = run.table("batch_matmuls")
    m = m[m.batch.isin(list(batches))]
    g = m.groupby(["batch", "short_name", "grid"], sort=False).agg(kernels=("kernels", "sum"),
                                                                   gpu_ns=("gpu_ns", "sum")).reset_index()
    g["ms"] = g.gpu_ns / 1e6
    return g.sort_values(["batch", "ms"], ascending=[True, False]).reset_index(drop=True)


def matmul_choice_text(run: runs.Run, b: int, n: int) -> str:
    """What the recorded kernels say about batch `b` being slower than the larger batch `n`."""
    c = matmul_choice(run, [b, n])

    def describe(batch: int) -> str:
        k = c[c.batch == batch]
        top = k[~k.short_name.str.contains("splitKreduce")].head(3)
        reduces = int(k.loc[k.short_name.str.contains("splitKreduce"), "kernels"].sum())
        names = "; ".join(f"`{r.short_name}` x{int(r.kernels)} ({r.ms:.2f} ms)" for r in top.itertuples())
        return (f"at batch {batch}, {k.ms.sum():.2f} ms in all, mostly {names}, with "
                + (f"{reduces} split-K reduce kernels" if reduces else "no split-K"))

    return (f"This run recorded which matrix-multiply kernels ran at each batch size: {describe(b)}; "
            f"{describe(n)}. So the slow point is cuBLAS's own choice of kernels: for {b} sequences its heuristics "
            f"picked other kernels than for {n}, and those ran slower in total. Why the heuristics choose them is "
            "inside cuBLAS; the kernel names (tile shape, split-K, the layout suffix) are what can be seen.")


def _runs_of(series: pd.Series) -> list[tuple[int, list[int]]]:
    out: list[tuple[int, list[int]]] = []
    for b, v in series.items():
        if out and out[-1][0] == v:
            out[-1][1].append(int(b))
        else:
            out.append((int(v), [int(b)]))
    return [(("none" if v == 0 else v), bs) for v, bs in out]


def _around(batches, b: int, n: int) -> list[int]:
    """The batch sizes just before `b`, `b` itself, and up to `n`."""
    bs = list(batches)
    i, j = bs.index(b), bs.index(n)
    return bs[max(i - 1, 0):j + 1]


# Figures ---------------------------------------------------------------------------------

def bytes_figure(run: runs.Run):
    """What one step reads at each batch size: the weights (the same at every batch) and the
    KV cache (growing with it), stacked."""
    import matplotlib.pyplot as plt

    from labsupport import figures as plots

    s = sweep(run)
    x = range(len(s))
    fig, ax = plt.subplots(figsize=(9, 3.4))
    ax.bar(x, s["weights bytes"] / 1e9, color=plots.KIND_COLORS["matrix multiply"], label="weights")
    ax.bar(x, s["KV bytes"] / 1e9, bottom=s["weights bytes"] / 1e9, color=plots.KIND_COLORS["attention"],
           label="KV cache (read by attention)")
    ax.set_xticks(list(x), [str(b) for b in s.batch])
    ax.set_xlabel("batch (sequences decoded together)")
    ax.set_ylabel("GB read per decode step")
    ax.set_title("Bytes one decode step must read: the weights once, each sequence's KV cache once")
    ax.grid(axis="x", visible=False)
    ax.legend(fontsize=8, frameon=False, loc="upper left")
    return plots.finish(fig, run.label)


def _batch_axis(ax, batches) -> None:
    """A log2 batch axis labelled with plain numbers."""
    ax.set_xscale("log", base=2)
    ticks = [b for b in (1, 4, 16, 64, 256, 1024, 4096) if min(batches) <= b <= max(batches)]
    ax.set_xticks(ticks, [str(t) for t in ticks])
    ax.minorticks_off()
    ax.set_xlabel("batch (sequences decoded together)")


def limits_figure(run: runs.Run):
    """Measured time per step against the limits drawn at the limits: on the left the matrix
    multiplies (the weights' bytes; their operations), on the right the whole step (weights and
    KV cache; all operations). Solid: the datasheet's limits; dashed: the ceilings measured in
    the run."""
    import matplotlib.pyplot as plt

    from labsupport import figures as plots

    s = sweep(run)
    r = ridge(run)
    lim = hardware.run_limits(run)
    read_tbs, read_name = hardware.measured_read(lim)
    mem, math = plots.KIND_COLORS["copy/convert/concat"], plots.KIND_COLORS["reduction"]
    sheet = f"{lim.datasheet_name} datasheet" if lim.datasheet_name else "datasheet"
    fig, ax = plt.subplots(1, 2, figsize=(11, 4.4), sharey=True)
    b = s.batch
    panels = (
        (ax[0], "matmul ms", "matrix multiplies (measured)", "matmul memory limit ms", "matmul math limit ms",
         "matmul read floor ms", "matmul GEMM floor ms", "The matrix multiplies: weights only"),
        (ax[1], "GPU ms", "whole step, GPU busy (measured)", "memory limit ms", "math limit ms",
         "read floor ms", None, "The whole step: weights and KV cache"),
    )
    for a, col, label, mem_col, math_col, read_col, gemm_col, title in panels:
        a.plot(b, s[col], "o-", color=plots.OURS, label=label, zorder=3)
        if lim.datasheet_tbs:
            a.plot(b, s[mem_col], "-", color=mem, lw=1.5,
                   label=f"memory limit: bytes at {lim.datasheet_tbs:.2f} TB/s ({sheet})")
        if lim.datasheet_tflops:
            a.plot(b, s[math_col], "-", color=math, lw=1.5,
                   label=f"math limit: operations at {lim.datasheet_tflops:.0f} TFLOP/s ({sheet})")
        if read_tbs:
            a.plot(b, s[read_col], "--", color=mem, lw=1,
                   label=f"bytes at the measured {read_name} ({read_tbs:.2f} TB/s, this run)")
        if gemm_col and lim.gemm_tflops:
            a.plot(b, s[gemm_col], "--", color=math, lw=1,
                   label=f"operations at the measured GEMM rate ({lim.gemm_tflops:.0f} TFLOP/s, this run)")
        _batch_axis(a, b)
        a.set_yscale("log")
        a.set_title(title)
        a.legend(fontsize=7, frameon=False, loc="upper left")
    ax[0].axvline(r.measured_batch, color="#555", lw=1)
    ax[0].text(r.measured_batch, s["matmul ms"].min() * 0.5, f"measured crossing ≈ {r.measured_batch:.0f} ",
               fontsize=8, ha="right")
    if r.datasheet_batch:
        ax[0].axvline(r.datasheet_batch, color="#bbb", lw=1, ls=":")
        ax[0].text(r.datasheet_batch, s["matmul ms"].min() * 0.37, f" datasheet ridge {r.datasheet_batch:.0f}",
                   fontsize=8, color="#777", ha="left")
    ax[0].set_ylabel("ms per decode step")
    lo = s["matmul ms"].min()
    if lim.datasheet_tbs:
        lo = min(lo, s["matmul memory limit ms"].min())
    ax[0].set_ylim(lo * 0.3, s["GPU ms"].max() * 4)
    return plots.finish(fig, run.label)


def throughput_figure(run: runs.Run):
    """Tokens per second: if the GPU never waited (GPU busy), and as measured (wall time)."""
    import matplotlib.pyplot as plt

    from labsupport import figures as plots

    s = sweep(run)
    fig, ax = plt.subplots(figsize=(7, 3.6))
    ax.plot(s.batch, s["GPU tokens/s"], "o-", color=plots.OURS, label="if the GPU never waited (GPU busy)")
    ax.plot(s.batch, s["tokens/s"], "s--", color="#999", ms=4, label="measured wall time (eager)")
    _batch_axis(ax, s.batch)
    ax.set_yscale("log")
    ax.set_ylabel("tokens per second")
    ax.set_title("Throughput grows with the batch")
    ax.legend(fontsize=8, frameon=False)
    return plots.finish(fig, run.label)
