"""Sort kernel names into kinds (matrix multiply, elementwise, copy, reduction, attention, ...).

The rules are regular expressions tried in order; the first that matches wins.
Order matters:

- torch.compile's generated Triton kernels come first, judged by the prefix Inductor
  gives them (`triton_poi_` pointwise, `triton_red_`/`triton_per_` reduction,
  `triton_tem_` GEMM template, `triton_for_` foreach): the rest of their name lists
  every ATen operator fused into them (`..._to_copy_add_mean_mul_pow_rsqrt_0` is an
  RMSNorm), so the other rules would match a fused `copy` or `attention` by accident.
  One exception: a reduction kernel with a fused `mm` is a matrix-vector product that
  Inductor wrote as a reduction (max-autotune does so for every GEMV of the decode
  step), so it counts as matrix multiply; `bmm` is not enough, since the rotary
  embedding's one-column `bmm` is fused into RMSNorm kernels.
- our own Triton kernels (labsupport.measure.kernels.triton_kernels) by their exact names;
- attention before convolution and matrix multiply: attention kernels may be built from
  CUTLASS, and cuDNN's SDPA runs a second kernel, `cudnn::fusion::lean_reduction_kernel`,
  that reduces the partial results of its split-KV attention kernel;
- communication (collectives between GPUs) before everything but Inductor's prefixes: NCCL's
  kernels (`ncclDevKernel_AllReduce_Sum_bf16_RING_LL(...)`, older `ncclKernel_...`) carry
  `Reduce`, `Copy` or `Sum` in their names, which the later rules would take. gloo runs on
  the CPU and launches no GPU kernel; on a CPU trace the collectives are the functional
  operators DTensor calls (`_c10d_functional::all_reduce`, `..::wait_tensor`, `c10d::...`);
- convolution before matrix multiply: convolutions are often implicit GEMMs;
- PyTorch's copy kernels are instances of its generic elementwise templates
  (`vectorized_elementwise_kernel<..., direct_copy_kernel_cuda ...>`), so copies must
  be caught before elementwise.

On a CPU (the tests' tiny-model path) the "kernels" are top-level ATen operators,
and the same rules cover their names (aten::linear, aten::mul, aten::conv1d, ...).
"""

from __future__ import annotations

import functools
import re

# flash-linear-attention's Triton kernels (the Gated DeltaNet recurrence and its chunked
# form for prompts). They mix information across tokens, so they count as attention.
FLA = re.compile(
    r"gated_delta_rule|fused_recurrent|chunk_(fwd|local|global|scaled)_|solve_tril|merge_16x16"
    r"|recompute_w_u|l2norm_fwd|gdn_gate|wy_repr"
)

KINDS = (
    "matrix multiply",
    "elementwise",
    "copy/convert/concat",
    "reduction",
    "attention",
    "communication",
    "convolution",
    "other",
)

# Collectives: NCCL's GPU kernels, and (CPU traces) the collective operators themselves.
COMMUNICATION = re.compile(r"^(void )?nccl(Dev)?Kernel_|^_?c10d(_functional)?::|^(nccl|gloo):")

# Our own Triton kernels (labsupport.measure.kernels.triton_kernels, .gemv, .persistent_gemv, .decode_attention), by
# their exact names.
OUR_TRITON = {
    "add_kernel": "elementwise",
    "rmsnorm_kernel": "reduction",
    "gemv_kernel": "matrix multiply",
    "persistent_gemv_kernel": "matrix multiply",  # not cuBLAS's, whose names hold "gemv" too
    "attention_part_kernel": "attention",
    "attention_combine_kernel": "attention",
    "attention_kernel": "attention",  # decode_attention_one: the two above in one
    "embed_kernel": "copy/convert/concat",  # folded_norms.embed_row: the embedding row, with its sum of squares
    # layer_kernel: a whole decoder layer, its four GEMVs and attention; its time is mostly its matrices' bytes
    "layer_kernel": "matrix multiply",
    "step_kernel": "matrix multiply",  # every layer's and the LM head's: the step's matrices
}


def _aten(*ops: str) -> str:
    """A pattern for the CPU path's top-level ATen operators called `ops` (exactly)."""
    return r"^aten::(" + "|".join(ops) + r")$"


