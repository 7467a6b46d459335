"""What "Why a GPU" declares: its run's files and its parameters."""

from __future__ import annotations

from dataclasses import dataclass

# fmt: off
# isort: off
from labsupport.chapters.declaring import (  # the names, wrapped to read as a list
    CEILINGS_FILE, DEVICE, DTYPE, REPEATS, TOKENS, Chapter, File, Parameters, param,
)
# isort: on
# fmt: on
from labsupport.chapters.rules import each_between, model_folder, preset


@dataclass
class Params(Parameters):
    """The parameters a live run records (meta.json)."""

    preset: str = param("qwen3-8b", check=preset(), cpu="tiny")
    # a local model folder with a transformers config.json (its safetensors, else random weights) in place of the preset
    model: str = param("", check=model_folder())
    prompt_len: int = param(256, check=TOKENS, cpu=16)  # tokens of each sequence's prompt
    batches: list[int] = param(
        [1, 2, 4, 8, 16, 32, 64, 128, 192, 256, 384, 512], check=each_between(1, 4096), smoke=[1, 16], cpu=[1, 2, 4]
    )
    rounds: int = param(20, check=REPEATS, smoke=3, cpu=2)  # timed steps per batch size, one per round (interleaved)
    matvec_repeats: int = param(20, check=REPEATS, smoke=5, cpu=2)
    dtype: str = param("bfloat16", check=DTYPE)  # or "float16"; a GPU without BF16 (T4, V100) runs float16
    device: str = param("cuda", check=DEVICE, cpu="cpu")


# fmt: off
DECLARATION = Chapter(
    "why-a-gpu",
    (
        # ceilings.csv and read_kernels.csv: recorded on every GPU (runs before read_kernels lack it); none on a CPU
        CEILINGS_FILE,
        File("read_kernels.csv",
             "cuBLAS and the book's Triton GEMV (each configuration its tuner tries; on Hopper each also with "
             "dependent launch and weights first) at every weight shape of the decode step, the LM head included: "
             "per-call time and read rate; with the read stream, the practical ceiling",
             ("kernel", "matrix", "n", "k", "config", "bytes", "ms", "tbs")),
        File("matvec.csv", "the decode-sized matrix-vector product timed on the CPU (FP32, BF16) and on the GPU",
             ("device", "dtype", "ms_median", "bytes", "GB/s", "shape"), required=True),
        File("batch_sweep.csv",
             "one decode step per batch size: kernels, GPU-busy and matmul time, wall time (minimum, quartiles, "
             "median)",
             ("batch", "status", "kernels", "gpu_busy_ns", "kernel_ns", "matmul_ns", "wall_ms_median", "wall_ms_min"),
             required=True),
        File("batch_times.csv",
             "every timed step of the batch sweep, per batch size (and round, where the sizes were timed interleaved)"),
        File("batch_matmuls.csv",
             "the matrix multiplies of each batch size's step, by shape, with the kernel cuBLAS chose"),
    ),
    Params,
    reads=("kernels-in-one-token", "launch-overhead", "prefill-vs-decode"),
)
# fmt: on
