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

Triton is imported on first use; on a CPU set TRITON_INTERPRET=1 first (no bfloat16 there).
"""

from __future__ import annotations

from functools import cache


@cache
def _kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def norm_rope(x_ptr, w_ptr, d, d_rot, sign, cos, sin, eps, D: tl.constexpr):
        # Qwen3's per-head RMSNorm (float32 statistic, rounded, times the weight, rounded), then
        # the rotary embedding x * cos + rotate_half(x) * sin, rounded to the input's dtype.
        x = tl.load(x_ptr + d)
        xf, xr = x.to(tl.float32), tl.load(x_ptr + d_rot).to(tl.float32)
        r = 1.0 / tl.sqrt(tl.sum(xf * xf, axis=0) / D + eps)
        n = ((xf * r).to(x.dtype) * tl.load(w_ptr + d)).to(tl.float32)
        nr = ((xr * r).to(x.dtype) * tl.load(w_ptr + d_rot)).to(tl.float32)
        return (n * cos + sign * nr * sin).to(x.dtype)

    # Triton resolves the functions a kernel calls among its module's globals, not a closure's.
    globals()["norm_rope"] = norm_rope

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
