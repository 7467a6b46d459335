"""Sort kernel names into kinds, and count kernels and GPU time by kind.

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
- our own Triton kernels (labsupport.measure.triton_kernels) by their exact names;
- attention before convolution and matrix multiply: attention kernels may be built from
  CUTLASS, and cuDNN's SDPA runs a second kernel, `cudnn::fusion::lean_reduction_kernel`,
  that reduces the partial results of its split-KV attention kernel;
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

import pandas as pd

# flash-linear-attention's Triton kernels (the Gated DeltaNet recurrence and its chunked
# form for prompts). They mix information across tokens, so they count as attention.
FLA = re.compile(r"gated_delta_rule|fused_recurrent|chunk_(fwd|local|global|scaled)_|solve_tril|merge_16x16"
                 r"|recompute_w_u|l2norm_fwd|gdn_gate|wy_repr")

KINDS = ("matrix multiply", "elementwise", "copy/convert/concat", "reduction", "attention", "convolution",
         "other")

# Our own Triton kernels (labsupport.measure.triton_kernels), by their exact names.
OUR_TRITON = {"add_kernel": "elementwise", "rmsnorm_kernel": "reduction"}


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
    ("attention", re.compile(r"\bcudnn::fusion::lean_reduction_kernel\b")),
    ("attention", re.compile(
        r"flash|fmha|sdpa|attention|attn|cudnn_generated_fort_native_sdpa|_efficient_attention"
        r"|aten::_scaled_dot_product", re.I)),
    ("convolution", re.compile(
        r"conv_depthwise|depthwise_conv|causal_conv1d|implicit_convolve|fprop_implicit|implicit_gemm"
        r"|ImplicitGemmConvolution|winograd|^[sh]cudnn_|xmma_(fprop|dgrad|wgrad)|^aten::\w*conv(?!ert)", re.I)),
    ("matrix multiply", re.compile(
        r"gemm|gemv|nvjet|xmma|cutlass|cublas|splitKreduce|splitK|s16816|s1688|wgmma|trsm|"
        + _aten("mm", "bmm", "addmm", "addbmm", "baddbmm", "matmul", "linear", "einsum", "mv", "addmv", "dot",
                "vdot", "_addmm_activation", "linalg_solve_triangular", "triangular_solve"), re.I)),
    ("copy/convert/concat", re.compile(
        r"copy|^memcpy|CatArray|concat|indexSelect|index_select|index_elementwise|gather|scatter|"
        + _aten("cat", "stack", "hstack", "vstack", "to", "type_as", "clone", "contiguous", "index", "index_put_",
                "index_put", "embedding", "pad", "constant_pad_nd", "repeat", "repeat_interleave", "roll", "flip",
                "masked_select", "take",
                # metadata only: views a CPU trace may still count (see trace._CPU_NON_KERNELS)
                "split_with_sizes", "detach_"),
        re.I)),
    ("reduction", re.compile(
        r"reduce|reduction|softmax|SoftMax|argmax|argmin|norm_kernel|layer_norm|rms_norm|topk|sort|scan|"
        + _aten("mean", "sum", "prod", "max", "min", "amax", "amin", "argmax", "argmin", "_softmax", "softmax",
                "_log_softmax", "log_softmax", "logsumexp", "norm", "linalg_vector_norm", "cumsum", "cumprod",
                "var", "std", "all", "any"),
        re.I)),
    ("elementwise", re.compile(
        r"elementwise|vectorized|unrolled|Functor|pointwise|silu|gelu|act_and_mul|rotary|fill|"
        + _aten("mul", "add", "sub", "div", "pow", "rsqrt", "sqrt", "reciprocal", "neg", "abs", "exp", "log",
                "log1p", "expm1", "silu", "gelu", "relu", "sigmoid", "tanh", "softplus", "erf", "where",
                "masked_fill", "masked_fill_", "clamp", "clamp_min", "clamp_max", "minimum", "maximum", "floor",
                "ceil", "round", "remainder", "fmod", "floor_divide", "eq", "ne", "lt", "le", "gt", "ge",
                "logical_and", "logical_or", "logical_not", "bitwise_and", "bitwise_or", "bitwise_not", "tril",
                "triu", "cos", "sin", "fill_", "zero_", "mul_", "add_", "sub_", "div_", "arange", "ones",
                "ones_like", "zeros", "zeros_like", "full", "full_like", "new_zeros", "new_ones", "new_full"),
        re.I)),
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
_HINT = re.compile(r"([A-Za-z]\w*?(?:_kernel_cuda|_kernel_impl|_kernel|Functor\w*|Ops)|CatArray\w*)\b")
_GENERIC = {"BinaryFunctor", "AUnaryFunctor", "BUnaryFunctor", "gpu_kernel_impl_nocast", "gpu_kernel_impl",
            "CUDAFunctorOnOther_add", "elementwise_kernel", "vectorized_elementwise_kernel",
            "unrolled_elementwise_kernel", "reduce_kernel"}


def short_name(name: str, width: int = 70) -> str:
    """A readable kernel name: template arguments and parameters dropped, the functor
    that tells generic PyTorch kernels apart kept in brackets
    (`vectorized_elementwise_kernel [CUDAFunctor_add]`)."""
    s = re.sub(r"^void\s+", "", name).replace("(anonymous namespace)::", "")
    depth, out = 0, []
    for ch in s:
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth = max(0, depth - 1)
        elif depth == 0:
            out.append(ch)
    base = re.sub(r"\(.*$", "", "".join(out)).strip()
    base = re.sub(r"^(at::native::|at::)", "", base)
    hints = [h for h in _HINT.findall(s[s.find("<"):]) if h not in _GENERIC] if "<" in s else []
    if hints and hints[0] not in base:
        base = f"{base} [{hints[0]}]"
    return base if len(base) <= width else base[: width - 1] + "…"


def census(kernels: pd.DataFrame) -> pd.DataFrame:
    """Kernel count and GPU time by kind (integer nanoseconds, so it recomputes exactly).

    `kernels` needs columns `kind` and `dur_ns`. Rows follow KINDS; a total row ends it.
    """
    g = kernels.groupby("kind")["dur_ns"].agg(kernels="count", gpu_ns="sum")
    g = g.reindex(list(KINDS), fill_value=0).reset_index()
    total_ns = int(g["gpu_ns"].sum())
    g["kernels"] = g["kernels"].astype(int)
    g["gpu_ns"] = g["gpu_ns"].astype("int64")
    g.loc[len(g)] = ["total", int(g["kernels"].sum()), total_ns]
    g["gpu_ms"] = (g["gpu_ns"] / 1e6).round(4)
    g["share"] = (g["gpu_ns"] / total_ns).round(4) if total_ns else 0.0
    return g


# Where a kernel's code comes from, judged by its name. Order matters as for kinds.
SOURCES = ("cuBLAS/cuBLASLt", "cuDNN", "FlashAttention", "flash-linear-attention (Triton)",
           "Triton (torch.compile)", "Triton (ours)",
           "PyTorch (ATen)", "CUDA driver", "other")

SOURCE_RULES: list[tuple[str, re.Pattern]] = [
    # cuDNN: its SDPA kernels and their helpers (cudnn::fusion::lean_reduction_kernel), and its
    # convolution kernels (implicit-GEMM xmma/cutlass fprop, implicit_convolve, [sh]cudnn_*).
    ("cuDNN", re.compile(r"^cudnn|cudnn_generated|\bcudnn::|^[sh]cudnn_|xmma_(fprop|dgrad|wgrad)"
                         r"|implicit_convolve|_cudnn::", re.I)),
    ("FlashAttention", re.compile(r"flash_fwd|pytorch_flash::|\bflash::", re.I)),
    ("flash-linear-attention (Triton)", FLA),
    ("Triton (torch.compile)", re.compile(r"^triton_(poi|red|per|tem|for|unk)_")),
    ("Triton (ours)", re.compile("^(" + "|".join(OUR_TRITON) + ")$")),
    # cuBLAS ships its own kernels (nvjet on Hopper, gemv, and CUTLASS-built sgemm for fp32).
    ("cuBLAS/cuBLASLt", re.compile(r"nvjet|cublas|gemv|sm90_xmma|xmma_gemm|splitKreduce|cutlass_80_simt_sgemm"
                                   r"|ampere_\w*gemm|sm80_\w*gemm|s16816gemm", re.I)),
    ("PyTorch (ATen)", re.compile(r"at::native::|\bat::|^void \(anonymous namespace\)::|fmha_cutlass"
                                  r"|indexSelect|CatArrayBatchedCopy|elementwise_kernel|reduce_kernel"
                                  r"|^aten::")),  # on a CPU every "kernel" is an ATen operator
    # The driver's own copy kernels: a memory copy captured in a CUDA graph can run as a kernel
    # (`memcpy128`, `memcpy32_post` in the H200 runs, CUDA 13 driver 580), not a copy-engine copy.
    ("CUDA driver", re.compile(r"^memcpy\w*$")),
]


@functools.lru_cache(maxsize=1 << 16)
def source(name: str) -> str:
    """The library or tool that a kernel called `name` comes from."""
    for src, pattern in SOURCE_RULES:
        if pattern.search(name):
            return src
    return "other"


def top_kernels(k: pd.DataFrame, by: str = "kind") -> pd.Series:
    """For each kind (or source, or any other column named `by`), its most time-consuming
    kernel: the full name whose launches add up to the most GPU time (`dur_ns` summed over
    every launch of that name). Ties go to the name that sorts first.

    `k` needs `name` and `dur_ns`; a missing `kind` or `source` column is computed from the
    names. The result is indexed by the values of `by`, in KINDS or SOURCES order for those.
    """
    if by not in k.columns:
        if by not in ("kind", "source"):
            raise KeyError(f"no column {by!r} in the kernel table")
        k = k.assign(**{by: k["name"].map(classify if by == "kind" else source)})
    per_name = k.groupby([by, "name"], sort=False)["dur_ns"].sum().reset_index()
    per_name = per_name.sort_values([by, "dur_ns", "name"], ascending=[True, False, True], kind="stable")
    top = per_name.drop_duplicates(by).set_index(by)["name"]
    order = {"kind": KINDS, "source": SOURCES}.get(by)
    if order is not None:
        top = top.reindex([v for v in order if v in top.index])
    top.name = "example kernel"
    return top


def example_kernel(k: pd.DataFrame, by: str, value: str) -> str:
    """The kernel shown as the example of one kind or source (`by` = "kind" or "source"):
    its most time-consuming one (see top_kernels)."""
    top = top_kernels(k, by)
    if value not in top.index:
        raise KeyError(f"no kernel of {by} {value!r} in the table")
    return top[value]

def annotate(df: pd.DataFrame) -> pd.DataFrame:
    """Add kind, a readable short name, and the decoder layer and part of the model
    (self_attn, mlp, a norm, lm_head, ...) that launched each kernel."""
    df = df.copy()
    df["kind"] = df["name"].map(classify)
    df["short_name"] = df["name"].map(short_name)
    layer = df["module"].str.extract(r"^layers\.(\d+)(?:\.|$)")[0]
    df["layer"] = pd.to_numeric(layer, errors="coerce").astype("Int64")
    part = df["module"].str.extract(r"^layers\.\d+\.([A-Za-z_]+)")[0]
    df["part"] = part.fillna(df["module"].where(df["layer"].isna(), "residual add"))
    df.loc[df["module"] == "", "part"] = "outside modules"
    return df
