"""A Qwen3 decode step written out in plain PyTorch, in the manner of gpt-fast: the whole
forward pass in one screen, using the weights of a transformers model, so that each fix of
*Closing the gap* is one switch here.

    Options.fused      Q/K/V as one matrix multiply, gate/up as one (weights concatenated once)
    Options.matmul     "torch" (cuBLAS through F.linear) or "triton" (labsupport.measure.kernels.gemv)
    Options.fuse_gemv  with "triton": RMSNorm, SiLU x up and the residual adds done inside the GEMVs
    Options.fused_attention  q/k norms, rotary, cache write and attention in two kernels of ours
    Options.split_k    with "triton": the tuned split-K configs allowed (the smaller matrices)
    Options.pdl        with "triton": our GEMVs launched with programmatic dependent launch
    Options.early_weights  with pdl: each GEMV loads its first tile (or two) of weights before it waits
    Options.one_attention  with fused_attention and pdl: attention in one kernel, PDL-launched, the
                       cached positions read before it waits (decode_attention.decode_attention_one)
    Options.fold_norms  with fuse_gemv: each RMSNorm's weight folded into the matrix after it
                       once, its Σx² summed by the kernel that writes x (a row of partial sums
                       read by the GEMV after), and the greedy token picked in the LM head's epilogue: no
                       final norm or argmax kernel (labsupport.measure.kernels.folded_norms); with fp8, the
                       folded matrices are the ones rounded to E4M3
    Options.persistent  with pdl and fold_norms, not fp8: every GEMV of the step in persistent form, a few
                       programs per SM walking the matrix's rows (labsupport.measure.kernels.persistent_gemv)
    Options.layer_kernel  with fold_norms and one_attention: each decoder layer in ONE persistent kernel,
                       its four GEMVs and attention stages joined by counters (labsupport.measure.kernels.megakernel)
    Options.step_kernel  with layer_kernel: the whole step after the embedding row in ONE kernel, every layer's
                       stages and the LM head's (megakernel.step)
    Options.fp8        with fuse_gemv: every matrix in FP8 E4M3 with row scales (gemv_fp8)

VerifyStep runs the same decoder on T tokens at once (a verify pass of speculative decoding):
the weights read once for T tokens; its matmuls are cuBLAS's (F.linear), our GEMV taking one vector.

The decoder layer is compiled once with torch.compile (every layer has the same shapes, its
weights are arguments) and the whole step, 36 compiled layers and the LM head, is captured
in one CUDA graph. The KV cache is a fixed-size tensor per layer; a step at position p
writes slot p and attends over the slots up to p through a mask, so every replay at the
same position does identical work (as transformers' StaticCache step does).
"""

from __future__ import annotations

import contextlib
import time
import weakref
from dataclasses import dataclass
from functools import cache, partial
from typing import NamedTuple

from labsupport.measure.kernels import folded_norms, gemv_fp8
from labsupport.measure.kernels.folded_norms import READ_ATTENDED, READ_INPUT, WRITE_ATTENDED, WRITE_OUTPUT


@dataclass(frozen=True)
class Options:
    fused: bool = False
    matmul: str = "torch"  # or "triton"
    fuse_gemv: bool = False
    fused_attention: bool = False  # q/k norms, rotary, cache write and attention in two kernels of ours
    split_k: bool = False
    pdl: bool = False
    fp8: bool = False
    early_weights: bool = False
    one_attention: bool = False
    fold_norms: bool = False
    persistent: bool = False
    layer_kernel: bool = False
    step_kernel: bool = False

    def __post_init__(self):
        if self.matmul not in ("torch", "triton"):
            raise ValueError(f"matmul must be 'torch' or 'triton', not {self.matmul!r}")
        if self.fuse_gemv and not (self.fused and self.matmul == "triton"):
            raise ValueError("fuse_gemv needs fused=True and matmul='triton'")
        if self.fused_attention and not self.fused:
            raise ValueError("fused_attention needs fused=True (it reads the fused q|k|v vector)")
        if (self.split_k or self.pdl) and self.matmul != "triton":
            raise ValueError("split_k and pdl are options of our GEMV: they need matmul='triton'")
        if self.fp8 and not self.fuse_gemv:
            raise ValueError("fp8 needs fuse_gemv=True (our GEMV reads the FP8 weights)")
        if self.early_weights and not self.pdl:
            raise ValueError("early_weights needs pdl=True (without a wait there is nothing to load before)")
        if self.one_attention and not (self.fused_attention and self.pdl):
            raise ValueError("one_attention needs fused_attention=True and pdl=True")
        if self.fold_norms and not self.fuse_gemv:
            raise ValueError("fold_norms needs fuse_gemv=True (our fused GEMVs read the folded weights)")
        if self.fp8 and (self.persistent or self.layer_kernel):
            raise ValueError("persistent and layer_kernel read BF16 weights: they take no fp8")
        if self.persistent and not (self.pdl and self.fold_norms):
            raise ValueError("persistent needs pdl=True and fold_norms=True (its GEMVs are the folded step's)")
        if self.layer_kernel and not (self.fold_norms and self.one_attention and self.early_weights):
            raise ValueError(
                "layer_kernel needs fold_norms, one_attention and early_weights (its stages are those kernels')"
            )
        if self.step_kernel and not self.layer_kernel:
            raise ValueError("step_kernel needs layer_kernel (its layers are the layer kernel's)")


