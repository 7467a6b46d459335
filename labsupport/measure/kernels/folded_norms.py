"""RMSNorm made cheaper inside the GEMVs of a decode step, and the greedy token taken inside the
LM head's GEMV: the pieces of the folded-norms rung (qwen3_decode.Options.fold_norms).

Qwen3's RMSNorm is g * x / rms(x), rms(x) = sqrt(mean(x^2) + eps). The GEMV with `norm`
(labsupport.measure.kernels.gemv) already keeps the 1 / rms(x) scale out of the product, but
every one of its programs still reads the norm's weight g beside x, multiplies and squares
every element of x on the way (split-K's second kernel reads all of x again), and its tuned
tiling is another than the plain GEMV's (on the H200, gate/up with the norm and SiLU took
50.9 us with 16 rows of 512 a program, the same matrix plain 47.9 us with 2 rows of 2,048). Here:

- **The weight is folded.** W (g * x) = (W diag(g)) x, so g is multiplied into the columns of
  the matrix after the norm once, when the decoder's weights are made (`fold`): the input norm
  into the fused Q|K|V matrix, the post-attention norm into the interleaved gate/up matrix, the
  final norm into the LM head. The product is taken in float32 and rounded once to the weights'
  dtype. That rounds differently from the model as written, which rounds the normalised x to
  BF16, multiplies by g and rounds again before the matmul: here those two roundings of the
  activation (one per column, shared by every row) are gone and each weight W_ij g_j is rounded
  instead (one per weight, independent from row to row), by the same relative step. (The GEMV
  with the norm fused rounds neither.) The chapter's fidelity check measures the result.
- **Σx² comes from the producer.** The kernel that writes x (the residual-add GEMVs: o_proj +
  residual, down + residual; the embedding row for the first layer, `embed_row`) sums the
  squares of the values it writes, as stored, and adds its program's sum into one of SLOTS
  float32 partial sums (one atomic add per program: program p into slot p % SLOTS). The next
  GEMV loads the SLOTS partial sums once, adds them, and multiplies its rows by
  1 / sqrt(Σx² / K + eps): it reads no g and squares nothing, and keeps the tiling of the plain
  (or SiLU) GEMV. The atomics make the sum's order, and so its last float32 bit, change from call
  to call; that is far below BF16's step.
- **The partial sums sit on lines of their own.** The 1,024 programs of o_proj or of down end
  together, and their adds into one float32 address would be served one after another there;
  SLOTS partial sums, each on a 128-byte line of its own (STRIDE floats apart), spread them over
  SLOTS addresses, and a reader pays one load of SLOTS floats. What that buys is not shown. On an
  H200, with one address, o_proj and down took about 90 us a step longer in the folded-norms step
  than in the same step without these epilogues (the GEMV configs of closing-the-gap
  20261206T215246Z-h200, an unpublished run, replayed as a CUDA graph; having each reader sum x²
  itself cost more than that in QKV, gate/up and the LM head). In the nightlies on H100s the same
  difference (folded-norms' o_proj and down against one-attention's, exclusive time a step) ranged
  from 9 to 103 us with one address and with the partial sums alike (closing-the-gap 20261206T204745Z,
  221102Z; 20261207T003422Z, 002010Z, 030729Z-h100-80gb-hbm3), so neither is shown to decide it.
- **The rows are zeroed inside the step** (`sums`): one row of partial sums per use in a
  step, 2 L + 1 for L layers (the embedding row, and per layer the x after attention's residual
  add and the layer's output), so that no use waits on another's. The producer of use j zeroes the row
  of use j - 1 (its first program, after the grid-dependency wait): the only reader of use
  j - 1 is the GEMV just before it (QKV before o_proj, with attention between; gate/up before
  down), and once a PDL kernel's wait returns, every kernel before it has finished (each of
  them waited on the one before it before finishing), so no reader is left. Cyclically, the
  embedding row's kernel, the first of a step, zeroes the row of the step before's last use,
  read by its LM head, which has finished. No memset runs inside the CUDA graph.
- **Argmax is the LM head's epilogue** (`argmax_epilogue`). Each program packs each of its
  logits (as stored, float32 bits) and row into one 64-bit word whose signed integer order is
  the reverse of the order of (value, then lower row): in the high 32 bits the float's bits with
  the magnitude bits of negative values flipped (so that integer order is float order; -0.0
  taken as +0.0, which torch.argmax treats as equal), then all bits flipped (so the order runs
  backwards); in the low 32 bits the row itself. The smallest word is the largest logit, and of
  equal logits the lowest row, as with torch.argmax; each program puts its smallest into one
  64-bit atomic min, and the word's low 32 bits are then the token itself (`token_of`: a view of
  them, no kernel). A max on the unreversed key would need 2^32 - 1 - row in the low bits for the
  lowest row to win, and a last step to turn that back into the token: another kernel, or a
  counter with which the last program finds itself (an atomic that returns, with a fence, at the
  end of each of the LM head's ~76,000 programs). The word is reset, with the LM head's Σx²
  row, by the next step's first kernel (`embed_row`), so the token stays readable until then.

The argmax's atomics cost little: one per program on one L2 address, issued as each program
finishes, so they are spread over the kernel (the LM head's ~76,000 programs of two rows, its
tuned tiling, over its ~280 us), unlike the Σx² adds of a residual GEMV, whose programs end
together; none has a result the program uses, so it need not wait for them, and relaxed, they
carry no fence.

Triton is imported on first use; on a CPU set TRITON_INTERPRET=1 first (no bfloat16 there).
"""

