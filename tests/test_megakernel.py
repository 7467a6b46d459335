"""The layer kernel (qwen3_decode.Options.layer_kernel, labsupport.measure.kernels.megakernel)
computes a decoder layer as PyTorch does, leaves the Σx² scalars as the folded-norms step leaves
them and its counters at zero, and a step of them gives transformers' logits and token. On a
CPU, in float32, in Triton's interpreter, which runs its programs one after another: the layer
runs as one program there (a wait for another program would never end), so these tests check
every stage's arithmetic and the order of the scalars, not programs waiting on each other, which
only a GPU runs."""

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"  # before any kernel is built

from labsupport.measure.models import qwen3_decode  # noqa: E402

pytest.importorskip("triton")
from labsupport.measure.kernels import folded_norms, gemv, megakernel, persistent_gemv  # noqa: E402

pytestmark = pytest.mark.unit
CLOSE = dict(rtol=1e-4, atol=1e-4)
EPS = 1e-6
# hidden 40 and intermediate 24: no block of rows or of K divides them, so every mask matters
HIDDEN, INTER, HEADS, KV_HEADS, HEAD_DIM, SLOTS, POS = 40, 24, 4, 2, 16, 20, 13
# (the config of the GEMV stages, the attention's positions per item: 8 is three stretches, 32 one)
CASES = {"two-rows": (gemv.Config(2, 16, 4, 2, ctas_per_sm=1), 8),
         "four-rows": (gemv.Config(4, 32, 4, 3, ctas_per_sm=1), None)}  # fmt: skip


def _layer(seed):
    g = torch.Generator().manual_seed(seed)

    def r(*shape, lo=None):
        t = torch.randn(*shape, generator=g)
        return t if lo is None else lo + torch.rand(*shape, generator=g)

    qkv_rows = (HEADS + 2 * KV_HEADS) * HEAD_DIM
    w = {"qkv": r(qkv_rows, HIDDEN) / 4, "o": r(HIDDEN, HEADS * HEAD_DIM) / 4, "gate": r(INTER, HIDDEN) / 4,
         "up": r(INTER, HIDDEN) / 4, "down": r(HIDDEN, INTER) / 4, "in_norm": r(HIDDEN, lo=0.5),
         "post_norm": r(HIDDEN, lo=0.5), "q_norm": r(HEAD_DIM, lo=0.5), "k_norm": r(HEAD_DIM, lo=0.5)}  # fmt: skip
    caches = [r(1, KV_HEADS, SLOTS, HEAD_DIM) for _ in range(2)]
    return r(1, 1, HIDDEN), w, caches


def _reference(x, w, caches):
    """The layer in PyTorch, unfolded: (output, k cache, v cache)."""
    kc, vc = (c.clone() for c in caches)
    shape = qwen3_decode.Shape(HEADS, KV_HEADS, HEAD_DIM, EPS)
    cfg = type("Cfg", (), {"rope_theta": 10000.0, "head_dim": HEAD_DIM})()
    cos, sin = qwen3_decode.rotary(cfg, SLOTS, "cpu", torch.float32)
    h = qwen3_decode.rmsnorm(x, w["in_norm"], EPS)
    a = qwen3_decode.attention(
        [h @ w["qkv"].T], torch.tensor([POS]), cos, sin, kc, vc, w["q_norm"], w["k_norm"], shape, fused=True
    )
    x2 = x + a @ w["o"].T
    h2 = qwen3_decode.rmsnorm(x2, w["post_norm"], EPS)
    act = torch.nn.functional.silu(h2 @ w["gate"].T) * (h2 @ w["up"].T)
    return x2 + act @ w["down"].T, kc, vc, (cos, sin)


