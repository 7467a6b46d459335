"""What one run of "Launch overhead" measures: the variants of the decode step, the columns of
the run's tables, and where the run lies."""

from __future__ import annotations

from .declaration import DECLARATION

CHAPTER, load, progress = DECLARATION.slug, DECLARATION.load, DECLARATION.progress  # its declaration's
# The variants of the step, by data key, with the label the page shows for each (at display time).
VARIANTS = {
    "eager": "eager, dynamic cache (as written)",
    "eager-static": "eager, static cache",
    "cuda-graph": "CUDA graph of the static-cache step",
    "compile-reduce-overhead": 'torch.compile, mode "reduce-overhead"',
    "compile-max-autotune": 'torch.compile, mode "max-autotune"',
}
# The forms this chapter times (and owns for the whole book: labsupport.chapters.shared); the two
# eager ones are built and profiled here, but timed by "The kernels in one token".
OWNED = ("cuda-graph", "compile-reduce-overhead", "compile-max-autotune")
SHARED_PREFIX = {"eager": "eager", "eager-static": "static", "cuda-graph": "graph"}
SHARED_PREFIX |= {"compile-reduce-overhead": "compiled", "compile-max-autotune": "autotune"}
# The columns of the run's tables, written even when no variant ran.
VARIANT_COLUMNS = [
    "variant", "status", "kernels", "gpu_busy_ns", "first_kernel_ns", "last_kernel_end_ns", "profiled_step_ns",
    "launch_calls", "wall_ms_median", "wall_ms_min", "wall_ms_q1", "wall_ms_q3", "wall_ms_max", "issue_ms_median",
    "clean", "graphs_compiled_while_profiling", "compile_s",
]  # fmt: skip
STEP_TIME_COLUMNS = ["variant", "repeat", "round", "wall_ms", "issue_ms", "gpu_ms", "clean", "probe_ms"]


def trace_file(variant: str) -> str:
    return f"trace-{variant}.json.gz"
