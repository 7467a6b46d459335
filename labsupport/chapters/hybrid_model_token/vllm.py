"""Beside the published vLLM profile (H100): each side measured against its own GPU's limit."""

from __future__ import annotations

import pandas as pd

from labsupport import runs
from labsupport.chapters.hybrid_model_token.keys import MODES_SHORT
from labsupport.chapters.hybrid_model_token.tables import ok_variants, prefill
from labsupport.measure import hardware

PUBLISHED_PRESET = "qwen3.5-27b"  # the configuration of the model class the published profile ran
OURS = "this run (transformers)"
PUBLISHED = "published (vLLM 0.31)"
# The table's keys, dropped for display: side ("published", "ours"), step ("decode", "prompt"),
# backend ("vllm", or this run's Gated DeltaNet backend).
KEYS = ["side", "step", "backend"]


def prefill_flop(run: runs.Run, tokens: int) -> float:
    """Operations of the matrix multiplies with the weights for a prompt of `tokens` tokens: a
    multiply and an add per weight per token in the decoder layers, and the LM head for the one
    token whose next token is sampled (transformers' and vLLM's prompt phase compute no other
    logits). Attention's own products (QK^T, PV) are left out: at 512 tokens they are well
    under 1% of these."""
    m = run.results["model"]
    head = m["lm_head_bytes"] // m["bytes_per_parameter"]
    return 2.0 * (m["matmul_weight_parameters"] - head) * tokens + 2.0 * head


def beside_published(run: runs.Run) -> pd.DataFrame:
    """The published vLLM profile (H100) and this run, each measured against its OWN GPU's
    datasheet limit: a decode step against the time to read the weights once at the GPU's
    bandwidth (the floor), a prompt against its operations at the GPU's dense BF16 rate (MFU).
    Both sides use the bytes and operations of the configuration built here (the published
    model is of the same class); the published times are as published. Each row carries its
    keys (KEYS: one decode row and one prompt row per side and backend); the other columns
    are for display."""
    from labsupport.chapters.published import HYBRID_27B_VLLM_HEADLINE as pub

    m = run.results["model"]
    nbytes = m["decode_bytes"]
    h100 = hardware.datasheet("NVIDIA H100 80GB HBM3")
    ours = hardware.datasheet_or_none(run.provenance["gpu"])
    gpu = ours.name if ours else run.provenance["gpu"].replace("NVIDIA ", "")
    ok = ok_variants(run)
    rows = []

    def decode(source, backend, gpu_name, sheet, what, kernels, ms):
        floor = nbytes / 1e9 / sheet.bandwidth_tbs if sheet else float("nan")
        rows.append(
            {
                "side": "ours" if source == OURS else "published",
                "step": "decode",
                "backend": backend,
                "source": source,
                "GPU": gpu_name,
                "what": what,
                "kernels": kernels,
                "ms": ms,
                "limit at": f"{sheet.bandwidth_tbs:g} TB/s" if sheet else "–",
                "limit ms": floor,
                "of its GPU's limit": floor / ms,
                "rate": f"{nbytes / 1e9 / ms:.2f} TB/s" if sheet or source == OURS else "–",
            }
        )

    def prompt(source, backend, gpu_name, sheet, what, kernels, ms, tokens):
        flop = prefill_flop(run, tokens)
        limit = flop / (sheet.bf16_tflops * 1e12) * 1e3 if sheet else float("nan")
        rows.append(
            {
                "side": "ours" if source == OURS else "published",
                "step": "prompt",
                "backend": backend,
                "source": source,
                "GPU": gpu_name,
                "what": what,
                "kernels": kernels,
                "ms": ms,
                "limit at": f"{sheet.bf16_tflops:g} TFLOP/s" if sheet else "–",
                "limit ms": limit,
                "of its GPU's limit": limit / ms,
                "rate": f"{flop / 1e12 / (ms / 1e3):.0f} TFLOP/s" if sheet or source == OURS else "–",
            }
        )

    # The published profile is of the 27B configuration: its bytes and operations are this run's
    # only when this run built the same one.
    pub_sheet = h100 if run.parameters.get("preset") == PUBLISHED_PRESET else None
    decode(PUBLISHED, "vllm", h100.name, pub_sheet, "decode, CUDA graphs", pub["decode_kernels"], pub["decode_ms"])
    if len(ok):
        best = ok.loc[ok["wall ms"].idxmin()]
        decode(
            OURS,
            best.backend,
            gpu,
            ours,
            f"decode, best: {best.backend}, {MODES_SHORT[best['mode']]}",
            best.kernels,
            best["wall ms"],
        )
    prompt(
        PUBLISHED,
        "vllm",
        h100.name,
        pub_sheet,
        f"{pub['prefill_tokens']}-token prompt",
        float("nan"),
        pub["prefill_ms"],
        pub["prefill_tokens"],
    )
    for _, r in prefill(run).iterrows():
        prompt(
            OURS,
            r.backend,
            gpu,
            ours,
            f"{r.tokens:.0f}-token prompt, {r.backend}",
            r.kernels,
            r["wall ms"],
            int(r.tokens),
        )
    return pd.DataFrame(rows)
