"""Our own Qwen3 decode step (qwen3_decode), split by hand over the ranks of a process group:
tensor parallelism written out, without DTensor, so that a step costs the host nothing beyond
the unsplit step's and can be captured whole in one CUDA graph per rank.

The split (Megatron-LM's, as gpt-fast writes it), on each of `world` ranks, rank r:

    q_proj, k_proj, v_proj   by columns (output rows of the weight): heads/world query heads and
                             kv_heads/world K/V heads, r-th block; the KV cache holds only those
    o_proj                   by rows (input columns of the weight): the same heads' block;
                             its partial output summed over the ranks: one all-reduce
    gate_proj, up_proj       by columns: intermediate/world rows, r-th block
    down_proj                by rows: the same block; one all-reduce
    lm_head                  by vocabulary: ceil(vocab/world) rows (the last shard padded with
                             zero rows), the logits gathered from every rank (one all-gather)
    embedding, norms         whole on every rank (a step reads one row of the embedding)

That is two all-reduces per layer and one all-gather per step. The layer's arithmetic is
qwen3_decode.layer itself, given this rank's shard, the shard's Shape (heads/world, kv_heads/world)
and `reduce` (the all-reduce after each row-split matmul). With Options.fused the rank's Q|K|V and
gate|up shards are concatenated (interleaved, with fuse_gemv); with fuse_gemv the residual add
inside o_proj's and down_proj's GEMV is done by rank 0 alone, so the sum over ranks adds it once.

All-reduce choices (`Collectives.choice`):

    "process-group"  torch.distributed's functional all-reduce (_c10d_functional.all_reduce +
                     wait_tensor): NCCL on GPUs, gloo on a CPU; traceable by torch.compile and,
                     with NCCL, capturable in a CUDA graph
    "symm-mem"       torch's one-shot all-reduce over symmetric memory
                     (torch.ops.symm_mem.one_shot_all_reduce on a buffer from
                     torch.distributed._symmetric_memory, rendezvoused once): every rank reads the
                     peers' buffers over NVLink in one kernel. Needs CUDA GPUs with peer access;
                     symm_mem_support() says why not where it cannot run. The prefill uses
                     "process-group" (its message is T times larger than the buffer).

What was exercised, and where (2026-12-02): on a CPU with two gloo ranks and the tiny model, in
float32, eager (neither compiled nor captured): the split step's logits against the whole model
(transformers' eager step and the unsplit Qwen3Decoder), with Options() and Options(fused=True);
the shards' sizes; the all-reduces one step issues (allreduce.CollectiveLog); the worker's
tables (tp_split_run, each rank's folder); and in BF16 through the chapter's live cell on a CPU
(TP=1 and TP=2, tiny model), its logits within a tenth of the largest of a float32 reference.
Not exercised anywhere yet: torch.compile of
the split layer (the collective inside a fullgraph compile), the capture of the whole step in a
CUDA graph with NCCL all-reduces in it, our Triton kernels (matmul="triton", fuse_gemv,
fused_attention, split_k, pdl) on a shard, the symmetric-memory all-reduce, BF16 rounding of a split
step against one float32 reference, and every timing and census on GPUs: those need the
two-GPU run (python -m torch.distributed.run --nproc-per-node 2 -m labsupport.measure.distributed.tp_split_run).
"""

from __future__ import annotations

import math
import warnings
from functools import partial

from labsupport.measure.models import qwen3_decode
from labsupport.measure.models.qwen3_decode import Options, OwnStep, Qwen3Decoder, Shape

CHOICES = ("process-group", "symm-mem")


class NotAvailable(RuntimeError):
    """An all-reduce choice this torch or this device cannot run."""


def symm_mem_support(device: str) -> str | None:
    """None when torch's one-shot symmetric-memory all-reduce can run on `device` ("cuda:1",
    "cpu"), else the reason, in one line."""
    import torch

    try:
        from torch.distributed import _symmetric_memory as symm
    except ImportError as e:
        return f"torch {torch.__version__} has no torch.distributed._symmetric_memory ({e})"
    if not hasattr(symm, "rendezvous") or not hasattr(symm, "empty"):
        return f"torch {torch.__version__}'s _symmetric_memory has no empty/rendezvous"
    if not hasattr(torch.ops.symm_mem, "one_shot_all_reduce"):
        return f"torch {torch.__version__} has no torch.ops.symm_mem.one_shot_all_reduce"
    if not str(device).startswith("cuda"):
        return f"symmetric memory needs CUDA GPUs with peer access; this rank is on {device}"
    if not torch.cuda.is_available():
        return "symmetric memory needs CUDA GPUs; torch sees none"
    return None


