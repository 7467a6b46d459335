"""The chapter's own figure (the generic ones are in labsupport.figures)."""

from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd

from labsupport import figures
from labsupport.chapters.launch_overhead.params import VARIANTS


def breakdown_figure(df: pd.DataFrame, label: str):
    """Where each variant's profiled step went (stacked horizontal bars), from breakdown()."""
    parts = [
        ("before first kernel ms", "#c9c9c9"),
        ("kernels running ms", figures.OURS),
        ("gaps between kernels ms", "#f2b880"),
        ("after last kernel ms", "#8c8c8c"),
    ]
    fig, ax = plt.subplots(figsize=(figures.WIDTH, 0.55 * len(df) + 2.0))
    left = pd.Series(0.0, index=df.index)
    for col, color in parts:
        ax.barh(df.variant.map(VARIANTS), df[col], left=left, color=color, label=col.replace(" ms", ""))
        left = left + df[col]
    ax.invert_yaxis()
    ax.set_xlabel("ms (profiled step)")
    ax.set_title("Where the time of one decode step goes")
    ax.legend(ncol=2, fontsize=10, frameon=False, loc="upper center", bbox_to_anchor=(0.5, -0.25))
    ax.grid(axis="y", visible=False)
    gaps = df.set_index(df.variant.map(VARIANTS))["gaps between kernels ms"]
    takeaway = f"Gaps between kernels: {gaps.max():.2f} ms in {gaps.idxmax()}, {gaps.min():.2f} ms in {gaps.idxmin()}."
    return figures.finish(fig, label, takeaway)
