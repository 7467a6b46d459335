"""Figures in one style, each with a one-line provenance footer (GPU, run id, date), drawn for
the width the book shows them at, and each carrying a description that says what it shows.

The width: the book shows a figure's PNG (bbox "tight") scaled to the text column, about 688 px
at a 1280 px page and 358 px on a 390 px phone (book/_static/book.css). A figure is WIDTH
inches wide and no text in it is under 10 pt, so that on the phone its smallest text is about
10 × 358 / (72 × 6.6) ≈ 7.5 px high (MIN_TEXT_PX: 7 px there, 9 px at 1280); several panels
are stacked rather than set side by side when their labels would not fit. `finish` wraps a
title or label wider than its axes and gives a legend wider than the figure fewer columns, so
that nothing widens the PNG past the figure; `text_heights_px` computes every text's height as
the book shows it (tests/test_figures.py, tests/figure_probe.py).

The description: `finish(fig, label, takeaway)` records what the figure shows (its title, its
axes, what its legend names, and the takeaway, from the data); a figure without one gets the
part read from its axes (`description`). Every PNG of the figure (the one a notebook cell's
output holds, savefig's) carries it as a "Description" text chunk, with the height of its
smallest text (`_carry_metadata`), and the book's Sphinx extension book/_ext/figure_alt.py
makes it the image's alt text: no notebook cell names it. myst-nb takes alt text only from a
cell's metadata, which would mean editing notebooks.
"""

from __future__ import annotations

import textwrap
import weakref
from pathlib import Path

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
WIDTH = 6.4  # inches: every figure of the book (see the module's docstring)

plt.rcParams.update(
    {
        "figure.dpi": 110,
        "savefig.dpi": 110,
        "font.size": 10,
        "axes.labelsize": 10,
        "xtick.labelsize": 10,
        "ytick.labelsize": 10,
        "legend.fontsize": 10,
        "figure.titlesize": 11,
        "axes.spines.top": False,
        "axes.spines.right": False,
        "axes.grid": True,
        "grid.alpha": 0.25,
        "axes.titleweight": "bold",
        "axes.titlesize": 11,
    }
)

# How the book shows a figure (book/_static/book.css): the text column's width at each page
# width; a figure wider than the column is scaled down to it, whole.
COLUMN_PX = {1280: 688, 390: 358}  # measured in the built book (Chromium)
MIN_TEXT_PX = {1280: 9.0, 390: 7.0}  # the least text height, in screen pixels, at each page width
DESCRIPTION_KEY = "Description"  # the PNG text chunk that carries a figure's description
# The PNG text chunk with the height, in the PNG's own pixels, of the figure's smallest text: the
# browser test (tests/test_browser.py) scales it by the width the page shows the image at.
SMALLEST_TEXT_KEY = "Smallest text px"


def shown_width_px(natural_px: float, page_px: int) -> float:
    """The width the book shows a figure whose PNG is `natural_px` wide, on a page `page_px` wide."""
    return min(natural_px, COLUMN_PX[page_px])


def _renderer(fig):
    if not hasattr(fig.canvas, "get_renderer"):  # a figure pyplot has closed: draw it with Agg
        from matplotlib.backends.backend_agg import FigureCanvasAgg

        FigureCanvasAgg(fig)
    fig.canvas.draw()
    return fig.canvas.get_renderer()


def text_heights_px(fig, page_px: int) -> list[tuple[float, str]]:
    """Every visible text of `fig` (titles, labels, ticks, legends, notes) with the height in
    screen pixels of its font as the book shows the figure on a page `page_px` wide, smallest
    first: font size in pt × dpi / 72 × shown width / natural width of the PNG."""
    renderer = _renderer(fig)
    natural_px = fig.get_tightbbox(renderer).padded(0.1).width * fig.dpi  # as savefig(bbox_inches="tight")
    scale = shown_width_px(natural_px, page_px) / natural_px
    texts = {id(t): t for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip()}
    return sorted((t.get_fontsize() * fig.dpi / 72 * scale, t.get_text()) for t in texts.values())


