"""Chapter "Launch overhead": the eager decode step's wall time against its GPU time, and the
fixes measured side by side on the same model and prompt: a static cache, CUDA graphs, and
torch.compile.

Live (the notebook's visible cells): build every variant, time the forms this chapter owns for
the book (CUDA graph, the two compile modes) interleaved in rounds, then profile each (no wall
time after a profile); the eager steps are profiled only, their wall times are "The kernels in
one token"'s (shared quantities). Replay: the fixes table, the eager step's summary, the breakdown of each
profiled step and what the static cache adds, all computed from the run here.

    params        Params, CHAPTER, VARIANTS (data key -> label shown), the tables' columns, load
    measuring     pending_run (the run the cells fill), failure, variant_row, variants_table
    analysis      the fixes table, the eager step's summary, the breakdown of each profiled step
    static_cache  the two eager steps compared call path by call path
    page          Page and page(): every number and fragment the page glues, and the frames it shows
    figures       the breakdown figure
"""

# ruff: noqa: F401, I001 (these imports are the package's public names, wrapped to read as a list)
from __future__ import annotations

from labsupport.measure.steps import StaticStep, graphs_compiled  # what tests/test_hybrid.py imports from here

# fmt: off
from .analysis import (
    breakdown, eager_summary, EagerSummary, headline, kernel_table, measured_column, one_layer, shared, variants,
    wall_stats,
)
from .figures import (
    breakdown_figure,
)
from .measuring import (
    failure, first_line, pending_run, variant_row, variants_table,
)
from .params import (
    CHAPTER, load, OWNED, progress, SHARED_PREFIX, STEP_TIME_COLUMNS, trace_file, VARIANT_COLUMNS, VARIANTS,
)
from .static_cache import (
    call_paths, STATIC_CACHE_CALLS, static_cache_diff, static_cache_summary, StaticCacheSummary, what_call,
)
from .page import (
    failed_text, fixes_table, measured_text, page, Page, profiled_note, static_cache_texts, timing_note,
)
from .declaration import (
    DECLARATION, Params,
)
# fmt: on
