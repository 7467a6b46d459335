"""Model presets and counts; datasheets and the measured ceilings' arithmetic."""

import pytest
import torch

from labsupport.measure import hardware, models

pytestmark = pytest.mark.unit


def test_qwen3_8b_counts_match_the_published_model():
    c = models.preset_counts("qwen3-8b")
    assert c.parameters == 8_190_735_360  # 8.19 B
    assert c.non_embedding_parameters == 7_568_405_504  # 7.57 B outside the embedding table
    assert c.embedding_parameters == 151_936 * 4096
    assert c.decode_bytes == 2 * 7_568_405_504  # about 15.1 GB per decode step
    assert round(c.decode_bytes / 1e9, 1) == 15.1
    assert c.layers == 36 and c.bytes_per_parameter == 2


def test_unknown_preset_is_a_clear_error():
    with pytest.raises(
        models.UnknownPresetError,
        match="unknown model preset 'llama-70b'; known presets: qwen3-1.7b, qwen3-8b, qwen3.5-27b, tiny, tiny-hybrid",
    ):
        models.build_model("llama-70b")


def test_tiny_model_runs_on_the_cpu():
    m = models.build_model("tiny")
    assert next(m.parameters()).dtype == torch.bfloat16
    assert m.config.num_hidden_layers == 2 and not m.config.tie_word_embeddings
    out = m(input_ids=torch.tensor([[1, 2, 3]]))
    assert out.logits.shape == (1, 3, 512)


@pytest.mark.parametrize(
    "reported, name",
    [
        ("NVIDIA H200", "H200 SXM"),
        ("NVIDIA H100 80GB HBM3", "H100 SXM"),
        ("NVIDIA A100-SXM4-80GB", "A100 SXM 80GB"),
        ("NVIDIA L4", "L4"),
    ],
)
def test_datasheet_lookup(reported, name):
    assert hardware.datasheet(reported).name == name


def test_ridge_points():
    assert round(hardware.datasheet("NVIDIA H200").ridge_flop_per_byte) == 206
    assert round(hardware.datasheet("NVIDIA H100 80GB HBM3").ridge_flop_per_byte) == 295


def test_unknown_gpu():
    with pytest.raises(hardware.UnknownGPUError, match="no datasheet for GPU 'NVIDIA B999'; known:"):
        hardware.datasheet("NVIDIA B999")
    assert hardware.datasheet_or_none("NVIDIA B999") is None


def test_ceilings_arithmetic_on_the_recorded_run(published):
    row = published.table("ceilings").iloc[0]
    c = hardware.Ceilings(**{k: row[k] for k in hardware.Ceilings.__dataclass_fields__})
    assert c.copy_tbs == pytest.approx(2 * row.copy_bytes / (row.copy_ms_median / 1e3) / 1e12)
    assert c.copy_tbs == pytest.approx(row.copy_tbs)
    assert c.gemm_tflops == pytest.approx(2 * 8192**3 / (row.gemm_ms_median / 1e3) / 1e12)
    assert row.copy_ms_min <= row.copy_ms_median <= row.copy_ms_max
    assert row.repeats == 20


def test_measuring_needs_a_gpu():
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    with pytest.raises((RuntimeError, AssertionError)):
        hardware.measure_ceilings(copy_gib=0.001, gemm_n=64, repeats=1)