class Collectives:
    """The step's collectives on this rank, over `group` (the default group when None): the
    all-reduce of the row-split matmuls' partial sums (`choice`, CHOICES) and the gather of the
    vocabulary-split logits. On one rank both are the identity."""

    def __init__(self, choice: str = "process-group", group=None, device: str = "cpu", message=None):
        import torch.distributed as dist

        if choice not in CHOICES:
            raise ValueError(f"all-reduce choice must be one of {CHOICES}, not {choice!r}")
        self.choice, self.group = choice, group if group is not None else dist.group.WORLD
        self.world, self.rank = dist.get_world_size(self.group), dist.get_rank(self.group)
        self.group_name = self.group.group_name
        self.buffer = None
        if choice == "symm-mem":
            why = symm_mem_support(device)
            if why is not None:
                raise NotAvailable(f"symmetric-memory all-reduce: {why}")
            if message is None:
                raise ValueError("the symmetric-memory all-reduce needs its message's (shape, dtype)")
            from torch.distributed import _symmetric_memory as symm

            shape, dtype = message
            if hasattr(symm, "enable_symm_mem_for_group"):  # needed by older torch, deprecated since
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", FutureWarning)
                    symm.enable_symm_mem_for_group(self.group_name)
            self.buffer = symm.empty(shape, dtype=dtype, device=device)
            symm.rendezvous(self.buffer, self.group_name)

    def all_reduce(self, t):
        """The sum of `t` over the ranks (a new tensor)."""
        import torch

        if self.world == 1:
            return t
        if self.buffer is not None:
            if t.shape != self.buffer.shape or t.dtype != self.buffer.dtype:
                raise ValueError(f"symmetric buffer is {tuple(self.buffer.shape)}, message {tuple(t.shape)}")
            self.buffer.copy_(t)
            return torch.ops.symm_mem.one_shot_all_reduce(self.buffer, "sum", self.group_name)
        out = torch.ops._c10d_functional.all_reduce(t, "sum", self.group_name)
        return torch.ops._c10d_functional.wait_tensor(out)

    def gather_last(self, shard):
        """Every rank's `shard` [B, n] side by side along the last dimension: [B, world * n]."""
        import torch

        if self.world == 1:
            return shard
        out = torch.ops._c10d_functional.all_gather_into_tensor(shard.contiguous(), self.world, self.group_name)
        out = torch.ops._c10d_functional.wait_tensor(out)  # [world * B, n]
        b, n = shard.shape
        return out.view(self.world, b, n).permute(1, 0, 2).reshape(b, self.world * n)


def split_sizes(cfg, world: int) -> dict:
    """Per-rank sizes of the split: query heads, K/V heads, MLP rows, vocabulary rows (padded);
    a clear error when heads or the MLP's width do not divide among the ranks."""
    for what in ("num_attention_heads", "num_key_value_heads", "intermediate_size"):
        if getattr(cfg, what) % world:
            raise ValueError(f"tensor parallelism over {world} ranks: {what}={getattr(cfg, what)} does not divide")
    return {
        "heads": cfg.num_attention_heads // world,
        "kv_heads": cfg.num_key_value_heads // world,
        "intermediate": cfg.intermediate_size // world,
        "vocab": math.ceil(cfg.vocab_size / world),
    }


