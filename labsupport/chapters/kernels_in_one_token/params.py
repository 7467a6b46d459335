"""What one run of "The kernels in one token" measures, and where it lies."""

from __future__ import annotations

from dataclasses import dataclass, field

from labsupport import chapters

ENTRY = chapters.of_module(__name__)  # the registry's entry: its slug, load() and progress()
CHAPTER, load, progress = ENTRY.slug, ENTRY.load, ENTRY.progress
TRACE_FILE = "trace.json.gz"


@dataclass
class Params:
    """What one run of the chapter measures."""

    preset: str = "qwen3-8b"
    batch: int = 1
    prompt_len: int = 256
    dtype: str = "bfloat16"  # or "float16" (environment.dtype_here: what a GPU without BF16 runs)
    contexts: list[int] = field(default_factory=lambda: [256, 1024, 4096, 8192, 16384, 32768])
    # rounds at the prompt's length: one step of each cache per round, interleaved; the fast-host median
    # needs 10 fast-host trials (harness.MIN_FAST_TRIALS), and a host that holds its speed gives ~all 24
    repeats: int = 24
    context_repeats: int = 8  # rounds at every other context (not a headline: never waits for a fast host)
    fresh_processes: int = 2  # fresh processes that time the eager step (none of them profiles)
    device: str = "cuda"
