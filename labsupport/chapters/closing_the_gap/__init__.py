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
    split_k    split_k_text: what the split-K rung changed against rung 9, from the run's tuning
    figures    the ladder figure and the matmul figure
"""

# ruff: noqa: F401, I001 (these imports are the package's public names, wrapped to read as a list)
from __future__ import annotations

# fmt: off
from .analysis import (
    best, census, census_by_rung, compiled_matmuls, fidelity_table, floor, Floor, fp8_error_factor,
    fp8_floor, fp8_tolerance_text, headline, is_shared_config, kernel_groups, kernel_table, ladder, matmul_launches,
    matmuls, next_to_published, overlap_text, overlaps, remaining, shared_values, time_split, token_note,
    tokens_per_forward, tolerance_text, tuning,
)
from .split_k import (
    split_k_text,
)
from .figures import (
    ladder_figure, matmul_figure,
)
from .measuring import (
    best_timed, build, eager_fidelity, error_factor, fidelity, fp8_record, fp8_tuning_cases, pending_run, Reference,
    reference, rung_row, rungs_table, runs_here, time_matmuls, time_tokens, timed_here, tuning_cases, weight_shapes,
)
from .params import (
    CHAPTER, ERROR_FACTOR, FP8_ERROR_FACTOR, FP8_ERROR_FACTORS, FP8_RUNGS, load, MATMUL_COLUMNS, OWN_OPTIONS,
    progress, RUNG_COLUMNS, RUNG_SHORT, RUNGS, SHARED_CONFIG, SHARED_RUNGS, STEP_TIME_COLUMNS, TOKENS,
    trace_file,
)
from .declaration import (
    DECLARATION, Params,
)
# fmt: on