def _wrapped(text: str, width_px: float, allowed_px: float) -> str:
    """`text` broken into lines that fit `allowed_px`, when it is `width_px` wide on one line."""
    if width_px <= allowed_px or not text.strip():
        return text
    longest = max(len(line) for line in text.splitlines())
    chars = max(8, int(longest * allowed_px / width_px * 0.95))
    return "\n".join(textwrap.fill(line, chars) for line in text.splitlines())


def _titles(ax) -> list[Text]:
    """The three titles of an axes (centre, left, right): matplotlib keeps them as attributes."""
    return [ax.title, ax._left_title, ax._right_title]


def fit_to_width(fig) -> None:
    """Wrap every axes title and x label wider than its axes, every y label taller than its axes,
    a figure title wider than the figure, and give a legend wider than the figure fewer columns:
    none of them then widens the PNG past the figure, which would shrink all its text."""
    renderer = _renderer(fig)
    fig_px = fig.get_figwidth() * fig.dpi
    for ax in fig.axes:
        if not ax.get_visible() or not ax.axison:
            continue
        box = ax.get_window_extent(renderer)
        for t in [*_titles(ax), ax.xaxis.label]:
            t.set_text(_wrapped(t.get_text(), t.get_window_extent(renderer).width, box.width * 1.05))
        label = ax.yaxis.label
        label.set_text(_wrapped(label.get_text(), label.get_window_extent(renderer).height, box.height * 1.1))
    if fig._suptitle is not None:
        t = fig._suptitle
        t.set_text(_wrapped(t.get_text(), t.get_window_extent(renderer).width, fig_px * 0.95))
    for ax in fig.axes:
        legend = ax.get_legend()
        while legend is not None and legend._ncols > 1 and legend.get_window_extent(renderer).width > fig_px * 0.98:
            legend = _relaid(legend, legend._ncols - 1)
            renderer = _renderer(fig)
        for t in legend.get_texts() if legend is not None else ():  # still too wide: its entries wrapped
            t.set_text(_wrapped(t.get_text(), t.get_window_extent(renderer).width, fig_px * 0.85))


def _relaid(legend, ncols: int):
    """The axes' legend drawn again in `ncols` columns, where it was, as it was (a legend lays
    out its columns once, when it is made)."""
    texts = legend.get_texts()
    return legend.axes.legend(
        legend.legend_handles,
        [t.get_text() for t in texts],
        ncols=ncols,
        loc=legend._loc,
        # where it was, in the axes' own coordinates (which a later layout keeps)
        bbox_to_anchor=legend.get_bbox_to_anchor().transformed(legend.axes.transAxes.inverted()).bounds,
        bbox_transform=legend.axes.transAxes,
        frameon=legend.get_frame_on(),
        fontsize=texts[0].get_fontsize() if texts else None,
    )


def plain_ticks(ax, axis: str = "y") -> None:
    """Tick labels of a log axis written as plain numbers (0.5, 20, 1,000), not as 6×10⁰."""

    def plain(v, _pos):
        return f"{v:,.0f}" if v >= 1 else f"{v:.3g}"

    target = ax.yaxis if axis == "y" else ax.xaxis
    target.set_major_formatter(FuncFormatter(plain))
    target.set_minor_formatter(NullFormatter())


def footer(fig, label: str) -> float:
    """Stamp the run's provenance under the figure, in as many lines as the figure's width
    needs (broken at its " · "); returns the height it takes, as a fraction of the figure's."""
    t = fig.text(0.01, 0.005, f"Measured: {label}", fontsize=10, color="#444", ha="left", va="bottom")
    renderer = _renderer(fig)
    allowed = fig.get_figwidth() * fig.dpi * 0.97
    lines: list[str] = []
    for part in t.get_text().split(" · "):
        t.set_text(f"{lines[-1]} · {part}" if lines else part)
        if lines and t.get_window_extent(renderer).width <= allowed:
            lines[-1] = t.get_text()
        else:
            lines.append(part)
    t.set_text("\n".join(lines))
    return (t.get_window_extent(renderer).height + 4) / (fig.get_figheight() * fig.dpi)


