"""Figures in one style, each with a one-line provenance footer (GPU, run id, date), legible on
a phone as on a laptop.

The rule that keeps them legible: a figure is at most 9 inches wide and no text in it is under
10 pt. The book shows a figure's PNG (bbox "tight") shrunk to the text column, 688 px wide at
1280 px, where no text may be under 9 px; on a 390 px phone the column is 358 px and
book/_static/book.css scales the whole figure to it (none is shown in part), so its text stays
at least 5 px high, readable with the phone's zoom. `text_heights_px` computes those heights for
every text of a figure (tests/test_figures.py)."""

from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.text import Text
from matplotlib.ticker import FuncFormatter, NullFormatter

from labsupport.traces.kernels import KINDS

KIND_COLORS = {
    "matrix multiply": "#3b6ea8",
    "elementwise": "#e0913a",
    "copy/convert/concat": "#5aa469",
    "reduction": "#b94a48",
    "attention": "#8361a8",
    "convolution": "#2a9d8f",
    "communication": "#d4a017",
    "other": "#8c8c8c",
}
OURS, THEIRS = "#3b6ea8", "#bdbdbd"

plt.rcParams.update(
    {
        "figure.dpi": 110,
        "savefig.dpi": 110,
        "font.size": 11,
        "axes.labelsize": 11,
        "xtick.labelsize": 10,
        "ytick.labelsize": 10,
        "legend.fontsize": 10,
        "figure.titlesize": 12,
        "axes.spines.top": False,
        "axes.spines.right": False,
        "axes.grid": True,
        "grid.alpha": 0.25,
        "axes.titleweight": "bold",
        "axes.titlesize": 12,
    }
)

# How the book shows a figure (book/_static/book.css): the text column's width at each page
# width; a figure wider than the column is scaled down to it, whole.
COLUMN_PX = {1280: 688, 390: 358}  # measured in the built book (Chromium)
MIN_TEXT_PX = {1280: 9.0, 390: 5.0}  # the least text height, in screen pixels, at each page width


def shown_width_px(natural_px: float, page_px: int) -> float:
    """The width the book shows a figure whose PNG is `natural_px` wide, on a page `page_px` wide."""
    return min(natural_px, COLUMN_PX[page_px])


def text_heights_px(fig, page_px: int) -> list[tuple[float, str]]:
    """Every visible text of `fig` (titles, labels, ticks, legends, notes) with the height in
    screen pixels of its font as the book shows the figure on a page `page_px` wide, smallest
    first: font size in pt × dpi / 72 × shown width / natural width of the PNG."""
    if not hasattr(fig.canvas, "get_renderer"):  # a figure pyplot has closed: draw it with Agg
        from matplotlib.backends.backend_agg import FigureCanvasAgg

        FigureCanvasAgg(fig)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    natural_px = fig.get_tightbbox(renderer).padded(0.1).width * fig.dpi  # as savefig(bbox_inches="tight")
    scale = shown_width_px(natural_px, page_px) / natural_px
    texts = {id(t): t for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip()}
    return sorted((t.get_fontsize() * fig.dpi / 72 * scale, t.get_text()) for t in texts.values())


def plain_ticks(ax, axis: str = "y") -> None:
    """Tick labels of a log axis written as plain numbers (0.5, 20, 1,000), not as 6×10⁰."""

    def plain(v, _pos):
        return f"{v:,.0f}" if v >= 1 else f"{v:.3g}"

    target = ax.yaxis if axis == "y" else ax.xaxis
    target.set_major_formatter(FuncFormatter(plain))
    target.set_minor_formatter(NullFormatter())


def footer(fig, label: str) -> None:
    """Stamp the run's provenance under the figure."""
    fig.text(0.01, 0.005, f"Measured: {label}", fontsize=10, color="#444", ha="left", va="bottom")


def finish(fig, label: str):
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    footer(fig, label)
    return fig


def kind_legend(ax, kinds: set[str], below: float) -> None:
    """A legend of the kernel kinds in `kinds` (in KINDS' order, KIND_COLORS' colours), in rows
    of four centred under the axes, `below` axes-heights down."""
    shown = [k for k in KINDS if k in kinds]
    handles = [plt.Rectangle((0, 0), 1, 1, color=KIND_COLORS[k]) for k in shown]
    ax.legend(handles, shown, ncol=4, fontsize=10, loc="upper center", bbox_to_anchor=(0.5, -below), frameon=False)


def timeline(kernels: pd.DataFrame, label: str, title: str):
    """Kernels of a slice of the step as bars on a time axis: CPU launch calls above, GPU
    kernels below, coloured by kind. The white space between GPU bars is the GPU waiting."""
    t0 = min(
        kernels.start_ns.min(),
        kernels.launch_ns[kernels.launch_ns > 0].min() if (kernels.launch_ns > 0).any() else kernels.start_ns.min(),
    )
    fig, ax = plt.subplots(figsize=(9, 2.9))
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
    kind_legend(ax, set(kernels.kind), below=0.32)
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
    width: float = 7,
    annotate: bool = True,
):
    """Horizontal bars with their values written at the end, on a linear axis (a ratio of 200
    looks like one)."""
    fig, ax = plt.subplots(figsize=(width, 0.45 * len(labels) + 1.3))
    ax.barh(list(labels), list(values), color=colors or OURS)
    if annotate:
        for i, v in enumerate(values):
            if v == v:  # not NaN
                ax.text(v, i, " " + fmt.format(v), va="center", fontsize=10)
    ax.invert_yaxis()
    ax.set_xlim(0, max((v for v in values if v == v), default=1) * 1.25)
    ax.set_xlabel(xlabel)
    ax.set_title(title)
    ax.grid(axis="y", visible=False)
    return finish(fig, label)


# --- Prompt phase vs decode phase ------------------------------------------------------------

PHASE_COLORS = {"prefill": "#2a7f62", "decode": "#c0504d"}
