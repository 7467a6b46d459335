"""What "A hybrid model's token" declares: its run's files and its parameters."""

from __future__ import annotations

from dataclasses import dataclass

# fmt: off
# isort: off
from labsupport.chapters.declaring import (  # the names, wrapped to read as a list
    CEILINGS_FILE, DEVICE, DTYPE, LENGTHS, REPEATS, TOKENS, Chapter, File, Parameters, param,
)
# isort: on
# fmt: on
from labsupport.chapters.rules import preset, subset_of

BACKENDS = subset_of("reference", "fla")  # Gated DeltaNet's code: transformers' PyTorch, flash-linear-attention


@dataclass
class Params(Parameters):
    """What one run of the chapter measures."""

    preset: str = param("qwen3.5-27b", check=preset(), cpu="tiny-hybrid")
    prompt_len: int = param(512, check=TOKENS, cpu=16)
    dtype: str = param("bfloat16", check=DTYPE)  # or "float16"; a GPU without BF16 (T4, V100) runs float16
    # interleaved rounds; the fast-host median needs 10 of them on a fast host
    repeats: int = param(12, check=REPEATS, smoke=3, cpu=2)
    backends: list[str] = param(["reference", "fla"], check=BACKENDS, cpu=["reference"])
    cuda_graphs: bool = param(True)  # False skips the CUDA-graph variants
    # torch.compile takes minutes per backend; [] skips it
    compile_backends: list[str] = param(["reference", "fla"], check=BACKENDS, smoke=[], cpu=[])
    contexts: list[int] = param([512, 4096, 32768], check=LENGTHS, smoke=[512, 4096], cpu=[8, 64])
    device: str = param("cuda", check=DEVICE, cpu="cpu")


# fmt: off
DECLARATION = Chapter(
    "hybrid-model-token",
    (
        CEILINGS_FILE,
        File("variants.csv", "each backend and mode of the decode step: kernels, GPU-busy and wall time, status",
             ("backend", "mode", "status", "kernels", "gpu_busy_ns", "wall_ms_median"), required=True),
        File("step_times.csv", "every clean timing of each backend and mode", ("backend", "mode", "repeat", "wall_ms"),
             required=True),
        File("prefill.csv", "the prompt phase of each backend: kernels, GPU-busy and wall time",
             ("backend", "status", "tokens", "kernels", "wall_ms_median"), required=True),
        File("cache_growth.csv",
             "the cache after prompts of each length (attention's KV cache, Gated DeltaNet's state)",
             ("context", "status", "layer_type", "layers", "bytes"), required=True),
        File("trace-reference-eager.json.gz", "the raw trace of the eager step, transformers' PyTorch Gated DeltaNet",
             required=True),
        File("trace-reference-cuda-graph.json.gz", "the raw trace of its CUDA-graph replay"),
        File("trace-reference-compile.json.gz", "the raw trace of it compiled"),
        File("trace-fla-eager.json.gz", "the raw trace of the eager step with flash-linear-attention's kernels"),
        File("trace-fla-cuda-graph.json.gz", "the raw trace of its CUDA-graph replay"),
        File("trace-fla-compile.json.gz", "the raw trace of it compiled"),
    ),
    Params,
    reads=("why-a-gpu",),  # its ceilings (shared.limits); the hybrid's own step walls are its own
)
# fmt: on
