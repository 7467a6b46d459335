"""What "Prompt phase vs decode phase" declares: its run's files and its parameters."""

from __future__ import annotations

from dataclasses import dataclass

# fmt: off
# isort: off
from labsupport.chapters.declaring import (  # the names, wrapped to read as a list
    CEILINGS_FILE, DEVICE, DTYPE, KERNELS_BY_LAYER, LENGTHS, REPEATS, TOKENS, Chapter, File,
    Parameters, param,
)
# isort: on
# fmt: on
from labsupport.chapters.rules import model_folder, preset


@dataclass
class Params(Parameters):
    """What one run of the chapter measures."""

    preset: str = param("qwen3-8b", check=preset(), cpu="tiny")
    # a local model folder with a transformers config.json (its safetensors, else random weights) in place of the preset
    model: str = param("", check=model_folder())
    prompt_len: int = param(512, check=TOKENS, cpu=16)
    dtype: str = param("bfloat16", check=DTYPE)  # or "float16"; a GPU without BF16 (T4, V100) runs float16
    prompt_lens: list[int] = param(
        [1, 8, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192], check=LENGTHS, smoke=[1, 64, 512], cpu=[1, 8, 16]
    )
    # rounds of interleaved trials: one decode step and one prefill of each length per round
    repeats: int = param(20, check=REPEATS, smoke=3, cpu=2)
    device: str = param("cuda", check=DEVICE, cpu="cpu")


# fmt: off
DECLARATION = Chapter(
    "prefill-vs-decode",
    (
        CEILINGS_FILE,
        File("phase_times.csv", "every timed trial of the prompt phase and of one decode step, in interleaved rounds",
             ("phase", "repeat", "wall_ms"), required=True),
        File("kernels-prefill.csv", "every kernel of the profiled prompt phase", KERNELS_BY_LAYER, required=True),
        File("kernels-decode.csv", "every kernel of the profiled decode step", KERNELS_BY_LAYER, required=True),
        File("census.csv", "both phases' kernels and GPU time by kind", ("phase", "kind", "kernels", "gpu_ms", "share"),
             required=True),
        File("prompt_sweep.csv",
             "the prompt phase at each prompt length: kernels, GPU busy, wall time (minimum, quartiles)",
             ("prompt_len", "status", "kernels", "gpu_busy_ns", "wall_ms_median"), required=True),
        File("trace-prefill.json.gz", "the raw trace of the prompt phase", required=True),
        File("trace-decode.json.gz", "the raw trace of the decode step", required=True),
    ),
    Params,
    reads=("why-a-gpu", "kernels-in-one-token", "launch-overhead"),
)
# fmt: on
