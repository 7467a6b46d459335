"""What "Closing the gap" declares: its run's files and its parameters."""

from __future__ import annotations

from dataclasses import dataclass

# fmt: off
# isort: off
from labsupport.chapters.declaring import (  # the names, wrapped to read as a list
    CEILINGS, CEILINGS_LINE, DEVICE, DTYPE, REPEATS, TOKENS, Chapter, File, Parameters, param,
)
# isort: on
# fmt: on
from labsupport.chapters.rules import preset


@dataclass
class Params(Parameters):
    preset: str = param("qwen3-8b", check=preset("qwen3-8b", "tiny"), smoke="tiny", cpu="tiny")
    prompt_len: int = param(256, check=TOKENS, smoke=64, cpu=16)
    dtype: str = param("bfloat16", check=DTYPE)  # or "float16"; a GPU without BF16 (T4, V100) runs float16
    repeats: int = param(30, check=REPEATS, smoke=3, cpu=2)  # rounds of interleaved trials of our rungs
    replays: int = param(30, check=REPEATS, smoke=3, cpu=2)  # calls of each of our rungs after its check
    device: str = param("cuda", check=DEVICE, cpu="cpu")  # on a CPU only the plain PyTorch rungs run


_TRACES = {
    "eager": "the raw trace of the eager step",
    "cuda-graph": "the raw trace of transformers' static-cache step replayed as a CUDA graph",
    "compile": "the raw trace of transformers' step compiled (reduce-overhead)",
    "own-compiled": "the raw trace of our decode step, compiled, in one CUDA graph",
    "fused-projections": "the raw trace of our step with fused Q/K/V and gate/up",
    "triton-gemv": "the raw trace of our step with our Triton GEMV",
    "fused-gemv": "the raw trace of our step with norms, SiLU and residual adds inside the GEMVs",
    "fused-attention": "the raw trace of our step with our attention kernels",
    "split-k": "the raw trace of our step with split-K GEMVs where the tuner chose them",
    "pdl": "the raw trace of our step with our GEMVs launched with programmatic dependent launch",
    "weights-first": "the raw trace of our step with each GEMV loading its first weights before the wait",
    "one-attention": "the raw trace of our step with attention in one kernel",
    "folded-norms": "the raw trace of our step with the norms folded into the matrices and argmax in the LM head",
    "persistent": "the raw trace of our step with persistent GEMVs",
    "layer-kernel": "the raw trace of our step with one kernel a layer",
    "step-kernel": "the raw trace of our step in one kernel after the embedding row",
    "fp8-weights": "the raw trace of our step reading FP8 weights",
    "fp8-pdl": "the raw trace of our FP8 step on rung 13's options (dependent launch, weights first, one attention)",
    "fp8-folded": "the raw trace of our FP8 step on rung 14's options (the norms folded into the FP8 matrices)",
}

# fmt: off
DECLARATION = Chapter(
    "closing-the-gap",
    (
        File("ceilings.csv", CEILINGS_LINE, CEILINGS),  # in runs recorded before shared.limits()
        # the rungs timed elsewhere
        File("rungs.csv",
             "each rung of the ladder: kernels, GPU-busy, wall and compile time, its logits against eager's",
             ("rung", "status", "kernels", "gpu_busy_ns", "wall_ms_median", "max_abs_diff", "same_token", "passed"),
             may_lack=("wall_ms_*", "issue_ms_*", "gpu_ms_*"), required=True),
        File("step_times.csv", "every timed trial of our rungs, in interleaved rounds: wall and CUDA-event ms",
             ("rung", "repeat", "wall_ms"), required=True),
        File("matmuls.csv", "each weight shape's matmul for one token: cuBLAS against our Triton GEMV, in µs and TB/s",
             ("matrix", "n", "k", "bytes", "cublas_us", "triton_us")),
        File("gemv_tuning.csv",
             "every configuration of our GEMV tried on every weight shape (BF16 and FP8 weights, split-K, persistent), "
             "and the ones kept", ("n", "k", "block_n", "block_k", "num_warps", "num_stages", "us", "chosen")),
        File("tokens_per_forward.csv",
             "the best BF16 rung's decoder on 1 to 16 tokens at once: ms per forward, in interleaved rounds",
             ("tokens", "path", "status", "ms_min")),
        *(File(f"trace-{rung}.json.gz", line, required=rung == "eager") for rung, line in _TRACES.items()),
    ),
    Params,
    reads=("why-a-gpu", "kernels-in-one-token", "launch-overhead"),
)
# fmt: on
