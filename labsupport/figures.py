"""Figures in one style, each with a one-line provenance footer (GPU, run id, date)."""

from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd

from labsupport.traces.kernels import KINDS

KIND_COLORS = {
    "matrix multiply": "#3b6ea8",
    "elementwise": "#e0913a",
    "copy/convert/concat": "#5aa469",
    "reduction": "#b94a48",
    "attention": "#8361a8",
    "convolution": "#2a9d8f",
    "other": "#8c8c8c",
}
OURS, THEIRS = "#3b6ea8", "#bdbdbd"

plt.rcParams.update(
    {
        "figure.dpi": 110,
        "savefig.dpi": 110,
        "font.size": 10,
        "axes.spines.top": False,
        "axes.spines.right": False,
        "axes.grid": True,
        "grid.alpha": 0.25,
        "axes.titleweight": "bold",
        "axes.titlesize": 11,
    }
)


def footer(fig, label: str) -> None:
    """Stamp the run's provenance under the figure."""
    fig.text(0.01, 0.005, f"Measured: {label}", fontsize=8.5, color="#444", ha="left", va="bottom")


def finish(fig, label: str):
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    footer(fig, label)
    return fig


def timeline(kernels: pd.DataFrame, label: str, title: str):
    """Kernels of a slice of the step as bars on a time axis: CPU launch calls above, GPU
    kernels below, coloured by kind. The white space between GPU bars is the GPU waiting."""
    t0 = min(
        kernels.start_ns.min(),
        kernels.launch_ns[kernels.launch_ns > 0].min() if (kernels.launch_ns > 0).any() else kernels.start_ns.min(),
    )
    fig, ax = plt.subplots(figsize=(11, 2.9))
    for r in kernels.itertuples():
        ax.broken_barh(
            [((r.start_ns - t0) / 1e3, r.dur_ns / 1e3)], (0, 0.8), color=KIND_COLORS.get(r.kind, KIND_COLORS["other"])
        )
        if r.launch_dur_ns > 0:
            ax.broken_barh([((r.launch_ns - t0) / 1e3, r.launch_dur_ns / 1e3)], (1.2, 0.8), color="#444")
    ax.set_yticks([0.4, 1.6], ["GPU kernels", "CPU launches"])
    ax.set_xlabel("time (µs)")
    ax.set_title(title)
    ax.grid(axis="y", visible=False)
    handles = [plt.Rectangle((0, 0), 1, 1, color=KIND_COLORS[k]) for k in KINDS if k in set(kernels.kind)]
    ax.legend(
        handles,
        [k for k in KINDS if k in set(kernels.kind)],
        ncol=6,
        fontsize=7.5,
        loc="upper center",
        bbox_to_anchor=(0.5, -0.32),
        frameon=False,
    )
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    footer(fig, label)
    return fig


def hbars(
    labels,
    values,
    label: str,
    title: str,
    xlabel: str,
    colors=None,
    fmt="{:.2f}",
    log=False,
    width: float = 8,
    annotate: bool = True,
):
    """Horizontal bars with their values written at the end."""
    fig, ax = plt.subplots(figsize=(width, 0.45 * len(labels) + 1.3))
    ax.barh(list(labels), list(values), color=colors or OURS)
    if annotate:
        for i, v in enumerate(values):
            if v == v:  # not NaN
                ax.text(v, i, " " + fmt.format(v), va="center", fontsize=8.5)
    ax.invert_yaxis()
    if log:
        ax.set_xscale("log")
    ax.set_xlabel(xlabel)
    ax.set_title(title)
    ax.grid(axis="y", visible=False)
    return finish(fig, label)


# --- Prompt phase vs decode phase ------------------------------------------------------------

PHASE_COLORS = {"prefill": "#2a7f62", "decode": "#c0504d"}
