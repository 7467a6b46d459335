"""Chapter "A hybrid model's token": one decode step of the 27B Gated DeltaNet hybrid
(48 linear-attention layers, 16 full-attention layers).

Live (the notebook's measuring cells): build the model from its configuration with random BF16
weights; for each Gated DeltaNet backend (transformers' reference PyTorch code,
flash-linear-attention's Triton kernels) time the 512-token prompt and one decode step in eager
mode, as a CUDA graph, and through torch.compile; only when everything is timed, profile each
of them; then measure how the cache grows with the context (measuring.py, which also holds the
names of the run's tables, columns, modes and traces).
Replay: every table of the chapter is computed from the run: the run's own tables, its kernels
and the published vLLM profile beside it (analysis.py), the host's side and where the idle time
sits (idle.py), the chapter's figures (figures.py), what its page glues (page.py; its conditional
paragraphs, prose.py) and the tables it shows (tables.py). Their public names are the package's.
"""

# ruff: noqa: F401, I001 (these imports are the package's public names, wrapped to read as a list)
from __future__ import annotations

# fmt: off
from .analysis import (
    beside_published, best_variant, cache_growth, census_by_group, census_by_kind, headline, kernel_table,
    BESIDE_KEYS, largest_kernels, limits, lm_head, LMHead, measured_column, mixer_by_module, mixer_kernels,
    ok_variants, OURS, per_layer_type, prefill, prefill_flop, PUBLISHED_PRESET, time_budget, timing_note, variants,
    variants_compact,
)
from .figures import (
    cache_growth_figure, csv_link, groups_figure, stacked_parts, time_budget_figure,
)
from .idle import (
    GAP_NS, host_before_first_kernel, host_call, HostCall, idle_places, idle_summary, IdleSummary,
    memsets_by_module, prefill_host_device, step_gaps,
)
from .measuring import (
    ARTIFACTS, CACHE_GROWTH_COLUMNS, cache_rows, CHAPTER, check_backends, GROUPS, load, model_facts, MODES,
    MODES_SHORT, OUTSIDE, PREFILL_COLUMNS, progress, Recorder, STEP_TIME_COLUMNS, trace_file,
    VARIANT_COLUMNS, wall_column,
)
from .page import Page, page
from .prose import (
    beside_published_texts, fla_section, gpus_text, graph_text, host_text, inside_graph_text, prefill_text,
)
from .tables import (
    beside_published_shown, census_shown, groups_shown, host_events_shown, idle_places_shown, largest_kernels_shown,
    layer_types_shown, mixer_kernel_links, mixer_shown, prefill_shown, published_shown, time_budget_shown,
    variants_shown,
)
from .declaration import (
    DECLARATION, Params,
)
# fmt: on
