"""The chapter "Closing the gap": our decode step and our Triton kernels compute what
transformers computes (on a CPU, in float32, the kernels in Triton's interpreter), the live
cells on a CPU (tiny model, the plain PyTorch rungs), and the analysis of its fixture run,
recorded on the H200."""

import os
import re

import pandas as pd
import pytest
import torch

from labsupport import chapters

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"  # before any kernel is built

from labsupport.chapters import closing_the_gap as ch  # noqa: E402
from labsupport.chapters import published  # noqa: E402
from labsupport.measure import decode, models
from labsupport.measure.models import qwen3_decode  # noqa: E402
from labsupport.traces import kernels  # noqa: E402

from .conftest import FIXTURES, fixture_run, folded_and_rounded, with_shared_owners  # noqa: E402
from .live_cells import parameters, run_live_cells, watch_harness  # noqa: E402
from .page_names import unglued  # noqa: E402

pytest.importorskip("triton")
from labsupport.measure.kernels import decode_attention, gemv, weight_timing  # noqa: E402

pytestmark = pytest.mark.unit

NOTEBOOK = "notebooks/closing_the_gap.ipynb"


# Our kernels against PyTorch (float32: the interpreter has no bfloat16).


@pytest.mark.parametrize("config", [gemv.Config(2, 64, 4, 2), gemv.Config(8, 32, 4, 2)])
def test_gemv_and_its_fusions_match_pytorch(config):
    g = torch.Generator().manual_seed(0)
    k, i = 96, 40  # K not a multiple of the block: the masks matter
    x, nw = torch.randn(1, 1, k, generator=g), torch.randn(k, generator=g)
    gate, up = torch.randn(i, k, generator=g), torch.randn(i, k, generator=g)
    w = torch.cat([gate, up])
    close = dict(rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(gemv.gemv(x, w, config=config), torch.nn.functional.linear(x, w), **close)
    normed = qwen3_decode.rmsnorm(x, nw, 1e-6)
    torch.testing.assert_close(
        gemv.gemv(x, w, norm_weight=nw, config=config), torch.nn.functional.linear(normed, w), **close
    )
    act = torch.nn.functional.silu(normed @ gate.T) * (normed @ up.T)
    fused = gemv.gemv(x, gemv.interleave(gate, up), norm_weight=nw, silu=True, config=config)
    assert fused.shape == (1, 1, i)
    torch.testing.assert_close(fused, act, **close)
    r = torch.randn(1, 1, 2 * i, generator=g)
    torch.testing.assert_close(gemv.gemv(x, w, residual=r, config=config), r + x @ w.T, **close)


def test_gemv_takes_one_vector_only():
    with pytest.raises(ValueError, match="one vector"):
        gemv.gemv(torch.randn(2, 8), torch.randn(4, 8))


def test_interleave_alternates_gate_and_up_rows():
    gate, up = torch.arange(6.0).reshape(3, 2), 10 + torch.arange(6.0).reshape(3, 2)
    assert gemv.interleave(gate, up)[:, 0].tolist() == [0, 10, 2, 12, 4, 14]


def test_decode_attention_matches_pytorch_across_several_stretches():
    g = torch.Generator().manual_seed(1)
    heads, kv_heads, d, slots, pos = 4, 2, 16, 40, 37  # 37 + 1 positions: two stretches of 32
    qkv = torch.randn(1, 1, (heads + 2 * kv_heads) * d, generator=g)
    qn, kn = torch.randn(d, generator=g), torch.randn(d, generator=g)
    cos, sin = torch.randn(slots, d, generator=g), torch.randn(slots, d, generator=g)
    kc, vc = torch.randn(1, kv_heads, slots, d, generator=g), torch.randn(1, kv_heads, slots, d, generator=g)
    p = torch.tensor([pos])
    shape = qwen3_decode.Shape(heads, kv_heads, d, 1e-6)
    kc_ref, vc_ref = kc.clone(), vc.clone()
    ref = qwen3_decode.attention([qkv], p, cos, sin, kc_ref, vc_ref, qn, kn, shape, fused=True)
    out = decode_attention.decode_attention(qkv, qn, kn, cos, sin, kc, vc, p, heads, 1e-6)
    torch.testing.assert_close(out.reshape(ref.shape), ref, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(kc, kc_ref)  # the new k and v written where PyTorch writes them
    torch.testing.assert_close(vc, vc_ref)


# Our decode step against transformers.


@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(0)
    model = models.build_model("tiny", device="cpu", dtype=torch.float32)
    prompt = decode.Prompt.random(model.config.vocab_size, 1, 40, "cpu")
    return model, prompt, ch.reference(model, prompt)


# pdl and the rungs on it: Triton's interpreter has no grid dependency control (gdc_wait); they run only on a
# Hopper GPU (tests/test_weights_first.py and test_norm_fusion.py check their kernels with the wait a no-op).
@pytest.mark.live
@pytest.mark.parametrize("rung", [r for r, o in ch.OWN_OPTIONS.items() if not o.get("pdl") and r not in ch.FP8_RUNGS])
def test_each_of_our_rungs_gives_transformers_logits(tiny, rung):
    model, prompt, ref = tiny
    opts = qwen3_decode.Options(**ch.OWN_OPTIONS[rung])
    logits, token = qwen3_decode.OwnStep(model, prompt.ids, ref.token, opts, compile=False, graph=False)()
    torch.testing.assert_close(logits, ref.logits, rtol=1e-4, atol=1e-4)
    assert int(token) == int(ref.next_token)
    check = ch.fidelity((logits, token), ref, ch.error_factor(rung))
    assert check["passed"] and check["same_token"]


@pytest.fixture(scope="module")
def fp8_rounded(tiny):
    """A copy of the tiny model whose matrices were rounded to FP8 and back: the weights the FP8
    rungs compute with (row scales are per row, so fusing rows first, as the step does, rounds each
    row as alone)."""
    import copy

    from labsupport.measure.kernels import gemv_fp8

    rounded = copy.deepcopy(tiny[0])
    with torch.no_grad():
        for mod in rounded.modules():
            if isinstance(mod, torch.nn.Linear):
                mod.weight.copy_(gemv_fp8.dequantize(*gemv_fp8.quantize(mod.weight), mod.weight.dtype))
    return rounded


@pytest.mark.live
def test_the_fp8_rung_computes_rung_9_on_the_fp8_rounded_weights(tiny, fp8_rounded):
    """FP8 weights change the answer by their rounding only: the FP8 rung equals rung 9 run on a
    copy of the model whose matrices were rounded to FP8 and back."""
    model, prompt, ref = tiny
    rounded = fp8_rounded
    opts = qwen3_decode.Options(**ch.OWN_OPTIONS["fp8-weights"])
    logits, _ = qwen3_decode.OwnStep(model, prompt.ids, ref.token, opts, compile=False, graph=False)()
    nine = qwen3_decode.Options(**ch.OWN_OPTIONS["fused-attention"])
    want, _ = qwen3_decode.OwnStep(rounded, prompt.ids, ref.token, nine, compile=False, graph=False)()
    torch.testing.assert_close(logits, want, rtol=1e-3, atol=1e-3)
    assert (logits - ref.logits).abs().max() > 1e-3  # and the rounding does show against the exact model


@pytest.mark.live
@pytest.mark.usefixtures("waits_as_no_ops")
def test_the_fp8_rung_on_rung_13_passes_the_check_against_its_fp8_weights(tiny, fp8_rounded, launches):
    """The FP8 rung on rung 13's options reads the FP8 weights through rung 13's kernels (each GEMV
    its first tile before the wait, attention in one kernel) and passes the chapter's rule against the
    model whose matrices are those FP8 weights. (Against the exact tiny model it cannot: that model
    is float32, eager's own error is nil, and the rounding of the weights is all that shows, as the
    test above checks.)"""
    model, prompt, ref = tiny
    opts = qwen3_decode.Options(**ch.OWN_OPTIONS["fp8-pdl"])
    out = qwen3_decode.OwnStep(model, prompt.ids, ref.token, opts, compile=False, graph=False)()
    layers = model.config.num_hidden_layers
    fp8_early = sum(bool(k.get("scale") is not None and k.get("early") and k.get("pdl")) for k in launches["gemv"])
    steps, rest = divmod(fp8_early, 4 * layers + 1)  # the step runs more than once (its warm-up)
    assert steps and not rest, "every GEMV of each step, the LM head's too, reads FP8 weights, its first tile early"
    assert sum(bool(k.get("pdl")) for k in launches["one"]) == steps * layers, "one attention kernel a layer"
    rounded = ch.reference(fp8_rounded, prompt)
    assert torch.equal(rounded.token, ref.token)  # the same input token
    check = ch.fidelity(out, rounded, ch.error_factor("fp8-pdl"))
    assert check["passed"] and check["same_token"] and int(rounded.next_token) == int(ref.next_token)


@pytest.mark.live
@pytest.mark.usefixtures("waits_as_no_ops")
def test_the_fp8_rung_on_rung_14_computes_with_the_folded_matrices_rounded(tiny_with_norms, launches):
    """The FP8 rung on rung 14's options rounds the folded matrices (each norm's weight multiplied into the
    matrix after it) to E4M3, not the model's own: it passes the chapter's rule against a model whose
    matrices are those folded and rounded ones and whose norms are ones, on a tiny model whose norms are not
    ones (so that folding before rounding shows). Every GEMV reads FP8 weights and a row of Σx², the LM head
    picks the token, and no norm kernel runs."""
    from labsupport.measure.kernels import folded_norms, gemv_fp8

    model, prompt, ref = tiny_with_norms
    step = qwen3_decode.OwnStep(model, prompt.ids, ref.token, qwen3_decode.Options(**ch.OWN_OPTIONS["fp8-folded"]),
                                compile=False, graph=False)  # fmt: skip
    out = step()
    layers = model.config.num_hidden_layers
    folded = [k for k in launches["gemv"] if k.get("scale") is not None and k.get("sumsq_in") is not None]
    steps, rest = divmod(len(folded), 2 * layers + 1)  # QKV's, gate/up's and the LM head's read Σx² (not o's, down's)
    assert steps and not rest and all(k.get("early") and k.get("pdl") for k in folded)
    assert sum(k.get("argmax") is not None and k.get("scale") is not None for k in launches["gemv"]) == steps
    assert all(k.get("norm_weight") is None for k in launches["gemv"])  # no norm inside a GEMV: folded
    assert step.dec.weights[0][0] is None and step.dec.weights[0][1] is None  # the layer's two norms are folded
    assert step.dec.weights[0][4].dtype == torch.float8_e4m3fn
    rounded = ch.reference(folded_and_rounded(model), prompt)
    check = ch.fidelity(out, rounded, ch.error_factor("fp8-folded"))
    assert check["passed"] and check["same_token"] and int(rounded.next_token) == int(ref.next_token)
    # the first layer's QKV rows for q are q_proj folded, then rounded: not q_proj rounded, then folded
    q, g = model.model.layers[0].self_attn.q_proj.weight, model.model.layers[0].input_layernorm.weight
    w8, scale = step.dec.weights[0][4][: q.shape[0]], step.dec.weights[0][-4][: q.shape[0]]
    got = gemv_fp8.dequantize(w8, scale, torch.float32)
    torch.testing.assert_close(got, gemv_fp8.dequantize(*gemv_fp8.quantize(folded_norms.fold(q, g)), torch.float32))
    assert not torch.allclose(got, gemv_fp8.dequantize(*gemv_fp8.quantize(q), torch.float32) * g[None, :])


@pytest.mark.live
def test_the_float32_reference_is_the_model_in_float32(tiny):
    model, prompt, ref = tiny
    # the tiny model is float32 already: its "truth" is itself, to rounding
    assert ref.eager_error < 1e-4
    assert ch.eager_fidelity(ref)["passed"]


@pytest.mark.live
def test_a_wrong_step_fails_the_check(tiny):
    _, _, ref = tiny
    wrong = ref.logits.roll(1, dims=-1)  # the right numbers at the wrong tokens
    check = ch.fidelity((wrong, wrong.argmax(-1)), ref)
    assert not check["passed"]
    assert check["max_abs_err"] > ch.ERROR_FACTOR * check["eager_abs_err"]


@pytest.mark.live
def test_fused_rungs_share_one_concatenation_of_each_weight(tiny):
    """Every rung is alive at once (timed interleaved): fused rungs on one model share its
    concatenated weights instead of holding a copy each, and a weight written in place since is
    concatenated afresh."""
    model, prompt, ref = tiny
    fused = qwen3_decode.Qwen3Decoder(model, 48, qwen3_decode.Options(fused=True))
    again = qwen3_decode.Qwen3Decoder(model, 48, qwen3_decode.Options(fused=True))
    assert all(a is b for a, b in zip(fused.weights[0], again.weights[0], strict=True))
    interleaved = qwen3_decode.Qwen3Decoder(
        model, 48, qwen3_decode.Options(fused=True, matmul="triton", fuse_gemv=True)
    )
    assert interleaved.weights[0][4] is fused.weights[0][4]  # q|k|v: one copy
    assert interleaved.weights[0][6] is not fused.weights[0][6]  # gate|up interleaved is another layout
    up = model.model.layers[0].mlp.up_proj.weight
    with torch.no_grad():
        up.add_(1.0)
    try:
        changed = qwen3_decode.Qwen3Decoder(model, 48, qwen3_decode.Options(fused=True))
        assert changed.weights[0][6] is not fused.weights[0][6]
        torch.testing.assert_close(changed.weights[0][6][-up.shape[0] :], up)
    finally:
        with torch.no_grad():
            up.sub_(1.0)


@pytest.mark.live
def test_the_fp8_rungs_share_one_fp8_copy_of_each_weight(tiny):
    """The two FP8 rungs without folded norms read the same FP8 weights: one copy of each matrix, its row
    scales and the LM head's, made for the first and found by the second (each copy is 7.6 GB on
    Qwen3-8B). The rung with folded norms reads FP8 copies of the folded matrices, made once too."""
    model = tiny[0]
    first, second, folded = (
        qwen3_decode.Qwen3Decoder(model, 48, qwen3_decode.Options(**ch.OWN_OPTIONS[r])) for r in ch.FP8_RUNGS
    )
    fp8 = [t for t in first.weights[0] if t is not None and t.dtype == torch.float8_e4m3fn]
    assert len(fp8) == 4 and all(a is b for a, b in zip(first.weights[0], second.weights[0], strict=True))
    assert first.lm_head is second.lm_head and first.lm_scale is second.lm_scale
    mine = [t for t in folded.weights[0] if t is not None and t.dtype == torch.float8_e4m3fn]
    assert len(mine) == 4 and not any(a is b for a in mine for b in fp8) and folded.lm_head is not first.lm_head
    again = qwen3_decode.Qwen3Decoder(model, 48, qwen3_decode.Options(**ch.OWN_OPTIONS["fp8-folded"]))
    assert all(a is b for a, b in zip(folded.weights[0], again.weights[0], strict=True))


def test_the_weights_made_for_the_rungs_carry_no_autograd_graph():
    """Every matrix the rungs make from the model's parameters (concatenated, interleaved, folded,
    FP8) is made without autograd: with it, each kept the float32 intermediates of its making alive,
    and on an 80 GB card the folded matrices held 31 GB instead of 10 and the FP8 rungs ran out."""
    model = models.build_model("tiny", device="cpu", dtype="bfloat16")
    assert any(p.requires_grad for p in model.parameters()), "the model's parameters ask for gradients"
    rungs = [r for r in ch.OWN_OPTIONS if qwen3_decode.Options(**ch.OWN_OPTIONS[r]).fused]
    decoders = [qwen3_decode.Qwen3Decoder(model, 48, qwen3_decode.Options(**ch.OWN_OPTIONS[r])) for r in rungs]
    store = qwen3_decode._JOINED[model]
    assert {"q|k|v folded", "gate|up interleaved folded", "lm_head fp8"} <= {k[0] for k in store}
    made = {k: v if isinstance(v, tuple) else (v,) for k, (_, v) in store.items()}
    read = {id(t) for d in decoders for layer in d.weights for t in (*layer, d.lm_head, d.lm_scale)}
    assert all(id(t) in read for ts in made.values() for t in ts), "every matrix made is one a rung reads"
    assert not [k for k, ts in made.items() if any(t.requires_grad or t.grad_fn is not None for t in ts)]


@pytest.mark.live
def test_another_token_passes_only_as_a_near_tie_of_the_float32_step(tiny):
    """A rung whose greedy token is not eager's passes when the float32 step puts the two tokens
    within eager's own error of each other (BF16's rounding can swap them), and fails otherwise."""
    _, _, ref = tiny
    e = int(ref.next_token)
    truth = ref.truth.clone()
    other = int(truth.reshape(-1).argsort()[-2])  # the runner-up
    # a made-up eager error of 0.5 (the tiny model is float32: its own is nil)
    close = ch.Reference(ref.token, ref.truth + 0.5, ref.next_token, truth)
    logits = truth.clone()
    logits.reshape(-1)[other] = truth.reshape(-1)[e] + 0.1  # the runner-up now wins by 0.1
    gap = float(truth.reshape(-1)[e] - truth.reshape(-1)[other])
    check = ch.fidelity((logits, torch.tensor([other])), close)
    assert not check["same_token"] and check["tie_gap"] == pytest.approx(gap)
    assert check["passed"] == (gap <= 0.5)
    far = truth.clone()
    far.reshape(-1)[e] += 10.0  # eager's token 10 above the rest in float32
    check = ch.fidelity((logits, torch.tensor([other])), ch.Reference(ref.token, far + 0.5, ref.next_token, far))
    assert check["tie_gap"] > 10 and not check["passed"]


def test_the_page_says_a_run_without_tie_gaps_cannot_tell_a_tie_from_a_fault():
    from labsupport import runs

    run = runs.load_run(chapters.by_slug("closing-the-gap"), "20261201T230816Z-h200")
    note = ch.token_note(run)
    assert "cannot tell a near tie" in note and "*9 our attention kernels*" in note
    assert ch.token_note(fixture_run("closing-the-gap")) == ""  # every rung chose eager's token there


def test_the_fp8_rungs_that_change_the_token_within_their_own_error_are_explained_once():
    """Run 20261206T004616Z: both FP8 rungs chose another token, 0.671 apart in float32: more than eager's
    error (0.333), less than theirs (2.447, 2.388). One sentence names both."""
    from labsupport import runs

    run = runs.load_run(chapters.by_slug("closing-the-gap"), "20261206T004616Z-h100-80gb-hbm3")
    note = ch.token_note(run)
    assert note.startswith("*18 FP8 weights (own floor)* and *19 FP8 + dependent launch* chose another greedy token")
    assert note.count("0.671 apart") == 1 and "own errors (2.447 and 2.388)" in note and "fails them" in note


def test_a_rung_that_chose_eagers_token_but_failed_on_its_error_is_named_with_the_size_of_its_miss():
    """Run 20261207T030729Z: the one-attention rung chose eager's token with 0.641 against float32, 2.08 times
    eager's 0.308, past the bound of 2. The page names it and says by how much; a run where every rung passed
    (20261207T002010Z) says nothing, and a rung of another token is left to token_note."""
    from labsupport import runs

    def run(run_id):
        return runs.load_run(chapters.by_slug("closing-the-gap"), f"{run_id}-h100-80gb-hbm3")

    note = ch.check_note(run("20261207T030729Z"))
    assert note == (
        "Not every rung passed in this run. This rung chose eager's token, but its largest logit error against "
        "float32 was past the bound: *13 one attention kernel* 0.641, 2.08 times eager's own (bound: 2 times)."
    )
    assert ch.check_note(run("20261207T002010Z")) == ""
    other_token = run("20261206T100257Z")  # the persistent rung chose another token and failed: token_note's
    assert ch.check_note(other_token) == "" and "*15 persistent GEMVs*" in ch.token_note(other_token)


@pytest.mark.live
def test_a_rung_passes_only_if_every_call_of_its_step_passes(tiny):
    """repeated_fidelity on the tiny model's own-compiled step: every call the same, it passes; where a later call
    gives other logits (one logit nudged, within the bound) it is counted, and where one gives the right numbers at
    the wrong tokens the rung fails although its first call passed."""
    model, prompt, ref = tiny
    opts = qwen3_decode.Options(**ch.OWN_OPTIONS["own-compiled"])
    step = qwen3_decode.OwnStep(model, prompt.ids, ref.token, opts, compile=False, graph=False)
    same = ch.repeated_fidelity(step, ref, ch.ERROR_FACTOR, replays=3)
    assert (same["replays"], same["replays_differing"], same["replays_failed"]) == (3, 0, 0) and same["passed"]
    assert same["replay_max_abs_err"] == same["max_abs_err"]
    calls = []

    def changing():  # the real step; its 3rd call's logits nudged, its 4th's shifted by one token
        logits, token = step()
        calls.append(len(calls) + 1)
        if calls[-1] == 3:
            logits = logits.clone()
            logits[0, 0] += 1e-4
        if calls[-1] == 4:
            logits = logits.roll(1, dims=-1)
            token = logits.argmax(-1)
        return logits, token

    check = ch.repeated_fidelity(changing, ref, ch.ERROR_FACTOR, replays=4)
    assert calls == [1, 2, 3, 4, 5]
    assert (check["replays"], check["replays_differing"], check["replays_failed"]) == (4, 2, 1)
    assert check["same_token"] and check["max_abs_err"] == same["max_abs_err"]  # the first call's
    assert not check["passed"] and check["replay_max_abs_err"] > ch.ERROR_FACTOR * ref.eager_error


def test_the_page_says_which_rungs_gave_other_logits_on_a_later_call(tmp_path):
    """Run 20261207T044556Z called each of our rungs 30 more times: the four with folded norms (Σx² by atomic adds)
    gave other logits on most calls, every other rung the same bit for bit. A run recorded before the calls says
    nothing; a rung without those atomics that differs is named apart, and one that passed its first call but failed
    later ones is named by check_note with the worst call's error."""
    from labsupport import runs

    before = runs.load_run(chapters.by_slug("closing-the-gap"), "20261207T030729Z-h100-80gb-hbm3")
    assert ch.repeat_note(before) == "" and "calls differing" not in ch.page(before, ch.shared_values()).fidelity
    recorded = runs.load_run(chapters.by_slug("closing-the-gap"), "20261207T044556Z-h100-80gb-hbm3")
    assert ch.repeat_note(recorded) == (
        "After its check each of our rungs was called 30 more times, the same step on the same buffers. Calls of 30 "
        "that gave other logits than the first: *14 folded norms* 29, *15 persistent GEMVs* 28, *16 one kernel a "
        "layer* 30, *17 one kernel a step* 20; every other rung gave the same bit for bit. Each of these adds floats "
        "by atomics from many programs (x's sum of squares, the folded norms'), and floats added in another order "
        "round differently. The largest error against float32 over all their calls was 0.366, eager's own 0.308."
    )
    # this run's tuner kept no split-K config: the rungs that allow split-K add no floats by atomics here
    adders = {"folded-norms", "persistent", "layer-kernel", "step-kernel", "fp8-folded"}
    assert set(ch.atomic_adders(recorded)) == adders
    table = ch.page(recorded, ch.shared_values()).fidelity.set_index("rung")
    assert table.loc[ch.RUNGS["folded-norms"], "calls differing"] == "29 of 30"
    assert table.loc[ch.RUNGS["one-attention"], "calls differing"] == "0 of 30"
    assert table.loc[ch.RUNGS["eager"], "calls differing"] == "—"  # the reference, and transformers' rungs: not again
    later = {"passed": False, "replays_differing": 3, "replays_failed": 2, "replay_max_abs_err": 0.7}
    fake = with_rungs(recorded, tmp_path, {}, changed={"weights-first": later})
    assert "; every other rung" not in ch.repeat_note(fake)
    assert "Of these, *12 weights before the wait* adds no floats by atomics, so a kernel of its step reads memory" in (
        ch.repeat_note(fake)
    )
    assert ch.check_note(fake) == (
        "Not every rung passed in this run. This rung chose eager's token, but its largest logit error against "
        "float32 was past the bound: *12 weights before the wait* 0.700 on 2 of its 30 later calls, 2.27 times "
        "eager's own (bound: 2 times)."
    )


def test_the_repeat_note_sets_the_fp8_rungs_worst_error_apart_from_the_bf16_rungs():
    """Run 20261207T102609Z: rung 20 (FP8 weights, folded norms) adds Σx² by atomics too and gave other logits
    on 18 of 30 calls. Its worst error over its calls is said apart from the BF16 rungs', with its own bound:
    one maximum over both would set an FP8 error beside eager's BF16 one as if it were a BF16 rung's."""
    from labsupport import runs

    recorded = runs.load_run(chapters.by_slug("closing-the-gap"), "20261207T102609Z-h100-80gb-hbm3")
    note = ch.repeat_note(recorded)
    assert "*17 one kernel a step* 25, *20 FP8 + folded norms* 18; every other rung" in note
    assert note.endswith(
        "The largest error against float32 over all their calls was 0.370 for the BF16 rungs and 2.350 for the FP8 "
        "rung (allowed 32 times eager's error: its weights are rounded to 8 bits), eager's own 0.304."
    )


def test_each_fp8_rungs_kernels_are_found_by_the_fp8_configs_it_launches():
    """Run 20261207T102609Z tuned FP8 gate/up both with its norm (rungs 18-19: 16 rows a program, 1,536
    programs) and with SiLU alone (rung 20: 8 rows, 3,072 programs): each rung's GEMVs are named by the
    configs of the cases it launches, and none by the other's."""
    from labsupport import runs

    run = runs.load_run(chapters.by_slug("closing-the-gap"), "20261207T102609Z-h100-80gb-hbm3")
    for rung, grid in (("fp8-pdl", "1536,1,1"), ("fp8-folded", "3072,1,1")):
        g = ch.kernel_groups(run, rung).set_index("grid")
        assert g.loc[grid, "weight"] == "gate_up (fused)" and g.loc["768,1,1", "weight"] == "qkv (fused)"
        assert g.loc[grid, "MB"] == pytest.approx(36 * 24576 * 4096 / 1e6)
    from labsupport.chapters.closing_the_gap.kernel_time import _fp8_launches

    cases = ("norm", "norm+silu", "silu", "plain", "residual")  # QKV plain is the folded rung's alone, and the LM head
    assert [_fp8_launches(f, False, ch.OWN_OPTIONS["fp8-folded"]) for f in cases] == [False, False, True, True, True]
    assert [_fp8_launches(f, False, ch.OWN_OPTIONS["fp8-pdl"]) for f in cases] == [True, True, False, False, True]
    assert _fp8_launches("plain", True, ch.OWN_OPTIONS["fp8-pdl"])


def test_a_split_k_config_kept_by_the_tuner_makes_the_rungs_that_allow_it_add_floats_by_atomics(
    published_run, tmp_path
):
    """The published run's tuner kept no split-K config, so only the folded-norms rungs add by atomics; where it kept
    one (its gemv_tuning.csv with one kept row made split-K), every rung that allows split-K does too."""
    import hashlib
    import json
    import shutil

    from labsupport import runs

    folded = ["folded-norms", "fp8-folded", "layer-kernel", "persistent", "step-kernel"]
    assert sorted(ch.atomic_adders(published_run)) == folded
    new = tmp_path / "closing-the-gap" / published_run.run_id
    shutil.copytree(published_run.path, new)
    t = pd.read_csv(new / "gemv_tuning.csv")
    t.loc[t.index[t.chosen_split.astype(str).eq("True")][0], "split_k"] = 4
    t.to_csv(new / "gemv_tuning.csv", index=False)
    meta = json.loads((new / "meta.json").read_text())
    meta["files"]["gemv_tuning.csv"] = hashlib.sha256((new / "gemv_tuning.csv").read_bytes()).hexdigest()
    (new / "meta.json").write_text(json.dumps(meta))
    split = ch.atomic_adders(runs.load_run(chapters.by_slug("closing-the-gap"), published_run.run_id, root=tmp_path))
    assert sorted(split) == sorted(r for r, o in ch.OWN_OPTIONS.items() if o.get("split_k") or o.get("fold_norms"))
    assert split["split-k"] == ["a split-K GEMV's partial sums"] and len(split["folded-norms"]) == 2


def test_a_bf16_rung_whose_tokens_are_apart_within_its_own_error_is_not_called_beyond_rounding():
    """Run 20261206T100257Z: the persistent rung chose another token, 0.312 apart in float32: past eager's
    error (0.308) but within the rung's own (0.490). The page says the rule fails it, not that no rounding
    explains it."""
    from labsupport import runs

    run = runs.load_run(chapters.by_slug("closing-the-gap"), "20261206T100257Z-h100-80gb-hbm3")
    note = ch.token_note(run)
    assert note.startswith("*15 persistent GEMVs* chose another greedy token than eager.")
    assert "0.312 apart at most: more than eager's own error (0.308)" in note
    assert "less than the rung' own error (0.490)" not in note and "less than the rung's own error (0.490)" in note
    assert "The rule fails the rung" in note and "no rounding explains it" not in note


def test_the_launch_shapes_name_every_block_size_the_trace_recorded():
    """Run 20261206T100257Z: our GEMV ran blocks of 256 threads on four shapes and of 512 on one (16 warps);
    the page gives the range, not the largest alone. cuBLAS's blocks were all of 384 threads."""
    from labsupport import runs

    run = runs.load_run(chapters.by_slug("closing-the-gap"), "20261206T100257Z-h100-80gb-hbm3")
    text = ch.launch_text(run, ch.matmul_launches(run, "fused-projections"), ch.matmul_launches(run, "triton-gemv"))
    assert "Our GEMV runs 2,048–75,968 programs of 256–512 threads" in text
    assert "96–132 thread blocks of 384 threads" in text


def test_options_that_do_not_fit_together_are_refused():
    with pytest.raises(ValueError, match="fuse_gemv"):
        qwen3_decode.Options(fuse_gemv=True)
    with pytest.raises(ValueError, match="fused_attention"):
        qwen3_decode.Options(fused_attention=True)
    with pytest.raises(ValueError, match="matmul"):
        qwen3_decode.Options(matmul="cublas")


# The live cells on a CPU.


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    from labsupport.measure import harness

    root = tmp_path_factory.mktemp("runs")
    calls = []
    mp = pytest.MonkeyPatch()
    mp.setenv("LABSUPPORT_RUNS", str(root))
    watch_harness(mp, calls)
    real = harness.interleaved

    def interleaved(variants, **kw):
        calls.append(("interleaved", tuple(variants)))
        return real(variants, **kw)

    mp.setattr(harness, "interleaved", interleaved)
    try:
        run = run_live_cells(NOTEBOOK, preset="tiny", prompt_len=16, repeats=2, replays=2, allow_cpu=True)["run"]
    finally:
        mp.undo()
    return run, calls


@pytest.mark.live
def test_live_cells_time_our_rungs_interleaved_before_profiling_any(tiny_run):
    run, calls = tiny_run
    ran = ["eager", "own-compiled", "fused-projections"]
    ours = ("own-compiled", "fused-projections")  # transformers' rungs are shared: checked and profiled, not timed
    widths = tuple(f"{t} tokens" for t in ch.TOKENS)  # then the best one on several tokens at once
    assert calls == [("interleaved", ours), ("interleaved", widths)] + [("profile", "decode_step")] * len(ran)
    r = run.table("rungs")
    assert list(r.rung) == list(ch.RUNGS)
    ok = r[r.status == "ok"]
    assert list(ok.rung) == ran
    rest = r[r.status != "ok"].set_index("rung").status
    assert rest.drop("max-autotune").str.contains("needs a CUDA GPU").all()
    assert "launch-overhead" in rest["max-autotune"]
    assert ok.passed.astype(bool).all()
    mine = ok.set_index("rung").loc[list(ours)]
    # each of our rungs called again after its check (replays=2 on a CPU): the same logits every time
    assert (mine.replays == 2).all() and (mine.replays_differing == 0).all() and (mine.replays_failed == 0).all()
    assert (mine.replay_max_abs_err >= mine.max_abs_err).all()
    assert ok.set_index("rung").loc["eager", ["replays", "replays_differing"]].isna().all()  # the reference itself
    assert ch.repeat_note(run) == (
        "After its check each of our rungs was called 2 more times, the same step on the same buffers: every call "
        "gave its first call's logits, bit for bit."
    )
    assert mine.clean.astype(bool).all() and (mine.wall_ms_repeats == 2).all()
    assert (mine.wall_ms_min <= mine.wall_ms_q1).all() and (mine.wall_ms_q1 <= mine.wall_ms_median).all()
    assert ok.set_index("rung").loc["eager", ["wall_ms_min", "wall_ms_median"]].isna().all()  # not timed here
    t = run.table("step_times")
    assert set(t.rung) == set(ours) and set(t["round"]) == {0, 1}
    assert "ceilings.csv" not in run.meta["files"]  # the ceilings are the shared ones
    # a run of another configuration has no shared numbers for transformers' rungs, and its own rungs' times
    lad = ch.ladder(run).set_index("rung")
    assert lad.loc[list(ch.SHARED_RUNGS), "ms"].isna().all()
    assert lad.loc[list(ours), "ms"].tolist() == mine.wall_ms_min.tolist()
    assert ch.best(run) in ours
    # tokens per forward: every width timed, the time per token falling as tokens share one weight read
    tpf = ch.tokens_per_forward(run)
    assert list(tpf.tokens) == list(ch.TOKENS) and (tpf.status == "ok").all() and (tpf.repeats == 2).all()
    assert tpf["ms per token"].to_numpy() == pytest.approx((tpf.ms_min / tpf.tokens).to_numpy())
    assert set(tpf.rung) <= set(ours)


# The analysis of the H200 run.


@pytest.fixture(scope="module")
def run():
    return fixture_run("closing-the-gap")


@pytest.fixture(autouse=True)
def _owners_of_the_fixture_run(request, monkeypatch):
    """A test of the fixture run reads the shared quantities (the floor, the ceiling, the shared
    steps) from the fixture runs of their owners, recorded on its GPU, as a page reads those of
    its own book; a test of the published run reads the book's."""
    if "run" in request.fixturenames and "published_run" not in request.fixturenames:
        monkeypatch.setenv("LABSUPPORT_RUNS", str(FIXTURES))


def test_ladder_arithmetic(run):
    vals = ch.shared_values()
    lad = ch.ladder(run).set_index("rung")
    f = ch.floor(run)
    assert list(lad.index) == list(ch.RUNGS)
    r = run.table("rungs").set_index("rung")
    # the floor and the ceiling are the shared ones, with one meaning: bytes at the datasheet, at the best rate
    assert f.shared and f.floor_ms == pytest.approx(vals["floor_ms"].value)
    assert f.ceiling_ms == pytest.approx(vals["ceiling_ms"].value) and f.ceiling_ms > f.floor_ms
    for rung, p in ch.SHARED_RUNGS.items():  # transformers' rungs: the owners' numbers, never this run's
        assert lad.loc[rung, "ms"] == vals[f"{p}_wall_ms"].value
        assert lad.loc[rung, "GPU busy ms"] == vals[f"{p}_gpu_busy_ms"].value
        assert lad.loc[rung, "kernels"] == vals[f"{p}_kernels"].value
    assert lad.loc["eager", "median"] == vals["eager_wall_median_ms"].value
    assert lad.loc["max-autotune", "same answers"] is None  # not run here
    for rung in [x for x in lad.index if x not in ch.SHARED_RUNGS and x in r.index]:  # ours: the minimum (host clock)
        assert lad.loc[rung, "ms"] == r.loc[rung, "wall_ms_min"]
        assert lad.loc[rung, "median"] == r.loc[rung, "wall_ms_median"]
        assert lad.loc[rung, "q1"] <= lad.loc[rung, "median"] <= lad.loc[rung, "q3"]
        assert lad.loc[rung, "GPU busy ms"] == pytest.approx(r.loc[rung, "gpu_busy_ns"] / 1e6)
    assert lad["x floor"].to_numpy() == pytest.approx((lad.ms / f.floor_ms).to_numpy(), nan_ok=True)
    assert (lad["x floor"].dropna() > 1).all()  # nothing beats the floor
    # rungs added since the fixture was recorded are in the ladder, without numbers
    assert lad.loc[["split-k", "pdl", *ch.FP8_RUNGS], "ms"].isna().all()
    # the waterfall adds up: eager's time minus every rung's saving is the last rung's time
    last = lad["ms"].last_valid_index()
    assert lad.loc["eager", "ms"] - lad["ms saved"].sum() == pytest.approx(lad.loc[last, "ms"])


def test_a_new_run_reports_our_rungs_by_their_cuda_event_times(run, tmp_path):
    import hashlib
    import json
    import shutil

    from labsupport import runs

    new = tmp_path / "closing-the-gap" / run.run_id
    shutil.copytree(run.path, new)
    r = pd.read_csv(new / "rungs.csv")
    ours = ~r.rung.isin(list(ch.SHARED_RUNGS))
    for stat, x in (("min", 0.9), ("q1", 0.95), ("median", 1.0), ("q3", 1.05), ("max", 1.1)):
        r[f"gpu_ms_{stat}"] = (r.wall_ms_median * x).where(ours)
    r.to_csv(new / "rungs.csv", index=False)
    meta = json.loads((new / "meta.json").read_text())
    meta["files"]["rungs.csv"] = hashlib.sha256((new / "rungs.csv").read_bytes()).hexdigest()
    (new / "meta.json").write_text(json.dumps(meta))
    lad = ch.ladder(runs.load_run(chapters.by_slug("closing-the-gap"), run.run_id, root=tmp_path)).set_index("rung")
    want = r.set_index("rung")
    for rung in want.index[ours.to_numpy()]:
        assert lad.loc[rung, "ms"] == want.loc[rung, "gpu_ms_min"] and lad.loc[rung, "timed by"] == "CUDA events"


def test_compiled_matmuls_from_the_launch_overhead_run():
    from labsupport.chapters import shared

    lo = shared.values()["autotune_wall_ms"].run
    at, ro = ch.compiled_matmuls(lo, "compile-max-autotune"), ch.compiled_matmuls(lo, "compile-reduce-overhead")
    assert ro["library"] == ro["kernels"] > 0  # reduce-overhead leaves every matmul to the library
    assert at["generated"] > 0 and at["generated"] + at["library"] == at["kernels"]
    assert ch.compiled_matmuls(lo, "no-such-variant") is None


def test_best_is_the_fastest_rung_that_gives_eagers_answers(run):
    lad = ch.ladder(run)
    good = lad[lad["same answers"].eq(True)]
    assert ch.best(run) == good.loc[good["ms"].idxmin(), "rung"]
    assert ch.headline(run)["best wall ms"] == good["ms"].min()


def test_time_split_adds_up_to_each_rungs_wall_time(run):
    split = ch.time_split(run)
    parts = split[["floor ms", "kernels above floor ms", "GPU idle ms"]].sum(axis=1)
    assert parts.to_numpy() == pytest.approx(split["wall ms"].to_numpy())


def test_census_by_rung_counts_every_kernel_of_every_trace(run):
    counts = ch.census_by_rung(run).set_index("rung")
    for rung in counts.index:
        k = ch.kernel_table(run, rung)
        assert counts.loc[rung, "total"] == len(k)
        assert counts.drop(columns="total").loc[rung].sum() == len(k)
        assert "other" not in counts.columns  # every kernel has a kind
    # the last rung's attention is our two kernels per layer, counted as attention
    k = ch.kernel_table(run, "fused-attention")
    assert set(k[k.kind == "attention"].name) == {"attention_part_kernel", "attention_combine_kernel"}


def test_remaining_adds_up_to_the_span_of_the_best_rungs_kernels(run):
    best = ch.best(run)
    rem = ch.remaining(run, best)
    k = ch.kernel_table(run, best)
    x = kernels.exclusive_times(k)
    assert rem.ms.sum() == pytest.approx((k.end_ns.max() - k.start_ns.min()) / 1e6, abs=1e-9)
    parts = rem.set_index("part")
    mm = parts.loc["matrix multiply kernels"]
    assert mm["floor ms"] == pytest.approx(ch.floor(run).floor_ms)
    assert "kernels overlapping each other" not in parts.index  # exclusive time has no overlap
    assert mm.ms == pytest.approx(x.exclusive_ns[k.kind == "matrix multiply"].sum() / 1e6)


@pytest.fixture(scope="module")
def published_run():
    """The chapter's published run in runs/ (the newest recording, with the dependent-launch rung)."""
    return ch.load()


def test_exclusive_times_add_up_to_the_span_of_every_recorded_trace(run, published_run):
    traces = [(run, rung) for rung in ch.RUNGS if ch.trace_file(rung) in run.meta["files"]]
    assert len(traces) >= 8 and ch.trace_file("pdl") in published_run.meta["files"]
    for r, rung in [*traces, (published_run, "pdl")]:
        k = ch.kernel_table(r, rung)
        x = kernels.exclusive_times(k)
        span = int(k.end_ns.max() - k.start_ns.min())
        assert int(x.exclusive_ns.sum() + x.gap_before_ns.sum()) == span, (r.run_id, rung)  # exactly
        assert int(x.exclusive_ns.sum()) == kernels.gpu_busy_ns(k), (r.run_id, rung)
        assert (x.exclusive_ns <= k.dur_ns).all() and (x.exclusive_ns >= 0).all() and (x.gap_before_ns >= 0).all()
    # with dependent launch the durations overlap: summed, they pass the span; exclusive times never do
    k = ch.kernel_table(published_run, "pdl")
    assert k.dur_ns.sum() > k.end_ns.max() - k.start_ns.min()


def test_the_budget_of_the_dependent_launch_rung_is_by_exclusive_time(published_run):
    rem = ch.remaining(published_run, "pdl").set_index("part")
    k = ch.kernel_table(published_run, "pdl")
    x = kernels.exclusive_times(k)
    span_ms = (k.end_ns.max() - k.start_ns.min()) / 1e6
    assert rem.ms.sum() == pytest.approx(span_ms, abs=1e-9)
    assert (rem.ms > 0).all() and "kernels overlapping each other" not in rem.index
    mm = k.kind == "matrix multiply"
    assert rem.loc["matrix multiply kernels", "ms"] == x.exclusive_ns[mm].sum() / 1e6 < k.dur_ns[mm].sum() / 1e6
    assert rem.loc["gaps between kernels", "ms"] == pytest.approx(span_ms - kernels.gpu_busy_ns(k) / 1e6, abs=1e-9)
    groups = ch.kernel_groups(published_run, "pdl").set_index("weight")
    assert groups["exclusive µs"].sum() == pytest.approx(kernels.gpu_busy_ns(k) / 1e3)
    qkv = groups.loc["qkv (fused)"]  # launched early, it waits: its exclusive time is shorter, its rate higher
    assert qkv["exclusive µs"] < qkv["µs"] and qkv["TB/s exclusive"] == pytest.approx(qkv.MB / qkv["exclusive µs"])
    assert qkv["TB/s exclusive"] > qkv["TB/s"]


def test_a_persistent_rungs_gemvs_are_named_by_their_place_in_the_step(published_run, tmp_path):
    """Every persistent GEMV has the same grid, so its matrix is found by launch order: four a layer
    (q|k|v, o_proj, gate|up, down_proj), then the LM head. On the dependent-launch rung's trace, read
    as a persistent rung's, that order gives each matrix the kernels and bytes its grid gives it."""
    fake = with_rungs(published_run, tmp_path, {"persistent": ("pdl", {})})
    by_order = ch.kernel_groups(fake, "persistent").set_index("weight")
    by_grid = ch.kernel_groups(published_run, "pdl").set_index("weight")
    layers = 36  # Qwen3-8B
    for name in ("qkv (fused)", "gate_up (fused)", "lm_head"):
        assert (
            by_order.loc[name, ["kernels", "µs", "MB"]].tolist() == by_grid.loc[name, ["kernels", "µs", "MB"]].tolist()
        )
    both = by_order.loc[["o_proj", "down_proj"]]
    assert both.kernels.tolist() == [layers, layers] and by_order.loc["qkv (fused)", "kernels"] == layers
    assert both["µs"].sum() == pytest.approx(by_grid.loc["o_proj / down_proj", "µs"])
    assert both.MB.sum() == pytest.approx(by_grid.loc["o_proj / down_proj", "MB"])  # its bytes, the two averaged


def test_the_steps_bytes_add_the_kv_cache_to_the_floors_weights(run):
    read = ch.step_bytes(run).set_index("read")
    f = ch.floor(run)
    # Qwen3-8B: 36 layers x K and V x 8 KV heads x 128 x (256 prompt positions + the new token) x 2 bytes
    assert ch.kv_cache_bytes(run) == 36 * 2 * 8 * 128 * 257 * 2 == read.loc["KV cache, 257 positions", "bytes"]
    weights, step = read.loc["weights (the floor's bytes)"], read.loc["the step"]
    assert weights.bytes == f.decode_bytes and weights["ms at the datasheet"] == pytest.approx(f.floor_ms)
    assert step.bytes == f.decode_bytes + ch.kv_cache_bytes(run)
    assert step["ms at the datasheet"] == pytest.approx(step.bytes / f.datasheet_tbs / 1e9)
    assert step["ms at the ceiling"] == pytest.approx(step.bytes / f.ceiling_tbs / 1e9)


def test_matmuls_and_tuning(run):
    m = ch.matmuls(run).set_index("matrix")
    assert m.loc["qkv (fused)", "n"] == m.loc["q_proj", "n"] + 2 * m.loc["k_proj / v_proj", "n"]
    assert (m["speed-up"] == m.cublas_us / m.triton_us).all()
    t = ch.tuning(run)
    chosen = t[t.chosen]
    assert not chosen.duplicated(["n", "k", "fusion"]).any()
    for (n, k, fusion), g in t.groupby(["n", "k", "fusion"]):
        assert g.loc[g.chosen, "us"].iloc[0] == g.us.min(), (n, k, fusion)


def test_fidelity_table_and_the_published_references(run):
    fid = ch.fidelity_table(run).set_index("rung")
    assert fid.loc["eager", "error / eager's"] == pytest.approx(1.0)
    assert (fid.passed == (fid["same token"] & (fid["error / eager's"] <= ch.ERROR_FACTOR))).all()
    table = ch.next_to_published(run, published.NEAR_FLOOR_REFERENCES)
    ours = table[table.source == f"run {run.run_id}"]
    assert len(ours) == 2 and list(table.columns) == list(published.NEAR_FLOOR_REFERENCES.columns)
    assert isinstance(table, pd.DataFrame) and len(table) == len(published.NEAR_FLOOR_REFERENCES) + 2
    # ours computed from the run; the published rows as published, below, never recomputed
    lad = ch.ladder(run).set_index("rung")
    best = ch.best(run)
    assert list(ours["x floor"]) == [f"{lad.loc[best, 'x floor']:.2f}×", f"{lad.loc[best, 'x ceiling']:.2f}×"]
    assert (ours["time per token"] == f"{lad.loc[best, 'ms']:.2f} ms").all()
    assert table.iloc[2:].reset_index(drop=True).equals(published.NEAR_FLOOR_REFERENCES)


def test_the_references_page_lists_each_published_anchor_once():
    """Every repository the anchors cite has one entry, with its address, on the references page."""
    from pathlib import Path

    text = " ".join((Path(__file__).resolve().parent.parent / "book" / "references.md").read_text().split())
    repos = set(re.findall(r"\b([\w-]+/[\w.-]+?)(?:[,\s]|$)", " ".join(published.NEAR_FLOOR_REFERENCES.source)))
    assert {"cloudrift-ai/emmy", "pytorch-labs/gpt-fast", "pytorch/ao", "msaroufim/megakernels-vs-cuda-graphs"} <= repos
    for repo in repos:
        assert len(re.findall(rf"<https://github\.com/{re.escape(repo)}[/>]", text)) == 1, repo
    for title in ("No Bubbles", "GPUStack performance lab", "arXiv:2512.22219"):
        assert title in text


def test_matmul_launches_read_the_launch_shapes_of_the_trace(run):
    theirs, ours = ch.matmul_launches(run, "fused-projections"), ch.matmul_launches(run, "triton-gemv")
    k = ch.kernel_table(run, "triton-gemv")
    assert ours.kernels.sum() == (k.kind == "matrix multiply").sum()
    gemv_rows = ours[ours.kernel == "gemv_kernel"]
    # our GEMV: N / BLOCK_N programs; the LM head's 151,936 rows in blocks of two
    assert 151_936 // 2 in set(gemv_rows.blocks)
    assert (gemv_rows.blocks > run.provenance["gpu_sms"]).all()
    cublas = theirs[theirs.kernel.str.startswith("nvjet")]
    assert (cublas.blocks <= run.provenance["gpu_sms"]).all()  # what the chapter says of cuBLAS here
    assert (theirs["grid / SMs"] == theirs.blocks / run.provenance["gpu_sms"]).all()


@pytest.fixture(scope="module")
def fixture_page(run):
    with pytest.MonkeyPatch.context() as m:  # the fixture owners' runs, as the page and ch.ladder read them
        m.setenv("LABSUPPORT_RUNS", str(FIXTURES))
        vals = ch.shared_values()
        return vals, ch.page(run, vals)


def test_the_page_of_the_fixture_run(run, fixture_page):
    """The page's numbers against the run's own rungs.csv and matmuls.csv and the shared quantities;
    the rungs the run predates (split-K, dependent launch, FP8, tokens per forward) said so."""
    vals, p = fixture_page
    rungs = pd.read_csv(run.path / "rungs.csv").set_index("rung")
    ours = rungs[~rungs.index.isin(list(ch.SHARED_RUNGS)) & rungs.passed.astype(str).eq("True")]
    fastest = ours.wall_ms_min.idxmin()  # faster than every shared rung here, as the ladder shows
    assert fastest == "fused-attention" and p.best == ch.RUNGS[fastest]
    assert p.best_wall == ours.loc[fastest, "wall_ms_min"] and p.best_median == ours.loc[fastest, "wall_ms_median"]
    assert p.best_kernels == ours.loc[fastest, "kernels"] and p.best_busy == ours.loc[fastest, "gpu_busy_ns"] / 1e6
    assert p.best_idle == pytest.approx(p.best_wall - p.best_busy)
    assert p.best_x == pytest.approx(p.best_wall / vals["floor_ms"].value, rel=1e-3)  # floor_ms is rounded bytes
    assert p.speedup == pytest.approx(vals["eager_wall_ms"].value / p.best_wall)
    assert p.try_best_tokens == pytest.approx(1e3 / p.best_wall)
    assert (p.eager_err, p.max_logit) == (rungs.loc["eager", "eager_abs_err"], rungs.loc["eager", "max_abs_logit"])
    assert p.tolerance_text == "2 times eager's own" and p.token_note == ""
    order = list(ch.RUNGS)
    absent = order[order.index("split-k") :]  # the fixture run was recorded before these rungs
    named = ", ".join(f"*{ch.RUNG_SHORT[r]}*" for r in absent[:-1]) + f" and *{ch.RUNG_SHORT[absent[-1]]}*"
    assert p.failed_text == f"Not every rung has numbers: {named}: not in this run (recorded before this rung existed)."
    assert p.fp8_text == "this run has no FP8 numbers: not in this run (recorded before this rung existed)."
    assert p.fp8_launch_text == ""
    assert p.fp8_table is None and p.tokens_table is None and p.tokens_text.startswith("this run has no such")
    assert p.overlap_text.startswith("(Programmatic dependent launch, rung 11, has no trace here: not in this run")
    shapes = pd.read_csv(run.path / "matmuls.csv")
    assert f"cuBLAS read between {shapes.cublas_tbs.min():.2f} and {shapes.cublas_tbs.max():.2f} TB/s" in p.matmul_text
    assert f"our GEMV between {shapes.triton_tbs.min():.2f} and" in p.matmul_text
    compiled = ours.compile_s.dropna()  # our rungs' (transformers' compile is Launch overhead's)
    assert len(compiled) == 5 and len(re.findall(r"\d s[,.]", p.compile_text)) == 5
    assert all(f"{ch.RUNG_SHORT[rung]} {took:.1f} s" in p.compile_text for rung, took in compiled.items())
    k = ch.kernel_table(run, fastest)
    assert p.rem_span == pytest.approx((k.end_ns.max() - k.start_ns.min()) / 1e6)
    step = ch.step_bytes(run, vals).iloc[-1]
    assert p.kv_positions == 257 and p.kv_mb == pytest.approx(ch.kv_cache_bytes(run) / 1e6)
    assert p.step_read_gb == pytest.approx(vals["step_gb"].value + p.kv_mb / 1e3, abs=0.01)  # step_gb is rounded
    assert p.best_x_step == pytest.approx(p.best_wall / step["ms at the datasheet"]) and p.best_x_step < p.best_x
    assert f"{ch.matmul_launches(run, 'triton-gemv').blocks.max():,}" in p.launch_text
    assert p.ladder_table["ms (minimum)"].iloc[0] == vals["eager_wall_ms"].text  # a shared rung in its own text
    assert p.ladder_table.set_index("rung").loc[ch.RUNG_SHORT[fastest], "ms (minimum)"] == f"{p.best_wall:.2f}"
    assert len(p.timeline_kernels) == len(k) // run.results["model"]["layers"]
    assert p.best_trace == "trace-fused-attention.json.gz"


def test_every_glue_name_of_the_prose_is_glued(fixture_page):
    _, p = fixture_page
    assert unglued(NOTEBOOK, p) == set()


def test_the_ladder_says_which_rungs_have_no_numbers():
    ladder = pd.DataFrame({"rung": ["eager", "pdl"], "status": ["ok", "failed: out of memory"]})
    assert ch.failed_text(ladder) == f"Not every rung has numbers: *{ch.RUNG_SHORT['pdl']}*: failed: out of memory."
    assert ch.failed_text(ladder.head(1)) == "Every rung has numbers."
    three = pd.DataFrame({"rung": ["pdl", "persistent", "fp8-pdl"], "status": ["gone", "failed: x", "gone"]})
    short = ch.RUNG_SHORT
    assert ch.failed_text(three) == (  # the rungs of one reason together, each reason once
        f"Not every rung has numbers: *{short['pdl']}* and *{short['fp8-pdl']}*: gone; "
        f"*{short['persistent']}*: failed: x."
    )


# A rung's status as an H100 80GB run recorded it (20261205T154101Z), cut at 200 characters.
OUT_OF_MEMORY = (
    "failed: OutOfMemoryError: CUDA out of memory. Tried to allocate 384.00 MiB. GPU 0 has a total capacity of "
    "79.18 GiB of which 294.12 MiB is free. Including non-PyTorch memory, this process has 78.88 GiB memory in "
    "use. Of the al"
)


def test_a_failed_rung_is_shown_by_its_first_two_sentences(run, tmp_path):
    """The ladder and the FP8 paragraph show an out-of-memory failure by its first two sentences,
    and the paragraph says why the FP8 rungs are the ones that run out."""
    cut = "failed: OutOfMemoryError: CUDA out of memory. Tried to allocate 384.00 MiB"
    assert ch.short_status(OUT_OF_MEMORY) == cut and ch.short_status("ok") == "ok"
    rows = {r: ("fused-attention", {"status": OUT_OF_MEMORY}) for r in ch.FP8_RUNGS}
    fake = with_rungs(run, tmp_path, rows)
    lad = ch.ladder(fake).set_index("rung")
    assert lad.loc[list(ch.FP8_RUNGS), "status"].tolist() == [cut, cut, cut]
    p = ch.page(fake, ch.shared_values())
    assert p.fp8_text.startswith(f"this run has no FP8 numbers: {cut}. Every rung is built and kept alive")
    assert "made after the BF16 rungs'" in p.fp8_text and "allocator" not in p.failed_text
    short = [f"*{ch.RUNG_SHORT[r]}*" for r in ch.FP8_RUNGS]
    assert f"{short[0]}, {short[1]} and {short[2]}: {cut}." in p.failed_text
    assert "the process held" not in p.fp8_text  # a run that did not record its memory
    held = {"fp8-weights": {"allocated": 78.12, "reserved": 78.4, "total": 85.03}}
    p = ch.page(with_rungs(run, tmp_path / "held", rows, results={"memory_gb": held}), ch.shared_values())
    assert p.fp8_text.endswith(
        "the process held 78.1 GB in tensors (78.4 GB reserved by PyTorch's allocator) of the GPU's 85.0 GB."
    )


def test_the_memory_held_after_each_rung_is_read_on_a_gpu_only(monkeypatch):
    assert ch.gpu_memory_gb("cpu") is None
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda: 12_345_678_901)
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda: 20_000_000_000)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: type("P", (), {"total_memory": 85_030_000_000}))
    assert ch.gpu_memory_gb("cuda") == {"allocated": 12.346, "reserved": 20.0, "total": 85.03}


