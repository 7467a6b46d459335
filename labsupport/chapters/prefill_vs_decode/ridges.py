"""The ridge of each GPU the chapter compares (the run's own, by its datasheet and by its
measured ceilings, and the H100 SXM and H200 SXM datasheets), and where this run's prefill
sits against each."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd

from labsupport import runs
from labsupport.measure import hardware

from .phases import phases
from .sweep import crossover
from .tables import bandwidth, limits, ratio, shape
from .work import tokens_at_intensity

# --- the ridge of each GPU --------------------------------------------------------------------

# The GPUs whose ridge the chapter shows beside the run's own: the H100 SXM (the GPU of the
# published profiles the book quotes) and the H200 SXM (the GPU the book's runs were measured on).
RIDGE_GPUS = ("NVIDIA H100 80GB HBM3", "NVIDIA H200")


@dataclass
class Ridge:
    """One GPU's ridge point, and where this run's prefill of `prompt_len` tokens sits
    against it. `this_gpu`: the ridge is that of the GPU the run measured (its datasheet or
    its measured ceilings); only then are `crossover_over_ridge` and the MFU filled: a
    measurement on one GPU is never set against another GPU's limit."""

    gpu: str
    limits: str  # the key: "datasheet" or "measured" (in this run)
    source: str  # for reading: "datasheet", or "measured in this run (...)"
    this_gpu: bool
    peak_tflops: float | None
    bandwidth_tbs: float | None
    ridge: float | None  # FLOP per byte
    ridge_tokens: float | None  # the prompt whose matrix multiplies reach it (tokens_at_intensity)
    prefill_over_ridge: float | None  # the prefill's FLOP per byte of weights over the ridge
    crossover_over_ridge: float | None  # the crossover measured in this run over ridge_tokens
    mfu: float | None  # the prefill's model FLOPs over wall time, over peak_tflops
    mfu_busy: float | None  # over GPU-busy time
    matmul_mfu: float | None  # its matrix multiplies' FLOPs over their kernel time


def ridges(run: runs.Run) -> list[Ridge]:
    """The ridge of each GPU the chapter compares: the run's GPU by its datasheet, the H100
    SXM and H200 SXM datasheets (where the run's GPU is another), and the run's measured
    ceilings (GEMM rate over bandwidth()). The prefill's FLOP per byte is the one the page
    gives everywhere: the whole pass's FLOPs over its bytes (Phase.flop_per_byte); the ridge's
    prompt length is the prompt whose matrix multiplies reach the ridge (tokens_at_intensity)."""
    sh, lim, cr = shape(run), limits(run), crossover(run)
    pre = phases(run)["prefill"]
    fpb = pre.flop_per_byte
    own = hardware.datasheet_or_none(run.provenance.get("gpu", ""))
    sheets = ([own] if own else []) + [
        hardware.DATASHEETS[k] for k in RIDGE_GPUS if not own or hardware.DATASHEETS[k].name != own.name
    ]

    def ridge(name, kind, source, this, tflops, tbs):
        r = tflops / tbs if tflops and tbs else None
        tokens = tokens_at_intensity(sh, r) if r else None
        return Ridge(
            gpu=name,
            limits=kind,
            source=source,
            this_gpu=this,
            peak_tflops=tflops,
            bandwidth_tbs=tbs,
            ridge=r,
            ridge_tokens=tokens,
            prefill_over_ridge=fpb / r if r else None,
            crossover_over_ridge=cr.measured_tokens / tokens if this and tokens else None,
            mfu=ratio(pre.tflops, tflops) if this else None,
            mfu_busy=ratio(pre.tflops_busy, tflops) if this else None,
            matmul_mfu=ratio(pre.matmul_tflops, tflops) if this else None,
        )

    out = [ridge(s.name, "datasheet", "datasheet", s is own, s.bf16_tflops, s.bandwidth_tbs) for s in sheets]
    if lim.gemm_tflops and bandwidth(lim).tbs:
        out.append(
            ridge(
                own.name if own else run.provenance.get("gpu", "this GPU"),
                "measured",
                f"measured on this GPU (GEMM rate, {bandwidth(lim).short})",
                True,
                lim.gemm_tflops,
                bandwidth(lim).tbs,
            )
        )
    return out


