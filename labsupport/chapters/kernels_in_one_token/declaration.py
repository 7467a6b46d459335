"""What "The kernels in one token" declares: its run's files and its parameters."""

from __future__ import annotations

from dataclasses import dataclass

# fmt: off
# isort: off
from labsupport.chapters.declaring import (  # the names, wrapped to read as a list
    BATCH, CEILINGS_FILE, DEVICE, DTYPE, KERNELS_BY_LAYER, LENGTHS, REPEATS, TOKENS, Chapter, File,
    Parameters, param,
)
# isort: on
# fmt: on
from labsupport.chapters.rules import between, model_folder, preset


@dataclass
class Params(Parameters):
    """What one run of the chapter measures."""

    preset: str = param("qwen3-8b", check=preset(), cpu="tiny")
    # a local model folder with a transformers config.json (its safetensors, else random weights) in place of the preset
    model: str = param("", check=model_folder())
    batch: int = param(1, check=BATCH)
    prompt_len: int = param(256, check=TOKENS, cpu=16)
    dtype: str = param("bfloat16", check=DTYPE)  # or "float16"; a GPU without BF16 (T4, V100) runs float16
    contexts: list[int] = param([256, 1024, 4096, 8192, 16384, 32768], check=LENGTHS, smoke=[256, 4096], cpu=[8, 32])
    # rounds at the prompt's length: one step of each cache per round, interleaved; the fast-host median
    # needs 10 fast-host trials (harness.MIN_FAST_TRIALS), and a host that holds its speed gives ~all 24
    repeats: int = param(24, check=REPEATS, smoke=5, cpu=2)
    context_repeats: int = param(8, check=REPEATS)  # rounds at every other context (never waits for a fast host)
    # fresh processes that time the eager step (none of them profiles)
    fresh_processes: int = param(2, check=between(0, 32), smoke=1, cpu=1)
    device: str = param("cuda", check=DEVICE, cpu="cpu")


# fmt: off
DECLARATION = Chapter(
    "kernels-in-one-token",
    (
        CEILINGS_FILE,
        File("kernels.csv", "every kernel of the profiled decode step: name, kind, times, launch, operator, layer",
             KERNELS_BY_LAYER, required=True),
        File("census.csv", "the step's kernels and GPU time by kind", ("kind", "kernels", "gpu_ms", "share"),
             required=True),
        File("step_times.csv",
             "every clean (unprofiled) trial of the eager step in the recording process, with its round and the host "
             "probe's reading of that round", ("repeat", "wall_ms"), required=True),
        File("plain_eager_step.csv",
             "every trial of the same step timed by benchmarks/plain_eager_step.py in a fresh process, with the host "
             "probe's reading just before it", ("trial", "wall_ms", "probe_ms")),
        File("fresh_processes.csv", "the eager step timed in fresh processes that never profiled, with their CPU load"),
        # the profiled span: one value, no quartiles
        File("profiler_effect.csv", "the same step timed clean, after a profile, and as its span inside a profile",
             may_lack=("wall_ms_q*",)),
        File("context_sweep.csv", "the step at each context length, dynamic and static cache: kernels, time, KV bytes",
             ("context", "status", "kernels"), required=True),
        File("context_census.csv", "the census by kind at each context length"),
        File("context_times.csv", "every trial at each context length, both caches, interleaved in rounds"),
        File("context_ops.csv", "each profiled step of the sweep by kind and call path: kernels, GPU time"),
        File("trace.json.gz", "the raw profiler trace of the decode step (opens in Perfetto)", required=True),
    ),
    Params,
    reads=("why-a-gpu", "launch-overhead"),  # the ceilings; the page glues every shared quantity
)
# fmt: on
