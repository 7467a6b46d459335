"""Kernel kinds and short names, on the kernel names of the recorded H200 trace."""
import pandas as pd
import pytest

from labsupport import kernels


def test_every_recorded_kernel_gets_a_real_kind(published_kernels):
    kinds = published_kernels["name"].map(kernels.classify)
    assert set(kinds) <= set(kernels.KINDS)
    unclassified = sorted(set(published_kernels.loc[kinds == "other", "name"]))
    assert unclassified == [], f"kernels left as 'other': {unclassified[:5]}"


@pytest.mark.parametrize("fragment, kind", [
    ("nvjet_sm90_tst", "matrix multiply"),            # cuBLASLt's Hopper GEMV/GEMM kernels
    ("cublasLt::splitKreduce_kernel", "matrix multiply"),  # split-K reduce helper of those GEMMs
    ("cutlass_80_simt_sgemm", "matrix multiply"),      # rotary embedding's float32 bmm
    ("cudnn_generated_fort_native_sdpa", "attention"),
    ("direct_copy_kernel_cuda", "copy/convert/concat"),  # .to(float32) inside RMSNorm
    ("bfloat16_copy_kernel_cuda", "copy/convert/concat"),
    ("CatArrayBatchedCopy", "copy/convert/concat"),    # KV cache append, rotate_half
    ("indexSelectSmallIndex", "copy/convert/concat"),  # embedding lookup
    ("MeanOps", "reduction"),
    ("ArgMaxOps", "reduction"),
    ("MulFunctor", "elementwise"),
    ("silu_kernel", "elementwise"),
    ("rsqrt_kernel_cuda", "elementwise"),
    ("CUDAFunctor_add", "elementwise"),
])
def test_recorded_names_by_family(published_kernels, fragment, kind):
    names = [n for n in set(published_kernels["name"]) if fragment in n]
    assert names, f"no recorded kernel contains {fragment!r}"
    assert {kernels.classify(n) for n in names} == {kind}


def test_cpu_operator_names():
    assert kernels.classify("aten::linear") == "matrix multiply"
    assert kernels.classify("aten::scaled_dot_product_attention") == "attention"
    assert kernels.classify("aten::to") == "copy/convert/concat"
    assert kernels.classify("aten::mean") == "reduction"
    assert kernels.classify("aten::mul") == "elementwise"
    assert kernels.classify("some_unknown_kernel") == "other"


def test_short_names_keep_the_functor(published_kernels):
    shorts = set(published_kernels["name"].map(kernels.short_name))
    assert "vectorized_elementwise_kernel [silu_kernel]" in shorts
    assert "reduce_kernel [MeanOps]" in shorts
    assert "unrolled_elementwise_kernel [direct_copy_kernel_cuda]" in shorts
    assert all("<" not in s and "(" not in s for s in shorts)
    assert max(map(len, shorts)) <= 70


def test_census_arithmetic():
    df = pd.DataFrame({"kind": ["matrix multiply", "elementwise", "elementwise", "attention"],
                       "dur_ns": [300, 50, 50, 100]})
    c = kernels.census(df).set_index("kind")
    assert list(c.index) == list(kernels.KINDS) + ["total"]
    assert c.loc["elementwise", "kernels"] == 2 and c.loc["elementwise", "gpu_ns"] == 100
    assert c.loc["total", "kernels"] == 4 and c.loc["total", "gpu_ns"] == 500
    assert c.loc["matrix multiply", "share"] == 0.6
    assert c.loc["other", "kernels"] == 0
    assert c.drop("total")["share"].sum() == pytest.approx(1.0)
