"""Groundwork for the hybrid chapter: the 27B Gated DeltaNet preset, and its decode step
profiled on a CPU at toy size with the existing pipeline."""
import os

from labsupport import decode, kernels, models, one_token, trace


def test_27b_hybrid_preset_counts():
    c = models.preset_counts("qwen3.5-27b")
    assert c.parameters == 26_895_998_464                 # about 54 GB in BF16
    assert c.embedding_parameters == 248_320 * 5120
    assert round(c.parameters * 2 / 1e9) == 54
    cfg = models.hf_config("qwen3.5-27b")
    assert cfg.layer_types.count("full_attention") == 16 and cfg.layer_types.count("linear_attention") == 48
    assert all(t == "full_attention" for t in cfg.layer_types[3::4])
    assert cfg.rope_parameters["partial_rotary_factor"] == 0.25 and cfg.rope_parameters["rope_theta"] == 1e7
    assert not cfg.tie_word_embeddings


def test_tiny_hybrid_decode_step_profiles_by_layer_type(tmp_path):
    m = models.build_model("tiny-hybrid")
    prompt = decode.Prompt.random(m.config.vocab_size, 1, 16, "cpu")
    path = tmp_path / "t.json.gz"
    decode.profile_decode_step(m, prompt, "cpu", path, warmup=1)
    k = one_token.annotate_kernels(trace.read_kernels(path, device="cpu"))
    types = dict(enumerate(m.config.layer_types))
    k = k.dropna(subset=["layer"])
    by_type = k.assign(layer_type=k.layer.map(lambda i: types[int(i)])).groupby("layer_type").part.apply(set)
    assert "linear_attn" in by_type["linear_attention"] and "self_attn" in by_type["full_attention"]
    per_layer = k.groupby("layer").size()
    linear = {per_layer[i] for i, t in types.items() if t == "linear_attention"}
    assert len(linear) == 1, "every linear-attention layer runs the same operators"
    assert os.path.getsize(path) > 0


# The chapter "A hybrid model's token" -----------------------------------------------------

import pytest  # noqa: E402

from labsupport import gated_deltanet, hybrid, runs  # noqa: E402


def test_backend_switch_restores_transformers_choice():
    import transformers.models.qwen3_5.modeling_qwen3_5 as m

    before = m.torch_recurrent_gated_delta_rule
    with gated_deltanet.use("reference", "cpu"):
        f = m.torch_recurrent_gated_delta_rule
        assert f is not before and f.__code__.co_filename == m.__file__
    assert m.torch_recurrent_gated_delta_rule is before
    with pytest.raises(gated_deltanet.UnknownBackendError, match="unknown Gated DeltaNet backend 'triton'"):
        gated_deltanet.unavailable_reason("triton", "cuda")
    assert "need a CUDA GPU" in gated_deltanet.unavailable_reason("fla", "cpu")
    with pytest.raises(RuntimeError, match="cannot run"):
        with gated_deltanet.use("fla", "cpu"):
            pass


def test_reference_backend_is_what_transformers_runs_without_fla():
    import torch

    m = models.build_model("tiny-hybrid")
    ids = decode.Prompt.random(m.config.vocab_size, 1, 12, "cpu").ids
    with torch.no_grad():
        plain = m(input_ids=ids).logits
        with gated_deltanet.use("reference", "cpu"):
            switched = m(input_ids=ids).logits
    assert torch.equal(plain, switched)


@pytest.fixture(scope="module")
def tiny_hybrid_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    mp = pytest.MonkeyPatch()
    mp.setenv("LABSUPPORT_RUNS", str(root))
    try:
        params = hybrid.Params(preset="tiny-hybrid", prompt_len=16, repeats=2, contexts=[8, 64, 256], device="cpu")
        yield hybrid.record(params, allow_cpu=True, progress=lambda msg: None)
    finally:
        mp.undo()


