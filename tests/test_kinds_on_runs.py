"""Kinds and sources on every committed run: nothing is left as "other".

Every kernel table (a CSV under runs/ with `name` and `dur_ns` columns), every raw profiler
trace (`*.json.gz`) and every kernel name listed in an attention-backend table, of every
recorded run (published or not), is classified with today's rules. Each trace is parsed
once per session.
"""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path

import pandas as pd
import pytest

from labsupport.traces import kernels, trace

pytestmark = pytest.mark.unit

RUNS = Path(__file__).resolve().parent.parent / "runs"


def _has_kernel_columns(path: Path) -> bool:
    with open(path) as f:
        header = f.readline().strip().split(",")
    return {"name", "dur_ns"} <= set(header)


TABLES = sorted(p for p in RUNS.glob("*/*/*.csv") if _has_kernel_columns(p))
TRACES = sorted(RUNS.glob("*/*/*.json.gz"))
BACKEND_TABLES = sorted(RUNS.glob("*/*/attention_backends.csv"))


def _rel(p: Path) -> str:
    return str(p.relative_to(RUNS))


def _device(path: Path) -> str:
    meta = json.loads((path.parent / "meta.json").read_text())
    return meta.get("provenance", {}).get("device", "cuda")


@functools.cache
def table_kernels(path: Path) -> pd.DataFrame:
    return pd.read_csv(path, usecols=["name", "dur_ns"], dtype={"name": str})


@functools.cache
def trace_kernels(path: Path) -> pd.DataFrame:
    """name, launching operator and duration of every kernel of a trace (parsed once)."""
    return trace.read_kernels(path, device=_device(path))[["name", "op", "dur_ns"]]


@functools.cache
def backend_kernel_names() -> frozenset:
    names = set()
    for p in BACKEND_TABLES:
        for s in pd.read_csv(p, dtype={"kernel_names": str}).kernel_names.dropna():
            names |= {n for n in s.split(";") if n}
    return frozenset(names)


@functools.cache
def all_names() -> frozenset:
    names = set(backend_kernel_names())
    for p in TABLES:
        names |= set(table_kernels(p).name)
    for p in TRACES:
        names |= set(trace_kernels(p).name)
    return frozenset(names)


def _leftovers(names) -> dict:
    names = sorted(set(names))
    return {
        "kind": [n for n in names if kernels.classify(n) == "other"],
        "source": [n for n in names if kernels.source(n) == "other"],
    }


def test_the_runs_hold_what_these_tests_read():
    tables = {p.name for p in TABLES}
    assert {
        "kernels.csv",
        "kernels-decode.csv",
        "kernels-prefill.csv",
        "mlp_kernels.csv",
        "rmsnorm_kernels.csv",
        "add_kernels.csv",
        "fusion_kernels.csv",
    } <= tables
    chapters = {p.parent.parent.name for p in TRACES}
    assert {
        "kernels-in-one-token",
        "launch-overhead",
        "prefill-vs-decode",
        "hybrid-model-token",
        "what-a-kernel",
    } <= chapters
    assert len(TRACES) >= 20 and BACKEND_TABLES
    assert all(len(table_kernels(p)) > 0 for p in TABLES)
    assert len(all_names()) > 150


@pytest.mark.parametrize("path", TABLES, ids=_rel)
def test_every_kernel_of_every_table_has_a_kind_and_a_source(path):
    assert _leftovers(table_kernels(path).name) == {"kind": [], "source": []}


@pytest.mark.parametrize("path", TRACES, ids=_rel)
def test_every_kernel_of_every_trace_has_a_kind_and_a_source(path):
    k = trace_kernels(path)
    assert len(k) > 0, "a recorded trace without kernels"
    assert _leftovers(k.name) == {"kind": [], "source": []}


def test_every_attention_backend_kernel_has_a_kind_and_a_source():
    assert _leftovers(backend_kernel_names()) == {"kind": [], "source": []}