from __future__ import annotations

from functools import cache
from types import SimpleNamespace

# The argmax word before any program has put its own: above every packed logit.
EMPTY_WORD = 2**63 - 1
# A layer's rows of the Σx² partial sums (its view sums[2i : 2i + 3]): 0 the layer's input x, 1 x after
# attention's residual add, 2 the layer's output (the next layer's input, or the LM head's).
# Each GEMV's (row it reads for its norm, row it adds its output's Σx² into, row it zeroes), -1: none.
READ_INPUT = (0, -1, -1)  # QKV: the input norm's scale
WRITE_ATTENDED = (-1, 1, 0)  # o_proj + residual: zeroes row 0, whose reader (QKV) has finished
READ_ATTENDED = (1, -1, -1)  # gate/up: the post-attention norm's scale
WRITE_OUTPUT = (-1, 2, 1)  # down + residual: zeroes row 1, whose reader (gate/up) has finished
# A use's Σx² as SLOTS partial sums, STRIDE floats (128 bytes, a cache line) apart (module
# docstring): program p of a producer adds into slot p % SLOTS, a reader adds the SLOTS up.
SLOTS = 16
STRIDE = 32
# Floats per use's row of `sums`: its SLOTS lines (so each row starts on 16 bytes, as torch.compile's
# code assumes of its inputs: a layer's view of the rows is one of them).
ROW = SLOTS * STRIDE


def scalar(value: float, device):
    """One use's row holding Σx² = `value` (in its first slot, the others zero), as a reader takes it."""
    import torch

    row = torch.zeros(ROW, device=device, dtype=torch.float32)
    row[0] = value
    return row


def total(rows):
    """The Σx² a reader takes from one use's row (or from each row of [uses, ROW]): its SLOTS partial
    sums added."""
    return rows.unflatten(-1, (SLOTS, STRIDE))[..., 0].sum(-1)


def fold(w, norm_weight):
    """W diag(g): the norm's weight multiplied into W's columns in float32, rounded once to W's
    dtype (module docstring: how that rounds against the model as written). One float32 copy of
    W at a time (a copy even of a float32 W, which is left as it was)."""
    import torch

    return w.to(torch.float32, copy=True).mul_(norm_weight.float()[None, :]).to(w.dtype)


def sums(layers: int, device):
    """The Σx² rows of a step of `layers` layers (SLOTS partial sums each), zeroed: row 0 the
    embedding row's, then two per layer (READ_INPUT ...); each kept at zero between steps by the
    step itself (module docstring)."""
    import torch

    return torch.zeros(2 * layers + 1, ROW, device=device, dtype=torch.float32)


def argmax_word(device):
    """The LM head's argmax word (int64, one): EMPTY_WORD until a step's LM head puts its logits
    in, reset by the next step's first kernel (module docstring)."""
    import torch

    return torch.full((1,), EMPTY_WORD, device=device, dtype=torch.int64)


def token_of(word):
    """The token in an argmax word, as a [1, 1] int32 view of its low 32 bits (the first four bytes:
    CUDA GPUs and the CPUs torch runs on are little-endian)."""
    import torch

    return word.view(torch.int32)[:1].view(1, 1)