def finish(fig, label: str, takeaway: str = ""):
    """The end every figure shares: titles, labels and legends fitted to the width
    (fit_to_width), a tight layout above the provenance footer, and the figure's description
    (what `description` reads from its axes, then `takeaway`, a sentence from the data)."""
    fit_to_width(fig)
    bottom = footer(fig, label)
    keep_inside(fig, bottom)
    describe(fig, takeaway)
    return fig


def keep_inside(fig, bottom: float = 0.0) -> None:
    """A tight layout above `bottom` (a fraction of the height) that leaves the PNG no wider than
    the figure: what sticks out past an axes' right end (a bar's value, an annotation) is
    brought in by narrowing the axes, rather than widening the image and shrinking every text."""
    left, right = 0.0, 1.0
    for _ in range(4):
        fig.tight_layout(rect=(left, bottom, right, 1))
        box, width = fig.get_tightbbox(_renderer(fig)), fig.get_figwidth()
        if box.x0 >= -0.02 and box.x1 <= width + 0.02:
            return
        left += max(-box.x0, 0) / width
        right -= max(box.x1 - width, 0) / width


# --- What a figure shows, for its alt text ---------------------------------------------------

_TAKEAWAYS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def describe(fig, takeaway: str) -> None:
    """Record the takeaway of `fig` (a sentence from the data) for its description, and make
    every PNG of it carry png_metadata (_carry_metadata)."""
    _TAKEAWAYS[fig] = " ".join(takeaway.split())
    _carry_metadata(fig)


def _carry_metadata(fig) -> None:
    """Every PNG written of `fig` carries png_metadata, whatever writes it: the inline backend's
    printer in a notebook kernel (IPython's print_figure, which calls the figure's canvas),
    savefig, `save`. The canvas's print_figure is wrapped, on this figure alone, to pass
    matplotlib the metadata; wrapping IPython's printer instead would be undone whenever the
    inline backend registers its own again."""
    canvas = fig.canvas
    if getattr(canvas.print_figure, "carries_metadata", False):
        return
    plain = canvas.print_figure

    def print_figure(filename, *args, **kwargs):
        fmt = kwargs.get("format") or (str(filename).rsplit(".", 1)[-1] if isinstance(filename, (str, Path)) else "png")
        if str(fmt).lower() == "png":
            kwargs["metadata"] = {**png_metadata(fig), **(kwargs.get("metadata") or {})}
        return plain(filename, *args, **kwargs)

    print_figure.carries_metadata = True
    canvas.print_figure = print_figure


def _one_line(text: str) -> str:
    return " ".join(text.split())


def description(fig) -> str:
    """What `fig` shows, in words: each panel's title, what is plotted against what (its axis
    labels), what its legend names, then the takeaway `describe` recorded."""
    panels = []
    for ax in fig.axes:
        if not ax.get_visible() or not ax.axison:
            continue
        title = _one_line(" ".join(t.get_text() for t in _titles(ax) if t.get_text()))
        x, y = _one_line(ax.get_xlabel()), _one_line(ax.get_ylabel())
        if not y and ax.get_yticklabels():
            names = [t.get_text() for t in ax.get_yticklabels() if any(c.isalpha() for c in t.get_text())]
            y = ", ".join(names[:8]) + (", …" if len(names) > 8 else "") if names else ""
        axes = "; ".join(f"{side} axis: {name}" for side, name in (("horizontal", x), ("vertical", y)) if name)
        legend = ax.get_legend()
        named = [_one_line(t.get_text()) for t in legend.get_texts()] if legend else []
        part = ": ".join(p for p in (title, axes) if p)
        if named:
            part += "; lines or bars: " + ", ".join(named)
        if part:
            panels.append(part)
    suptitle = _one_line(fig._suptitle.get_text()) if fig._suptitle is not None else ""
    shown = ". ".join(p for p in [suptitle, *panels] if p)
    return " ".join(p for p in ("Figure.", f"{shown}." if shown else "", _TAKEAWAYS.get(fig, "")) if p)


