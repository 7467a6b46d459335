"""A whole decoder layer of the folded-norms step in ONE kernel: the four GEMVs and attention that
the rungs before launch as five kernels (`layer`, qwen3_decode.Options.layer_kernel); and the whole
step after the embedding row in one kernel, every layer and the LM head (`step`, Options.step_kernel).

The layer runs in five stages, each needing all of the one before: QKV, attention, o_proj +
residual, gate/up + SiLU, down + residual. A kernel boundary is what makes a stage wait for the
one before; here the kernel is persistent instead (`programs`: `ctas_per_sm` programs per SM,
all resident at once) and the stages are joined by counters in global memory (`counters`):
each program walks its share of a stage's work, then adds one to the stage's counter (a release:
its writes are visible to whoever sees the count); before the next stage it waits until the
counter reaches the number of programs (an acquire). Nothing is launched, drained or started
between stages, and what a program needs before its wait is loaded before it: the first chunk
of its first block of W for a GEMV, the cached keys and values of its first stretch for
attention (which depend on nothing in the step), as the GEMVs with weights first do before
`gdc_wait`. The layer's first stage waits on the kernel before (programmatic dependent launch),
as they do.

The pieces are the other rungs' own, called, not copied: a GEMV stage is the persistent GEMV's
walk over row blocks (persistent_gemv's `first_chunk` and `walk_blocks`, with the folded
norms' Σx² epilogues), attention is the one-kernel attention's (decode_attention's
`stretch_kv` and `attend_stretch`: one item per (K/V head, stretch), combined by the last item of
each K/V head to finish). The Σx² rows are used as in the folded-norms step (folded_norms):
QKV reads row 0, o_proj adds into row 1 and zeroes row 0, gate/up reads row 1, down adds into row 2
and zeroes row 1; each zeroing comes after the stage that read the row, two counters earlier.

Waiting for another program is safe only when every program is resident: one not yet started
would never arrive. So the grid is at most what fits on the GPU at once (`check_resident` says
so once the kernel is compiled), and a wait gives up after MAX_SPINS polls, counting a
timeout (`timeouts`), so that a grid that does not fit ends with wrong numbers and a count,
never a hang. The stage counters are set back to zero by the last program to finish, for
the next launch; the attention's by the last item of each K/V head.

The step kernel runs the same layer body for each layer in turn, its weights, caches and q/k norms
found by address in a table (`table`), the counters counting on from layer to layer (a stage of
layer l waits for l + 1 times the programs), then the LM head's GEMV with its argmax. Each layer
has its own rows of the scratch buffers: a buffer reused by the next layer would be read again in
the same launch after another SM rewrote it, and an SM's L1 cache, which is not kept coherent with
the other SMs' writes, could still hold the old line.

Triton's interpreter (TRITON_INTERPRET=1, on a CPU) runs one program after another, so there a
wait for the other programs would never end: it runs the layer as one program (`programs`).
"""

from __future__ import annotations

from functools import cache
from types import SimpleNamespace

from labsupport.measure.kernels import decode_attention, folded_norms, gemv, persistent_gemv

# The counters (int32): 0-4 the stages QKV, attention, o_proj, gate/up and down done (counted on
# through the layers of a launch), then the programs done with the launch, the waits that gave up,
# and from SYNC on the attention's, one per K/V head.
DONE, TIMEOUTS, SYNC = 5, 6, 8
# Polls of a counter before a wait gives up: each is a round trip to L2 (about a microsecond),
# so some milliseconds, a hundred times a stage's length.
MAX_SPINS = 1 << 14
# The GEMV stages' block shape, warps and pipeline depth, and the programs per SM. On an H100 the
# persistent GEMV's tuning (gemv_tuning.csv of closing-the-gap run 20261205T190637Z-h100-80gb-hbm3)
# read gate/up at 67 us with two programs of 4 rows per SM, 86 us with one: a program of 8 warps
# keeps too few bytes in flight alone. So the default is two per SM (their registers capped so that
# both fit, persistent_gemv.max_registers). In the first run with this kernel (closing-the-gap
# 20261206T004616Z-h100-80gb-hbm3) one layer took 150 us with that default, 170 us with one program
# of 16 warps and 8 rows per SM, against about 138 us for the folded-norms rung's five kernels, whose
# GEMVs run 64 warps per SM: so the tuner (`tune`) also tries three and four programs per SM, 24 and
# 32 warps, with fewer registers each (20261206T041852Z-h100-80gb-hbm3: 162 and 186 us, against 151).
DEFAULT = gemv.Config(4, 2048, 8, 3, ctas_per_sm=2)
CANDIDATES = (DEFAULT, gemv.Config(8, 2048, 16, 3, ctas_per_sm=1),
              *(gemv.Config(4, 2048, 8, 3, ctas_per_sm=n) for n in (3, 4)))  # fmt: skip
