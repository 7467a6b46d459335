"""Kernels of our own, written in Triton: a vector add and a fused RMSNorm.

Triton is imported only when a kernel is first used, so the book builds without it.
On a machine without a GPU, set TRITON_INTERPRET=1 before the first use and the
same kernels run in Triton's interpreter (slowly, for tests).
"""

from __future__ import annotations

from functools import cache


@cache
def _kernels():
    import triton
    import triton.language as tl

    @triton.jit
    def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
        # Each program (one thread block) adds BLOCK consecutive elements.
        pid = tl.program_id(axis=0)
        offsets = pid * BLOCK + tl.arange(0, BLOCK)
        mask = offsets < n
        x = tl.load(x_ptr + offsets, mask=mask)
        y = tl.load(y_ptr + offsets, mask=mask)
        tl.store(out_ptr + offsets, x + y, mask=mask)

    @triton.jit
    def rmsnorm_kernel(x_ptr, w_ptr, out_ptr, n_cols, eps, BLOCK: tl.constexpr):
        # One program per row: read the row once, reduce, scale, write once.
        row = tl.program_id(axis=0)
        cols = tl.arange(0, BLOCK)
        mask = cols < n_cols
        x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
        mean_sq = tl.sum(x * x, axis=0) / n_cols
        y = x * (1.0 / tl.sqrt(mean_sq + eps))
        w = tl.load(w_ptr + cols, mask=mask, other=0.0)
        out = w * y.to(w.dtype)
        tl.store(out_ptr + row * n_cols + cols, out, mask=mask)

    return triton, add_kernel, rmsnorm_kernel


def add(x, y, block: int = 1024, num_warps: int = 4):
    """x + y with our Triton kernel: a grid of ceil(n / block) programs of `num_warps` warps."""
    import torch

    triton, add_kernel, _ = _kernels()
    assert x.shape == y.shape and x.is_contiguous() and y.is_contiguous()
    out = torch.empty_like(x)
    n = x.numel()
    add_kernel[(triton.cdiv(n, block),)](x, y, out, n, BLOCK=block, num_warps=num_warps)
    return out


def add_grid(n: int, block: int = 1024) -> int:
    """Programs (thread blocks) our add launches for n elements."""
    return -(-n // block)


def rmsnorm(x, weight, eps: float = 1e-6):
    """Qwen3's RMSNorm (float32 statistics, weight applied in the input dtype) as one kernel."""
    import torch

    triton, _, rmsnorm_kernel = _kernels()
    n_cols = x.shape[-1]
    x2 = x.reshape(-1, n_cols).contiguous()
    out = torch.empty_like(x2)
    block = triton.next_power_of_2(n_cols)
    rmsnorm_kernel[(x2.shape[0],)](x2, weight, out, n_cols, eps, BLOCK=block, num_warps=8)
    return out.reshape(x.shape)
