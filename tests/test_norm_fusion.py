"""The folded-norms rung (qwen3_decode.Options.fold_norms) computes what PyTorch and transformers
compute: its GEMV epilogues (the norm's scale from a row of Σx² partial sums, those summed by the
kernel that writes x, argmax in the LM head), the embedding row, the folded weights, and the whole step on
the tiny model. On a CPU, in float32, in Triton's interpreter, which has no grid dependency control
(the waits are no-ops there, exact where kernels run one after another)."""

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"  # before any kernel is built

from labsupport.measure.models import qwen3_decode  # noqa: E402

pytest.importorskip("triton")
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from labsupport.measure.kernels import folded_norms, gemv  # noqa: E402

from .conftest import tiny_model_with_norms  # noqa: E402

pytestmark = pytest.mark.unit
CLOSE = dict(rtol=1e-4, atol=1e-4)
EPS = 1e-6
# K = 96 below: none of these blocks divides it, so every mask matters (the last one's first tile too);
# the persistent one's programs (persistent_gemv.INTERPRETER_SMS of them) walk 6 to 16 blocks of rows each
CONFIGS = {
    "two-tiles": gemv.Config(2, 64, 4, 2),
    "three-tiles": gemv.Config(8, 32, 4, 2),
    "split-k": gemv.Config(2, 32, 4, 2, 3),
    "one-tile-past-k": gemv.Config(4, 128, 4, 2),
    "persistent": gemv.Config(2, 64, 4, 2, ctas_per_sm=1),
}
ONE_KERNEL = {name: c for name, c in CONFIGS.items() if c.split_k == 1}


def _case(seed, n=48, k=96):
    g = torch.Generator().manual_seed(seed)
    x, norm = torch.randn(1, 1, k, generator=g), 0.5 + torch.rand(k, generator=g)
    return x, norm, torch.randn(n, k, generator=g), torch.randn(n, k, generator=g)


def _sumsq(x):
    return (x.float() ** 2).sum().reshape(1)


def _row(x, spread=False):
    """x's Σx² as a row of partial sums: in the first slot, or (`spread`) cut into unequal parts over
    every slot, as the programs of a producer leave it."""
    if not spread:
        return folded_norms.scalar(float(_sumsq(x)), "cpu")
    parts = torch.rand(folded_norms.SLOTS, generator=torch.Generator().manual_seed(9))
    row = torch.zeros(folded_norms.ROW)
    row[:: folded_norms.STRIDE] = _sumsq(x) * parts / parts.sum()
    return row


@pytest.mark.parametrize("spread", [False, True], ids=["", "spread"])
@pytest.mark.parametrize("early", [False, True], ids=["", "early"])
@pytest.mark.parametrize("config", CONFIGS.values(), ids=CONFIGS.keys())
def test_a_gemv_with_the_norms_weight_folded_in_and_its_sum_of_squares_given_is_the_normed_product(
    config, early, spread
):
    x, norm, gate, up = _case(0)
    normed = qwen3_decode.rmsnorm(x, norm, EPS)
    s = _row(x, spread)
    kept = s.clone()
    w = torch.cat([gate, up])
    out = gemv.gemv(x, folded_norms.fold(w, norm), sumsq_in=s, config=config, early=early)
    torch.testing.assert_close(out, normed @ w.T, **CLOSE)
    act = torch.nn.functional.silu(normed @ gate.T) * (normed @ up.T)
    mlp = folded_norms.fold(gemv.interleave(gate, up), norm)
    torch.testing.assert_close(gemv.gemv(x, mlp, sumsq_in=s, silu=True, config=config, early=early), act, **CLOSE)
    assert torch.equal(s, kept)  # a reader leaves its row as it found it


