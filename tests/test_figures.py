"""Every figure the book draws is legible on a 390 px phone and at 1280 px: no text under
figures.MIN_TEXT_PX pixels high (9 px at 1280, legends included) as the book shows it
(labsupport.figures.text_heights_px), no
tick label in scientific notation (6×10⁰) on a log axis, and every bar on a log axis labelled
with its value. The figures are the ones each chapter notebook draws, its cells executed in
this process in replay mode on the chapter's fixture run (as papermill would run them)."""

import matplotlib.pyplot as plt
import nbformat
import pytest
from matplotlib.container import BarContainer

from labsupport import chapters, figures

from .conftest import FIXTURES

WITH_FIXTURE = [c for c in chapters.CHAPTERS if (FIXTURES / c.slug).is_dir()]


def drawn_figures(chapter, monkeypatch) -> list[tuple[str, object]]:
    """Execute the chapter notebook's code cells in replay mode on its fixture run; return each
    figure drawn, named by the first line of the cell that drew it."""
    monkeypatch.setenv("LABSUPPORT_RUNS", str(FIXTURES))
    monkeypatch.chdir(chapter.path.parent)
    run_id = sorted(p.name for p in (FIXTURES / chapter.slug).iterdir() if p.is_dir())[-1]
    ns = {"mode": "replay"}
    drawn = []
    plt.close("all")
    for cell in nbformat.read(chapter.path, as_version=4).cells:
        if cell.cell_type != "code":
            continue
        exec(compile(cell.source, f"<{chapter.path.name} cell>", "exec"), ns)
        if "parameters" in cell.metadata.get("tags", []):
            ns["run_id"] = run_id
        for n in plt.get_fignums():
            drawn.append((cell.source.splitlines()[0], plt.figure(n)))
        plt.close("all")  # the figures stay usable; pyplot only forgets them
    return drawn


def problems(name: str, fig) -> list[str]:
    found = []
    for page in (390, 1280):
        px, text = figures.text_heights_px(fig, page)[0]
        if px < figures.MIN_TEXT_PX[page]:
            found.append(f"{name}: at {page} px the text {text[:40]!r} is {px:.1f} px high")
    for ax in fig.axes:
        for axis, scale in (("x", ax.get_xscale()), ("y", ax.get_yscale())):
            if scale != "log":
                continue
            labels = ax.get_xticklabels() if axis == "x" else ax.get_yticklabels()
            sci = [t.get_text() for t in labels if "$" in t.get_text() or "^" in t.get_text()]
            if sci:
                found.append(f"{name}: {axis} tick labels in scientific notation: {sci[:3]}")
            bars = [
                b
                for c in ax.containers
                if isinstance(c, BarContainer)
                for b in c
                if (b.get_width() if axis == "x" else b.get_height()) > 0
            ]
            if bars and len(ax.texts) < len(bars):
                found.append(f"{name}: {len(bars)} bars on a log {axis} axis, {len(ax.texts)} value labels")
    return found


@pytest.mark.parametrize("chapter", WITH_FIXTURE, ids=lambda c: c.slug)
def test_every_figure_of_the_chapter_is_legible(chapter, monkeypatch):
    drawn = drawn_figures(chapter, monkeypatch)
    found = [p for name, fig in drawn for p in problems(name, fig)]
    assert not found, "\n".join(found)


def test_the_status_history_figure_is_legible():
    from labsupport.ops import status

    fig = status.history_figure("runs/history.csv")
    assert not problems("history", fig)
    plt.close(fig)


def test_the_measure_catches_a_figure_too_wide_for_its_text():
    """A 12-inch figure with 8 pt ticks: at 1280 px its ticks would be about 6 px high."""
    fig, ax = plt.subplots(figsize=(12, 3))
    ax.plot([1, 10, 100], [1, 2, 3])
    ax.tick_params(labelsize=8)
    ax.set_xscale("log")
    found = problems("wide", fig)
    assert any("at 1280 px" in p for p in found)
    assert any("scientific notation" in p for p in found)  # matplotlib's own log ticks: 10^0
    px = figures.text_heights_px(fig, 390)[0][0]
    natural = fig.get_tightbbox().padded(0.1).width * fig.dpi
    assert px == pytest.approx(8 * fig.dpi / 72 * figures.COLUMN_PX[390] / natural, rel=1e-6)
    figures.plain_ticks(ax, "x")
    assert not any("scientific" in p for p in problems("wide", fig))
    plt.close(fig)
