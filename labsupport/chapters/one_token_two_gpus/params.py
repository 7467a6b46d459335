"""What one run of "One token on two GPUs" measures, the columns of its tables, and where the
run lies."""

from __future__ import annotations

from .declaration import DECLARATION

CHAPTER, load, progress = DECLARATION.slug, DECLARATION.load, DECLARATION.progress  # its declaration's
# The forms of the step, by data key, with the label the page shows for each.
VARIANTS = {
    "eager": "eager, dynamic cache (as written)",
    "cuda-graph": "CUDA graph of the static-cache step",
    "compile": 'torch.compile, mode "reduce-overhead"',
}
SHORT = {"eager": "eager step", "cuda-graph": "CUDA-graph step", "compile": "compiled step"}  # for sentences
STEP_TIME_COLUMNS = DECLARATION.columns_of("step_times.csv")  # as its declaration names them
VARIANT_COLUMNS = DECLARATION.columns_of("split_variants.csv")  # the key columns every variants table has
COLLECTIVE_COLUMNS = DECLARATION.columns_of("collectives.csv")  # as its declaration names them
ALLREDUCE_COLUMNS = DECLARATION.columns_of("allreduce.csv")  # as its declaration names them


def trace_file(tp: int, rank: int, variant: str) -> str:
    """The run's trace of one rank's profiled step of `variant` at tensor-parallel degree `tp`."""
    return f"trace-tp{tp}-rank{rank}-{variant}.json.gz"
