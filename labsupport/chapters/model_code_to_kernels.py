"""Chapter "From model code to kernels": the three-line MLP and RMSNorm at Qwen3-8B
shapes, profiled line by line, and RMSNorm as one fused kernel.

Live, every time is taken before the first profile of the process (labsupport.measure.harness),
then the profiles."""
from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from labsupport.measure import harness, models, profiler
from labsupport.traces import kernels
from labsupport import runs
from labsupport.measure import recording

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


def _rmsnorm_variants(hidden: int, eps: float, device: str = "cuda"):
    import torch
    import torch.nn.functional as F
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm

    from labsupport.measure import triton_kernels

    norm = Qwen3RMSNorm(hidden, eps=eps).to(device=device, dtype=torch.bfloat16)
    with torch.no_grad():
        norm.weight.normal_(1.0, 0.1)
    return {
        "transformers (as written)": lambda x: norm(x),
        "torch.nn.functional.rms_norm": lambda x: F.rms_norm(x.float(), (hidden,), norm.weight.float(), eps).to(x.dtype),
        "ours (one Triton kernel)": lambda x: triton_kernels.rmsnorm(x, norm.weight, eps),
    }


def _per_call(t: harness.Timing) -> pd.Series:
    """Times per call in ms: CUDA events around each call (the host clock on a CPU)."""
    return pd.Series(t.gpu_ms or t.wall_ms, dtype=float)


def record(params: Params | None = None, run_id: str | None = None, allow_cpu: bool = False,
           progress=_progress) -> runs.Run:
    """Measure this GPU now and write a new run (not published).

    Order: the MLP and each RMSNorm per call (CUDA events), before any profile; then (the
    process's first profiles) the MLP line by line and each RMSNorm's kernels."""
    import torch

    params = params or Params()
    device = params.device
    cfg = models.preset_config(params.preset)
    hidden, inter = cfg["hidden_size"], cfg["intermediate_size"]
    harness.for_chapter(CHAPTER)
    with recording.writer(CHAPTER, params, run_id, allow_cpu=allow_cpu) as w, torch.inference_mode():
        w.extra["method"] = harness.method()
        x = torch.randn(params.tokens, hidden, device=device, dtype=torch.bfloat16)
        w_gate = torch.randn(inter, hidden, device=device, dtype=torch.bfloat16) * hidden**-0.5
        w_up = torch.randn(inter, hidden, device=device, dtype=torch.bfloat16) * hidden**-0.5
        x_norm = torch.randn(params.tokens, hidden, device=device, dtype=torch.bfloat16)
        variants = _rmsnorm_variants(hidden, cfg["rms_norm_eps"], device)
        ref = variants["transformers (as written)"](x_norm).float()

        # 1. Every time first, before any profile.
        progress("timing the three-line MLP per call")
        t = _per_call(harness.time_region(lambda: _annotated_mlp(x, w_gate, w_up), what="the MLP, per call",
                                          device=device, repeats=params.repeats, warmup=10))
        w.extra["mlp"] = {"ms_median": float(t.median()), "ms_min": float(t.min()), "ms_max": float(t.max()),
                          "bytes": mlp_bytes(hidden, inter, params.tokens)}
        progress("timing RMSNorm three ways per call")
        times = []
        for name, fn in variants.items():
            tt = _per_call(harness.time_region(lambda fn=fn: fn(x_norm), what=f"RMSNorm, {name}", device=device,
                                               repeats=params.repeats, warmup=10)) * 1e3
            err = (fn(x_norm).float() - ref).abs().max().item()
            times.append({"variant": name, "us_median": float(tt.median()), "us_min": float(tt.min()),
                          "us_max": float(tt.max()), "max_abs_diff_vs_transformers": err})

        # 2. Then the profiles.
        progress("profiling the three-line MLP")
        tmp = w.path / ".t.json.gz"
        k = profiler.kernels_of(lambda: _annotated_mlp(x, w_gate, w_up), tmp, device=device, origin="mlp")
        k["kind"] = k.name.map(kernels.classify)
        w.write_table("mlp_kernels", k)
        progress("profiling RMSNorm three ways")
        tables = []
        for row, (name, fn) in zip(times, variants.items()):
            kt = profiler.kernels_of(lambda fn=fn: fn(x_norm), tmp, device=device, origin="rmsnorm")
            kt["variant"] = name
            tables.append(kt)
            row["kernels"] = len(kt)
        tmp.unlink()
        kt = pd.concat(tables, ignore_index=True)
        kt["kind"] = kt.name.map(kernels.classify)
        w.write_table("rmsnorm_kernels", kt)
        cols = ["variant", "kernels", "us_median", "us_min", "us_max", "max_abs_diff_vs_transformers"]
        w.write_table("rmsnorm_times", pd.DataFrame(times)[cols])
    return runs.load_run(CHAPTER, w.run_id)


def load(run_id: str | None = None) -> runs.Run:
    return runs.load_run(CHAPTER, run_id)


def mlp_table(run: runs.Run) -> pd.DataFrame:
    """Each line of the MLP: its kernels, their time, and the bytes the line must move."""
    k = _kernels(run, "mlp_kernels")
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


def _kernels(run: runs.Run, table: str) -> pd.DataFrame:
    """A kernel table of the run, kinds by today's rules."""
    k = run.table(table)
    k["kind"] = k.name.map(kernels.classify)
    return k


def mlp_kernels(run: runs.Run) -> pd.DataFrame:
    k = _kernels(run, "mlp_kernels")
    return pd.DataFrame({"line": k.module, "operator": k.op, "kernel": k.name.map(kernels.short_name),
                         "kind": k.kind, "µs": k.dur_ns / 1e3})


def rmsnorm_kernels(run: runs.Run, variant: str = "transformers (as written)") -> pd.DataFrame:
    """The kernels of one RMSNorm variant, in order, with the step of the math each does."""
    k = _kernels(run, "rmsnorm_kernels")
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
    from labsupport.chapters import kernels_in_one_token as one_token

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