def smallest_text_px(fig) -> float:
    """The height of the smallest visible text of `fig`, in pixels of its PNG (font size × dpi / 72)."""
    sizes = [t.get_fontsize() for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip()]
    return min(sizes, default=0.0) * fig.dpi / 72


def png_metadata(fig) -> dict:
    """The text chunks a figure's PNG carries: its description and its smallest text's height."""
    return {DESCRIPTION_KEY: description(fig), SMALLEST_TEXT_KEY: f"{smallest_text_px(fig):.2f}"}


def save(fig, path) -> None:
    """Write `fig` as the book shows it (bbox tight), with png_metadata."""
    fig.savefig(path, bbox_inches="tight", metadata=png_metadata(fig), format="png")


def kind_legend(ax, kinds: set[str], below: float) -> None:
    """A legend of the kernel kinds in `kinds` (in KINDS' order, KIND_COLORS' colours), in rows
    of three centred under the axes, `below` axes-heights down."""
    shown = [k for k in KINDS if k in kinds]
    handles = [plt.Rectangle((0, 0), 1, 1, color=KIND_COLORS[k]) for k in shown]
    ax.legend(handles, shown, ncol=3, fontsize=10, loc="upper center", bbox_to_anchor=(0.5, -below), frameon=False)


def timeline(kernels: pd.DataFrame, label: str, title: str):
    """Kernels of a slice of the step as bars on a time axis: CPU launch calls above, GPU
    kernels below, coloured by kind. The white space between GPU bars is the GPU waiting."""
    t0 = min(
        kernels.start_ns.min(),
        kernels.launch_ns[kernels.launch_ns > 0].min() if (kernels.launch_ns > 0).any() else kernels.start_ns.min(),
    )
    fig, ax = plt.subplots(figsize=(WIDTH, 3.2))
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
    busy = (kernels.dur_ns.sum() / 1e3, ((kernels.start_ns + kernels.dur_ns).max() - t0) / 1e3)
    return finish(
        fig,
        label,
        f"{len(kernels)} kernels; the GPU runs kernels for {busy[0]:,.0f} of the {busy[1]:,.0f} µs shown, "
        "and the white space between its bars is the GPU waiting.",
    )


def hbars(
    labels,
    values,
    label: str,
    title: str,
    xlabel: str,
    colors=None,
    fmt="{:.2f}",
    width: float = WIDTH,
    annotate: bool = True,
):
    """Horizontal bars with their values written at the end, on a linear axis (a ratio of 200
    looks like one). At most WIDTH inches wide, whatever `width` asks."""
    labels, values = list(labels), list(values)
    fig, ax = plt.subplots(figsize=(min(width, WIDTH), 0.45 * len(labels) + 1.5))
    ax.barh(labels, values, color=colors or OURS)
    if annotate:
        for i, v in enumerate(values):
            if v == v:  # not NaN
                ax.text(v, i, " " + fmt.format(v), va="center", fontsize=10)
    ax.invert_yaxis()
    ax.set_xlim(0, max((v for v in values if v == v), default=1) * 1.25)
    ax.set_xlabel(xlabel)
    ax.set_title(title)
    ax.grid(axis="y", visible=False)
    known = [(v, n) for v, n in zip(values, labels, strict=True) if v == v]
    takeaway = ""
    if len(known) > 1:
        (lo, lo_name), (hi, hi_name) = min(known), max(known)
        takeaway = f"Largest: {hi_name}, {fmt.format(hi)}; smallest: {lo_name}, {fmt.format(lo)}."
    return finish(fig, label, takeaway)


# --- Prompt phase vs decode phase ------------------------------------------------------------

PHASE_COLORS = {"prefill": "#2a7f62", "decode": "#c0504d"}
