"""Groundwork for the hybrid chapter: the 27B Gated DeltaNet preset, and its decode step
profiled on a CPU at toy size with the existing pipeline."""
import os

from labsupport import decode, models, one_token, trace


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
