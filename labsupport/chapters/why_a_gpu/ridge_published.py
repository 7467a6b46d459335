"""The ridge point with the KV cache counted, and beside the published H100 figure."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from labsupport import runs
from labsupport.chapters import published
from labsupport.measure import hardware

from .batch_sweep import attention_flop_per_context_token, largest, ridge, sweep
from .one_token import counts

# Published (cite as published, never ours): the Qwen3-8B H100 profile's ridge, in requests.
PUBLISHED_H100_RIDGE_REQUESTS = 295
PUBLISHED_H100_RIDGE_SOURCE = published.QWEN3_8B_H100_SOURCE
H100 = hardware.DATASHEETS["NVIDIA H100 80GB HBM3"]

# The rows of ridge_comparison, by key (`key` column); `KV_RIDGE` rows are one per GPU.
PUBLISHED, DATASHEET_RIDGE, CEILINGS_RIDGE, MEASURED_CROSSING, KV_RIDGE = (
    "published",
    "datasheet",
    "ceilings",
    "measured",
    "kv-cache",
)


@dataclass
class KVRidge:
    """Where the whole step (weights and KV cache) reaches a ridge point, at one context.

    With B sequences of `context` tokens the step does B·(F + a·context) operations on
    W + B·context·kv bytes: its intensity grows with B but never passes `cap`, the KV cache's
    share alone. `batch` is where the intensity reaches `ridge` (inf when `cap` is below it);
    `max_context` is the longest context at which any batch still reaches it."""

    gpu: str
    ridge: float  # FLOP/byte
    context: int
    batch: float
    cap: float  # FLOP/byte at an unlimited batch
    max_context: float


def kv_ridge(run: runs.Run, sheet: hardware.Datasheet, context: int | None = None) -> KVRidge:
    """The batch where the whole step reaches `sheet`'s ridge point, with this run's model and
    KV cache, at `context` (default: the context of the sweep's largest batch)."""
    c, kv, a = counts(run), run.results["kv_bytes_per_token"], attention_flop_per_context_token(run)
    context = int(context if context is not None else largest(sweep(run)).context)
    r = sheet.ridge_flop_per_byte
    room = c.decode_flops + a * context - r * context * kv
    batch = r * c.decode_bytes / room if room > 0 else float("inf")
    max_context = c.decode_flops / (r * kv - a) if r * kv > a else float("inf")
    return KVRidge(
        gpu=sheet.name,
        ridge=r,
        context=context,
        batch=batch,
        cap=(c.decode_flops + a * context) / (context * kv),
        max_context=max_context,
    )


def ridge_comparison(run: runs.Run) -> pd.DataFrame:
    """The published H100 ridge (in requests) beside this run's, raw and as a share of each GPU's
    own datasheet ridge; and where the whole step, KV cache included, reaches each ridge. Rows
    keyed by `key` (PUBLISHED, DATASHEET_RIDGE, CEILINGS_RIDGE, MEASURED_CROSSING, KV_RIDGE)."""
    sheet = hardware.datasheet_or_none(run.provenance["gpu"])
    r = ridge(run)
    gpu = sheet.name if sheet else run.provenance["gpu"]
    own = sheet.ridge_flop_per_byte if sheet else float("nan")
    rows = [
        (
            PUBLISHED,
            "math becomes the limit (published)",
            H100.name,
            PUBLISHED_H100_RIDGE_REQUESTS,
            H100.ridge_flop_per_byte,
            "published (source in the text)",
        )
    ]
    if sheet:
        rows.append((DATASHEET_RIDGE, "datasheet ridge (weights only)", gpu, own, own, f"{sheet.name} datasheet"))
    rows += [
        (CEILINGS_RIDGE, "measured ceilings: GEMM rate / practical ceiling", gpu, r.ceilings_batch, own, "this run"),
        (MEASURED_CROSSING, "matrix multiplies' times cross (measured)", gpu, r.measured_batch, own, "this run"),
    ]
    for sh in [H100] + ([sheet] if sheet and sheet != H100 else []):
        k = kv_ridge(run, sh)
        rows.append(
            (
                KV_RIDGE,
                f"whole step with the KV cache, {k.context}-token context",
                sh.name,
                k.batch,
                sh.ridge_flop_per_byte,
                f"computed here: this run's model, {sh.name} datasheet",
            )
        )
    df = pd.DataFrame(
        rows, columns=["key", "where math becomes the limit", "GPU", "batch", "GPU's datasheet ridge", "from"]
    )
    df["batch / ridge"] = df["batch"] / df["GPU's datasheet ridge"]
    return df[["key", "where math becomes the limit", "GPU", "batch", "GPU's datasheet ridge", "batch / ridge", "from"]]


def ridge_display(run: runs.Run) -> pd.DataFrame:
    """The comparison as the chapter shows it (no keys)."""
    return ridge_comparison(run).drop(columns="key")


def ridge_text(run: runs.Run) -> str:
    """The published H100 ridge beside this run's, raw and normalised, and what else differs."""
    cmp = ridge_comparison(run).set_index("key")
    pub = cmp.loc[PUBLISHED]
    r = ridge(run)
    sheet = hardware.datasheet_or_none(run.provenance["gpu"])
    gpu = sheet.name if sheet else run.provenance["gpu"]
    pub_text = (
        f"the published {PUBLISHED_H100_RIDGE_REQUESTS} is {pub['batch / ridge']:.0%} of the H100's "
        f"({H100.bf16_tflops:.0f} TFLOP/s over {H100.bandwidth_tbs:.2f} TB/s = {H100.ridge_flop_per_byte:.0f} "
        "FLOP per byte; it matches that ratio, so it reads as the datasheet's arithmetic rather than a "
        "measured crossing, and the book has no published batch sweep to set beside this one)"
    )
    if sheet:
        share = r.measured_batch / sheet.ridge_flop_per_byte
        where = (
            "close to where its datasheet puts it"
            if abs(share - 1) <= 0.15
            else "beyond where its datasheet puts it"
            if share > 1
            else "before where its datasheet puts it"
        )
        first = (
            f"Raw, {PUBLISHED_H100_RIDGE_REQUESTS} against this run's measured {r.measured_batch:.0f} reads as "
            f"if the {gpu} turned compute-bound at a much smaller batch. Normalised to each GPU's own datasheet "
            f"ridge: {pub_text}, and this run's measured crossing is {share:.0%} of the {gpu}'s "
            f"({sheet.ridge_flop_per_byte:.0f}), {where}."
        )
        if sheet.bf16_tflops == H100.bf16_tflops and sheet.bandwidth_tbs != H100.bandwidth_tbs:
            first += (
                f" The two GPUs have the same datasheet math rate ({sheet.bf16_tflops:.0f} TFLOP/s) and differ "
                f"in bandwidth ({H100.bandwidth_tbs:.2f} against {sheet.bandwidth_tbs:.2f} TB/s): faster "
                f"memory, not slower math, brings the {gpu}'s ridge to a smaller batch."
            )
    else:
        first = (
            f"Normalised to the H100's own datasheet ridge, {pub_text}. This run's GPU ({gpu}) has no datasheet "
            f"in the book, so its measured crossing ({r.measured_batch:.0f}) cannot be set against its own ridge."
        )
    parts = [first]
    h100 = kv_ridge(run, H100)
    own = kv_ridge(run, sheet) if sheet and sheet != H100 else None

    def at(k: KVRidge) -> str:
        if k.batch == float("inf"):
            return f"no batch on the {k.gpu}"
        return f"about {k.batch:,.0f} sequences on the {k.gpu}"

    both = f"{at(own)} and {at(h100)}" if own else at(h100)
    ctx_max = (
        f"{own.max_context:.0f} tokens on the {own.gpu} ({h100.max_context:.0f} on the {h100.gpu})"
        if own
        else f"{h100.max_context:.0f} tokens on the {h100.gpu}"
    )
    parts.append(
        f"What else differs. Neither ridge counts the KV cache. With this run's {h100.context}-token context "
        f"the whole step reaches the ridge only at {both} (computed from the datasheets and this run's "
        f"model, not measured); at contexts longer than about {ctx_max}, at no batch at all: there, "
        "each sequence's own operations per byte of its cache are below the ridge, and adding sequences "
        "cannot lift the step above it. "
        "The software differs too: the published profile's is named in its source, above; this run "
        f"used transformers {run.provenance.get('transformers', '?')} and PyTorch "
        f"{run.provenance.get('torch', '?')}, eager, on an {run.provenance['gpu']}. A serving engine batches "
        "requests of many "
        "different contexts at once, which moves the crossing again."
    )
    return "\n\n".join(parts)


def ridge_pair_text(run: runs.Run) -> str:
    """The H100's datasheet ridge beside this GPU's, for the exercise on where the ridge falls:
    the GPU with less bandwidth per FLOP has the larger ridge (its BF16 rate over its bandwidth)."""
    sheet = hardware.datasheet_or_none(run.provenance["gpu"])
    pair = [H100] + ([sheet] if sheet and sheet != H100 else [])
    each = "; the ".join(
        f"{s.name} ({s.bf16_tflops:.0f} TFLOP/s over {s.bandwidth_tbs:.2f} TB/s) at {s.ridge_flop_per_byte:.0f} "
        "FLOP/byte"
        for s in sorted(pair, key=lambda s: s.bandwidth_tbs / s.bf16_tflops)
    )
    if len(pair) == 1:
        return f"From its datasheet, the {each}."
    return f"From the datasheets: the {each}. The one with less bandwidth per FLOP needs the larger batch."
