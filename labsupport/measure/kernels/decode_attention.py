"""Everything between the QKV matmul and o_proj of one decode step, as Triton kernels of ours.

After the fused Q/K/V matmul, Qwen3's attention does, per head: RMSNorm of q and of k over the
head (q_norm, k_norm), the rotary embedding, the new k and v written into the KV cache, then
attention of q over every cached position. Written in PyTorch and compiled, that is about six
kernels, each a few microseconds. Here it is two, split the way flash-decoding splits it: the
first runs one program per (query head, stretch of BLOCK_S positions), so that a few hundred
programs share the work instead of one per head; each normalises and rotates its q (and its
group's k), one per K/V head writes the new k and v into the cache, and each returns its
stretch's softmax maximum, sum and weighted values. The second combines the stretches of each
head. (The new position's k and v come from registers, not from the cache another program is
writing.)

`decode_attention_one` does the same in ONE kernel, the way a megakernel would, in one of two
forms (`OneConfig.per_head`). Grouped: one program per (K/V head, stretch) serves the query heads
that share that K/V head in one [G, BLOCK_S, D] product, reading each cached k and v once for all
of them. Per head: one program per (query head, stretch), as the two-kernel form splits it; the G
programs of a K/V head each read its stretch (from L2 after the first). In both, the last program
to finish (a counter per K/V head, or per query head, incremented atomically after each program
has written its stretch) combines the stretches, so no second kernel is launched. Launched with
programmatic dependent launch (`pdl`) it reads, before it waits for the kernel before it (the QKV
GEMV) to finish, everything that kernel does not write: the cached positions before the new token,
the rotary table's row and the norms' weights. What is left after the wait is a chain of dependent
steps (q and k normed and rotated, the scores, the softmax, the weighted sum, the partials stored,
the counter, the combine), so the form with the shorter chain wins: the grouped product's
reductions across a [G, BLOCK_S, D] tile take several times the instructions of one head's, which
`tune_one` weighs against the grouped form's fewer programs and single read of the cache.
A third form (`OneConfig.cluster`) is CUDA C++ (labsupport.measure.kernels.cluster_attention): the
per-head split, with each head's stretches one thread-block cluster that combines on chip, so the
partials, the counter and the loads back leave the chain.
That chain leaves the memory idle for microseconds; pulling o_proj's weights into L2 from here by
bulk prefetches did not pay (closing-the-gap 20261206T060822Z-h100-80gb-hbm3: attention took 445 us
a step against 265, o_proj and down_proj 1,607 against 1,635), so the kernel does not.

Triton is imported on first use; on a CPU set TRITON_INTERPRET=1 first (no bfloat16 there).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from types import SimpleNamespace


@cache
def _kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def norm_rope_w(x_ptr, w, w_rot, d, d_rot, sign, cos, sin, eps, D: tl.constexpr):
        # Qwen3's per-head RMSNorm (float32 statistic, rounded, times the weight, rounded), then the rotary
        # embedding x * cos + rotate_half(x) * sin, rounded to the input's dtype; the norm's weight given,
        # loaded already (w at d, w_rot at d_rot)
        x = tl.load(x_ptr + d)
        xf, xr = x.to(tl.float32), tl.load(x_ptr + d_rot).to(tl.float32)
        r = 1.0 / tl.sqrt(tl.sum(xf * xf, axis=0) / D + eps)
        n = ((xf * r).to(x.dtype) * w).to(tl.float32)
        nr = ((xr * r).to(x.dtype) * w_rot).to(tl.float32)
        return (n * cos + sign * nr * sin).to(x.dtype)

    @triton.jit
    def norm_rope(x_ptr, w_ptr, d, d_rot, sign, cos, sin, eps, D: tl.constexpr):
        # norm_rope_w, the norm's weight loaded here
        return norm_rope_w(x_ptr, tl.load(w_ptr + d), tl.load(w_ptr + d_rot), d, d_rot, sign, cos, sin, eps, D)

    # Triton resolves the functions a kernel calls among its module's globals, not a closure's.
    globals().update(norm_rope=norm_rope, norm_rope_w=norm_rope_w)

    @triton.jit
    def attention_part_kernel(
        qkv_ptr, qn_ptr, kn_ptr, cos_ptr, sin_ptr, kc_ptr, vc_ptr, pos_ptr, part_ptr, eps, scale,
        H: tl.constexpr, KVH: tl.constexpr, D: tl.constexpr, SLOTS: tl.constexpr, BLOCK_S: tl.constexpr,
    ):  # fmt: skip
        h, part = tl.program_id(0), tl.program_id(1)
        kvh = h // (H // KVH)
        pos = tl.load(pos_ptr)
        d = tl.arange(0, D)
        d_rot = (d + D // 2) % D
        sign = tl.where(d < D // 2, -1.0, 1.0)
        cos = tl.load(cos_ptr + pos * D + d).to(tl.float32)
        sin = tl.load(sin_ptr + pos * D + d).to(tl.float32)
        q = norm_rope(qkv_ptr + h * D, qn_ptr, d, d_rot, sign, cos, sin, eps, D).to(tl.float32)
        k = norm_rope(qkv_ptr + (H + kvh) * D, kn_ptr, d, d_rot, sign, cos, sin, eps, D)
        v = tl.load(qkv_ptr + (H + KVH + kvh) * D + d)
        cache_at = kvh * SLOTS * D
        if (h % (H // KVH) == 0) & (part == 0):  # one program per K/V head writes the new position
            tl.store(kc_ptr + cache_at + pos * D + d, k)
            tl.store(vc_ptr + cache_at + pos * D + d, v)
        # This program's stretch of positions; the new one's k and v come from registers.
        s = part * BLOCK_S + tl.arange(0, BLOCK_S)
        old = (s < pos)[:, None]
        at = cache_at + s[:, None] * D + d[None, :]
        kt = tl.load(kc_ptr + at, mask=old, other=0.0).to(tl.float32)
        vt = tl.load(vc_ptr + at, mask=old, other=0.0).to(tl.float32)
        now = (s == pos)[:, None]
        kt = tl.where(now, k.to(tl.float32)[None, :], kt)
        vt = tl.where(now, v.to(tl.float32)[None, :], vt)
        scores = tl.where(s <= pos, tl.sum(kt * q[None, :], axis=1) * scale, float("-inf"))
        m = tl.max(scores, axis=0)
        p = tl.exp(scores - tl.where(m == float("-inf"), 0.0, m))  # a stretch past `pos`: all zero
        row = part_ptr + (h * tl.num_programs(1) + part) * (D + 2)
        tl.store(row + d, tl.sum(p[:, None] * vt, axis=0))
        tl.store(row + D, m)
        tl.store(row + D + 1, tl.sum(p, axis=0))

    @triton.jit
    def attention_combine_kernel(part_ptr, out_ptr, PARTS, D: tl.constexpr, BLOCK_P: tl.constexpr):
        # softmax over all positions from each stretch's (max, sum, weighted values)
        h = tl.program_id(0)
        i = tl.arange(0, BLOCK_P)
        d = tl.arange(0, D)
        ok = i < PARTS
        rows = part_ptr + (h * PARTS + i) * (D + 2)
        m = tl.load(rows + D, mask=ok, other=float("-inf"))
        total = tl.load(rows + D + 1, mask=ok, other=0.0)
        acc = tl.load(rows[:, None] + d[None, :], mask=ok[:, None], other=0.0)
        w = tl.exp(m - tl.max(m, axis=0))
        out = tl.sum(w[:, None] * acc, axis=0) / tl.sum(w * total, axis=0)
        tl.store(out_ptr + h * D + d, out.to(out_ptr.dtype.element_ty))

    return triton, attention_part_kernel, attention_combine_kernel


@cache
def one_kernel():
    """decode_attention_one's kernel, with the two pieces it is made of, which the layer kernel
    (labsupport.measure.kernels.megakernel) runs too: `stretch_kv`, a stretch's cached k and v,
    and `attend_stretch`, the rest of one (K/V head, stretch), the combine by the last included."""
    import triton
    import triton.language as tl

    _kernel()  # norm_rope_w, among this module's globals

    @triton.jit
    def tables(cos_ptr, sin_ptr, qn_ptr, kn_ptr, pos, D: tl.constexpr):
        # what the step after the QKV GEMV reads that no kernel of the step writes, so loaded before the
        # wait: the rotary row of `pos` (float32) and the q and k norms' weights, straight and rotated
        d = tl.arange(0, D)
        d_rot = (d + D // 2) % D
        cos = tl.load(cos_ptr + pos * D + d).to(tl.float32)
        sin = tl.load(sin_ptr + pos * D + d).to(tl.float32)
        return cos, sin, tl.load(qn_ptr + d), tl.load(qn_ptr + d_rot), tl.load(kn_ptr + d), tl.load(kn_ptr + d_rot)

    @triton.jit
    def norm_rope_rows(x_ptr, w, w_rot, d, d_rot, sign, cos, sin, eps, D: tl.constexpr):
        # norm_rope_w of G rows at once: x_ptr a [G] column of row starts
        x = tl.load(x_ptr[:, None] + d[None, :])
        xf, xr = x.to(tl.float32), tl.load(x_ptr[:, None] + d_rot[None, :]).to(tl.float32)
        r = 1.0 / tl.sqrt(tl.sum(xf * xf, axis=1) / D + eps)
        n = ((xf * r[:, None]).to(x.dtype) * w[None, :]).to(tl.float32)
        nr = ((xr * r[:, None]).to(x.dtype) * w_rot[None, :]).to(tl.float32)
        return (n * cos[None, :] + sign[None, :] * nr * sin[None, :]).to(x.dtype)

    globals().update(norm_rope_rows=norm_rope_rows)

    @triton.jit
    def stretch_kv(kc_ptr, vc_ptr, pos, kvh, part, D: tl.constexpr, SLOTS: tl.constexpr, BLOCK_S: tl.constexpr):
        # the cached k and v of one stretch of positions, those before the new token only (float32)
        d = tl.arange(0, D)
        s = part * BLOCK_S + tl.arange(0, BLOCK_S)
        at = kvh * SLOTS * D + s[:, None] * D + d[None, :]
        old = (s < pos)[:, None]
        kt = tl.load(kc_ptr + at, mask=old, other=0.0).to(tl.float32)
        vt = tl.load(vc_ptr + at, mask=old, other=0.0).to(tl.float32)
        return kt, vt

    @triton.jit
    def new_kv(kt, vt, qkv_ptr, kc_ptr, vc_ptr, kw, kw_rot, cos, sin, pos, kvh, write, eps,
               H: tl.constexpr, KVH: tl.constexpr, D: tl.constexpr, SLOTS: tl.constexpr, s):  # fmt: skip
        # the new token's k (normed, rotated) and v, written into the cache where `write`, and put in
        # the stretch's rows at `pos` from registers, not from the cache another program is writing
        d = tl.arange(0, D)
        d_rot = (d + D // 2) % D
        sign = tl.where(d < D // 2, -1.0, 1.0)
        k = norm_rope_w(qkv_ptr + (H + kvh) * D, kw, kw_rot, d, d_rot, sign, cos, sin, eps, D)  # noqa: F821
        v = tl.load(qkv_ptr + (H + KVH + kvh) * D + d)
        if write:
            tl.store(kc_ptr + kvh * SLOTS * D + pos * D + d, k)
            tl.store(vc_ptr + kvh * SLOTS * D + pos * D + d, v)
        now = (s == pos)[:, None]
        return tl.where(now, k.to(tl.float32)[None, :], kt), tl.where(now, v.to(tl.float32)[None, :], vt)

    @triton.jit
    def attend_stretch(
        kt, vt, cos, sin, qw, qw_rot, kw, kw_rot, qkv_ptr, kc_ptr, vc_ptr, pos, kvh, part, parts, part_ptr,
        count_ptr, out_ptr, eps, scale, H: tl.constexpr, KVH: tl.constexpr, D: tl.constexpr, SLOTS: tl.constexpr,
        BLOCK_S: tl.constexpr, CHUNK: tl.constexpr,
    ):  # fmt: skip
        # one (K/V head, stretch) once the QKV GEMV's output is there (the grouped form): the group's q
        # (and k) normed and rotated, the new k and v into the cache (stretch 0), the stretch's softmax
        # partials in one [G, BLOCK_S, D] product, and the combine of the group's stretches by the last
        # of `parts` programs to finish for this K/V head
        G: tl.constexpr = H // KVH
        d = tl.arange(0, D)
        heads = kvh * G + tl.arange(0, G)
        s = part * BLOCK_S + tl.arange(0, BLOCK_S)
        d_rot = (d + D // 2) % D
        sign = tl.where(d < D // 2, -1.0, 1.0)
        kt, vt = new_kv(kt, vt, qkv_ptr, kc_ptr, vc_ptr, kw, kw_rot, cos, sin, pos, kvh, part == 0, eps, H, KVH, D,
                        SLOTS, s)  # fmt: skip
        q = norm_rope_rows(qkv_ptr + heads * D, qw, qw_rot, d, d_rot, sign, cos, sin, eps, D).to(tl.float32)  # noqa: F821
        scores = tl.sum(q[:, None, :] * kt[None, :, :], axis=2) * scale  # [G, BLOCK_S]
        scores = tl.where((s <= pos)[None, :], scores, float("-inf"))
        m = tl.max(scores, axis=1)
        p = tl.exp(scores - tl.where(m == float("-inf"), 0.0, m)[:, None])
        rows = part_ptr + (heads * parts + part) * (D + 2)  # [G]
        tl.store(rows[:, None] + d[None, :], tl.sum(p[:, :, None] * vt[None, :, :], axis=1))
        tl.store(rows + D, m)
        tl.store(rows + D + 1, tl.sum(p, axis=1))
        # The last program of this K/V head combines its group's stretches (acq_rel: every other
        # program's stores above are visible to it), then resets the counter for the next call.
        if tl.atomic_add(count_ptr + kvh, 1) == parts - 1:
            combine_group(part_ptr, out_ptr, heads, parts, G, D, CHUNK)
            tl.atomic_xchg(count_ptr + kvh, 0)

    @triton.jit
    def attend_head(
        kt, vt, cos, sin, qw, qw_rot, kw, kw_rot, qkv_ptr, kc_ptr, vc_ptr, pos, h, part, parts, part_ptr, count_ptr,
        out_ptr, eps, scale, H: tl.constexpr, KVH: tl.constexpr, D: tl.constexpr, SLOTS: tl.constexpr,
        BLOCK_S: tl.constexpr, CHUNK: tl.constexpr,
    ):  # fmt: skip
        # attend_stretch for one query head h (the per-head form): its K/V head's first program writes
        # the new k and v, and the last of the head's `parts` programs combines its stretches
        G: tl.constexpr = H // KVH
        kvh = h // G
        d = tl.arange(0, D)
        s = part * BLOCK_S + tl.arange(0, BLOCK_S)
        d_rot = (d + D // 2) % D
        sign = tl.where(d < D // 2, -1.0, 1.0)
        kt, vt = new_kv(kt, vt, qkv_ptr, kc_ptr, vc_ptr, kw, kw_rot, cos, sin, pos, kvh, (h % G == 0) & (part == 0),
                        eps, H, KVH, D, SLOTS, s)  # fmt: skip
        q = norm_rope_w(qkv_ptr + h * D, qw, qw_rot, d, d_rot, sign, cos, sin, eps, D).to(tl.float32)  # noqa: F821
        score = tl.where(s <= pos, tl.sum(kt * q[None, :], axis=1) * scale, float("-inf"))  # [BLOCK_S]
        m = tl.max(score, axis=0)
        p = tl.exp(score - tl.where(m == float("-inf"), 0.0, m))
        row = part_ptr + (h * parts + part) * (D + 2)
        tl.store(row + d, tl.sum(p[:, None] * vt, axis=0))
        tl.store(row + D, m)
        tl.store(row + D + 1, tl.sum(p, axis=0))
        if tl.atomic_add(count_ptr + h, 1) == parts - 1:
            combine_head(part_ptr, out_ptr, h, parts, D, CHUNK)
            tl.atomic_xchg(count_ptr + h, 0)

    @triton.jit
    def combine_group(part_ptr, out_ptr, heads, parts, G: tl.constexpr, D: tl.constexpr, CHUNK: tl.constexpr):
        # the softmax over every stretch of the G heads `heads` at once, CHUNK stretches at a time
        d = tl.arange(0, D)
        first = heads * parts * (D + 2)  # [G]: each head's first stretch
        top = tl.full((G,), float("-inf"), tl.float32)
        for c in range(0, parts, CHUNK):
            i = c + tl.arange(0, CHUNK)
            at_i = first[:, None] + i[None, :] * (D + 2)
            top = tl.maximum(
                top, tl.max(tl.load(part_ptr + at_i + D, mask=(i < parts)[None, :], other=float("-inf")), axis=1)
            )
        num = tl.zeros((G, D), tl.float32)
        den = tl.zeros((G,), tl.float32)
        for c in range(0, parts, CHUNK):
            i = c + tl.arange(0, CHUNK)
            ok = (i < parts)[None, :]
            at_i = first[:, None] + i[None, :] * (D + 2)
            weight = tl.exp(tl.load(part_ptr + at_i + D, mask=ok, other=float("-inf")) - top[:, None])
            den += tl.sum(weight * tl.load(part_ptr + at_i + D + 1, mask=ok, other=0.0), axis=1)
            acc = tl.load(part_ptr + at_i[:, :, None] + d[None, None, :], mask=ok[:, :, None], other=0.0)
            num += tl.sum(weight[:, :, None] * acc, axis=1)
        out = num / den[:, None]
        tl.store(out_ptr + heads[:, None] * D + d[None, :], out.to(out_ptr.dtype.element_ty))

    @triton.jit
    def combine_head(part_ptr, out_ptr, h, parts, D: tl.constexpr, CHUNK: tl.constexpr):
        # the softmax over every stretch of head h, CHUNK stretches at a time: their maximum, then the sums
        d = tl.arange(0, D)
        first = part_ptr + h * parts * (D + 2)
        top = tl.full((CHUNK,), float("-inf"), tl.float32)
        for c in range(0, parts, CHUNK):
            i = c + tl.arange(0, CHUNK)
            top = tl.maximum(top, tl.load(first + i * (D + 2) + D, mask=i < parts, other=float("-inf")))
        most = tl.max(top, axis=0)
        num = tl.zeros((D,), tl.float32)
        den = tl.zeros((CHUNK,), tl.float32)
        for c in range(0, parts, CHUNK):
            i = c + tl.arange(0, CHUNK)
            ok = i < parts
            weight = tl.exp(tl.load(first + i * (D + 2) + D, mask=ok, other=float("-inf")) - most)
            den += weight * tl.load(first + i * (D + 2) + D + 1, mask=ok, other=0.0)
            acc = tl.load(first + i[:, None] * (D + 2) + d[None, :], mask=ok[:, None], other=0.0)
            num += tl.sum(weight[:, None] * acc, axis=0)
        tl.store(out_ptr + h * D + d, (num / tl.sum(den, axis=0)).to(out_ptr.dtype.element_ty))

    # (tl too: Triton's interpreter looks for it there when the layer kernel calls these)
    globals().update(tables=tables, stretch_kv=stretch_kv, new_kv=new_kv, attend_stretch=attend_stretch,
                     attend_head=attend_head, combine_group=combine_group, combine_head=combine_head,
                     tl=tl)  # fmt: skip

    @triton.jit
    def attention_kernel(
        qkv_ptr, qn_ptr, kn_ptr, cos_ptr, sin_ptr, kc_ptr, vc_ptr, pos_ptr, part_ptr, count_ptr, out_ptr, eps,
        scale, H: tl.constexpr, KVH: tl.constexpr, D: tl.constexpr, SLOTS: tl.constexpr, BLOCK_S: tl.constexpr,
        CHUNK: tl.constexpr, PDL: tl.constexpr, PER_HEAD: tl.constexpr,
    ):  # fmt: skip
        who, part = tl.program_id(0), tl.program_id(1)  # who: the K/V head, or with PER_HEAD the query head
        kvh = who // (H // KVH) if PER_HEAD else who
        # Before the wait: what no kernel of this step writes (the cached positions before the new
        # token, the rotary row, the norms' weights).
        pos = tl.load(pos_ptr)
        kt, vt = stretch_kv(kc_ptr, vc_ptr, pos, kvh, part, D, SLOTS, BLOCK_S)
        cos, sin, qw, qw_rot, kw, kw_rot = tables(cos_ptr, sin_ptr, qn_ptr, kn_ptr, pos, D)
        if PDL:  # the QKV GEMV's output is read from here on
            tl.extra.cuda.gdc_wait()
            tl.extra.cuda.gdc_launch_dependents()
        if PER_HEAD:
            attend_head(
                kt, vt, cos, sin, qw, qw_rot, kw, kw_rot, qkv_ptr, kc_ptr, vc_ptr, pos, who, part, tl.num_programs(1),
                part_ptr, count_ptr, out_ptr, eps, scale, H, KVH, D, SLOTS, BLOCK_S, CHUNK,
            )  # fmt: skip
        else:
            attend_stretch(
                kt, vt, cos, sin, qw, qw_rot, kw, kw_rot, qkv_ptr, kc_ptr, vc_ptr, pos, kvh, part, tl.num_programs(1),
                part_ptr, count_ptr, out_ptr, eps, scale, H, KVH, D, SLOTS, BLOCK_S, CHUNK,
            )  # fmt: skip

    return SimpleNamespace(
        triton=triton, kernel=attention_kernel, stretch_kv=stretch_kv, tables=tables, attend_stretch=attend_stretch
    )


_COUNTERS: dict = {}
# The stretch lengths (positions per program) decode_attention_one is tuned over, grouped and per
# head. The two-kernel form keeps 32: 32 query heads x 9 stretches at 256 tokens already give a few
# hundred programs; the grouped one kernel runs one program per K/V head and stretch (8 K/V heads in
# Qwen3-8B), so at 32 positions it leaves half an H100 idle; the per-head form has four times its
# programs, so it is tried at longer stretches (at 8, 272 slots would make over a thousand programs).
ONE_BLOCKS = (8, 16, 32)
HEAD_BLOCKS = (16, 32, 64)
ONE_WARPS = (4, 8)
# A thread's share of the grouped product [G, BLOCK_S, D] in float32 registers, at most. (Closing-the-
# gap 20261205T191713Z-h200 ran it with 128 a thread, 32 positions on 4 warps: 13.6 us a call, and 20
# us of a step's layer by exclusive time, against 8 for the two kernels. 20261206T041852Z-h100-80gb-
# hbm3 then found one head after another in one program 1.5 to 3 times slower than the grouped
# product, and a combine cut into tiles of 32 floats a thread 1.3 to 2.3 us slower than one pass:
# what bounds the kernel is its chain of dependent steps after the wait, which for the grouped form is
# some 3,200 instructions of reductions across the [G, BLOCK_S, D] tile at 16 positions on 4 warps,
# against some 700 for one head's [BLOCK_S, D], compiled for sm_90 by Triton 3.9.)
PRODUCT_FLOATS = 64


@dataclass(frozen=True)
class OneConfig:
    """How decode_attention_one runs: positions per program, warps per program, and whether a program
    serves one query head (`per_head`) or every query head of its K/V head in one product; `cluster`:
    per head, in the CUDA C++ kernel whose stretches of a head combine on chip (cluster_attention)."""

    block_s: int
    num_warps: int = 4
    per_head: bool = False
    cluster: bool = False


# The configs tune_one may time (tuned_configs: those whose grouped product fits), and the one
# chosen per shape (kv_heads, slots, head_dim, group).
ONE_CANDIDATES = [
    *(OneConfig(b, w) for b in ONE_BLOCKS for w in ONE_WARPS),
    *(OneConfig(b, w, per_head=True) for b in HEAD_BLOCKS for w in ONE_WARPS),
]
CHOSEN_ONE: dict = {}
# The cluster kernel's configs: 16 positions a warp (cluster_attention.BLOCKS, those that keep a 256-
# token prompt's stretches within a cluster).
CLUSTER_CANDIDATES = [OneConfig(b, b // 16, per_head=True, cluster=True) for b in (64, 128)]


def filling_block(slots: int, kv_heads: int, sms: int) -> int:
    """The longest stretch of ONE_BLOCKS that still gives at least one program per SM (the
    shortest where none does): the stretch decode_attention_one runs untuned."""
    fits = [b for b in ONE_BLOCKS if kv_heads * -(-slots // b) >= sms]
    return max(fits) if fits else min(ONE_BLOCKS)


def fits_grouped(block_s: int, group: int, head_dim: int, num_warps: int) -> bool:
    """Whether the grouped product [group, block_s, head_dim] holds PRODUCT_FLOATS a thread or fewer."""
    return group * block_s * head_dim <= PRODUCT_FLOATS * 32 * num_warps


def tuned_configs(group: int, head_dim: int, cluster_for: tuple | None = None) -> list[OneConfig]:
    """The configs of ONE_CANDIDATES that tune_one times for heads of `head_dim`, `group` a K/V head:
    every per-head one, the grouped ones where their product fits (fits_grouped); with `cluster_for`
    (slots, dtype), the CLUSTER_CANDIDATES that fit a cache of that many positions in that dtype too
    (cluster_attention.fits)."""
    mine = [c for c in ONE_CANDIDATES if c.per_head or fits_grouped(c.block_s, group, head_dim, c.num_warps)]
    if cluster_for is None:
        return mine
    from labsupport.measure.kernels import cluster_attention

    slots, dtype = cluster_for
    return mine + [c for c in CLUSTER_CANDIDATES if cluster_attention.fits(slots, c.block_s, head_dim, dtype)]


def combine_chunk(parts: int) -> int:
    """The stretches the last program combines at a time: all of `parts` in one pass (a power of two at
    or past it) up to 32, which on an H100 beat smaller tiles (the comment above PRODUCT_FLOATS)."""
    chunk = 1
    while chunk < min(parts, 32):
        chunk *= 2
    return chunk


def counters(n: int, device):
    """The int32 counters of decode_attention_one, one per K/V head (or per query head in the per-head
    form), `n` of them: zeroed once, made on first use (the warm-up runs before any CUDA-graph
    capture), and zeroed again by each head's last program."""
    import torch

    key = (n, str(device))
    if key not in _COUNTERS:
        _COUNTERS[key] = torch.zeros(n, device=device, dtype=torch.int32)
    return _COUNTERS[key]


