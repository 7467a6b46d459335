"""The chapter's figures: the roofline (every matrix multiply of both passes, and each whole pass, under the
datasheet's roof and the roof of the ceilings measured in the run), MFU and MBU, kernels by kind, the matrix multiplies
of one layer, and the prefill against prompt length.
"""

from __future__ import annotations

import math

import matplotlib.pyplot as plt
import pandas as pd

from labsupport import runs
from labsupport.figures import OURS, PHASE_COLORS, THEIRS, WIDTH, finish, plain_ticks
from labsupport.traces.kernels import KINDS

from .analysis import TIME_LABELS, bandwidth, limits
from .ceilings import attainable, gemm_points, pass_points, roofline_clusters
from .measuring import PHASES, SHORT


def utilisation_bars(df: pd.DataFrame, label: str):
    """MFU and MBU of prefill and decode (wall time and GPU busy), against the datasheet and
    the measured ceilings. `df` is prefill_vs_decode.utilisation(), whose last MBU column names
    the measured bandwidth ("MBU vs practical ceiling")."""
    mbu_measured = next(c for c in df.columns if c.startswith("MBU vs") and c != "MBU vs datasheet")
    fig, axes = plt.subplots(1, 2, figsize=(WIDTH, 0.5 * len(df) + 2.6), sharey=True)
    names = [f"{r.phase}, {TIME_LABELS[r.time]}" for r in df.itertuples()]
    y = list(range(len(df)))
    h = 0.38
    for ax, (sheet_col, meas_col, title) in zip(
        axes,
        (
            ("MFU vs datasheet", "MFU vs measured GEMM", "Share of peak math (MFU)"),
            ("MBU vs datasheet", mbu_measured, "Share of peak memory bandwidth (MBU)"),
        ),
        strict=True,
    ):
        for off, col, color, name in (
            (-h / 2, meas_col, OURS, meas_col.split(" vs ")[1]),
            (h / 2, sheet_col, THEIRS, "datasheet"),
        ):
            vals = (df[col] * 100).tolist()
            ax.barh([i + off for i in y], [0 if v != v else v for v in vals], h, color=color, label=f"against {name}")
            for i, v in enumerate(vals):
                if v == v:
                    ax.text(v, i + off, f" {v:.1f}%" if v >= 0.1 else f" {v:.2f}%", va="center", fontsize=10)
        ax.set_xlim(0, 115)
        ax.set_xlabel("% of the peak")
        ax.set_title(title)
        ax.grid(axis="y", visible=False)
        ax.legend(fontsize=10, frameon=False, loc="upper left", bbox_to_anchor=(0, -0.3))
    axes[0].set_yticks(y, names)
    axes[0].invert_yaxis()
    for t in axes[0].get_yticklabels():
        t.set_color(PHASE_COLORS.get(t.get_text().split(",")[0], "#333"))
    mfu = df.set_index(pd.Index(names))["MFU vs datasheet"] * 100
    takeaway = (
        "Share of the datasheet's peak math: " + ", ".join(f"{n} {v:.1f}%" for n, v in mfu.items() if v == v) + "."
    )
    return finish(fig, label, takeaway)


def phase_census_bars(census: pd.DataFrame, label: str):
    """Kernels and GPU time by kind, prefill beside decode. `census` is prefill_vs_decode.census()."""
    kinds = [k for k in KINDS if k in census.index]
    c = census.reindex(kinds)
    fig, axes = plt.subplots(1, 2, figsize=(WIDTH, 0.42 * len(kinds) + 2.2))
    y = list(range(len(kinds)))
    h = 0.38
    for ax, col, title in ((axes[0], "kernels", "Kernels"), (axes[1], "GPU ms", "GPU time (ms)")):
        for off, ph in ((-h / 2, "prefill"), (h / 2, "decode")):
            vals = c[(ph, col)].tolist()
            ax.barh([i + off for i in y], vals, h, color=PHASE_COLORS[ph], label=ph)
            for i, v in enumerate(vals):
                ax.text(v, i + off, f" {v:,.0f}" if col == "kernels" else f" {v:.2f}", va="center", fontsize=10)
        ax.set_yticks(y, kinds)
        ax.invert_yaxis()
        ax.set_title(title)
        ax.grid(axis="y", visible=False)
        ax.set_xlim(0, max(c[("prefill", col)].max(), c[("decode", col)].max()) * 1.25)
    axes[1].set_yticklabels([])
    axes[1].legend(fontsize=10, frameon=False, loc="lower right")  # beside the short bars of the last kinds
    takeaway = (
        f"Prefill: {c[('prefill', 'kernels')].sum():,.0f} kernels, {c[('prefill', 'GPU ms')].sum():.2f} ms; "
        f"decode: {c[('decode', 'kernels')].sum():,.0f} kernels, {c[('decode', 'GPU ms')].sum():.2f} ms."
    )
    return finish(fig, label, takeaway)


