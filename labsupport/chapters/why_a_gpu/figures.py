"""The chapter's own figures: what a step reads, its times against the limits, throughput; and the live notebook's
explorer of the sweep (not shown in the web book).
"""

from __future__ import annotations

from labsupport import figures, runs
from labsupport.measure import hardware

from .batch_sweep import COMPUTE, MEMORY, OVERHEAD, bound_at, ridge, sweep
from .one_token import arithmetic_rows, practical_ceiling_tbs

# The shading of each regime in the throughput figure.
REGIME_SHADES = {OVERHEAD: "#eeeeee", MEMORY: "#deebf7", COMPUTE: "#fde0c5"}


def bytes_figure(run: runs.Run):
    """What one step reads at each batch size: the weights (the same at every batch) and the
    KV cache (growing with it), stacked."""
    import matplotlib.pyplot as plt

    s = sweep(run)
    x = range(len(s))
    fig, ax = plt.subplots(figsize=(figures.WIDTH, 3.8))
    ax.bar(x, s["weights bytes"] / 1e9, color=figures.KIND_COLORS["matrix multiply"], label="weights")
    ax.bar(
        x,
        s["KV bytes"] / 1e9,
        bottom=s["weights bytes"] / 1e9,
        color=figures.KIND_COLORS["attention"],
        label="KV cache (read by attention)",
    )
    ax.set_xticks(list(x), [str(b) for b in s.batch])
    ax.set_xlabel("batch (sequences decoded together)")
    ax.set_ylabel("GB read per decode step")
    ax.set_title("Bytes one decode step must read: the weights once, each sequence's KV cache once")
    ax.grid(axis="x", visible=False)
    ax.legend(fontsize=10, frameon=False, loc="upper left")
    first, last = s.iloc[0], s.iloc[-1]
    takeaway = (
        f"The weights are {first['weights bytes'] / 1e9:.1f} GB at every batch; the KV cache grows to "
        f"{last['KV bytes'] / 1e9:.1f} GB at batch {last.batch}."
    )
    return figures.finish(fig, run.label, takeaway)


def _batch_axis(ax, batches) -> None:
    """A log2 batch axis labelled with plain numbers."""
    ax.set_xscale("log", base=2)
    ticks = [b for b in (1, 4, 16, 64, 256, 1024, 4096) if min(batches) <= b <= max(batches)]
    ax.set_xticks(ticks, [str(t) for t in ticks])
    ax.minorticks_off()
    ax.set_xlabel("batch (sequences decoded together)")


def _mark_batch(ax, batch: float, y: float, text: str, ha: str, colour: str, text_colour=None, ls: str = "-"):
    """A batch size marked on a panel: a vertical line, its label at height `y` on the `ha` side of it."""
    ax.axvline(batch, color=colour, lw=1, ls=ls)
    ax.text(batch, y, text, fontsize=10, ha=ha, color=text_colour)


def limits_figure(run: runs.Run):
    """Measured time per step against the limits drawn at the limits: on the left the matrix
    multiplies (the weights' bytes; their operations), on the right the whole step (weights and
    KV cache; all operations). Solid: the datasheet's limits; dashed: the ceilings measured in
    the run."""
    import matplotlib.pyplot as plt

    s = sweep(run)
    r = ridge(run)
    lim = hardware.run_limits(run)
    ceil_tbs = practical_ceiling_tbs(run)
    mem, math = figures.KIND_COLORS["copy/convert/concat"], figures.KIND_COLORS["reduction"]
    sheet = f"{lim.datasheet_name} datasheet" if lim.datasheet_name else "datasheet"
    fig, ax = plt.subplots(2, 1, figsize=(figures.WIDTH, 9.5), sharex=True)  # stacked: legible on a phone
    b = s.batch
    panels = (
        (
            ax[0],
            "matmul ms",
            "matrix multiplies (measured)",
            "matmul memory limit ms",
            "matmul math limit ms",
            "matmul ceiling ms",
            "matmul GEMM ms",
            "The matrix multiplies: weights only",
        ),
        (
            ax[1],
            "GPU ms",
            "whole step, GPU busy (measured)",
            "memory limit ms",
            "math limit ms",
            "ceiling ms",
            None,
            "The whole step: weights and KV cache",
        ),
    )
    for a, col, label, mem_col, math_col, read_col, gemm_col, title in panels:
        a.plot(b, s[col], "o-", color=figures.OURS, label=label, zorder=3)
        lines = []  # (column, style, colour, width, legend text) of each limit this run knows
        if lim.datasheet_tbs:
            lines.append((mem_col, "-", mem, 1.5, f"floor: bytes at {lim.datasheet_tbs:.2f} TB/s ({sheet})"))
        if lim.datasheet_tflops:
            text = f"math limit: operations at {lim.datasheet_tflops:.0f} TFLOP/s ({sheet})"
            lines.append((math_col, "-", math, 1.5, text))
        if ceil_tbs:
            lines.append((read_col, "--", mem, 1, f"bytes at the practical ceiling ({ceil_tbs:.2f} TB/s, this run)"))
        if gemm_col and lim.gemm_tflops:
            text = f"operations at the measured GEMM rate ({lim.gemm_tflops:.0f} TFLOP/s, this run)"
            lines.append((gemm_col, "--", math, 1, text))
        for column, style, colour, width, text in lines:
            a.plot(b, s[column], style, color=colour, lw=width, label=text)
        _batch_axis(a, b)
        a.set_yscale("log")
        figures.plain_ticks(a, "y")
        a.set_title(title)
    low = s["matmul ms"].min()
    _mark_batch(ax[0], r.measured_batch, low * 0.5, f"measured crossing ≈ {r.measured_batch:.0f} ", "right", "#555")
    if r.datasheet_batch:
        text = f" datasheet ridge {r.datasheet_batch:.0f}"
        _mark_batch(ax[0], r.datasheet_batch, low * 0.37, text, "left", "#bbb", text_colour="#777", ls=":")
    for a in ax:
        a.set_ylabel("ms per decode step")
        a.xaxis.set_tick_params(labelbottom=True)
    # One legend under the panels: the limits are drawn alike in each, only the measured line differs.
    handles, labels = ax[0].get_legend_handles_labels()
    h1, l1 = ax[1].get_legend_handles_labels()
    ax[1].legend(
        [*handles[:1], *h1[:1], *handles[1:]],
        [*labels[:1], *l1[:1], *labels[1:]],
        frameon=False,
        fontsize=10,
        loc="upper left",
        bbox_to_anchor=(0, -0.2),
        ncol=1,
    )
    lo = s["matmul ms"].min()
    if lim.datasheet_tbs:
        lo = min(lo, s["matmul memory limit ms"].min())
    for a in ax:
        a.set_ylim(lo * 0.3, s["GPU ms"].max() * 4)
    takeaway = (
        "The matrix multiplies' measured time crosses from the memory limit to the math limit "
        f"near batch {r.measured_batch:.0f}."
    )
    return figures.finish(fig, run.label, takeaway)