def test_tiny_hybrid_run_records_every_variant_with_a_status(tiny_hybrid_run):
    run = tiny_hybrid_run
    assert set(hybrid.ARTIFACTS) <= set(run.meta["files"])
    v = hybrid.variants(run)
    assert len(v) == len(hybrid.MODES) * 2
    ok = v[v.status == "ok"]
    assert list(zip(ok.backend, ok["mode"])) == [("reference", hybrid.MODES["eager"])]
    assert v[v.backend == "fla"].status.str.contains("need a CUDA GPU").all()
    assert v[(v.backend == "reference") & (v.status != "ok")].status.str.contains("needs a CUDA GPU").all()
    k = hybrid.kernel_table(run, "reference", "eager")
    assert ok.kernels.iloc[0] == len(k)
    groups = hybrid.census_by_group(k)
    assert groups.kernels.sum() == len(k) and groups.share.sum() == pytest.approx(1.0)
    assert {"linear attention (Gated DeltaNet)", "full attention", "MLP", "LM head"} <= set(groups.index)


def test_tiny_hybrid_layer_types(tiny_hybrid_run):
    k = hybrid.kernel_table(tiny_hybrid_run, "reference", "eager")
    t = hybrid.per_layer_type(k).set_index("layer type")
    assert t.loc["linear attention", "layers"] == 3 and t.loc["full attention", "layers"] == 1
    for _, r in t.iterrows():
        parts = r["mixer kernels"] + r["MLP kernels"] + r["norms and residual kernels"]
        assert parts == pytest.approx(r["kernels per layer"])
    mix = hybrid.mixer_kernels(k)
    assert len(mix) == t.loc["linear attention", "mixer kernels"]
    assert {"in_proj_qkv", "in_proj_z", "out_proj"} <= set(mix.module)


def test_tiny_hybrid_cache_growth_matches_the_configuration(tiny_hybrid_run):
    cfg = models.hf_config("tiny-hybrid")
    g = hybrid.cache_growth(tiny_hybrid_run)
    full = cfg.layer_types.count("full_attention")
    kv_per_token = full * 2 * cfg.num_key_value_heads * cfg.head_dim * 2          # keys and values, BF16
    assert (g["KV bytes per token"] == kv_per_token).all()
    conv = (2 * cfg.linear_num_key_heads * cfg.linear_key_head_dim
            + cfg.linear_num_value_heads * cfg.linear_value_head_dim) * cfg.linear_conv_kernel_dim * 2
    state = cfg.linear_num_value_heads * cfg.linear_key_head_dim * cfg.linear_value_head_dim * 4  # float32
    linear = cfg.layer_types.count("linear_attention")
    assert (g["linear-attention state MB"] * 1e6).tolist() == pytest.approx([linear * (conv + state)] * len(g))
    assert list(g.context) == [8, 64, 256]


def test_tiny_hybrid_prefill_and_lm_head(tiny_hybrid_run):
    p = hybrid.prefill(tiny_hybrid_run)
    assert list(p.backend) == ["reference"] and p.tokens.iloc[0] == 16 and p.kernels.iloc[0] > 0
    head = hybrid.lm_head(tiny_hybrid_run)
    assert head.rows == 512 and head.gb == pytest.approx(512 * 64 * 2 / 1e9) and head.ms > 0
    side = hybrid.beside_published(tiny_hybrid_run)
    assert side.source.str.contains("published").sum() == 2
    assert side.loc[side.source.str.contains("published"), "kernels"].tolist() == [2464, 902]


def test_unknown_backend_is_refused_before_measuring(runs_root):
    with pytest.raises(gated_deltanet.UnknownBackendError):
        hybrid.record(hybrid.Params(preset="tiny-hybrid", backends=["nope"], device="cpu"), allow_cpu=True)
    assert not any(runs_root.rglob("meta.json"))
    with pytest.raises(runs.RunError):
        hybrid.load("no-such-run")


# The recorded H200 run of the 27B hybrid -------------------------------------------------

@pytest.fixture(scope="module")
def h200_run():
    from .conftest import RUNS

    return runs.load_run(hybrid.CHAPTER, root=RUNS)


