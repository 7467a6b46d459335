"""Chapter "Why a GPU": the per-token arithmetic, one matrix-vector product on the CPU
and the GPU, and a batch sweep of the decode step that finds where math, not memory,
becomes the limit (the ridge point)."""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field

import pandas as pd

from . import hardware, kernels, models, runs, trace

CHAPTER = "why-a-gpu"


@dataclass
class Params:
    preset: str = "qwen3-8b"
    prompt_len: int = 256
    batches: list[int] = field(default_factory=lambda: [1, 2, 4, 8, 16, 32, 64, 128, 192, 256, 384, 512])
    steps: int = 5
    matvec_repeats: int = 20
    device: str = "cuda"


def _progress(msg: str) -> None:
    print(f"[{CHAPTER}] {msg}", flush=True)


def per_token_arithmetic(counts: models.ModelCounts, sheet: hardware.Datasheet | None,
                         copy_tbs: float | None = None, gemm_tflops: float | None = None) -> pd.DataFrame:
    """Time for one token's weights at peak math and at peak memory bandwidth."""
    rows = []
    ceilings = []
    if sheet:
        ceilings.append((f"{sheet.name} datasheet", sheet.bf16_tflops, sheet.bandwidth_tbs))
    if copy_tbs and gemm_tflops:
        ceilings.append(("measured on this GPU", gemm_tflops, copy_tbs))
    for name, tflops, tbs in ceilings:
        math_ms = counts.decode_flops / (tflops * 1e12) * 1e3
        mem_ms = counts.decode_bytes / (tbs * 1e12) * 1e3
        rows.append({"ceilings": name, "TFLOP/s": tflops, "TB/s": tbs, "math ms": math_ms,
                     "memory ms": mem_ms, "memory / math": mem_ms / math_ms,
                     "ridge FLOP/byte": tflops / tbs})
    return pd.DataFrame(rows)


def _time_host(fn, repeats: int) -> list[float]:
    fn()
    out = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t) * 1e3)
    return out


def measure_matvec(out_features: int, in_features: int, repeats: int) -> pd.DataFrame:
    """One weight matrix times one vector, BF16, on the CPU and on the GPU (ms, median)."""
    import torch

    rows = []
    w = torch.randn(out_features, in_features, dtype=torch.bfloat16)
    x = torch.randn(in_features, dtype=torch.bfloat16)
    nbytes = w.numel() * w.element_size()
    cpu = _time_host(lambda: torch.mv(w, x), repeats)
    rows.append({"device": f"CPU ({torch.get_num_threads()} threads)", "dtype": "bfloat16",
                 "ms_median": statistics.median(cpu), "ms_min": min(cpu), "bytes": nbytes})
    wf, xf = w.float(), x.float()
    cpu32 = _time_host(lambda: torch.mv(wf, xf), repeats)
    rows.append({"device": f"CPU ({torch.get_num_threads()} threads)", "dtype": "float32",
                 "ms_median": statistics.median(cpu32), "ms_min": min(cpu32), "bytes": 2 * nbytes})
    wg, xg = w.cuda(), x.cuda()
    gpu = hardware.time_cuda_ms(lambda: torch.mv(wg, xg), repeats=max(repeats, 50), warmup=10)
    rows.append({"device": torch.cuda.get_device_name(0), "dtype": "bfloat16",
                 "ms_median": statistics.median(gpu), "ms_min": min(gpu), "bytes": nbytes})
    df = pd.DataFrame(rows)
    df["GB/s"] = df["bytes"] / (df["ms_median"] * 1e-3) / 1e9
    df["shape"] = f"{out_features} x {in_features}"
    return df


def measure_batch(model, batch: int, prompt_len: int, steps: int, trace_path) -> dict:
    """Decode steps at one batch size: a profiled step (kernel times) and timed steps.

    The prompt is prefilled once; the steps then follow one another on that cache, which
    grows by one token per step (a few tokens on top of `prompt_len`).
    """
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    from . import decode

    prompt = decode.Prompt.random(model.config.vocab_size, batch, prompt_len, "cuda", seed=batch)
    cache, tok = decode.prefill(model, prompt)
    del prompt
    for _ in range(2):
        tok = decode.decode_step(model, cache, tok)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        with record_function("decode_step"):
            tok = decode.decode_step(model, cache, tok)
        torch.cuda.synchronize()
    prof.export_chrome_trace(str(trace_path))
    walls = []
    for _ in range(steps):
        torch.cuda.synchronize()
        t = time.perf_counter()
        tok = decode.decode_step(model, cache, tok)
        torch.cuda.synchronize()
        walls.append((time.perf_counter() - t) * 1e3)
    context = cache.get_seq_length()
    del cache
    k = trace.read_kernels(trace_path)
    k["kind"] = k["name"].map(kernels.classify)
    return {"batch": batch, "status": "ok", "kernels": len(k),
            "gpu_busy_ns": trace.busy_ns(k.start_ns, k.end_ns), "kernel_ns": int(k.dur_ns.sum()),
            "matmul_ns": int(k.loc[k.kind == "matrix multiply", "dur_ns"].sum()),
            "attention_ns": int(k.loc[k.kind == "attention", "dur_ns"].sum()),
            "wall_ms_median": statistics.median(walls), "wall_ms_min": min(walls),
            "context_end": context}


