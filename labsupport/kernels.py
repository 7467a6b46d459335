"""Sort kernel names into kinds, and count kernels and GPU time by kind.

The rules are regular expressions tried in order; the first that matches wins.
Order matters: PyTorch's copy kernels are instances of its generic elementwise
templates (`vectorized_elementwise_kernel<..., direct_copy_kernel_cuda ...>`), so
copies must be caught before elementwise; attention kernels may be built from
CUTLASS, so attention comes before matrix multiply.

On a CPU (the tests' tiny-model path) the "kernels" are top-level ATen operators,
and the same rules cover their names (aten::linear, aten::mul, ...).
"""
from __future__ import annotations

import re

import pandas as pd

# flash-linear-attention's Triton kernels (the Gated DeltaNet recurrence and its chunked
# form for prompts). They mix information across tokens, so they count as attention.
FLA = re.compile(r"gated_delta_rule|fused_recurrent|chunk_(fwd|local|global|scaled)_|solve_tril|merge_16x16"
                 r"|recompute_w_u|l2norm_fwd|gdn_gate|wy_repr")

KINDS = ("matrix multiply", "elementwise", "copy/convert/concat", "reduction", "attention", "other")

RULES: list[tuple[str, re.Pattern]] = [
    ("attention", FLA),
    ("attention", re.compile(
        r"flash|fmha|sdpa|attention|attn|cudnn_generated_fort_native_sdpa|_efficient_attention"
        r"|aten::_scaled_dot_product", re.I)),
    ("matrix multiply", re.compile(
        r"gemm|gemv|nvjet|xmma|cutlass|cublas|splitKreduce|splitK|s16816|s1688|wgmma|triton_tem_"
        r"|^aten::(mm|bmm|addmm|matmul|linear|baddbmm)$", re.I)),
    ("copy/convert/concat", re.compile(
        r"copy|CatArray|concat|indexSelect|index_select|index_elementwise|gather|scatter|"
        r"^aten::(cat|copy_|_to_copy|to|clone|index|index_select|embedding|contiguous|stack|gather)$",
        re.I)),
    ("reduction", re.compile(
        r"reduce|softmax|SoftMax|argmax|argmin|norm_kernel|layer_norm|rms_norm|topk|sort|scan|"
        r"triton_red_|triton_per_|^aten::(mean|sum|max|min|amax|argmax|_softmax|softmax|norm|cumsum|var)$",
        re.I)),
    ("elementwise", re.compile(
        r"elementwise|vectorized|unrolled|Functor|pointwise|triton_poi_|silu|gelu|act_and_mul|"
        r"rotary|fill|^aten::(mul|add|sub|div|pow|rsqrt|silu|neg|exp|where|fill_|zero_|sigmoid|"
        r"tanh|masked_fill|clamp|mul_|add_|sqrt|reciprocal|cos|sin|arange|ones|full|zeros)$", re.I)),
]


def classify(name: str) -> str:
    """The kind of the kernel (or, on a CPU, the ATen operator) called `name`."""
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
           "PyTorch (ATen)", "other")

SOURCE_RULES: list[tuple[str, re.Pattern]] = [
    ("cuDNN", re.compile(r"^cudnn|cudnn_generated|\bcudnn::", re.I)),
    ("FlashAttention", re.compile(r"flash_fwd|pytorch_flash::|\bflash::", re.I)),
    ("flash-linear-attention (Triton)", FLA),
    ("Triton (torch.compile)", re.compile(r"^triton_(poi|red|per|tem|for|unk)_")),
    ("Triton (ours)", re.compile(r"^(add_kernel|rmsnorm_kernel)$")),
    # cuBLAS ships its own kernels (nvjet on Hopper, gemv, and CUTLASS-built sgemm for fp32).
    ("cuBLAS/cuBLASLt", re.compile(r"nvjet|cublas|gemv|sm90_xmma|xmma_gemm|splitKreduce|cutlass_80_simt_sgemm"
                                   r"|ampere_\w*gemm|sm80_\w*gemm|s16816gemm", re.I)),
    ("PyTorch (ATen)", re.compile(r"at::native::|\bat::|^void \(anonymous namespace\)::|fmha_cutlass"
                                  r"|indexSelect|CatArrayBatchedCopy|elementwise_kernel|reduce_kernel")),
]


def source(name: str) -> str:
    """The library or tool that a kernel called `name` comes from."""
    for src, pattern in SOURCE_RULES:
        if pattern.search(name):
            return src
    return "other"