@pytest.mark.parametrize("pdl", [False, True], ids=["", "pdl"])
@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_the_layer_kernel_gives_the_layer_and_leaves_the_sums_as_the_folded_step_does(case, pdl, waits_as_no_ops):
    config, block_s = case
    x, w, caches = _layer(0)
    want, want_k, want_v, (cos, sin) = _reference(x, w, caches)
    kc, vc = (c.clone() for c in caches)
    sums = torch.zeros(3, folded_norms.ROW)
    sums[0, 0] = (x**2).sum()  # the layer's input Σx², as the kernel before leaves it
    wqkv = folded_norms.fold(w["qkv"], w["in_norm"])
    wgu = folded_norms.fold(gemv.interleave(w["gate"], w["up"]), w["post_norm"])
    out = megakernel.layer(
        x, wqkv, w["o"], wgu, w["down"], w["q_norm"], w["k_norm"], cos, sin, kc, vc, torch.tensor([POS]), sums,
        HEADS, EPS, config=config, pdl=pdl, block_s=block_s,
    )  # fmt: skip
    torch.testing.assert_close(out, want, **CLOSE)
    torch.testing.assert_close(kc, want_k, **CLOSE)  # the new position written, the rest as it was
    torch.testing.assert_close(vc, want_v, **CLOSE)
    # row 0 (read by QKV) zeroed by o_proj, row 1 (read by gate/up) by down, row 2 the output's Σ
    assert not sums[:2].any()
    assert float(folded_norms.total(sums[2])) == pytest.approx(float((out**2).sum()), rel=1e-5)
    assert not sums[2].unflatten(0, (folded_norms.SLOTS, folded_norms.STRIDE))[:, 1:].any()  # only in slots
    sync = megakernel.counters(KV_HEADS, "cpu")
    assert not sync.any(), "every counter back at zero for the next launch, and no wait gave up"


def test_a_second_launch_finds_its_counters_and_sums_ready(waits_as_no_ops):
    x, w, caches = _layer(1)
    want, *_, (cos, sin) = _reference(x, w, caches)
    wqkv = folded_norms.fold(w["qkv"], w["in_norm"])
    wgu = folded_norms.fold(gemv.interleave(w["gate"], w["up"]), w["post_norm"])
    sums = torch.zeros(3, folded_norms.ROW)
    for _ in range(2):  # as a step's replay does: the same layer, the input's Σx² put back, its output's zeroed
        sums[0, 0], sums[2] = (x**2).sum(), 0.0
        kc, vc = (c.clone() for c in caches)
        out = megakernel.layer(
            x, wqkv, w["o"], wgu, w["down"], w["q_norm"], w["k_norm"], cos, sin, kc, vc, torch.tensor([POS]), sums,
            HEADS, EPS, config=CASES["two-rows"][0], pdl=True, block_s=8,
        )  # fmt: skip
        torch.testing.assert_close(out, want, **CLOSE)


def test_the_grid_is_one_program_in_the_interpreter_and_programs_per_sm_on_a_gpu(monkeypatch):
    assert megakernel.programs(gemv.Config(4, 2048, 8, 3, ctas_per_sm=2), "cpu") == 1
    monkeypatch.setattr(megakernel.persistent_gemv, "sm_count", lambda device: 132)
    assert megakernel.programs(gemv.Config(4, 2048, 8, 3, ctas_per_sm=2), "cuda") == 264


def test_programs_fit_on_an_sm_by_registers_threads_and_shared_memory():
    hopper = dict(regs_per_sm=65536, threads_per_sm=2048, shared_per_sm=233472)
    # 8 warps of 128 registers a thread take 32,768 registers: two fit
    assert megakernel.resident(128, 0, 8, **hopper) == 2
    # 129 registers round up to 136 a thread (a warp's in 256s): 8 x 32 x 136 = 34,816, one fits
    assert megakernel.resident(129, 0, 8, **hopper) == 1
    assert megakernel.resident(32, 0, 4, **hopper) == 16  # by threads: 2,048 / 128
    assert megakernel.resident(32, 100_000, 4, **hopper) == 2  # by shared memory


