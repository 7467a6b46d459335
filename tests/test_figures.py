"""Every figure the book draws is legible on a 390 px phone and at 1280 px: no text under
figures.MIN_TEXT_PX pixels high (9 px at 1280, legends included) as the book shows it
(labsupport.figures.text_heights_px), no
tick label in scientific notation (6×10⁰) on a log axis, and every bar on a log axis labelled
with its value. The figures are the ones each chapter notebook draws in the session's book
build (replay mode on the published runs): tests/figure_probe.py checks them in the build's
notebook kernels, after each cell, so no chapter is executed again here."""

import matplotlib.pyplot as plt
import nbformat
import pytest

from labsupport import chapters, figures

from .figure_probe import problems

pytestmark = pytest.mark.unit


def code_first_lines(path) -> list[str]:
    cells = nbformat.read(path, as_version=4).cells
    return [(c.source.splitlines() or [""])[0] for c in cells if c.cell_type == "code"]


@pytest.mark.book
@pytest.mark.parametrize("chapter", chapters.CHAPTERS, ids=lambda c: c.slug)
def test_every_figure_of_the_chapter_is_legible(chapter, book_figures):
    expected = code_first_lines(chapter.path)
    seen = [r for r in book_figures if [c for c in r["cells"] if c] == [c for c in expected if c]]
    assert len(seen) == 1, f"the figure probe saw {len(seen)} kernels run {chapter.path.name}"
    record = seen[0]
    assert not record["errors"], "\n".join(record["errors"])
    assert record["figures"] > 0, "the probe saw no figure of the chapter"
    assert not record["problems"], "\n".join(record["problems"])


@pytest.mark.book
@pytest.mark.parametrize("chapter", chapters.CHAPTERS, ids=lambda c: c.slug)
def test_a_replay_loads_neither_torch_nor_transformers(chapter, book_figures):
    """The book's build replays every chapter: torch, transformers and Triton are imported only
    in live mode (the notebooks' `if mode == "live"` imports; labsupport imports them where they
    are used), which keeps each replay to a few seconds."""
    expected = [c for c in code_first_lines(chapter.path) if c]
    (record,) = [r for r in book_figures if [c for c in r["cells"] if c] == expected]
    assert record["loaded"] == [], f"{chapter.path.name} in replay loaded {record['loaded']}"


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
