"""The chapter's figures (the generic ones are in labsupport.figures)."""

from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd

from labsupport import figures, runs
from labsupport.measure import hardware
from labsupport.traces.kernels import KINDS


def gemv_figure(g: pd.DataFrame, run: runs.Run):
    """Read bandwidth of each weight matrix's kernels against the ceilings."""
    lim = hardware.run_limits(run)
    fig, ax = plt.subplots(figsize=(figures.WIDTH, 0.45 * len(g) + 2.4))
    labels = [f"{p}  ({s}, {b / 1e6:,.0f} MB)" for p, s, b in zip(g.projection, g["shape"], g.bytes, strict=True)]
    ax.barh(labels, g.tbs, color=[figures.OURS if not s else "#8fb0d6" for s in g.split_k])
    for tbs, name, style in (
        (lim.datasheet_tbs, "datasheet", "-"),
        (lim.ceiling_tbs, "practical ceiling (measured)", "--"),
    ):
        if tbs:
            ax.axvline(tbs, color="#555", ls=style, lw=1, label=f"{name}: {tbs:.2f} TB/s")
    for y, v in enumerate(g.tbs):
        ax.text(v, y, f" {v:.2f}", va="center", fontsize=10)
    ax.invert_yaxis()
    ax.set_xlim(0, max(g.tbs.max(), lim.datasheet_tbs or 0) * 1.25)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.22), ncol=2, fontsize=10, frameon=False)
    ax.set_xlabel("TB/s read (weights / kernel time per call; light bars: split-K)")
    ax.set_title("Read bandwidth of each matrix-vector product of the step")
    best = g.loc[g.tbs.idxmax()]
    takeaway = f"The fastest, {best.projection}, reads {best.tbs:.2f} TB/s" + (
        f", against {lim.datasheet_tbs:.2f} TB/s on the datasheet." if lim.datasheet_tbs else "."
    )
    return figures.finish(fig, run.label, takeaway)


def kv_cache_figure(t: pd.DataFrame, run: runs.Run):
    """Time per step spent concatenating the cache and in attention, by context, for both caches."""
    fig, ax = plt.subplots(figsize=(figures.WIDTH, 4.6))
    x = t.context
    has_cat = t["cat ms"].notna().all()
    ax.plot(
        x,
        t["cat ms"] if has_cat else t["copy ms"],
        "o-",
        color=figures.KIND_COLORS["copy/convert/concat"],
        label="concatenations, dynamic cache" if has_cat else "all copies and concatenations, dynamic cache",
    )
    ax.plot(x, t["attention ms"], "o-", color=figures.KIND_COLORS["attention"], label="attention, dynamic cache")
    if t["GPU ms, static"].notna().any():
        ax.plot(
            x,
            t["cat ms, static"],
            "s--",
            color=figures.KIND_COLORS["copy/convert/concat"],
            label="concatenations, static cache",
        )
        ax.plot(
            x, t["attention ms, static"], "s--", color=figures.KIND_COLORS["attention"], label="attention, static cache"
        )
        ax.plot(x, t["copy ms, static"], "^:", color="#555", label="all copies and conversions, static cache")
        ax.set_yscale("log")
        figures.plain_ticks(ax, "y")
    ax.set_xscale("log", base=2)
    ax.set_xticks(list(x), [f"{v:,}" for v in x])
    ax.set_xlabel("tokens of context")
    ax.set_ylabel("GPU ms per decode step" + (" (log)" if t["GPU ms, static"].notna().any() else ""))
    ax.set_title("The KV cache: copied every step (dynamic cache) vs read once (attention)")
    ax.legend(fontsize=10, frameon=False, loc="upper center", bbox_to_anchor=(0.5, -0.22), ncol=2)
    last = t.iloc[-1]
    takeaway = (
        f"At {int(last.context):,} tokens of context the dynamic cache spends "
        f"{(last['cat ms'] if has_cat else last['copy ms']):.2f} ms per step copying "
        f"and {last['attention ms']:.2f} ms in attention."
    )
    return figures.finish(fig, run.label, takeaway)


