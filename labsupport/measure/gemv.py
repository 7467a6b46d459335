"""A matrix-vector product of our own, in Triton: the kernel a batch-1 decode step needs.

At batch 1 every matmul of a decode step is a GEMV: y = W x, W of N rows by K columns read
once, x a single vector. The work is reading W; a good GEMV keeps enough bytes in flight on
every SM to stream W at the memory's speed, whatever its shape. Each program (thread block)
owns BLOCK_N consecutive rows and walks along K in BLOCK_K chunks, accumulating in float32.

Three optional fusions, so that one kernel does what would otherwise be three:
- `norm`: x is first scaled by RMSNorm (each program recomputes the row's statistic from x,
  which is small and sits in L2), so the norm kernel before the matmul goes away;
- `silu_mul`: x is [gate | up], 2K long, and the kernel reads silu(gate) * up, so the
  activation kernel between gate/up and down goes away;
- `residual`: the output is residual + W x (the residual add after o_proj and down_proj).

`tune()` times a list of block shapes on the GPU and keeps the fastest per weight shape.
Triton has its own autotuner (`triton.autotune`), but it keeps only the winner; the book
records every candidate's time, so the choice can be shown and checked.

Triton is imported on first use; on a CPU set TRITON_INTERPRET=1 first (no bfloat16 there).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from functools import cache


@dataclass(frozen=True)
class Config:
    """A block shape of the GEMV kernel and how many warps and pipeline stages run it."""

    block_n: int
    block_k: int
    num_warps: int
    num_stages: int


DEFAULT = Config(block_n=4, block_k=1024, num_warps=4, num_stages=3)
# The candidates tune() times: few rows per program (many programs, so every SM gets several),
# long enough K chunks to issue wide loads, accumulator tiles of 4-8 K elements.
CANDIDATES = [
    Config(bn, bk, w, s)
    for bn, bk in [(2, 2048), (4, 1024), (4, 2048), (8, 512), (8, 1024), (16, 512)]
    for w in (4, 8)
    for s in (2, 4)
]
# The chosen config for each weight shape (N, K), filled by tune(); DEFAULT otherwise.
CHOSEN: dict[tuple[int, int], Config] = {}


@cache
def _kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def gemv_kernel(
        x_ptr, w_ptr, y_ptr, norm_w_ptr, res_ptr, N, K, eps,
        NORM: tl.constexpr, SILU_MUL: tl.constexpr, RESIDUAL: tl.constexpr,
        BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    ):  # fmt: skip
        rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        row_ok = rows < N
        scale = 1.0
        if NORM:  # RMSNorm's statistic of x, recomputed by every program (x is small, in L2)
            sq = tl.zeros((BLOCK_K,), tl.float32)
            for k in range(0, K, BLOCK_K):
                cols = k + tl.arange(0, BLOCK_K)
                xs = tl.load(x_ptr + cols, mask=cols < K, other=0.0).to(tl.float32)
                sq += xs * xs
            scale = 1.0 / tl.sqrt(tl.sum(sq, axis=0) / K + eps)
        acc = tl.zeros((BLOCK_N, BLOCK_K), tl.float32)
        for k in range(0, K, BLOCK_K):
            cols = k + tl.arange(0, BLOCK_K)
            col_ok = cols < K
            if SILU_MUL:  # x is [gate | up]: read silu(gate) * up
                g = tl.load(x_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
                u = tl.load(x_ptr + K + cols, mask=col_ok, other=0.0)
                xv = ((g / (1.0 + tl.exp(-g))).to(u.dtype) * u).to(tl.float32)
            else:
                xv = tl.load(x_ptr + cols, mask=col_ok, other=0.0)
                if NORM:  # as Qwen3's RMSNorm: normalise in float32, round, then scale by the weight
                    nw = tl.load(norm_w_ptr + cols, mask=col_ok, other=0.0)
                    xv = (xv.to(tl.float32) * scale).to(nw.dtype) * nw
                xv = xv.to(tl.float32)
            w = tl.load(w_ptr + rows[:, None] * K + cols[None, :], mask=row_ok[:, None] & col_ok[None, :], other=0.0)
            acc += w.to(tl.float32) * xv[None, :]
        y = tl.sum(acc, axis=1)
        if RESIDUAL:
            r = tl.load(res_ptr + rows, mask=row_ok, other=0.0)
            y = (y.to(r.dtype) + r).to(tl.float32)  # the product rounded first, as in `x + linear(...)`
        tl.store(y_ptr + rows, y.to(y_ptr.dtype.element_ty), mask=row_ok)

    return triton, gemv_kernel


def launch(x, w, out, *, norm_weight=None, eps: float = 1e-6, silu_mul: bool = False, residual=None, config=None):
    """Run the kernel: out[N] = W[N, K] @ f(x), f per the fusions (module docstring)."""
    triton, kernel = _kernel()
    n, k = w.shape
    c = config or CHOSEN.get((n, k), DEFAULT)
    kernel[(triton.cdiv(n, c.block_n),)](
        x, w, out,
        norm_weight if norm_weight is not None else w, residual if residual is not None else out,
        n, k, eps,
        NORM=norm_weight is not None, SILU_MUL=silu_mul, RESIDUAL=residual is not None,
        BLOCK_N=c.block_n, BLOCK_K=c.block_k, num_warps=c.num_warps, num_stages=c.num_stages,
    )  # fmt: skip
    return out


def gemv(x, w, *, norm_weight=None, eps: float = 1e-6, silu_mul: bool = False, residual=None, config=None):
    """W @ f(x) for one vector x (any leading dimensions of size 1): torch.nn.functional.linear's
    shape convention, W of shape [N, K]."""
    import math

    import torch

    n = w.shape[0]
    lead = x.shape[:-1]
    if math.prod(lead) != 1:
        raise ValueError(f"gemv takes one vector (batch 1), got input of shape {tuple(x.shape)}")
    out = torch.empty(n, device=x.device, dtype=w.dtype)
    res = residual.reshape(n) if residual is not None else None
    launch(x.reshape(-1), w, out, norm_weight=norm_weight, eps=eps, silu_mul=silu_mul, residual=res, config=config)
    return out.reshape(*lead, n)


def time_per_call_us(matmul, n: int, k: int, dtype=None, repeats: int = 20) -> float:
    """Microseconds per call of `matmul(x, w, out)` on a weight of shape (N, K), as the kernels
    run inside a decode step's CUDA graph: many calls captured in one graph and replayed (no
    launch gaps from Python), each on a different copy of the weight so that none is read from
    L2 (the copies together are several times the L2 cache)."""
    import torch

    from labsupport.measure import hardware

    dtype = dtype or torch.bfloat16
    nbytes = n * k * torch.finfo(dtype).bits // 8
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    copies = max(2, -(-4 * l2 // nbytes))
    ws = [torch.randn(n, k, device="cuda", dtype=dtype) for _ in range(copies)]
    x = torch.randn(1, k, device="cuda", dtype=dtype)
    out = torch.empty(1, n, device="cuda", dtype=dtype)
    calls = max(32, copies)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for i in range(calls):  # compiles a Triton kernel on first use, outside the capture
            matmul(x, ws[i % copies], out)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(calls):
            matmul(x, ws[i % copies], out)
    ms = sorted(hardware.time_cuda_ms(graph.replay, repeats=repeats))
    del graph, ws
    return ms[len(ms) // 2] * 1e3 / calls


@dataclass
class Trial:
    """One candidate config timed on one weight shape."""

    n: int
    k: int
    config: Config
    us: float  # per call, time_per_call_us
    tbs: float  # weight bytes read per second, TB/s
    chosen: bool = False

    def as_row(self) -> dict:
        return {"n": self.n, "k": self.k, **asdict(self.config), "us": self.us, "tbs": self.tbs, "chosen": self.chosen}


def tune(shapes, candidates=CANDIDATES, progress=print) -> list[Trial]:
    """Time every candidate config on each weight shape (N, K) (time_per_call_us), keep the
    fastest in CHOSEN, and return every trial."""
    trials = []
    for n, k in shapes:
        mine = []
        for c in candidates:
            us = time_per_call_us(lambda x, w, out, c=c: launch(x.reshape(-1), w, out.reshape(-1), config=c), n, k)
            mine.append(Trial(n, k, c, us, n * k * 2 / us / 1e6))
        best = min(mine, key=lambda t: t.us)
        best.chosen = True
        CHOSEN[(n, k)] = best.config
        progress(f"  GEMV {n}x{k}: {best.us:.1f} us, {best.tbs:.2f} TB/s with {best.config}")
        trials.extend(mine)
    return trials
