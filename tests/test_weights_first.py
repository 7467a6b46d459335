"""The kernels of the rungs past PDL compute what PyTorch computes (on a CPU, in float32, in
Triton's interpreter, which has no grid dependency control: the wait itself runs only on a Hopper
GPU): the GEMV that loads its first tile of weights before the wait, and attention in one kernel."""

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"  # before any kernel is built

from labsupport.measure.models import qwen3_decode  # noqa: E402

pytest.importorskip("triton")
from labsupport.measure.kernels import decode_attention, gemv  # noqa: E402

from .conftest import assert_gemv_products  # noqa: E402

pytestmark = pytest.mark.unit
CLOSE = dict(rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    "config",
    [gemv.Config(2, 64, 4, 2), gemv.Config(8, 32, 4, 2), gemv.Config(2, 32, 4, 2, 3), gemv.Config(4, 128, 4, 2)],
    ids=["two-tiles", "three-tiles", "split-k", "one-tile-past-k"],
)
def test_the_gemv_with_its_first_tile_loaded_early_gives_the_same_products(config):
    # K = 96, not a multiple of the block: the first tile's mask matters too; split-K's buffer is zeroed again
    assert_gemv_products(config, early=True, k=96, rows=24, seed=7)


def test_the_gemv_with_only_its_first_tile_loaded_early_gives_the_same_products(monkeypatch):
    # no room for two tiles: the first alone before the wait, the second in the loop
    monkeypatch.setattr(gemv, "EARLY_BYTES", 0)
    assert gemv.early_tiles(gemv.Config(8, 32, 4, 2)) == 1
    assert_gemv_products(gemv.Config(8, 32, 4, 2), early=True, k=96, rows=24, seed=7)


def test_two_tiles_go_before_the_wait_where_they_fit_in_32_registers_a_thread():
    assert gemv.early_tiles(gemv.Config(4, 2048, 8, 2)) == 2  # gate/up's tiling: 4 x 2048 BF16 x 2 on 256 threads
    assert gemv.early_tiles(gemv.Config(8, 2048, 8, 2)) == 1
    assert gemv.early_tiles(gemv.Config(8, 2048, 8, 2), fp8=True) == 2  # FP8: half the bytes


def _attention_case(heads, kv_heads, d, slots, pos, seed=1):
    g = torch.Generator().manual_seed(seed)
    qkv = torch.randn(1, 1, (heads + 2 * kv_heads) * d, generator=g)
    qn, kn = torch.randn(d, generator=g), torch.randn(d, generator=g)
    cos, sin = torch.randn(slots, d, generator=g), torch.randn(slots, d, generator=g)
    kc, vc = torch.randn(1, kv_heads, slots, d, generator=g), torch.randn(1, kv_heads, slots, d, generator=g)
    return qkv, qn, kn, cos, sin, kc, vc, torch.tensor([pos])


@pytest.mark.parametrize(
    ("heads", "kv_heads", "slots", "pos", "chunk"),
    [(4, 2, 40, 37, 16), (8, 2, 70, 37, 2), (4, 4, 100, 0, 2), (4, 1, 64, 63, 1)],
    ids=["two-stretches", "chunked-combine", "first-position", "last-slot"],
)
def test_attention_in_one_kernel_matches_pytorch_and_resets_its_counters(heads, kv_heads, slots, pos, chunk):
    d = 16
    qkv, qn, kn, cos, sin, kc, vc, p = _attention_case(heads, kv_heads, d, slots, pos)
    shape = qwen3_decode.Shape(heads, kv_heads, d, 1e-6)
    kc_ref, vc_ref = kc.clone(), vc.clone()
    ref = qwen3_decode.attention([qkv], p, cos, sin, kc_ref, vc_ref, qn, kn, shape, fused=True)
    for _ in range(2):  # the second call finds every counter back at zero, or it would never combine
        out = decode_attention.decode_attention_one(qkv, qn, kn, cos, sin, kc, vc, p, heads, 1e-6, chunk=chunk)
        torch.testing.assert_close(out.reshape(ref.shape), ref, **CLOSE)
        torch.testing.assert_close(kc, kc_ref)  # the new k and v written where PyTorch writes them
        torch.testing.assert_close(vc, vc_ref)
        assert (decode_attention.counters(kv_heads, "cpu") == 0).all()


