"""Our GEMV in persistent form (labsupport.measure.kernels.gemv, `Config.ctas_per_sm` > 0): the
persistent rung's.

The plain GEMV launches one program per BLOCK_N rows: for the LM head tens of thousands of them,
many times what the GPU holds at once, so they run in waves. Each GEMV of a step pays a fixed
cost besides reading its bytes (about 3.5 us on an H200, times ~145 GEMVs a step): the launch
and retirement of every program, the ramp-up before the first bytes arrive, and the tail of the
last wave, in which part of the SMs has nothing left to do. Here the grid is at most
`ctas_per_sm` programs per SM (`programs`), all resident at once (their registers capped so that
they fit: `max_registers`), and program p walks the row
blocks p, p + P, p + 2P, ... (P programs), running the plain kernel's K loop and epilogue on each
(gemv's `stream_rows` and `finish_rows`, called, not copied). So there are few programs to start
and retire, no wave after the first, and the blocks that run at one time are P adjacent ones.
The K loop is a `tl.range` with the config's num_stages, so that the compiler keeps that many
chunks of W in flight per program (a plain `range` pipelines only loads that feed a dot). With
`early` each program issues the load of its first block's first chunk of W before the wait, as
the plain kernel does, and each later block's first chunk during the block before's epilogue.
No split-K (Config refuses it): a program already owns whole rows.

The folded-norms epilogues (labsupport.measure.kernels.folded_norms) hold when one program runs
the epilogue on several blocks:
- `sumsq_out`: each block adds the Σ of the squares it wrote into its program's slot of the row
  with its own atomic add, so the slots add up to the sum over all blocks, whichever program wrote
  each and in whatever order (only the last float32 bit changes, as with the plain kernel's
  programs); the program that runs block 0's epilogue (program 0) zeroes the row of the use before
  once per block it walks: the same stores of 0.0 again, to a row nothing in this grid reads or adds
  into (its reader, the GEMV before, has finished, since this grid waited on it), so repeating it
  changes nothing;
- `sumsq_in`: loaded once per program after the wait, as before, and used by each block;
- `argmax`: each block puts its smallest packed word into one atomic min, and a min of mins is
  the min of all (the order does not matter).
The next kernel's wait still returns only after this whole grid has finished, every block of
every program included, so its reads see every add.

Triton is imported on first use; on a CPU set TRITON_INTERPRET=1 first (no bfloat16 there).
"""

from __future__ import annotations

from functools import cache
from types import SimpleNamespace

# Triton's interpreter runs the programs one after another on the CPU: a few stand for the SMs
# (an odd number, so that with the tests' shapes programs walk unequal numbers of row blocks).
INTERPRETER_SMS = 3


@cache
def sm_count(device: str) -> int:
    """The SMs of a CUDA device (`device` as str(torch.device)); INTERPRETER_SMS elsewhere."""
    import torch

    dev = torch.device(device)
    return torch.cuda.get_device_properties(dev).multi_processor_count if dev.type == "cuda" else INTERPRETER_SMS


def programs(blocks: int, ctas_per_sm: int, device) -> int:
    """The persistent grid: `ctas_per_sm` programs per SM of `device`, never more than the
    `blocks` blocks of rows."""
    return min(blocks, ctas_per_sm * sm_count(str(device)))