@cache
def jit_functions():
    """The Triton functions the GEMV's epilogues call (sumsq_epilogue, argmax_epilogue), a reader's
    Σx² from a row of partial sums (read_sumsq) and the embedding row's kernel."""
    import triton
    import triton.language as tl

    # Triton's interpreter looks for triton.language among a called function's module globals
    # (a kernel's launch puts it there; these functions are called from gemv's kernel first);
    # a kernel reads a module's number only as a constexpr.
    globals().update(tl=tl, SLOTS_=tl.constexpr(SLOTS), STRIDE_=tl.constexpr(STRIDE))

    @triton.jit
    def read_sumsq(row_ptr):
        # a use's Σx²: its SLOTS partial sums, loaded and added
        return tl.sum(tl.load(row_ptr + tl.arange(0, SLOTS_) * STRIDE_), axis=0)  # noqa: F821 (globals)

    @triton.jit
    def sumsq_epilogue(y, ok, sumsq_ptr, clear_ptr):
        # Σ of the squares of the values this program wrote (as stored), into its slot of the next
        # use's row; relaxed: its reader runs after this whole grid (module docstring)
        yf = tl.where(ok, y.to(tl.float32), 0.0)
        slot = (tl.program_id(0) % SLOTS_) * STRIDE_  # noqa: F821 (globals)
        tl.atomic_add(sumsq_ptr + slot, tl.sum(yf * yf, axis=0), sem="relaxed")
        if tl.program_id(0) == 0:  # the use before: its reader has finished
            tl.store(clear_ptr + tl.arange(0, SLOTS_) * STRIDE_, tl.zeros((SLOTS_,), tl.float32))  # noqa: F821

    @triton.jit
    def argmax_epilogue(y, rows, ok, word_ptr):
        # The largest logit, lowest row first, of this program into the word: its smallest packed
        # word into one atomic min (module docstring); relaxed: read after this whole grid
        v = y.to(tl.float32)
        v = tl.where(v == 0.0, 0.0, v)  # -0.0 as +0.0: equal values, as torch.argmax has them
        bits = v.to(tl.int32, bitcast=True)
        key = bits ^ ((bits >> 31) & 0x7FFFFFFF)  # negative: magnitude flipped, so int order is float order
        word = ((~key).to(tl.int64) << 32) | rows.to(tl.int64)  # reversed: the smallest word wins
        word = tl.where(ok, word, 2**63 - 1)
        tl.atomic_min(word_ptr, tl.min(word, axis=0), sem="relaxed")

    @triton.jit
    def embed_kernel(
        tok_ptr, table_ptr, x_ptr, sumsq_ptr, word_ptr, last_sumsq_ptr, K,
        BLOCK_K: tl.constexpr, PDL: tl.constexpr, RESET: tl.constexpr,
    ):  # fmt: skip
        # One program copies the token's row and stores the sum of its squares into its row's first
        # slot (no atomic: it is alone; the other slots were left zero by the row's zeroing or never
        # written); with RESET, the first kernel of a step: resets what the step before left
        if PDL:  # the token may come from the step before
            tl.extra.cuda.gdc_wait()
            tl.extra.cuda.gdc_launch_dependents()
        if RESET:  # the LM head before, their reader, has finished
            tl.store(word_ptr, 2**63 - 1)
            tl.store(last_sumsq_ptr + tl.arange(0, SLOTS_) * STRIDE_, tl.zeros((SLOTS_,), tl.float32))  # noqa: F821
        row = tl.load(tok_ptr).to(tl.int64) * K
        sq = tl.zeros((BLOCK_K,), tl.float32)
        for k in range(0, K, BLOCK_K):
            cols = k + tl.arange(0, BLOCK_K)
            ok = cols < K
            v = tl.load(table_ptr + row + cols, mask=ok, other=0.0)
            tl.store(x_ptr + cols, v, mask=ok)
            vf = v.to(tl.float32)
            sq += vf * vf
        tl.store(sumsq_ptr, tl.sum(sq, axis=0))

    return SimpleNamespace(triton=triton, sumsq_epilogue=sumsq_epilogue, argmax_epilogue=argmax_epilogue,
                           read_sumsq=read_sumsq, embed_kernel=embed_kernel)  # fmt: skip


def embed_row(tokens, table, sumsq, pdl: bool = False, reset=None, block_k: int = 1024):
    """The embedding row of one token ([1, 1] ids) as x [1, 1, hidden], with its Σx² stored into
    the first slot of `sumsq` (one use's row, its other slots zero). One program: 8 KB of a row is a
    few microseconds of latency whatever the grid, and one program needs no atomic; `pdl`: launched with programmatic
    dependent launch, so that the first GEMV's weights load while it runs; `reset`: (the argmax
    word, the LM head's Σx² row), which it resets for this step's LM head."""
    import torch

    if tokens.numel() != 1:
        raise ValueError(f"embed_row takes one token, got ids of shape {tuple(tokens.shape)}")
    fns = jit_functions()
    k = table.shape[1]
    x = torch.empty(1, 1, k, device=table.device, dtype=table.dtype)
    extra = {"launch_pdl": True} if pdl else {}
    block = min(block_k, fns.triton.next_power_of_2(k))
    word, last = reset if reset is not None else (sumsq, sumsq)
    fns.embed_kernel[(1,)](
        tokens, table, x, sumsq, word, last, k, BLOCK_K=block, PDL=pdl, RESET=reset is not None, num_warps=4, **extra
    )  # fmt: skip
    return x
