"""The chapter's names: its run's tables and columns, the modes and backends measured, the
parts of the model the census groups kernels by, the trace file of each variant."""

from __future__ import annotations

from labsupport import chapters

ENTRY = chapters.of_module(__name__)  # the registry's entry: its slug, load() and progress()
CHAPTER, load, progress = ENTRY.slug, ENTRY.load, ENTRY.progress
ARTIFACTS = ENTRY.artifacts
# The columns of the run's tables, written even when nothing ran.
VARIANT_COLUMNS = [
    "backend",
    "mode",
    "status",
    "kernels",
    "gpu_busy_ns",
    "kernel_ns",
    "launch_calls",
    "wall_ms_median",
    "wall_ms_min",
    "wall_ms_max",
    "wall_ms_q1",
    "wall_ms_q3",
    "issue_ms_median",
    "clean",
    "graphs_compiled_while_profiling",
    "compile_s",
]
STEP_TIME_COLUMNS = ["backend", "mode", "repeat", "wall_ms", "issue_ms", "gpu_ms", "clean", "round"]
PREFILL_COLUMNS = [
    "backend",
    "status",
    "tokens",
    "kernels",
    "gpu_busy_ns",
    "wall_ms_median",
    "wall_ms_min",
    "wall_ms_max",
    "wall_ms_q1",
    "wall_ms_q3",
    "clean",
]
CACHE_GROWTH_COLUMNS = list(ENTRY.columns["cache_growth.csv"])  # as the registry declares them
MODES = {
    "eager": "eager, dynamic cache (as written)",
    "cuda-graph": "CUDA graph (static cache)",
    "compile": 'torch.compile "reduce-overhead" (static cache)',
}
# The same, short, for narrow tables (the prose says what each is).
MODES_SHORT = {"eager": "eager", "cuda-graph": "CUDA graph", "compile": "torch.compile"}
# What each part of a decoder layer is, for the census by layer type.
GROUPS = {"linear_attn": "linear attention (Gated DeltaNet)", "self_attn": "full attention", "mlp": "MLP"}
# ... and the kernels outside the decoder layers.
OUTSIDE = {
    "lm_head": "LM head",
    "norm": "final norm",
    "embed_tokens": "embedding lookup",
    "rotary_emb": "rotary position tables",
    "sample": "sampling (argmax)",
    "model": "model glue (masks, positions)",
}


def wall_column(table) -> str:
    """The column a wall time is read from: the minimum of the timed repeats (the book's estimator for
    host-timed numbers), which every run of the chapter recorded; the median in a table without it."""
    return "wall_ms_min" if "wall_ms_min" in table else "wall_ms_median"


def trace_file(backend: str, mode: str) -> str:
    return f"trace-{backend}-{mode}.json.gz"