def test_the_attention_stretch_is_the_shortest_whose_items_every_program_takes_at_once():
    # Qwen3-8B at 272 slots, 8 K/V heads: 16 positions give 136 items, 32 give 72
    assert megakernel.attention_block(272, 8, 132) == 32
    assert megakernel.attention_block(272, 8, 264) == 16
    assert megakernel.attention_block(272, 8, 300) == 8
    assert megakernel.attention_block(4096, 8, 132) == 32  # none fits: the longest


def test_the_layer_kernel_refuses_a_config_without_programs_per_sm_or_with_split_k():
    x, w, caches = _layer(2)
    args = (x, w["qkv"], w["o"], w["qkv"], w["down"], w["q_norm"], w["k_norm"], x, x, *caches, torch.tensor([POS]),
            torch.zeros(3, 4), HEADS, EPS)  # fmt: skip
    for bad in (gemv.Config(2, 16, 4, 2), gemv.Config(3, 16, 4, 2, ctas_per_sm=1)):
        with pytest.raises(ValueError, match="the layer kernel needs programs per SM"):
            megakernel.layer(*args, config=bad)


def test_the_layer_kernel_option_needs_the_folded_step_with_one_attention_kernel():
    from labsupport.chapters import closing_the_gap as ch

    qwen3_decode.Options(**ch.OWN_OPTIONS["layer-kernel"])
    assert ch.OWN_OPTIONS["layer-kernel"] == {**ch.OWN_OPTIONS["folded-norms"], "layer_kernel": True}
    with pytest.raises(ValueError, match="layer_kernel needs fold_norms"):
        qwen3_decode.Options(**{**ch.OWN_OPTIONS["one-attention"], "layer_kernel": True})


@pytest.mark.live
def test_our_decoder_with_one_kernel_a_layer_gives_transformers_logits_and_token(
    tiny_with_norms, waits_as_no_ops, monkeypatch
):
    from labsupport.chapters import closing_the_gap as ch

    model, prompt, ref = tiny_with_norms
    launched = {"layer": 0, "gemv": []}
    layer, launch = megakernel.layer, gemv.launch

    def counted_layer(*a, **k):
        launched["layer"] += 1
        return layer(*a, **k)

    def counted_launch(*a, **k):
        launched["gemv"].append(k.get("argmax") is not None)
        return launch(*a, **k)

    monkeypatch.setattr(megakernel, "layer", counted_layer)
    monkeypatch.setattr(gemv, "launch", counted_launch)
    opts = qwen3_decode.Options(**ch.OWN_OPTIONS["layer-kernel"])
    step = qwen3_decode.OwnStep(model, prompt.ids, ref.token, opts, compile=False, graph=False)
    for _ in range(2):  # after the warm-up's three: the sums and the argmax word ready for each step
        logits, token = step()
        torch.testing.assert_close(logits, ref.logits, **CLOSE)
        assert int(token) == int(ref.next_token)
        assert ch.fidelity((logits, token), ref, ch.ERROR_FACTOR)["passed"]
        sums = step.dec.sums
        assert sums[:-1].eq(0).all() and folded_norms.total(sums[-1]) > 0  # as the folded step leaves them
    layers = model.config.num_hidden_layers
    assert launched["layer"] == 5 * layers, "one layer kernel a layer, every step"
    assert launched["gemv"] == [True] * 5, "the only GEMV left outside is the LM head, with its argmax"


