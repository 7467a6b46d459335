"""What the notebook's live cells call beyond the harness: the run they fill, each rung built
as a callable step, the eager step's logits every rung is checked against, the matmuls timed
shape by shape, and the row each rung gets."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from labsupport.chapters.closing_the_gap.params import (
    DECLARATION,
    ERROR_FACTOR,
    ERROR_FLOOR,
    FP8_ERROR_FACTOR,
    FP8_ERROR_FACTORS,
    FP8_RUNGS,
    OWN_OPTIONS,
    RUNG_COLUMNS,
    RUNGS,
    SHARED_RUNGS,
    TOKEN_COLUMNS,
    TOKENS,
    progress,
)
from labsupport.chapters.closing_the_gap.prose import attention_form
from labsupport.measure import decode, hardware, models, recording, steps
from labsupport.traces import kernels


def pending_run(params, run_id: str | None = None) -> recording.PendingRun:
    """The chapter's run, filled cell by cell and written by the last live cell. It measures no
    ceilings of its own: the floor and the practical ceiling are the shared ones (why-a-gpu's run)."""
    return recording.PendingRun(DECLARATION, params, run_id, ceilings=False, progress=progress)


@dataclass
class Reference:
    """What every rung is checked against: eager's input token, logits and greedy next token,
    and the same step's logits computed in float32 from the same weights."""

    token: object  # [1, 1]: the input token every rung is fed
    logits: object  # [1, vocab] float32: eager's (BF16) logits, as float
    next_token: object  # [1]: eager's greedy choice
    truth: object  # [1, vocab]: the float32 model's logits

    @property
    def eager_error(self) -> float:
        return float((self.logits - self.truth).abs().max())


def reference(model, prompt: decode.Prompt) -> Reference:
    """The eager step as written (transformers, dynamic cache) after a prefill of `prompt`, and
    the same step (same prompt, same input token) by a float32 copy of the model (made here,
    freed before returning)."""
    import copy

    import torch

    def step(m, tok=None):
        cache, first = decode.prefill(m, prompt)
        tok = first if tok is None else tok
        with torch.inference_mode():
            return tok, m(input_ids=tok, past_key_values=cache, use_cache=True).logits[:, -1].float()

    tok, logits = step(model)
    exact = copy.deepcopy(model).float()
    _, truth = step(exact, tok)
    del exact
    if truth.is_cuda:
        torch.cuda.empty_cache()
    return Reference(tok, logits, logits.argmax(-1), truth)


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
    from labsupport.measure.models import qwen3_decode

    if rung == "eager":
        return steps.EagerStep(model, prompt)
    if rung == "cuda-graph":
        return steps.GraphStep(StaticLogitsStep(model, prompt.ids, token))
    if rung == "compile":
        return steps.CompiledStep(StaticLogitsStep(model, prompt.ids, token), "reduce-overhead")
    on_gpu = device == "cuda"
    opts = qwen3_decode.Options(**OWN_OPTIONS[rung])
    return qwen3_decode.OwnStep(model, prompt.ids, token, opts, compile=on_gpu, graph=on_gpu)


def gpu_memory_gb(device: str) -> dict | None:
    """What the process holds on the GPU now, in GB: allocated to tensors, reserved by PyTorch's
    caching allocator, and the GPU's total. Recorded after each rung is built (results["memory_gb"]):
    every rung stays alive until all are timed, so the record says what each one added, and what was
    left where one ran out of memory. None on a CPU."""
    if device != "cuda":
        return None
    import torch

    gb = 1e9
    total = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
    return {
        "allocated": round(torch.cuda.memory_allocated() / gb, 3),
        "reserved": round(torch.cuda.memory_reserved() / gb, 3),
        "total": round(total / gb, 3),
    }


def runs_here(rung: str, device: str) -> str | None:
    """Why `rung` is not run here, or None. max-autotune is shared (the launch-overhead chapter
    compiles, checks and times it; compiling it again here would take minutes for numbers this
    page does not show). On a CPU (the tests' tiny model) CUDA graphs do not exist and Triton has
    no BF16 interpreter, so only the plain PyTorch rungs run."""
    if rung == "max-autotune":
        return "not run here: measured in launch-overhead"
    if device != "cuda" and rung not in ("eager", "own-compiled", "fused-projections"):
        return "not run: needs a CUDA GPU"
    if OWN_OPTIONS.get(rung, {}).get("pdl") and not hardware.dependent_launch():
        return "not run: programmatic dependent launch needs a Hopper GPU (sm_90) or later"
    if rung in FP8_RUNGS:
        import torch

        if tuple(torch.cuda.get_device_capability()) < (8, 9):  # a T4 or V100 (float16 runs) and Ampere
            return "not run: FP8 (E4M3) weights need compute capability 8.9 (Ada, Hopper) or later"
    return None


def timed_here(rung: str) -> bool:
    """Whether this chapter times `rung`: our own rungs only (transformers' are shared quantities)."""
    return rung not in SHARED_RUNGS


def error_factor(rung: str, dtype: str = "bfloat16") -> float:
    """The allowed error of `rung` as a multiple of eager's: FP8_ERROR_FACTOR for FP8 weights
    (FP8_ERROR_FACTORS[dtype] in a model of another dtype)."""
    if rung not in FP8_RUNGS:
        return ERROR_FACTOR
    return FP8_ERROR_FACTOR if dtype == "bfloat16" else FP8_ERROR_FACTORS[dtype]


def fidelity(out, ref: Reference, factor: float = ERROR_FACTOR) -> dict:
    """How far a rung's step output (logits, next token) is from eager's and from float32: the
    largest absolute logit difference from each, eager's own error against float32, eager's
    largest logit, cosine similarity with eager, same greedy token, and whether that passes
    (error at most ERROR_FACTOR x eager's, or ERROR_FLOOR of the largest logit; and eager's
    greedy token, or a near tie: another token that float32 puts within eager's own error of
    eager's, `tie_gap`, so that BF16's rounding alone can swap the two)."""
    import torch

    logits, token = out
    a = logits.float().reshape(-1)
    eager, truth = ref.logits.reshape(-1), ref.truth.reshape(-1)
    err = float((a - truth).abs().max())
    chosen, eager_token = int(token.reshape(-1)[0]), int(ref.next_token.reshape(-1)[0])
    same = chosen == eager_token
    gap = abs(float(truth[eager_token] - truth[chosen]))
    near_tie = not same and gap <= ref.eager_error
    return {
        "max_abs_diff": float((a - eager).abs().max()),
        "max_abs_err": err,
        "eager_abs_err": ref.eager_error,
        "max_abs_logit": float(eager.abs().max()),
        "cosine": float(torch.nn.functional.cosine_similarity(a, eager, dim=0)),
        "same_token": same,
        "tie_gap": gap,
        "passed": (same or near_tie) and err <= max(factor * ref.eager_error, ERROR_FLOOR * float(truth.abs().max())),
    }


def repeated_fidelity(step, ref: Reference, factor: float = ERROR_FACTOR, replays: int = 0) -> dict:
    """fidelity() of the step's first output, then of `replays` more calls of it: how many gave
    logits differing from the first call's in any bit, how many failed the check, and the largest
    error against float32 among all calls. Every call redoes the same step on the same buffers, so
    a difference comes from an order that changes between calls: float atomics' (the Σx² partial
    sums, split-K), or a kernel reading memory that another still writes. The rung passes only if
    every call does."""
    import torch

    out = step()
    first = fidelity(out, ref, factor)
    logits = out[0].detach().float().clone()
    differing = failed = 0
    worst = first["max_abs_err"]
    for _ in range(replays):
        again = step()
        differing += not torch.equal(again[0].float(), logits)
        f = fidelity(again, ref, factor)
        failed += not f["passed"]
        worst = max(worst, f["max_abs_err"])
    return {
        **first,
        "passed": first["passed"] and not failed,
        "replays": replays,
        "replays_differing": differing,
        "replays_failed": failed,
        "replay_max_abs_err": worst,
    }


def eager_fidelity(ref: Reference) -> dict:
    """The eager rung's row: the reference itself, with its own error against float32."""
    return fidelity((ref.logits, ref.next_token), ref)


def rung_row(rung: str, k: pd.DataFrame, t, span_ns: int, step, fid: dict) -> dict:
    """The row of rungs.csv of a rung timed (`t`: a harness.Timing, None for a shared rung that
    this chapter only checks and profiles), checked (`fid`) and profiled (kernels `k`). The
    times: the minimum, quartiles, median and maximum of the host wall time and of the CUDA
    events around each trial (`gpu_ms_*`: the main number of a graph replay, which the GPU
    alone paces)."""
    from labsupport.measure import harness

    times = {}
    if t is not None:
        times = t.summary()  # wall_ms_min, _q1, _median, _q3, _max, _repeats, clean
        g = list(t.gpu_ms)
        times.update(
            {"gpu_ms_min": min(g), "gpu_ms_q1": harness.quantile(g, 0.25), "gpu_ms_median": harness.quantile(g, 0.5),
             "gpu_ms_q3": harness.quantile(g, 0.75), "gpu_ms_max": max(g)} if g else {}
        )  # fmt: skip
    return {
        "rung": rung,
        "status": "ok",
        **kernels.profile_row(k, total=False, bounds=True),
        "profiled_step_ns": span_ns,
        **times,
        "compile_s": getattr(step, "compile_s", float("nan")),
        **fid,
    }


def rungs_table(rows: dict[str, dict], status: dict[str, str]) -> pd.DataFrame:
    """rungs.csv: one row per rung in ladder order; a rung without numbers has its reason."""
    out = [rows[r] if r in rows else {"rung": r, "status": status[r]} for r in RUNGS if r in rows or r in status]
    return pd.DataFrame(out, columns=RUNG_COLUMNS)


def weight_shapes(model) -> dict[str, tuple[int, int]]:
    """The weight matrices of one decoder layer (separate and fused) and the LM head of `model`, by
    name: (rows N, columns K) (models.weight_shapes)."""
    return models.weight_shapes(model.config.to_dict())


def fused_cases(model) -> list:
    """The fused GEMVs of rungs 8 and on, each with the fusion it runs with: qkv and gate/up after a
    norm, gate/up writing silu(gate) * up, o_proj and down_proj adding the residual."""
    from labsupport.measure.kernels.gemv import Fusion

    s = weight_shapes(model)
    return [
        (*s["qkv (fused)"], Fusion(norm=True)),
        (*s["o_proj"], Fusion(residual=True)),
        (*s["gate_up (fused)"], Fusion(norm=True, silu=True)),
        (*s["down_proj"], Fusion(residual=True)),
    ]


def tuning_cases(model) -> list:
    """What gemv.tune times: every weight shape plain, the fused GEMVs (fused_cases), and gate/up
    writing silu(gate) * up with its norm folded into the weights (the folded-norms rung: no norm in
    the kernel, so a tiling of its own)."""
    from labsupport.measure.kernels.gemv import PLAIN, Fusion

    s = weight_shapes(model)
    plain = [(*shape, PLAIN) for shape in dict.fromkeys(s.values())]
    return plain + fused_cases(model) + [(*s["gate_up (fused)"], Fusion(silu=True))]


def fp8_tuning_cases(model) -> list:
    """What gemv.tune times with FP8 weights: the cases the FP8 rungs run: the fused GEMVs and the LM
    head, and for the FP8 rung with folded norms QKV plain and gate/up writing silu(gate) * up with no norm
    (its o_proj and down_proj are the residual cases already)."""
    from labsupport.measure.kernels.gemv import PLAIN, Fusion

    s = weight_shapes(model)
    folded = [(*s["qkv (fused)"], PLAIN), (*s["gate_up (fused)"], Fusion(silu=True))]
    return fused_cases(model) + [(*s["lm_head"], PLAIN)] + folded


def tune_attention(model, prompt_len: int) -> list[dict]:
    """The one-kernel attention (rungs 13 on) timed with each config (stretch length, warps, a program
    per K/V head or per query head) on one layer of our step's cache (decode_attention.tune_one); the
    fastest is what the rungs run. One row each."""
    from labsupport.measure.kernels import decode_attention
    from labsupport.measure.models.qwen3_decode import EXTRA_SLOTS

    c = model.config
    progress("  attention in one kernel: timing its forms (the CUDA C++ one is built first where nvcc is here: "
             "about a minute the first time)")  # fmt: skip
    rows = decode_attention.tune_one(
        c.num_attention_heads, c.num_key_value_heads, c.head_dim, prompt_len + EXTRA_SLOTS, prompt_len, model.dtype
    )
    best = next(r for r in rows if r["chosen"])
    progress(f"  attention in one kernel: {best['us']:.1f} us with {best['block_s']} positions per program "
             f"({best['programs']} programs of {best['num_warps']} warps, {attention_form(best)}), "
             f"best of {len(rows)}")  # fmt: skip
    return rows


def tune_layer_kernel(model, prompt_len: int) -> list[dict]:
    """The layer kernel (the one-kernel-a-layer rung) timed with each of its candidate configs on one
    layer of our step's shapes (megakernel.tune); the fastest is what the rung runs. One row each."""
    from labsupport.measure.kernels import megakernel
    from labsupport.measure.models.qwen3_decode import EXTRA_SLOTS

    c = model.config
    rows = megakernel.tune(
        c.hidden_size, c.intermediate_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim,
        prompt_len + EXTRA_SLOTS, prompt_len, model.dtype,
    )  # fmt: skip
    for r in rows:
        how = f"{r['us']:.1f} us a layer" if r["status"] == "ok" else r["status"]
        progress(f"  one kernel a layer, {r['ctas_per_sm']} x {r['num_warps']} warps a SM, {r['block_n']} rows: {how}")
    return rows


def persistent_tuning_cases(model) -> list:
    """What gemv.tune times with the persistent candidates: the GEMVs of the persistent rung's step,
    whose norms are folded into the weights (QKV and the LM head plain, o_proj and down_proj adding
    the residual, gate/up writing silu(gate) * up)."""
    from labsupport.measure.kernels.gemv import PLAIN, Fusion

    s = weight_shapes(model)
    return [
        (*s["qkv (fused)"], PLAIN),
        (*s["o_proj"], Fusion(residual=True)),
        (*s["gate_up (fused)"], Fusion(silu=True)),
        (*s["down_proj"], Fusion(residual=True)),
        (*s["lm_head"], PLAIN),
    ]


def time_matmuls(shapes: dict[str, tuple[int, int]], dtype=None) -> pd.DataFrame:
    """Each weight shape read by one token's matmul: cuBLAS (torch.mm, as F.linear calls it) against our
    Triton GEMV with its tuned config, per call as inside a CUDA graph (gemv.time_per_call_us), in
    the model's `dtype` (None: BF16)."""
    import torch

    from labsupport.measure.kernels import gemv

    rows = []
    for name, (n, k) in shapes.items():
        out = torch.empty(1, n, device="cuda", dtype=dtype or torch.bfloat16)
        us = {
            "cublas": gemv.time_per_call_us(n, k, lambda x, w, out=out: torch.mm(x, w.t(), out=out), dtype=dtype),
            "triton": gemv.time_per_call_us(n, k, gemv.fused_call(n, k, gemv.PLAIN, dtype=dtype), dtype=dtype),
        }
        nbytes = n * k * 2
        rows.append(
            {"matrix": name, "n": n, "k": k, "bytes": nbytes, "cublas_us": us["cublas"], "triton_us": us["triton"],
             "cublas_tbs": nbytes / us["cublas"] / 1e6, "triton_tbs": nbytes / us["triton"] / 1e6}
        )  # fmt: skip
        progress(f"  {name} {n}x{k}: cuBLAS {us['cublas']:.1f} us, Triton {us['triton']:.1f} us")
    return pd.DataFrame(rows)


def fp8_record(step, model) -> dict:
    """What the run keeps of an FP8 rung's step, once for all of them (they read the same weights):
    the bytes it reads as weights (FP8 matrices, their float32 row scales, the BF16 norms), from
    which their own floor comes, and how far rounding `model`'s weight matrices (every linear
    layer's, the LM head's) to E4M3 with row scales moved them (gemv_fp8.rounding_error)."""
    import torch

    from labsupport.measure.kernels import gemv_fp8

    mats = [m.weight for m in model.modules() if isinstance(m, torch.nn.Linear)]
    return {"decode_bytes": int(step.dec.weight_bytes()), "rounding_error": gemv_fp8.rounding_error(mats)}


def best_timed(timed: dict, checks: dict) -> str | None:
    """The fastest BF16 rung timed here that gave eager's answers (by the minimum of its CUDA
    events where it has them, else of its wall time), or None."""
    good = [r for r in timed if r not in FP8_RUNGS and checks.get(r, {}).get("passed")]
    key = lambda r: min(timed[r].gpu_ms) if timed[r].gpu_ms else timed[r].low  # noqa: E731
    return min(good, key=key) if good else None


def time_tokens(step, device: str, rounds: int, tokens=TOKENS) -> pd.DataFrame:
    """tokens_per_forward.csv: the decoder of `step` (an OwnStep: the best BF16 rung's) run on
    1, 2, 4, 8, 16 tokens at once (qwen3_decode.VerifyStep, compiled, one CUDA graph each; one
    token goes through the rung's own kernels, several through cuBLAS and PyTorch's attention,
    our GEMV taking one vector), all timed interleaved (CUDA events on a GPU). A width that fails
    to build is recorded with its reason."""
    from labsupport.measure import harness
    from labsupport.measure.models import qwen3_decode

    ours = step.dec.opts.matmul == "triton"
    variants, rows = {}, {}
    for t in tokens:
        path = "the rung's kernels (our GEMV)" if t == 1 and ours else "cuBLAS matmuls, PyTorch attention"
        rows[t] = {"tokens": t, "path": path, "status": "ok"}
        try:
            v = qwen3_decode.VerifyStep(step, t)
        except Exception as e:  # one width failing leaves the others
            rows[t]["status"] = f"failed: {type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"
            progress(f"  {t} tokens: {rows[t]['status']}")
            continue
        variants[f"{t} tokens"] = (v, None)
        rows[t]["compile_s"] = v.compile_s
    timed = harness.interleaved(variants, device=device, rounds=rounds, warmup=3, what="tokens per forward",
                                progress=progress) if variants else {}  # fmt: skip
    for name, tm in timed.items():
        t = int(name.split()[0])
        vals = list(tm.gpu_ms) or list(tm.wall_ms)
        q = {f"ms_{n}": harness.quantile(vals, v) for n, v in (("q1", 0.25), ("median", 0.5), ("q3", 0.75))}
        rows[t] |= {"ms_min": min(vals), **q, "ms_max": max(vals), "repeats": len(vals)}
        progress(f"  {t} tokens: {rows[t]['ms_min']:.3f} ms per forward (minimum)")
    return pd.DataFrame(list(rows.values()), columns=TOKEN_COLUMNS)
