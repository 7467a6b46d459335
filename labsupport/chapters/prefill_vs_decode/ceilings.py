"""Every rate the chapter shows set against the ceilings, the sentences that explain a rate
above a measured ceiling, and the headline numbers the status page follows."""

from __future__ import annotations

import pandas as pd

from labsupport import runs

from .names import LM_HEAD
from .phases import phases
from .roofline import gemm_points
from .sweep import crossover, layer_gemms, prompt_sweep
from .tables import bandwidth, limits


def ceilings_row(run: runs.Run) -> pd.Series | None:
    """The measured ceilings the run is set against (ceilings.csv of tables.ceilings_run: the
    shared ceilings run on the same GPU, else the run's own), or None where there are none."""
    from .tables import ceilings_run

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
            notes["gemm"] += f" The hardware's limit is the datasheet's {lim.datasheet_tflops:.0f} TFLOP/s, " + (
                "which none of them reaches."
                if not top["above datasheet"]
                else f"and {top.value:.0f} TFLOP/s is above even that: a measurement to distrust."
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
        if lim.read_tbs:
            why = (
                f"The read stream is one measurement, {ceil['read_by']} over "
                f"{int(ceil['read_bytes']) / 2**30:.0f} GiB timed on this GPU, not a limit of the hardware."
            )
        else:
            why = (
                "A copy's rate counts the bytes it reads plus those it writes, over one memory bus; a kernel "
                "that only reads its weights can go faster. This run measured no read stream, the ceiling "
                "that applies to reading weights."
            )
        notes["bandwidth"] = (
            f"{top.figure[0].upper()}{top.figure[1:]} moved {top.value:.2f} TB/s, more than the "
            f"{bw.name}, {bw.tbs:.2f} TB/s. {why}"
        )
        if lim.datasheet_tbs:
            notes["bandwidth"] += f" The hardware's limit is the datasheet's {lim.datasheet_tbs:.2f} TB/s" + (
                "."
                if not top["above datasheet"]
                else f", and {top.value:.2f} TB/s is above even that: a measurement to distrust."
            )
    else:
        notes["bandwidth"] = f"No figure here is above the {bw.name}, {bw.tbs:.2f} TB/s."
    return notes


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