def decode_attention(
    qkv, q_norm, k_norm, cos, sin, k_cache, v_cache, pos, heads: int, eps: float, block_s: int = 32
):  # fmt: skip
    """Attention output [heads * head_dim] of one token from its fused q|k|v vector; writes the
    token's k and v into k_cache / v_cache ([1, kv_heads, slots, head_dim]) at `pos` ([1])."""
    import torch

    triton, part_kernel, combine_kernel = _kernel()
    _, kv_heads, slots, head_dim = k_cache.shape
    parts = triton.cdiv(slots, block_s)
    partial = torch.empty(heads, parts, head_dim + 2, device=qkv.device, dtype=torch.float32)
    part_kernel[(heads, parts)](
        qkv.reshape(-1), q_norm, k_norm, cos, sin, k_cache, v_cache, pos, partial, eps, head_dim**-0.5,
        H=heads, KVH=kv_heads, D=head_dim, SLOTS=slots, BLOCK_S=block_s, num_warps=4,
    )  # fmt: skip
    out = torch.empty(heads * head_dim, device=qkv.device, dtype=qkv.dtype)
    combine_kernel[(heads,)](partial, out, parts, D=head_dim, BLOCK_P=triton.next_power_of_2(parts), num_warps=4)
    return out


def decode_attention_one(
    qkv, q_norm, k_norm, cos, sin, k_cache, v_cache, pos, heads: int, eps: float, config: OneConfig | None = None,
    pdl: bool = False, chunk: int | None = None,
):  # fmt: skip
    """decode_attention's result in one kernel (module docstring); `pdl`: launched with
    programmatic dependent launch, what the step does not write read before the wait. `config`
    None: the one tune_one chose for this shape, else filling_block's stretch on 4 warps, grouped
    where it fits, else per head; `chunk` None: combine_chunk's."""
    import torch

    _, kv_heads, slots, head_dim = k_cache.shape
    group = heads // kv_heads
    if group * kv_heads != heads or group & (group - 1):
        raise ValueError(f"one-kernel attention needs a power of two query heads per K/V head, not {heads}/{kv_heads}")
    if config is None:
        config = CHOSEN_ONE.get((kv_heads, slots, head_dim, group))
    if config is None:
        block = filling_block(slots, kv_heads, _sms(qkv.device))
        config = OneConfig(block, 4, per_head=not fits_grouped(block, group, head_dim, 4))
    if config.cluster:
        from labsupport.measure.kernels import cluster_attention

        return cluster_attention.attention(
            qkv, q_norm, k_norm, cos, sin, k_cache, v_cache, pos, heads, eps, config.block_s, pdl
        )  # fmt: skip
    one = one_kernel()
    triton, kernel = one.triton, one.kernel
    parts = triton.cdiv(slots, config.block_s)
    chunk = chunk or combine_chunk(parts)
    partial = torch.empty(heads, parts, head_dim + 2, device=qkv.device, dtype=torch.float32)
    out = torch.empty(heads * head_dim, device=qkv.device, dtype=qkv.dtype)
    extra = {"launch_pdl": True} if pdl else {}
    who = heads if config.per_head else kv_heads
    kernel[(who, parts)](
        qkv.reshape(-1), q_norm, k_norm, cos, sin, k_cache, v_cache, pos, partial, counters(who, qkv.device),
        out, eps, head_dim**-0.5, H=heads, KVH=kv_heads, D=head_dim, SLOTS=slots, BLOCK_S=config.block_s, CHUNK=chunk,
        PDL=pdl, PER_HEAD=config.per_head, num_warps=config.num_warps, **extra,
    )  # fmt: skip
    return out