@pytest.mark.live
def test_notebook_runs_live_on_cpu_through_papermill(runs_root, monkeypatch, tmp_path):
    """The whole page on the CPU live path (tiny model): measured, then every analysis cell on the
    run just recorded, with the shared quantities read from the owners' published runs."""
    import json

    import nbformat
    import papermill as pm

    from .conftest import REPO

    with_shared_owners(runs_root)
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    out = tmp_path / "closing_the_gap.ipynb"
    nb_path = REPO / NOTEBOOK
    params = parameters(preset="tiny", prompt_len=16, repeats=2, allow_cpu=True)
    pm.execute_notebook(
        str(nb_path), str(out), parameters=params, cwd=str(nb_path.parent), kernel_name="python3", progress_bar=False
    )
    nb = nbformat.read(out, as_version=4)
    assert "Traceback" not in json.dumps([c.get("outputs", []) for c in nb.cells])
    (run_dir,) = (runs_root / ch.CHAPTER).iterdir()
    assert json.loads((run_dir / "meta.json").read_text())["parameters"]["preset"] == "tiny"


# The last rungs: FP8 weights, split-K, programmatic dependent launch, several tokens per forward.


def test_every_fp8_candidate_leaves_each_thread_16_bytes_a_load_or_more():
    """An FP8 tile of BLOCK_N rows by BLOCK_K columns, BLOCK_K a multiple of 16, shared by the
    program's 32 x num_warps threads leaves each thread 16 FP8 weights or more: one 16-byte load at
    least, and one run of FP8_CHUNK weights summed at once. Among them, tiles of fewer rows than
    eight (gemv.FP8_CANDIDATES)."""
    assert gemv.FP8_CHUNK == 16
    for c in gemv.FP8_CANDIDATES:
        assert c.block_k % 16 == 0 and c.block_n * c.block_k // (32 * c.num_warps) >= gemv.FP8_CHUNK, c
    assert {(c.block_n, c.block_k) for c in gemv.FP8_CANDIDATES} >= {(4, 1024), (2, 2048)}
    # those with an accumulator a weight hold 32 weights a thread: 32 float32 registers of sums
    ones = [c for c in gemv.FP8_CANDIDATES if c.chunk == 1]
    assert ones and all(c.block_n * c.block_k // (32 * c.num_warps) == 32 for c in ones)
    assert all(c.chunk == 0 for c in gemv.CANDIDATES)  # BF16 sums a whole tile (no chunk)


def test_a_gemv_is_timed_on_copies_that_overflow_l2_but_never_thousands_of_them():
    """Each weight shape is timed cycling through copies four times the L2 cache (50 MB here): 25
    of Qwen3-8B's smallest matrix (k_proj, 8 MB), 2 of the LM head; the tiny model's 64 x 64 BF16
    matrix would need 25,600, each launched and captured, so it gets MAX_COPIES."""
    l2 = 50 * 2**20
    assert weight_timing.weight_copies(1024 * 4096 * 2, l2) == 25
    assert weight_timing.weight_copies(151_936 * 4096 * 2, l2) == 2
    assert weight_timing.weight_copies(64 * 64 * 2, l2) == weight_timing.MAX_COPIES == 512
    # Qwen3-1.7B's smallest: not capped
    assert weight_timing.weight_copies(1024 * 2048 * 2, l2) == 50 < weight_timing.MAX_COPIES


def test_fp8_quantisation_is_within_half_a_step_of_e4m3():
    from labsupport.measure.kernels import gemv_fp8

    g = torch.Generator().manual_seed(2)
    w = torch.randn(64, 256, generator=g) * torch.rand(64, 1, generator=g)  # rows of different scales
    w8, scale = gemv_fp8.quantize(w)
    assert w8.dtype == torch.float8_e4m3fn and scale.shape == (64,)
    back = gemv_fp8.dequantize(w8, scale, torch.float32)
    # each row's largest weight maps to 448; every normal value is within 2^-4 of itself, a
    # subnormal (under 2^-6 in units of the scale) within half the subnormal step, 2^-10
    assert (w8.float().abs().amax(1) == gemv_fp8.E4M3_MAX).all()
    err = (back - w).abs()
    bound = torch.maximum(w.abs() * gemv_fp8.RELATIVE_STEP / 2, scale[:, None] * 2.0**-10)
    assert (err <= bound * (1 + 1e-6)).all()
    assert ch.FP8_ERROR_FACTOR == ch.ERROR_FACTOR * 16  # 2^-3 over 2^-7


@pytest.mark.parametrize("chunk", [0, 1])
@pytest.mark.parametrize("emulate", [False, True])
def test_fp8_gemv_and_its_fusions_match_the_dequantised_weight(emulate, chunk):
    """Our GEMV reading FP8 weights (row scales applied to each row's sum) against PyTorch on the
    dequantised weight, in the interpreter: real float8 tensors where the interpreter takes them,
    and the emulated path (E4M3 values held in float32) that a Triton without float8 would use; each
    thread's products summed FP8_CHUNK at a time (chunk 0) or each into an accumulator of its own."""
    from labsupport.measure.kernels import gemv_fp8

    g = torch.Generator().manual_seed(3)
    k, i = 96, 20
    x, nw = torch.randn(1, 1, k, generator=g), torch.randn(k, generator=g)
    w = torch.randn(2 * i, k, generator=g)
    w8, s = gemv_fp8.quantize(w, emulate=emulate)
    dense = gemv_fp8.dequantize(w8, s, torch.float32)
    close = dict(rtol=1e-4, atol=1e-4)
    c = gemv.Config(2, 64, 4, 2, chunk=chunk)
    torch.testing.assert_close(gemv.gemv(x, w8, scale=s, config=c), x @ dense.T, **close)
    normed = qwen3_decode.rmsnorm(x, nw, 1e-6)
    y = normed @ dense.T
    torch.testing.assert_close(
        gemv.gemv(x, w8, norm_weight=nw, silu=True, scale=s, config=c),
        torch.nn.functional.silu(y[..., 0::2]) * y[..., 1::2],
        **close,
    )
    r = torch.randn(1, 1, 2 * i, generator=g)
    torch.testing.assert_close(gemv.gemv(x, w8, residual=r, scale=s, config=c), r + x @ dense.T, **close)


@pytest.mark.parametrize("config", [gemv.Config(2, 32, 4, 2, 2), gemv.Config(4, 32, 4, 2, 3)])
def test_split_k_gemv_and_its_fusions_match_pytorch_and_leave_the_buffer_zeroed(config):
    g = torch.Generator().manual_seed(4)
    k, i = 100, 20  # K not a multiple of a stretch
    x, nw = torch.randn(1, 1, k, generator=g), torch.randn(k, generator=g)
    gate, up = torch.randn(i, k, generator=g), torch.randn(i, k, generator=g)
    w = torch.cat([gate, up])
    close = dict(rtol=1e-4, atol=1e-4)
    for _ in range(2):  # twice: the second call finds the buffer zeroed by the first
        torch.testing.assert_close(gemv.gemv(x, w, config=config), x @ w.T, **close)
    normed = qwen3_decode.rmsnorm(x, nw, 1e-6)
    torch.testing.assert_close(gemv.gemv(x, w, norm_weight=nw, config=config), normed @ w.T, **close)
    act = torch.nn.functional.silu(normed @ gate.T) * (normed @ up.T)
    fused = gemv.gemv(x, gemv.interleave(gate, up), norm_weight=nw, silu=True, config=config)
    torch.testing.assert_close(fused, act, **close)
    r = torch.randn(1, 1, 2 * i, generator=g)
    torch.testing.assert_close(gemv.gemv(x, w, residual=r, config=config), r + x @ w.T, **close)
    assert (gemv.workspace(2 * i, "cpu") == 0).all()


def test_the_tuned_choice_falls_back_in_order(monkeypatch):
    plain, split, fp8 = gemv.Config(4, 1024, 8, 2), gemv.Config(4, 512, 4, 2, 4), gemv.Config(4, 4096, 8, 2)
    early, early_split = gemv.Config(8, 1024, 8, 2), gemv.Config(2, 1024, 4, 2, 4)
    monkeypatch.setattr(gemv, "CHOSEN", {(8, 16, gemv.PLAIN): plain, (8, 32, gemv.PLAIN): plain})
    monkeypatch.setattr(gemv, "CHOSEN_SPLIT", {(8, 16, gemv.PLAIN): split})
    monkeypatch.setattr(gemv, "CHOSEN_EARLY", {(8, 16, gemv.PLAIN): early, (8, 32, gemv.PLAIN): early_split})
    monkeypatch.setattr(gemv, "CHOSEN_FP8", {})
    assert gemv.choose(8, 16, gemv.PLAIN) == plain
    assert gemv.choose(8, 16, gemv.PLAIN, split=True) == split
    # launched with the first weights before the wait: the configs timed so, before the split-K rung's
    assert gemv.choose(8, 16, gemv.PLAIN, early=True) == early == gemv.choose(8, 16, gemv.PLAIN, split=True, early=True)
    # a split-K config timed so only where split-K is allowed (not for the LM head's argmax)
    assert gemv.choose(8, 32, gemv.PLAIN, split=True, early=True) == early_split
    assert gemv.choose(8, 32, gemv.PLAIN, early=True) == plain
    assert gemv.choose(8, 16, gemv.PLAIN, fp8=True) == plain  # FP8 not tuned: the BF16 choice
    gemv.CHOSEN_FP8[(8, 16, gemv.PLAIN)] = fp8
    assert gemv.choose(8, 16, gemv.Fusion(residual=True), fp8=True) == fp8
    assert gemv.choose(1, 1, gemv.PLAIN) == gemv.DEFAULT


def test_the_new_options_need_our_gemv():
    with pytest.raises(ValueError, match="split_k and pdl"):
        qwen3_decode.Options(fused=True, pdl=True)
    with pytest.raises(ValueError, match="fp8"):
        qwen3_decode.Options(fused=True, matmul="triton", fp8=True)


def test_pdl_and_the_new_rungs_are_not_run_on_a_cpu():
    for rung in ("split-k", "pdl", "weights-first", "one-attention", "folded-norms", "persistent", *ch.FP8_RUNGS):
        assert "needs a CUDA GPU" in ch.runs_here(rung, "cpu")
    assert ch.FP8_RUNGS == ("fp8-weights", "fp8-pdl", "fp8-folded")
    assert all(ch.error_factor(r) == ch.FP8_ERROR_FACTOR for r in ch.FP8_RUNGS)
    assert ch.error_factor("pdl") == ch.ERROR_FACTOR


@pytest.mark.live
def test_a_verify_pass_gives_the_one_token_steps_logits_at_its_first_position(tiny):
    model, prompt, ref = tiny
    opts = qwen3_decode.Options(fused=True)
    own = qwen3_decode.OwnStep(model, prompt.ids, ref.token, opts, compile=False, graph=False)
    one, _ = own()
    for t in (1, 3):
        logits, tokens = qwen3_decode.VerifyStep(own, t)()
        assert logits.shape == (1, t, model.config.vocab_size) and tokens.shape == (1, t)
        torch.testing.assert_close(logits[:, 0], one, rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="do not fit"):
        qwen3_decode.VerifyStep(own, 17)


def test_overlaps_count_kernels_that_start_before_the_one_before_ends():
    k = pd.DataFrame({"start_ns": [0, 90, 200, 260, 400], "end_ns": [100, 180, 300, 350, 450]})
    assert ch.overlaps(k) == {"kernels": 5, "overlapping": 2, "overlap_us": pytest.approx((10 + 40) / 1e3)}
    assert ch.overlaps(k.iloc[[0, 2, 4]])["overlapping"] == 0


def test_kernel_groups_account_for_every_kernel_and_the_weights_read(run):
    best = ch.best(run)
    groups = ch.kernel_groups(run, best).set_index("weight")
    k = ch.kernel_table(run, best)
    assert groups.kernels.sum() == len(k)
    assert groups["µs"].sum() == pytest.approx(k.dur_ns.sum() / 1e3)
    assert groups.share.sum() == pytest.approx(1.0)
    m = ch.matmuls(run).set_index("matrix")
    layers = run.results["model"]["layers"]
    gu = groups.loc["gate_up (fused)"]
    assert gu.kernels == layers and gu["MB"] == pytest.approx(layers * m.loc["gate_up (fused)", "bytes"] / 1e6)
    assert gu["TB/s"] == pytest.approx(gu["MB"] / gu["µs"])
    assert groups["exclusive µs"].sum() == pytest.approx(kernels.gpu_busy_ns(k) / 1e3)
    assert gu["TB/s exclusive"] == pytest.approx(gu["MB"] / gu["exclusive µs"])
    # o_proj and down_proj share a grid (4,096 rows each): one group, both weights' bytes
    both = groups.loc["o_proj / down_proj"]
    assert both["MB"] == pytest.approx(layers * (m.loc["o_proj", "bytes"] + m.loc["down_proj", "bytes"]) / 1e6)


def with_rungs(
    source, tmp_path, rows: dict, fp8_bytes: int | None = None, results: dict | None = None, changed: dict | None = None
):
    """A copy of the run `source` under tmp_path, loaded, with rows added to its rungs.csv (rung ->
    (the rung whose row and traces it copies, the columns it changes)), rows of it changed (`changed`:
    rung -> the columns it changes) and, where given, the bytes of its FP8 weights (meta.json:
    results.fp8) and other results."""
    import hashlib
    import json
    import shutil

    from labsupport import runs

    new = tmp_path / "closing-the-gap" / source.run_id
    shutil.copytree(source.path, new)
    r = pd.read_csv(new / "rungs.csv")
    meta = json.loads((new / "meta.json").read_text())
    written = ["rungs.csv"]
    for rung, (like, changes) in rows.items():
        row = r[r.rung == like].iloc[0].copy()
        row["rung"] = rung
        for column, value in changes.items():
            row[column] = value
        r = pd.concat([r, row.to_frame().T], ignore_index=True)
        for name in [f for f in meta["files"] if f.startswith(f"trace-{like}.")]:  # the trace and its tables
            written.append(name.replace(f"trace-{like}.", f"trace-{rung}.", 1))
            shutil.copy(new / name, new / written[-1])
            if name in meta.get("derived", {}):  # a table: derived from the copy now
                meta["derived"][written[-1]] = {**meta["derived"][name], "from": ch.trace_file(rung)}
    for rung, changes in (changed or {}).items():
        for column, value in changes.items():
            r.loc[r.rung == rung, column] = value
    r.to_csv(new / "rungs.csv", index=False)
    if fp8_bytes is not None:
        meta["results"]["fp8"] = {"decode_bytes": fp8_bytes}
    meta["results"].update(results or {})
    for name in written:
        meta["files"][name] = hashlib.sha256((new / name).read_bytes()).hexdigest()
    (new / "meta.json").write_text(json.dumps(meta))
    return runs.load_run(chapters.by_slug("closing-the-gap"), source.run_id, root=tmp_path)


def test_the_fp8_rung_has_its_own_floor_and_is_never_the_best(run, tmp_path):
    # faster than every BF16 rung
    fake = with_rungs(run, tmp_path, {"fp8-weights": ("fused-attention", {"wall_ms_min": 2.0, "passed": True})},
                      fp8_bytes=7_600_000_000)  # fmt: skip
    lad = ch.ladder(fake).set_index("rung")
    f, f8 = ch.floor(fake), ch.fp8_floor(fake)
    assert f8.floor_ms == pytest.approx(7.6e9 / f.datasheet_tbs / 1e9) and f8.floor_ms < f.floor_ms
    row = lad.loc["fp8-weights"]
    assert row["floor ms"] == pytest.approx(f8.floor_ms) and row["x floor"] == pytest.approx(2.0 / f8.floor_ms)
    assert row["TB/s"] == pytest.approx(7.6 / 2.0)
    assert lad.loc["fused-attention", "floor ms"] == pytest.approx(f.floor_ms)
    assert ch.best(fake) == "fused-attention"  # the best rung is BF16's
    split = ch.time_split(fake).set_index("rung")
    assert split.loc["fp8-weights", "floor ms"] == pytest.approx(f8.floor_ms)


def test_the_page_of_both_fp8_rungs_speaks_of_the_fastest_that_passes(run, tmp_path):
    """Both FP8 rungs against their one floor, each in the FP8 table; the sentence is the fastest
    FP8 rung that gives eager's answers (here the one on rung 9's options: the one on rung 13's is
    faster, but fails), and what the second changed against the first, each by its number."""
    first, second = (ch.RUNG_SHORT[r].split()[0] for r in ch.FP8_RUNGS[:2])
    rows = {"fp8-weights": ("fused-attention", {"wall_ms_min": 2.0, "passed": True}),
            "fp8-pdl": ("fused-attention", {"wall_ms_min": 1.8, "passed": False})}  # fmt: skip
    fake = with_rungs(run, tmp_path, rows, fp8_bytes=7_600_000_000)
    lad = ch.ladder(fake)
    f8 = ch.fp8_floor(fake)
    for rung, ms in (("fp8-weights", 2.0), ("fp8-pdl", 1.8)):
        row = lad.set_index("rung").loc[rung]
        assert row["floor ms"] == pytest.approx(f8.floor_ms) and row["x floor"] == pytest.approx(ms / f8.floor_ms)
    assert ch.best(fake) == "fused-attention" and ch.best_fp8(lad) == "fp8-weights"
    p = ch.page(fake, ch.shared_values())
    assert p.fp8_text.startswith(f"*{ch.RUNGS['fp8-weights']}*, the fastest FP8 rung that gives eager's answers")
    assert "took 2.00 ms" in p.fp8_text
    t = p.fp8_table.set_index("rung")
    assert list(t.index) == [ch.RUNGS["fused-attention"], ch.RUNGS["fp8-weights"], ch.RUNGS["fp8-pdl"]]
    assert t["same answers"].tolist() == ["yes", "yes", "no"]
    assert t.loc[ch.RUNGS["fp8-pdl"], "× its floor"] == pytest.approx(1.8 / f8.floor_ms)
    assert t.loc[ch.RUNGS["fp8-pdl"], "its floor ms"] == pytest.approx(f8.floor_ms)
    assert p.fp8_launch_text.startswith(f"Rung {second} took 1.80 ms ({1.8 / f8.floor_ms:.2f}× its floor")
    assert f"rung {first}'s 2.00 ms" in p.fp8_launch_text and "took 0.20 ms off the FP8 step" in p.fp8_launch_text
    # by name, not by position: the one that passes, else the fastest (its sentence then says none passes)
    passes = lad["same answers"].where(lad.rung != "fp8-pdl", True)
    assert ch.best_fp8(lad.assign(**{"same answers": passes})) == "fp8-pdl"
    none = lad["same answers"].where(~lad.rung.isin(ch.FP8_RUNGS), False)
    assert ch.best_fp8(lad.assign(**{"same answers": none})) == "fp8-pdl"
    assert ch.best_fp8(lad[~lad.rung.isin(ch.FP8_RUNGS)]) is None


def test_a_run_recorded_before_the_second_fp8_rung_shows_the_first_alone(run, tmp_path):
    """A run with the FP8 rung on rung 9's options only: the page shows it against its floor and
    says the one on rung 13's options is not in the run."""
    rows = {"fp8-weights": ("fused-attention", {"wall_ms_min": 2.0, "passed": True})}
    p = ch.page(with_rungs(run, tmp_path, rows, fp8_bytes=7_600_000_000), ch.shared_values())
    assert p.fp8_text.startswith(f"*{ch.RUNGS['fp8-weights']}*, the fastest FP8 rung that gives eager's answers")
    assert list(p.fp8_table.rung) == [p.best, ch.RUNGS["fp8-weights"]]
    why = "not in this run (recorded before this rung existed)"
    second = ch.RUNG_SHORT["fp8-pdl"].split()[0]
    assert p.fp8_launch_text == f"Rung {second} has no numbers here: {why}."
    assert f"*{ch.RUNG_SHORT['fp8-pdl']}* and *{ch.RUNG_SHORT['fp8-folded']}*: {why}" in p.failed_text


@pytest.fixture(scope="module")
def fp8_run():
    """A run of the chapter on the H200 with the FP8 rung's trace and FP8 tuning (kept in runs/ for
    this; on an 80 GB card the FP8 rungs ran out of memory, so the published run has neither trace)."""
    from labsupport import runs

    return runs.load_run(chapters.by_slug("closing-the-gap"), "20261202T103503Z-h200")


def test_the_kernels_of_the_fp8_rung_on_rung_13_read_the_fp8_weights_it_was_tuned_for(fp8_run, tmp_path):
    """The FP8 rung on rung 13's options allows split-K, but FP8 is tuned without it: its GEMVs are
    found by FP8's chosen configs, as the other FP8 rung's are (here its trace is that rung's)."""
    fake = with_rungs(fp8_run, tmp_path, {"fp8-pdl": ("fp8-weights", {})})
    columns = ["kernel", "weight", "kernels", "MB"]
    groups = ch.kernel_groups(fake, "fp8-pdl")[columns]
    assert groups.equals(ch.kernel_groups(fake, "fp8-weights")[columns])
    assert "gate_up (fused)" in set(groups.weight)


def test_the_page_gives_the_one_kernel_attentions_kept_config_and_the_range_the_run_tuned():
    from labsupport.chapters.closing_the_gap import prose

    run = ch.load()  # the published run: tuned on its GPU
    rows = run.results["attention_tuning"]
    text = prose.attention_tuning_text(run)
    ran = [r for r in rows if r.get("status", "ok") == "ok"]  # (a form that did not run here has no time)
    kept = min(ran, key=lambda r: r["us"])
    assert [r for r in rows if r["chosen"]] == [kept]
    assert f"took {kept['us']:.1f} µs with {kept['block_s']} positions per program ({kept['programs']} programs" in text
    assert f"the fastest of {len(rows)} configs tried" in text
    assert f"which took {kept['us']:.1f} to {max(r['us'] for r in ran):.1f} µs" in text
    order = {True: "one program per query head", False: "its query heads together"}[kept.get("per_head", False)]
    if "grouped" in kept and not kept["grouped"]:  # an earlier form: one program took its heads in turn
        order = "one query head after another"
    if kept.get("cluster"):
        order += ", a head's programs one thread-block cluster"
    assert f"{kept.get('num_warps', 4)} warps, {order}" in text  # runs before these were tuned: 4, together
    assert prose.attention_tuning_text(fixture_run("closing-the-gap")) == ""  # recorded before the tuning


def test_the_rungs_that_cost_time_are_named_with_the_part_of_the_step_that_grew_most():
    from labsupport.chapters.closing_the_gap import prose

    run = ch.load()  # the published run
    steps = ch.ladder(run)
    costlier = ch.costlier_rungs(run, steps)
    t = steps.set_index("rung")
    own = [r for r in ch.RUNGS if r not in ch.SHARED_RUNGS]
    pairs = [(ch.built_on(r), r) for r in own[1:] if (r in ch.FP8_RUNGS) == (ch.built_on(r) in ch.FP8_RUNGS)]
    slower = [b for a, b in pairs if b in t.index and t.loc[b, "ms"] > max(t.loc[a, "ms"], t.loc[a, "q3"])]
    assert costlier.rung.tolist() == slower and (costlier.before == [ch.built_on(r) for r in slower]).all()
    text = prose.costlier_text(costlier)
    for _, r in costlier.iterrows():
        grew = ch.exclusive_parts(run, r["rung"]).sub(ch.exclusive_parts(run, r["before"]), fill_value=0.0)
        assert r["part"] == grew.idxmax()
        assert r["part µs"] == pytest.approx(ch.exclusive_parts(run, r["rung"])[r["part"]])
        assert f"*{ch.RUNG_SHORT[r['rung']]}* took {r['ms']:.2f} ms against {r['before ms']:.2f}" in text
        assert f"its {r['part']} kernels'" in text
    assert prose.costlier_text(costlier.iloc[:0]) == ""
    # the timed rungs built on a slower one, through any rung between, carry its cost: named after them
    # (in this run, and where rung 13 had been the slower one: every rung built on it then carries it)
    timed = steps.rung[steps.status == "ok"]
    one = pd.DataFrame([{"rung": "one-attention", "before": "weights-first", "ms": 5.5, "before ms": 5.4,
                         "part": "attention", "part µs": 430.0, "before part µs": 260.0}])  # fmt: skip
    for frame in (costlier, one):
        text = prose.costlier_text(frame, timed=timed)
        carried = [r for r in timed if r not in set(frame.rung) and set(prose._ancestors(r)) & set(frame.rung)]
        if not carried:
            assert "carry that cost too" not in text
            continue
        assert text.endswith(f"carry that cost too: {', '.join(f'*{ch.RUNG_SHORT[r]}*' for r in carried[:-1])}"
                             f" and *{ch.RUNG_SHORT[carried[-1]]}*.")  # fmt: skip
    assert {"folded-norms", "persistent", "fp8-pdl"} <= set(carried)


def test_an_fp8_rung_that_costs_time_is_set_against_the_fp8_rung_it_is_built_on(tmp_path):
    """Run 20261207T102609Z with rung 20 (FP8, folded norms) made slower than rung 19: it is named against
    rung 19 with the part that grew (o_proj and down_proj, which add Σx² by atomics: 1,058 µs a step
    against 981), never against a BF16 rung; rung 19, on rung 13's options, is not set against rung 13."""
    from labsupport import runs

    run = runs.load_run(chapters.by_slug("closing-the-gap"), "20261207T102609Z-h100-80gb-hbm3")
    slow = with_rungs(run, tmp_path, {}, changed={"fp8-folded": {"gpu_ms_min": 3.1}})
    c = ch.costlier_rungs(slow, ch.ladder(slow)).set_index("rung")
    assert c.loc["fp8-folded", "before"] == "fp8-pdl" and c.loc["fp8-folded", "part"] == "o_proj / down_proj"
    assert c.loc["fp8-folded", "part µs"] == pytest.approx(1058.4, abs=0.1)
    assert c.loc["fp8-folded", "before part µs"] == pytest.approx(981.0, abs=0.1)
    assert "fp8-pdl" not in c.index and "fp8-weights" not in c.index


def test_each_rung_is_built_on_the_one_before_it_but_the_branches():
    from labsupport.chapters.closing_the_gap import prose

    order = list(ch.RUNGS)
    assert ch.built_on("eager") is None and ch.built_on("pdl") == "split-k"
    assert ch.built_on("layer-kernel") == "folded-norms" != order[order.index("layer-kernel") - 1]
    for rung, base in ch.BUILT_ON.items():  # a branch's options are its base's and its own change
        extra = set(ch.OWN_OPTIONS[rung].items()) - set(ch.OWN_OPTIONS[base].items())
        assert extra and set(ch.OWN_OPTIONS[base].items()) - set(ch.OWN_OPTIONS[rung].items()) <= {("split_k", True)}
    assert prose._ancestors("layer-kernel")[:3] == ["folded-norms", "one-attention", "weights-first"]
    assert prose._ancestors("layer-kernel")[-1] == "eager"


def test_the_layer_kernel_is_set_against_the_parts_of_the_step_it_replaces():
    from labsupport.chapters.closing_the_gap import kernel_time

    before = pd.Series({"qkv (fused)": 600.0, "attention": 300.0, "o_proj / down_proj": 1700.0,
                        "gate_up (fused)": 2300.0, "lm_head": 400.0, "copy/convert/concat": 5.0})  # fmt: skip
    mine = pd.Series({"layer": 5000.0, "lm_head": 410.0, "copy/convert/concat": 5.0})
    cut = kernel_time.as_parts_of(mine, before)
    assert cut.to_dict() == {"lm_head": 400.0, "copy/convert/concat": 5.0, "layer": 4900.0}
    assert kernel_time.as_parts_of(before, mine) is mine  # a rung without the layer kernel: as it is
    assert mine.sub(cut, fill_value=0.0).idxmax() == "layer"
    whole = pd.Series({"step": 5300.0, "copy/convert/concat": 5.0})  # the step kernel: all but the embedding row
    assert kernel_time.as_parts_of(whole, before).to_dict() == {"copy/convert/concat": 5.0, "step": 5300.0}
    assert kernel_time.as_parts_of(whole, cut).to_dict() == {"copy/convert/concat": 5.0, "step": 5300.0}