@pytest.mark.parametrize("block_s", [8, 16])
@pytest.mark.parametrize("per_head", [False, True], ids=["heads-together", "a-program-a-head"])
def test_attention_in_one_kernel_gives_the_same_output_at_every_stretch_length(block_s, per_head):
    # 70 slots: 9 stretches of 8 (the last partly past the cache), 5 of 16; one combining pass
    qkv, qn, kn, cos, sin, kc, vc, p = _attention_case(8, 2, 16, 70, 61, seed=3)
    shape = qwen3_decode.Shape(8, 2, 16, 1e-6)
    ref = qwen3_decode.attention([qkv], p, cos, sin, kc.clone(), vc.clone(), qn, kn, shape, fused=True)
    config = decode_attention.OneConfig(block_s, 4, per_head)
    out = decode_attention.decode_attention_one(qkv, qn, kn, cos, sin, kc, vc, p, 8, 1e-6, config=config)
    torch.testing.assert_close(out.reshape(ref.shape), ref, **CLOSE)


def test_attention_a_program_a_head_writes_the_cache_once_combines_in_chunks_and_resets_its_counters():
    # 70 slots in stretches of 8: 9 to combine, two at a time (five passes, the last half empty); a
    # counter per query head (8), and the new k and v written by one program of each K/V head
    qkv, qn, kn, cos, sin, kc, vc, p = _attention_case(8, 2, 16, 70, 37, seed=5)
    shape = qwen3_decode.Shape(8, 2, 16, 1e-6)
    kc_ref, vc_ref = kc.clone(), vc.clone()
    ref = qwen3_decode.attention([qkv], p, cos, sin, kc_ref, vc_ref, qn, kn, shape, fused=True)
    config = decode_attention.OneConfig(8, 4, per_head=True)
    for _ in range(2):
        out = decode_attention.decode_attention_one(qkv, qn, kn, cos, sin, kc, vc, p, 8, 1e-6, config=config, chunk=2)
        torch.testing.assert_close(out.reshape(ref.shape), ref, **CLOSE)
        torch.testing.assert_close(kc, kc_ref)
        torch.testing.assert_close(vc, vc_ref)
        assert (decode_attention.counters(8, "cpu") == 0).all()


def test_the_grouped_product_is_tuned_only_where_it_fits_in_registers_a_program_a_head_from_16_positions():
    # Qwen3-8B: 4 query heads a K/V head of 128. 32 positions on 4 warps were 128 floats a thread
    assert not decode_attention.fits_grouped(32, 4, 128, 4)
    assert decode_attention.fits_grouped(32, 4, 128, 8) and decode_attention.fits_grouped(16, 4, 128, 4)
    tried = decode_attention.tuned_configs(4, 128)
    together = [(c.block_s, c.num_warps) for c in tried if not c.per_head]
    apart = [(c.block_s, c.num_warps) for c in tried if c.per_head]
    assert together == [(8, 4), (8, 8), (16, 4), (16, 8), (32, 8)]
    assert apart == [(16, 4), (16, 8), (32, 4), (32, 8), (64, 4), (64, 8)]


def test_the_combine_takes_every_stretch_in_one_pass_up_to_32():
    assert decode_attention.combine_chunk(9) == 16
    assert decode_attention.combine_chunk(17) == 32
    assert decode_attention.combine_chunk(34) == 32  # two passes
    assert decode_attention.combine_chunk(1) == 1


