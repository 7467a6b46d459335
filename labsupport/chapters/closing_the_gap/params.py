"""What one run of "Closing the gap" measures: the rungs of the ladder from the eager decode
step to the bandwidth floor, the columns of the run's tables, and where the run lies."""

from __future__ import annotations

from labsupport.measure.kernels import gemv_fp8

from .declaration import DECLARATION

CHAPTER, load, progress = DECLARATION.slug, DECLARATION.load, DECLARATION.progress  # its declaration's
# The rungs, by data key, in ladder order, with the label the page shows for each. The first
# four are transformers' model; the rest are our own decode step (labsupport.measure.models.qwen3_decode).
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
    "split-k": "+ split-K for the smaller matrices where the tuner finds it faster",
    "pdl": "+ programmatic dependent launch: each GEMV may start while the kernel before drains",
    "weights-first": "+ each GEMV loads its first weights before it waits for the kernel before",
    "one-attention": "+ attention in one kernel, launched the same way, the cached keys and values read first",
    "folded-norms": "+ norm weights folded into the matrices, x's sum of squares from the kernel that writes x, "
    "argmax inside the LM head",
    "persistent": "+ persistent GEMVs: a few programs per SM walk each matrix's rows",
    "layer-kernel": "+ one kernel a layer: on rung 14, its four GEMVs and attention in one persistent kernel, "
    "stages joined by counters",
    "step-kernel": "+ one kernel a step: every layer and the LM head in one persistent kernel, after the embedding row",
    "fp8-weights": "FP8 (E4M3) weights with row scales, on rung 9: a floor of its own",
    "fp8-pdl": "FP8 (E4M3) weights on rung 13: dependent launch, weights first, one attention kernel",
    "fp8-folded": "FP8 (E4M3) weights on rung 14: the norm weights folded into the matrices before rounding",
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
    "split-k": "10 split-K",
    "pdl": "11 dependent launch",
    "weights-first": "12 weights before the wait",
    "one-attention": "13 one attention kernel",
    "folded-norms": "14 folded norms",
    "persistent": "15 persistent GEMVs",
    "layer-kernel": "16 one kernel a layer",
    "step-kernel": "17 one kernel a step",
    "fp8-weights": "18 FP8 weights (own floor)",
    "fp8-pdl": "19 FP8 + dependent launch",
    "fp8-folded": "20 FP8 + folded norms",
}
# Where the folded QKV's or gate/up's fastest tilings, each timed alone, lie within STEP_TIE of each
# other, the folded-norms step is built with each and timed whole, and the faster step keeps its
# tilings (settle_folded_tilings): alone, the tuner's pick between 8 rows of 1,024 and 4 of 2,048
# flipped from night to night on 0.04-0.6% (closing-the-gap 20261206T204745Z, 221102Z,
# 20261207T002010Z, 003422Z-h100-80gb-hbm3), and in the step 8 rows of 1,024 for both ran 5.082 ms
# against the tuner's 4 of 2,048 at 5.116 (20261207T030729Z-h100-80gb-hbm3).
STEP_TIE = 0.01
STEP_TIE_MOST = 2  # tilings tried per GEMV: the fastest two alone (four steps at most for the two GEMVs)
STEP_TIE_ROUNDS = 20
# The FP8 folded step settles its QKV's and gate/up's tilings the same way, over a wider tie: alone, its
# plain QKV kept 16 rows of 512 with an accumulator a weight at 9.64 us over 8 rows of 1,024 at 10.03
# (4% apart; 20261207T133436Z-h100-80gb-hbm3), and in that run's step the QKV took 330 us a step
# (exclusive, from the trace) against 269 us with 8 rows of 1,024 in 20261207T102609Z-h100-80gb-hbm3.
STEP_TIE_FP8 = 0.05
# The folded-norms step is also built with every GEMV on one tiling of the tuner's candidates, 4 rows of
# 1,024 with 4 warps, (block_n, block_k, num_warps, num_stages), where the tuner's picks are not that on
# every GEMV: on one H100 in one process the folded step ran 4.987 ms with it against 5.032 with the picks
# of 20261207T044556Z-h100-80gb-hbm3, which had timed 4 rows of 1,024 only with 8 warps (CUDA-event
# medians of 60 interleaved rounds), while every other single tiling tried ran 5.07-5.25. As a candidate
# it was then the tuner's own pick for 9 of the 12 BF16 cases timed as the step launches them
# (20261207T082204Z-h100-80gb-hbm3): not for down_proj (with the residual or plain) nor for k/v alone.
# With those picks the step ran 4.940 ms against 4.988 with every GEMV on the one tiling (one H100, one process,
# 60 interleaved rounds): the step keeps whichever is faster where it is run.
STEP_ONE_TILING = (4, 1024, 4, 2)
# The rungs that are transformers' step: shared quantities (labsupport.chapters.shared), timed by
# the chapter that owns each, by the prefix of their names there. This chapter shows their
# numbers from the owner's run and times none of them; it runs the first three only to check
# their answers against float32 and to profile them for the kernels by kind.
SHARED_RUNGS = {"eager": "eager", "cuda-graph": "graph", "compile": "compiled", "max-autotune": "autotune"}
# The configuration of the shared steps: a run of this chapter with other parameters (the tests'
# tiny model) has no shared numbers for its first rungs.
SHARED_CONFIG = {"preset": "qwen3-8b", "prompt_len": 256}
# The rungs that are our own decode step, and the options of each (qwen3_decode.Options).
PDL = {"fused": True, "matmul": "triton", "fuse_gemv": True, "fused_attention": True, "split_k": True, "pdl": True}
LAYER_KERNEL = {**PDL, "early_weights": True, "one_attention": True, "fold_norms": True, "layer_kernel": True}
OWN_OPTIONS = {
    "own-compiled": {},
    "fused-projections": {"fused": True},
    "triton-gemv": {"fused": True, "matmul": "triton"},
    "fused-gemv": {"fused": True, "matmul": "triton", "fuse_gemv": True},
    "fused-attention": {"fused": True, "matmul": "triton", "fuse_gemv": True, "fused_attention": True},
    "split-k": {"fused": True, "matmul": "triton", "fuse_gemv": True, "fused_attention": True, "split_k": True},
    "pdl": PDL,
    # each on the one before: PDL with the weights loaded first, then one attention kernel, then the folded norms,
    # then the persistent GEMVs, then (on the folded norms) one kernel a layer, then one kernel a step
    "weights-first": {**PDL, "early_weights": True},
    "one-attention": {**PDL, "early_weights": True, "one_attention": True},
    "folded-norms": {**PDL, "early_weights": True, "one_attention": True, "fold_norms": True},
    "persistent": {**PDL, "early_weights": True, "one_attention": True, "fold_norms": True, "persistent": True},
    # on the folded-norms rung's options, not the persistent rung's: its GEMV stages are persistent already
    "layer-kernel": LAYER_KERNEL,
    "step-kernel": {**LAYER_KERNEL, "step_kernel": True},
    # on rung 9's options, not on split-K's or PDL's: a failure of either cannot take this rung down
    "fp8-weights": {"fused": True, "matmul": "triton", "fuse_gemv": True, "fused_attention": True, "fp8": True},
    # rung 13's options on FP8 weights; rung 18 stands if PDL fails
    "fp8-pdl": {**PDL, "early_weights": True, "one_attention": True, "fp8": True},
    # rung 14's options on FP8 weights: the folded matrices rounded to E4M3 (on rung 19, so built on it)
    "fp8-folded": {**PDL, "early_weights": True, "one_attention": True, "fold_norms": True, "fp8": True},
}
# The rung each of our rungs is built on where it is not the one before it in RUNGS (its options are that
# rung's plus its own change): what the page sets it against when it costs time.
BUILT_ON = {"layer-kernel": "folded-norms", "fp8-weights": "fused-attention", "fp8-pdl": "one-attention"}