def max_registers(config, regs_per_sm: int = 65536) -> int:
    """The registers a thread may use so that `config.ctas_per_sm` programs of its `num_warps` fit on
    an SM (65,536 registers on every NVIDIA GPU since Volta), rounded down to 8 as ptxas takes them:
    without the cap a program of ~100 registers a thread leaves room for two of 8 warps, and a third
    would wait for a place instead of running beside them."""
    return min(255, regs_per_sm // (config.ctas_per_sm * config.num_warps * 32)) // 8 * 8


def kernel(accumulate, stream_rows, finish_rows, after_wait):
    """The persistent kernel, calling the plain GEMV's jit functions it is given (gemv builds it
    beside its own kernel): one BLOCK_K chunk's product, the K loop, the epilogue, the wait and the
    Σx² read after it. Returned with the two pieces it is made of, which the layer and step
    kernels (labsupport.measure.kernels.megakernel) run too: `first_chunk`, a program's first
    block's first chunk of W, and `walk_blocks`, the walk over the row blocks from there."""
    import triton
    import triton.language as tl

    # Triton resolves the functions a kernel calls among its module's globals, not a closure's.
    # (and, in the interpreter, triton.language among a called function's: the layer kernel calls these first).
    globals().update(accumulate=accumulate, stream_rows=stream_rows, finish_rows=finish_rows, after_wait=after_wait,
                     tl=tl)  # fmt: skip

    @triton.jit
    def first_chunk(w_ptr, pid, N, K, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
        # program pid's first block's first chunk of W: it depends on no kernel of the step
        rows = pid * BLOCK_N + tl.arange(0, BLOCK_N)
        cols = tl.arange(0, BLOCK_K)
        return tl.load(w_ptr + rows[:, None] * K + cols[None, :], mask=(rows < N)[:, None] & (cols < K)[None, :],
                       other=0.0)  # fmt: skip

    @triton.jit
    def walk_blocks(
        w_next, pid, step, sumsq, x_ptr, w_ptr, y_ptr, norm_w_ptr, res_ptr, scale_ptr, ws_ptr, sumsq_out_ptr,
        sumsq_clear_ptr, argmax_ptr, N, K, eps,
        NORM: tl.constexpr, SILU: tl.constexpr, RESIDUAL: tl.constexpr, BLOCK_N: tl.constexpr,
        BLOCK_K: tl.constexpr, STAGES: tl.constexpr, SCALE: tl.constexpr, EARLY: tl.constexpr,
        SUMSQ_IN: tl.constexpr, SUMSQ_OUT: tl.constexpr, ARGMAX: tl.constexpr,
    ):  # fmt: skip
        # the row blocks pid, pid + step, ...: each one's K loop and epilogue; with EARLY, `w_next` is the
        # first block's first chunk of W, loaded already, and each block loads the next one's
        first_cols = tl.arange(0, BLOCK_K)
        first_ok = first_cols < K
        for tile in range(pid, tl.cdiv(N, BLOCK_N), step):
            rows = tile * BLOCK_N + tl.arange(0, BLOCK_N)
            row_ok = rows < N
            acc = tl.zeros((BLOCK_N, BLOCK_K), tl.float32)
            sq = tl.zeros((BLOCK_K,), tl.float32)
            start = 0
            if EARLY:
                acc, sq = accumulate(acc, sq, w_next, x_ptr, norm_w_ptr, first_cols, first_ok, NORM)  # noqa: F821
                start = BLOCK_K
            acc, sq = stream_rows(  # noqa: F821 (a global)
                acc, sq, rows, row_ok, start, K, x_ptr, w_ptr, norm_w_ptr, K, BLOCK_K, NORM, STAGES
            )
            if EARLY:  # the next block's first chunk, in flight during this block's epilogue
                nxt = rows + step * BLOCK_N
                w_next = tl.load(
                    w_ptr + nxt[:, None] * K + first_cols[None, :], mask=(nxt < N)[:, None] & first_ok[None, :],
                    other=0.0,
                )  # fmt: skip
            finish_rows(  # noqa: F821 (a global)
                acc, sq, sumsq, tile, rows, row_ok, y_ptr, res_ptr, scale_ptr, ws_ptr, sumsq_out_ptr, sumsq_clear_ptr,
                argmax_ptr, N, K, eps, NORM, SILU, RESIDUAL, BLOCK_N, SCALE, 1, SUMSQ_IN, SUMSQ_OUT, ARGMAX,
            )  # fmt: skip

    globals().update(first_chunk=first_chunk, walk_blocks=walk_blocks)

    @triton.jit
    def persistent_gemv_kernel(
        x_ptr, w_ptr, y_ptr, norm_w_ptr, res_ptr, scale_ptr, ws_ptr, sumsq_in_ptr, sumsq_out_ptr, sumsq_clear_ptr,
        argmax_ptr, N, K, eps,
        NORM: tl.constexpr, SILU: tl.constexpr, RESIDUAL: tl.constexpr, BLOCK_N: tl.constexpr,
        BLOCK_K: tl.constexpr, STAGES: tl.constexpr, SCALE: tl.constexpr = False, PDL: tl.constexpr = False,
        EARLY: tl.constexpr = False, SUMSQ_IN: tl.constexpr = False, SUMSQ_OUT: tl.constexpr = False,
        ARGMAX: tl.constexpr = False,
    ):  # fmt: skip
        pid, step = tl.program_id(0), tl.num_programs(0)
        w_next = 0.0
        if EARLY:  # the first block's first chunk of W depends on no kernel of the step: issued before the wait
            w_next = first_chunk(w_ptr, pid, N, K, BLOCK_N, BLOCK_K)
        sumsq = after_wait(sumsq_in_ptr, PDL, SUMSQ_IN)  # noqa: F821 (a global): used by every block
        walk_blocks(
            w_next, pid, step, sumsq, x_ptr, w_ptr, y_ptr, norm_w_ptr, res_ptr, scale_ptr, ws_ptr, sumsq_out_ptr,
            sumsq_clear_ptr, argmax_ptr, N, K, eps, NORM, SILU, RESIDUAL, BLOCK_N, BLOCK_K, STAGES, SCALE, EARLY,
            SUMSQ_IN, SUMSQ_OUT, ARGMAX,
        )  # fmt: skip

    return SimpleNamespace(kernel=persistent_gemv_kernel, first_chunk=first_chunk, walk_blocks=walk_blocks)