def _sms(device) -> int:
    """The SMs of `device` (on a CPU, the tests' interpreter: one)."""
    import torch

    return torch.cuda.get_device_properties(device).multi_processor_count if torch.device(device).type == "cuda" else 1


def tune_one(heads: int, kv_heads: int, head_dim: int, slots: int, pos: int, dtype, repeats: int = 20) -> list[dict]:
    """Time decode_attention_one with each of tuned_configs (the cluster kernel's where it builds and
    fits, else a row saying why not) on one layer's shapes (a cache of `slots`
    positions, the new token at `pos`), as it runs in a decode step's CUDA graph: many calls captured
    in one graph, each on its own copy of the cache so that none is read from L2, and on a GPU with
    programmatic dependent launch each launched with it, as the step launches it, so that a call's
    reads before its wait overlap the call before; keep the fastest in CHOSEN_ONE and return one row
    per config (block_s, num_warps, per_head, cluster, programs, us, status, chosen). A config that fails is a
    row with its reason; if none runs, this raises."""
    import torch

    from labsupport.measure import hardware
    from labsupport.measure.kernels.weight_timing import weight_copies

    dev = "cuda"
    group = heads // kv_heads
    layer_bytes = 2 * kv_heads * slots * head_dim * torch.empty((), dtype=dtype).element_size()
    copies = weight_copies(layer_bytes, torch.cuda.get_device_properties(0).L2_cache_size)
    caches = [
        (torch.randn(1, kv_heads, slots, head_dim, device=dev, dtype=dtype),
         torch.randn(1, kv_heads, slots, head_dim, device=dev, dtype=dtype)) for _ in range(copies)
    ]  # fmt: skip
    qkv = torch.randn((heads + 2 * kv_heads) * head_dim, device=dev, dtype=dtype)
    qn, kn = torch.ones(head_dim, device=dev, dtype=dtype), torch.ones(head_dim, device=dev, dtype=dtype)
    cos, sin = (torch.randn(slots, head_dim, device=dev, dtype=dtype) for _ in range(2))
    at = torch.tensor([pos], device=dev)
    pdl = hardware.dependent_launch()
    from labsupport.measure.kernels import cluster_attention

    def row_of(c: OneConfig, status: str) -> dict:
        return {"block_s": c.block_s, "num_warps": c.num_warps, "per_head": c.per_head, "cluster": c.cluster,
                "programs": (heads if c.per_head else kv_heads) * -(-slots // c.block_s), "us": float("nan"),
                "status": status}  # fmt: skip

    configs = tuned_configs(group, head_dim, cluster_for=(slots, dtype))
    why_not = cluster_attention.unusable(dev) if any(c.cluster for c in configs) else "none fits these shapes"
    rows = [row_of(c, f"not run: {why_not}") for c in CLUSTER_CANDIDATES if why_not]
    for c in [c for c in configs if not (c.cluster and why_not)]:

        def calls(c=c):  # (the first, outside the capture, compiles the kernel and makes the counters)
            for kc, vc in caches:
                decode_attention_one(qkv, qn, kn, cos, sin, kc, vc, at, heads, 1e-6, config=c, pdl=pdl)

        row = row_of(c, "ok")
        try:
            row["us"] = hardware.graph_us_per_call(calls, copies, repeats=repeats)
        except Exception as e:  # (one that does not compile, say, on this GPU's Triton)
            row["status"] = f"failed: {type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"
        rows.append(row)
    ok = [r for r in rows if r["status"] == "ok"]
    if not ok:
        raise RuntimeError(f"no config of the one-kernel attention ran: {rows[0]['status']}")
    best = min(ok, key=lambda r: r["us"])
    for r in rows:
        r["chosen"] = r is best
    CHOSEN_ONE[(kv_heads, slots, head_dim, group)] = OneConfig(
        best["block_s"], best["num_warps"], best["per_head"], best["cluster"]
    )  # fmt: skip
    return rows