def length_ticks(ax, lengths) -> None:
    """Prompt lengths as the x ticks (1k, 2k, ... for whole thousands of 1024), each at least 4
    times the one before, so that they do not overlap on a narrow figure."""
    ticks = []
    for n in sorted(lengths):
        if not ticks or n >= 4 * ticks[-1]:
            ticks.append(n)
    ax.set_xticks(ticks, [f"{n // 1024}k" if n >= 1024 and n % 1024 == 0 else str(n) for n in ticks])
    ax.minorticks_off()


def gemm_rates(
    g: pd.DataFrame,
    label: str,
    datasheet_tflops=None,
    gemm_tflops=None,
    datasheet_tbs=None,
    measured_tbs=None,
    title_layer: str = "",
    bandwidth_label: str = "measured copy",
):
    """The matrix multiplies of one decoder layer: TFLOP/s (log scale) and TB/s reached in
    prefill and in decode, against the peaks (`measured_tbs`, called `bandwidth_label`: the
    measured read stream, or the copy in older runs). `g` is prefill_vs_decode.layer_gemms()."""
    mods = list(dict.fromkeys(g.module))
    y = list(range(len(mods)))
    h = 0.38
    fig, axes = plt.subplots(2, 1, figsize=(WIDTH, 2 * (0.42 * len(mods) + 2.2)))  # stacked: legible on a phone
    for ax, col, title, unit, peaks in (
        (
            axes[0],
            "tflops",
            "Math reached (TFLOP/s, log scale)",
            "TFLOP/s",
            ((gemm_tflops, "measured GEMM", OURS), (datasheet_tflops, "datasheet", "#888")),
        ),
        (
            axes[1],
            "tbs",
            "Memory bandwidth reached (TB/s)",
            "TB/s",
            ((measured_tbs, bandwidth_label, OURS), (datasheet_tbs, "datasheet", "#888")),
        ),
    ):
        for off, ph in ((-h / 2, "prefill"), (h / 2, "decode")):
            x = g[g.phase == ph].set_index("module").reindex(mods)[col]
            ax.barh([i + off for i in y], x.fillna(0), h, color=PHASE_COLORS[ph], label=ph)
            for i, v in enumerate(x):
                if v == v:
                    ax.text(v, i + off, f" {v:.0f}" if v >= 10 else f" {v:.1f}", va="center", fontsize=10)
        for value, text, color in peaks:
            if value:
                ax.axvline(
                    value,
                    color=color,
                    lw=1,
                    ls="--",
                    label=f"{text}: {value:.0f} {unit}" if value >= 10 else f"{text}: {value:.2f} {unit}",
                )
        if col == "tflops":
            ax.set_xscale("log")
            plain_ticks(ax, "x")
            ax.set_xlim(max(g[col].min(), 1e-12) / 2, max(g[col].max(), datasheet_tflops or 0) * 4)
        else:
            ax.set_xlim(0, max(g[col].max(), datasheet_tbs or 0, measured_tbs or 0) * 1.2)
        ax.set_title(title)
        ax.grid(axis="y", visible=False)
        ax.legend(fontsize=10, frameon=False, ncol=2, loc="upper center", bbox_to_anchor=(0.5, -0.18))
        ax.set_yticks(y, mods)
        ax.invert_yaxis()
    fig.suptitle(f"The same weight matrices in prefill and in decode{title_layer}", fontsize=11, fontweight="bold")
    rates = g.groupby("phase").tflops.max()
    takeaway = "Fastest matrix multiply: " + ", ".join(f"{ph} {v:,.1f} TFLOP/s" for ph, v in rates.items()) + "."
    return finish(fig, label, takeaway)


