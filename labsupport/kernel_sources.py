"""Chapter "Where kernels come from": which library each kernel of a decode step comes
from, a fusion made by torch.compile, and the attention backends side by side."""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field

import pandas as pd

from . import hardware, kernels, models, profiler, runs

CHAPTER = "where-kernels-come-from"
FUSED_SOURCE = "fused_rmsnorm_source.py"
BACKENDS = ("CUDNN_ATTENTION", "FLASH_ATTENTION", "EFFICIENT_ATTENTION", "MATH")


@dataclass
class Params:
    preset: str = "qwen3-8b"
    contexts: list[int] = field(default_factory=lambda: [256, 4096])
    repeats: int = 100
    device: str = "cuda"


def _progress(msg: str) -> None:
    print(f"[{CHAPTER}] {msg}", flush=True)


def by_source(k: pd.DataFrame) -> pd.DataFrame:
    """Kernel count and GPU time by source library (a `name` and `dur_ns` table)."""
    k = k.assign(source=k.name.map(kernels.source))
    g = k.groupby("source")["dur_ns"].agg(kernels="count", gpu_ns="sum")
    g = g.reindex([s for s in kernels.SOURCES if s in g.index])
    g["GPU ms"] = g.gpu_ns / 1e6
    g["share of GPU time"] = g.gpu_ns / g.gpu_ns.sum()
    g["example kernel"] = [kernels.short_name(k.loc[k.source == s, "name"].iloc[0]) for s in g.index]
    return g.drop(columns="gpu_ns")


def _fusion(hidden: int, eps: float, tmp, progress):
    """RMSNorm eager vs torch.compile: kernels before and after, and the generated source."""
    import torch
    from torch._inductor.utils import run_and_get_code
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm

    norm = Qwen3RMSNorm(hidden, eps=eps).to(device="cuda", dtype=torch.bfloat16)
    x = torch.randn(1, hidden, device="cuda", dtype=torch.bfloat16)
    compiled = torch.compile(norm)
    with torch.inference_mode():
        _, codes = run_and_get_code(compiled, x)
        err = (compiled(x).float() - norm(x).float()).abs().max().item()
        rows, tables = [], []
        for name, fn in (("eager (as written)", lambda: norm(x)), ("torch.compile", lambda: compiled(x))):
            k = profiler.kernels_of(fn, tmp, origin="rmsnorm")
            k["variant"] = name
            tables.append(k)
            t = hardware.time_cuda_ms(fn, repeats=100, warmup=10)
            rows.append({"variant": name, "kernels": len(k), "us_median": statistics.median(t) * 1e3})
    progress(f"  RMSNorm: {rows[0]['kernels']} kernels eager, {rows[1]['kernels']} compiled")
    return pd.concat(tables, ignore_index=True), pd.DataFrame(rows), "\n\n".join(codes), err


