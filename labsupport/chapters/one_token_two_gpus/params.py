"""What one run of "One token on two GPUs" measures, the columns of its tables, and where the
run lies."""

from __future__ import annotations

from dataclasses import dataclass, field

from labsupport import chapters
from labsupport.measure.distributed import allreduce

ENTRY = chapters.of_module(__name__)  # the registry's entry: its slug, load() and progress()
CHAPTER, load, progress = ENTRY.slug, ENTRY.load, ENTRY.progress
# The forms of the step, by data key, with the label the page shows for each.
VARIANTS = {
    "eager": "eager, dynamic cache (as written)",
    "cuda-graph": "CUDA graph of the static-cache step",
    "compile": 'torch.compile, mode "reduce-overhead"',
}
SHORT = {"eager": "eager step", "cuda-graph": "CUDA-graph step", "compile": "compiled step"}  # for sentences
STEP_TIME_COLUMNS = ENTRY.columns["step_times.csv"]  # as the registry declares them
VARIANT_COLUMNS = ENTRY.columns["split_variants.csv"]  # the key columns every variants table has
COLLECTIVE_COLUMNS = ENTRY.columns["collectives.csv"]  # as the registry declares them
ALLREDUCE_COLUMNS = ENTRY.columns["allreduce.csv"]  # as the registry declares them


@dataclass
class Params:
    preset: str = "qwen3-8b"
    prompt_len: int = 256
    dtype: str = "bfloat16"  # or "float16" (environment.dtype_here: what a GPU without BF16 runs)
    batch: int = 1
    repeats: int = 20
    gpus: int = 2  # the tensor-parallel degree of the split run (the run at TP=1 comes first)
    variants: list = field(default_factory=lambda: list(VARIANTS))
    sweep_max: int = allreduce.SWEEP_MAX
    sweep_iters: int = 20
    device: str = "cuda"


def trace_file(tp: int, rank: int, variant: str) -> str:
    """The run's trace of one rank's profiled step of `variant` at tensor-parallel degree `tp`."""
    return f"trace-tp{tp}-rank{rank}-{variant}.json.gz"
