"""Vendor datasheet figures of the GPUs readers have, each with its source, and the match of a
live GPU's name (torch.cuda.get_device_name) to one of them.

Every figure is the vendor's peak: memory bandwidth, dense tensor-core rates (never the
"with sparsity" figure, which is twice the dense one), memory size, SM count, compute
capability. A figure no vendor document states is None (said in the entry's `note`), never
a guess. A GPU not in the table still runs: the chapters compare it with the ceilings they
measure on it only.

The GeForce cards' tensor rates are those with FP32 accumulation, what PyTorch's matrix
multiplies in half precision use (the whitepapers list twice that with FP16 accumulation).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

NVIDIA_DC = "https://www.nvidia.com/en-us/data-center/"


@dataclass(frozen=True)
class Datasheet:
    """Vendor datasheet figures (dense BF16 tensor rate, memory bandwidth and size), with the
    document they come from. A figure the vendor does not state is None."""

    name: str
    bf16_tflops: float | None  # dense; None: no BF16 tensor cores (compute capability below 8.0)
    bandwidth_tbs: float | None
    memory_gb: float | None
    sms: int | None
    source: str  # the vendor document's title
    fp16_tflops: float | None = None  # dense FP16 tensor rate (FP32 accumulation on GeForce)
    compute_capability: str | None = None
    url: str = ""
    note: str = ""  # what is missing or how a figure is read
    names: tuple[str, ...] = ()  # what torch.cuda.get_device_name reports (whole name, any case)

    @property
    def ridge_flop_per_byte(self) -> float | None:
        """Arithmetic intensity above which math, not memory, is the limit (BF16)."""
        if not self.bf16_tflops or not self.bandwidth_tbs:
            return None
        return self.bf16_tflops * 1e12 / (self.bandwidth_tbs * 1e12)

    def tensor_tflops(self, dtype: str = "bfloat16") -> float | None:
        """The dense tensor-core rate of `dtype` ("bfloat16" or "float16")."""
        return self.fp16_tflops if dtype in ("float16", "fp16", "half") else self.bf16_tflops


_CUDA_CC = "CUDA C++ Programming Guide, compute capabilities (https://developer.nvidia.com/cuda-gpus)"


def _a100(name: str, bandwidth_tbs: float, memory_gb: int, reported: str) -> Datasheet:
    """One A100 of the one datasheet: the four differ only in memory, its bandwidth and the name
    torch reports."""
    return Datasheet(
        name,
        312.0,
        bandwidth_tbs,
        memory_gb,
        108,
        "NVIDIA A100 Tensor Core GPU datasheet",
        312.0,
        "8.0",
        NVIDIA_DC + "a100/",
        "624 TFLOP/s is with sparsity",
        (reported,),
    )


SHEETS = (
    Datasheet(
        "T4",
        None,
        0.32,
        16,
        40,
        "NVIDIA T4 Tensor Core GPU datasheet",
        65.0,
        "7.5",
        NVIDIA_DC + "tesla-t4/",
        "no BF16 (Turing): 65 TFLOP/s is the FP16 mixed-precision rate; the SM count (40) is in the "
        "Turing architecture whitepaper's TU104 table, not in the datasheet",
        ("Tesla T4", "NVIDIA T4"),
    ),
    Datasheet(
        "V100 SXM2",
        None,
        0.9,
        None,
        80,
        "NVIDIA Tesla V100 GPU datasheet",
        125.0,
        "7.0",
        NVIDIA_DC + "v100/",
        "no BF16 (Volta): 125 TFLOP/s is the FP16 tensor rate; memory 16 or 32 GB by model",
        ("Tesla V100-SXM2-16GB", "Tesla V100-SXM2-32GB"),
    ),
    Datasheet(
        "V100 PCIe",
        None,
        0.9,
        None,
        80,
        "NVIDIA Tesla V100 GPU datasheet",
        112.0,
        "7.0",
        NVIDIA_DC + "v100/",
        "no BF16 (Volta): 112 TFLOP/s is the FP16 tensor rate; memory 16 or 32 GB by model",
        ("Tesla V100-PCIE-16GB", "Tesla V100-PCIE-32GB"),
    ),
    Datasheet(
        "A10G",
        None,
        0.6,
        24,
        None,
        "Amazon EC2 G5 instances (NVIDIA A10G Tensor Core GPU)",
        None,
        "8.6",
        "https://aws.amazon.com/ec2/instance-types/g5/",
        "an AWS variant with no public NVIDIA datasheet: 24 GB and 600 GB/s as AWS and "
        "https://www.baseten.co/blog/nvidia-a10-vs-a10g-for-ml-model-inference/ give them; no vendor "
        "document states its tensor rates or SM count, so they are left empty",
        ("NVIDIA A10G",),
    ),
    Datasheet(
        "L4",
        121.0,
        0.3,
        24,
        58,
        "NVIDIA L4 Tensor Core GPU datasheet",
        121.0,
        "8.9",
        NVIDIA_DC + "l4/",
        "the datasheet's 242 TFLOP/s is with sparsity",
        ("NVIDIA L4",),
    ),
    Datasheet(
        "L40S",
        362.05,
        0.864,
        48,
        142,
        "NVIDIA L40S GPU datasheet",
        362.05,
        "8.9",
        NVIDIA_DC + "l40s/",
        "the datasheet's 733 TFLOP/s is with sparsity; 142 SMs (one RT core each)",
        ("NVIDIA L40S",),
    ),
    _a100("A100 SXM 40GB", 1.555, 40, "NVIDIA A100-SXM4-40GB"),
    _a100("A100 PCIe 40GB", 1.555, 40, "NVIDIA A100-PCIE-40GB"),
    _a100("A100 SXM 80GB", 2.039, 80, "NVIDIA A100-SXM4-80GB"),
    _a100("A100 PCIe 80GB", 1.935, 80, "NVIDIA A100 80GB PCIe"),
    Datasheet(
        "H100 PCIe",
        756.0,
        2.0,
        80,
        114,
        "NVIDIA H100 Tensor Core GPU datasheet",
        756.0,
        "9.0",
        NVIDIA_DC + "h100/",
        "the datasheet's 1,513 TFLOP/s is with sparsity; 114 SMs per the NVIDIA H100 Tensor Core GPU "
        "Architecture whitepaper",
        ("NVIDIA H100 PCIe",),
    ),
    Datasheet(
        "H100 SXM",
        989.0,
        3.35,
        80,
        132,
        "NVIDIA H100 Tensor Core GPU datasheet",
        989.0,
        "9.0",
        NVIDIA_DC + "h100/",
        "the datasheet's 1,979 TFLOP/s is with sparsity",
        ("NVIDIA H100 80GB HBM3",),
    ),
    Datasheet(
        "H200 SXM",
        989.0,
        4.8,
        141,
        132,
        "NVIDIA H200 Tensor Core GPU datasheet",
        989.0,
        "9.0",
        NVIDIA_DC + "h200/",
        "the datasheet's 1,979 TFLOP/s is with sparsity; H200 NVL is another part",
        ("NVIDIA H200",),
    ),
    Datasheet(
        "B200 (HGX)",
        2250.0,
        8.0,
        180,
        None,
        "NVIDIA HGX B200 datasheet (per GPU of an HGX B200)",
        2250.0,
        "10.0",
        NVIDIA_DC + "hgx/",
        "per GPU of the 8-GPU HGX B200 (1,440 GB over 8 GPUs); the 4,500 TFLOP/s in the datasheet is with "
        "sparsity; no datasheet found states the SM count, so it is left empty",
        ("NVIDIA B200",),
    ),
    Datasheet(
        "RTX 3090",
        71.0,
        0.936,
        24,
        82,
        "NVIDIA Ampere GA102 GPU Architecture whitepaper (appendix A)",
        71.0,
        "8.6",
        "https://www.nvidia.com/content/PDF/nvidia-ampere-ga-102-gpu-architecture-whitepaper-v2.pdf",
        "71 TFLOP/s with FP32 accumulation (142 with FP16 accumulation, 284 with sparsity)",
        ("NVIDIA GeForce RTX 3090",),
    ),
    Datasheet(
        "RTX 4090",
        165.2,
        1.008,
        24,
        128,
        "NVIDIA Ada GPU Architecture whitepaper (appendix A)",
        165.2,
        "8.9",
        "https://images.nvidia.com/aem-dam/Solutions/geforce/ada/nvidia-ada-gpu-architecture.pdf",
        "165.2 TFLOP/s with FP32 accumulation (330.3 with FP16 accumulation; twice each with sparsity)",
        ("NVIDIA GeForce RTX 4090",),
    ),
)

# Keyed by the name torch reports for each (its first reported name): the table the chapters read.
DATASHEETS = {s.names[0]: s for s in SHEETS}


def _plain(name: str) -> str:
    return re.sub(r"\s+", " ", str(name)).strip().casefold()


_BY_NAME = {_plain(n): s for s in SHEETS for n in s.names}


def match(gpu_name: str) -> Datasheet | None:
    """The entry whose reported name is `gpu_name` (whole, any case and spacing), else None.

    A whole-name match, never a part of the name: "NVIDIA L40S" is not the L4, "NVIDIA H200 NVL"
    is not the H200 SXM, an A100 MIG slice ("NVIDIA A100-SXM4-40GB MIG 1g.5gb") is not a whole
    A100, and "NVIDIA GeForce RTX 3090 Ti" is not the RTX 3090."""
    return _BY_NAME.get(_plain(gpu_name))
