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

Four launch options, for the last rungs:
- FP8 weights (`scale`): W as float8 E4M3, one float32 scale per row (gemv_fp8) applied to the row's
  sum, x in BF16. A thread sums its 16 contiguous weights' products at once (FP8_CHUNK): a whole tile's
  float32 accumulator (4 bytes a weight) took 132 registers at 16 x 512, leaving fewer bytes in flight.
  Tiles of 32 weights a thread are also tried with that accumulator (`Config.chunk` = 1): a weight then
  costs one fused multiply-add, not a multiply or add and a share of the sum of 16. In the loop's sm_90
  code from Triton 3.9 (its instructions counted) that is 2.5 instructions a weight against 3, 1.5 of them
  the E4M3 -> half -> float32 conversion; an FP8 GEMV has a weight per byte it reads, BF16 half of one;
- split-K (`Config.split_k` > 1): each row's K is cut into split_k stretches, one program per
  (rows, stretch), each adding its partial sum into a float32 buffer with atomics; a second
  small kernel (`_finish`) applies the norm's scale, the rounding, SiLU x up or the residual,
  and zeroes the buffer again for the next call. More programs for the small matrices;
- programmatic dependent launch (`pdl`): the kernel is launched so that it may start while the
  kernel before it drains (Hopper and later); it waits (`gdc_wait`) before reading anything,
  then lets the kernel after it be launched (`gdc_launch_dependents`);
- weights first (`early`): each program issues the load of its first tile of W before that wait
  (its first two where they fit in registers: early_tiles). The weights depend on no kernel of the
  step, only x does, so with `pdl` the first stretch of W streams in while the kernel before is
  still finishing, instead of after it;
- persistent (`Config.ctas_per_sm` > 0): a few programs per SM, each walking many blocks of
  rows with the same K loop and epilogue (labsupport.measure.kernels.persistent_gemv, which says why).

Three epilogues for the folded-norms rung (labsupport.measure.kernels.folded_norms, which says why):
- `sumsq_in`: the norm's weight is folded into W and Σx² was summed by the kernel that wrote x;
  the kernel loads its partial sums (folded_norms.SLOTS of them) right after the wait (their
  latency hidden behind the loop over W) and scales its rows by their sum at the end, with the
  plain (or SiLU) GEMV's tiling;
- `sumsq_out`: the kernel adds the Σ of the squares of what it writes into a row of partial sums
  (one atomic add per program, into its slot) and zeroes the row of the use before;
- `argmax`: the LM head's programs combine their largest logit and its row into one packed word
  (one 64-bit atomic min each), whose low 32 bits are then the token.

`tune()` times a list of block shapes on the GPU and keeps the fastest per weight shape and
fusion. Triton has its own autotuner (`triton.autotune`), but it keeps only the winner; the
book records every candidate's time, so the choice can be shown and checked.

Triton is imported on first use; on a CPU set TRITON_INTERPRET=1 first (no bfloat16 there).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from functools import cache
from types import SimpleNamespace

from labsupport.measure import hardware
from labsupport.measure.kernels import folded_norms, persistent_gemv
from labsupport.measure.kernels.weight_timing import time_per_call_us