@pytest.mark.parametrize("config", CONFIGS.values(), ids=CONFIGS.keys())
def test_a_residual_gemv_sums_the_squares_it_writes_and_zeroes_the_row_of_the_use_before(config):
    x, _, gate, up = _case(1)
    r = torch.randn(1, 1, gate.shape[0], generator=torch.Generator().manual_seed(2))
    into, before = torch.zeros(folded_norms.ROW), torch.full((folded_norms.ROW,), 5.0)
    y = gemv.gemv(x, gate, residual=r, sumsq_out=(into, before), config=config)
    torch.testing.assert_close(y, r + x @ gate.T, **CLOSE)
    torch.testing.assert_close(folded_norms.total(into).reshape(1), _sumsq(y), **CLOSE)
    assert not before[:: folded_norms.STRIDE].any()  # every slot of the row before
    into.zero_()  # and the SiLU GEMV's output, summed the same way
    act = gemv.gemv(x, gemv.interleave(gate, up), silu=True, sumsq_out=(into, before), config=config)
    torch.testing.assert_close(folded_norms.total(into).reshape(1), _sumsq(act), **CLOSE)


def test_a_producers_programs_add_into_slots_of_their_own_lines_by_program():
    """Program p adds into slot p % SLOTS, each slot STRIDE floats (a 128-byte line) from the next: with
    one row a program, slot i holds the squares of rows i, i + SLOTS, ...; nothing lands between slots."""
    g = torch.Generator().manual_seed(10)
    n, k = 2 * folded_norms.SLOTS + 5, 24  # more programs than slots, and not a multiple of them
    x, w, r = torch.randn(1, 1, k, generator=g), torch.randn(n, k, generator=g), torch.randn(1, 1, n, generator=g)
    into, before = torch.zeros(folded_norms.ROW), torch.zeros(folded_norms.ROW)
    y = gemv.gemv(x, w, residual=r, sumsq_out=(into, before), config=gemv.Config(1, 32, 4, 2)).reshape(n)
    slots = into.reshape(folded_norms.SLOTS, folded_norms.STRIDE)
    want = torch.zeros(folded_norms.SLOTS).index_add_(0, torch.arange(n) % folded_norms.SLOTS, y.float() ** 2)
    torch.testing.assert_close(slots[:, 0], want, **CLOSE)
    assert not slots[:, 1:].any()
    assert folded_norms.STRIDE * 4 == 128 and folded_norms.ROW == folded_norms.SLOTS * folded_norms.STRIDE


@pytest.mark.parametrize("config", [gemv.Config(4, 16, 4, 2), gemv.Config(2, 16, 4, 2, ctas_per_sm=1)],
                         ids=["", "persistent"])  # fmt: skip
def test_a_chain_of_producers_and_readers_leaves_every_row_ready_for_the_next_call(config):
    """embedding row (zeroes row 2, the LM head's of the call before) -> QKV (reads row 0) ->
    o_proj + residual (adds row 1, zeroes row 0) -> gate/up (reads row 1) -> down + residual (adds
    row 2, zeroes row 1), twice: the second call starts from the rows the first left, and would
    read or leave doubled sums if any was left unzeroed."""
    g = torch.Generator().manual_seed(3)
    k, inter, vocab = 40, 24, 30
    table = torch.randn(vocab, k, generator=g)
    in_norm, post_norm = 0.5 + torch.rand(k, generator=g), 0.5 + torch.rand(k, generator=g)
    wq, wo = torch.randn(k, k, generator=g), torch.randn(k, k, generator=g)
    gate, up, down = (
        torch.randn(inter, k, generator=g),
        torch.randn(inter, k, generator=g),
        torch.randn(k, inter, generator=g),
    )
    qkv_f, mlp_f = folded_norms.fold(wq, in_norm), folded_norms.fold(gemv.interleave(gate, up), post_norm)
    sums, word = folded_norms.sums(1, "cpu"), folded_norms.argmax_word("cpu")
    tok = torch.tensor([[7]])
    for _ in range(2):
        x = folded_norms.embed_row(tok, table, sums[0], reset=(word, sums[2]), block_k=16)
        q = gemv.gemv(x, qkv_f, sumsq_in=sums[0], config=config)
        x1 = gemv.gemv(q, wo, residual=x, sumsq_out=(sums[1], sums[0]), config=config)
        act = gemv.gemv(x1, mlp_f, silu=True, sumsq_in=sums[1], config=config)
        out = gemv.gemv(act, down, residual=x1, sumsq_out=(sums[2], sums[1]), config=config)
        h = qwen3_decode.rmsnorm(table[7].reshape(1, 1, k), in_norm, EPS) @ wq.T
        want1 = table[7] + h @ wo.T
        h2 = qwen3_decode.rmsnorm(want1, post_norm, EPS)
        want = want1 + (torch.nn.functional.silu(h2 @ gate.T) * (h2 @ up.T)) @ down.T
        torch.testing.assert_close(out, want, **CLOSE)
        torch.testing.assert_close(folded_norms.total(sums[2]).reshape(1), _sumsq(out), **CLOSE)
        assert sums[:2].eq(0).all()