@cache
def ops():
    """Our Triton kernels as PyTorch custom operators, which torch.compile calls as they are:
    (gemv, decode_attention, gemv_folded, layer), by name too (Kernels)."""
    import torch

    from labsupport.measure.kernels import decode_attention, gemv, megakernel

    # The schemas are written out: this module's annotations are strings (PEP 563).
    @torch.library.custom_op(
        "labsupport::gemv",
        mutates_args=(),
        schema="(Tensor x, Tensor w, Tensor? norm_weight, float eps, bool silu, Tensor? residual, Tensor? scale, "
        "bool split, bool pdl, bool early) -> Tensor",
    )
    def gemv_op(x, w, norm_weight, eps, silu, residual, scale, split, pdl, early):
        return gemv.gemv(
            x, w, norm_weight=norm_weight, eps=eps, silu=silu, residual=residual, scale=scale, split=split, pdl=pdl,
            early=early,
        )  # fmt: skip

    @gemv_op.register_fake
    def _(x, w, norm_weight, eps, silu, residual, scale, split, pdl, early):
        return x.new_empty(*x.shape[:-1], w.shape[0] // 2 if silu else w.shape[0])

    @torch.library.custom_op(
        "labsupport::decode_attention",
        mutates_args=("k_cache", "v_cache"),
        schema="(Tensor qkv, Tensor q_norm, Tensor k_norm, Tensor cos, Tensor sin, Tensor(a!) k_cache, "
        "Tensor(b!) v_cache, Tensor pos, int heads, float eps, bool one) -> Tensor",
    )
    def attention_op(qkv, q_norm, k_norm, cos, sin, k_cache, v_cache, pos, heads, eps, one):
        if one:  # one kernel, PDL-launched
            return decode_attention.decode_attention_one(
                qkv, q_norm, k_norm, cos, sin, k_cache, v_cache, pos, heads, eps, pdl=True
            )
        return decode_attention.decode_attention(qkv, q_norm, k_norm, cos, sin, k_cache, v_cache, pos, heads, eps)

    @attention_op.register_fake
    def _(qkv, q_norm, k_norm, cos, sin, k_cache, v_cache, pos, heads, eps, one):
        return qkv.new_empty(heads * k_cache.shape[-1])

    # The GEMV of the folded-norms rung: `sums` is a layer's three Σx² rows (folded_norms.sums),
    # `read`, `add`, `clear` the rows it reads for its norm, adds its output's Σx² into, zeroes (-1: none).
    @torch.library.custom_op(
        "labsupport::gemv_folded",
        mutates_args=("sums",),
        schema="(Tensor x, Tensor w, Tensor(a!) sums, int read, int add, int clear, float eps, bool silu, "
        "Tensor? residual, Tensor? scale, bool split, bool pdl, bool early, bool persistent) -> Tensor",
    )
    def gemv_folded_op(x, w, sums, read, add, clear, eps, silu, residual, scale, split, pdl, early, persistent):
        return gemv.gemv(
            x, w, eps=eps, silu=silu, residual=residual, scale=scale, split=split, pdl=pdl, early=early,
            sumsq_in=sums[read] if read >= 0 else None,
            sumsq_out=(sums[add], sums[clear]) if add >= 0 else None, persistent=persistent,
        )  # fmt: skip

    @gemv_folded_op.register_fake
    def _(x, w, sums, read, add, clear, eps, silu, residual, scale, split, pdl, early, persistent):
        return x.new_empty(*x.shape[:-1], w.shape[0] // 2 if silu else w.shape[0])

    # A whole layer of the folded step in one kernel: `sums` is the layer's three Σx² rows.
    @torch.library.custom_op(
        "labsupport::layer",
        mutates_args=("k_cache", "v_cache", "sums"),
        schema="(Tensor x, Tensor wqkv, Tensor wo, Tensor wgu, Tensor wd, Tensor q_norm, Tensor k_norm, Tensor cos, "
        "Tensor sin, Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor pos, Tensor(c!) sums, int heads, float eps, "
        "bool pdl) -> Tensor",
    )
    def layer_op(x, wqkv, wo, wgu, wd, q_norm, k_norm, cos, sin, k_cache, v_cache, pos, sums, heads, eps, pdl):
        return megakernel.layer(
            x, wqkv, wo, wgu, wd, q_norm, k_norm, cos, sin, k_cache, v_cache, pos, sums, heads, eps, pdl=pdl
        )

    @layer_op.register_fake
    def _(x, wqkv, wo, wgu, wd, q_norm, k_norm, cos, sin, k_cache, v_cache, pos, sums, heads, eps, pdl):
        return torch.empty_like(x)

    return Kernels(gemv_op, attention_op, gemv_folded_op, layer_op)


class Kernels(NamedTuple):
    """ops()' custom operators, by name."""

    gemv: object
    attention: object
    gemv_folded: object
    layer: object


def rmsnorm(x, weight, eps):
    """Qwen3's RMSNorm: statistics in float32, weight applied in the input's dtype (None: a weight
    folded into the matrix after the norm, Options.fold_norms)."""
    import torch

    xf = x.float()
    normed = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
    return normed if weight is None else weight * normed


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


def layer(
    x, pos, cos, sin, k_cache, v_cache, *w, shape: Shape, opts: Options, kernels=None, reduce=None, residual=True,
    sums=None,
):  # fmt: skip
    """One decoder layer on x [B, T, hidden] at positions pos [T]; writes the cache in place.
    `w`: input norm, post-attention norm, q norm, k norm, the attention input weight(s)
    (Q, K, V or QKV), o_proj, the MLP input weight(s) (gate, up or gate-up), down_proj.
    `kernels`: ops(), our kernels, used for a single token as opts asks. With opts.fp8 the
    four matrices are FP8 and their row scales follow them in `w`. With opts.fold_norms the first
    two norms are None (folded into QKV and gate/up) and `sums` is the layer's three Σx² rows
    (folded_norms: its input's, after attention's, its output's), used for a single token.
    Split by tensor parallelism (labsupport.measure.distributed.tp_split) `w` is one rank's shard, `reduce`
    sums o_proj's and down_proj's partial outputs over the ranks (one all-reduce each), and
    `residual` says whether this rank adds the residual (one rank only, inside a fused GEMV)."""
    import torch.nn.functional as F

    s, eps = shape, shape.eps
    if opts.fold_norms and reduce is not None:
        raise ValueError("fold_norms is the one-GPU step's: a rank's Σx² would be of its partial sum")
    sc = (None, None, None, None)
    if opts.fp8:  # (..., qkv, o, gate_up, down, their four scales)
        w, sc = w[:-4], w[-4:]
    n_in = 1 if opts.fused else 3
    in_norm, post_norm, q_norm, k_norm = w[:4]
    attn_in, wo = w[4 : 4 + n_in], w[4 + n_in]
    mlp_in, wdown = w[5 + n_in : -1], w[-1]
    one_token = x.shape[1] == 1 and kernels is not None
    gemv = kernels.gemv if one_token and opts.matmul == "triton" else None

    fuse = opts.fuse_gemv and gemv is not None
    fold = fuse and opts.fold_norms

    def mm(v, weight, norm=None, silu=False, residual=None, scale=None, sumsq=None):
        if gemv is None:
            return F.linear(v, weight if scale is None else gemv_fp8.dequantize(weight, scale, v.dtype))
        if fold:  # sumsq: the rows of `sums` it reads, adds into, zeroes (READ_INPUT ...)
            flags = (opts.split_k, opts.pdl, opts.early_weights, opts.persistent)
            return kernels.gemv_folded(v, weight, sums, *sumsq, eps, silu, residual, scale, *flags)
        return gemv(v, weight, norm, eps, silu, residual, scale, opts.split_k, opts.pdl, opts.early_weights)

    red = (lambda t: t) if reduce is None else reduce
    if fold and opts.layer_kernel:  # the whole layer, one kernel
        return kernels.layer(x, attn_in[0], wo, mlp_in[0], wdown, q_norm, k_norm, cos, sin, k_cache, v_cache, pos,
                             sums, s.heads, eps, opts.pdl)  # fmt: skip
    h = x if fuse else rmsnorm(x, in_norm, eps)
    qkv = [mm(h, wi, norm=in_norm if fuse else None, scale=sc[0], sumsq=READ_INPUT) for wi in attn_in]
    if opts.fused_attention and one_token:
        a = kernels.attention(qkv[0], q_norm, k_norm, cos, sin, k_cache, v_cache, pos, s.heads, eps, opts.one_attention)
        a = a.view(1, 1, -1)
    else:
        a = attention(qkv, pos, cos, sin, k_cache, v_cache, q_norm, k_norm, s, opts.fused)
    res = x if residual else None
    x = red(mm(a, wo, residual=res, scale=sc[1], sumsq=WRITE_ATTENDED)) if fuse else x + red(mm(a, wo, scale=sc[1]))
    if fuse:  # the gate/up weight is interleaved (gemv.interleave): its GEMV writes silu(gate) * up
        res = x if residual else None
        act = mm(x, mlp_in[0], norm=post_norm, silu=True, scale=sc[2], sumsq=READ_ATTENDED)
        return red(mm(act, wdown, residual=res, scale=sc[3], sumsq=WRITE_OUTPUT))
    h = rmsnorm(x, post_norm, eps)
    gu = [mm(h, wi, scale=sc[2]) for wi in mlp_in]
    if opts.fuse_gemv:  # the prompt, with the interleaved gate/up weight: rows gate_i, up_i
        gate, up = gu[0].unflatten(-1, (-1, 2)).unbind(-1)
    else:
        gate, up = gu[0].chunk(2, dim=-1) if opts.fused else gu
    return x + red(mm(F.silu(gate) * up, wdown, scale=sc[3]))


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


def rotary(cfg, max_len: int, dev, dt):
    """(cos, sin) of Qwen3's rotary embedding for positions 0 .. max_len - 1, [max_len, head_dim]."""
    import torch

    theta = cfg.rope_parameters["rope_theta"] if hasattr(cfg, "rope_parameters") else cfg.rope_theta
    inv = 1.0 / (theta ** (torch.arange(0, cfg.head_dim, 2, device=dev, dtype=torch.float32) / cfg.head_dim))
    freqs = torch.outer(torch.arange(max_len, device=dev, dtype=torch.float32), inv)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dt), emb.sin().to(dt)


# The concatenated weights made so far, per model (held weakly: they go with the model, and a
# deepcopy of the model, such as the float32 reference, carries none of them).
_JOINED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def joined(model):
    """A function that returns the concatenation of some of `model`'s weights, made on first use
    and shared by every decoder built on the same model while those weights are unchanged (same
    storage, no in-place write since). Each rung of *Closing the gap* is a decoder of its own, all
    alive at once to be timed interleaved; with a copy each, six fused rungs held 50 GB of
    identical concatenations and the FP8 rung (rung 9's options) ran out of the H200's memory.
    (The folded matrices, Options.fold_norms, are new ones: about 10 GB for Qwen3-8B, made once
    for every folded rung; a source's signature covers the norm's weight too. The FP8 copies, about
    7.6 GB, are made once for both FP8 rungs.) They are made without autograd: made from the
    model's parameters with it, each kept the graph of its making, and with it the float32
    intermediates its backward would need (31 GB, not 10, for the folded matrices on an H100,
    and the FP8 rungs ran out of its 80 GB)."""
    import torch

    store = _JOINED.setdefault(model, {})

    def made(key, sources, make):
        signature = tuple((t.data_ptr(), t._version) for t in sources)
        if key not in store or store[key][0] != signature:
            with torch.no_grad():
                store[key] = (signature, make(*sources))
        return store[key][1]

    return made


class Qwen3Decoder:
    """The weights of a transformers Qwen3 model (shared, or concatenated once per model when
    fused: `joined`), a KV cache of `max_len` slots per layer, and the forward pass above. With
    opts.fold_norms the input and post-attention norms' weights are folded into the fused QKV and
    gate/up matrices and the final norm's into the LM head (folded_norms.fold: the norms in `weights`
    and `norm` are None), and a step keeps its Σx² rows (`sums`) and its LM head's argmax word
    (`argmax`, the token a view of it: `next_token`), each reset inside the step (folded_norms)."""

    def __init__(self, model, max_len: int, opts: Options):
        import torch

        from labsupport.measure.kernels import gemv

        cfg, m = model.config, model.model
        self.opts, self.max_len = opts, max_len
        self.shape = Shape(cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, cfg.rms_norm_eps)
        self.embed, self.norm, self.lm_head = m.embed_tokens.weight, m.norm.weight, model.lm_head.weight
        self.weights = []
        made = joined(model)
        fold = folded_norms.fold

        def folded_qkv(q, k, v, norm):
            return fold(torch.cat((q, k, v)), norm)

        def folded_gate_up(gate, up, norm):
            return fold(gemv.interleave(gate, up), norm)

        if opts.fold_norms:
            self.lm_head = made(("lm_head folded",), (self.lm_head, self.norm), fold)
            self.norm = None
        for i, lyr in enumerate(m.layers):
            a, p = lyr.self_attn, lyr.mlp
            attn = [a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]
            mlp = [p.gate_proj.weight, p.up_proj.weight]
            norms = [lyr.input_layernorm.weight, lyr.post_attention_layernorm.weight, a.q_norm.weight, a.k_norm.weight]
            if opts.fold_norms:  # fuse_gemv: the gate/up weight interleaved
                attn = [made(("q|k|v folded", i), (*attn, norms[0]), folded_qkv)]
                mlp = [made(("gate|up interleaved folded", i), (*mlp, norms[1]), folded_gate_up)]
                norms[:2] = None, None
            elif opts.fused:
                attn = [made(("q|k|v", i), attn, lambda *a: torch.cat(a).contiguous())]
                if opts.fuse_gemv:
                    mlp = [made(("gate|up interleaved", i), mlp, gemv.interleave)]
                else:
                    mlp = [made(("gate|up", i), mlp, lambda *g: torch.cat(g).contiguous())]
            mats = (*attn, a.o_proj.weight, *mlp, p.down_proj.weight)
            if opts.fp8:  # FP8 copies with row scales, shared by the FP8 rungs; the BF16 concatenations are dropped
                key = "fp8 folded" if opts.fold_norms else "fp8"  # of the folded matrices, or of the plain ones
                q = [made((key, i, j), (m,), gemv_fp8.quantize) for j, m in enumerate(mats)]
                mats = (*(m for m, _ in q), *(c for _, c in q))
            self.weights.append((*norms, *mats))
        self.lm_scale = None
        if opts.fp8:
            key = "lm_head folded fp8" if opts.fold_norms else "lm_head fp8"
            self.lm_head, self.lm_scale = made((key,), (self.lm_head,), gemv_fp8.quantize)
        dev, dt = self.embed.device, self.embed.dtype
        kv = (1, cfg.num_key_value_heads, max_len, cfg.head_dim)
        self.k_cache = [torch.zeros(kv, device=dev, dtype=dt) for _ in m.layers]
        self.v_cache = [torch.zeros(kv, device=dev, dtype=dt) for _ in m.layers]
        self.cos, self.sin = rotary(cfg, max_len, dev, dt)
        self.inter = cfg.intermediate_size
        if opts.step_kernel:  # every layer's tensors by address, for the step kernel (megakernel.table)
            from labsupport.measure.kernels import megakernel

            names = ("q_norm", "k_norm", "qkv", "o_proj", "gate_up", "down")  # a folded layer's, from its third
            self.table = megakernel.table([
                {**dict(zip(names, w[2:], strict=True)), "k_cache": kc, "v_cache": vc}
                for w, kc, vc in zip(self.weights, self.k_cache, self.v_cache, strict=True)
            ])  # fmt: skip
        if opts.fold_norms:
            self.sums = folded_norms.sums(len(m.layers), dev)
            self.argmax = folded_norms.argmax_word(dev)
            self.next_token = folded_norms.token_of(self.argmax)
        self.kernels = ops() if opts.matmul == "triton" or opts.fused_attention else None
        self.layer_eager = partial(layer, shape=self.shape, opts=opts, kernels=self.kernels)
        self.layer_step = self.layer_eager

    def compile(self):
        """Compile the decoder layer (once: every layer has the same shapes). Every rung's options
        and every verify width is a compilation of the same function: dynamo's limit of
        recompilations per function (8 by default) is raised so that none falls back to eager.
        Inductor's data-dependent choices are pinned (labsupport.measure.compiling)."""
        import torch

        from labsupport.measure import compiling

        for name in ("recompile_limit", "cache_size_limit"):
            if hasattr(torch._dynamo.config, name):
                setattr(torch._dynamo.config, name, max(64, getattr(torch._dynamo.config, name)))
        self.layer_step = compiling.torch_compile(self.layer_eager, fullgraph=True, dynamic=False)

    def weight_bytes(self) -> int:
        """The bytes a step reads as weights: every layer's matrices, norms (those not folded) and
        (FP8) scales, the final norm and the LM head (with its scales); the embedding's one row is
        left out."""
        ts = [t for w in self.weights for t in w] + [self.norm, self.lm_head, self.lm_scale]
        return sum(t.numel() * t.element_size() for t in ts if t is not None)

    def forward(self, tokens, pos, step: bool = True, last_only: bool = True):
        """Logits of the last position for tokens [B, T] at positions pos [T] (of every position,
        [B, T, vocab], with not `last_only`); `step` uses the (compiled) step layer, else the eager
        one (the prefill)."""
        import torch.nn.functional as F

        o, eps = self.opts, self.shape.eps
        fn = self.layer_step if step else self.layer_eager
        folded = o.fold_norms and step and tokens.shape[1] == 1  # our GEMVs' step: fuse_gemv
        if folded:  # the embedding row and its Σx², for the first QKV GEMV
            last = (self.argmax, self.sums[-1])  # the LM head's, the step before's: reset here
            x = folded_norms.embed_row(tokens, self.embed, self.sums[0], o.pdl, reset=last)
            if o.step_kernel:  # every layer and the LM head, one kernel
                from labsupport.measure.kernels import megakernel

                s = self.shape
                logits = megakernel.step(
                    x, self.table, self.lm_head, self.argmax, self.cos, self.sin, pos, self.sums, inter=self.inter,
                    heads=s.heads, kv_heads=s.kv_heads, head_dim=s.head_dim, slots=self.max_len, eps=eps, pdl=o.pdl,
                )  # fmt: skip
                return logits.view(1, -1)
        else:
            x = F.embedding(tokens, self.embed)
        for i, (w, kc, vc) in enumerate(zip(self.weights, self.k_cache, self.v_cache, strict=True)):
            extra = {"sums": self.sums[2 * i : 2 * i + 3]} if folded else {}
            x = fn(x, pos, self.cos, self.sin, kc, vc, *w, **extra)
        x = x[:, -1:] if last_only else x
        if folded:  # the final norm's weight is in the LM head, its Σx² from the last down GEMV
            from labsupport.measure.kernels import gemv

            head = gemv.gemv(
                x, self.lm_head, eps=eps, sumsq_in=self.sums[-1], argmax=self.argmax, pdl=o.pdl,
                early=o.early_weights, persistent=o.persistent, scale=self.lm_scale,
            )  # fmt: skip
            return head[:, -1]
        if not (step and o.matmul == "triton" and x.shape[1] == 1):
            head = self.lm_head if self.lm_scale is None else gemv_fp8.dequantize(self.lm_head, self.lm_scale, x.dtype)
            logits = F.linear(rmsnorm(x, self.norm, eps), head)
            return logits[:, -1] if last_only else logits
        if self.opts.fuse_gemv:  # the final norm as one Triton kernel: inside the LM head's GEMV, the
            # norm's weight would be read again by each of its ~19,000 programs (measured slower)
            from labsupport.measure.kernels import triton_kernels

            x = triton_kernels.rmsnorm(x, self.norm, eps)
        else:
            x = rmsnorm(x, self.norm, eps)
        head = self.kernels.gemv(
            x, self.lm_head, None, eps, False, None, self.lm_scale, o.split_k, o.pdl, o.early_weights
        )  # fmt: skip
        return head[:, -1]


class Captured:
    """A step of our decoder that is warmed up (compiled, every kernel run once) on a side stream,
    then on a GPU captured in a CUDA graph; a call replays the graph (or, without one, runs the
    step). Subclasses give `run()`."""

    graph = None

    def warm_and_capture(self, dev, graph: bool, since: float) -> float:
        """Warm up, then capture; returns the seconds from `since` (the compile's start) to the end
        of the warm-up: the compile time, the capture left out."""
        import torch

        side = torch.cuda.Stream() if dev.type == "cuda" else None
        if side is not None:
            side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side) if side is not None else contextlib.nullcontext(), torch.no_grad():
            for _ in range(3):  # compile, and run every kernel once, before any capture
                self.run()
        if side is not None:
            torch.cuda.current_stream().wait_stream(side)
            torch.cuda.synchronize()
        warmed = time.perf_counter() - since
        self.graph = None
        if graph and dev.type == "cuda":
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph), torch.no_grad():
                self.out = self.run()
        return warmed

    def __call__(self):
        import torch

        if self.graph is not None:
            self.graph.replay()
            return self.out
        with torch.no_grad():
            return self.run()


