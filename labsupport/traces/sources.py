"""Where a kernel's code comes from (cuBLAS, cuDNN, Triton, PyTorch, ...), judged by its name."""

from __future__ import annotations

import functools
import re

from labsupport.traces.kinds import FLA, OUR_TRITON

SOURCES = (
    "cuBLAS/cuBLASLt",
    "cuDNN",
    "FlashAttention",
    "flash-linear-attention (Triton)",
    "Triton (torch.compile)",
    "Triton (ours)",
    "CUDA C++ (ours)",
    "PyTorch (ATen)",
    "CUDA driver",
    "NCCL",
    "other",
)

SOURCE_RULES: list[tuple[str, re.Pattern]] = [
    # cuDNN: its SDPA kernels and their helpers (cudnn::fusion::lean_reduction_kernel), and its
    # convolution kernels (implicit-GEMM xmma/cutlass fprop, implicit_convolve, [sh]cudnn_*).
    (
        "cuDNN",
        re.compile(
            r"^cudnn|cudnn_generated|\bcudnn::|^[sh]cudnn_|xmma_(fprop|dgrad|wgrad)"
            r"|implicit_convolve|_cudnn::",
            re.I,
        ),
    ),
    ("FlashAttention", re.compile(r"flash_fwd|pytorch_flash::|\bflash::", re.I)),
    ("flash-linear-attention (Triton)", FLA),
    ("Triton (torch.compile)", re.compile(r"^triton_(poi|red|per|tem|for|unk)_")),
    ("Triton (ours)", re.compile("^(" + "|".join(OUR_TRITON) + ")$")),
    # Our own CUDA C++ kernels (labsupport.measure.kernels.cluster_attention), by their demangled names.
    ("CUDA C++ (ours)", re.compile(r"^void cluster_attention_kernel<")),
    # cuBLAS ships its own kernels (nvjet on Hopper, gemv, and CUTLASS-built sgemm for fp32).
    (
        "cuBLAS/cuBLASLt",
        re.compile(
            r"nvjet|cublas|gemv|sm90_xmma|xmma_gemm|splitKreduce|cutlass_80_simt_sgemm"
            r"|ampere_\w*gemm|sm80_\w*gemm|s16816gemm",
            re.I,
        ),
    ),
    (
        "PyTorch (ATen)",
        re.compile(
            r"at::native::|\bat::|^void \(anonymous namespace\)::|fmha_cutlass"
            r"|indexSelect|CatArrayBatchedCopy|elementwise_kernel|reduce_kernel"
            r"|^aten::"
        ),
    ),  # on a CPU every "kernel" is an ATen operator
    # The driver's own copy kernels: a memory copy captured in a CUDA graph can run as a kernel
    # (`memcpy128`, `memcpy32_post` in the H200 runs, CUDA 13 driver 580), not a copy-engine copy.
    ("CUDA driver", re.compile(r"^memcpy\w*$")),
    # NCCL, the collectives library (all-reduce between GPUs), by its kernels' names.
    ("NCCL", re.compile(r"^(void )?nccl(Dev)?Kernel_")),
]


@functools.lru_cache(maxsize=1 << 16)
def source(name: str) -> str:
    """The library or tool that a kernel called `name` comes from."""
    for src, pattern in SOURCE_RULES:
        if pattern.search(name):
            return src
    return "other"
