"""The roofline figure: every matrix multiply of both passes, and each whole pass, under the
datasheet's roof and the roof of the ceilings measured in the run."""

from __future__ import annotations

import math

from labsupport import runs
from labsupport.figures import OURS, PHASE_COLORS, finish, plain_ticks

from .names import PHASES, SHORT
from .roofline import attainable, gemm_points, pass_points, roofline_clusters
from .tables import bandwidth, limits


def spread(ys: list[float], ratio: float) -> list[float]:
    """Label heights (log scale) near `ys`, at least `ratio` apart, in the same order."""
    m = math
    logs = [m.log(y) for y in ys]
    gap = m.log(ratio)
    order = sorted(range(len(ys)), key=lambda i: logs[i])
    out = [logs[i] for i in order]
    for _ in range(50):
        moved = False
        for j in range(1, len(out)):
            if out[j] - out[j - 1] < gap - 1e-9:
                push = (gap - (out[j] - out[j - 1])) / 2
                out[j - 1] -= push
                out[j] += push
                moved = True
        if not moved:
            break
    res = [0.0] * len(ys)
    for k, i in enumerate(order):
        res[i] = m.exp(out[k])
    return res


def roofline_figure(run: runs.Run):
    """The roofline: FLOP per byte (log) against TFLOP/s reached (log), every matrix multiply
    of both passes as a point (gemm_points()), each whole pass as a hollow point
    (pass_points()), under the datasheet's roof and the roof of the ceilings measured in the
    run, each labelled with its numbers."""
    import matplotlib.pyplot as plt
    import numpy as np

    pts, whole, lim = gemm_points(run), pass_points(run), limits(run)
    bw = bandwidth(lim)
    n = int(run.parameters["prompt_len"])
    fig, ax = plt.subplots(figsize=(9, 6.4))
    ok = pts[pts.tflops.notna() & (pts.tflops > 0)]
    lo_x = min(ok.flop_per_byte.min(), whole.flop_per_byte.min()) / 4
    hi_x = max(ok.flop_per_byte.max(), whole.flop_per_byte.max(), lim.datasheet_ridge or 0) * 8
    x = np.geomspace(lo_x, hi_x, 400)
    sheet = f"datasheet ({lim.datasheet_name})" if lim.datasheet_name else "datasheet"
    sheet_text = f"{sheet}: {lim.datasheet_tflops or 0:.0f} TFLOP/s, {lim.datasheet_tbs or 0:.2f} TB/s"
    measured_text = (
        f"measured on this GPU: GEMM {lim.gemm_tflops or 0:.0f} TFLOP/s, {bw.short} {bw.tbs or 0:.2f} TB/s"
        + ("" if lim.read_tbs else " (bytes read + written; this run measured no read stream)")
    )
    for tflops, tbs, color, ls, text in (
        (lim.datasheet_tflops, lim.datasheet_tbs, "#888", "-", sheet_text),
        (lim.gemm_tflops, bw.tbs, OURS, "--", measured_text),
    ):
        if tflops and tbs:
            ax.plot(
                x,
                attainable(x, tflops, tbs),
                color=color,
                ls=ls,
                lw=1.4,
                label=f"roof, {text}; ridge {tflops / tbs:.0f} FLOP/byte",
            )
            ax.plot([tflops / tbs], [tflops], marker="o", ms=4, color=color)
    # Points: prefill squares under decode circles (the LM head runs for one row in both).
    for ph, marker, size in (("prefill", "s", 64), ("decode", "o", 30)):
        p = ok[ok.phase == ph]
        rows = f"{n:,} rows, 1 for the LM head" if ph == "prefill" else "1 row"
        ax.scatter(
            p.flop_per_byte,
            p.tflops,
            s=size,
            marker=marker,
            color=PHASE_COLORS[ph],
            zorder=3,
            label=f"{ph}: one weight matrix, its kernels summed over the layers ({rows})",
        )
    for r in whole.itertuples():
        ax.scatter(
            [r.flop_per_byte],
            [r.tflops],
            s=80,
            marker="D",
            facecolors="none",
            edgecolors=PHASE_COLORS[r.phase],
            linewidths=1.3,
            zorder=3,
            label=f"whole {r.phase} pass: model FLOPs over GPU-busy time",
        )
    # Labels, one per shape, in a column beside each cluster (one row: decode's; more: prefill's).
    for one_row, color, fx_of in (
        (True, PHASE_COLORS["decode"], lambda f: f * 2.2),
        (False, PHASE_COLORS["prefill"], lambda f: f * 2.0),
    ):
        p = ok[(ok.rows == 1) == one_row]
        if p.empty:
            continue
        groups = []
        for (_, _, _), g in p.groupby(["rows", "in", "out"], sort=False):
            names = list(dict.fromkeys(g.module.map(SHORT)))
            text = ", ".join(names)
            if one_row and set(g.phase) == set(PHASES):
                text += " (both passes)"
            groups.append((text, float(np.exp(np.log(g.flop_per_byte).mean())), float(np.exp(np.log(g.tflops).mean()))))
        ys = spread([g[2] for g in groups], 1.4)
        roof = min(v for v in (lim.gemm_tflops, lim.datasheet_tflops, float("inf")) if v)
        if not one_row and max(ys) > 0.8 * roof:  # keep the labels under the roof lines
            ys = [y * 0.8 * roof / max(ys) for y in ys]
        lx = fx_of(max(g[1] for g in groups))
        for (text, fx, fy), ly in zip(groups, ys, strict=True):
            ax.annotate(
                text,
                (fx, fy),
                xytext=(lx, ly),
                textcoords="data",
                fontsize=10,
                va="center",
                color=color,
                arrowprops={"arrowstyle": "-", "color": color, "lw": 0.5, "alpha": 0.6},
            )
    clusters = roofline_clusters(run)
    for ph in PHASES:
        c = clusters[ph]
        if not c.points or c.tflops_max != c.tflops_max:
            continue
        where = {"memory": "on the bandwidth slope", "compute": "under the math roof"}.get(c.bound, "")
        fpb = f"{c.fpb_min:,.0f}–{c.fpb_max:,.0f}" if c.fpb_max - c.fpb_min >= 1 else f"{c.fpb_max:.1f}"
        title = f"{ph.upper()} ({n:,} tokens)" if ph == "prefill" else f"{ph.upper()} (1 token)"
        if ph == "decode":
            xy, ha = (c.fpb_max * 0.8, c.tflops_min / 1.8), "left"
        else:
            xy, ha = ((c.fpb_min * c.fpb_max) ** 0.5, c.tflops_min / 3.5), "center"
        ax.text(
            *xy,
            f"{title}\n{fpb} FLOP/byte" + (f", {where}" if where else ""),
            ha=ha,
            va="top",
            fontsize=10,
            fontweight="bold",
            color=PHASE_COLORS[ph],
        )
    ax.set_xscale("log")
    ax.set_yscale("log")
    plain_ticks(ax, "x")
    plain_ticks(ax, "y")
    ax.set_xlim(lo_x, hi_x)
    top = max(lim.datasheet_tflops or 0, lim.gemm_tflops or 0, ok.tflops.max())
    ax.set_ylim(min(ok.tflops.min(), whole.tflops.min()) / 8, top * 3)
    ax.set_xlabel("arithmetic intensity (FLOP per byte moved, log scale)")
    ax.set_ylabel("rate reached (TFLOP/s on kernel time, log scale)")
    ax.set_title("Roofline: every matrix multiply of the prefill and of the decode step")
    ax.legend(fontsize=10, frameon=False, loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=1)
    finish(fig, run.label)
    return fig