# The config `tune` kept per layer shape (hidden, intermediate, heads, kv_heads, head_dim, slots).
CHOSEN: dict = {}
_COUNTERS: dict = {}


def chosen(hidden: int, inter: int, heads: int, kv_heads: int, head_dim: int, slots: int) -> gemv.Config:
    """The config `tune` kept for a layer of these shapes, else DEFAULT."""
    return CHOSEN.get((hidden, inter, heads, kv_heads, head_dim, slots), DEFAULT)


def counters(kv_heads: int, device):
    """The layer kernel's int32 counters on `device` (SYNC + one per K/V head): zeroed once, made on
    first use (before any CUDA-graph capture), and left at zero by every launch but the timeouts'."""
    import torch

    key = (kv_heads, str(device))
    if key not in _COUNTERS:
        _COUNTERS[key] = torch.zeros(SYNC + kv_heads, device=device, dtype=torch.int32)
    return _COUNTERS[key]


def timeouts(device) -> int:
    """The waits that gave up on `device` since its counters were made (0 when all were resident)."""
    return sum(int(c[TIMEOUTS]) for key, c in _COUNTERS.items() if key[1] == str(device))


def programs(config: gemv.Config, device) -> int:
    """The grid: `config.ctas_per_sm` programs per SM of `device` (one in the interpreter, module docstring)."""
    import torch

    if torch.device(device).type != "cuda":
        return 1
    return config.ctas_per_sm * persistent_gemv.sm_count(str(device))