def _attention(heads: int, kv_heads: int, head_dim: int, ctx: int, tmp) -> list[dict]:
    """One decode step's attention (one query token) under each SDPA backend."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q = torch.randn(1, heads, 1, head_dim, device="cuda", dtype=torch.bfloat16)
    # transformers repeats the KV heads to match the query heads before calling SDPA.
    k = torch.randn(1, kv_heads, ctx, head_dim, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    k = k.repeat_interleave(heads // kv_heads, dim=1)
    v = v.repeat_interleave(heads // kv_heads, dim=1)
    rows = []
    ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float())
    for backend in BACKENDS:
        def fn():
            with sdpa_kernel(getattr(SDPBackend, backend)):
                return F.scaled_dot_product_attention(q, k, v)
        try:
            out = fn()
            kt = profiler.kernels_of(fn, tmp, origin="sdpa")
            t = hardware.time_cuda_ms(fn, repeats=50, warmup=5)
        except RuntimeError as e:
            msg = next((ln for ln in str(e).splitlines() if ln.strip()), type(e).__name__)
            rows.append({"backend": backend, "context": ctx, "status": f"not available: {msg[:160]}"})
            continue
        rows.append({"backend": backend, "context": ctx, "status": "ok", "kernels": len(kt),
                     "kernel_names": ";".join(dict.fromkeys(kt.name)),
                     "gpu_ns": int(kt.dur_ns.sum()), "us_median": statistics.median(t) * 1e3,
                     "max_abs_diff": (out.float() - ref).abs().max().item()})
    return rows


def record(params: Params | None = None, run_id: str | None = None, progress=_progress) -> runs.Run:
    params = params or Params()
    cfg = models.preset_config(params.preset)
    with runs.live_writer(CHAPTER, params, run_id) as w:
        tmp = w.path / ".t.json.gz"
        progress("torch.compile fuses RMSNorm")
        k, times, code, err = _fusion(cfg["hidden_size"], cfg["rms_norm_eps"], tmp, progress)
        k["kind"] = k.name.map(kernels.classify)
        w.write_table("fusion_kernels", k)
        w.write_table("fusion_times", times)
        (w.path / FUSED_SOURCE).write_text(code)
        w.extra["fusion_max_abs_diff"] = err
        progress("attention under each SDPA backend")
        rows = []
        for ctx in params.contexts:
            rows += _attention(cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"], ctx, tmp)
        w.write_table("attention_backends", pd.DataFrame(rows))
        tmp.unlink(missing_ok=True)
    return runs.load_run(CHAPTER, w.run_id)


def load(run_id: str | None = None) -> runs.Run:
    return runs.load_run(CHAPTER, run_id)


def fused_kernel_excerpt(run: runs.Run, lines: int = 40) -> str:
    """The generated Triton kernel (the @triton.jit function) from the recorded source."""
    src = run.file(FUSED_SOURCE).read_text().splitlines()
    start = next((i for i, ln in enumerate(src) if ln.startswith("@triton.jit")), None)
    if start is None:
        start = next((i for i, ln in enumerate(src) if "def triton_" in ln), 0)
    out = []
    for ln in src[start:]:
        if out and ln and not ln[0].isspace() and not ln.startswith(("@", "def ")):
            break
        out.append(ln)
        if len(out) >= lines:
            break
    return "\n".join(out).rstrip()


def fusion_kernels(run: runs.Run) -> pd.DataFrame:
    k = run.table("fusion_kernels")
    return pd.DataFrame({"variant": k.variant, "kernel": k.name.map(lambda n: kernels.short_name(n, 46)),
                         "source": k.name.map(kernels.source), "kind": k.kind, "µs": (k.dur_ns / 1e3).round(2)})


def attention_backends(run: runs.Run) -> pd.DataFrame:
    a = run.table("attention_backends")
    def names(s):
        found = [kernels.short_name(n, 40) for n in s.split(";") if n]
        return "; ".join(found) if len(found) <= 2 else f"{found[0]}; {found[1]}; … ({len(found)} distinct)"

    a["kernel"] = a.kernel_names.fillna("").map(names)
    a["source"] = a.kernel_names.fillna("").map(lambda s: "; ".join(dict.fromkeys(kernels.source(n) for n in s.split(";") if n)))
    return a


def headline(run: runs.Run) -> dict:
    t = run.table("fusion_times")
    a = run.table("attention_backends")
    return {"RMSNorm kernels eager": int(t.kernels.iloc[0]), "RMSNorm kernels compiled": int(t.kernels.iloc[1]),
            "attention backends available": int(a.loc[a.status == "ok", "backend"].nunique())}


def fusion_table(run: runs.Run) -> pd.DataFrame:
    """RMSNorm eager vs compiled: kernels, GPU time (profiler) and time per call."""
    k = run.table("fusion_kernels")
    gpu = k.groupby("variant").dur_ns.sum() / 1e3
    t = run.table("fusion_times")
    return pd.DataFrame({"variant": t.variant, "kernels": t.kernels, "GPU µs (profiler)": t.variant.map(gpu).values,
                         "per call µs (CUDA events)": t.us_median})
