"""What the notebook's live cells call beyond the harness: the run they fill, each rung built
as a callable step, the eager step's logits every rung is checked against, the matmuls timed
shape by shape, and the row each rung gets."""

from __future__ import annotations

import pandas as pd

from labsupport.chapters.closing_the_gap.params import CHAPTER, OWN_OPTIONS, RUNG_COLUMNS, RUNGS, TOLERANCE, progress
from labsupport.measure import decode, recording, steps
from labsupport.traces import trace


def pending_run(params, run_id: str | None = None, allow_cpu: bool = False) -> recording.PendingRun:
    """The chapter's run, filled cell by cell and written by the last live cell."""
    return recording.PendingRun(CHAPTER, params, run_id, allow_cpu=allow_cpu, progress=progress)


def reference(model, prompt: decode.Prompt):
    """The eager step as written (transformers, dynamic cache) after a prefill of `prompt`:
    (its input token, its logits in float32, its greedy next token). Every rung is fed the same
    input token and checked against these logits."""
    import torch

    cache, tok = decode.prefill(model, prompt)
    with torch.inference_mode():
        logits = model(input_ids=tok, past_key_values=cache, use_cache=True).logits[:, -1].float()
    return tok, logits, logits.argmax(-1)


class StaticLogitsStep(steps.StaticStep):
    """transformers' static-cache step, returning (logits, next token) so that the captured and
    compiled forms can be checked against eager; fed `token` instead of its own prefill's."""

    def __init__(self, model, prompt_ids, token):
        super().__init__(model, prompt_ids)
        self.tok = token.reshape(1, 1).clone()

    def forward(self, tok, pos):
        logits = self.model(input_ids=tok, past_key_values=self.cache, use_cache=True, cache_position=pos).logits
        return logits[:, -1], logits[:, -1].argmax(-1, keepdim=True)


def build(rung: str, model, prompt: decode.Prompt, token, device: str):
    """The step of `rung` (a key of RUNGS), ready to call; built (and compiled) here."""
    from labsupport.measure import qwen3_decode

    if rung == "eager":
        return steps.EagerStep(model, prompt)
    if rung == "cuda-graph":
        return steps.GraphStep(StaticLogitsStep(model, prompt.ids, token))
    if rung == "compile":
        return steps.CompiledStep(StaticLogitsStep(model, prompt.ids, token), "reduce-overhead")
    on_gpu = device == "cuda"
    opts = qwen3_decode.Options(**OWN_OPTIONS[rung])
    return qwen3_decode.OwnStep(model, prompt.ids, token, opts, compile=on_gpu, graph=on_gpu)


def runs_here(rung: str, device: str) -> str | None:
    """Why `rung` cannot run on `device`, or None. On a CPU (the tests' tiny model) CUDA graphs
    do not exist and Triton has no BF16 interpreter, so only the plain PyTorch rungs run."""
    if device == "cuda" or rung in ("eager", "own-compiled", "fused-projections"):
        return None
    return "not run: needs a CUDA GPU"


def fidelity(out, ref_logits, ref_token) -> dict:
    """How far a rung's step output (logits, next token) is from eager's: the largest absolute
    difference of a logit, eager's largest logit, cosine similarity, same greedy token, and
    whether that passes (TOLERANCE)."""
    import torch

    logits, token = out
    a, b = logits.float().reshape(-1), ref_logits.reshape(-1)
    diff = float((a - b).abs().max())
    largest = float(b.abs().max())
    same = bool(int(token.reshape(-1)[0]) == int(ref_token.reshape(-1)[0]))
    return {
        "max_abs_diff": diff,
        "max_abs_logit": largest,
        "cosine": float(torch.nn.functional.cosine_similarity(a, b, dim=0)),
        "same_token": same,
        "passed": same and diff <= TOLERANCE * largest,
    }


REFERENCE_ROW = {"max_abs_diff": 0.0, "cosine": 1.0, "same_token": True, "passed": True}


def rung_row(rung: str, k: pd.DataFrame, t, span_ns: int, step, fid: dict) -> dict:
    """The row of rungs.csv of a rung timed (`t`), checked (`fid`) and profiled (kernels `k`)."""
    return {
        "rung": rung,
        "status": "ok",
        "kernels": len(k),
        "gpu_busy_ns": trace.busy_ns(k.start_ns, k.end_ns),
        "first_kernel_ns": int(k.start_ns.min()),
        "last_kernel_end_ns": int(k.end_ns.max()),
        "profiled_step_ns": span_ns,
        "wall_ms_median": t.median,
        "wall_ms_min": t.low,
        "wall_ms_max": t.high,
        "clean": t.clean,
        "compile_s": getattr(step, "compile_s", float("nan")),
        **fid,
    }


def rungs_table(rows: dict[str, dict], status: dict[str, str]) -> pd.DataFrame:
    """rungs.csv: one row per rung in ladder order; a rung without numbers has its reason."""
    out = [rows[r] if r in rows else {"rung": r, "status": status[r]} for r in RUNGS if r in rows or r in status]
    return pd.DataFrame(out, columns=RUNG_COLUMNS)


def weight_shapes(model) -> dict[str, tuple[int, int]]:
    """The weight matrices of one decoder layer (separate and fused) and the LM head, by name:
    (rows N, columns K), as a matmul of one token reads them."""
    c = model.config
    q, kv, h, i = (
        c.num_attention_heads * c.head_dim,
        c.num_key_value_heads * c.head_dim,
        c.hidden_size,
        c.intermediate_size,
    )
    return {
        "q_proj": (q, h),
        "k_proj / v_proj": (kv, h),
        "o_proj": (h, q),
        "gate_proj / up_proj": (i, h),
        "down_proj": (h, i),
        "qkv (fused)": (q + 2 * kv, h),
        "gate_up (fused)": (2 * i, h),
        "lm_head": (c.vocab_size, h),
    }


def time_matmuls(shapes: dict[str, tuple[int, int]]) -> pd.DataFrame:
    """Each weight shape read by one token's matmul: cuBLAS (torch.mm, as F.linear calls it) against our
    Triton GEMV with its tuned config, per call as inside a CUDA graph (gemv.time_per_call_us)."""
    import torch

    from labsupport.measure import gemv

    rows = []
    for name, (n, k) in shapes.items():
        us = {
            "cublas": gemv.time_per_call_us(lambda x, w, out: torch.mm(x, w.t(), out=out), n, k),
            "triton": gemv.time_per_call_us(lambda x, w, out: gemv.launch(x.reshape(-1), w, out.reshape(-1)), n, k),
        }
        nbytes = n * k * 2
        rows.append(
            {"matrix": name, "n": n, "k": k, "bytes": nbytes, "cublas_us": us["cublas"], "triton_us": us["triton"],
             "cublas_tbs": nbytes / us["cublas"] / 1e6, "triton_tbs": nbytes / us["triton"] / 1e6}
        )  # fmt: skip
        progress(f"  {name} {n}x{k}: cuBLAS {us['cublas']:.1f} us, Triton {us['triton']:.1f} us")
    return pd.DataFrame(rows)
