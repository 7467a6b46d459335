"""Chapter "From model code to kernels": the three-line MLP and RMSNorm at Qwen3-8B
shapes, profiled line by line, and RMSNorm as one fused kernel."""
from __future__ import annotations

import statistics
from dataclasses import dataclass

import pandas as pd

from . import hardware, kernels, models, profiler, runs

CHAPTER = "model-code-to-kernels"
MLP_LINES = ("gate = x @ W_gate", "up = x @ W_up", "h = silu(gate) * up")


@dataclass
class Params:
    preset: str = "qwen3-8b"
    tokens: int = 1          # rows of x: 1 is one decode step at batch 1
    repeats: int = 100
    device: str = "cuda"


def _progress(msg: str) -> None:
    print(f"[{CHAPTER}] {msg}", flush=True)


def _annotated_mlp(x, w_gate, w_up):
    """The MLP as three lines, each inside a profiler annotation named after the line."""
    import torch.nn.functional as F
    from torch.profiler import record_function

    with record_function(MLP_LINES[0]):
        gate = F.linear(x, w_gate)
    with record_function(MLP_LINES[1]):
        up = F.linear(x, w_up)
    with record_function(MLP_LINES[2]):
        h = F.silu(gate) * up
    return h


def mlp_bytes(hidden: int, inter: int, tokens: int, elem: int = 2) -> dict:
    """Bytes each line must move at least (inputs read once, outputs written once)."""
    return {
        MLP_LINES[0]: (inter * hidden + tokens * hidden + tokens * inter) * elem,
        MLP_LINES[1]: (inter * hidden + tokens * hidden + tokens * inter) * elem,
        MLP_LINES[2]: 3 * tokens * inter * elem,
    }


