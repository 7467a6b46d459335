"""The chapter's own figures: the all-reduce curve, and one layer on every rank side by side."""

from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd

from labsupport import figures

# The generic palette, with a colour for the kind this chapter brings (collectives between GPUs).
COLORS = figures.KIND_COLORS  # communication (NCCL) included


def allreduce_figure(curves: dict[str, pd.DataFrame], label: str):
    """Latency and bus bandwidth of one all-reduce against its size, one line per way of
    launching it ({name: allreduce_curve}; empty ones left out), the decode step's message
    size marked on each."""
    fig, (lat, bw) = plt.subplots(2, 1, figsize=(figures.WIDTH, 6.4))  # one above the other: legible on a phone
    styles = iter([("o-", figures.OURS), ("s--", "0.45")])
    for name, curve in ((n, c) for n, c in curves.items() if len(c)):
        style, color = next(styles)
        kb = curve.bytes / 1024
        lat.loglog(kb, curve.latency_us, style, color=color, label=name)
        bw.semilogx(kb, curve.busbw_gbs, style, color=color, label=name)
        step = curve[curve["decode step"]]
        for ax, col in ((lat, "latency_us"), (bw, "busbw_gbs")):
            ax.plot(step.bytes / 1024, step[col], "o", ms=11, mfc="none", mec=COLORS["communication"], mew=2)
    first = next(c for c in curves.values() if len(c))
    for ax, col in ((lat, "latency_us"), (bw, "busbw_gbs")):
        for r in first[first["decode step"]].itertuples():
            ax.annotate(
                "decode\nstep",
                (r.bytes / 1024, getattr(r, col)),
                textcoords="offset points",
                xytext=(12, 10),
                fontsize=10,
            )
        ax.set_xlabel("message size (KB)")
        figures.plain_ticks(ax, "x")
    figures.plain_ticks(lat, "y")
    lat.legend(fontsize=10, frameon=False)
    lat.set_ylabel("µs per all-reduce")
    lat.set_title("Latency")
    bw.set_ylabel("bus bandwidth (GB/s)")
    bw.set_title("Bus bandwidth")
    step = first[first["decode step"]]
    takeaway = (
        f"At the decode step's message ({step.bytes.iloc[0] / 1024:,.0f} KB) one all-reduce takes "
        f"{step.latency_us.iloc[0]:,.1f} µs."
        if len(step)
        else ""
    )
    return figures.finish(fig, label, takeaway)


def ranks_timeline(layers: dict[str, pd.DataFrame], label: str, title: str):
    """The kernels of one decoder layer on every rank (`layers`: lane name -> kernels), one lane
    each, coloured by kind, each lane from its own layer's first kernel (every rank has its
    own clock and its own step)."""
    fig, ax = plt.subplots(figsize=(figures.WIDTH, 1.9 + 0.8 * len(layers)))
    seen = set()
    for i, k in enumerate(layers.values()):
        y, t0 = len(layers) - 1 - i, k.start_ns.min()
        for r in k.itertuples():
            ax.broken_barh([((r.start_ns - t0) / 1e3, r.dur_ns / 1e3)], (y, 0.8), color=COLORS.get(r.kind, "#8c8c8c"))
            seen.add(r.kind)
    ax.set_yticks([len(layers) - 1 - i + 0.4 for i in range(len(layers))], list(layers))
    ax.set_xlabel("time since the layer's first kernel (µs)")
    ax.set_title(title)
    ax.grid(axis="y", visible=False)
    figures.kind_legend(ax, seen, below=0.35)
    spans = {name: (k.start_ns + k.dur_ns).max() / 1e3 - k.start_ns.min() / 1e3 for name, k in layers.items()}
    takeaway = "The layer takes " + ", ".join(f"{us:,.0f} µs on {name}" for name, us in spans.items()) + "."
    return figures.finish(fig, label, takeaway)


def layer_lanes_figure(run):
    """ranks_timeline() of the middle decoder layer of the profiled main form, every rank of the split in
    its own lane."""
    from .analysis import layer_kernels, main_form, split_degree
    from .params import SHORT

    tp, form = split_degree(run), main_form(run)
    layer = run.results["model"]["layers"] // 2
    lanes = {f"rank {rank}": layer_kernels(run, tp, rank, form, layer) for rank in range(tp)}
    return ranks_timeline(lanes, run.label, f"TP={tp}, {SHORT[form]}: decoder layer {layer} on each rank")


def allreduce_curves_figure(run):
    """allreduce_figure() of the run's curves, launched one by one and replayed from a CUDA graph."""
    from .analysis import allreduce_curve

    return allreduce_figure(
        {"one by one": allreduce_curve(run), "CUDA graph": allreduce_curve(run, "CUDA graph")}, run.label
    )