def _shade_regimes(ax, s) -> None:
    """Shade the batch sizes of each regime (on a log2 axis: from halfway to the neighbours) and
    name each stretch at the top of the axes."""
    import numpy as np

    b = list(s.batch)
    edges = [b[0] / 2**0.5] + [float(np.sqrt(x * y)) for x, y in zip(b, b[1:], strict=False)] + [b[-1] * 2**0.5]
    regs = list(s.regime)
    start = 0
    for i in range(1, len(b) + 1):
        if i == len(b) or regs[i] != regs[start]:
            lo, hi = edges[start], edges[i]
            ax.axvspan(lo, hi, color=REGIME_SHADES.get(regs[start], "#f5f5f5"), zorder=0, lw=0)
            ax.text(
                float(np.sqrt(lo * hi)),
                0.97,
                regs[start].replace("-bound", "-\nbound"),
                transform=ax.get_xaxis_transform(),
                ha="center",
                va="top",
                fontsize=10,
                color="#333",
            )
            start = i
    ax.set_xlim(edges[0], edges[-1])


def throughput_figure(run: runs.Run):
    """Tokens per second: if the GPU never waited (GPU busy), and as measured (wall time, the
    minimum of the trials), over the regime of each batch size (shaded, named at the top)."""
    import matplotlib.pyplot as plt

    s = sweep(run)
    fig, ax = plt.subplots(figsize=(figures.WIDTH, 4.2))
    _shade_regimes(ax, s)
    ax.plot(s.batch, s["GPU tokens/s"], "o-", color=figures.OURS, label="if the GPU never waited (GPU busy)")
    ax.plot(s.batch, s["tokens/s"], "s--", color="#555", ms=4, label="measured wall time (eager, minimum)")
    _batch_axis(ax, s.batch)
    ax.set_xlim(*ax.get_xlim())
    ax.set_yscale("log")
    figures.plain_ticks(ax, "y")
    ax.set_ylabel("tokens per second")
    ax.set_title("Throughput grows with the batch", pad=8)
    ax.set_ylim(top=ax.get_ylim()[1] * 6)  # room for the regimes' names
    ax.legend(fontsize=10, frameon=False, loc="lower right")
    best = s.loc[s["tokens/s"].idxmax()]
    takeaway = (
        f"Measured throughput grows from {s['tokens/s'].iloc[0]:,.0f} tokens/s at batch {s.batch.iloc[0]} "
        f"to {best['tokens/s']:,.0f} at batch {best.batch}."
    )
    return figures.finish(fig, run.label, takeaway)


def explorer(run: runs.Run):
    """An ipywidgets explorer of the sweep: pick a batch size, read time, tokens/s, bound."""
    import ipywidgets as widgets

    s = sweep(run).set_index("batch")

    def show(batch):
        r = s.loc[batch]
        return (
            f"<b>batch {batch}</b>: GPU time {r['GPU ms']:.2f} ms per step, wall {r['wall ms']:.2f} ms (minimum); "
            f"{r['tokens/s']:,.0f} tokens/s (GPU alone could do {r['GPU tokens/s']:,.0f}); "
            f"weights+KV read at {r['TB/s']:.2f} TB/s; matmuls at {r['matmul TFLOP/s']:.0f} TFLOP/s; "
            f"{bound_at(run, batch)}"
        )

    first = s.index.min()
    slider = widgets.SelectionSlider(options=list(s.index), value=first, description="batch")
    out = widgets.HTML(show(first))
    slider.observe(lambda change: setattr(out, "value", show(change["new"])), names="value")
    return widgets.VBox([slider, out])


def arithmetic_figure(run: runs.Run):
    """One token's math against reading its weights, at the datasheet's rates and at the rates
    measured in the run (the arithmetic table's two rows), as bars on a linear scale."""
    sheet, measured = arithmetic_rows(run)
    return figures.hbars(
        [
            "math at peak (datasheet)",
            "memory: the floor (datasheet)",
            "math (measured GEMM)",
            "memory (practical ceiling)",
        ],
        [sheet["math ms"], sheet["memory ms"], measured["math ms"], measured["memory ms"]],
        run.label,
        f"One token of Qwen3-8B: reading the weights takes {sheet['memory ms'] / sheet['math ms']:.0f}× "
        f"(datasheet), {measured['memory ms'] / measured['math ms']:.0f}× (measured) the math",
        "ms (linear scale)",
        colors=[figures.KIND_COLORS["reduction"], figures.OURS] * 2,
        fmt="{:.3f}",
    )
