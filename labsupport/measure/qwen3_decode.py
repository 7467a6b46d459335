"""A Qwen3 decode step written out in plain PyTorch, in the manner of gpt-fast: the whole
forward pass in one screen, using the weights of a transformers model, so that each fix of
*Closing the gap* is one switch here.

    Options.fused      Q/K/V as one matrix multiply, gate/up as one (weights concatenated once)
    Options.matmul     "torch" (cuBLAS through F.linear) or "triton" (labsupport.measure.gemv)
    Options.fuse_gemv  with "triton": RMSNorm, SiLU x up and the residual adds done inside the GEMVs
    Options.fused_attention  q/k norms, rotary, cache write and attention in two kernels of ours

The decoder layer is compiled once with torch.compile (every layer has the same shapes, its
weights are arguments) and the whole step, 36 compiled layers and the LM head, is captured
in one CUDA graph. The KV cache is a fixed-size tensor per layer; a step at position p
writes slot p and attends over the slots up to p through a mask, so every replay at the
same position does identical work (as transformers' StaticCache step does).
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from functools import cache, partial


@dataclass(frozen=True)
class Options:
    fused: bool = False
    matmul: str = "torch"  # or "triton"
    fuse_gemv: bool = False
    fused_attention: bool = False  # q/k norms, rotary, cache write and attention in two kernels of ours

    def __post_init__(self):
        if self.matmul not in ("torch", "triton"):
            raise ValueError(f"matmul must be 'torch' or 'triton', not {self.matmul!r}")
        if self.fuse_gemv and not (self.fused and self.matmul == "triton"):
            raise ValueError("fuse_gemv needs fused=True and matmul='triton'")
        if self.fused_attention and not self.fused:
            raise ValueError("fused_attention needs fused=True (it reads the fused q|k|v vector)")


@cache
def ops():
    """Our Triton kernels as PyTorch custom operators, which torch.compile calls as they are:
    (gemv, decode_attention)."""
    import torch

    from labsupport.measure import decode_attention, gemv

    # The schemas are written out: this module's annotations are strings (PEP 563).
    @torch.library.custom_op(
        "labsupport::gemv",
        mutates_args=(),
        schema="(Tensor x, Tensor w, Tensor? norm_weight, float eps, bool silu, Tensor? residual) -> Tensor",
    )
    def gemv_op(x, w, norm_weight, eps, silu, residual):
        return gemv.gemv(x, w, norm_weight=norm_weight, eps=eps, silu=silu, residual=residual)

    @gemv_op.register_fake
    def _(x, w, norm_weight, eps, silu, residual):
        return x.new_empty(*x.shape[:-1], w.shape[0] // 2 if silu else w.shape[0])

    @torch.library.custom_op(
        "labsupport::decode_attention",
        mutates_args=("k_cache", "v_cache"),
        schema="(Tensor qkv, Tensor q_norm, Tensor k_norm, Tensor cos, Tensor sin, Tensor(a!) k_cache, "
        "Tensor(b!) v_cache, Tensor pos, int heads, float eps) -> Tensor",
    )
    def attention_op(qkv, q_norm, k_norm, cos, sin, k_cache, v_cache, pos, heads, eps):
        return decode_attention.decode_attention(qkv, q_norm, k_norm, cos, sin, k_cache, v_cache, pos, heads, eps)

    @attention_op.register_fake
    def _(qkv, q_norm, k_norm, cos, sin, k_cache, v_cache, pos, heads, eps):
        return qkv.new_empty(heads * k_cache.shape[-1])

    return gemv_op, attention_op


def rmsnorm(x, weight, eps):
    """Qwen3's RMSNorm: statistics in float32, weight applied in the input's dtype."""
    import torch

    xf = x.float()
    return weight * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def rotate_half(x):
    import torch

    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


@dataclass
class Shape:
    heads: int
    kv_heads: int
    head_dim: int
    eps: float


def layer(x, pos, cos, sin, k_cache, v_cache, *w, shape: Shape, opts: Options, kernels=None):
    """One decoder layer on x [B, T, hidden] at positions pos [T]; writes the cache in place.
    `w`: input norm, post-attention norm, q norm, k norm, the attention input weight(s)
    (Q, K, V or QKV), o_proj, the MLP input weight(s) (gate, up or gate-up), down_proj.
    `kernels`: ops(), our kernels, used for a single token as opts asks."""
    import torch.nn.functional as F

    s, eps = shape, shape.eps
    n_in = 1 if opts.fused else 3
    in_norm, post_norm, q_norm, k_norm = w[:4]
    attn_in, wo = w[4 : 4 + n_in], w[4 + n_in]
    mlp_in, wdown = w[5 + n_in : -1], w[-1]
    one_token = x.shape[1] == 1 and kernels is not None
    gemv = kernels[0] if one_token and opts.matmul == "triton" else None

    def mm(v, weight, norm=None, silu=False, residual=None):
        if gemv is None:
            return F.linear(v, weight)
        return gemv(v, weight, norm, eps, silu, residual)

    fuse = opts.fuse_gemv and gemv is not None
    h = x if fuse else rmsnorm(x, in_norm, eps)
    qkv = [mm(h, wi, norm=in_norm if fuse else None) for wi in attn_in]
    if opts.fused_attention and one_token:
        a = kernels[1](qkv[0], q_norm, k_norm, cos, sin, k_cache, v_cache, pos, s.heads, eps).view(1, 1, -1)
    else:
        a = attention(qkv, pos, cos, sin, k_cache, v_cache, q_norm, k_norm, s, opts.fused)
    x = mm(a, wo, residual=x) if fuse else x + mm(a, wo)
    if fuse:  # the gate/up weight is interleaved (gemv.interleave): its GEMV writes silu(gate) * up
        return mm(mm(x, mlp_in[0], norm=post_norm, silu=True), wdown, residual=x)
    h = rmsnorm(x, post_norm, eps)
    gu = [mm(h, wi) for wi in mlp_in]
    if opts.fuse_gemv:  # the prompt, with the interleaved gate/up weight: rows gate_i, up_i
        gate, up = gu[0].unflatten(-1, (-1, 2)).unbind(-1)
    else:
        gate, up = gu[0].chunk(2, dim=-1) if opts.fused else gu
    return x + mm(F.silu(gate) * up, wdown)


def attention(qkv, pos, cos, sin, k_cache, v_cache, q_norm, k_norm, s: Shape, fused: bool):
    """Qwen3's attention between the QKV and o_proj matmuls, in PyTorch: q/k norms, rotary
    embedding, the new k and v written into the cache, grouped attention over the cache."""
    import torch

    eps = s.eps
    b, t, _ = qkv[0].shape
    if not fused:
        q, k, v = qkv
    else:
        q, k, v = qkv[0].split([s.heads * s.head_dim, s.kv_heads * s.head_dim, s.kv_heads * s.head_dim], dim=-1)
    q = rmsnorm(q.view(b, t, s.heads, s.head_dim), q_norm, eps).transpose(1, 2)
    k = rmsnorm(k.view(b, t, s.kv_heads, s.head_dim), k_norm, eps).transpose(1, 2)
    v = v.view(b, t, s.kv_heads, s.head_dim).transpose(1, 2)
    c, sn = cos[pos], sin[pos]  # [T, head_dim]
    q, k = q * c + rotate_half(q) * sn, k * c + rotate_half(k) * sn
    k_cache.index_copy_(2, pos, k)
    v_cache.index_copy_(2, pos, v)
    # Each K/V head serves heads // kv_heads query heads.
    g = s.heads // s.kv_heads
    qg = q.reshape(b, s.kv_heads, g * t, s.head_dim)
    scores = (qg @ k_cache.transpose(2, 3)).float() * s.head_dim**-0.5
    visible = torch.arange(k_cache.shape[2], device=qg.device)[None, :] <= pos[:, None]  # [T, slots]
    scores = scores.masked_fill(~visible.repeat(g, 1), float("-inf"))
    a = (scores.softmax(-1).to(qg.dtype) @ v_cache).reshape(b, s.heads, t, s.head_dim)
    return a.transpose(1, 2).reshape(b, t, s.heads * s.head_dim)


class Qwen3Decoder:
    """The weights of a transformers Qwen3 model (shared, or concatenated once when fused), a
    KV cache of `max_len` slots per layer, and the forward pass above."""

    def __init__(self, model, max_len: int, opts: Options):
        import torch

        from labsupport.measure import gemv

        cfg, m = model.config, model.model
        self.opts, self.max_len = opts, max_len
        self.shape = Shape(cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, cfg.rms_norm_eps)
        self.embed, self.norm, self.lm_head = m.embed_tokens.weight, m.norm.weight, model.lm_head.weight
        self.weights = []
        for lyr in m.layers:
            a, p = lyr.self_attn, lyr.mlp
            attn = [a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]
            mlp = [p.gate_proj.weight, p.up_proj.weight]
            if opts.fused:
                attn = [torch.cat(attn).contiguous()]
                mlp = [gemv.interleave(*mlp) if opts.fuse_gemv else torch.cat(mlp).contiguous()]
            norms = [lyr.input_layernorm.weight, lyr.post_attention_layernorm.weight, a.q_norm.weight, a.k_norm.weight]
            self.weights.append((*norms, *attn, a.o_proj.weight, *mlp, p.down_proj.weight))
        dev, dt = self.embed.device, self.embed.dtype
        kv = (1, cfg.num_key_value_heads, max_len, cfg.head_dim)
        self.k_cache = [torch.zeros(kv, device=dev, dtype=dt) for _ in m.layers]
        self.v_cache = [torch.zeros(kv, device=dev, dtype=dt) for _ in m.layers]
        theta = model.config.rope_parameters["rope_theta"] if hasattr(cfg, "rope_parameters") else cfg.rope_theta
        inv = 1.0 / (theta ** (torch.arange(0, cfg.head_dim, 2, device=dev, dtype=torch.float32) / cfg.head_dim))
        freqs = torch.outer(torch.arange(max_len, device=dev, dtype=torch.float32), inv)
        emb = torch.cat((freqs, freqs), dim=-1)
        self.cos, self.sin = emb.cos().to(dt), emb.sin().to(dt)
        self.kernels = ops() if opts.matmul == "triton" or opts.fused_attention else None
        self.layer_eager = partial(layer, shape=self.shape, opts=opts, kernels=self.kernels)
        self.layer_step = self.layer_eager

    def compile(self):
        """Compile the decoder layer (once: every layer has the same shapes)."""
        import torch

        self.layer_step = torch.compile(self.layer_eager, fullgraph=True, dynamic=False)

    def forward(self, tokens, pos, step: bool = True):
        """Logits of the last position for tokens [B, T] at positions pos [T]; `step` uses the
        (compiled) step layer, else the eager one (the prefill)."""
        import torch.nn.functional as F

        fn = self.layer_step if step else self.layer_eager
        x = F.embedding(tokens, self.embed)
        for w, kc, vc in zip(self.weights, self.k_cache, self.v_cache, strict=True):
            x = fn(x, pos, self.cos, self.sin, kc, vc, *w)
        x, eps = x[:, -1:], self.shape.eps
        if not (step and self.opts.matmul == "triton"):
            return F.linear(rmsnorm(x, self.norm, eps), self.lm_head)[:, -1]
        if self.opts.fuse_gemv:  # the final norm as one Triton kernel: inside the LM head's GEMV, the
            # norm's weight would be read again by each of its ~19,000 programs (measured slower)
            from labsupport.measure import triton_kernels

            x = triton_kernels.rmsnorm(x, self.norm, eps)
        else:
            x = rmsnorm(x, self.norm, eps)
        return self.kernels[0](x, self.lm_head, None, eps, False, None)[:, -1]


class OwnStep:
    """One decode step of Qwen3Decoder at position `len(prompt)`, after a prefill of the
    prompt, fed `token`: compiled, and on a GPU captured in a CUDA graph. Returns (logits,
    next token); every call redoes the same step (same slot, same input)."""

    def __init__(self, model, prompt_ids, token, opts: Options, compile: bool = True, graph: bool = True):
        import torch

        n = prompt_ids.shape[1]
        self.dec = Qwen3Decoder(model, n + 16, opts)
        dev = prompt_ids.device
        with torch.no_grad():
            self.dec.forward(prompt_ids, torch.arange(n, device=dev), step=False)
        self.tok, self.pos = token.reshape(1, 1).clone(), torch.tensor([n], device=dev)
        self.compile_s = 0.0
        t = time.perf_counter()
        if compile:
            self.dec.compile()
        side = torch.cuda.Stream() if dev.type == "cuda" else None
        if side is not None:
            side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side) if side is not None else contextlib.nullcontext(), torch.no_grad():
            for _ in range(3):  # compile, and run every kernel once, before any capture
                self.run()
        if side is not None:
            torch.cuda.current_stream().wait_stream(side)
            torch.cuda.synchronize()
        self.compile_s = time.perf_counter() - t
        self.graph = None
        if graph and dev.type == "cuda":
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph), torch.no_grad():
                self.out = self.run()

    def run(self):
        logits = self.dec.forward(self.tok, self.pos)
        return logits, logits.argmax(-1, keepdim=True)

    def __call__(self):
        import torch

        if self.graph is not None:
            self.graph.replay()
            return self.out
        with torch.no_grad():
            return self.run()
