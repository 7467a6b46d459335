"""Chapter "Why a GPU": the per-token arithmetic, one matrix-vector product on the CPU
and the GPU, and a batch sweep of the decode step that finds where math, not memory,
becomes the limit (the ridge point).

Live, every time is taken before the first profile of the process (labsupport.harness):
the ceilings, the sweep's wall times at every batch size, the GPU's matrix-vector product
per call and the CPU's; then the profiles that give the GPU times (one decode step per
batch size, the matrix-vector product alone)."""
from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

from . import hardware, harness, kernels, models, runs

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
    from . import decode

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
    from . import trace

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
    with runs.live_writer(CHAPTER, params, run_id, allow_cpu=allow_cpu) as w:
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


def sweep(run: runs.Run) -> pd.DataFrame:
    """The batch sweep with the derived rates: per-step times, tokens/s, bandwidth, FLOP/s."""
    s = run.table("batch_sweep")
    ok = s[s.status == "ok"].copy()
    c = counts(run)
    kv = run.results["kv_bytes_per_token"]
    ok["GPU ms"] = ok.gpu_busy_ns / 1e6
    ok["matmul ms"] = ok.matmul_ns / 1e6
    ok["tokens/s"] = ok.batch / (ok.wall_ms_median / 1e3)
    ok["GPU tokens/s"] = ok.batch / (ok["GPU ms"] / 1e3)
    # Bytes a step must read: every weight once, plus each sequence's KV cache (at the
    # context of the profiled step, whose GPU time this is; older runs recorded only the
    # context after all steps, a few tokens more).
    context = ok.context_profiled if "context_profiled" in ok else ok.context_end
    ok["bytes"] = c.decode_bytes + ok.batch * context * kv
    ok["TB/s"] = ok["bytes"] / (ok["GPU ms"] / 1e3) / 1e12
    ok["matmul TFLOP/s"] = c.decode_flops * ok.batch / (ok["matmul ms"] / 1e3) / 1e12
    ok["FLOP/byte"] = c.decode_flops * ok.batch / c.matmul_bytes
    return ok


def wall_times_clean(run: runs.Run) -> bool:
    """Whether the sweep's wall times were taken before any profile in the process (older
    runs timed each batch size right after profiling it)."""
    s = sweep(run)
    return "wall_clean" in s and bool(s.wall_clean.astype(bool).all())


def sweep_display(run: runs.Run) -> pd.DataFrame:
    """The sweep as the chapter shows it; the wall times' range where the run recorded it."""
    s = sweep(run)
    out = s[["batch", "kernels", "matmul ms", "GPU ms", "wall_ms_median"]].rename(columns={"wall_ms_median": "wall ms"})
    if "wall_ms_max" in s:
        out["wall min–max"] = [f"{lo:.1f}–{hi:.1f}" for lo, hi in zip(s.wall_ms_min, s.wall_ms_max)]
    return pd.concat([out, s[["tokens/s", "TB/s", "matmul TFLOP/s"]]], axis=1)


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


def sweep_note(run: runs.Run) -> str:
    """How the sweep's wall times were taken (older runs timed each batch size right after
    profiling it)."""
    if wall_times_clean(run):
        return ("The sweep's wall times, like every wall time in the book, were taken before the process's first "
                "profile: for each batch size a fresh prefill, a few untimed steps, then the timed steps (the "
                "median, and the range of the repeats); the GPU times come from one step per batch size profiled "
                "afterwards, again after a fresh prefill.")
    return ("In this run the wall times of each batch size were taken right after that batch size was profiled, in "
            "the same process, and a profile slows every later kernel launch (the methodology, under *Two "
            "instruments*): read its wall-time curve as an upper bound. The ridge point uses GPU times only.")
