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
    figures       the breakdown figure
"""

from labsupport.chapters.launch_overhead.analysis import (
    EagerSummary,
    breakdown,
    eager_summary,
    headline,
    kernel_table,
    measured_column,
    one_layer,
    profiled_note,
    shared,
    timing_note,
    variants,
    wall_stats,
)
from labsupport.chapters.launch_overhead.figures import breakdown_figure
from labsupport.chapters.launch_overhead.measuring import (
    failure,
    first_line,
    pending_run,
    variant_row,
    variants_table,
)
from labsupport.chapters.launch_overhead.params import (
    CHAPTER,
    OWNED,
    SHARED_PREFIX,
    STEP_TIME_COLUMNS,
    VARIANT_COLUMNS,
    VARIANTS,
    Params,
    load,
    progress,
    trace_file,
)
from labsupport.chapters.launch_overhead.static_cache import (
    STATIC_CACHE_CALLS,
    StaticCacheSummary,
    call_paths,
    static_cache_diff,
    static_cache_summary,
    what_call,
)
from labsupport.measure.steps import StaticStep, graphs_compiled  # what tests/test_hybrid.py imports from here

__all__ = [
    "shared",
    "CHAPTER", "OWNED", "SHARED_PREFIX", "VARIANTS", "VARIANT_COLUMNS", "STEP_TIME_COLUMNS", "Params", "load",
    "progress", "trace_file",
    "pending_run", "failure", "first_line", "variant_row", "variants_table",
    "kernel_table", "one_layer", "measured_column", "timing_note", "variants", "wall_stats", "breakdown",
    "profiled_note",
    "EagerSummary",
    "eager_summary", "headline",
    "call_paths", "STATIC_CACHE_CALLS", "what_call", "static_cache_diff", "StaticCacheSummary", "static_cache_summary",
    "breakdown_figure", "StaticStep", "graphs_compiled",
]  # fmt: skip
