"""What "From model code to kernels" declares: its run's files and its parameters."""

from __future__ import annotations

from dataclasses import dataclass

from labsupport.chapters.declaring import DEVICE, DTYPE, KERNELS, REPEATS, TOKENS, Chapter, File, Parameters, param
from labsupport.chapters.rules import model_folder, preset


@dataclass
class Params(Parameters):
    preset: str = param("qwen3-8b", check=preset())
    # a local model folder with a transformers config.json (its safetensors, else random weights) in place of the preset
    model: str = param("", check=model_folder())
    dtype: str = param("bfloat16", check=DTYPE)  # or "float16"; a GPU without BF16 (T4, V100) runs float16
    tokens: int = param(1, check=TOKENS)  # rows of x: 1 is one decode step at batch 1
    repeats: int = param(100, check=REPEATS, smoke=10)  # timed calls of the MLP and of each RMSNorm
    device: str = param("cuda", check=DEVICE)


# fmt: off
DECLARATION = Chapter(
    "model-code-to-kernels",
    (
        File("mlp_kernels.csv",
             "every kernel of one decoder layer's MLP, with the operator and module that launched it", KERNELS,
             required=True),
        File("rmsnorm_kernels.csv", "the kernels of RMSNorm as written, compiled and as one Triton kernel",
             KERNELS + ("variant",), required=True),
        File("rmsnorm_times.csv", "the time of each RMSNorm variant", ("variant", "kernels", "us_median"),
             required=True),
    ),
    Params,
    # shared.glue_values() reads every owner's run (the eager step's kernels are shown)
    reads=("kernels-in-one-token", "why-a-gpu", "launch-overhead"),
)
# fmt: on