RULES: list[tuple[str, re.Pattern]] = [
    ("attention", FLA),
    # torch.compile (Inductor) kernels, by prefix.
    ("matrix multiply", re.compile(r"^triton_tem_")),
    ("matrix multiply", re.compile(r"^triton_(red|per)_\w*_(add)?mm_")),
    ("reduction", re.compile(r"^triton_(red|per)_")),
    ("elementwise", re.compile(r"^triton_(poi|for)_")),
    *[(kind, re.compile(rf"^{re.escape(name)}$")) for name, kind in OUR_TRITON.items()],
    ("communication", COMMUNICATION),
    ("attention", re.compile(r"\bcudnn::fusion::lean_reduction_kernel\b")),
    (
        "attention",
        re.compile(
            r"flash|fmha|sdpa|attention|attn|cudnn_generated_fort_native_sdpa|_efficient_attention"
            r"|aten::_scaled_dot_product",
            re.I,
        ),
    ),
    (
        "convolution",
        re.compile(
            r"conv_depthwise|depthwise_conv|causal_conv1d|implicit_convolve|fprop_implicit|implicit_gemm"
            r"|ImplicitGemmConvolution|winograd|^[sh]cudnn_|xmma_(fprop|dgrad|wgrad)|^aten::\w*conv(?!ert)",
            re.I,
        ),
    ),
    (
        "matrix multiply",
        re.compile(
            r"gemm|gemv|nvjet|xmma|cutlass|cublas|splitKreduce|splitK|s16816|s1688|wgmma|trsm|"
            + _aten(
                "mm",
                "bmm",
                "addmm",
                "addbmm",
                "baddbmm",
                "matmul",
                "linear",
                "einsum",
                "mv",
                "addmv",
                "dot",
                "vdot",
                "_addmm_activation",
                "linalg_solve_triangular",
                "triangular_solve",
            ),
            re.I,
        ),
    ),
    (
        "copy/convert/concat",
        re.compile(
            r"copy|^memcpy|CatArray|concat|indexSelect|index_select|index_elementwise|gather|scatter|"
            + _aten(
                "cat",
                "stack",
                "hstack",
                "vstack",
                "to",
                "type_as",
                "clone",
                "contiguous",
                "index",
                "index_put_",
                "index_put",
                "embedding",
                "pad",
                "constant_pad_nd",
                "repeat",
                "repeat_interleave",
                "roll",
                "flip",
                "masked_select",
                "take",
                # metadata only: views a CPU trace may still count (see trace._CPU_NON_KERNELS)
                "split_with_sizes",
                "detach_",
            ),
            re.I,
        ),
    ),
    (
        "reduction",
        re.compile(
            r"reduce|reduction|softmax|SoftMax|argmax|argmin|norm_kernel|layer_norm|rms_norm|topk|sort|scan|"
            + _aten(
                "mean",
                "sum",
                "prod",
                "max",
                "min",
                "amax",
                "amin",
                "argmax",
                "argmin",
                "_softmax",
                "softmax",
                "_log_softmax",
                "log_softmax",
                "logsumexp",
                "norm",
                "linalg_vector_norm",
                "cumsum",
                "cumprod",
                "var",
                "std",
                "all",
                "any",
            ),
            re.I,
        ),
    ),
    (
        "elementwise",
        re.compile(
            r"elementwise|vectorized|unrolled|Functor|pointwise|silu|gelu|act_and_mul|rotary|fill|"
            + _aten(
                "mul",
                "add",
                "sub",
                "div",
                "pow",
                "rsqrt",
                "sqrt",
                "reciprocal",
                "neg",
                "abs",
                "exp",
                "log",
                "log1p",
                "expm1",
                "silu",
                "gelu",
                "relu",
                "sigmoid",
                "tanh",
                "softplus",
                "erf",
                "where",
                "masked_fill",
                "masked_fill_",
                "clamp",
                "clamp_min",
                "clamp_max",
                "minimum",
                "maximum",
                "floor",
                "ceil",
                "round",
                "remainder",
                "fmod",
                "floor_divide",
                "eq",
                "ne",
                "lt",
                "le",
                "gt",
                "ge",
                "logical_and",
                "logical_or",
                "logical_not",
                "bitwise_and",
                "bitwise_or",
                "bitwise_not",
                "tril",
                "triu",
                "cos",
                "sin",
                "fill_",
                "zero_",
                "mul_",
                "add_",
                "sub_",
                "div_",
                "arange",
                "ones",
                "ones_like",
                "zeros",
                "zeros_like",
                "full",
                "full_like",
                "new_zeros",
                "new_ones",
                "new_full",
            ),
            re.I,
        ),
    ),
]


@functools.lru_cache(maxsize=1 << 16)
def classify(name: str) -> str:
    """The kind of the kernel (or, on a CPU, the ATen operator) called `name`.

    Cached: a step launches thousands of kernels but only a few hundred distinct names."""
    for kind, pattern in RULES:
        if pattern.search(name):
            return kind
    return "other"


# Names inside PyTorch's generic kernel templates that say what the kernel computes.