def record(params: Params | None = None, run_id: str | None = None, progress=_progress) -> runs.Run:
    """Measure this GPU now and write a new run (not published)."""
    import torch

    params = params or Params()
    with runs.live_writer(CHAPTER, params, run_id) as w:
        hardware.record_ceilings(w, progress)
        progress(f"building {params.preset} with random BF16 weights")
        model = models.build_model(params.preset, device="cuda")
        counts = models.count_model(model, params.preset)
        w.extra["model"] = counts.as_record()
        w.extra["kv_bytes_per_token"] = (2 * model.config.num_hidden_layers * model.config.num_key_value_heads
                                         * model.config.head_dim * 2)
        rows = []
        tmp = w.path / ".batch-trace.json.gz"
        for b in params.batches:
            progress(f"batch {b}: decode steps")
            try:
                rows.append(measure_batch(model, b, params.prompt_len, params.steps, tmp))
            except torch.OutOfMemoryError:
                rows.append({"batch": b, "status": "out of memory"})
                progress(f"  batch {b}: out of GPU memory, recorded as such; larger batches skipped")
                torch.cuda.empty_cache()
                break
            r = rows[-1]
            progress(f"  GPU {r['gpu_busy_ns'] / 1e6:.2f} ms, wall {r['wall_ms_median']:.2f} ms")
        tmp.unlink(missing_ok=True)
        w.write_table("batch_sweep", pd.DataFrame(rows))
        del model
        torch.cuda.empty_cache()
        # Last: the CPU product wakes a pool of CPU threads, which would then compete with
        # the Python thread that launches the decode steps' kernels and slow them down.
        cfg = models.preset_config(params.preset)
        progress("one weight matrix times one vector, on the CPU and on the GPU")
        w.write_table("matvec", measure_matvec(cfg["intermediate_size"], cfg["hidden_size"], params.matvec_repeats))
    return runs.load_run(CHAPTER, w.run_id)


def load(run_id: str | None = None) -> runs.Run:
    return runs.load_run(CHAPTER, run_id)


def ceilings(run: runs.Run) -> hardware.Ceilings:
    row = run.table("ceilings").iloc[0]
    return hardware.Ceilings(**{k: row[k].item() if hasattr(row[k], "item") else row[k]
                                for k in hardware.Ceilings.__dataclass_fields__})


def counts(run: runs.Run) -> models.ModelCounts:
    m = run.results["model"]
    return models.ModelCounts(**{k: m[k] for k in models.ModelCounts.__dataclass_fields__})


def arithmetic(run: runs.Run) -> pd.DataFrame:
    c = ceilings(run)
    return per_token_arithmetic(counts(run), hardware.datasheet_or_none(run.provenance["gpu"]),
                                c.copy_tbs, c.gemm_tflops)


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
    # Bytes a step must read: every weight once, plus each sequence's KV cache.
    ok["bytes"] = c.decode_bytes + ok.batch * ok.context_end * kv
    ok["TB/s"] = ok["bytes"] / (ok["GPU ms"] / 1e3) / 1e12
    ok["matmul TFLOP/s"] = c.decode_flops * ok.batch / (ok["matmul ms"] / 1e3) / 1e12
    ok["FLOP/byte"] = c.decode_flops * ok.batch / c.matmul_bytes
    return ok


@dataclass
class Ridge:
    """Where the matrix multiplies turn from memory-bound to compute-bound."""

    floor_ms: float          # matmul time when memory-bound (median over batch <= 8)
    ms_per_sequence: float   # matmul time per sequence when compute-bound (largest batch)
    measured_batch: float    # the batch where the two lines cross
    datasheet_batch: float | None
    ceilings_batch: float    # measured GEMM rate / measured copy rate
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
    c = ceilings(run)
    flat = s[s["matmul ms"] <= 1.25 * floor].batch
    return Ridge(floor_ms=floor, ms_per_sequence=per_seq, measured_batch=floor / per_seq,
                 datasheet_batch=sheet.ridge_flop_per_byte if sheet else None,
                 ceilings_batch=c.gemm_tflops / c.copy_tbs, flat_until=int(flat.max()))


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
