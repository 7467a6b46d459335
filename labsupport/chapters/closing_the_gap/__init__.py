"""Chapter "Closing the gap": one Qwen3-8B decode step taken from eager to as close to the
bandwidth floor as we can get, one rung at a time, every rung measured in the same run and
checked against eager's answers.

Live (the notebook's visible cells): tune and time our Triton GEMV shape by shape, build and
time every rung, check its logits, then profile each (no wall time after a profile). Replay:
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
    floor,
    headline,
    kernel_table,
    ladder,
    matmul_launches,
    matmuls,
    next_to_published,
    remaining,
    time_split,
    tolerance_text,
    tuning,
)
from labsupport.chapters.closing_the_gap.analysis import fidelity as fidelity_table
from labsupport.chapters.closing_the_gap.figures import ladder_figure, matmul_figure
from labsupport.chapters.closing_the_gap.measuring import (
    Reference,
    build,
    eager_fidelity,
    fidelity,
    pending_run,
    reference,
    rung_row,
    rungs_table,
    runs_here,
    time_matmuls,
    tuning_cases,
    weight_shapes,
)
from labsupport.chapters.closing_the_gap.params import (
    CHAPTER,
    ERROR_FACTOR,
    MATMUL_COLUMNS,
    OWN_OPTIONS,
    RUNG_COLUMNS,
    RUNG_SHORT,
    RUNGS,
    STEP_TIME_COLUMNS,
    TARGET_X_FLOOR,
    Params,
    load,
    progress,
    trace_file,
)

__all__ = [
    "CHAPTER", "RUNGS", "RUNG_SHORT", "OWN_OPTIONS", "RUNG_COLUMNS", "STEP_TIME_COLUMNS", "MATMUL_COLUMNS",
    "ERROR_FACTOR",
    "TARGET_X_FLOOR", "Params", "load", "progress", "trace_file",
    "pending_run", "reference", "build", "runs_here", "fidelity", "Reference", "eager_fidelity", "rung_row",
    "rungs_table",
    "weight_shapes", "tuning_cases", "time_matmuls",
    "Floor", "floor", "kernel_table", "ladder", "best", "time_split", "census", "census_by_rung", "fidelity_table",
    "matmuls", "matmul_launches",
    "remaining", "tuning", "headline", "tolerance_text", "next_to_published",
    "ladder_figure", "matmul_figure",
]  # fmt: skip
