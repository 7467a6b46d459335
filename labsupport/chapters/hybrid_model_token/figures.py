"""The chapter's own figures (the cache as the context grows; where a step's time goes) and the
download of a table as a CSV link."""

from __future__ import annotations

import base64
import html

import matplotlib.pyplot as plt
import pandas as pd

from labsupport.figures import KIND_COLORS, OURS, WIDTH, finish, plain_ticks


def cache_growth_figure(growth: pd.DataFrame, label: str):
    """Cache bytes against context length: the full-attention layers' KV cache grows, the
    linear-attention layers' state stays flat."""
    fig, ax = plt.subplots(figsize=(WIDTH, 3.8))
    x = growth["context"]
    ax.plot(x, growth["full-attention KV cache MB"], "o-", color=OURS, label="full-attention layers: KV cache")
    ax.plot(
        x,
        growth["linear-attention state MB"],
        "s-",
        color=KIND_COLORS["attention"],
        label="linear-attention layers: fixed state",
    )
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    plain_ticks(ax, "x")
    plain_ticks(ax, "y")
    ax.set_xlabel("context (tokens)")
    ax.set_ylabel("MB held by the cache")
    ax.set_title("Cache size as the context grows")
    ax.legend(frameon=False)
    last = growth.iloc[-1]
    takeaway = (
        f"At {last['context']:,.0f} tokens the KV cache holds {last['full-attention KV cache MB']:,.0f} MB "
        f"and the linear-attention state {last['linear-attention state MB']:,.0f} MB."
    )
    return finish(fig, label, takeaway)


def stacked_parts(df: pd.DataFrame, parts: list[str], label: str, title: str, xlabel: str):
    """One horizontal bar per row of `df` (named by its `variant` column), split into the
    columns `parts`, stacked left to right."""
    colors = [OURS, KIND_COLORS["elementwise"], "#c9c9c9", "#8c8c8c", KIND_COLORS["attention"]]
    fig, ax = plt.subplots(figsize=(WIDTH, 0.55 * len(df) + 2.0))
    left = pd.Series(0.0, index=df.index)
    for col, color in zip(parts, colors, strict=False):  # at most as many parts as colours
        ax.barh(df.variant, df[col], left=left, color=color, label=col.replace(" ms", ""))
        left = left + df[col]
    ax.invert_yaxis()
    ax.set_xlabel(xlabel)
    ax.set_title(title)
    ax.legend(ncol=2, fontsize=10, frameon=False, loc="upper center", bbox_to_anchor=(0.5, -0.25))
    ax.grid(axis="y", visible=False)
    totals = df.set_index("variant")[parts].sum(axis=1)
    takeaway = (
        f"Longest: {totals.idxmax()}, {totals.max():.2f} in all; shortest: {totals.idxmin()}, {totals.min():.2f}."
    )
    return finish(fig, label, takeaway)


def csv_link(df: pd.DataFrame, filename: str, text: str):
    """A link that downloads `df` as a CSV file, the data carried in the link itself (nothing is
    written next to the book)."""
    from IPython.display import HTML

    data = base64.b64encode(df.to_csv(index=False).encode()).decode()
    return HTML(
        f'<p><a href="data:text/csv;base64,{data}" download="{html.escape(filename)}">'
        f"{html.escape(text)}</a> ({len(df)} rows, CSV)</p>"
    )


def groups_figure(run):
    """The eager reference step's GPU time by the part of the model that launched each kernel."""
    from labsupport.figures import hbars

    from .analysis import census_by_group, kernel_table

    groups = census_by_group(kernel_table(run, "reference", "eager"))
    return hbars(
        list(groups.index),
        list(groups["GPU ms"]),
        run.label,
        "Eager decode step, reference Gated DeltaNet: GPU time by part of the model",
        "GPU ms",
    )


def time_budget_figure(run):
    """stacked_parts() of every variant's time: matrix multiplies, other kernels, GPU idle."""
    from .analysis import time_budget
    from .measuring import MODES

    budget = time_budget(run)
    return stacked_parts(
        budget.assign(variant=[f"{b}: {MODES[m]}" for b, m in zip(budget.backend, budget["mode"], strict=True)]),
        ["matrix multiplies ms", "other kernels ms", "GPU idle ms"],
        run.label,
        "Where the time of one decode step goes",
        "ms per token",
    )
