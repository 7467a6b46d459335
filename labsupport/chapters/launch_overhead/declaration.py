"""What "Launch overhead" declares: its run's files and its parameters."""

from __future__ import annotations

from dataclasses import dataclass

# fmt: off
# isort: off
from labsupport.chapters.declaring import (  # the names, wrapped to read as a list
    CEILINGS_FILE, DEVICE, DTYPE, REPEATS, TOKENS, Chapter, File, Parameters, param,
)
# isort: on
# fmt: on
from labsupport.chapters.rules import model_folder, preset


@dataclass
class Params(Parameters):
    preset: str = param("qwen3-8b", check=preset(), smoke="tiny", cpu="tiny")
    # a local model folder with a transformers config.json (its safetensors, else random weights) in place of the preset
    model: str = param("", check=model_folder())
    prompt_len: int = param(256, check=TOKENS, smoke=64, cpu=16)
    dtype: str = param("bfloat16", check=DTYPE)  # or "float16"; a GPU without BF16 (T4, V100) runs float16
    # interleaved rounds: one step of each timed form per round (10 fast-host ones needed)
    repeats: int = param(24, check=REPEATS, smoke=3, cpu=2)
    max_autotune: bool = param(True, smoke=True)  # the slowest compile (minutes); False skips it
    device: str = param("cuda", check=DEVICE, cpu="cpu")  # on a CPU only the two eager variants run


# fmt: off
DECLARATION = Chapter(
    "launch-overhead",
    (
        CEILINGS_FILE,  # runs before shared.limits()
        # the eager forms: timed by the census chapter
        File("variants.csv",
             "each form of the step (eager, static cache, CUDA graph, compiled): kernels, busy, wall time",
             ("variant", "status", "kernels", "gpu_busy_ns", "launch_calls", "wall_ms_median"),
             may_lack=("wall_ms_*", "issue_ms_*"), required=True),
        File("step_times.csv",
             "every clean trial of each form this chapter times (CUDA graph, compiled), with its round",
             ("variant", "repeat", "wall_ms"), required=True),
        File("trace-eager.json.gz", "the raw trace of the eager step", required=True),
        File("trace-eager-static.json.gz", "the raw trace of the eager step with a static cache"),
        File("trace-cuda-graph.json.gz", "the raw trace of the CUDA-graph replay"),
        File("trace-compile-reduce-overhead.json.gz", "the raw trace of the step compiled with mode reduce-overhead"),
        File("trace-compile-max-autotune.json.gz", "the raw trace of the step compiled with mode max-autotune"),
    ),
    Params,
    reads=("kernels-in-one-token", "why-a-gpu"),  # the eager steps' numbers; the ceilings
)
# fmt: on