def test_the_embedding_row_is_copied_with_the_sum_of_its_squares():
    table = torch.randn(11, 40, generator=torch.Generator().manual_seed(4))
    s = folded_norms.scalar(3.0, "cpu")  # stored, not added: no zeroing needed before
    x = folded_norms.embed_row(torch.tensor([[9]]), table, s, block_k=16)  # 40 = 16 + 16 + 8: masked
    torch.testing.assert_close(x, table[9].reshape(1, 1, 40))
    torch.testing.assert_close(s, _row(table[9]))
    with pytest.raises(ValueError, match="one token"):
        folded_norms.embed_row(torch.tensor([[1, 2]]), table, s)


@pytest.mark.parametrize("config", ONE_KERNEL.values(), ids=ONE_KERNEL.keys())
def test_the_lm_heads_argmax_epilogue_gives_torchs_token_until_the_next_steps_first_kernel_resets_it(config):
    x, norm, w, _ = _case(5, n=37)  # 37 rows: the last block is cut short
    quiet = 0.01 * torch.randn(37, 96, generator=torch.Generator().manual_seed(6))  # every logit far below w's
    word, s = folded_norms.argmax_word("cpu"), _row(x, spread=True)
    token = folded_norms.token_of(word)
    tokens = []
    for weight in (w, quiet):  # the second's largest logit is below the first's: a word left unreset would win
        logits = gemv.gemv(x, folded_norms.fold(weight, norm), sumsq_in=s, argmax=word, config=config)
        torch.testing.assert_close(logits, qwen3_decode.rmsnorm(x, norm, EPS) @ weight.T, **CLOSE)
        tokens.append(int(token))
        assert token.shape == (1, 1) and tokens[-1] == int(logits.argmax())
        assert torch.equal(s, _row(x, spread=True))  # read, and left for the next step's first kernel
        folded_norms.embed_row(torch.tensor([[0]]), x.reshape(1, -1), torch.zeros(folded_norms.ROW), reset=(word, s))
        assert int(word) == folded_norms.EMPTY_WORD and not s.any()
        s.copy_(_row(x, spread=True))
    assert tokens[0] != tokens[1]


def test_argmax_is_the_lm_heads_one_kernel_epilogue():
    x, _, w, _ = _case(7)
    state = folded_norms.argmax_word("cpu")
    with pytest.raises(ValueError, match="no split-K"):
        gemv.gemv(x, w, argmax=state, config=CONFIGS["split-k"])
    with pytest.raises(ValueError, match="no SiLU"):
        gemv.gemv(x, w, argmax=state, silu=True)


globals()["argmax_epilogue"] = folded_norms.jit_functions().argmax_epilogue  # for the kernel below


@triton.jit
def argmax_kernel(v_ptr, word_ptr, n, BLOCK: tl.constexpr):
    rows = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = rows < n
    argmax_epilogue(tl.load(v_ptr + rows, mask=ok, other=0.0), rows, ok, word_ptr)  # noqa: F821 (a global)


INF = float("inf")
ORDERS = {
    "negative": [-3.0, -1.5, -2.0, -7.0, -1.25],
    "negative-and-positive": [-1.0, 2.0, -5.0, 3.0, 0.5, -3.5],
    "tiny-beats-zero": [0.0, -1e-38, 1e-38, -0.0],
    "minus-zero-first": [-0.0, 0.0, -2.0],
    "zero-ties-minus-zero": [-1.0, 0.0, -0.0, -0.0],
    "ties-across-programs": [1.0, 5.0, 2.0, 5.0, 5.0],
    "tie-in-a-later-program-first": [0.0, 1.0, 9.0, 3.0, 9.0],
    "infinities": [-INF, 3e38, INF, -3e38, INF],
    "all-minus-infinity": [-INF, -INF, -INF],
}