def test_recorded_run_has_every_backend_and_mode(h200_run):
    v = hybrid.variants(h200_run)
    assert (v.status == "ok").all(), v[v.status != "ok"]
    assert set(zip(v.backend, v["mode"])) == {(b, m) for b in ("reference", "fla") for m in hybrid.MODES.values()}
    assert h200_run.results["backend_versions"]["fla"] == "0.6.0"
    graphs = v[v["mode"] == hybrid.MODES["cuda-graph"]]
    assert (graphs["launch calls"] == 1).all(), "one replay call launches the whole graph"
    eager = v[v["mode"] == hybrid.MODES["eager"]]
    assert (eager["launch calls"] == eager.kernels).all()


def test_recorded_cache_growth_matches_the_27b_configuration(h200_run):
    cfg = models.hf_config("qwen3.5-27b")
    g = hybrid.cache_growth(h200_run)
    assert (g["KV bytes per token"] == 16 * 2 * cfg.num_key_value_heads * cfg.head_dim * 2).all()  # 65,536
    conv = (2 * 16 * 128 + 48 * 128) * 4 * 2
    state = 48 * 128 * 128 * 4
    assert (g["linear-attention state MB"] * 1e6).tolist() == pytest.approx([48 * (conv + state)] * len(g))


def test_recorded_layers_by_type(h200_run):
    for backend in ("reference", "fla"):
        k = hybrid.kernel_table(h200_run, backend, "eager")
        per_layer = k.dropna(subset=["layer"]).groupby("layer").size()
        types = h200_run.results["model"]["layer_types"]
        for kind in ("linear_attention", "full_attention"):
            counts = {per_layer[i] for i, t in enumerate(types) if t == kind}
            assert len(counts) == 1, f"{backend}: every {kind} layer runs the same kernels"
        t = hybrid.per_layer_type(k).set_index("layer type")
        assert t.loc["linear attention", "layers"] == 48 and t.loc["full attention", "layers"] == 16
    fla = hybrid.kernel_table(h200_run, "fla", "eager")
    rec = fla[fla.name == "fused_recurrent_gated_delta_rule_fwd_kernel"]
    assert len(rec) == 48 and set(rec.part) == {"linear_attn"}
    assert set(rec.name.map(kernels.source)) == {"flash-linear-attention (Triton)"}
    ref = hybrid.kernel_table(h200_run, "reference", "eager")
    assert not ref.name.map(kernels.source).eq("flash-linear-attention (Triton)").any()


def test_recorded_lm_head_is_the_largest_kernel(h200_run):
    head = hybrid.lm_head(h200_run)
    assert head.rows == 248_320 and head.gb == pytest.approx(248_320 * 5120 * 2 / 1e9)
    assert head.is_largest and head.ms > head.floor_ms_datasheet


def test_recorded_time_budget_adds_up(h200_run):
    tb = hybrid.time_budget(h200_run)
    v = h200_run.table("variants")
    busy = (v.gpu_busy_ns / 1e6).values
    parts = (tb["matrix multiplies ms"] + tb["other kernels ms"]).values
    assert parts == pytest.approx(v.kernel_ns.values / 1e6)
    assert parts == pytest.approx(busy, rel=0.01)   # one stream: kernels hardly overlap
    assert ((tb["GPU idle ms"] - (tb["wall ms"] - busy)).abs() < 1e-9).all()
    gb = h200_run.results["model"]["matmul_bytes"] / 1e9
    assert tb["matmul TB/s"].tolist() == pytest.approx((gb / tb["matrix multiplies ms"]).tolist())


def test_recorded_census_by_kind(h200_run):
    c = hybrid.census_by_kind(h200_run)
    v = h200_run.table("variants").set_index(["backend", "mode"])
    for backend in ("reference", "fla"):
        assert c.loc["total", (backend, "kernels")] == v.loc[(backend, "eager"), "kernels"]
        assert c.loc["total", (backend, "GPU ms")] * 1e6 == pytest.approx(v.loc[(backend, "eager"), "kernel_ns"])
    # flash-linear-attention replaces the reference recurrence by one attention-kind kernel per layer
    assert c.loc["attention", ("fla", "kernels")] - c.loc["attention", ("reference", "kernels")] == 48
    assert c.loc["matrix multiply", ("fla", "kernels")] == c.loc["matrix multiply", ("reference", "kernels")]