def test_registers_are_capped_so_that_the_programs_of_an_sm_fit_together():
    assert persistent_gemv.max_registers(gemv.Config(4, 2048, 8, 3, ctas_per_sm=2)) == 128  # 65,536 / (2 x 256)
    assert persistent_gemv.max_registers(gemv.Config(8, 2048, 16, 3, ctas_per_sm=1)) == 128
    assert persistent_gemv.max_registers(gemv.Config(2, 512, 4, 2, ctas_per_sm=1)) == 248  # ptxas's 255, down to 8s
    assert persistent_gemv.max_registers(gemv.Config(2, 512, 4, 2, ctas_per_sm=3)) == 168  # 170, down to 8s
    assert persistent_gemv.max_registers(gemv.Config(4, 2048, 8, 3, ctas_per_sm=3)) == 80  # 85, down to 8s
    assert persistent_gemv.max_registers(gemv.Config(4, 2048, 8, 3, ctas_per_sm=4)) == 64
    # every candidate of the layer kernel and of the persistent GEMV fits its programs by the same sum resident() does
    for c in (*megakernel.CANDIDATES, *gemv.PERSISTENT_CANDIDATES):
        regs = persistent_gemv.max_registers(c)
        assert megakernel.resident(regs, 0, c.num_warps, 65536, 2048, 233472) >= c.ctas_per_sm


def test_the_page_gives_the_layer_kernels_time_with_each_config_the_run_tried():
    from types import SimpleNamespace

    from labsupport.chapters.closing_the_gap import prose

    rows = [{"block_n": 4, "block_k": 2048, "num_warps": 8, "num_stages": 3, "ctas_per_sm": 2, "programs": 264,
             "us": 101.25, "status": "ok", "chosen": True},
            {"block_n": 8, "block_k": 2048, "num_warps": 16, "num_stages": 3, "ctas_per_sm": 1, "programs": 132,
             "us": float("nan"), "status": "failed: RuntimeError: gave up waiting", "chosen": False}]  # fmt: skip
    text = prose.layer_tuning_text(SimpleNamespace(results={"layer_tuning": rows}))
    assert "2 programs of 8 warps per SM, 4 rows of 2,048 at a time: 101.2 µs, kept" in text
    assert "1 program of 16 warps per SM, 8 rows of 2,048 at a time: failed: RuntimeError" in text
    assert prose.layer_tuning_text(SimpleNamespace(results={})) == ""  # a run recorded before the rung


def test_the_step_kernel_gives_what_the_layer_kernels_and_the_lm_head_give_one_after_another(waits_as_no_ops):
    """Two layers and an LM head: the step kernel (each layer's tensors by address) against the layer
    kernel on each layer and the folded LM head's GEMV with its argmax."""
    vocab = 50
    x, _, _ = _layer(3)
    layers = [_layer(4 + i)[1:] for i in range(2)]
    cfg = type("Cfg", (), {"rope_theta": 10000.0, "head_dim": HEAD_DIM})()
    cos, sin = qwen3_decode.rotary(cfg, SLOTS, "cpu", torch.float32)
    lm = torch.randn(vocab, HIDDEN, generator=torch.Generator().manual_seed(9)) / 4
    pos = torch.tensor([POS])

    def state():
        sums = torch.zeros(5, folded_norms.ROW)
        sums[0, 0] = (x**2).sum()
        folded = [{"qkv": folded_norms.fold(w["qkv"], w["in_norm"]), "o_proj": w["o"],
                   "gate_up": folded_norms.fold(gemv.interleave(w["gate"], w["up"]), w["post_norm"]),
                   "down": w["down"], "q_norm": w["q_norm"], "k_norm": w["k_norm"], "k_cache": caches[0].clone(),
                   "v_cache": caches[1].clone()} for w, caches in layers]  # fmt: skip
        return sums, folded, folded_norms.argmax_word("cpu")

    sums, folded, word = state()
    h = x
    for i, t in enumerate(folded):
        mats = [t[n] for n in ("qkv", "o_proj", "gate_up", "down", "q_norm", "k_norm")]
        h = megakernel.layer(h, *mats, cos, sin, t["k_cache"], t["v_cache"], pos, sums[2 * i : 2 * i + 3], HEADS, EPS,
                             block_s=8)  # fmt: skip
    want = gemv.gemv(h, lm, eps=EPS, sumsq_in=sums[-1], argmax=word)
    mine_sums, mine, mine_word = state()
    logits = megakernel.step(
        x, megakernel.table(mine), lm, mine_word, cos, sin, pos, mine_sums, inter=INTER, heads=HEADS,
        kv_heads=KV_HEADS, head_dim=HEAD_DIM, slots=SLOTS, eps=EPS, pdl=True, block_s=8,
    )  # fmt: skip
    torch.testing.assert_close(logits, want.reshape(-1), **CLOSE)
    assert int(folded_norms.token_of(mine_word)) == int(folded_norms.token_of(word)) == int(want.argmax())
    for a, b in zip(mine, folded, strict=True):  # every layer's new k and v written through the table
        torch.testing.assert_close(a["k_cache"], b["k_cache"], **CLOSE)
        torch.testing.assert_close(a["v_cache"], b["v_cache"], **CLOSE)
    torch.testing.assert_close(mine_sums, sums, **CLOSE)  # the sums left as the layer kernels leave them
    assert not megakernel.counters(KV_HEADS, "cpu").any(), "every counter back at zero, no wait gave up"