@pytest.mark.parametrize("values", ORDERS.values(), ids=ORDERS.keys())
def test_the_packed_argmax_word_orders_as_torch_argmax(values):
    v = torch.tensor(values, dtype=torch.float32)
    word = folded_norms.argmax_word("cpu")
    argmax_kernel[(triton.cdiv(v.numel(), 2),)](v, word, v.numel(), BLOCK=2)  # two values a program
    assert int(folded_norms.token_of(word)) == int(torch.argmax(v))


def test_fold_multiplies_the_columns_in_float32_and_rounds_once():
    g = torch.Generator().manual_seed(8)
    w, norm = torch.randn(6, 5, generator=g).bfloat16(), (0.5 + torch.rand(5, generator=g)).bfloat16()
    folded = folded_norms.fold(w, norm)
    assert folded.dtype == torch.bfloat16
    assert torch.equal(folded, (w.float() * norm.float()).bfloat16())


# Our decoder with the option, on the tiny model whose norms' weights are made unlike 1 (as built,
# they are all 1, and a fold would change nothing).


FUSED_GEMV = {"fused": True, "matmul": "triton", "fuse_gemv": True}  # rung 8's options


def test_folded_weights_are_made_once_per_model_and_again_when_a_norm_changes(tiny_with_norms):
    import copy

    model = copy.deepcopy(tiny_with_norms[0])
    opts = qwen3_decode.Options(**FUSED_GEMV, fold_norms=True)
    dec, again = qwen3_decode.Qwen3Decoder(model, 48, opts), qwen3_decode.Qwen3Decoder(model, 48, opts)
    assert dec.weights[0][4] is again.weights[0][4] and dec.lm_head is again.lm_head
    a, lyr = model.model.layers[0].self_attn, model.model.layers[0]
    qkv = torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight])
    torch.testing.assert_close(dec.weights[0][4], qkv * lyr.input_layernorm.weight)
    assert dec.weights[0][:2] == (None, None) and dec.norm is None  # the folded norms are read no more
    unfolded = qwen3_decode.Qwen3Decoder(model, 48, qwen3_decode.Options(**FUSED_GEMV))
    norms = lyr.input_layernorm.weight.numel() + lyr.post_attention_layernorm.weight.numel()
    layers, hidden = model.config.num_hidden_layers, model.config.hidden_size
    assert unfolded.weight_bytes() - dec.weight_bytes() == 4 * (layers * norms + hidden)
    with torch.no_grad():
        lyr.input_layernorm.weight.mul_(2.0)
    refolded = qwen3_decode.Qwen3Decoder(model, 48, opts)
    torch.testing.assert_close(refolded.weights[0][4], 2.0 * dec.weights[0][4])


def test_the_folded_decoders_prompt_pass_gives_transformers_logits(tiny_with_norms):
    model, prompt, _ = tiny_with_norms
    dec = qwen3_decode.Qwen3Decoder(model, 48, qwen3_decode.Options(**FUSED_GEMV, fold_norms=True))
    n = prompt.ids.shape[1]
    with torch.no_grad():
        ours = dec.forward(prompt.ids, torch.arange(n), step=False, last_only=False)
        want = model(input_ids=prompt.ids).logits
    torch.testing.assert_close(ours, want, **CLOSE)


def test_in_bf16_the_folded_weights_rounding_keeps_the_logits_as_close_to_float32_as_eagers():
    """The fold moves BF16's rounding from the normed activations to the weights: on the prompt
    pass (PyTorch's matmuls, so BF16 runs on a CPU) the folded decoder's last logits pass the
    chapter's check against the float32 model, with eager BF16's own error as the yardstick."""
    import copy

    from labsupport.chapters import closing_the_gap as ch

    model, prompt = tiny_model_with_norms(torch.bfloat16)
    ids = prompt.ids
    dec = qwen3_decode.Qwen3Decoder(model, 48, qwen3_decode.Options(**FUSED_GEMV, fold_norms=True))
    with torch.no_grad():
        eager = model(input_ids=ids).logits[:, -1].float()
        truth = copy.deepcopy(model).float()(input_ids=ids).logits[:, -1]
        ours = dec.forward(ids, torch.arange(ids.shape[1]), step=False).float()
    ref = ch.Reference(ids[:, -1:], eager, eager.argmax(-1), truth)
    assert ref.eager_error > 1e-3  # BF16's rounding shows
    check = ch.fidelity((ours, ours.argmax(-1)), ref, ch.ERROR_FACTOR)
    assert check["passed"] and check["same_token"], check