def prompt_sweep_figure(
    sweep: pd.DataFrame,
    roof: pd.DataFrame,
    label: str,
    datasheet_tflops=None,
    gemm_tflops=None,
    crossover_tokens=None,
    datasheet_ridge_tokens=None,
    measured_ridge_tokens=None,
):
    """Prefill against prompt length: time per token (left) and the FLOP/s the matrix
    multiplies reached, under the roofline (right). `sweep` is prefill_vs_decode.prompt_sweep(),
    `roof` prefill_vs_decode.roofline()."""
    fig, ax = plt.subplots(2, 1, figsize=(WIDTH, 10))  # stacked: legible on a phone
    n = sweep.prompt_len
    a = ax[0]
    a.plot(n, sweep["ms per token"] * 1e3, "o-", color=PHASE_COLORS["prefill"], label="prefill, wall time")
    a.plot(n, sweep["GPU ms per token"] * 1e3, "s--", color="#777", ms=4, label="prefill, GPU busy")
    a.plot(n, sweep["matmul ms per token"] * 1e3, "^:", color=OURS, ms=4, label="its matrix multiplies (GPU)")
    a.set_yscale("log")
    plain_ticks(a, "y")
    a.set_ylabel("µs per prompt token")
    a.set_title("Time per token falls, then levels off")
    b = ax[1]
    if roof["datasheet TFLOP/s"].notna().any():
        b.plot(roof.prompt_len, roof["datasheet TFLOP/s"], color="#999", lw=1.2, label="roofline, datasheet")
    if roof["measured TFLOP/s"].notna().any():
        b.plot(
            roof.prompt_len,
            roof["measured TFLOP/s"],
            color=OURS,
            lw=1.2,
            alpha=0.6,
            label="roofline, measured ceilings",
        )
    b.plot(n, sweep["matmul TFLOP/s"], "o-", color=PHASE_COLORS["prefill"], label="matrix multiplies reached (GPU)")
    b.plot(n, sweep["TFLOP/s"], "s--", color="#777", ms=4, label="whole prefill, on wall time")
    b.set_yscale("log")
    plain_ticks(b, "y")
    b.set_ylabel("TFLOP/s")
    b.set_title("Where the matrix multiplies hit the math limit")
    lo = max(min(sweep["TFLOP/s"].min(), sweep["matmul TFLOP/s"].min()) / 3, 1e-12)
    b.set_ylim(lo, max(datasheet_tflops or 0, gemm_tflops or 0, sweep["matmul TFLOP/s"].max()) * 3)
    for value, text, color in ((datasheet_tflops, "datasheet peak", "#999"), (gemm_tflops, "measured GEMM", OURS)):
        if value:
            b.axhline(value, color=color, lw=0.8, ls=":", label=f"{text}: {value:.0f} TFLOP/s")
    for value, text, color, ls in (
        (datasheet_ridge_tokens, "ridge, datasheet", "#999", "--"),
        (measured_ridge_tokens, "ridge, measured ceilings", OURS, "--"),
        (crossover_tokens, "crossover in this sweep", PHASE_COLORS["decode"], "-"),
    ):
        if value:
            for axis in ax:
                axis.axvline(
                    value, color=color, lw=0.9, ls=ls, label=f"{text}: {value:.0f} tokens" if axis is b else None
                )
    for axis in ax:
        axis.set_xscale("log", base=2)
        length_ticks(axis, n)
        axis.set_xlabel("tokens in the prompt")
        axis.legend(fontsize=10, frameon=False, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=1)
    first, last = sweep.iloc[0], sweep.iloc[-1]
    takeaway = (
        f"From {first.prompt_len:,} to {last.prompt_len:,} prompt tokens the time per token falls from "
        f"{first['ms per token'] * 1e3:,.1f} to {last['ms per token'] * 1e3:,.1f} µs."
    )
    return finish(fig, label, takeaway)


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
    fig, ax = plt.subplots(figsize=(WIDTH, 7.4))
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
    takeaway = "; ".join(
        f"{ph}: {clusters[ph].fpb_min:,.1f} to {clusters[ph].fpb_max:,.1f} FLOP/byte, {clusters[ph].bound}-bound"
        for ph in PHASES
        if clusters[ph].points
    )
    return finish(fig, run.label, takeaway + ".")


def layer_gemm_figure(run: runs.Run):
    """gemm_rates() of the run's compared decoder layer, against the run's limits."""
    from .analysis import layer_gemms

    lim = limits(run)
    measured = bandwidth(lim)
    return gemm_rates(
        layer_gemms(run),
        run.label,
        lim.datasheet_tflops,
        lim.gemm_tflops,
        lim.datasheet_tbs,
        measured.tbs,
        f", decoder layer {int(run.results['gemm_layer'])}",
        bandwidth_label=measured.short,
    )


def sweep_figure(run: runs.Run):
    """prompt_sweep_figure() of the run: its sweep under its roofline, with its crossover and ridges."""
    from .analysis import crossover, prompt_sweep, roofline

    lim, cross = limits(run), crossover(run)
    return prompt_sweep_figure(
        prompt_sweep(run),
        roofline(run),
        run.label,
        lim.datasheet_tflops,
        lim.gemm_tflops,
        cross.measured_tokens,
        cross.datasheet_tokens,
        cross.measured_ridge_tokens,
    )
