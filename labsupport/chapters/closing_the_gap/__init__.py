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
    analysis   floor, ladder, best, time_split, census, fidelity table, matmuls, remaining, tuning
    figures    the ladder figure and the matmul figure
"""

from labsupport.chapters.closing_the_gap.analysis import (
    Floor,
    best,
    census,
    census_by_rung,
    compiled_matmuls,
    floor,
    fp8_floor,
    fp8_tolerance_text,
    headline,
    is_shared_config,
    kernel_groups,
    kernel_table,
    ladder,
    matmul_launches,
    matmuls,
    next_to_published,
    overlaps,
    remaining,
    shared_values,
    time_split,
    tokens_per_forward,
    tolerance_text,
    tuning,
)
from labsupport.chapters.closing_the_gap.analysis import fidelity as fidelity_table
from labsupport.chapters.closing_the_gap.figures import ladder_figure, matmul_figure
from labsupport.chapters.closing_the_gap.measuring import (
    Reference,
    best_timed,
    build,
    eager_fidelity,
    error_factor,
    fidelity,
    fp8_record,
    fp8_tuning_cases,
    pending_run,
    reference,
    rung_row,
    rungs_table,
    runs_here,
    time_matmuls,
    time_tokens,
    timed_here,
    tuning_cases,
    weight_shapes,
)
from labsupport.chapters.closing_the_gap.params import (
    CHAPTER,
    ERROR_FACTOR,
    FP8_ERROR_FACTOR,
    FP8_RUNGS,
    MATMUL_COLUMNS,
    OWN_OPTIONS,
    RUNG_COLUMNS,
    RUNG_SHORT,
    RUNGS,
    SHARED_CONFIG,
    SHARED_RUNGS,
    STEP_TIME_COLUMNS,
    TARGET_MS,
    TARGET_X_FLOOR,
    TOKENS,
    Params,
    load,
    progress,
    trace_file,
)

__all__ = [
    "CHAPTER", "RUNGS", "RUNG_SHORT", "OWN_OPTIONS", "RUNG_COLUMNS", "STEP_TIME_COLUMNS", "MATMUL_COLUMNS",
    "ERROR_FACTOR", "SHARED_RUNGS", "SHARED_CONFIG", "timed_here", "shared_values", "is_shared_config",
    "compiled_matmuls",
    "TARGET_X_FLOOR", "Params", "load", "progress", "trace_file",
    "pending_run", "reference", "build", "runs_here", "fidelity", "Reference", "eager_fidelity", "rung_row",
    "rungs_table",
    "weight_shapes", "tuning_cases", "time_matmuls",
    "Floor", "floor", "kernel_table", "ladder", "best", "time_split", "census", "census_by_rung", "fidelity_table",
    "matmuls", "matmul_launches",
    "remaining", "tuning", "headline", "tolerance_text", "next_to_published",
    "ladder_figure", "matmul_figure",
    "FP8_RUNGS", "FP8_ERROR_FACTOR", "TOKENS", "fp8_floor", "fp8_tolerance_text", "kernel_groups", "overlaps",
    "tokens_per_forward", "best_timed", "error_factor", "fp8_record", "time_tokens", "fp8_tuning_cases",
    "TARGET_MS",
]  # fmt: skip
