"""Chapter "The kernels in one token": the helpers its notebook's live cells call, and the
analysis of a run.

Live (the notebook's visible cells): time the eager decode step in fresh processes, then in
this process at every context with a dynamic and a static cache interleaved in rounds (the
prompt's length is the headline: the book's eager step, a shared quantity), then profile the
step (trace, kernel table, census), time it once more with the profiler attached, and profile
the context sweep (kernels by call path). Replay: every table and number of the chapter is computed from the run here.

    params       Params, CHAPTER, TRACE_FILE, load
    measuring    pending_run (the run the cells fill), ContextSweep, profiler_effect_table
    analysis     kernel table, summary, census beside the published one, layers, context sweep
    matrices     the weight matrices by shape, the KV cache's traffic by context
    figures      the chapter's figures
    page         Page and page(): every number and fragment the page glues, the frames it shows, its prose
"""

# ruff: noqa: F401, I001 (these imports are the package's public names, wrapped to read as a list)
from __future__ import annotations

# fmt: off
from .analysis import (
    attention_kernel_names, census_beside_published, clean_times, context_ops, context_sweep, fresh_processes,
    headline, kernel_table, plain_step, PlainStep, layer_kernels, layer_parts, middle_layer, outside_layers, per_layer,
    profiler_effect, recompute_census, shared, static_at_prompt, static_copies, Summary, summary,
)
from .figures import (
    attention_share_figure, bandwidth_figure, census_figure, gemv_figure, kv_cache_figure, layer_parts_figure,
)
from .matrices import (
    gemv_by_shape, kv_bytes_per_token, kv_cache_traffic, projection_shapes, PROJECTIONS,
)
from .page import (
    census_table, context_wall_text, estimator_text, fresh_note, fresh_table, gemv_table, gemv_text, kv_cache_text,
    kv_table, page, Page, plain_text, static_copies_text, timeline_note, timeline_title, try_answers,
)
from .host import kept_trials, probe_figure, step_trials
from .measuring import (
    call_paths, context_row, ContextSweep, ops_rows, pending_run, plain_eager_step, profile_step,
    profiler_effect_table,
)
from .params import (
    CHAPTER, load, progress, TRACE_FILE,
)
from .declaration import (
    DECLARATION, Params,
)
# fmt: on
