"""Kernel kinds and short names, on the kernel names of the recorded H200 trace."""

import pandas as pd
import pytest

from labsupport.traces import kernels, kinds

pytestmark = pytest.mark.unit


def test_every_recorded_kernel_gets_a_real_kind(published_kernels):
    kinds = published_kernels["name"].map(kernels.classify)
    assert set(kinds) <= set(kernels.KINDS)
    unclassified = sorted(set(published_kernels.loc[kinds == "other", "name"]))
    assert unclassified == [], f"kernels left as 'other': {unclassified[:5]}"


@pytest.mark.parametrize(
    "fragment, kind",
    [
        ("nvjet_sm90_tst", "matrix multiply"),  # cuBLASLt's Hopper GEMV/GEMM kernels
        ("cublasLt::splitKreduce_kernel", "matrix multiply"),  # split-K reduce helper of those GEMMs
        ("cutlass_80_simt_sgemm", "matrix multiply"),  # rotary embedding's float32 bmm
        ("cudnn_generated_fort_native_sdpa", "attention"),
        ("direct_copy_kernel_cuda", "copy/convert/concat"),  # .to(float32) inside RMSNorm
        ("bfloat16_copy_kernel_cuda", "copy/convert/concat"),
        ("CatArrayBatchedCopy", "copy/convert/concat"),  # KV cache append, rotate_half
        ("indexSelectSmallIndex", "copy/convert/concat"),  # embedding lookup
        ("MeanOps", "reduction"),
        ("ArgMaxOps", "reduction"),
        ("MulFunctor", "elementwise"),
        ("silu_kernel", "elementwise"),
        ("rsqrt_kernel_cuda", "elementwise"),
        ("CUDAFunctor_add", "elementwise"),
    ],
)
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
    assert kernels.classify("aten::conv1d") == "convolution"
    assert kernels.classify("aten::_convolution") == "convolution"
    assert kernels.classify("aten::convolution") == "convolution"
    assert kernels.classify("aten::_convert_indices_from_coo_to_csr") != "convolution"
    assert kernels.classify("aten::softplus") == "elementwise"
    assert kernels.classify("aten::linalg_solve_triangular") == "matrix multiply"
    assert kernels.source("aten::linear") == "PyTorch (ATen)"
    assert kernels.classify("some_unknown_kernel") == "other"
    assert kernels.source("some_unknown_kernel") == "other"


@pytest.fixture(scope="module")
def tiny_cpu_operators():
    """The top-level ATen operators of one decode step of each tiny model on the CPU (the
    tests' path through the chapters), as trace.read_kernels lists them."""
    import tempfile
    from pathlib import Path

    from labsupport.measure import decode, models
    from labsupport.traces import trace

    names = {}
    with tempfile.TemporaryDirectory() as tmp:
        for preset in ("tiny", "tiny-hybrid"):
            m = models.build_model(preset)
            prompt = decode.Prompt.random(m.config.vocab_size, 1, 16, "cpu")
            path = Path(tmp) / f"{preset}.json.gz"
            decode.profile_decode_step(m, prompt, "cpu", path, warmup=1)
            names[preset] = set(trace.read_kernels(path, device="cpu").name)
    return names


def test_tiny_models_cpu_operators_have_a_kind_and_a_source(tiny_cpu_operators):
    for preset, names in tiny_cpu_operators.items():
        assert names, preset
        assert [n for n in sorted(names) if kernels.classify(n) == "other"] == [], preset
        assert {kernels.source(n) for n in names} == {"PyTorch (ATen)"}, preset
    assert kernels.classify("aten::conv1d") == "convolution" and "aten::conv1d" in tiny_cpu_operators["tiny-hybrid"]
    for preset in tiny_cpu_operators:
        kinds = {kernels.classify(n) for n in tiny_cpu_operators[preset]}
        assert {"matrix multiply", "attention", "reduction", "elementwise", "copy/convert/concat"} <= kinds