def test_the_untuned_stretch_is_the_longest_that_gives_every_sm_a_program():
    # Qwen3-8B at 256 tokens (272 slots, 8 K/V heads) on 132 SMs: 16 positions, 17 x 8 = 136 programs
    assert decode_attention.filling_block(272, 8, 132) == 16
    assert decode_attention.filling_block(272, 8, 64) == 32  # 9 x 8 = 72 programs already fill 64 SMs
    assert decode_attention.filling_block(40, 2, 132) == 8  # none fills: the shortest


def test_attention_in_one_kernel_needs_a_power_of_two_group():
    qkv, qn, kn, cos, sin, kc, vc, p = _attention_case(6, 2, 16, 40, 3)
    with pytest.raises(ValueError, match="power of two"):
        decode_attention.decode_attention_one(qkv, qn, kn, cos, sin, kc, vc, p, 6, 1e-6)


@pytest.mark.live
@pytest.mark.parametrize("extra", [{"early_weights": True}, {"early_weights": True, "one_attention": True}])
def test_our_decoder_with_the_new_options_gives_transformers_logits(waits_as_no_ops, launches, extra):
    from labsupport.chapters import closing_the_gap as ch
    from labsupport.measure import decode, models

    torch.manual_seed(0)
    model = models.build_model("tiny", device="cpu", dtype=torch.float32)
    prompt = decode.Prompt.random(model.config.vocab_size, 1, 40, "cpu")
    ref = ch.reference(model, prompt)
    opts = qwen3_decode.Options(**ch.OWN_OPTIONS["pdl"], **extra)
    logits, token = qwen3_decode.OwnStep(model, prompt.ids, ref.token, opts, compile=False, graph=False)()
    torch.testing.assert_close(logits, ref.logits, **CLOSE)
    assert int(token) == int(ref.next_token)
    layers = model.config.num_hidden_layers
    early = sum(bool(k.get("early") and k.get("pdl")) for k in launches["gemv"])
    steps, rest = divmod(early, 4 * layers + 1)  # the step runs more than once (its warm-up)
    assert steps and not rest, "every GEMV of each step, the LM head's too, loads its weights first"
    one = sum(bool(k.get("pdl")) for k in launches["one"])
    assert one == (steps * layers if "one_attention" in extra else 0), "one attention kernel a layer"


def test_the_new_options_need_what_they_build_on():
    with pytest.raises(ValueError, match="early_weights needs pdl"):
        qwen3_decode.Options(fused=True, matmul="triton", early_weights=True)
    with pytest.raises(ValueError, match="one_attention needs"):
        qwen3_decode.Options(fused=True, matmul="triton", pdl=True, one_attention=True)


def test_the_ladder_climbs_past_pdl_one_change_a_rung():
    from labsupport.chapters import closing_the_gap as ch

    past = ["pdl", "weights-first", "one-attention", "folded-norms", "persistent"]
    rungs = list(ch.RUNGS)
    assert rungs[rungs.index("pdl") : rungs.index("pdl") + len(past)] == past
    fp8 = ["fp8-weights", "fp8-pdl", "fp8-folded"]
    assert rungs[-3:] == list(ch.FP8_RUNGS) == fp8  # FP8 last, each on a BF16 rung's options and on the FP8 one before
    pairs = [*zip(past, past[1:], strict=False), ("fused-attention", "fp8-weights"), ("one-attention", "fp8-pdl")]
    pairs += [("folded-norms", "fp8-folded"), ("fp8-pdl", "fp8-folded")]
    for before, rung in pairs:
        added = set(ch.OWN_OPTIONS[rung].items()) - set(ch.OWN_OPTIONS[before].items())
        assert len(added) == 1 and set(ch.OWN_OPTIONS[before].items()) <= set(ch.OWN_OPTIONS[rung].items())
        qwen3_decode.Options(**ch.OWN_OPTIONS[rung])  # options that fit together
    assert [ch.RUNG_SHORT[r].split()[0] for r in ch.RUNGS] == [str(i) for i in range(1, len(ch.RUNGS) + 1)]