@dataclass(frozen=True)
class Config:
    """A block shape of the GEMV kernel and how many warps and pipeline stages run it."""

    block_n: int
    block_k: int
    num_warps: int
    num_stages: int
    split_k: int = 1  # programs along K per block of rows (module docstring)
    ctas_per_sm: int = 0  # > 0: the persistent form, this many programs per SM walking the row blocks
    chunk: int = 0  # FP8 weights a thread sums before its accumulator (0: FP8_CHUNK; 1: one accumulator each)

    def __post_init__(self):
        if self.ctas_per_sm > 0 and self.split_k > 1:
            raise ValueError(f"a persistent GEMV (ctas_per_sm={self.ctas_per_sm}) takes no split-K, got {self}")


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
# (4, 1024, 4): 4 warps where the others of its size have 8; what the folded-norms step tries on every GEMV.
CANDIDATES = [
    Config(bn, bk, w, 2)
    for bn, bk, w in [
        (1, 4096, 8), (2, 2048, 8), (2, 4096, 8), (2, 4096, 16), (4, 1024, 8),
        (4, 2048, 8), (8, 512, 4), (8, 1024, 8), (16, 512, 4), (16, 512, 8), (4, 1024, 4),
    ]
]  # fmt: skip
# Split-K candidates, tried on the smaller matrices only (at most SPLIT_MAX_ELEMENTS weights), whose
# few thousand rows leave each program little work. (A first trial on the H200 found split-K slower
# on every shape, by 3-4 us on o_proj; the two least slow are kept, so that the tuner decides.)
SPLIT_CANDIDATES = [Config(4, 512, 4, 2, 4), Config(2, 1024, 4, 2, 4)]
SPLIT_MAX_ELEMENTS = 32 * 2**20
# FP8 candidates: tiles of 4,096 to 32,768 weights, 16 contiguous a thread or more (one 16-byte load); and the
# tiles of 32 weights a thread with an accumulator each (chunk 1: 32 float32 registers)
FP8_TILES = [(8, 1024, 4), (16, 512, 4), (16, 1024, 4), (32, 512, 8), (8, 512, 4), (4, 1024, 4), (32, 1024, 8)]
FP8_CANDIDATES = [Config(bn, bk, w, 2) for bn, bk, w in [*FP8_TILES, (2, 2048, 8)]] + [
    Config(bn, bk, w, 2, chunk=1) for bn, bk, w in [(8, 512, 4), (4, 1024, 4), (8, 1024, 8), (16, 512, 8)]
]
FP8_CHUNK = 16  # FP8 weights a thread sums at once (module docstring); BF16 weights sum the whole tile
# The persistent candidates (the persistent rung's): two programs per SM, each loading long stretches
# of a few rows three stages deep. (Closing-the-gap 20261206T004616Z-h100-80gb-hbm3: one per SM was
# slowest everywhere; in 20261206T041852Z four per SM, kept by under 1% alone, lost 0.19 ms in the step.)
PERSISTENT_CANDIDATES = [Config(*tile, 3, ctas_per_sm=2) for tile in [(2, 2048, 8), (4, 2048, 8), (2, 4096, 8)]]
PERSISTENT_DEFAULT = Config(4, 2048, 8, 3, ctas_per_sm=2)
# The chosen config for each weight shape and fusion (N, K, Fusion), filled by tune(): without
# split-K (CHOSEN), best of all (CHOSEN_SPLIT, the split-K rung's), timed with PDL and W's first tiles
# before the wait (CHOSEN_EARLY, the rungs launched so), FP8 weights (CHOSEN_FP8), persistent
# (CHOSEN_PERSISTENT, the persistent rung's); and the folded-norms step's own, where that step was timed
# whole with other configs (CHOSEN_FOLDED, closing-the-gap's settle_folded_tilings; else CHOSEN_EARLY's).
CHOSEN: dict[tuple[int, int, Fusion], Config] = {}
CHOSEN_EARLY: dict[tuple[int, int, Fusion], Config] = {}
CHOSEN_SPLIT: dict[tuple[int, int, Fusion], Config] = {}
CHOSEN_FP8: dict[tuple[int, int, Fusion], Config] = {}
CHOSEN_PERSISTENT: dict[tuple[int, int, Fusion], Config] = {}
CHOSEN_FOLDED: dict[tuple[int, int, Fusion], Config] = {}


