"""The datasheet table: every entry sourced, dense rates only, whole-name matching of what
torch.cuda.get_device_name reports, and the H200 figures the published floor rests on."""

import pytest

from labsupport.measure import datasheets, hardware

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    "reported, name",
    [
        ("NVIDIA H200", "H200 SXM"),
        ("Tesla T4", "T4"),
        ("Tesla V100-SXM2-16GB", "V100 SXM2"),
        ("Tesla V100-PCIE-32GB", "V100 PCIe"),
        ("NVIDIA A10G", "A10G"),
        ("NVIDIA L4", "L4"),
        ("NVIDIA L40S", "L40S"),
        ("NVIDIA A100-SXM4-40GB", "A100 SXM 40GB"),
        ("NVIDIA A100-SXM4-80GB", "A100 SXM 80GB"),
        ("NVIDIA A100-PCIE-40GB", "A100 PCIe 40GB"),
        ("NVIDIA A100 80GB PCIe", "A100 PCIe 80GB"),
        ("NVIDIA H100 PCIe", "H100 PCIe"),
        ("NVIDIA H100 80GB HBM3", "H100 SXM"),
        ("NVIDIA B200", "B200 (HGX)"),
        ("NVIDIA GeForce RTX 3090", "RTX 3090"),
        ("NVIDIA GeForce RTX 4090", "RTX 4090"),
        ("  nvidia   geforce rtx 4090 ", "RTX 4090"),
    ],
)
def test_a_reported_name_finds_its_entry(reported, name):
    assert hardware.datasheet(reported).name == name


@pytest.mark.parametrize(
    "reported",
    [
        "NVIDIA L40",
        "NVIDIA H200 NVL",
        "NVIDIA A100-SXM4-40GB MIG 1g.5gb",
        "NVIDIA GeForce RTX 3090 Ti",
        "NVIDIA H100 NVL",
        "Tesla V100S-PCIE-32GB",
        "",
    ],
)
def test_a_part_of_a_name_is_not_a_match(reported):
    assert hardware.datasheet_or_none(reported) is None


def test_the_h200_figures_are_unchanged():
    """The published floor (15.14 GB at 4.8 TB/s = 3.15 ms) rests on these."""
    h = hardware.datasheet("NVIDIA H200")
    assert (h.name, h.bf16_tflops, h.bandwidth_tbs, h.memory_gb, h.sms) == ("H200 SXM", 989.0, 4.8, 141, 132)
    assert round(15_136_811_008 / h.bandwidth_tbs / 1e9, 2) == 3.15
    assert hardware.DATASHEETS["NVIDIA H200"] is h


def test_every_entry_is_sourced_and_dense():
    assert len(datasheets.SHEETS) >= 16 and len({s.name for s in datasheets.SHEETS}) == len(datasheets.SHEETS)
    for s in datasheets.SHEETS:
        assert s.source and s.url.startswith("https://") and s.names, s.name
        for v in (s.bf16_tflops, s.fp16_tflops, s.bandwidth_tbs, s.memory_gb, s.sms):
            assert v is None or v > 0, s.name
        if None in (s.bf16_tflops, s.fp16_tflops, s.sms, s.memory_gb):
            assert s.note, f"{s.name}: an empty figure is said in the note"
        if s.compute_capability and float(s.compute_capability) < 8.0:
            assert s.bf16_tflops is None and s.fp16_tflops, f"{s.name}: no BF16 below compute capability 8.0"
        assert "sparsity" in s.note or s.bf16_tflops is None or s.name.startswith("A10G"), s.name


def test_rates_by_dtype():
    t4 = hardware.datasheet("Tesla T4")
    assert t4.tensor_tflops("float16") == 65.0 and t4.tensor_tflops("bfloat16") is None
    assert t4.ridge_flop_per_byte is None
    assert round(hardware.datasheet("NVIDIA H200").ridge_flop_per_byte) == 206