def census_figure(ours: pd.DataFrame, published: pd.DataFrame, label: str, gpu: str):
    """Kernel count and GPU time by kind: this run beside the published H100 profile."""
    o_all, p_all = ours.set_index("kind"), published.set_index("kind")
    # Kinds that neither profile has (convolution, in a model without one) are left out.
    kinds = [k for k in KINDS if o_all["kernels"].get(k, 0) or k in p_all.index]
    o = o_all.reindex(kinds)
    p = p_all.reindex(kinds)
    fig, axes = plt.subplots(1, 2, figsize=(figures.WIDTH, 0.4 * len(kinds) + 2.2))
    y = range(len(kinds))
    h = 0.38
    for ax, ours_col, pub_col, title in (
        (axes[0], o["kernels"], p["kernels"], "Kernels per token"),
        (axes[1], o["gpu_ns"] / 1e6, p["gpu_ms"], "GPU time per token (ms)"),
    ):
        ax.barh(
            [i - h / 2 for i in y],
            ours_col,
            h,
            color=[figures.KIND_COLORS[k] for k in kinds],
            label=f"{gpu} (this run)",
        )
        ax.barh([i + h / 2 for i in y], pub_col, h, color=figures.THEIRS, label="H100 (published)")
        ax.set_yticks(list(y), kinds)
        ax.invert_yaxis()
        ax.set_title(title)
        ax.grid(axis="y", visible=False)
    axes[1].set_yticklabels([])
    axes[1].legend(loc="lower right", fontsize=10, frameon=False)  # beside the short bars of the last kinds
    takeaway = (
        f"This run: {o['kernels'].sum():,.0f} kernels and {o['gpu_ns'].sum() / 1e6:.2f} ms of GPU time per token; "
        f"the published H100 profile: {p['kernels'].sum():,.0f} kernels, {p['gpu_ms'].sum():.2f} ms."
    )
    return figures.finish(fig, label, takeaway)


def bandwidth_figure(values: dict[str, float], label: str):
    """Bandwidths side by side (TB/s): what the matmuls reached against the limits."""
    fig, ax = plt.subplots(figsize=(figures.WIDTH, 0.45 * len(values) + 1.6))
    names = list(values)
    ax.barh(
        names, [values[n] for n in names], color=[figures.OURS if "reached" in n else figures.THEIRS for n in names]
    )
    for i, n in enumerate(names):
        ax.text(values[n], i, f" {values[n]:.2f}", va="center", fontsize=10)
    ax.invert_yaxis()
    ax.set_xlabel("TB/s")
    ax.set_title("Memory bandwidth: reached by the matrix multiplies vs the limits")
    ax.grid(axis="y", visible=False)
    takeaway = "; ".join(f"{n}: {v:.2f} TB/s" for n, v in values.items()) + "."
    return figures.finish(fig, label, takeaway)


def layer_parts_figure(table: pd.DataFrame, label: str):
    """Kernels (bars) and GPU time (labels) of each part of one decoder layer, in order."""
    fig, ax = plt.subplots(figsize=(figures.WIDTH, 0.4 * len(table) + 1.6))
    ax.barh(list(table.index), table.kernels, color=figures.OURS)
    for i, (n, us) in enumerate(zip(table.kernels, table["GPU µs"], strict=True)):
        ax.text(n, i, f" {n} kernels, {us:.1f} µs", va="center", fontsize=10)
    ax.invert_yaxis()
    ax.set_xlabel("kernels")
    ax.set_xlim(0, table.kernels.max() * 1.6)
    ax.set_title("One decoder layer: kernels launched by each part")
    ax.grid(axis="y", visible=False)
    takeaway = (
        f"{table.kernels.sum():,} kernels in the layer, {table['GPU µs'].sum():.1f} µs of GPU time; "
        f"most from {table.kernels.idxmax()}."
    )
    return figures.finish(fig, label, takeaway)


def attention_share_figure(sweep: pd.DataFrame, label: str):
    """Attention's share of the step's GPU time as the context grows."""
    fig, ax = plt.subplots(2, 1, figsize=(figures.WIDTH, 6.4))  # one above the other: legible on a phone
    ax[0].plot(sweep.context, sweep["attention share"] * 100, "o-", color=figures.KIND_COLORS["attention"])
    ax[0].set_xscale("log", base=2)
    ax[0].set_xlabel("tokens in the KV cache")
    ax[0].set_ylabel("attention share of GPU time (%)")
    ax[0].set_title("Attention's share grows with context")
    ax[1].stackplot(
        sweep.context,
        sweep["GPU ms"] - sweep["attention ms"],
        sweep["attention ms"],
        colors=["#c9d6e8", figures.KIND_COLORS["attention"]],
        labels=["everything else", "attention"],
    )
    ax[1].set_xscale("log", base=2)
    ax[1].set_xlabel("tokens in the KV cache")
    ax[1].set_ylabel("GPU time per token (ms)")
    ax[1].set_title("GPU time per token")
    ax[1].legend(loc="upper left", fontsize=10, frameon=False)
    for a in ax:
        a.set_xticks(list(sweep.context), [f"{c // 1024}k" if c >= 1024 else str(c) for c in sweep.context])
    first, last = sweep.iloc[0], sweep.iloc[-1]
    takeaway = (
        f"Attention's share grows from {first['attention share']:.0%} at {first.context:,} tokens "
        f"to {last['attention share']:.0%} at {last.context:,}."
    )
    return figures.finish(fig, label, takeaway)