@pytest.mark.live
@pytest.mark.parametrize("base", ["fused-gemv", "one-attention", "persistent"])
def test_our_decoder_with_folded_norms_gives_transformers_logits_and_token(
    tiny_with_norms,
    waits_as_no_ops,
    monkeypatch,
    base,
):
    from labsupport.chapters import closing_the_gap as ch
    from labsupport.measure.kernels import triton_kernels

    model, prompt, ref = tiny_with_norms
    launches = []
    launch = gemv.launch

    def counted_launch(*a, **k):
        launches.append({n: k.get(n) is not None for n in ("norm_weight", "sumsq_in", "sumsq_out", "argmax")})
        launches[-1]["persistent"] = k.get("persistent")
        return launch(*a, **k)

    def no_rmsnorm_kernel(*a, **k):
        raise AssertionError("the final norm is in the LM head")

    monkeypatch.setattr(gemv, "launch", counted_launch)
    monkeypatch.setattr(triton_kernels, "rmsnorm", no_rmsnorm_kernel)
    # the folded-norms rung on rung 8's options, the rung itself (on one-attention's), the persistent rung
    options = {"fused-gemv": {**FUSED_GEMV, "fold_norms": True}, "one-attention": ch.OWN_OPTIONS["folded-norms"],
               "persistent": ch.OWN_OPTIONS["persistent"]}[base]  # fmt: skip
    step = qwen3_decode.OwnStep(model, prompt.ids, ref.token, qwen3_decode.Options(**options), compile=False,
                                graph=False)  # fmt: skip
    for _ in range(2):  # after its warm-up's three: every scalar and the word reset where a step needs it
        logits, token = step()
        torch.testing.assert_close(logits, ref.logits, **CLOSE)
        assert token is step.dec.next_token and int(token) == int(ref.next_token)  # the LM head's word
        check = ch.fidelity((logits, token), ref, ch.ERROR_FACTOR)
        assert check["passed"] and check["same_token"]
        sums = step.dec.sums
        assert sums[:-1].eq(0).all() and folded_norms.total(sums[-1]) > 0  # the last: the next step's first kernel's
    layers = model.config.num_hidden_layers
    per_step = 4 * layers + 1
    steps, rest = divmod(len(launches), per_step)
    assert steps == 5 and not rest
    one = launches[-per_step:]
    assert not any(c["norm_weight"] for c in one), "no GEMV reads a norm's weight"
    assert sum(c["sumsq_in"] for c in one) == 2 * layers + 1  # QKV, gate/up, the LM head
    assert sum(c["sumsq_out"] for c in one) == 2 * layers  # o_proj + residual, down + residual
    assert [c["argmax"] for c in one] == [False] * (per_step - 1) + [True]
    assert all(c["persistent"] == (base == "persistent") for c in launches), "every GEMV of the step, or none"


def test_folded_norms_need_our_fused_gemv_and_one_gpu_and_take_fp8_but_not_persistent():
    with pytest.raises(ValueError, match="fold_norms needs fuse_gemv"):
        qwen3_decode.Options(fused=True, matmul="triton", fold_norms=True)
    qwen3_decode.Options(**FUSED_GEMV, fp8=True, fold_norms=True)  # the folded matrices rounded to FP8
    with pytest.raises(ValueError, match="take no fp8"):
        qwen3_decode.Options(**FUSED_GEMV, pdl=True, fp8=True, fold_norms=True, persistent=True)
    opts = qwen3_decode.Options(**FUSED_GEMV, fold_norms=True)
    shape = qwen3_decode.Shape(4, 2, 16, EPS)
    with pytest.raises(ValueError, match="one-GPU"):
        qwen3_decode.layer(torch.zeros(1, 1, 64), None, None, None, None, None, shape=shape, opts=opts,
                           reduce=lambda t: t)  # fmt: skip