# Kernels by family: (pattern over the recorded names, kind, source).
FAMILIES = [
    (r"^void cudnn::fusion::lean_reduction_kernel<", "attention", "cuDNN"),  # cuDNN SDPA's split-KV reduction
    (r"^cudnn_generated_fort_native_sdpa_", "attention", "cuDNN"),
    (r"^void pytorch_flash::flash_fwd_", "attention", "FlashAttention"),
    (r"^fused_recurrent_gated_delta_rule_fwd_kernel$", "attention", "flash-linear-attention (Triton)"),
    (r"^triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_0$", "reduction", "Triton (torch.compile)"),  # RMSNorm
    (r"^triton_(red|per)_fused_\w*_mean_mul_pow_rsqrt_\d+$", "reduction", "Triton (torch.compile)"),
    (r"^triton_per_fused__to_copy__unsafe_view_mean_pow_", "reduction", "Triton (torch.compile)"),
    (r"^triton_red_fused_mm_t_", "matrix multiply", "Triton (torch.compile)"),  # max-autotune's GEMVs
    (r"^triton_poi_fused_", "elementwise", "Triton (torch.compile)"),
    (r"^add_kernel$", "elementwise", "Triton (ours)"),
    (r"^rmsnorm_kernel$", "reduction", "Triton (ours)"),
    (r"^void cluster_attention_kernel<", "attention", "CUDA C++ (ours)"),  # the one-kernel attention's cluster form
    (r"conv_depthwise2d_forward_kernel", "convolution", "PyTorch (ATen)"),  # the hybrid's causal conv1d
    (r"^nvjet_sm90_", "matrix multiply", "cuBLAS/cuBLASLt"),
    (r"cutlass_80_simt_sgemm", "matrix multiply", "cuBLAS/cuBLASLt"),
]


@pytest.mark.parametrize("pattern, kind, src", FAMILIES, ids=[f[0] for f in FAMILIES])
def test_recorded_families(pattern, kind, src):
    names = [n for n in all_names() if re.search(pattern, n)]
    assert names, f"no recorded kernel matches {pattern!r}"
    assert {kernels.classify(n) for n in names} == {kind}
    assert {kernels.source(n) for n in names} == {src}


def test_rmsnorm_compiled_is_no_longer_a_copy():
    """The fused RMSNorm kernels list `_to_copy` among their ops; the prefix decides."""
    rms = [n for n in all_names() if n.startswith("triton_") and "rsqrt" in n and "_mm_" not in n]
    assert rms
    assert "copy/convert/concat" not in {kernels.classify(n) for n in rms}


@pytest.mark.parametrize("path", TRACES, ids=_rel)
def test_kind_agrees_with_the_launching_operator(path):
    """An eager kernel has the kind of the ATen operator that launched it (the CPU path's
    rules applied to the operator's name): aten::_cudnn_attention_forward launches only
    attention, aten::_conv_depthwise2d only convolution, aten::mm only matrix multiply."""
    k = trace_kernels(path)
    k = k[k.op.str.startswith("aten::")]
    by_op = k.op.map(kernels.classify)
    by_name = k.name.map(kernels.classify)
    odd = sorted(set(zip(k.op[by_op != by_name], by_name[by_op != by_name], strict=True)))
    assert odd == []


def test_lean_reduction_is_launched_by_cudnn_attention():
    ops = set()
    for p in TRACES:
        k = trace_kernels(p)
        ops |= set(k.loc[k.name.str.contains("lean_reduction_kernel", regex=False), "op"])
    # Inside a CUDA graph replay or a compiled graph the launching operator is not an ATen one.
    assert {op for op in ops if op.startswith("aten::")} == {"aten::_cudnn_attention_forward"}


# Traces of a model's step (what-a-kernel's burst of adds and the compiled RMSNorm alone are not).
MODEL_STEPS = [p for p in TRACES if p.parent.parent.name != "what-a-kernel" and "rmsnorm" not in p.name]


@pytest.mark.parametrize("path", MODEL_STEPS, ids=_rel)
def test_matrix_multiply_leads_every_model_step(path):
    """Reading the weights is most of a step's computing, eager or compiled: with max-autotune
    the GEMVs are Triton reductions, which must still count as matrix multiply. An NCCL
    kernel of a split step counts the time it waits for the other rank as its own (most of an
    eager split step, whose hosts are slow), so communication is no computing to compare."""
    k = trace_kernels(path)
    c = kernels.census(k.assign(kind=k.name.map(kernels.classify))).set_index("kind").drop("total")
    c = c.drop(index="communication", errors="ignore")
    assert c.gpu_ns.idxmax() == "matrix multiply", c.gpu_ns.to_dict()
    assert c.loc["other", "kernels"] == 0
