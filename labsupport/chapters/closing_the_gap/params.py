"""What one run of "Closing the gap" measures: the rungs of the ladder from the eager decode
step to the bandwidth floor, the columns of the run's tables, and where the run lies."""

from __future__ import annotations

from dataclasses import dataclass

from labsupport import runs

CHAPTER = "closing-the-gap"
# The rungs, by data key, in ladder order, with the label the page shows for each. The first
# four are transformers' model; the rest are our own decode step (labsupport.measure.qwen3_decode).
RUNGS = {
    "eager": "eager, as written (transformers)",
    "cuda-graph": "static cache + CUDA graph (transformers)",
    "compile": 'torch.compile "reduce-overhead" (transformers)',
    "max-autotune": 'torch.compile "max-autotune" (transformers)',
    "own-compiled": "our decode step, compiled, one CUDA graph",
    "fused-projections": "+ Q/K/V and gate/up as one matmul each",
    "triton-gemv": "+ our Triton GEMV for every matmul",
    "fused-gemv": "+ norms, SiLU × up and residual adds inside the GEMVs",
    "fused-attention": "+ q/k norms, rotary, cache write and attention in two kernels of ours",
}
# Short names for the figure's axis, by the same keys.
RUNG_SHORT = {
    "eager": "1 eager",
    "cuda-graph": "2 CUDA graph",
    "compile": "3 torch.compile",
    "max-autotune": "4 max-autotune",
    "own-compiled": "5 our decode step",
    "fused-projections": "6 fused projections",
    "triton-gemv": "7 our Triton GEMV",
    "fused-gemv": "8 fused into the GEMVs",
    "fused-attention": "9 our attention kernels",
}
# The rungs that are transformers' step: shared quantities (labsupport.chapters.shared), timed by
# the chapter that owns each, by the prefix of their names there. This chapter shows their
# numbers from the owner's run and times none of them; it runs the first three only to check
# their answers against float32 and to profile them for the kernels by kind.
SHARED_RUNGS = {"eager": "eager", "cuda-graph": "graph", "compile": "compiled", "max-autotune": "autotune"}
# The configuration of the shared steps: a run of this chapter with other parameters (the tests'
# tiny model) has no shared numbers for its first rungs.
SHARED_CONFIG = {"preset": "qwen3-8b", "prompt_len": 256}
# The rungs that are our own decode step, and the options of each (qwen3_decode.Options).
OWN_OPTIONS = {
    "own-compiled": {},
    "fused-projections": {"fused": True},
    "triton-gemv": {"fused": True, "matmul": "triton"},
    "fused-gemv": {"fused": True, "matmul": "triton", "fuse_gemv": True},
    "fused-attention": {"fused": True, "matmul": "triton", "fuse_gemv": True, "fused_attention": True},
}
RUNG_COLUMNS = [
    "rung", "status", "kernels", "gpu_busy_ns", "first_kernel_ns", "last_kernel_end_ns", "profiled_step_ns",
    "wall_ms_median", "wall_ms_min", "wall_ms_max", "clean", "compile_s",
    "wall_ms_q1", "wall_ms_q3", "wall_ms_repeats",
    "gpu_ms_min", "gpu_ms_q1", "gpu_ms_median", "gpu_ms_q3", "gpu_ms_max",
    "max_abs_diff", "max_abs_err", "eager_abs_err", "max_abs_logit", "cosine", "same_token", "passed",
]  # fmt: skip
STEP_TIME_COLUMNS = ["rung", "repeat", "round", "wall_ms", "issue_ms", "gpu_ms", "clean"]
MATMUL_COLUMNS = ["matrix", "n", "k", "bytes", "cublas_us", "triton_us", "cublas_tbs", "triton_tbs"]
# Same answers. BF16 rounds at every operation, so no two implementations give identical
# logits; the reference for "correct" is the same step computed in float32 from the same
# weights. Eager BF16 itself is some distance from it; a rung passes when its greedy token is
# eager's and its largest logit error against float32 is at most ERROR_FACTOR times eager's.
ERROR_FACTOR = 2.0
# ... or, where eager is float32 already (the tests' tiny model) and its own error is nil, at
# most this fraction of the largest logit.
ERROR_FLOOR = 1e-3
# The target: 1.15x the time of the step's bytes at the practical ceiling (the best rate
# any kernel reached on the same GPU: shared.ceiling_ms).
TARGET_X_FLOOR = 1.15


@dataclass
class Params:
    preset: str = "qwen3-8b"
    prompt_len: int = 256
    repeats: int = 30  # rounds of interleaved trials of our rungs
    device: str = "cuda"


def progress(msg: str) -> None:
    """A line of the live recording's log, naming the chapter."""
    print(f"[{CHAPTER}] {msg}", flush=True)


def trace_file(rung: str) -> str:
    return f"trace-{rung}.json.gz"


def load(run_id: str | None = None) -> runs.Run:
    """The published run (or `run_id`) of this chapter."""
    return runs.load_run(CHAPTER, run_id)