# Rules for the kernels of torch.compile, our Triton kernels, cuDNN's SDPA and convolutions.
@pytest.mark.parametrize(
    "name, kind, src",
    [
        # torch.compile: the prefix decides, whatever ops are fused (RMSNorm fuses `_to_copy`).
        ("triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_0", "reduction", "Triton (torch.compile)"),
        ("triton_per_fused__to_copy__unsafe_view_mean_pow_view_18", "reduction", "Triton (torch.compile)"),
        ("triton_poi_fused_copy__11", "elementwise", "Triton (torch.compile)"),
        (
            "triton_poi_fused__scaled_dot_product_cudnn_attention__unsafe_view_add_arange_clone_expand_le_scalar_tensor"
            "_unsqueeze_where_2",
            "elementwise",
            "Triton (torch.compile)",
        ),  # the causal mask, not attention
        ("triton_tem_fused_mm_0", "matrix multiply", "Triton (torch.compile)"),
        ("triton_for_fused_0", "elementwise", "Triton (torch.compile)"),
        # ... except a reduction with a fused mm: a GEMV that Inductor wrote as a reduction
        ("triton_red_fused_mm_t_view_9", "matrix multiply", "Triton (torch.compile)"),
        ("triton_red_fused__to_copy_add_mean_mm_mul_pow_rsqrt_t_view_16", "matrix multiply", "Triton (torch.compile)"),
        ("triton_red_fused__to_copy_addmm_3", "matrix multiply", "Triton (torch.compile)"),
        # ... but not the rotary embedding's one-column bmm
        (
            "triton_per_fused__to_copy__unsafe_view_add_arange_bmm_cat_cos_index_copy_mean_mul_neg_pow_rsqrt_sin_slice"
            "_transpose_unsqueeze_view_3",
            "reduction",
            "Triton (torch.compile)",
        ),
        # our own Triton kernels
        ("add_kernel", "elementwise", "Triton (ours)"),
        ("rmsnorm_kernel", "reduction", "Triton (ours)"),
        ("gemv_kernel", "matrix multiply", "Triton (ours)"),
        ("persistent_gemv_kernel", "matrix multiply", "Triton (ours)"),
        ("attention_part_kernel", "attention", "Triton (ours)"),
        ("attention_combine_kernel", "attention", "Triton (ours)"),
        # our own CUDA C++: the one-kernel attention whose stretches combine in a thread-block cluster
        (
            "void cluster_attention_kernel<4>(__nv_bfloat16 const*, __nv_bfloat16 const*, __nv_bfloat16 const*, "
            "__nv_bfloat16 const*, __nv_bfloat16 const*, __nv_bfloat16*, __nv_bfloat16*, long const*, __nv_bfloat16*, "
            "float, float, int, int, int, int)",
            "attention",
            "CUDA C++ (ours)",
        ),
        # cuDNN's SDPA: the attention kernel and the reduction of its split-KV partial results
        ("void cudnn::fusion::lean_reduction_kernel<false, false, false>(void*, float*, float*)", "attention", "cuDNN"),
        # convolutions: PyTorch's depthwise kernel, cuDNN's implicit-GEMM kernels
        (
            "void at::native::(anonymous namespace)::conv_depthwise2d_forward_kernel_generic<c10::BFloat16, int>(int)",
            "convolution",
            "PyTorch (ATen)",
        ),
        ("sm80_xmma_fprop_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nhwc_tilesize128x128x32", "convolution", "cuDNN"),
        ("void cudnn::detail::implicit_convolve_sgemm<float, float, 128, 5, 5>(int)", "convolution", "cuDNN"),
        # a device-to-device copy captured in a CUDA graph, run by the driver as a kernel (hybrid run, H200)
        ("memcpy128", "copy/convert/concat", "CUDA driver"),
        ("memcpy32_post", "copy/convert/concat", "CUDA driver"),
        # NCCL's all-reduce kernels (NCCL 2.2x names, and the older ncclKernel_ form); gloo has no GPU kernel
        (
            "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
            "communication",
            "NCCL",
        ),
        ("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "communication", "NCCL"),
        ("void ncclKernel_AllReduce_RING_LL_Sum_bfloat16(ncclWork)", "communication", "NCCL"),
        # on a CPU trace: the collective operators DTensor calls (here over gloo)
        ("_c10d_functional::all_reduce", "communication", "other"),
        ("_c10d_functional::wait_tensor", "communication", "other"),
    ],
)
def test_rules(name, kind, src):
    assert kernels.classify(name) == kind
    assert kernels.source(name) == src


def test_only_cudnn_lean_reduction_is_attention():
    """The rule for cuDNN's SDPA helper names it exactly: other reductions stay reductions."""
    assert kernels.classify("lean_reduction_kernel") == "reduction"
    assert kernels.classify("void cudnn::fusion::some_other_kernel<false>(float*)") == "other"
    assert (
        kernels.classify(
            "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, "
            "at::native::MeanOps<float, float, float, float>, unsigned int, float, 4, 4> >()"
        )
        == "reduction"
    )


def test_short_names_keep_the_functor(published_kernels):
    shorts = set(published_kernels["name"].map(kernels.short_name))
    assert "vectorized_elementwise_kernel [silu_kernel]" in shorts
    assert "reduce_kernel [MeanOps]" in shorts
    assert "unrolled_elementwise_kernel [direct_copy_kernel_cuda]" in shorts
    assert all("<" not in s and "(" not in s for s in shorts)
    assert max(map(len, shorts)) <= 70


def test_census_arithmetic():
    df = pd.DataFrame(
        {"kind": ["matrix multiply", "elementwise", "elementwise", "attention"], "dur_ns": [300, 50, 50, 100]}
    )
    c = kernels.census(df).set_index("kind")
    assert list(c.index) == list(kernels.KINDS) + ["total"]
    assert c.loc["elementwise", "kernels"] == 2 and c.loc["elementwise", "gpu_ns"] == 100
    assert c.loc["total", "kernels"] == 4 and c.loc["total", "gpu_ns"] == 500
    assert c.loc["matrix multiply", "share"] == 0.6
    assert c.loc["other", "kernels"] == 0
    assert c.loc["convolution", "kernels"] == 0 and c.loc["convolution", "gpu_ns"] == 0
    assert c.drop("total")["share"].sum() == pytest.approx(1.0)


def test_exclusive_times_charge_shared_time_once_and_add_up_to_the_span():
    """A dependent launch starts inside the kernel before it: only the time after every kernel
    before it has ended is its own; gaps are the time no kernel ran. Given out of start order,
    answered in the frame's own order."""
    # a 0-100; b 90-180 (launched early, waits); c 120-150 (inside b); d 200-300 (after a gap); e 300-350
    k = pd.DataFrame({"start_ns": [200, 0, 90, 120, 300], "end_ns": [300, 100, 180, 150, 350]}, index=list("dabce"))
    x = kernels.exclusive_times(k)
    assert list(x.index) == list("dabce")
    assert x.to_dict("index") == {
        "a": {"exclusive_ns": 100, "gap_before_ns": 0},  # the first kernel: all its own
        "b": {"exclusive_ns": 80, "gap_before_ns": 0},  # the 10 ns it shares with a are a's
        "c": {"exclusive_ns": 0, "gap_before_ns": 0},  # wholly inside b
        "d": {"exclusive_ns": 100, "gap_before_ns": 20},
        "e": {"exclusive_ns": 50, "gap_before_ns": 0},  # starts as d ends
    }
    assert x.exclusive_ns.sum() + x.gap_before_ns.sum() == k.end_ns.max() - k.start_ns.min()
    assert x.exclusive_ns.sum() == kernels.gpu_busy_ns(k) < (k.end_ns - k.start_ns).sum()
    assert kernels.exclusive_times(k.iloc[:0]).empty


def test_only_collectives_are_communication():
    """Reductions and copies whose names mention "reduce" or "copy" stay what they were."""
    assert kernels.classify("void at::native::reduce_kernel<512, 1>(at::native::ReduceOp<float>)") == "reduction"
    assert kernels.classify("void cub::DeviceReduceKernel<float>(float*)") == "reduction"
    assert kernels.classify("aten::copy_") == "copy/convert/concat"
    assert kernels.classify("my_nccl_helper_kernel") != "communication"


def test_kinds_in_order():
    assert kernels.KINDS[-1] == "other" and kernels.KINDS.index("convolution") == len(kernels.KINDS) - 2
    assert len(set(kernels.KINDS)) == len(kernels.KINDS)
    assert {kind for kind, _ in kinds.RULES} == set(kernels.KINDS) - {"other"}


# The example kernel of a kind or source: its most time-consuming one ----------------------


def _slowest_by_hand(k, column):
    per_name = {}
    for value, name, dur in zip(k[column], k["name"], k["dur_ns"], strict=False):
        per_name[(value, name)] = per_name.get((value, name), 0) + int(dur)
    best = {}
    for (value, name), ns in per_name.items():
        if value not in best or (-ns, name) < (-best[value][1], best[value][0]):
            best[value] = (name, ns)
    return {v: n for v, (n, _) in best.items()}


@pytest.mark.parametrize("by", ["kind", "source"])
def test_top_kernels_on_the_recorded_step(published_kernels, by):
    k = published_kernels[["name", "dur_ns"]]
    top = kernels.top_kernels(k, by)
    column = k["name"].map(kernels.classify if by == "kind" else kernels.source)
    assert top.to_dict() == _slowest_by_hand(k.assign(**{by: column}), by)
    order = kernels.KINDS if by == "kind" else kernels.SOURCES
    assert list(top.index) == [v for v in order if v in set(column)]
    for value, name in top.items():
        assert kernels.example_kernel(k, by, value) == name


def test_cublas_example_is_the_step_s_big_gemv_not_the_rotary_sgemm(published_kernels):
    k = published_kernels
    ex = kernels.example_kernel(k, "source", "cuBLAS/cuBLASLt")
    assert ex.startswith("nvjet_sm90_")
    cublas = k[k.name.map(kernels.source) == "cuBLAS/cuBLASLt"]
    per_name = cublas.groupby("name").dur_ns.sum()
    assert per_name[ex] == per_name.max()
    sgemm = [n for n in per_name.index if "cutlass_80_simt_sgemm" in n]
    assert sgemm and per_name[sgemm].max() < per_name[ex]
    assert kernels.example_kernel(k, "kind", "matrix multiply") == ex
    assert "lean_reduction" not in kernels.example_kernel(k, "kind", "attention")


def test_top_kernels_ties_and_missing_values():
    k = pd.DataFrame({"name": ["b_gemm", "a_gemm", "b_gemm", "silu_kernel"], "dur_ns": [5, 10, 5, 1]})
    assert kernels.top_kernels(k, "kind").to_dict() == {"matrix multiply": "a_gemm", "elementwise": "silu_kernel"}
    with pytest.raises(KeyError):
        kernels.example_kernel(k, "kind", "attention")
    with pytest.raises(KeyError):
        kernels.top_kernels(k, "layer")
