"""What "Where kernels come from" declares: its run's files and its parameters."""

from __future__ import annotations

from dataclasses import dataclass

from labsupport.chapters.declaring import DEVICE, DTYPE, KERNELS, LENGTHS, REPEATS, Chapter, File, Parameters, param
from labsupport.chapters.rules import model_folder, preset


@dataclass
class Params(Parameters):
    """What one run of the chapter measures."""

    preset: str = param("qwen3-8b", check=preset())
    # a local model folder with a transformers config.json (its safetensors, else random weights) in place of the preset
    model: str = param("", check=model_folder())
    dtype: str = param("bfloat16", check=DTYPE)  # or "float16"; a GPU without BF16 (T4, V100) runs float16
    contexts: list[int] = param([256, 4096], check=LENGTHS, smoke=[256])  # tokens in the KV cache (attention)
    repeats: int = param(100, check=REPEATS, smoke=10)  # timed calls of each RMSNorm variant and attention backend
    device: str = param("cuda", check=DEVICE)


# fmt: off
DECLARATION = Chapter(
    "where-kernels-come-from",
    (
        File("fusion_kernels.csv", "the kernels of RMSNorm eager and compiled, with their sources",
             KERNELS + ("variant",), required=True),
        File("fusion_times.csv", "the time of each of them", ("variant", "kernels", "us_median"), required=True),
        File("fused_rmsnorm_source.py", "the Triton source torch.compile generated for the fused RMSNorm",
             required=True),
        File("attention_backends.csv",
             "each attention backend at each context length: kernels, GPU time, time per call",
             ("backend", "context", "status", "kernels", "gpu_ns", "us_median"), required=True),
        File("trace-rmsnorm-compiled.json.gz",
             "the raw profiler trace of one compiled RMSNorm call, with its host events (Dynamo's guard check, the "
             "compiled region, the launch)"),
    ),
    Params,
    reads=("kernels-in-one-token",),
)
# fmt: on