class SplitDecoder(Qwen3Decoder):
    """Rank `comm.rank`'s shard of a transformers Qwen3 model's weights (copies: the whole model
    may be dropped once every rank has built its decoder), its shard of the KV cache, and the
    forward pass of Qwen3Decoder with the all-reduces and the logits gather (module docstring).
    `prefill_comm`: the collectives of the prefill (by default `comm`, or a process-group one
    when `comm` is the symmetric-memory all-reduce, whose buffer fits one token)."""

    def __init__(self, model, max_len: int, opts: Options, comm: Collectives, prefill_comm=None):
        import torch

        from labsupport.measure.kernels import gemv

        if opts.fp8:
            raise ValueError("the split step is the BF16 rungs' (fp8 is not split)")
        cfg, m = model.config, model.model
        r, world = comm.rank, comm.world
        n = split_sizes(cfg, world)
        self.opts, self.max_len, self.comm, self.vocab = opts, max_len, comm, cfg.vocab_size
        self.shape = Shape(n["heads"], n["kv_heads"], cfg.head_dim, cfg.rms_norm_eps)
        d = cfg.head_dim

        def rows(w, k):  # output rows r*k .. (r+1)*k: a column-split of y = x W^T
            return w[r * k : (r + 1) * k].clone(memory_format=torch.contiguous_format)

        def cols(w, k):  # input columns: a row-split
            return w[:, r * k : (r + 1) * k].clone(memory_format=torch.contiguous_format)

        self.embed, self.norm = m.embed_tokens.weight, m.norm.weight
        head = rows(model.lm_head.weight, n["vocab"])
        if head.shape[0] < n["vocab"]:  # the last shard of a vocabulary that does not divide
            pad = head.new_zeros(n["vocab"] - head.shape[0], head.shape[1])
            head = torch.cat((head, pad))
        self.lm_head, self.lm_scale = head, None
        self.weights = []
        for lyr in m.layers:
            a, p = lyr.self_attn, lyr.mlp
            attn = [rows(a.q_proj.weight, n["heads"] * d), rows(a.k_proj.weight, n["kv_heads"] * d)]
            attn.append(rows(a.v_proj.weight, n["kv_heads"] * d))
            mlp = [rows(p.gate_proj.weight, n["intermediate"]), rows(p.up_proj.weight, n["intermediate"])]
            if opts.fused:
                attn = [torch.cat(attn).contiguous()]
                mlp = [gemv.interleave(*mlp) if opts.fuse_gemv else torch.cat(mlp).contiguous()]
            norms = [lyr.input_layernorm.weight, lyr.post_attention_layernorm.weight, a.q_norm.weight, a.k_norm.weight]
            o, down = cols(a.o_proj.weight, n["heads"] * d), cols(p.down_proj.weight, n["intermediate"])
            self.weights.append((*norms, *attn, o, *mlp, down))
        dev, dt = self.embed.device, self.embed.dtype
        kv = (1, n["kv_heads"], max_len, d)
        self.k_cache = [torch.zeros(kv, device=dev, dtype=dt) for _ in m.layers]
        self.v_cache = [torch.zeros(kv, device=dev, dtype=dt) for _ in m.layers]
        self.cos, self.sin = qwen3_decode.rotary(cfg, max_len, dev, dt)
        self.kernels = qwen3_decode.ops() if opts.matmul == "triton" or opts.fused_attention else None
        if prefill_comm is None:
            prefill_comm = comm if comm.choice == "process-group" else Collectives("process-group", comm.group)
        self.prefill_comm = prefill_comm
        common = {"shape": self.shape, "opts": opts, "kernels": self.kernels, "residual": r == 0}
        self.layer_eager = partial(qwen3_decode.layer, reduce=comm.all_reduce, **common)
        self.layer_prefill = partial(qwen3_decode.layer, reduce=prefill_comm.all_reduce, **common)
        self.layer_step = self.layer_eager

    def forward(self, tokens, pos, step: bool = True, last_only: bool = True):
        """Logits of the last position, whole (gathered from every rank), for tokens [B, T] at
        positions pos [T]; `step` uses the (compiled) step layer and `comm`, else the eager layer
        and `prefill_comm` (the prefill)."""
        import torch.nn.functional as F

        if not last_only:
            raise ValueError("the split decoder returns the last position's logits only")
        fn = self.layer_step if step else self.layer_prefill
        x = F.embedding(tokens, self.embed)
        for w, kc, vc in zip(self.weights, self.k_cache, self.v_cache, strict=True):
            x = fn(x, pos, self.cos, self.sin, kc, vc, *w)
        x, eps, o = x[:, -1:], self.shape.eps, self.opts
        if step and o.matmul == "triton" and x.shape[1] == 1:
            if o.fuse_gemv:
                from labsupport.measure.kernels import triton_kernels

                x = triton_kernels.rmsnorm(x, self.norm, eps)
            else:
                x = qwen3_decode.rmsnorm(x, self.norm, eps)
            shard = self.kernels.gemv(x, self.lm_head, None, eps, False, None, None, o.split_k, o.pdl, o.early_weights)
            shard = shard[:, -1]
        else:
            shard = F.linear(qwen3_decode.rmsnorm(x, self.norm, eps), self.lm_head)[:, -1]
        comm = self.comm if step else self.prefill_comm
        return comm.gather_last(shard)[:, : self.vocab]


def shard_census(dec: SplitDecoder, model) -> dict:
    """Parameters of the split matrices (q, k, v, o, gate, up, down, lm_head) this rank holds and
    the whole model has, and those every rank holds whole (norms; the embedding apart)."""
    m, norms = model.model, 4  # the four norms lead each layer's tuple
    split = sum(t.numel() for w in dec.weights for t in w[norms:]) + dec.lm_head.numel()
    names = ("q_proj", "k_proj", "v_proj", "o_proj")
    whole = sum(getattr(lyr.self_attn, k).weight.numel() for lyr in m.layers for k in names)
    whole += sum(getattr(lyr.mlp, k).weight.numel() for lyr in m.layers for k in ("gate_proj", "up_proj", "down_proj"))
    whole += model.lm_head.weight.numel()
    replicated = sum(t.numel() for w in dec.weights for t in w[:norms]) + dec.norm.numel()
    return {"split_params": split, "whole_split_params": whole, "replicated_params": replicated}


class SplitStep(OwnStep):
    """One decode step of a SplitDecoder at position len(prompt), after a prefill of the prompt,
    fed `token`: compiled and, on a GPU, captured in one CUDA graph (the all-reduces and the
    gather inside it). Before the compile it runs one eager step whose collectives are recorded
    (`census`: allreduce.CollectiveLog's rows) and whose logits are kept (`first_logits`, float32).
    Returns (logits, next token) like qwen3_decode.OwnStep, whose prefill, compile and capture it
    shares; every call redoes the same step."""

    def __init__(self, model, prompt_ids, token, opts: Options, comm: Collectives, compile=True, graph=True):
        self.comm = comm
        super().__init__(model, prompt_ids, token, opts, compile=compile, graph=graph)

    def decoder(self, model, max_len: int, opts: Options) -> SplitDecoder:
        return SplitDecoder(model, max_len, opts, self.comm)

    def before_compile(self) -> None:
        import torch

        from labsupport.measure.distributed import allreduce

        log = allreduce.CollectiveLog()
        with torch.no_grad(), log:
            self.first_logits = self.dec.forward(self.tok, self.pos).float()
        self.census = log.rows
