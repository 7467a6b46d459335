"""A matrix-vector product of our own, in Triton: the kernel a batch-1 decode step needs.

At batch 1 every matmul of a decode step is a GEMV: y = W x, W of N rows by K columns read
once, x a single vector. The work is reading W; a good GEMV keeps enough bytes in flight on
every SM to stream W at the memory's speed, whatever its shape. Each program (thread block)
owns BLOCK_N consecutive rows and walks along K in BLOCK_K chunks, accumulating in float32.

Three optional fusions (`Fusion`), so that one kernel does what would otherwise be two or three:
- `norm`: x goes through RMSNorm first, so the norm kernel before the matmul goes away. Its
  scale is one number for the whole vector, so it factors out of the product: each program
  sums x's squares while it reads x for the product and applies the scale at the end, reading
  x once. (The model as written rounds the normalised x to BF16 before the norm's weight;
  here it stays in float32, which is closer to the exact result.)
- `silu`: the weight's rows come in (gate, up) pairs, interleaved, and the kernel writes
  silu(gate) * up, one value per pair, so the activation kernel after gate/up goes away;
- `residual`: the output is residual + W x (the residual add after o_proj and down_proj).

`tune()` times a list of block shapes on the GPU and keeps the fastest per weight shape and
fusion. Triton has its own autotuner (`triton.autotune`), but it keeps only the winner; the
book records every candidate's time, so the choice can be shown and checked.

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


@dataclass(frozen=True)
class Fusion:
    """What the kernel does besides W x (module docstring)."""

    norm: bool = False
    silu: bool = False
    residual: bool = False

    @property
    def label(self) -> str:
        return "+".join(n for n in ("norm", "silu", "residual") if getattr(self, n)) or "plain"


PLAIN = Fusion()
DEFAULT = Config(block_n=4, block_k=1024, num_warps=4, num_stages=3)
# The candidates tune() times: a few rows per program (many programs, so that every SM gets
# several), K chunks long enough for wide loads, accumulator tiles of 2-8 K elements per warp.
# (A first run on the H200 found two or four pipeline stages equally fast: two are kept.)
CANDIDATES = [
    Config(bn, bk, w, 2)
    for bn, bk, w in [
        (1, 4096, 8), (2, 2048, 8), (2, 4096, 8), (2, 4096, 16), (4, 1024, 8),
        (4, 2048, 8), (8, 512, 4), (8, 1024, 8), (16, 512, 4), (16, 512, 8),
    ]
]  # fmt: skip
# The chosen config for each weight shape and fusion (N, K, Fusion), filled by tune().
CHOSEN: dict[tuple[int, int, Fusion], Config] = {}


@cache
def _kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def gemv_kernel(
        x_ptr, w_ptr, y_ptr, norm_w_ptr, res_ptr, N, K, eps,
        NORM: tl.constexpr, SILU: tl.constexpr, RESIDUAL: tl.constexpr,
        BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    ):  # fmt: skip
        rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        row_ok = rows < N
        acc = tl.zeros((BLOCK_N, BLOCK_K), tl.float32)
        sq = tl.zeros((BLOCK_K,), tl.float32)
        for k in range(0, K, BLOCK_K):
            cols = k + tl.arange(0, BLOCK_K)
            col_ok = cols < K
            xv = tl.load(x_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
            if NORM:  # the sum of squares on the way; the norm's weight now, its scale at the end
                sq += xv * xv
                xv = xv * tl.load(norm_w_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
            w = tl.load(w_ptr + rows[:, None] * K + cols[None, :], mask=row_ok[:, None] & col_ok[None, :], other=0.0)
            acc += w.to(tl.float32) * xv[None, :]
        y = tl.sum(acc, axis=1)
        if NORM:
            y = y / tl.sqrt(tl.sum(sq, axis=0) / K + eps)
        y = y.to(y_ptr.dtype.element_ty)  # rounded, as a matmul's output is
        if SILU:  # rows 2i and 2i+1 are gate_i and up_i: write silu(gate_i) * up_i at i
            gate, up = tl.split(tl.reshape(y, (BLOCK_N // 2, 2)))
            g = gate.to(tl.float32)
            act = (g / (1.0 + tl.exp(-g))).to(up.dtype)
            out_rows = tl.program_id(0) * (BLOCK_N // 2) + tl.arange(0, BLOCK_N // 2)
            tl.store(y_ptr + out_rows, act * up, mask=out_rows < N // 2)
        else:
            if RESIDUAL:
                y = y + tl.load(res_ptr + rows, mask=row_ok, other=0.0)
            tl.store(y_ptr + rows, y, mask=row_ok)

    return triton, gemv_kernel


def launch(x, w, out, *, norm_weight=None, eps: float = 1e-6, silu: bool = False, residual=None, config=None):
    """Run the kernel: out = W @ f(x) (+ residual), or silu(gate) * up of its row pairs."""
    triton, kernel = _kernel()
    n, k = w.shape
    fusion = Fusion(norm_weight is not None, silu, residual is not None)
    c = config or CHOSEN.get((n, k, fusion)) or CHOSEN.get((n, k, PLAIN), DEFAULT)
    kernel[(triton.cdiv(n, c.block_n),)](
        x, w, out,
        norm_weight if norm_weight is not None else w, residual if residual is not None else out,
        n, k, eps,
        NORM=fusion.norm, SILU=silu, RESIDUAL=fusion.residual,
        BLOCK_N=c.block_n, BLOCK_K=c.block_k, num_warps=c.num_warps, num_stages=c.num_stages,
    )  # fmt: skip
    return out


def gemv(x, w, *, norm_weight=None, eps: float = 1e-6, silu: bool = False, residual=None, config=None):
    """W @ f(x) for one vector x (any leading dimensions of size 1), in F.linear's convention
    (W of shape [N, K]); with `silu`, N/2 outputs (module docstring)."""
    import math

    import torch

    n = w.shape[0] // 2 if silu else w.shape[0]
    lead = x.shape[:-1]
    if math.prod(lead) != 1:
        raise ValueError(f"gemv takes one vector (batch 1), got input of shape {tuple(x.shape)}")
    out = torch.empty(n, device=x.device, dtype=w.dtype)
    res = residual.reshape(n) if residual is not None else None
    launch(x.reshape(-1), w, out, norm_weight=norm_weight, eps=eps, silu=silu, residual=res, config=config)
    return out.reshape(*lead, n)


def interleave(gate, up):
    """The gate and up weights as one matrix whose rows alternate gate_i, up_i (for `silu`)."""
    import torch

    return torch.stack((gate, up), dim=1).reshape(-1, gate.shape[1]).contiguous()


def time_per_call_us(n: int, k: int, call, repeats: int = 20) -> float:
    """Microseconds per call of `call(x, w)` (which writes its own output) on a BF16 weight of
    shape (N, K), as the kernels run inside a decode step's CUDA graph: many calls captured in
    one graph and replayed (no launch gaps from Python), each on a different copy of the weight
    so that none is read from L2 (the copies together are several times the L2 cache)."""
    import torch

    from labsupport.measure import hardware

    nbytes = n * k * 2
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    copies = max(2, -(-4 * l2 // nbytes))
    ws = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) for _ in range(copies)]
    x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
    calls = max(32, copies)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for i in range(calls):  # compiles a Triton kernel on first use, outside the capture
            call(x, ws[i % copies])
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(calls):
            call(x, ws[i % copies])
    ms = sorted(hardware.time_cuda_ms(graph.replay, repeats=repeats))
    del graph, ws
    return ms[len(ms) // 2] * 1e3 / calls


def fused_call(n: int, k: int, fusion: Fusion, config: Config | None = None):
    """A call(x, w) for time_per_call_us running the kernel with `fusion` (its norm weight,
    residual and output made here, once)."""
    import torch

    out = torch.empty(n // 2 if fusion.silu else n, device="cuda", dtype=torch.bfloat16)
    norm = torch.ones(k, device="cuda", dtype=torch.bfloat16) if fusion.norm else None
    res = torch.randn(n, device="cuda", dtype=torch.bfloat16) if fusion.residual else None

    def call(x, w):
        launch(x.reshape(-1), w, out, norm_weight=norm, silu=fusion.silu, residual=res, config=config)

    return call


@dataclass
class Trial:
    """One candidate config timed on one weight shape and fusion."""

    n: int
    k: int
    fusion: Fusion
    config: Config
    us: float  # per call, time_per_call_us
    tbs: float  # weight bytes read per second, TB/s (BF16 weights)
    chosen: bool = False

    def as_row(self) -> dict:
        return {"n": self.n, "k": self.k, "fusion": self.fusion.label, **asdict(self.config), "us": self.us,
                "tbs": self.tbs, "chosen": self.chosen}  # fmt: skip


def tune(cases, candidates=CANDIDATES, progress=print) -> list[Trial]:
    """Time every candidate config on each case (N, K, Fusion) (time_per_call_us), keep the
    fastest in CHOSEN, and return every trial."""
    trials = []
    for n, k, fusion in cases:
        mine = []
        for c in candidates:
            if fusion.silu and c.block_n < 2:
                continue
            us = time_per_call_us(n, k, fused_call(n, k, fusion, c))
            mine.append(Trial(n, k, fusion, c, us, n * k * 2 / us / 1e6))
        best = min(mine, key=lambda t: t.us)
        best.chosen = True
        CHOSEN[(n, k, fusion)] = best.config
        progress(f"  GEMV {n}x{k} {fusion.label}: {best.us:.1f} us, {best.tbs:.2f} TB/s with {best.config}")
        trials.extend(mine)
    return trials
