"""The chapter's figures besides the roofline: MFU and MBU, kernels by kind, the matrix
multiplies of one layer, and the prefill against prompt length."""

from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd

from labsupport.figures import OURS, PHASE_COLORS, THEIRS, finish, plain_ticks
from labsupport.traces.kernels import KINDS

from .phases import TIME_LABELS


def utilisation_bars(df: pd.DataFrame, label: str):
    """MFU and MBU of prefill and decode (wall time and GPU busy), against the datasheet and
    the measured ceilings. `df` is prefill_vs_decode.utilisation(), whose last MBU column names
    the measured bandwidth ("MBU vs measured read", or copy in older runs)."""
    mbu_measured = next(c for c in df.columns if c.startswith("MBU vs measured"))
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6), sharey=True)
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
        ax.legend(fontsize=10, frameon=False, loc="lower right")
    axes[0].set_yticks(y, names)
    axes[0].invert_yaxis()
    for t in axes[0].get_yticklabels():
        t.set_color(PHASE_COLORS.get(t.get_text().split(",")[0], "#333"))
    finish(fig, label)
    return fig


def phase_census_bars(census: pd.DataFrame, label: str):
    """Kernels and GPU time by kind, prefill beside decode. `census` is prefill_vs_decode.census()."""
    kinds = [k for k in KINDS if k in census.index]
    c = census.reindex(kinds)
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.8))
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
    axes[0].legend(fontsize=10, frameon=False, loc="lower right")
    finish(fig, label)
    return fig


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
    fig, axes = plt.subplots(1, 2, figsize=(9, 0.42 * len(mods) + 2.4), sharey=True)
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
        ax.legend(fontsize=10, frameon=False, ncol=2, loc="upper center", bbox_to_anchor=(0.5, -0.12))
    axes[0].set_yticks(y, mods)
    axes[0].invert_yaxis()
    fig.suptitle(f"The same weight matrices in prefill and in decode{title_layer}", fontsize=11, fontweight="bold")
    finish(fig, label)
    return fig


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
    fig, ax = plt.subplots(1, 2, figsize=(9, 7))
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
    finish(fig, label)
    return fig