def ridge_text(run: runs.Run) -> str:
    """What the ridge table shows, raw and normalised, and what differs between the GPUs."""
    rs, cr = ridges(run), crossover(run)
    n = int(run.parameters["prompt_len"])
    fpb = phases(run)["prefill"].flop_per_byte  # one number: the pass's FLOP per byte
    sheets = [r for r in rs if r.limits == "datasheet"]
    own = next((r for r in sheets if r.this_gpu), None)
    others = [r for r in sheets if not r.this_gpu]
    meas = next((r for r in rs if r.limits == "measured"), None)
    gpu = run.provenance.get("gpu", "this GPU")
    raw = "; ".join(
        f"{r.ridge:.0f} FLOP per byte on {'this' if r.this_gpu else 'an'} {r.gpu} ({r.peak_tflops:.0f} "
        f"TFLOP/s over {r.bandwidth_tbs:.2f} TB/s), reached by a prompt of about {r.ridge_tokens:.0f} tokens"
        for r in sheets
    )
    text = [f"Raw, the ridge belongs to the GPU: {raw}."]
    over = " and ".join(
        f"{r.prefill_over_ridge:.2f} times the ridge of {'this' if r.this_gpu else 'an'} {r.gpu}" for r in sheets
    )
    bound = (
        "so by the datasheets it is compute-bound on each"
        if all(r.prefill_over_ridge > 1 for r in sheets)
        else "so the datasheets do not agree on its side"
    )
    text.append(
        f"The {n:,}-token prefill does {fpb:,.0f} FLOP per byte (its FLOPs over the bytes it must move), whatever the "
        f"GPU: {over}, {bound}."
    )
    ref = own or meas
    if ref and ref.mfu is not None:
        text.append(
            f"Its MFU is set against its own GPU's peak only: {ref.mfu:.1%} of {ref.peak_tflops:.0f} TFLOP/s "
            f"on wall time, {ref.mfu_busy:.1%} on GPU-busy time, {ref.matmul_mfu:.1%} for its matrix "
            "multiplies on their own kernel time."
        )
    whose = {"measured": "the ceilings measured on this GPU", "datasheet": "this GPU's datasheet"}
    crossed = [
        f"{r.crossover_over_ridge:.2f} times the ridge of {whose[r.limits]} ({r.ridge_tokens:.0f} tokens)"
        for r in (own, meas)
        if r and r.crossover_over_ridge
    ]
    if crossed:
        text.append(
            f"The crossover measured in this run, {cr.measured_tokens:.0f} tokens, is "
            + " and ".join(crossed)
            + "; it is a measurement of this GPU alone."
        )
    if own:
        for o in others:
            same_peak = math.isclose(o.peak_tflops, own.peak_tflops)
            peak = (
                f"the same {own.peak_tflops:.0f} TFLOP/s"
                if same_peak
                else f"{own.peak_tflops:.0f} against {o.peak_tflops:.0f} TFLOP/s"
            )
            lo, hi = sorted((own.ridge_tokens, o.ridge_tokens))
            text.append(
                f"Between this {own.gpu} and an {o.gpu}: {peak} of BF16 math, but {own.bandwidth_tbs:.2f} "
                f"against {o.bandwidth_tbs:.2f} TB/s of memory bandwidth, so the ridge of the {o.gpu} is "
                f"{o.ridge / own.ridge:.2f} times this GPU's, and a prompt of {lo:.0f} to {hi:.0f} tokens "
                f"is compute-bound on the {own.gpu if own.ridge < o.ridge else o.gpu} but still "
                f"memory-bound on the {o.gpu if own.ridge < o.ridge else own.gpu}. No {o.gpu} was measured "
                f"here: its row is the datasheet's arithmetic, and its crossover and MFU are not known."
            )
    else:
        text.append(
            f"No datasheet is known for the {gpu}: the datasheet rows are other GPUs', shown for scale, "
            "not set against this run's measurements."
        )
    return " ".join(text)


def ridge_table(run: runs.Run) -> pd.DataFrame:
    """ridges() for reading: one row per GPU and source (NaN: not measured on that GPU)."""
    nan = float("nan")
    return pd.DataFrame(
        [
            {
                "GPU": r.gpu + (" (this run)" if r.this_gpu else ""),
                "limits": r.source,
                "peak TFLOP/s": none_as_nan(r.peak_tflops),
                "TB/s": none_as_nan(r.bandwidth_tbs),
                "ridge FLOP/byte": none_as_nan(r.ridge),
                "ridge, prompt tokens": none_as_nan(r.ridge_tokens),
                "prefill ÷ ridge": none_as_nan(r.prefill_over_ridge),
                "crossover ÷ ridge": none_as_nan(r.crossover_over_ridge),
                "prefill MFU, wall": none_as_nan(r.mfu),
                "prefill MFU, GPU busy": none_as_nan(r.mfu_busy),
            }
            for r in ridges(run)
        ]
    ).fillna(nan)


def none_as_nan(v):
    return float("nan") if v is None else v