def _rmsnorm_variants(hidden: int, eps: float):
    import torch
    import torch.nn.functional as F
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm

    from . import triton_kernels

    norm = Qwen3RMSNorm(hidden, eps=eps).to(device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        norm.weight.normal_(1.0, 0.1)
    return {
        "transformers (as written)": lambda x: norm(x),
        "torch.nn.functional.rms_norm": lambda x: F.rms_norm(x.float(), (hidden,), norm.weight.float(), eps).to(x.dtype),
        "ours (one Triton kernel)": lambda x: triton_kernels.rmsnorm(x, norm.weight, eps),
    }


def record(params: Params | None = None, run_id: str | None = None, progress=_progress) -> runs.Run:
    import torch

    params = params or Params()
    cfg = models.preset_config(params.preset)
    hidden, inter = cfg["hidden_size"], cfg["intermediate_size"]
    with runs.live_writer(CHAPTER, params, run_id) as w, torch.inference_mode():
        x = torch.randn(params.tokens, hidden, device="cuda", dtype=torch.bfloat16)
        w_gate = torch.randn(inter, hidden, device="cuda", dtype=torch.bfloat16) * hidden**-0.5
        w_up = torch.randn(inter, hidden, device="cuda", dtype=torch.bfloat16) * hidden**-0.5
        progress("profiling the three-line MLP")
        tmp = w.path / ".t.json.gz"
        k = profiler.kernels_of(lambda: _annotated_mlp(x, w_gate, w_up), tmp, origin="mlp")
        k["kind"] = k.name.map(kernels.classify)
        w.write_table("mlp_kernels", k)
        t = hardware.time_cuda_ms(lambda: _annotated_mlp(x, w_gate, w_up), repeats=params.repeats, warmup=10)
        w.extra["mlp"] = {"ms_median": statistics.median(t), "bytes": mlp_bytes(hidden, inter, params.tokens)}

        progress("profiling RMSNorm three ways")
        x_norm = torch.randn(params.tokens, hidden, device="cuda", dtype=torch.bfloat16)
        variants = _rmsnorm_variants(hidden, cfg["rms_norm_eps"])
        ref = variants["transformers (as written)"](x_norm).float()
        tables, times = [], []
        for name, fn in variants.items():
            kt = profiler.kernels_of(lambda: fn(x_norm), tmp, origin="rmsnorm")
            kt["variant"] = name
            tables.append(kt)
            tt = hardware.time_cuda_ms(lambda: fn(x_norm), repeats=params.repeats, warmup=10)
            err = (fn(x_norm).float() - ref).abs().max().item()
            times.append({"variant": name, "kernels": len(kt), "us_median": statistics.median(tt) * 1e3,
                          "max_abs_diff_vs_transformers": err})
        tmp.unlink()
        kt = pd.concat(tables, ignore_index=True)
        kt["kind"] = kt.name.map(kernels.classify)
        w.write_table("rmsnorm_kernels", kt)
        w.write_table("rmsnorm_times", pd.DataFrame(times))
    return runs.load_run(CHAPTER, w.run_id)


def load(run_id: str | None = None) -> runs.Run:
    return runs.load_run(CHAPTER, run_id)


def mlp_table(run: runs.Run) -> pd.DataFrame:
    """Each line of the MLP: its kernels, their time, and the bytes the line must move."""
    k = run.table("mlp_kernels")
    nbytes = run.results["mlp"]["bytes"]
    rows = []
    for line in MLP_LINES:
        sub = k[k.module == line]
        us = sub.dur_ns.sum() / 1e3
        rows.append({"line": line, "kernels": len(sub),
                     "kernel names": "; ".join(sub.name.map(kernels.short_name)),
                     "GPU µs": us, "MB moved": nbytes[line] / 1e6,
                     "GB/s": nbytes[line] / (us * 1e-6) / 1e9 if us else float("nan")})
    return pd.DataFrame(rows)


def mlp_kernels(run: runs.Run) -> pd.DataFrame:
    k = run.table("mlp_kernels")
    return pd.DataFrame({"line": k.module, "operator": k.op, "kernel": k.name.map(kernels.short_name),
                         "kind": k.kind, "µs": k.dur_ns / 1e3})


def rmsnorm_kernels(run: runs.Run, variant: str = "transformers (as written)") -> pd.DataFrame:
    """The kernels of one RMSNorm variant, in order, with the step of the math each does."""
    k = run.table("rmsnorm_kernels")
    k = k[k.variant == variant]
    out = pd.DataFrame({"operator": k.op, "kernel": k.name.map(lambda n: kernels.short_name(n, 46)),
                        "kind": k.kind, "µs": (k.dur_ns / 1e3).round(2)}).reset_index(drop=True)
    if list(out.operator) == [op for op, _ in RMSNORM_AS_WRITTEN]:
        out["step"] = [step for _, step in RMSNORM_AS_WRITTEN]
    return out


# transformers' Qwen3RMSNorm.forward, operator by operator, and what each step computes.
RMSNORM_AS_WRITTEN = [
    ("aten::copy_", "convert BF16 → float32"),
    ("aten::pow", "square"),
    ("aten::mean", "mean"),
    ("aten::add", "add epsilon"),
    ("aten::rsqrt", "reciprocal square root"),
    ("aten::mul", "multiply by it"),
    ("aten::copy_", "convert float32 → BF16"),
    ("aten::mul", "multiply by the weight"),
]


def op_to_kernels(decode_run: runs.Run, layer: int) -> pd.DataFrame:
    """From a recorded decode step: for each module of one decoder layer, each operator and
    the kernels it became."""
    from . import one_token

    k = one_token.kernel_table(decode_run)
    k = k[k.layer == layer]
    k = k.assign(module=k.module.str.replace(rf"^layers\.{layer}\.?", "", regex=True).replace("", "(layer)"))
    g = (k.groupby(["module", "op"], sort=False)
         .agg(kernels=("name", "size"), names=("short_name", lambda s: "; ".join(dict.fromkeys(s))),
              us=("dur_ns", lambda s: s.sum() / 1e3))
         .reset_index())
    return g.rename(columns={"op": "operator", "names": "kernel(s)", "us": "GPU µs"})


def headline(run: runs.Run) -> dict:
    t = run.table("rmsnorm_times").set_index("variant")
    mlp = mlp_table(run)
    return {"MLP kernels": int(mlp.kernels.sum()), "RMSNorm kernels": int(t.kernels.iloc[0]),
            "RMSNorm µs": float(t.us_median.iloc[0]), "fused RMSNorm µs": float(t.us_median.iloc[-1])}


def rmsnorm_table(run: runs.Run) -> pd.DataFrame:
    """Each RMSNorm variant: kernels, their GPU time (profiler), time per call from Python
    (CUDA events around the call), and its largest difference from transformers' output."""
    k = run.table("rmsnorm_kernels")
    gpu = k.groupby("variant").dur_ns.sum() / 1e3
    t = run.table("rmsnorm_times")
    return pd.DataFrame({"variant": t.variant, "kernels": t.kernels, "GPU µs (profiler)": t.variant.map(gpu).values,
                         "per call µs (CUDA events)": t.us_median,
                         "max |difference|": t.max_abs_diff_vs_transformers})