@cache
def _kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def accumulate(acc, sq, w, x_ptr, norm_w_ptr, cols, col_ok, NORM: tl.constexpr, CHUNK: tl.constexpr = 1):
        # one BLOCK_K stretch of the product: x's (normed on the way) times W's tile, CHUNK columns summed first
        xv = tl.load(x_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
        if NORM:  # the sum of squares on the way; the norm's weight now, its scale at the end
            sq += xv * xv
            xv = xv * tl.load(norm_w_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
        prod = w.to(tl.float32) * xv[None, :]
        if CHUNK > 1:
            prod = tl.sum(tl.reshape(prod, (prod.shape[0], prod.shape[1] // CHUNK, CHUNK)), axis=2)
        acc += prod
        return acc, sq

    @triton.jit
    def write_rows(
        y, tile, rows, row_ok, y_ptr, res_ptr, sumsq_out_ptr, sumsq_clear_ptr, N,
        BLOCK: tl.constexpr, SILU: tl.constexpr, RESIDUAL: tl.constexpr, SUMSQ_OUT: tl.constexpr,
    ):  # fmt: skip
        # the epilogue of every kernel here, on block `tile` of rows: rows 2i and 2i+1 are gate_i and up_i with SILU
        # (silu(gate_i) * up_i written at i), else the rows plus the residual; with SUMSQ_OUT the squares of what
        # is written summed
        if SILU:
            gate, up = tl.split(tl.reshape(y, (BLOCK // 2, 2)))
            g = gate.to(tl.float32)
            act = (g / (1.0 + tl.exp(-g))).to(up.dtype)
            out_rows = tile * (BLOCK // 2) + tl.arange(0, BLOCK // 2)
            tl.store(y_ptr + out_rows, act * up, mask=out_rows < N // 2)
            if SUMSQ_OUT:
                sumsq_epilogue(act * up, out_rows < N // 2, sumsq_out_ptr, sumsq_clear_ptr)  # noqa: F821 (a global)
        else:
            if RESIDUAL:
                y = y + tl.load(res_ptr + rows, mask=row_ok, other=0.0)
            tl.store(y_ptr + rows, y, mask=row_ok)
            if SUMSQ_OUT:
                sumsq_epilogue(y, row_ok, sumsq_out_ptr, sumsq_clear_ptr)  # noqa: F821 (a global)

    @triton.jit
    def after_wait(sumsq_in_ptr, PDL: tl.constexpr, SUMSQ_IN: tl.constexpr):
        # with PDL, wait for the kernel before (its writes visible), then let the next one launch; then the
        # Σx² it wrote (SUMSQ_IN), its partial sums loaded once here, used at the end
        if PDL:
            tl.extra.cuda.gdc_wait()
            tl.extra.cuda.gdc_launch_dependents()
        sumsq = 0.0
        if SUMSQ_IN:
            sumsq = read_sumsq(sumsq_in_ptr)  # noqa: F821 (a global)
        return sumsq

    # Triton resolves the functions a kernel calls among its module's globals, not a closure's.
    globals().update(accumulate=accumulate, write_rows=write_rows, after_wait=after_wait)
    fns = folded_norms.jit_functions()
    globals().update(sumsq_epilogue=fns.sumsq_epilogue, argmax_epilogue=fns.argmax_epilogue, read_sumsq=fns.read_sumsq)

    @triton.jit
    def stream_rows(
        acc, sq, rows, row_ok, start, hi, x_ptr, w_ptr, norm_w_ptr, K,
        BLOCK_K: tl.constexpr, NORM: tl.constexpr, STAGES: tl.constexpr, CHUNK: tl.constexpr = 1,
    ):  # fmt: skip
        # W's rows from column `start` to `hi`, BLOCK_K at a time, into acc (x's squares into sq with NORM);
        # STAGES: the compiler pipelines this loop's loads that deep (None: the kernel's num_stages decides)
        for k in tl.range(start, hi, BLOCK_K, num_stages=STAGES):
            cols = k + tl.arange(0, BLOCK_K)
            col_ok = cols < K
            w = tl.load(w_ptr + rows[:, None] * K + cols[None, :], mask=row_ok[:, None] & col_ok[None, :], other=0.0)
            acc, sq = accumulate(acc, sq, w, x_ptr, norm_w_ptr, cols, col_ok, NORM, CHUNK)
        return acc, sq

    @triton.jit
    def finish_rows(
        acc, sq, sumsq, tile, rows, row_ok, y_ptr, res_ptr, scale_ptr, ws_ptr, sumsq_out_ptr, sumsq_clear_ptr,
        argmax_ptr, N, K, eps,
        NORM: tl.constexpr, SILU: tl.constexpr, RESIDUAL: tl.constexpr, BLOCK_N: tl.constexpr, SCALE: tl.constexpr,
        SPLIT_K: tl.constexpr, SUMSQ_IN: tl.constexpr, SUMSQ_OUT: tl.constexpr, ARGMAX: tl.constexpr,
    ):  # fmt: skip
        # the epilogue of row block `tile`: its rows' sums, scaled, rounded and written (module docstring)
        y = tl.sum(acc, axis=1)
        if SCALE:  # FP8 weights: each row's scale
            y = y * tl.load(scale_ptr + rows, mask=row_ok, other=0.0).to(tl.float32)
        if SPLIT_K > 1:  # a partial sum: _finish does the rest
            tl.atomic_add(ws_ptr + rows, y, mask=row_ok)
        else:
            if NORM:
                y = y / tl.sqrt(tl.sum(sq, axis=0) / K + eps)
            if SUMSQ_IN:
                y = y / tl.sqrt(sumsq / K + eps)
            y = y.to(y_ptr.dtype.element_ty)  # rounded, as a matmul's output is
            write_rows(
                y, tile, rows, row_ok, y_ptr, res_ptr, sumsq_out_ptr, sumsq_clear_ptr, N, BLOCK_N, SILU, RESIDUAL,
                SUMSQ_OUT,
            )  # fmt: skip
            if ARGMAX:  # the LM head: no SiLU, no residual (launch refuses them), so y is what was written
                argmax_epilogue(y, rows, row_ok, argmax_ptr)  # noqa: F821 (a global)

    # Triton's interpreter looks for triton.language among a called function's module globals (a
    # kernel's launch puts it there; the persistent kernel, in another module, calls these first).
    globals().update(stream_rows=stream_rows, finish_rows=finish_rows, tl=tl)

    @triton.jit
    def gemv_kernel(
        x_ptr, w_ptr, y_ptr, norm_w_ptr, res_ptr, scale_ptr, ws_ptr, sumsq_in_ptr, sumsq_out_ptr, sumsq_clear_ptr,
        argmax_ptr, N, K, eps,
        NORM: tl.constexpr, SILU: tl.constexpr, RESIDUAL: tl.constexpr,
        BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
        SCALE: tl.constexpr = False, SPLIT_K: tl.constexpr = 1, PDL: tl.constexpr = False,
        EARLY: tl.constexpr = False, SUMSQ_IN: tl.constexpr = False, SUMSQ_OUT: tl.constexpr = False,
        ARGMAX: tl.constexpr = False, EARLY_TILES: tl.constexpr = 1, CHUNK: tl.constexpr = 1,
    ):  # fmt: skip
        rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        row_ok = rows < N
        acc = tl.zeros((BLOCK_N, BLOCK_K // CHUNK), tl.float32)
        sq = tl.zeros((BLOCK_K,), tl.float32)
        lo, hi = 0, K
        if SPLIT_K > 1:  # this program's stretch of K
            chunk = tl.cdiv(tl.cdiv(K, BLOCK_K), SPLIT_K) * BLOCK_K
            lo = tl.program_id(1) * chunk
            hi = lo + chunk
        start = lo
        if EARLY:  # W's first tile depends on no kernel of the step: its load is issued before the wait
            first_cols = lo + tl.arange(0, BLOCK_K)
            first_ok = first_cols < K
            w_first = tl.load(
                w_ptr + rows[:, None] * K + first_cols[None, :], mask=row_ok[:, None] & first_ok[None, :], other=0.0
            )
            if EARLY_TILES > 1:  # and the second, so that the two are in flight together, as the loop has them
                next_cols = first_cols + BLOCK_K
                next_ok = (next_cols < K) & (next_cols < hi)
                w_next = tl.load(
                    w_ptr + rows[:, None] * K + next_cols[None, :], mask=row_ok[:, None] & next_ok[None, :], other=0.0
                )
        sumsq = after_wait(sumsq_in_ptr, PDL, SUMSQ_IN)
        if EARLY:
            acc, sq = accumulate(acc, sq, w_first, x_ptr, norm_w_ptr, first_cols, first_ok, NORM, CHUNK)
            start = lo + BLOCK_K
            if EARLY_TILES > 1:
                acc, sq = accumulate(acc, sq, w_next, x_ptr, norm_w_ptr, next_cols, next_ok, NORM, CHUNK)
                start = lo + 2 * BLOCK_K
        acc, sq = stream_rows(acc, sq, rows, row_ok, start, hi, x_ptr, w_ptr, norm_w_ptr, K, BLOCK_K, NORM, None, CHUNK)
        finish_rows(
            acc, sq, sumsq, tl.program_id(0), rows, row_ok, y_ptr, res_ptr, scale_ptr, ws_ptr, sumsq_out_ptr,
            sumsq_clear_ptr, argmax_ptr, N, K, eps, NORM, SILU, RESIDUAL, BLOCK_N, SCALE, SPLIT_K, SUMSQ_IN,
            SUMSQ_OUT, ARGMAX,
        )  # fmt: skip

    persistent = persistent_gemv.kernel(accumulate, stream_rows, finish_rows, after_wait)
    return SimpleNamespace(triton=triton, plain=gemv_kernel, persistent=persistent.kernel,
                           first_chunk=persistent.first_chunk, walk_blocks=persistent.walk_blocks)  # fmt: skip


def jit_kernels():
    """The GEMV's Triton kernels and the pieces of the persistent one (first_chunk, walk_blocks), which
    the layer kernel (labsupport.measure.kernels.megakernel) runs too; built on first use."""
    return _kernel()


@cache
def _finish():
    """The second kernel of a split-K GEMV: reads the summed rows from the float32 buffer and
    zeroes it, applies the norm's scale (its sum of squares over the whole x, or the Σx² of
    `sumsq_in`'s partial sums), rounds, and writes silu(gate) * up or adds the residual (and sums the squares of
    what it writes: `sumsq_out`), as the one-kernel GEMV's epilogue does."""
    import triton
    import triton.language as tl

    _kernel()  # write_rows, among this module's globals

    @triton.jit
    def finish_kernel(
        ws_ptr, x_ptr, y_ptr, res_ptr, sumsq_in_ptr, sumsq_out_ptr, sumsq_clear_ptr, N, K, eps,
        NORM: tl.constexpr, SILU: tl.constexpr, RESIDUAL: tl.constexpr, PDL: tl.constexpr,
        BLOCK: tl.constexpr, BLOCK_K: tl.constexpr, SUMSQ_IN: tl.constexpr = False, SUMSQ_OUT: tl.constexpr = False,
    ):  # fmt: skip
        if PDL:
            tl.extra.cuda.gdc_wait()
            tl.extra.cuda.gdc_launch_dependents()
        rows = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        row_ok = rows < N
        y = tl.load(ws_ptr + rows, mask=row_ok, other=0.0)
        tl.store(ws_ptr + rows, tl.zeros((BLOCK,), tl.float32), mask=row_ok)  # ready for the next call
        if NORM:
            sq = tl.zeros((BLOCK_K,), tl.float32)
            for k in range(0, K, BLOCK_K):
                cols = k + tl.arange(0, BLOCK_K)
                xv = tl.load(x_ptr + cols, mask=cols < K, other=0.0).to(tl.float32)
                sq += xv * xv
            y = y / tl.sqrt(tl.sum(sq, axis=0) / K + eps)
        if SUMSQ_IN:
            y = y / tl.sqrt(read_sumsq(sumsq_in_ptr) / K + eps)  # noqa: F821 (a global)
        y = y.to(y_ptr.dtype.element_ty)
        write_rows(  # noqa: F821 (a global)
            y, tl.program_id(0), rows, row_ok, y_ptr, res_ptr, sumsq_out_ptr, sumsq_clear_ptr, N, BLOCK, SILU, RESIDUAL,
            SUMSQ_OUT,
        )  # fmt: skip

    return finish_kernel


_WORKSPACE: dict = {}


def workspace(n: int, device):
    """The float32 buffer of n rows a split-K GEMV sums into: zeroed once, made on first use (the
    warm-up runs before any CUDA-graph capture), and zeroed again by every _finish."""
    import torch

    key = (n, str(device))
    if key not in _WORKSPACE:
        _WORKSPACE[key] = torch.zeros(n, device=device, dtype=torch.float32)
    return _WORKSPACE[key]


def choose(
    n: int, k: int, fusion: Fusion, fp8: bool = False, split: bool = False, persistent: bool = False,
    early: bool = False, folded: bool = False,
) -> Config:  # fmt: skip
    """The tuned config of a weight shape and fusion: FP8's (folded or not), or the folded-norms step's
    (`folded`, CHOSEN_FOLDED), or as launched with `early` (CHOSEN_EARLY),
    or with split-K allowed (the split-K rung), or the plain one, each falling back to the plain
    shape's and then DEFAULT; `persistent` (the persistent rung): the persistent one, falling back to
    the plain shape's, then PERSISTENT_DEFAULT."""
    tables = [CHOSEN_FP8] if fp8 else [CHOSEN_FOLDED] if folded else []  # (CHOSEN_FOLDED's are BF16 tilings)
    tables += [CHOSEN_EARLY] if early else []
    tables += [CHOSEN_SPLIT] if split else []
    tables.append(CHOSEN)
    if persistent:
        tables = [CHOSEN_PERSISTENT]
    for table in tables:  # (CHOSEN_EARLY may hold a split-K config: only where split-K is allowed)
        c = table.get((n, k, fusion)) or table.get((n, k, PLAIN))
        if c is not None and not (fusion.silu and c.block_n < 2) and (split or c.split_k == 1):
            return c
    return PERSISTENT_DEFAULT if persistent else DEFAULT


EARLY_BYTES = 128  # the bytes of W a thread may hold in the tiles it loads before the wait (32 registers)


def early_tiles(c: Config, fp8: bool = False) -> int:
    """How many tiles of W a program loads before the wait (`early`): two where both fit in
    EARLY_BYTES a thread, so that they are in flight together as the loop's pipeline has them
    (one alone leaves the second's latency after the first's arithmetic), else one."""
    two_tiles = 2 * c.block_n * c.block_k * (1 if fp8 else 2)
    return 2 if two_tiles <= EARLY_BYTES * c.num_warps * 32 else 1


def launch(
    x, w, out, *, norm_weight=None, eps: float = 1e-6, silu: bool = False, residual=None, config=None,
    scale=None, split: bool = False, pdl: bool = False, early: bool = False, sumsq_in=None, sumsq_out=None,
    argmax=None, persistent: bool = False,
):  # fmt: skip
    """Run the kernel: out = W @ f(x) (+ residual), or silu(gate) * up of its row pairs; `scale`:
    W is FP8 with these row scales; `split`: split-K configs allowed; `pdl`: launched with
    programmatic dependent launch; `early`: W's first tile loaded before the wait. Folded norms
    (module docstring): `sumsq_in`, the row of x's Σx² partial sums (W's columns carry the norm's
    weight); `sumsq_out`, (the row to add the output's Σ of squares into, the row to zero), each a
    row of folded_norms.ROW floats;
    `argmax`, the LM head's argmax word (folded_norms.argmax_word), the token put into it;
    `persistent`: the persistent configs (CHOSEN_PERSISTENT), whatever `split` says. A config with
    ctas_per_sm > 0, given or chosen, runs the persistent kernel (persistent_gemv)."""
    kernels = _kernel()
    n, k = w.shape
    fusion = Fusion(norm_weight is not None, silu, residual is not None)
    folded = sumsq_in is not None or sumsq_out is not None  # every GEMV of the folded-norms step reads or adds Σx²
    c = config or choose(
        n, k, fusion, fp8=scale is not None, split=split and argmax is None, persistent=persistent, early=early,
        folded=folded,
    )  # fmt: skip
    if argmax is not None and (silu or residual is not None or c.split_k > 1):
        raise ValueError("argmax is the LM head's epilogue: one kernel per row block (no split-K), no SiLU or residual")
    ws = workspace(n, x.device) if c.split_k > 1 else out
    add_into, zero = sumsq_out if sumsq_out is not None else (out, out)
    one_kernel = c.split_k == 1  # else _finish does the epilogue
    extra = {"launch_pdl": True} if pdl else {}
    blocks = kernels.triton.cdiv(n, c.block_n)
    args = (
        x, w, out,
        norm_weight if norm_weight is not None else w, residual if residual is not None else out,
        scale if scale is not None else out, ws, sumsq_in if sumsq_in is not None else out, add_into, zero,
        argmax if argmax is not None else out,
        n, k, eps,
    )  # fmt: skip
    flags = dict(
        NORM=fusion.norm, SILU=silu, RESIDUAL=fusion.residual, BLOCK_N=c.block_n, BLOCK_K=c.block_k,
        SCALE=scale is not None, PDL=pdl, EARLY=early, SUMSQ_IN=one_kernel and sumsq_in is not None,
        SUMSQ_OUT=one_kernel and sumsq_out is not None, ARGMAX=argmax is not None, num_warps=c.num_warps,
        num_stages=c.num_stages, **extra,
    )  # fmt: skip
    if c.ctas_per_sm > 0:
        grid = persistent_gemv.programs(blocks, c.ctas_per_sm, x.device)
        cap = {"maxnreg": persistent_gemv.max_registers(c)} if x.device.type == "cuda" else {}  # all resident
        kernels.persistent[(grid,)](*args, STAGES=c.num_stages, **flags, **cap)
        return out
    tiles = early_tiles(c, fp8=scale is not None) if early else 1
    chunk = (c.chunk or FP8_CHUNK) if scale is not None else 1
    kernels.plain[(blocks, c.split_k)](*args, SPLIT_K=c.split_k, EARLY_TILES=tiles, CHUNK=chunk, **flags)
    if c.split_k > 1:
        block = 256
        _finish()[(kernels.triton.cdiv(n, block),)](
            ws, x, out, residual if residual is not None else out, sumsq_in if sumsq_in is not None else out,
            add_into, zero, n, k, eps,
            NORM=fusion.norm, SILU=silu, RESIDUAL=fusion.residual, PDL=pdl, BLOCK=block, BLOCK_K=1024,
            SUMSQ_IN=sumsq_in is not None, SUMSQ_OUT=sumsq_out is not None, num_warps=4, **extra,
        )  # fmt: skip
    return out


def gemv(
    x, w, *, norm_weight=None, eps: float = 1e-6, silu: bool = False, residual=None, config=None,
    scale=None, split: bool = False, pdl: bool = False, early: bool = False, sumsq_in=None, sumsq_out=None,
    argmax=None, persistent: bool = False,
):  # fmt: skip
    """W @ f(x) for one vector x (any leading dimensions of size 1), in F.linear's convention
    (W of shape [N, K]); with `silu`, N/2 outputs; `scale`, `split`, `pdl`, `early`, `sumsq_in`,
    `sumsq_out`, `argmax`, `persistent`: launch's."""
    import math

    import torch

    n = w.shape[0] // 2 if silu else w.shape[0]
    lead = x.shape[:-1]
    if math.prod(lead) != 1:
        raise ValueError(f"gemv takes one vector (batch 1), got input of shape {tuple(x.shape)}")
    out = torch.empty(n, device=x.device, dtype=x.dtype if scale is not None else w.dtype)
    res = residual.reshape(n) if residual is not None else None
    launch(
        x.reshape(-1), w, out, norm_weight=norm_weight, eps=eps, silu=silu, residual=res, config=config,
        scale=scale, split=split, pdl=pdl, early=early, sumsq_in=sumsq_in, sumsq_out=sumsq_out, argmax=argmax,
        persistent=persistent,
    )  # fmt: skip
    return out.reshape(*lead, n)


def interleave(gate, up):
    """The gate and up weights as one matrix whose rows alternate gate_i, up_i (for `silu`)."""
    import torch

    return torch.stack((gate, up), dim=1).reshape(-1, gate.shape[1]).contiguous()


def fused_call(
    n: int, k: int, fusion: Fusion, config: Config | None = None, fp8: bool = False, split: bool = False,
    pdl: bool = False, dtype=None, folded: bool = False, early: bool = False,
):  # fmt: skip
    """A call(x, w) for time_per_call_us running the kernel with `fusion` (its norm weight,
    residual, output and, with `fp8`, row scales made here, once), in `dtype` (None: BF16);
    `folded`: as the folded-norms rung runs it (PDL, W's first tiles before the wait, a row of Σx²);
    `early`: PDL and W's first tiles before the wait, as rung 13's options run it (on Hopper and later)."""
    import torch

    half = dtype or torch.bfloat16
    out = torch.empty(n // 2 if fusion.silu else n, device="cuda", dtype=half)
    norm = torch.ones(k, device="cuda", dtype=half) if fusion.norm else None
    res = torch.randn(n, device="cuda", dtype=half) if fusion.residual else None
    scale = torch.full((n,), 0.01, device="cuda", dtype=torch.float32) if fp8 else None
    pdl_here = hardware.dependent_launch()
    folded, early = folded and pdl_here, (early or folded) and pdl_here
    sumsq = folded_norms.scalar(float(k), "cuda") if folded else None

    def call(x, w):
        launch(
            x.reshape(-1), w, out, norm_weight=norm, silu=fusion.silu, residual=res, config=config, scale=scale,
            split=split, pdl=pdl or early, early=early, sumsq_in=sumsq,
        )  # fmt: skip

    return call


@dataclass
class Trial:
    """One candidate config timed on one weight shape and fusion, in one way of launching it."""

    n: int
    k: int
    fusion: Fusion
    config: Config
    us: float  # per call, time_per_call_us
    tbs: float  # weight bytes read per second, TB/s (of the weights' own bytes: BF16 or FP16, or FP8)
    chosen: bool = False  # the config kept without split-K (rungs 7-9), or FP8's
    chosen_split: bool = False  # the config kept with split-K allowed (the split-K rung)
    weights: str = "bf16"  # or "fp16" (a model in float16), or "fp8"
    chosen_persistent: bool = False  # the persistent config kept (the persistent rung)
    early: bool = False  # timed with PDL and W's first tiles before the wait (fused_call's `early`)
    chosen_early: bool = False  # the config kept for the rungs launched so (CHOSEN_EARLY)
    chosen_folded: bool = False  # the config the folded-norms step runs, where that step settled it (CHOSEN_FOLDED)

    def as_row(self) -> dict:
        return {"n": self.n, "k": self.k, "fusion": self.fusion.label, **asdict(self.config), "us": self.us,
                "tbs": self.tbs, "chosen": self.chosen, "chosen_split": self.chosen_split, "weights": self.weights,
                "chosen_persistent": self.chosen_persistent, "early": self.early,
                "chosen_early": self.chosen_early, "chosen_folded": self.chosen_folded}  # fmt: skip


def tune(
    cases, candidates=CANDIDATES, progress=print, split_candidates=SPLIT_CANDIDATES, fp8: bool = False, dtype=None,
    persistent: bool = False,
) -> list[Trial]:  # fmt: skip
    """Time every candidate on each case (N, K, Fusion) (time_per_call_us), and the split-K ones on
    the smaller matrices; keep the fastest without split-K in CHOSEN (CHOSEN_FP8 with `fp8`: FP8
    weights, FP8_CANDIDATES, no split-K), the fastest of all in CHOSEN_SPLIT; with `persistent`,
    PERSISTENT_CANDIDATES, no split-K, the fastest in CHOSEN_PERSISTENT only; return every trial.
    `dtype`: the activations' (None: BF16). Each is timed as the rungs that run it launch it: BF16
    alone for rungs 7-11, and again with PDL and W's first tiles before the wait (`early`), the fastest
    of those, split-K or not, in CHOSEN_EARLY for the rungs launched so (timed one way for both,
    closing-the-gap 20261206T150245Z-h100-80gb-hbm3 left rungs 7-11 0.05-0.09 ms slower than 121924Z,
    or folded-norms 0.02 ms, as it went); FP8 with `early` only (timed without, fp8-pdl took 3.01 ms in
    120547Z, with, 2.94 in 121924Z); gate/up with SiLU and no norm, the folded rungs' alone (BF16 or FP8), as
    those rungs run it (`folded`; timed alone, 054617Z kept a config that took 86 us a layer, against 65)."""
    import torch

    if fp8 and persistent:
        raise ValueError("tune: the persistent candidates are tuned with BF16 (or FP16) weights, not fp8")
    half_label = "fp16" if dtype == torch.float16 else "bf16"
    trials = []
    if candidates is CANDIDATES and (fp8 or persistent):
        candidates = FP8_CANDIDATES if fp8 else PERSISTENT_CANDIDATES
    for n, k, fusion in cases:
        mine = []
        splits = [] if fp8 or persistent or n * k > SPLIT_MAX_ELEMENTS else list(split_candidates)
        folded = fusion.silu and not fusion.norm and not persistent
        modes = (False,) if persistent else (True,) if fp8 or folded else (False, True)  # `early` or not
        for c in [*candidates, *splits]:
            if fusion.silu and c.block_n < 2:
                continue
            for early in modes:
                try:
                    call = fused_call(n, k, fusion, c, fp8=fp8, dtype=dtype, folded=folded and early, early=early)
                    us = time_per_call_us(n, k, call, fp8=fp8, dtype=dtype)
                except Exception as e:  # a split-K, FP8 or persistent candidate failing leaves the others
                    if c.split_k == 1 and not (fp8 or persistent):
                        raise
                    progress(f"    {n}x{k} {fusion.label} with {c}: failed: {type(e).__name__}: {str(e)[:120]}")
                    continue
                tbs = n * k * (1 if fp8 else 2) / us / 1e6
                mine.append(Trial(n, k, fusion, c, us, tbs, weights="fp8" if fp8 else half_label, early=early))
        first = [t for t in mine if t.early == modes[0]]  # rungs 7-11's way, where they run the case
        best = min((t for t in first if t.config.split_k == 1), key=lambda t: t.us)
        top = min(first, key=lambda t: t.us)
        if persistent:
            best.chosen_persistent = True
            CHOSEN_PERSISTENT[(n, k, fusion)] = best.config
        else:
            best.chosen = True
            (CHOSEN_FP8 if fp8 else CHOSEN)[(n, k, fusion)] = best.config
        label = "FP8 " if fp8 else "persistent " if persistent else ""
        progress(f"  {label}GEMV {n}x{k} {fusion.label}: {best.us:.1f} us, {best.tbs:.2f} TB/s with {best.config}")
        if not (fp8 or persistent):
            top.chosen_split = True
            CHOSEN_SPLIT[(n, k, fusion)] = top.config
            fast = min((t for t in mine if t.early), key=lambda t: t.us)  # their options allow split-K
            fast.chosen_early = True
            CHOSEN_EARLY[(n, k, fusion)] = fast.config
            if top is not best:
                progress(f"    split-K: {top.us:.1f} us, {top.tbs:.2f} TB/s with {top.config}")
            if fast is not best:
                progress(f"    with PDL, weights first: {fast.us:.1f} us, {fast.tbs:.2f} TB/s with {fast.config}")
        trials.extend(mine)
    return trials
