"""Chapter "Closing the gap": one Qwen3-8B decode step taken from eager to as close to the
bandwidth floor as we can get, one rung at a time, every rung measured in the same run and
checked against eager's answers.

Live (the notebook's visible cells): tune and time our Triton GEMV shape by shape, build every
rung and check its logits, time our own rungs interleaved (transformers' rungs are shared
quantities, timed by the chapters that own them), then profile each (no time after a profile). Replay:
the ladder, where each rung's time goes, the kernels by kind, the matmuls by shape and what
remains, all computed from the run here.

    params     Params, CHAPTER, RUNGS (data key -> label shown), OWN_OPTIONS, ERROR_FACTOR, load
    measuring  pending_run, reference (eager's logits), build (each rung's step), fidelity,
               rung_row, rungs_table, weight_shapes, time_matmuls
    tilings    settle_folded_tilings: the folded steps' (BF16's, FP8's) near-tied tilings timed whole
    analysis   floor, the step's bytes (KV cache too), ladder, best (BF16's), best_fp8, time_split, census,
               fidelity table, matmuls, remaining, tuning, next to published
    kernel_time  kernel_groups (where a rung's kernel time goes, exclusive of waits), exclusive_parts,
               costlier_rungs (the rungs slower than the one they are built on, and the part that grew)
    split_k    split_k_text: what the split-K rung changed against rung 9, from the run's tuning
    prose      the page's sentences that depend on the run (which rungs failed, FP8, matmuls, launches, ...)
    page       Page and page(): every number and sentence the page glues, and the frames it shows
    figures    the ladder figure and the matmul figure
"""

# ruff: noqa: F401, I001 (these imports are the package's public names, wrapped to read as a list)
from __future__ import annotations

# fmt: off
from .analysis import (
    best, best_fp8, census, census_by_rung, compiled_matmuls, fidelity_table, floor,
    Floor, fp8_error_factor, fp8_floor, headline, is_shared_config, kernel_table, kv_cache_bytes,
    kv_positions, ladder, matmul_launches, matmuls, next_to_published, overlaps, remaining, shared_values, short_status,
    step_bytes, time_split, tokens_per_forward, tuning,
)
from .kernel_time import (
    costlier_rungs, exclusive_parts, kernel_groups,
)
from .prose import (
    atomic_adders, check_note, compile_matmul_text, compile_text, failed_text, folded_tilings_text, fp8_launch_text,
    fp8_rounding_text, fp8_text, fp8_tolerance_text, launch_text, matmul_text, overlap_text, repeat_note, token_note,
    tokens_text, tolerance_text,
)
from .page import (
    FIDELITY_FORMATS, FP8_FORMATS, GROUP_FORMATS, LADDER_FORMATS, LAUNCH_FORMATS, MATMUL_FORMATS, page, Page,
    STEP_BYTES_FORMATS, TOKENS_FORMATS,
)
from .split_k import (
    split_k_text,
)
from .figures import (
    ladder_figure, matmul_figure,
)
from .measuring import (
    best_timed, build, eager_fidelity, error_factor, fidelity, fp8_record, fp8_tuning_cases, gpu_memory_gb,
    pending_run, persistent_tuning_cases, Reference, reference, repeated_fidelity, rung_row, rungs_table, runs_here,
    time_matmuls, time_tokens, timed_here, tune_attention, tune_layer_kernel, tuning_cases, weight_shapes,
)
from .tilings import (
    folded_step_cases, folded_tie_cases, folded_tries, near_ties, one_tiling, settle_folded_tilings, step_trials,
)
from .params import (
    CHAPTER, ERROR_FACTOR, FP8_ERROR_FACTOR, FP8_ERROR_FACTORS, FP8_RUNGS, load, MATMUL_COLUMNS, OWN_OPTIONS,
    progress, RUNG_COLUMNS, RUNG_SHORT, RUNGS, SHARED_CONFIG, SHARED_RUNGS, STEP_ONE_TILING, STEP_TIE, STEP_TIE_FP8,
    STEP_TIME_COLUMNS, TOKENS, trace_file, BUILT_ON, built_on,
)
from .declaration import (
    DECLARATION, Params,
)
# fmt: on
