"""The 27B Gated DeltaNet hybrid preset, its tiny stand-in profiled on a CPU with the existing
pipeline, and the backend switch (labsupport.measure.models.gated_deltanet) the hybrid chapter uses."""

import os

import pytest

from labsupport.measure import decode, models
from labsupport.measure.models import gated_deltanet
from labsupport.measure.steps import StaticStep, graphs_compiled
from labsupport.traces import kernels, trace

pytestmark = pytest.mark.unit


def test_27b_hybrid_preset_counts():
    c = models.preset_counts("qwen3.5-27b")
    assert c.parameters == 26_895_998_464  # about 54 GB in BF16
    assert c.embedding_parameters == 248_320 * 5120
    assert round(c.parameters * 2 / 1e9) == 54
    cfg = models.hf_config("qwen3.5-27b")
    assert cfg.layer_types.count("full_attention") == 16 and cfg.layer_types.count("linear_attention") == 48
    assert all(t == "full_attention" for t in cfg.layer_types[3::4])
    assert cfg.rope_parameters["partial_rotary_factor"] == 0.25 and cfg.rope_parameters["rope_theta"] == 1e7
    assert not cfg.tie_word_embeddings


@pytest.mark.live
def test_tiny_hybrid_decode_step_profiles_by_layer_type(tmp_path):
    m = models.build_model("tiny-hybrid")
    prompt = decode.Prompt.random(m.config.vocab_size, 1, 16, "cpu")
    path = tmp_path / "t.json.gz"
    decode.profile_decode_step(m, prompt, "cpu", path, warmup=1)
    k = kernels.annotate(trace.read_kernels(path, device="cpu"))
    types = dict(enumerate(m.config.layer_types))
    k = k.dropna(subset=["layer"])
    by_type = k.assign(layer_type=k.layer.map(lambda i: types[int(i)])).groupby("layer_type").part.apply(set)
    assert "linear_attn" in by_type["linear_attention"] and "self_attn" in by_type["full_attention"]
    per_layer = k.groupby("layer").size()
    linear = {per_layer[i] for i, t in types.items() if t == "linear_attention"}
    assert len(linear) == 1, "every linear-attention layer runs the same operators"
    assert os.path.getsize(path) > 0


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
    with pytest.raises(RuntimeError, match="cannot run"), gated_deltanet.use("fla", "cpu"):
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


@pytest.mark.live
def test_compiled_steps_survive_the_backend_switch():
    """The order the hybrid chapter's measuring cells rely on: both backends compile the static
    step with the same torch.compile settings; Dynamo guards on the rule functions the switch
    replaces, so the second backend compiles its own entry, and the first backend's compiled
    step, called again under its own backend (as the profiles re-enter it), runs without
    recompiling."""
    import torch
    import transformers.models.qwen3_5.modeling_qwen3_5 as modeling

    model = models.build_model("tiny-hybrid")
    ids = decode.Prompt.random(model.config.vocab_size, 1, 8, "cpu").ids

    # A stand-in for a second backend on a CPU: other function objects running the reference code.
    def forward_to(f):
        return lambda *a, **k: f(*a, **k)

    other = {n: forward_to(f) for n, f in gated_deltanet._reference_rules().items()}

    def run_once(step, fn):
        step.prepare()
        fn(step.tok, step.pos)

    start = graphs_compiled()
    with torch.no_grad():
        with gated_deltanet.use("reference", "cpu"):
            a = StaticStep(model, ids)
            fa = torch.compile(a.forward, backend="eager", fullgraph=True)
            run_once(a, fa)
        assert graphs_compiled() == start + 1
        with pytest.MonkeyPatch.context() as mp:
            for n, f in other.items():
                mp.setattr(modeling, n, f)
            b = StaticStep(model, ids)
            fb = torch.compile(b.forward, backend="eager", fullgraph=True)
            run_once(b, fb)
            assert graphs_compiled() == start + 2, "the other rule functions failed the first entry's guards"
            run_once(b, fb)
        with gated_deltanet.use("reference", "cpu"):
            run_once(a, fa)
    assert graphs_compiled() == start + 2, "each compiled step ran again under its backend without recompiling"
