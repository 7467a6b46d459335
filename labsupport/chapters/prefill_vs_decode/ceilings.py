"""Every rate against the ceilings: the roofline of every matrix multiply of both passes (one
point per weight matrix and phase, each whole pass as one point, the roofs, each phase's cluster
summarised for the prose), the ridge of each GPU the chapter compares and where this run's prefill
sits against each, the sentences that explain a rate above a measured ceiling, and the headline
numbers the status page follows.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import pandas as pd

from labsupport import runs
from labsupport.measure import hardware

from .analysis import (
    bandwidth,
    crossover,
    kernel_table,
    layer_gemms,
    limits,
    measured_ridge,
    phases,
    prompt_sweep,
    ratio,
    shape,
    side_by_side,
)
from .measuring import GEMM_MODULES, LM_HEAD, MATMUL, PHASES, ROOFLINE_MODULES, SHORT, tokens_at_intensity


def attainable(flop_per_byte, tflops: float | None, tbs: float | None):
    """The most TFLOP/s work at `flop_per_byte` can reach under a roof of `tflops` (math) and
    `tbs` (memory): min(tflops, tbs × FLOP per byte). NaN where either limit is unknown."""
    import numpy as np

    x = np.asarray(flop_per_byte, dtype=float)
    return np.minimum(tflops, tbs * x) if tflops and tbs else np.full_like(x, float("nan"))


def _hidden(run: runs.Run) -> int:
    shapes = run.results["gemm_shapes"]
    return int(shapes["mlp.down_proj"][1] if "mlp.down_proj" in shapes else shapes["self_attn.o_proj"][1])


def gemm_points(run: runs.Run) -> pd.DataFrame:
    """The points of the roofline: one row per weight matrix (the seven of a decoder layer,
    and the LM head) and phase, its kernels summed over every decoder layer.

    rows      = tokens that go through the matrix: the prompt for a decoder layer's matrix in
                prefill, 1 in decode, and 1 for the LM head in both phases (a prefill asks for
                the logits of its last token only);
    instances = decoder layers whose kernels for that matrix the profile holds (1 for the LM head);
    FLOPs     = instances × 2 × rows × in × out;
    bytes     = instances × bytes per value × (in × out + rows × in + rows × out): the weight,
                the input and the output, each moved once (the least traffic; a split-K
                kernel's partial sums add to it, unseen here);
    time      = the matrix-multiply kernels launched by that matrix (a split-K reduction included).

    `roof_*` is the most TFLOP/s at that FLOP per byte (attainable()) under the datasheet's
    ceilings and under those measured in the run (GEMM rate, bandwidth()); `of_*_roof` the
    share of it reached. Below the ridge the roof is the bandwidth slope, so that share is the
    share of the bandwidth reached; above it, the share of the peak FLOP/s."""
    shapes = run.results["gemm_shapes"]
    sh, lim = shape(run), limits(run)
    p = sh.bytes_per_value
    hidden = _hidden(run)
    n = int(run.parameters["prompt_len"])
    rows = []
    for ph in PHASES:
        k = kernel_table(run, ph)
        k = k[k.kind == MATMUL]
        for mod in ROOFLINE_MODULES:
            if mod == LM_HEAD:
                fin, fout, m_rows = hidden, sh.lm_head_parameters // hidden, 1
                g = k[k.module == LM_HEAD]
                instances = 1 if len(g) else 0
            elif mod in shapes:
                (fin, fout), m_rows = shapes[mod], (n if ph == "prefill" else 1)
                g = k[k.module.str.fullmatch(rf"layers\.\d+\.{re.escape(mod)}")]
                instances = int(g.layer.nunique())
            else:
                continue
            ns = int(g.dur_ns.sum())
            flops = instances * 2 * m_rows * fin * fout
            nbytes = instances * p * (fin * fout + m_rows * (fin + fout))
            names = g.groupby("short_name").dur_ns.sum().sort_values(ascending=False)
            rows.append(
                {
                    "phase": ph,
                    "module": mod,
                    "rows": m_rows,
                    "in": fin,
                    "out": fout,
                    "instances": instances,
                    "kernels": len(g),
                    "kernel": names.index[0] if len(names) else "",
                    "split_k": bool(g.short_name.str.contains("splitK", case=False).any()),
                    "dur_ns": ns,
                    "flops": flops,
                    "bytes": nbytes,
                    "flop_per_byte": flops / nbytes if nbytes else float("nan"),
                    "tflops": flops / ns / 1e3 if ns else float("nan"),
                    "tbs": nbytes / ns / 1e3 if ns else float("nan"),
                }
            )
    out = pd.DataFrame(rows)
    out["roof_datasheet"] = attainable(out.flop_per_byte, lim.datasheet_tflops, lim.datasheet_tbs)
    out["roof_measured"] = attainable(out.flop_per_byte, lim.gemm_tflops, bandwidth(lim).tbs)
    out["of_datasheet_roof"] = out.tflops / out.roof_datasheet
    out["of_measured_roof"] = out.tflops / out.roof_measured
    return out


def pass_points(run: runs.Run) -> pd.DataFrame:
    """Each whole pass as one point of the roofline: model FLOPs over FLOP per byte (phases()),
    at the rate reached on GPU-busy time (every kernel, not only the matrix multiplies)."""
    lim = limits(run)
    out = pd.DataFrame(
        [{"phase": ph, "flop_per_byte": x.flop_per_byte, "tflops": x.tflops_busy} for ph, x in phases(run).items()]
    )
    out["roof_datasheet"] = attainable(out.flop_per_byte, lim.datasheet_tflops, lim.datasheet_tbs)
    out["roof_measured"] = attainable(out.flop_per_byte, lim.gemm_tflops, bandwidth(lim).tbs)
    return out


@dataclass
class RooflineCluster:
    """The points of one phase's matrix multiplies on the roofline, summarised for the prose
    (the prefill's LM head, one row like decode's, is left out of the prefill's cluster)."""

    phase: str
    points: int
    fpb_min: float
    fpb_max: float
    tflops_min: float
    tflops_max: float
    tbs_min: float
    tbs_max: float
    of_datasheet_min: float
    of_datasheet_max: float
    of_measured_min: float
    of_measured_max: float
    matmul_share: float  # share of the phase's matrix-multiply kernel time in its points (all)
    bound: str  # "memory" or "compute": every point below / above the datasheet ridge
    slowest: str  # the matrix furthest below its roof (datasheet)
    fastest: str
    others: str  # modules of the phase's other matrix-multiply kernels ("" if none)


def roofline_clusters(run: runs.Run) -> dict[str, RooflineCluster]:
    pts, lim = gemm_points(run), limits(run)
    ridge = lim.datasheet_ridge or measured_ridge(lim)
    out = {}
    for ph in PHASES:
        allp = pts[pts.phase == ph]
        x = allp[~((allp.module == LM_HEAD) & (allp.rows < allp.rows.max()))]
        mm = kernel_table(run, ph)
        mm = mm[mm.kind == MATMUL]
        mm_ns = mm.dur_ns.sum()
        covered = mm.module.str.fullmatch(rf"layers\.\d+\.({'|'.join(map(re.escape, GEMM_MODULES))})") | (
            mm.module == LM_HEAD
        )
        rest = mm[~covered]
        key = "of_datasheet_roof" if x.of_datasheet_roof.notna().any() else "of_measured_roof"
        below = bool(ridge) and (x.flop_per_byte < ridge).all()
        above = bool(ridge) and (x.flop_per_byte > ridge).all()
        out[ph] = RooflineCluster(
            phase=ph,
            points=len(x),
            fpb_min=x.flop_per_byte.min(),
            fpb_max=x.flop_per_byte.max(),
            tflops_min=x.tflops.min(),
            tflops_max=x.tflops.max(),
            tbs_min=x.tbs.min(),
            tbs_max=x.tbs.max(),
            of_datasheet_min=x.of_datasheet_roof.min(),
            of_datasheet_max=x.of_datasheet_roof.max(),
            of_measured_min=x.of_measured_roof.min(),
            of_measured_max=x.of_measured_roof.max(),
            matmul_share=allp.dur_ns.sum() / mm_ns if mm_ns else float("nan"),
            bound="memory" if below else "compute" if above else "mixed",
            slowest=SHORT[x.loc[x[key].idxmin(), "module"]] if x[key].notna().any() else "",
            fastest=SHORT[x.loc[x[key].idxmax(), "module"]] if x[key].notna().any() else "",
            others="; ".join(
                f"`{m or 'no module'}` ({len(g)} kernel{'s' if len(g) > 1 else ''}, {g.dur_ns.sum() / 1e3:,.1f} µs)"
                for m, g in rest.groupby("module", sort=False)
            ),
        )
    return out


def roofline_table(run: runs.Run) -> pd.DataFrame:
    """gemm_points() laid out for reading: one row per matrix, the phases side by side: rows
    (the prefill's; decode's are 1), FLOP per byte, the rate that matters for the phase
    (TFLOP/s in the prefill, TB/s in decode, where one FLOP per byte makes the two the same
    number) and its share of the datasheet's roof at that intensity. Indexed by module (SHORT
    names them for display)."""
    pts = gemm_points(run)
    out = {}
    for ph in PHASES:
        x = pts[pts.phase == ph].set_index("module")
        if ph == "prefill":
            out[(ph, "rows")] = x["rows"]
        out[(ph, "FLOP/byte")] = x["flop_per_byte"]
        if ph == "prefill":
            out[(ph, "TFLOP/s")] = x["tflops"]
        else:
            out[(ph, "TB/s")] = x["tbs"]
        out[(ph, "of roof")] = x["of_datasheet_roof"]
    return side_by_side(out, pts, "module")


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

    dtype = (run.parameters or {}).get("dtype", "bfloat16")  # runs before the parameter: BF16
    out = [ridge(s.name, "datasheet", "datasheet", s is own, s.tensor_tflops(dtype), s.bandwidth_tbs) for s in sheets]
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


def ceilings_row(run: runs.Run) -> pd.Series | None:
    """The measured ceilings the run is set against (ceilings.csv of analysis.ceilings_run: the
    shared ceilings run on the same GPU, else the run's own), or None where there are none."""
    from .analysis import ceilings_run

    src = ceilings_run(run)
    return src.table("ceilings").squeeze(axis=0) if "ceilings.csv" in src.meta["files"] else None


def achieved_rates(run: runs.Run) -> pd.DataFrame:
    """Every rate the chapter shows, next to the ceilings it is compared with: one row per
    figure (the fastest, where a table shows several), `value` in `unit` (TFLOP/s or TB/s),
    `measured` (the measured GEMM rate, or bandwidth()) and `datasheet`, and whether the
    value is above each (False where the ceiling is unknown)."""
    lim = limits(run)
    bw = bandwidth(lim).tbs
    layer = int(run.results["gemm_layer"])
    g, s, roof = layer_gemms(run), prompt_sweep(run), gemm_points(run)
    rows = []

    def add(figure: str, unit: str, value: float) -> None:
        measured, sheet = (lim.gemm_tflops, lim.datasheet_tflops) if unit == "TFLOP/s" else (bw, lim.datasheet_tbs)
        rows.append(
            {
                "figure": figure,
                "unit": unit,
                "value": float(value),
                "measured": measured,
                "datasheet": sheet,
                "above measured": bool(measured) and value > measured,
                "above datasheet": bool(sheet) and value > sheet,
            }
        )

    for ph, x in phases(run).items():
        add(f"the whole {ph} on GPU-busy time", "TFLOP/s", x.tflops_busy)
        add(f"the whole {ph} on GPU-busy time", "TB/s", x.tbs_busy)
        add(f"the matrix multiplies of the {ph}", "TFLOP/s", x.matmul_tflops)
        gp = g[(g.phase == ph) & g.dur_ns.gt(0)]
        for unit, col in (("TFLOP/s", "tflops"), ("TB/s", "tbs")):
            if len(gp):
                best = gp.loc[gp[col].idxmax()]
                add(f"the {best.module} matrix multiply of layer {layer} in {ph}", unit, best[col])
        pts = roof[(roof.phase == ph) & roof.dur_ns.gt(0)]
        for unit, col in (("TFLOP/s", "tflops"), ("TB/s", "tbs")):
            if len(pts):
                best = pts.loc[pts[col].idxmax()]
                what = (
                    "the LM head's matrix multiply"
                    if best.module == LM_HEAD
                    else f"the {best.module} matrix multiplies of every layer"
                )
                add(f"{what} in {ph}", unit, best[col])
    if len(s):
        best = s.loc[s["matmul TFLOP/s"].idxmax()]
        add(f"the matrix multiplies of the {int(best.prompt_len):,}-token prefill", "TFLOP/s", best["matmul TFLOP/s"])
    return pd.DataFrame(rows)


def ceiling_notes(run: runs.Run) -> dict[str, str]:
    """For each measured ceiling (`gemm`, `bandwidth`), the sentence the chapter shows: why a
    figure above it can be there, or that none is."""
    lim, bw = limits(run), bandwidth(limits(run))
    a, ceil = achieved_rates(run), ceilings_row(run)
    notes = {}
    t = a[a.unit == "TFLOP/s"]
    top = t.loc[t.value.idxmax()]
    if not lim.gemm_tflops or ceil is None:
        notes["gemm"] = "This run measured no GEMM rate."
    elif top["above measured"]:
        n = int(ceil["gemm_n"])
        notes["gemm"] = (
            f"Some matrix multiplies here ran faster than the measured GEMM rate: {top.figure} reached "
            f"{top.value:.0f} TFLOP/s, against {lim.gemm_tflops:.0f}. That rate is one shape, the product of two "
            f"{n:,} × {n:,} matrices of random numbers timed on this GPU: a reference point, not a limit of the "
            "hardware. The "
            "library picks a kernel for each shape, and some shapes run a little faster."
        )
        if lim.datasheet_tflops:
            notes["gemm"] += datasheet_note(
                f"{lim.datasheet_tflops:.0f} TFLOP/s",
                f"{top.value:.0f} TFLOP/s",
                top["above datasheet"],
                ", which none of them reaches.",
            )
    else:
        notes["gemm"] = (
            f"No matrix multiply here ran faster than the measured GEMM rate ({lim.gemm_tflops:.0f} TFLOP/s)."
        )
    b = a[a.unit == "TB/s"]
    top = b.loc[b.value.idxmax()]
    if not bw.tbs:
        notes["bandwidth"] = "This run measured no bandwidth."
    elif top["above measured"]:
        why = (
            f"The practical ceiling is the best read rate measured in the run of *Why a GPU* ({lim.ceiling_by}), "
            "not a limit of the hardware."
        )
        notes["bandwidth"] = (
            f"{top.figure[0].upper()}{top.figure[1:]} moved {top.value:.2f} TB/s, more than the "
            f"{bw.name}, {bw.tbs:.2f} TB/s. {why}"
        )
        if lim.datasheet_tbs:
            notes["bandwidth"] += datasheet_note(
                f"{lim.datasheet_tbs:.2f} TB/s", f"{top.value:.2f} TB/s", top["above datasheet"], "."
            )
    else:
        notes["bandwidth"] = f"No figure here is above the {bw.name}, {bw.tbs:.2f} TB/s."
    return notes


def datasheet_note(limit: str, top: str, above: bool, below: str) -> str:
    """The sentence that closes a note on the figures above a measured ceiling: the datasheet's
    `limit`, then `below` where the top figure stays under it, else that `top` is above even that."""
    return f" The hardware's limit is the datasheet's {limit}" + (
        f", and {top} is above even that: a measurement to distrust." if above else below
    )


def headline(run: runs.Run) -> dict:
    """Wall times (which, in eager mode, move with the host CPU) and the GPU-side numbers
    (which hold steady from run to run)."""
    p = phases(run)
    return {
        "prefill ms": p["prefill"].wall_ms,
        "decode ms": p["decode"].wall_ms,
        "prefill GPU ms": p["prefill"].gpu_busy_ms,
        "decode GPU ms": p["decode"].gpu_busy_ms,
        "prefill TFLOP/s (GPU busy)": p["prefill"].tflops_busy,
        "crossover tokens": crossover(run).measured_tokens,
    }