def resident(
    n_regs: int, shared: int, num_warps: int, regs_per_sm: int, threads_per_sm: int, shared_per_sm: int
) -> int:
    """How many programs of a compiled kernel fit on one SM at once, by its registers (a thread's,
    allocated per warp in 256s), its shared memory and its threads."""
    regs_per_warp = -(-max(n_regs, 1) * 32 // 256) * 256
    by_regs = regs_per_sm // (regs_per_warp * num_warps)
    by_threads = threads_per_sm // (32 * num_warps)
    by_shared = shared_per_sm // shared if shared else by_threads
    return min(by_regs, by_threads, by_shared)


@cache
def _kernel():
    import triton
    import triton.language as tl

    g = gemv.jit_kernels()
    one = decode_attention.one_kernel()
    fns = folded_norms.jit_functions()
    # Triton resolves the functions a kernel calls among its module's globals, not a closure's.
    globals().update(first_chunk=g.first_chunk, walk_blocks=g.walk_blocks, stretch_kv=one.stretch_kv, tables=one.tables,
                     attend_stretch=one.attend_stretch, tl=tl, sumsq_epilogue=fns.sumsq_epilogue,
                     read_sumsq=fns.read_sumsq)  # fmt: skip

    @triton.jit
    def arrive(sync_ptr, counter):
        # this program's writes of the stage issued by every thread, then released with one count
        tl.debug_barrier()
        tl.atomic_add(sync_ptr + counter, 1, sem="release")

    @triton.jit
    def wait_for(sync_ptr, counter, target, MAX: tl.constexpr, TIMEOUTS_AT: tl.constexpr):
        # until `counter` reaches `target` (acquire: the writes released with it visible), at most MAX polls
        seen = tl.atomic_add(sync_ptr + counter, 0, sem="acquire")
        polls = 0
        while (seen < target) & (polls < MAX):
            seen = tl.atomic_add(sync_ptr + counter, 0, sem="acquire")
            polls += 1
        if seen < target:
            tl.atomic_add(sync_ptr + TIMEOUTS_AT, 1, sem="relaxed")
        tl.debug_barrier()

    globals().update(arrive=arrive, wait_for=wait_for)

    @triton.jit
    def gemv_stage(
        w_next, x_ptr, w_ptr, y_ptr, res_ptr, sumsq_in_ptr, sumsq_out_ptr, clear_ptr, word_ptr, N, K, eps, sync_ptr,
        after, target, pid, P,
        SILU: tl.constexpr, RESIDUAL: tl.constexpr, SUMSQ_IN: tl.constexpr, SUMSQ_OUT: tl.constexpr,
        ARGMAX: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, STAGES: tl.constexpr,
        MAX: tl.constexpr, TIMEOUTS_AT: tl.constexpr,
    ):  # fmt: skip
        # y = W x (scaled by the norm of x from its Σx², SiLU x up, + residual, Σy² out, argmax) over this
        # program's row blocks, once counter `after` reaches `target`; `w_next`, the first chunk of W, was
        # loaded before that wait
        wait_for(sync_ptr, after, target, MAX, TIMEOUTS_AT)
        sumsq = 0.0
        if SUMSQ_IN:
            sumsq = read_sumsq(sumsq_in_ptr)  # noqa: F821 (a global)
        walk_blocks(  # noqa: F821 (a global)
            w_next, pid, P, sumsq, x_ptr, w_ptr, y_ptr, w_ptr, res_ptr, y_ptr, y_ptr, sumsq_out_ptr, clear_ptr,
            word_ptr, N, K, eps, False, SILU, RESIDUAL, BLOCK_N, BLOCK_K, STAGES, False, True, SUMSQ_IN, SUMSQ_OUT,
            ARGMAX,
        )  # fmt: skip

    globals()["gemv_stage"] = gemv_stage

    @triton.jit
    def layer_body(
        w_next, x_ptr, wqkv_ptr, wo_ptr, wgu_ptr, wd_ptr, qn_ptr, kn_ptr, cos_ptr, sin_ptr, kc_ptr, vc_ptr, pos,
        sums_ptr, sync_ptr, qkv_ptr, part_ptr, attn_ptr, h2_ptr, act_ptr, out_ptr, eps, scale, HIDDEN, INTER, pid,
        P, base,
        H: tl.constexpr, KVH: tl.constexpr, D: tl.constexpr, SLOTS: tl.constexpr, BLOCK_S: tl.constexpr,
        CHUNK: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, STAGES: tl.constexpr,
        MAX: tl.constexpr, ROW: tl.constexpr, TIMEOUTS_AT: tl.constexpr, SYNC_AT: tl.constexpr,
    ):  # fmt: skip
        # One layer's five stages; each counter has reached `base` (P times the layers before, in this
        # launch) and reaches base + P when every program is done with its stage here. `w_next`: the first
        # chunk of W of this program's first block of QKV, loaded already.
        row0, row1, row2 = sums_ptr, sums_ptr + ROW, sums_ptr + 2 * ROW
        # Stage 0, QKV (reads row 0), once the layer before is done everywhere (its output x, row 0).
        gemv_stage(
            w_next, x_ptr, wqkv_ptr, qkv_ptr, x_ptr, row0, row0, row0, row0, (H + 2 * KVH) * D, HIDDEN, eps, sync_ptr,
            4, base, pid, P, False, False, True, False, False, BLOCK_N, BLOCK_K, STAGES, MAX, TIMEOUTS_AT,
        )  # fmt: skip
        arrive(sync_ptr, 0)
        # Stage 1, attention: one item per (K/V head, stretch); the first item's cached k and v before the wait.
        parts = tl.cdiv(SLOTS, BLOCK_S)
        items = KVH * parts
        first = tl.minimum(pid, items - 1)
        kt, vt = stretch_kv(kc_ptr, vc_ptr, pos, first // parts, first % parts, D, SLOTS, BLOCK_S)  # noqa: F821
        cos, sin, qw, qw_rot, kw, kw_rot = tables(cos_ptr, sin_ptr, qn_ptr, kn_ptr, pos, D)  # noqa: F821
        wait_for(sync_ptr, 0, base + P, MAX, TIMEOUTS_AT)
        for item in range(pid, items, P):
            if item != pid:
                kt, vt = stretch_kv(kc_ptr, vc_ptr, pos, item // parts, item % parts, D, SLOTS, BLOCK_S)  # noqa: F821
            # (the group's heads in one product: on 8 warps or more it fits, decode_attention.fits_grouped)
            attend_stretch(  # noqa: F821 (a global)
                kt, vt, cos, sin, qw, qw_rot, kw, kw_rot, qkv_ptr, kc_ptr, vc_ptr, pos, item // parts, item % parts,
                parts, part_ptr, sync_ptr + SYNC_AT, attn_ptr, eps, scale, H, KVH, D, SLOTS, BLOCK_S, CHUNK,
            )  # fmt: skip
        arrive(sync_ptr, 1)
        # Stage 2, o_proj + residual (adds into row 1, zeroes row 0, read by stage 0).
        w_next = first_chunk(wo_ptr, pid, HIDDEN, H * D, BLOCK_N, BLOCK_K)  # noqa: F821 (a global)
        gemv_stage(
            w_next, attn_ptr, wo_ptr, h2_ptr, x_ptr, row0, row1, row0, row0, HIDDEN, H * D, eps, sync_ptr, 1, base + P,
            pid, P, False, True, False, True, False, BLOCK_N, BLOCK_K, STAGES, MAX, TIMEOUTS_AT,
        )  # fmt: skip
        arrive(sync_ptr, 2)
        # Stage 3, gate/up + SiLU (reads row 1).
        w_next = first_chunk(wgu_ptr, pid, 2 * INTER, HIDDEN, BLOCK_N, BLOCK_K)  # noqa: F821 (a global)
        gemv_stage(
            w_next, h2_ptr, wgu_ptr, act_ptr, h2_ptr, row1, row1, row1, row1, 2 * INTER, HIDDEN, eps, sync_ptr, 2,
            base + P, pid, P, True, False, True, False, False, BLOCK_N, BLOCK_K, STAGES, MAX, TIMEOUTS_AT,
        )  # fmt: skip
        arrive(sync_ptr, 3)
        # Stage 4, down + residual (adds into row 2, zeroes row 1, read by stage 3).
        w_next = first_chunk(wd_ptr, pid, HIDDEN, INTER, BLOCK_N, BLOCK_K)  # noqa: F821 (a global)
        gemv_stage(
            w_next, act_ptr, wd_ptr, out_ptr, h2_ptr, row1, row2, row1, row1, HIDDEN, INTER, eps, sync_ptr, 3,
            base + P, pid, P, False, True, False, True, False, BLOCK_N, BLOCK_K, STAGES, MAX, TIMEOUTS_AT,
        )  # fmt: skip
        arrive(sync_ptr, 4)

    @triton.jit
    def finish(sync_ptr, P, DONE_AT: tl.constexpr):
        # the last program to finish sets the counters back for the next launch (all others are past their waits)
        if tl.atomic_add(sync_ptr + DONE_AT, 1) == P - 1:
            for c in range(0, DONE_AT + 1):
                tl.store(sync_ptr + c, 0)

    @triton.jit
    def address(row_ptr, column, ELEMENT: tl.constexpr):
        # a tensor's address from the step kernel's table, 16-byte aligned (`table` checks it), so that
        # loads through it are as wide as through a kernel argument, which Triton knows aligned
        return tl.multiple_of(tl.load(row_ptr + column).to(tl.pointer_type(ELEMENT)), 16)

    globals().update(layer_body=layer_body, finish=finish, address=address)

    @triton.jit
    def layer_kernel(
        x_ptr, wqkv_ptr, wo_ptr, wgu_ptr, wd_ptr, qn_ptr, kn_ptr, cos_ptr, sin_ptr, kc_ptr, vc_ptr, pos_ptr,
        sums_ptr, sync_ptr, qkv_ptr, part_ptr, attn_ptr, h2_ptr, act_ptr, out_ptr, eps, scale, HIDDEN, INTER,
        H: tl.constexpr, KVH: tl.constexpr, D: tl.constexpr, SLOTS: tl.constexpr, BLOCK_S: tl.constexpr,
        CHUNK: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, STAGES: tl.constexpr,
        PDL: tl.constexpr, MAX: tl.constexpr, ROW: tl.constexpr, DONE_AT: tl.constexpr, TIMEOUTS_AT: tl.constexpr,
        SYNC_AT: tl.constexpr,
    ):  # fmt: skip
        pid, P = tl.program_id(0), tl.num_programs(0)
        pos = tl.load(pos_ptr)
        # QKV's first chunk of W before the wait for the kernel before (x, row 0).
        w_next = first_chunk(wqkv_ptr, pid, (H + 2 * KVH) * D, HIDDEN, BLOCK_N, BLOCK_K)  # noqa: F821
        if PDL:
            tl.extra.cuda.gdc_wait()
            tl.extra.cuda.gdc_launch_dependents()
        layer_body(
            w_next, x_ptr, wqkv_ptr, wo_ptr, wgu_ptr, wd_ptr, qn_ptr, kn_ptr, cos_ptr, sin_ptr, kc_ptr, vc_ptr, pos,
            sums_ptr, sync_ptr, qkv_ptr, part_ptr, attn_ptr, h2_ptr, act_ptr, out_ptr, eps, scale, HIDDEN, INTER,
            pid, P, 0, H, KVH, D, SLOTS, BLOCK_S, CHUNK, BLOCK_N, BLOCK_K, STAGES, MAX, ROW, TIMEOUTS_AT, SYNC_AT,
        )  # fmt: skip
        finish(sync_ptr, P, DONE_AT)

    @triton.jit
    def step_kernel(
        x_ptr, table_ptr, cos_ptr, sin_ptr, pos_ptr, sums_ptr, sync_ptr, qkv_ptr, part_ptr, attn_ptr, h2_ptr,
        act_ptr, out_ptr, lm_ptr, logits_ptr, word_ptr, eps, scale, HIDDEN, INTER, VOCAB, LAYERS,
        H: tl.constexpr, KVH: tl.constexpr, D: tl.constexpr, SLOTS: tl.constexpr, BLOCK_S: tl.constexpr,
        CHUNK: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, STAGES: tl.constexpr,
        PDL: tl.constexpr, MAX: tl.constexpr, ROW: tl.constexpr, DONE_AT: tl.constexpr, TIMEOUTS_AT: tl.constexpr,
        SYNC_AT: tl.constexpr, TABLE: tl.constexpr,
    ):  # fmt: skip
        # Every layer (its weights, caches and q/k norms by address: table row l, TABLE_COLUMNS), then the LM
        # head with argmax. Each layer has its own rows of the scratch buffers, so that no address is read in
        # this launch before its last write (none waits on a cache line another program rewrote).
        pid, P = tl.program_id(0), tl.num_programs(0)
        wt = x_ptr.dtype.element_ty
        pos = tl.load(pos_ptr)
        PARTS: tl.constexpr = (SLOTS + BLOCK_S - 1) // BLOCK_S
        QKV_N: tl.constexpr = (H + 2 * KVH) * D
        w_next = first_chunk(address(table_ptr, 0, wt), pid, QKV_N, HIDDEN, BLOCK_N, BLOCK_K)  # noqa: F821
        if PDL:  # the embedding row (x, row 0) comes from the kernel before
            tl.extra.cuda.gdc_wait()
            tl.extra.cuda.gdc_launch_dependents()
        x_in = x_ptr
        for layer in range(LAYERS):
            at = table_ptr + layer * TABLE
            layer_body(
                w_next, x_in, address(at, 0, wt), address(at, 1, wt), address(at, 2, wt), address(at, 3, wt),
                address(at, 6, wt), address(at, 7, wt), cos_ptr, sin_ptr, address(at, 4, wt), address(at, 5, wt),
                pos, sums_ptr + 2 * layer * ROW, sync_ptr,
                qkv_ptr + layer * QKV_N, part_ptr + layer * H * PARTS * (D + 2), attn_ptr + layer * H * D,
                h2_ptr + layer * HIDDEN, act_ptr + layer * INTER, out_ptr + layer * HIDDEN, eps, scale, HIDDEN, INTER,
                pid, P, layer * P, H, KVH, D, SLOTS, BLOCK_S, CHUNK, BLOCK_N, BLOCK_K, STAGES, MAX, ROW, TIMEOUTS_AT,
                SYNC_AT,
            )  # fmt: skip
            x_in = out_ptr + layer * HIDDEN
            # the next layer's (or the LM head's) first chunk of W, before that layer's wait
            if layer + 1 < LAYERS:
                w_next = first_chunk(address(at + TABLE, 0, wt), pid, QKV_N, HIDDEN, BLOCK_N, BLOCK_K)  # noqa: F821
            else:
                w_next = first_chunk(lm_ptr, pid, VOCAB, HIDDEN, BLOCK_N, BLOCK_K)  # noqa: F821
        # The LM head (reads the last layer's output and its Σx², the step's last row), its argmax into the word.
        last = sums_ptr + 2 * LAYERS * ROW
        gemv_stage(
            w_next, x_in, lm_ptr, logits_ptr, x_in, last, last, last, word_ptr, VOCAB, HIDDEN, eps, sync_ptr, 4,
            LAYERS * P, pid, P, False, False, True, False, True, BLOCK_N, BLOCK_K, STAGES, MAX, TIMEOUTS_AT,
        )  # fmt: skip
        finish(sync_ptr, P, DONE_AT)

    return SimpleNamespace(triton=triton, layer=layer_kernel, step=step_kernel)


_CHECKED: set = set()


def layer(
    x, wqkv, wo, wgu, wd, q_norm, k_norm, cos, sin, k_cache, v_cache, pos, sums, heads: int, eps: float,
    config: gemv.Config | None = None, pdl: bool = False, block_s: int | None = None,
):  # fmt: skip
    """The decoder layer's output [hidden] for one token x (any leading dimensions of size 1), from the
    folded QKV, o_proj, interleaved folded gate/up and down weights, writing the token's k and v
    into the caches ([1, kv_heads, slots, head_dim]) at `pos` ([1]) and using the layer's three Σx²
    rows `sums` (folded_norms.sums' rows for this layer) as the folded-norms step does;
    `pdl`: launched with programmatic dependent launch. `block_s`: the attention's positions per
    item (None: attention_block's)."""
    _, kv_heads, slots, head_dim = k_cache.shape
    hidden, inter = x.shape[-1], wgu.shape[0] // 2
    c, grid, shape, extra, made = _launch(x, 1, hidden, inter, heads, kv_heads, head_dim, slots, config, pdl, block_s)
    compiled = _kernel().layer[(grid,)](
        x.reshape(-1), wqkv, wo, wgu, wd, q_norm, k_norm, cos, sin, k_cache, v_cache, pos, sums,
        counters(kv_heads, x.device), made["qkv"], made["partial"], made["attn"], made["h2"], made["act"],
        made["out"], eps, head_dim**-0.5, hidden, inter, **shape, **extra,
    )  # fmt: skip
    if x.device.type == "cuda":
        check_resident(compiled, c, x.device)
    return made["out"].reshape(x.shape)


# The columns of the step kernel's table: the addresses of each layer's weights, caches and q/k norms.
TABLE_COLUMNS = ("qkv", "o_proj", "gate_up", "down", "k_cache", "v_cache", "q_norm", "k_norm")


def table(layers: list[dict]):
    """The step kernel's table (int64 [layers, TABLE_COLUMNS]): each layer's tensors by name, as
    addresses, each 16-byte aligned (the kernel loads through them as wide as through its arguments)
    and contiguous. The tensors must outlive every launch that reads the table (the decoder holds them)."""
    import torch

    device = layers[0]["qkv"].device
    for i, ts in enumerate(layers):
        for name in TABLE_COLUMNS:
            if ts[name].data_ptr() % 16 or not ts[name].is_contiguous():
                raise ValueError(f"layer {i}'s {name} is not contiguous from a 16-byte boundary: the table needs it")
    rows = [[ts[name].data_ptr() for name in TABLE_COLUMNS] for ts in layers]
    return torch.tensor(rows, dtype=torch.int64, device=device)


def step(
    x, layer_table, lm_head, word, cos, sin, pos, sums, *, inter: int, heads: int, kv_heads: int, head_dim: int,
    slots: int, eps: float, config: gemv.Config | None = None, pdl: bool = False, block_s: int | None = None,
):  # fmt: skip
    """The logits [vocab] of a whole decode step after its embedding row x, in ONE kernel: every layer
    (layer_table, as `table` makes it; each as `layer` runs it) and the folded LM head, whose argmax
    goes into `word` (folded_norms.argmax_word). `sums`: the step's Σx² rows (folded_norms.sums),
    `pos` [1]; the caches, of `slots` positions, are written through the table."""
    import torch

    layers, hidden = layer_table.shape[0], x.shape[-1]
    c, grid, shape, extra, made = _launch(
        x, layers, hidden, inter, heads, kv_heads, head_dim, slots, config, pdl, block_s
    )  # fmt: skip
    logits = torch.empty(lm_head.shape[0], device=x.device, dtype=x.dtype)
    compiled = _kernel().step[(grid,)](
        x.reshape(-1), layer_table, cos, sin, pos, sums, counters(kv_heads, x.device), made["qkv"], made["partial"],
        made["attn"], made["h2"], made["act"], made["out"], lm_head, logits, word, eps, head_dim**-0.5, hidden, inter,
        lm_head.shape[0], layers, TABLE=len(TABLE_COLUMNS), **shape, **extra,
    )  # fmt: skip
    if x.device.type == "cuda":
        check_resident(compiled, c, x.device)
    return logits


def _launch(x, layers, hidden, inter, heads, kv_heads, head_dim, slots, config, pdl, block_s):
    """What a launch of the layer or the step kernel needs: its config (given, tuned, or DEFAULT), its
    grid, the constexprs of its shapes, its launch options and the scratch buffers of `layers` layers
    (each its own rows: the step kernel's docstring says why)."""
    import torch

    triton = _kernel().triton
    c = config or chosen(hidden, inter, heads, kv_heads, head_dim, slots)
    if c.ctas_per_sm < 1 or c.split_k > 1 or c.block_n % 2:
        raise ValueError(f"the layer kernel needs programs per SM, no split-K and an even block of rows, not {c}")
    grid = programs(c, x.device)
    block_s = block_s or attention_block(slots, kv_heads, grid)
    parts = triton.cdiv(slots, block_s)
    dev, dt = x.device, x.dtype
    sizes = {"qkv": (heads + 2 * kv_heads) * head_dim, "attn": heads * head_dim, "h2": hidden, "act": inter,
             "out": hidden}  # fmt: skip
    made = {n: torch.empty(layers, size, device=dev, dtype=dt) for n, size in sizes.items()}
    made["partial"] = torch.empty(layers, heads, parts, head_dim + 2, device=dev, dtype=torch.float32)
    shape = dict(
        H=heads, KVH=kv_heads, D=head_dim, SLOTS=slots, BLOCK_S=block_s,
        CHUNK=decode_attention.combine_chunk(parts),
        BLOCK_N=c.block_n, BLOCK_K=c.block_k, STAGES=c.num_stages, PDL=pdl, MAX=MAX_SPINS, ROW=folded_norms.ROW,
        DONE_AT=DONE, TIMEOUTS_AT=TIMEOUTS, SYNC_AT=SYNC, num_warps=c.num_warps, num_stages=c.num_stages,
    )  # fmt: skip
    extra = {"launch_pdl": True} if pdl else {}
    if dev.type == "cuda":  # registers capped so that the programs of an SM fit together
        extra["maxnreg"] = persistent_gemv.max_registers(c)
    return c, grid, shape, extra, made


def check_resident(compiled, config: gemv.Config, device) -> None:
    """Raise if `config.ctas_per_sm` programs of the compiled layer kernel do not fit on an SM at once
    (module docstring: its waits need every program resident); checked once per compiled kernel."""
    import torch

    key = (id(compiled), config, str(device))
    if key in _CHECKED or getattr(compiled, "n_regs", None) is None:  # checked, or not loaded (then the waits say)
        return
    import triton

    props = torch.cuda.get_device_properties(device)
    regs = triton.runtime.driver.active.utils.get_device_properties(props_index(device))["max_num_regs"]
    fits = resident(compiled.n_regs, compiled.metadata.shared, config.num_warps, regs,
                    props.max_threads_per_multi_processor, props.shared_memory_per_multiprocessor)  # fmt: skip
    if fits < config.ctas_per_sm:
        raise RuntimeError(
            f"the layer kernel with {config} needs {config.ctas_per_sm} programs an SM resident at once; "
            f"{fits} fit ({compiled.n_regs} registers a thread, {compiled.metadata.shared} B of shared memory)"
        )
    _CHECKED.add(key)


def props_index(device) -> int:
    """The CUDA device index of `device` (the current one where it names none)."""
    import torch

    dev = torch.device(device)
    return dev.index if dev.index is not None else torch.cuda.current_device()


def attention_block(slots: int, kv_heads: int, grid: int) -> int:
    """The attention's positions per item in the layer kernel: the shortest stretch of
    decode_attention.ONE_BLOCKS whose items (one per K/V head and stretch) every program can take
    at once, so that none takes two in turn while the others wait for it (the longest where none fits)."""
    fits = [b for b in decode_attention.ONE_BLOCKS if kv_heads * -(-slots // b) <= grid]
    return min(fits) if fits else max(decode_attention.ONE_BLOCKS)


def tune(
    hidden: int, inter: int, heads: int, kv_heads: int, head_dim: int, slots: int, pos: int, dtype,
    candidates=CANDIDATES, repeats: int = 20, calls: int = 8,
) -> list[dict]:  # fmt: skip
    """Time the layer kernel with each config of `candidates` on one layer of these shapes (random
    weights: a layer's are hundreds of MB, far past the L2 cache, so each call reads them from
    memory), `calls` calls in one CUDA graph, launched as the step launches them; keep the fastest
    in CHOSEN and return one row per config (its fields, programs, us per call, status, chosen). A
    config that fails (its programs not all resident, a wait that gave up) is a row with its reason."""
    import torch

    from labsupport.measure import hardware

    dev = torch.device("cuda", torch.cuda.current_device())

    def r(*shape):
        return torch.randn(*shape, device=dev, dtype=dtype) / 16

    w = (r((heads + 2 * kv_heads) * head_dim, hidden), r(hidden, heads * head_dim), r(2 * inter, hidden),
         r(hidden, inter))  # fmt: skip
    norms = (torch.ones(head_dim, device=dev, dtype=dtype), torch.ones(head_dim, device=dev, dtype=dtype))
    cos, sin = r(slots, head_dim), r(slots, head_dim)
    kc, vc = r(1, kv_heads, slots, head_dim), r(1, kv_heads, slots, head_dim)
    x, at = r(1, 1, hidden), torch.tensor([pos], device=dev)
    sums = torch.zeros(3, folded_norms.ROW, device=dev, dtype=torch.float32)
    sums[0, 0] = hidden / 256  # Σx² of x
    rows = []
    for c in candidates:
        row = {**{k: getattr(c, k) for k in ("block_n", "block_k", "num_warps", "num_stages", "ctas_per_sm")},
               "programs": programs(c, dev), "us": float("nan"), "status": "ok"}  # fmt: skip

        def step(c=c):
            for _ in range(calls):  # (x's Σx², zeroed by the first call's o_proj, then scales by 1 / sqrt(eps))
                layer(x, *w, *norms, cos, sin, kc, vc, at, sums, heads, 1e-6, config=c, pdl=True)

        try:
            before = timeouts(dev)
            us = hardware.graph_us_per_call(step, calls, repeats=repeats)  # its first run checks residency
            if timeouts(dev) > before:
                raise RuntimeError("its programs gave up waiting for each other")
            row["us"] = us
        except Exception as e:
            row["status"] = f"failed: {type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"
        rows.append(row)
    ok = [row for row in rows if row["status"] == "ok"]
    best = min(ok, key=lambda row: row["us"]) if ok else None
    for row, c in zip(rows, candidates, strict=True):
        row["chosen"] = row is best
        if row is best:
            CHOSEN[(hidden, inter, heads, kv_heads, head_dim, slots)] = c
    return rows