def test_the_step_kernels_table_holds_each_layers_tensors_by_address_in_its_columns_order():
    ts = [{name: torch.zeros(2) for name in megakernel.TABLE_COLUMNS} for _ in range(3)]
    t = megakernel.table(ts)
    assert t.dtype == torch.int64 and t.shape == (3, len(megakernel.TABLE_COLUMNS))
    assert t[2, megakernel.TABLE_COLUMNS.index("k_cache")] == ts[2]["k_cache"].data_ptr()
    ts[1]["down"] = torch.zeros(8)[1:]  # 4 bytes past an aligned start: loads through it could not be 16 wide
    with pytest.raises(ValueError, match="layer 1's down is not contiguous from a 16-byte boundary"):
        megakernel.table(ts)


@pytest.mark.live
def test_our_decoder_in_one_kernel_a_step_gives_transformers_logits_and_token(
    tiny_with_norms, waits_as_no_ops, monkeypatch
):
    from labsupport.chapters import closing_the_gap as ch

    model, prompt, ref = tiny_with_norms
    launched = {"layer": 0, "gemv": 0}

    def no_layer_kernel(*a, **k):
        launched["layer"] += 1

    def no_gemv(*a, **k):
        launched["gemv"] += 1

    monkeypatch.setattr(megakernel, "layer", no_layer_kernel)
    monkeypatch.setattr(gemv, "launch", no_gemv)
    opts = qwen3_decode.Options(**ch.OWN_OPTIONS["step-kernel"])
    step = qwen3_decode.OwnStep(model, prompt.ids, ref.token, opts, compile=False, graph=False)
    for _ in range(2):
        logits, token = step()
        torch.testing.assert_close(logits, ref.logits, **CLOSE)
        assert int(token) == int(ref.next_token)
        sums = step.dec.sums
        assert sums[:-1].eq(0).all() and folded_norms.total(sums[-1]) > 0  # as the folded step leaves them
    assert launched == {"layer": 0, "gemv": 0}, "neither a layer kernel nor a GEMV: one kernel after the embedding row"
    with pytest.raises(ValueError, match="step_kernel needs layer_kernel"):
        qwen3_decode.Options(**ch.OWN_OPTIONS["folded-norms"], step_kernel=True)


def test_the_benchmark_that_checks_the_megakernels_before_a_nightly_runs_the_three_ways_alike(waits_as_no_ops):
    """benchmarks/megakernel_check.py on small shapes in the interpreter: the separate kernels, one
    kernel a layer and one a step give the same logits and token, and no wait gives up."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "megakernel_check.py"
    spec = importlib.util.spec_from_file_location("megakernel_check", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    line = bench.check(bench.TINY, 2, "cpu")
    assert set(line["rel_diff"]) == set(bench.WAYS) and max(line["rel_diff"].values()) <= 1e-5
    assert all(line["same_token"].values()) and line["timeouts"] == 0 and line["us"] == {}  # no timing on a CPU