def built_on(rung: str) -> str | None:
    """The rung `rung` is built on (BUILT_ON, else the one before it in RUNGS; None for the first)."""
    order = list(RUNGS)
    return BUILT_ON.get(rung) or (order[order.index(rung) - 1] if order.index(rung) else None)


# The rungs whose weights are not BF16: each has its own floor (its own bytes over the datasheet),
# is never set against the BF16 floor, and is never "the best rung" (which is BF16's). They read
# FP8 matrices of the same shapes (rung 20 the folded ones, and not the two BF16 norm weights a layer
# that it folds, 0.6 MB of Qwen3-8B's 7.6 GB), so they share one floor, the bytes of rung 18's step
# (run.results["fp8"]); the page speaks of the fastest of them that gives eager's answers (analysis.best_fp8).
FP8_RUNGS = ("fp8-weights", "fp8-pdl", "fp8-folded")
# Tokens per forward: the best BF16 rung's decoder run on this many tokens at once (a verify pass).
TOKENS = (1, 2, 4, 8, 16)
TOKEN_COLUMNS = [
    "tokens", "path", "status", "ms_min", "ms_q1", "ms_median", "ms_q3", "ms_max", "repeats", "compile_s",
]  # fmt: skip
RUNG_COLUMNS = [
    "rung", "status", "kernels", "gpu_busy_ns", "first_kernel_ns", "last_kernel_end_ns", "profiled_step_ns",
    "wall_ms_median", "wall_ms_min", "wall_ms_max", "clean", "compile_s",
    "wall_ms_q1", "wall_ms_q3", "wall_ms_repeats",
    "gpu_ms_min", "gpu_ms_q1", "gpu_ms_median", "gpu_ms_q3", "gpu_ms_max",
    "max_abs_diff", "max_abs_err", "eager_abs_err", "max_abs_logit", "cosine", "same_token", "tie_gap", "passed",
    "replays", "replays_differing", "replays_failed", "replay_max_abs_err",
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
# ERROR_FACTOR is a ratio of two errors in the same type (a rung's and eager's), so it holds in
# float16 as in BF16: both round at the same relative step.
# The FP8 rungs' allowed error, as a multiple of eager's own: ERROR_FACTOR times the ratio of
# E4M3's relative step (3 mantissa bits: 2^-3) to BF16's (2^-7), 16 (gemv_fp8's docstring).
FP8_ERROR_FACTOR = gemv_fp8.tolerance_factor(ERROR_FACTOR)
# By the model's dtype: in float16 (10 mantissa bits, a step of 2^-10) eager's own error is 8
# times smaller and the FP8 weights' the same, so the ratio is 2^-3 / 2^-10 = 128: 256.
FP8_ERROR_FACTORS = {d: gemv_fp8.tolerance_factor(ERROR_FACTOR, d) for d in gemv_fp8.HALF_RELATIVE_STEP}


def trace_file(rung: str) -> str:
    return f"trace-{rung}.json.gz"
