"""Everything between the QKV matmul and o_proj of one decode step, as one Triton kernel.

After the fused Q/K/V matmul, Qwen3's attention does, per head: RMSNorm of q and of k over the
head (q_norm, k_norm), the rotary embedding, the new k and v written into the KV cache, then
attention of q over every cached position. Written in PyTorch and compiled, that is about six
kernels, each a few microseconds; here it is one. One program per query head: it normalises
and rotates its q (and its group's k), the first head of each group writes k and v into the
cache, and it attends over the cache in chunks of BLOCK_S positions with a running softmax
(the new position's k and v come from registers, not from the cache another program writes).

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
    def decode_attention_kernel(
        qkv_ptr, qn_ptr, kn_ptr, cos_ptr, sin_ptr, kc_ptr, vc_ptr, pos_ptr, out_ptr, eps, scale,
        H: tl.constexpr, KVH: tl.constexpr, D: tl.constexpr, SLOTS: tl.constexpr, BLOCK_S: tl.constexpr,
    ):  # fmt: skip
        h = tl.program_id(0)
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
        if h % (H // KVH) == 0:  # one program per group writes the new position into the cache
            tl.store(kc_ptr + cache_at + pos * D + d, k)
            tl.store(vc_ptr + cache_at + pos * D + d, v)
        kf, vf = k.to(tl.float32), v.to(tl.float32)
        m = tl.full((), float("-inf"), tl.float32)
        total = tl.zeros((), tl.float32)
        acc = tl.zeros((D,), tl.float32)
        for start in range(0, pos + 1, BLOCK_S):
            s = start + tl.arange(0, BLOCK_S)
            old = (s < pos)[:, None]
            at = cache_at + s[:, None] * D + d[None, :]
            kt = tl.load(kc_ptr + at, mask=old, other=0.0).to(tl.float32)
            vt = tl.load(vc_ptr + at, mask=old, other=0.0).to(tl.float32)
            now = (s == pos)[:, None]
            kt = tl.where(now, kf[None, :], kt)
            vt = tl.where(now, vf[None, :], vt)
            scores = tl.where(s <= pos, tl.sum(kt * q[None, :], axis=1) * scale, float("-inf"))
            m_new = tl.maximum(m, tl.max(scores, axis=0))
            p = tl.exp(scores - m_new)
            alpha = tl.exp(m - m_new)
            total = total * alpha + tl.sum(p, axis=0)
            acc = acc * alpha + tl.sum(p[:, None] * vt, axis=0)
            m = m_new
        tl.store(out_ptr + h * D + d, (acc / total).to(v.dtype))

    return decode_attention_kernel


def decode_attention(qkv, q_norm, k_norm, cos, sin, k_cache, v_cache, pos, heads: int, eps: float, block_s: int = 64):
    """Attention output [heads * head_dim] of one token from its fused q|k|v vector; writes the
    token's k and v into k_cache / v_cache ([1, kv_heads, slots, head_dim]) at `pos` ([1])."""
    import torch

    _, kv_heads, slots, head_dim = k_cache.shape
    out = torch.empty(heads * head_dim, device=qkv.device, dtype=qkv.dtype)
    _kernel()[(heads,)](
        qkv.reshape(-1), q_norm, k_norm, cos, sin, k_cache, v_cache, pos, out, eps, head_dim**-0.5,
        H=heads, KVH=kv_heads, D=head_dim, SLOTS=slots, BLOCK_S=block_s, num_warps=4,
    )  # fmt: skip
    return out
