"""Chapter "A hybrid model's token": one decode step of the 27B Gated DeltaNet hybrid
(48 linear-attention layers, 16 full-attention layers).

Live (the notebook's measuring cells): build the model from its configuration with random BF16
weights; for each Gated DeltaNet backend (transformers' reference PyTorch code,
flash-linear-attention's Triton kernels) time the 512-token prompt and one decode step in eager
mode, as a CUDA graph, and through torch.compile; only when everything is timed, profile each
of them; then measure how the cache grows with the context (measuring.py).
The names of the run's tables, columns, modes and traces are in keys.py.
Replay: every table of the chapter is computed from the run: the run's own tables (tables.py),
its kernels (census.py), where the idle time sits (idle.py), the host's side (host.py), the
published vLLM profile beside it (vllm.py), and the chapter's figures (figures.py).
"""

from __future__ import annotations

from labsupport.chapters.hybrid_model_token.census import (
    LMHead,
    census_by_group,
    census_by_kind,
    kernel_table,
    largest_kernels,
    lm_head,
    mixer_by_module,
    mixer_kernels,
    per_layer_type,
    time_budget,
)
from labsupport.chapters.hybrid_model_token.figures import cache_growth_figure, csv_link, stacked_parts
from labsupport.chapters.hybrid_model_token.host import (
    HostCall,
    host_call,
    memsets_by_module,
    prefill_host_device,
)
from labsupport.chapters.hybrid_model_token.idle import (
    GAP_NS,
    IdleSummary,
    host_before_first_kernel,
    idle_places,
    idle_summary,
    step_gaps,
)
from labsupport.chapters.hybrid_model_token.keys import (
    ARTIFACTS,
    CACHE_GROWTH_COLUMNS,
    CHAPTER,
    GROUPS,
    MODES,
    MODES_SHORT,
    OUTSIDE,
    PREFILL_COLUMNS,
    STEP_TIME_COLUMNS,
    VARIANT_COLUMNS,
    load,
    progress,
    trace_file,
)
from labsupport.chapters.hybrid_model_token.measuring import (
    Params,
    Recorder,
    cache_rows,
    check_backends,
    model_facts,
)
from labsupport.chapters.hybrid_model_token.tables import (
    best_variant,
    cache_growth,
    headline,
    limits,
    measured_column,
    ok_variants,
    prefill,
    timing_note,
    variants,
    variants_compact,
)
from labsupport.chapters.hybrid_model_token.vllm import KEYS as BESIDE_KEYS
from labsupport.chapters.hybrid_model_token.vllm import OURS, PUBLISHED_PRESET, beside_published, prefill_flop

__all__ = [
    "ARTIFACTS",
    "BESIDE_KEYS",
    "CACHE_GROWTH_COLUMNS",
    "CHAPTER",
    "GAP_NS",
    "GROUPS",
    "MODES",
    "MODES_SHORT",
    "OURS",
    "OUTSIDE",
    "PREFILL_COLUMNS",
    "PUBLISHED_PRESET",
    "STEP_TIME_COLUMNS",
    "VARIANT_COLUMNS",
    "HostCall",
    "IdleSummary",
    "LMHead",
    "Params",
    "Recorder",
    "best_variant",
    "beside_published",
    "cache_growth",
    "cache_growth_figure",
    "cache_rows",
    "census_by_group",
    "census_by_kind",
    "check_backends",
    "csv_link",
    "headline",
    "host_before_first_kernel",
    "host_call",
    "idle_places",
    "idle_summary",
    "kernel_table",
    "largest_kernels",
    "limits",
    "lm_head",
    "load",
    "measured_column",
    "memsets_by_module",
    "mixer_by_module",
    "mixer_kernels",
    "model_facts",
    "ok_variants",
    "per_layer_type",
    "prefill",
    "prefill_flop",
    "prefill_host_device",
    "progress",
    "stacked_parts",
    "step_gaps",
    "time_budget",
    "timing_note",
    "trace_file",
    "variants",
    "variants_compact",
]
