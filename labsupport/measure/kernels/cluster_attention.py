"""The one-kernel attention with its stretches combined on chip: cluster_attention.cu, built at run time.

In decode_attention_one's Triton forms, after a program's stretch is done it stores its softmax
partial, counts itself in with an atomic (release and acquire: the stores must reach L2 first), and
the last of a head's programs loads every partial back to combine them: three dependent trips through
L2 at the end of the chain that follows the QKV GEMV. A Hopper thread-block cluster runs the stretches
of a head together on one GPC, where each block can write the first block's shared memory and all
wait at one hardware barrier, so the partials never leave the chip. Triton (3.x) has no way to address
another block's shared memory, so this kernel is CUDA C++, compiled by nvcc through
torch.utils.cpp_extension.load_inline the first time it is used (about a minute; torch keeps the build).

`unusable(device)` says why it cannot run (no CUDA GPU of compute capability 9.0 or later, no nvcc,
or the build failed), so that the tuner leaves it out with its reason rather than failing.
"""

from __future__ import annotations

import shutil
from functools import cache
from pathlib import Path

SOURCE = Path(__file__).with_name("cluster_attention.cu")
BLOCKS = (32, 64, 128)  # positions per block (16 a warp); the kernel is built for these
HEAD_DIM = 128
MAX_CLUSTER = 8  # blocks in a cluster, at most (the portable size): the stretches of one head

_BINDING = """
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>

extern "C" int launch_cluster_attention(const void*, const void*, const void*, const void*, const void*, void*,
                                        void*, const int64_t*, void*, float, float, int, int, int, int, int,
                                        cudaStream_t);

torch::Tensor attention(torch::Tensor qkv, torch::Tensor q_norm, torch::Tensor k_norm, torch::Tensor cos,
                        torch::Tensor sin, torch::Tensor k_cache, torch::Tensor v_cache, torch::Tensor pos,
                        int64_t heads, double eps, int64_t block_s, bool pdl) {
  auto out = torch::empty({heads * k_cache.size(3)}, qkv.options());
  int err = launch_cluster_attention(
      qkv.data_ptr(), q_norm.data_ptr(), k_norm.data_ptr(), cos.data_ptr(), sin.data_ptr(), k_cache.data_ptr(),
      v_cache.data_ptr(), pos.data_ptr<int64_t>(), out.data_ptr(), static_cast<float>(eps),
      static_cast<float>(1.0 / std::sqrt(static_cast<double>(k_cache.size(3)))), static_cast<int>(heads),
      static_cast<int>(k_cache.size(1)), static_cast<int>(k_cache.size(2)), static_cast<int>(block_s), pdl ? 1 : 0,
      at::cuda::getCurrentCUDAStream());
  TORCH_CHECK(err == 0, "cluster attention: launch failed: ", cudaGetErrorString(static_cast<cudaError_t>(err)));
  return out;
}
"""


@cache
def extension():
    """The built extension (its one function, `attention`): nvcc runs once per machine and torch
    caches the result under its extensions folder."""
    from torch.utils.cpp_extension import load_inline

    return load_inline(
        name="labsupport_cluster_attention",
        cpp_sources=_BINDING,
        cuda_sources=SOURCE.read_text(),
        functions=["attention"],
        extra_cuda_cflags=["-O3", "-gencode=arch=compute_90,code=sm_90"],
        verbose=False,
    )


@cache
def unusable(device: str) -> str | None:
    """Why the cluster kernel cannot run on `device` (str of a torch.device), or None: it needs a CUDA
    GPU of compute capability 9.0 or later (thread-block clusters) and nvcc to build it."""
    import torch
    import torch.utils.cpp_extension

    dev = torch.device(device)
    if dev.type != "cuda":
        return f"needs a CUDA GPU, not {dev.type}"
    if torch.cuda.get_device_capability(dev)[0] < 9:
        return "needs thread-block clusters (compute capability 9.0 or later)"
    if shutil.which("nvcc") is None and not (Path(torch.utils.cpp_extension.CUDA_HOME or "") / "bin" / "nvcc").exists():
        return "needs nvcc to build it"
    try:
        extension()
    except Exception as e:  # a failed build: the reason's first line
        return f"build failed: {type(e).__name__}: {str(e).strip().splitlines()[0][:160] if str(e).strip() else ''}"
    return None


def fits(slots: int, block_s: int, head_dim: int, dtype) -> bool:
    """Whether the kernel takes these shapes: heads of HEAD_DIM in bfloat16, a block length it is built
    for, and at most MAX_CLUSTER stretches a head."""
    import torch

    stretches = -(-slots // block_s)
    return head_dim == HEAD_DIM and dtype == torch.bfloat16 and block_s in BLOCKS and stretches <= MAX_CLUSTER


def attention(qkv, q_norm, k_norm, cos, sin, k_cache, v_cache, pos, heads: int, eps: float, block_s: int, pdl: bool):
    """decode_attention_one's result (and its write of the new k and v into the caches) from the cluster
    kernel: grid (stretches, heads), one cluster a head."""
    _, _, slots, head_dim = k_cache.shape
    if not fits(slots, block_s, head_dim, qkv.dtype):
        raise ValueError(
            f"cluster attention takes bfloat16 heads of {HEAD_DIM} and at most {MAX_CLUSTER} stretches of "
            f"{BLOCKS} positions, not {head_dim}, {qkv.dtype}, {slots} positions in stretches of {block_s}"
        )
    named = {"qkv": qkv, "q_norm": q_norm, "k_norm": k_norm, "cos": cos, "sin": sin, "k_cache": k_cache,
             "v_cache": v_cache}  # fmt: skip
    for name, t in named.items():  # the kernel reads 8 bytes at a time from each
        if not t.is_contiguous() or t.data_ptr() % 8:
            raise ValueError(f"cluster attention reads contiguous tensors at 8-byte-aligned addresses; {name} is not")
    return extension().attention(
        qkv.reshape(-1), q_norm, k_norm, cos, sin, k_cache, v_cache, pos, heads, eps, block_s, pdl
    )
