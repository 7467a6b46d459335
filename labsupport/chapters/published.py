"""Figures published by others, quoted as published (their GPUs' numbers, never ours).

Kept apart from measured data: chapters show these beside a run, labelled with
their source, and never feed them into our own arithmetic.
"""

from __future__ import annotations

import pandas as pd

QWEN3_8B_H100_SOURCE = (
    "Published profile of Qwen3-8B, BF16, batch 1, 256-token prompt, one H100 SXM, "
    "Hugging Face transformers 5.19, PyTorch 2.14, eager"
)

# kind, kernels, GPU time (ms), share of GPU time
QWEN3_8B_H100_CENSUS = pd.DataFrame(
    [
        ("matrix multiply", 433, 6.20, 0.61),
        ("elementwise", 1234, 1.97, 0.20),
        ("copy/convert/concat", 547, 1.28, 0.13),
        ("reduction", 146, 0.36, 0.04),
        ("attention", 36, 0.29, 0.03),
        ("other", 2, 0.00, 0.00),
        ("total", 2398, 10.09, 1.00),
    ],
    columns=["kind", "kernels", "gpu_ms", "share"],
)

QWEN3_8B_H100_HEADLINE = {
    "token_ms": 29.3,
    "token_ms_second_run": 37.4,
    "gpu_busy_ms": 10.1,
    "gpu_wait_ms": 19.3,
    "kernel_interval_us": 12.2,
    "kernel_mean_us": 4.2,
    "matmul_bytes_gb": 15.1,
    "matmul_ms": 6.2,
    "matmul_tbs": 2.4,
    "matmul_fraction_of_datasheet": 0.73,
    "best_case_ms": 4.5,
    "attention_kernels": 36,
}

HYBRID_27B_VLLM_SOURCE = (
    "Published profile of a 27B hybrid model (64 layers: 16 full attention, 48 Gated DeltaNet), "
    "one H100 SXM, vLLM 0.31 defaults (CUDA graphs on), batch 1, 512-token prompt"
)

# Kernels of one decode step, by what they do, as published.
HYBRID_27B_VLLM_DECODE = pd.DataFrame(
    [
        ("GEMMs", 305, "92.6% of GPU time"),
        ("split-K reduce", 112, "1.0% of GPU time"),
        ("norms", 177, ""),
        ("linear-attention recurrence and conv", 96, ""),
        ("activations", 64, ""),
        ("full attention", 32, ""),
        ("RoPE / QK-norm", 17, ""),
        ("KV-cache writes", 16, ""),
        ("sampling", 5, ""),
    ],
    columns=["kernels doing", "kernels", "note"],
)

HYBRID_27B_VLLM_HEADLINE = {
    "decode_kernels": 902,
    "decode_ms": 20.55,
    "tokens_per_s": 48.7,
    "eager_kernels": 2464,
    "launch_calls_with_graphs": 21,
    "lm_head_ms": 0.88,
    "lm_head_rows": 248_320,
    "prefill_ms": 54.3,
    "prefill_tokens": 512,
}

# Batch-1 decode steps near their floor, as published, each normalised to its own GPU's floor
# ("x floor": time per token over the weight bytes at that GPU's bandwidth; the basis, the
# datasheet's or a measured copy's, in "floor from"). Times and multiples are quoted as their
# sources give them (text: some are ranges), never recomputed from our numbers. Hazy Research's and
# torchao's figures are fractions of the datasheet bandwidth, x floor their reciprocal (1,905 GB/s
# over the H100 SXM's 3.35 TB/s is 57%, so 1.76x). The serving stacks' page measured SGLang and
# TensorRT-LLM at a concurrency of 4 only, vLLM at 1.
GPUSTACK = "GPUStack performance lab, Qwen3-8B on an H100 SXM (one page for the three engines)"
EMMY_502 = "cloudrift-ai/emmy PR #502"
MEGAKERNELS_VS_GRAPHS = "msaroufim/megakernels-vs-cuda-graphs, RESULTS.md"
GPT_FAST_ON_OUR_H200 = (
    "pytorch-labs/gpt-fast, run on the H200 box that recorded this book's earlier runs (not one of its runs)"
)
NEAR_FLOOR_REFERENCES = pd.DataFrame(
    [
        ("vLLM 0.11", "Qwen3-8B BF16", "H100 SXM", "concurrency 1", "7.28 ms", "1.61×", "datasheet", GPUSTACK),
        ("SGLang 0.5.3", "Qwen3-8B BF16", "H100 SXM", "concurrency 4", "7.19 ms", "1.59×", "datasheet", GPUSTACK),
        ("TensorRT-LLM 1.2rc1", "Qwen3-8B BF16", "H100 SXM", "concurrency 4", "7.67 ms", "1.70×", "datasheet",
         GPUSTACK),
        ("Mirage MPK megakernel", "Qwen3-8B", "A100 80GB", "1", "9.83 ms", "1.32×", "datasheet",
         f"Mirage MPK (arXiv 2512.22219), measured in {EMMY_502}"),
        ("Mirage MPK megakernel", "Qwen3-8B", "A100", "1", "–", "1.02×", "measured copy bandwidth", EMMY_502),
        ("stock vLLM 0.23", "Qwen3-8B", "A100", "1", "–", "1.11×", "measured copy bandwidth", EMMY_502),
        ("gpt-fast", "Llama-2-7B", "A100", "1", "9.53 ms", "1.46×", "datasheet", "pytorch-labs/gpt-fast README"),
        ("gpt-fast at commit 32971d3, Qwen3-8B's shapes, random weights", "Qwen3-8B", "H200", "1", "6.12–6.51 ms",
         "1.94–2.07×", "datasheet", GPT_FAST_ON_OUR_H200),
        ("torch.compile (gpt-fast style)", "Llama-3.1-8B BF16", "H100", "1", "126.9 tokens/s", "1.76×",
         "datasheet (1,905 GB/s)", "pytorch/ao README"),
        ("Hazy Research megakernel", "Llama-3.2-1B", "H100", "1", "–", "1.28×", "datasheet (78% of bandwidth)",
         'Hazy Research, "Look Ma, No Bubbles!" (blog, 2025-05-27)'),
        ("megakernel (replication)", "Llama-1B", "H100", "1", "972.8 µs (CUDA graphs + PDL: 979.5 µs)", "1.32×",
         "datasheet", MEGAKERNELS_VS_GRAPHS),
        ("megakernel (replication)", "Llama-1B", "H200", "1", "759.8 µs (CUDA graphs + PDL: 794.7 µs)", "1.48×",
         "datasheet", MEGAKERNELS_VS_GRAPHS),
    ],
    columns=["system", "model", "GPU", "batch", "time per token", "x floor", "floor from", "source"],
)  # fmt: skip

# Tensor parallelism, as published (other GPUs and models: compare ratios, never raw times).
TP_GPT_FAST_SOURCE = "gpt-fast (pytorch-labs/gpt-fast README): Llama-3.1-8B, BF16, batch 1, A100s"
TP_GPT_FAST_TOKENS_PER_S = {1: 93.8, 2: 149.1}  # tensor-parallel degree -> tokens/s
TP_ALLREDUCE_SOURCE = "SGLang PR #2904: one all-reduce of 32 KB at TP=2 on H100s"
TP_ALLREDUCE_32KB_US = {"vLLM custom all-reduce": 9.0, "SGLang custom all-reduce": 4.5}
