"""Chapter "Why a GPU": the per-token arithmetic, one matrix-vector product on the CPU
and the GPU, and a batch sweep of the decode step that finds where math, not memory,
becomes the limit (the ridge point).

The notebook's visible cells measure (with the helpers of `measuring`) and write the run;
`read_kernels` times the kernels that read the step's weights (the practical ceiling's); the rest reads
it: `one_token` (one token's arithmetic, the matrix-vector product),
`batch_sweep` (the sweep, its limits and ridge), `comparisons` (the sweep's irregular points,
and its ridge with the KV cache beside the published H100 figure), `figures` (with the live
notebook's explorer) and `page` (every number and text the page glues, and its tables). Their
public names are the package's."""

# ruff: noqa: F401, I001 (these imports are the package's public names, wrapped to read as a list)
from __future__ import annotations

# fmt: off
from .batch_sweep import (
    AGREEMENT, attention_flop_per_context_token, Batch1, batch1_check, bound_at, bytes_display, COMPUTE,
    context_note, flat_ms, gpu_regimes, headline, interleaved, kv_cap, largest, MEMORY, OVERHEAD, regime_batches,
    REGIME_RULE, regime_text, regimes, Ridge, ridge, smallest, sweep, sweep_display, sweep_note, sweep_numbers,
    wall_times_clean,
)
from .comparisons import (
    BUMP_TOLERANCE, H100, irregular_batches, irregular_text, kernel_count_groups, kv_ridge, KVRidge, matmul_choice,
    matmul_choice_text, PREFILL_CHAPTER, PUBLISHED, PUBLISHED_H100_RIDGE_REQUESTS, PUBLISHED_H100_RIDGE_SOURCE,
    ridge_comparison, ridge_display, ridge_pair_text, ridge_text, split_k_evidence, split_k_per_layer, SplitK,
)
from .figures import (
    arithmetic_figure, bytes_figure, explorer, limits_figure, throughput_figure,
)
from .measuring import (
    batch_matmuls, batch_prompt, CHAPTER, copied_step, copy_of, DECODE_WARMUP, free, fresh_step,
    gpu_matvec_operands, HOST_CLOCK, KEEP_SHARE, keeps_prefills, KERNEL_TIME, kv_bytes_per_token, load,
    matvec_table, PER_CALL, prefill_once, profile_batch, profile_matvec_gpu, progress, SETUP_COPY,
    SETUP_PREFILL, SETUP_ROWS, step_for, SWEEP_METHOD, sweep_row, time_batches, time_matvec_cpu, time_matvec_gpu,
)
from .read_kernels import (
    CUBLAS, MODEL_NEEDS, record_read_kernels, step_matrices, time_read_kernels, TRITON, TRITON_EARLY,
)
from .one_token import (
    arithmetic, arithmetic_display, arithmetic_rows, ceilings, ceilings_label, counts, DATASHEET, matvec, Matvec,
    matvec_summary, matvec_text, MEASURED, memory_ceiling_text, per_token_arithmetic, practical_ceiling_tbs, shared,
)
from .page import (
    batch1_note, glue_shared, Page, page, published_prefill, steps_note, sweep_panels, TABLE_FORMATS,
)
from .declaration import (
    DECLARATION, Params,
)
# fmt: on