EXTRA_SLOTS = 16  # the cache slots an OwnStep keeps past its prompt (a verify pass writes up to 16 tokens)


class OwnStep(Captured):
    """One decode step of Qwen3Decoder at position `len(prompt)`, after a prefill of the
    prompt, fed `token`: compiled, and on a GPU captured in a CUDA graph. Returns (logits,
    next token); every call redoes the same step (same slot, same input)."""

    def __init__(self, model, prompt_ids, token, opts: Options, compile: bool = True, graph: bool = True):
        import torch

        n = prompt_ids.shape[1]
        self.dec = self.decoder(model, n + EXTRA_SLOTS, opts)
        dev = prompt_ids.device
        with torch.no_grad():
            self.dec.forward(prompt_ids, torch.arange(n, device=dev), step=False)
        self.tok, self.pos = token.reshape(1, 1).clone(), torch.tensor([n], device=dev)
        self.before_compile()
        self.compile_s = 0.0
        from labsupport.measure.kernels import megakernel

        gave_up = megakernel.timeouts(dev) if opts.layer_kernel else 0
        t = time.perf_counter()
        if compile:
            self.dec.compile()
        self.compile_s = self.warm_and_capture(dev, graph, since=t)
        if opts.layer_kernel and (n := megakernel.timeouts(dev) - gave_up):  # in the warm-up: its numbers are wrong
            raise RuntimeError(f"the layer kernel's programs gave up waiting for each other {n} times")

    def decoder(self, model, max_len: int, opts: Options) -> Qwen3Decoder:
        """The decoder this step runs (a subclass may give another: tp_split's, one rank's shard)."""
        return Qwen3Decoder(model, max_len, opts)

    def before_compile(self) -> None:
        """Called after the prefill, before the compile and capture (nothing here)."""

    def run(self):
        logits = self.dec.forward(self.tok, self.pos)
        if self.dec.opts.fold_norms:  # the LM head's argmax word (a view), until the next step starts
            return logits, self.dec.next_token
        return logits, logits.argmax(-1, keepdim=True)


class VerifyStep(Captured):
    """`t` tokens at once through the decoder of an OwnStep `own` (its weights, cache and compiled
    layer), at positions len(prompt) .. len(prompt) + t - 1, logits of every position (a verify
    pass of speculative decoding: the weights read once for t tokens). Its matmuls are cuBLAS's
    (F.linear; our GEMV takes one vector), its attention PyTorch's; compiled for this shape and,
    on a GPU, captured in a CUDA graph. Every call redoes the same pass."""

    def __init__(self, own: OwnStep, t: int):
        import torch

        self.dec, self.t = own.dec, t
        if own.pos.item() + t > self.dec.max_len:
            raise ValueError(f"{t} tokens do not fit the cache's {self.dec.max_len} slots")
        self.tok = own.tok.reshape(1, 1).repeat(1, t).clone()
        self.pos = own.pos + torch.arange(t, device=own.pos.device)
        dev = self.tok.device
        self.compile_s = self.warm_and_capture(dev, graph=True, since=time.perf_counter())  # compiles this shape

    def run(self):
        logits = self.dec.forward(self.tok, self.pos, last_only=False)
        return logits, logits.argmax(-1)
