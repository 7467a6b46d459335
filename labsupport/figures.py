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


def census_bars(ours: pd.DataFrame, published: pd.DataFrame, label: str, gpu: str):
    """Kernel count and GPU time by kind: this run beside the published H100 profile."""
    o_all, p_all = ours.set_index("kind"), published.set_index("kind")
    # Kinds that neither profile has (convolution, in a model without one) are left out.
    kinds = [k for k in KINDS if o_all["kernels"].get(k, 0) or k in p_all.index]
    o = o_all.reindex(kinds)
    p = p_all.reindex(kinds)
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
    return finish(fig, label)


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


def attention_share(sweep: pd.DataFrame, label: str):
    """Attention's share of the step's GPU time as the context grows."""
    fig, ax = plt.subplots(1, 2, figsize=(10, 3.5))
    ax[0].plot(sweep.context, sweep["attention share"] * 100, "o-", color=KIND_COLORS["attention"])
    ax[0].set_xscale("log", base=2)
    ax[0].set_xlabel("tokens in the KV cache")
    ax[0].set_ylabel("attention share of GPU time (%)")
    ax[0].set_title("Attention's share grows with context")
    ax[1].stackplot(
        sweep.context,
        sweep["GPU ms"] - sweep["attention ms"],
        sweep["attention ms"],
        colors=["#c9d6e8", KIND_COLORS["attention"]],
        labels=["everything else", "attention"],
    )
    ax[1].set_xscale("log", base=2)
    ax[1].set_xlabel("tokens in the KV cache")
    ax[1].set_ylabel("GPU time per token (ms)")
    ax[1].set_title("GPU time per token")
    ax[1].legend(loc="upper left", fontsize=8, frameon=False)
    for a in ax:
        a.set_xticks(list(sweep.context), [f"{c // 1024}k" if c >= 1024 else str(c) for c in sweep.context])
    return finish(fig, label)


def layer_parts(table: pd.DataFrame, label: str):
    """Kernels (bars) and GPU time (labels) of each part of one decoder layer, in order."""
    fig, ax = plt.subplots(figsize=(9, 0.36 * len(table) + 1.4))
    ax.barh(list(table.index), table.kernels, color=OURS)
    for i, (n, us) in enumerate(zip(table.kernels, table["GPU µs"], strict=False)):
        ax.text(n, i, f" {n} kernels, {us:.1f} µs", va="center", fontsize=8.5)
    ax.invert_yaxis()
    ax.set_xlabel("kernels")
    ax.set_xlim(0, table.kernels.max() * 1.6)
    ax.set_title("One decoder layer: kernels launched by each part")
    ax.grid(axis="y", visible=False)
    return finish(fig, label)


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
    return finish(fig, label)


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


def queue(q: pd.DataFrame, label: str):
    """Per launch: when the CPU's launch call returned, and when the GPU finished that kernel."""
    fig, ax = plt.subplots(figsize=(9, 3.4))
    ax.plot(q.launch, q.call_return_us / 1e3, color="#444", label="CPU: launch call returned")
    ax.plot(q.launch, q.gpu_done_us / 1e3, color=OURS, label="GPU: kernel finished")
    ax.fill_between(
        q.launch, q.call_return_us / 1e3, q.gpu_done_us / 1e3, color=OURS, alpha=0.12, label="waiting in the queue"
    )
    ax.set_xlabel("launch number")
    ax.set_ylabel("ms since the first launch")
    ax.set_title("The CPU runs ahead; the GPU works through the queue")
    ax.legend(fontsize=8, frameon=False)
    return finish(fig, label)


def stacked_breakdown(df: pd.DataFrame, label: str):
    """Where each variant's profiled step went (stacked horizontal bars)."""
    parts = [
        ("before first kernel ms", "#c9c9c9"),
        ("kernels running ms", OURS),
        ("gaps between kernels ms", "#f2b880"),
        ("after last kernel ms", "#8c8c8c"),
    ]
    fig, ax = plt.subplots(figsize=(10, 0.55 * len(df) + 1.6))
    left = pd.Series(0.0, index=df.index)
    for col, color in parts:
        ax.barh(df.variant, df[col], left=left, color=color, label=col.replace(" ms", ""))
        left = left + df[col]
    ax.invert_yaxis()
    ax.set_xlabel("ms (profiled step)")
    ax.set_title("Where the time of one decode step goes")
    ax.legend(ncol=4, fontsize=8, frameon=False, loc="upper center", bbox_to_anchor=(0.5, -0.25))
    ax.grid(axis="y", visible=False)
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    footer(fig, label)
    return fig


# --- Prompt phase vs decode phase ------------------------------------------------------------

PHASE_COLORS = {"prefill": "#2a7f62", "decode": "#c0504d"}
