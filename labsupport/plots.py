"""Figures in one style, each with a one-line provenance footer (GPU, run id, date)."""
from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd

from .kernels import KINDS

KIND_COLORS = {
    "matrix multiply": "#3b6ea8",
    "elementwise": "#e0913a",
    "copy/convert/concat": "#5aa469",
    "reduction": "#b94a48",
    "attention": "#8361a8",
    "other": "#8c8c8c",
}
OURS, THEIRS = "#3b6ea8", "#bdbdbd"

plt.rcParams.update({
    "figure.dpi": 110,
    "savefig.dpi": 110,
    "font.size": 10,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.alpha": 0.25,
    "axes.titleweight": "bold",
    "axes.titlesize": 11,
})


def footer(fig, label: str) -> None:
    """Stamp the run's provenance under the figure."""
    fig.text(0.01, 0.005, f"Measured: {label}", fontsize=7.5, color="#555", ha="left", va="bottom")


def _finish(fig, label: str):
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    footer(fig, label)
    return fig


def census_bars(ours: pd.DataFrame, published: pd.DataFrame, label: str, gpu: str):
    """Kernel count and GPU time by kind: this run beside the published H100 profile."""
    kinds = list(KINDS)
    o = ours.set_index("kind").reindex(kinds)
    p = published.set_index("kind").reindex(kinds)
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    y = range(len(kinds))
    h = 0.38
    for ax, ours_col, pub_col, title in (
        (axes[0], o["kernels"], p["kernels"], "Kernels per token"),
        (axes[1], o["gpu_ns"] / 1e6, p["gpu_ms"], "GPU time per token (ms)"),
    ):
        ax.barh([i - h / 2 for i in y], ours_col, h, color=[KIND_COLORS[k] for k in kinds], label=f"{gpu} (this run)")
        ax.barh([i + h / 2 for i in y], pub_col, h, color=THEIRS, label="H100 (published)")
        ax.set_yticks(list(y), kinds)
        ax.invert_yaxis()
        ax.set_title(title)
        ax.grid(axis="y", visible=False)
    axes[1].set_yticklabels([])
    axes[0].legend(loc="lower right", fontsize=8, frameon=False)
    return _finish(fig, label)


def timeline(kernels: pd.DataFrame, label: str, title: str):
    """Kernels of a slice of the step as bars on a time axis: CPU launch calls above, GPU
    kernels below, coloured by kind. The white space between GPU bars is the GPU waiting."""
    t0 = min(kernels.start_ns.min(), kernels.launch_ns[kernels.launch_ns > 0].min()
             if (kernels.launch_ns > 0).any() else kernels.start_ns.min())
    fig, ax = plt.subplots(figsize=(11, 2.9))
    for r in kernels.itertuples():
        ax.broken_barh([((r.start_ns - t0) / 1e3, r.dur_ns / 1e3)], (0, 0.8), color=KIND_COLORS[r.kind])
        if r.launch_dur_ns > 0:
            ax.broken_barh([((r.launch_ns - t0) / 1e3, r.launch_dur_ns / 1e3)], (1.2, 0.8), color="#444")
    ax.set_yticks([0.4, 1.6], ["GPU kernels", "CPU launches"])
    ax.set_xlabel("time (µs)")
    ax.set_title(title)
    ax.grid(axis="y", visible=False)
    handles = [plt.Rectangle((0, 0), 1, 1, color=KIND_COLORS[k]) for k in KINDS if k in set(kernels.kind)]
    ax.legend(handles, [k for k in KINDS if k in set(kernels.kind)], ncol=6, fontsize=7.5,
              loc="upper center", bbox_to_anchor=(0.5, -0.32), frameon=False)
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    footer(fig, label)
    return fig


def attention_share(sweep: pd.DataFrame, label: str):
    """Attention's share of the step's GPU time as the context grows."""
    fig, ax = plt.subplots(1, 2, figsize=(10, 3.5))
    ax[0].plot(sweep.context, sweep["attention share"] * 100, "o-", color=KIND_COLORS["attention"])
    ax[0].set_xscale("log", base=2)
    ax[0].set_xlabel("tokens in the KV cache")
    ax[0].set_ylabel("attention share of GPU time (%)")
    ax[0].set_title("Attention's share grows with context")
    ax[1].stackplot(sweep.context, sweep["GPU ms"] - sweep["attention ms"], sweep["attention ms"],
                    colors=["#c9d6e8", KIND_COLORS["attention"]], labels=["everything else", "attention"])
    ax[1].set_xscale("log", base=2)
    ax[1].set_xlabel("tokens in the KV cache")
    ax[1].set_ylabel("GPU time per token (ms)")
    ax[1].set_title("GPU time per token")
    ax[1].legend(loc="upper left", fontsize=8, frameon=False)
    for a in ax:
        a.set_xticks(list(sweep.context), [f"{c // 1024}k" if c >= 1024 else str(c) for c in sweep.context])
    return _finish(fig, label)


def per_layer_bars(table: pd.DataFrame, label: str):
    """Kernels per decoder layer: the same count in every layer."""
    fig, ax = plt.subplots(figsize=(10, 2.8))
    ax.bar(table.index.astype(int), table["all kernels"], color=OURS)
    ax.set_xlabel("decoder layer")
    ax.set_ylabel("kernels")
    ax.set_title("Kernels launched by each decoder layer")
    return _finish(fig, label)


def bandwidth_bars(values: dict[str, float], label: str):
    """Bandwidths side by side (TB/s): what the matmuls reached against the limits."""
    fig, ax = plt.subplots(figsize=(7, 2.6))
    names = list(values)
    ax.barh(names, [values[n] for n in names], color=[OURS if "reached" in n else THEIRS for n in names])
    for i, n in enumerate(names):
        ax.text(values[n], i, f" {values[n]:.2f}", va="center", fontsize=9)
    ax.invert_yaxis()
    ax.set_xlabel("TB/s")
    ax.set_title("Memory bandwidth: reached by the matrix multiplies vs the limits")
    ax.grid(axis="y", visible=False)
    return _finish(fig, label)
