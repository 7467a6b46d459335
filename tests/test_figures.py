"""Every figure the book draws is legible on a 390 px phone and at 1280 px: no text under
figures.MIN_TEXT_PX pixels high (7 px at 390, 9 px at 1280, legends included) as the book shows
it (labsupport.figures.text_heights_px), no
tick label in scientific notation (6×10⁰) on a log axis, and every bar on a log axis labelled
with its value. The figures are the ones each chapter notebook draws in the session's book
build (replay mode on the published runs): tests/figure_probe.py checks them in the build's
notebook kernels, after each cell, so no chapter is executed again here. The unit tests below
check the generic figures and what makes them fit (labsupport.figures.finish), the description
and text size each PNG carries, and book/_ext/figure_alt.py, which turns them into the page's
alt text and a link to the full-size image."""

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


# --- Figures drawn for the phone, and what they carry for the book --------------------------

LABEL = "NVIDIA H200 · run 20261130T143702Z-h200 · 2026-12-01 · torch 2.11.0+cu128"


def kernels_frame(n: int = 30):
    import pandas as pd

    kinds = ["matrix multiply", "elementwise", "attention", "reduction"]
    return pd.DataFrame(
        {
            "start_ns": [i * 5_000 for i in range(n)],
            "dur_ns": [3_000] * n,
            "launch_ns": [i * 5_000 - 2_000 for i in range(n)],
            "launch_dur_ns": [1_500] * n,
            "kind": [kinds[i % len(kinds)] for i in range(n)],
        }
    )


@pytest.mark.parametrize("draw", ["hbars", "timeline"])
def test_the_generic_figures_are_legible_on_a_phone(draw):
    """At 390 px no text of the generic figures is under 7 px (figures.MIN_TEXT_PX), with a long
    title, long labels and a long provenance footer, and the PNG is no wider than the figure."""
    if draw == "hbars":
        names = ["eager, dynamic cache (as written)", "CUDA graph of the static-cache step", "torch.compile"]
        fig = figures.hbars(
            names, [31.2, 12.4, 9.87], LABEL, "Time per token of each form of the step, at batch one", "ms per token"
        )
    else:
        fig = figures.timeline(kernels_frame(), LABEL, "Decoder layer 18: CPU launches and GPU kernels (profiled)")
    assert not problems(draw, fig)
    assert figures.text_heights_px(fig, 390)[0][0] >= 7
    assert fig.get_tightbbox().width <= fig.get_figwidth() + 0.05
    plt.close(fig)


def test_finish_keeps_a_value_label_inside_the_figure():
    """A bar's value written past the axes' end widens the PNG and shrinks every text (a tight
    layout alone leaves it out): finish narrows the axes instead (figures.keep_inside)."""
    fig, ax = plt.subplots(figsize=(figures.WIDTH, 2.5))
    names = ["reached by the matrix multiplies", "read stream measured on this GPU", "H200 SXM datasheet"]
    values = [3.21, 4.19, 4.80]
    ax.barh(names, values)
    for i, v in enumerate(values):
        ax.text(v, i, f" {v:.2f} TB/s", va="center", fontsize=10)
    ax.set_title("Memory bandwidth: reached by the matrix multiplies vs the limits")
    figures.finish(fig, LABEL)
    assert fig.get_tightbbox().x1 <= fig.get_figwidth() + 0.05
    assert figures.text_heights_px(fig, 390)[0][0] >= figures.MIN_TEXT_PX[390]
    plt.close(fig)


def test_finish_fits_titles_and_legends_to_the_width():
    """A title wider than its axes is wrapped; a legend wider than the figure loses columns."""
    fig, ax = plt.subplots(figsize=(figures.WIDTH, 3))
    for i in range(4):
        ax.plot([1, 2], [i, i + 1], label=f"a rather long name for line number {i}")
    ax.set_title("A title far too long to stand on one line of a figure drawn for a phone's screen")
    ax.legend(ncol=4, loc="upper center", bbox_to_anchor=(0.5, -0.2))
    figures.finish(fig, LABEL)
    assert "\n" in ax.get_title()
    assert ax.get_legend()._ncols < 4
    assert fig.get_tightbbox().width <= fig.get_figwidth() + 0.05
    plt.close(fig)


def test_the_description_says_what_the_figure_shows():
    fig = figures.hbars(["eager", "CUDA graph"], [30.0, 12.0], LABEL, "Time per token", "ms per token")
    text = figures.description(fig)
    assert text.startswith("Figure. Time per token")
    assert "horizontal axis: ms per token" in text and "eager, CUDA graph" in text
    assert "Largest: eager, 30.00; smallest: CUDA graph, 12.00." in text
    assert "/" not in text and ".png" not in text
    plt.close(fig)


def test_a_displayed_figure_png_carries_its_description():
    """A figure a notebook cell shows is written by the inline backend's printer, IPython's
    print_figure, registered for every figure; the PNG it writes of a finished figure carries the
    description and the smallest text's height as text chunks (book/_ext/figure_alt.py and the
    browser test read them), and so does savefig's."""
    import base64
    import functools
    import io

    from IPython.core.formatters import PNGFormatter
    from IPython.core.pylabtools import print_figure
    from matplotlib.figure import Figure
    from PIL import Image

    png = PNGFormatter()
    png.for_type(Figure, functools.partial(print_figure, fmt="png", base64=True))  # as matplotlib-inline does
    fig = figures.hbars(["eager", "CUDA graph"], [30.0, 12.0], LABEL, "Time per token", "ms per token")
    for data in (base64.b64decode(png(fig)), _saved(fig)):
        image = Image.open(io.BytesIO(data))
        image.load()
        assert image.text[figures.DESCRIPTION_KEY] == figures.description(fig)
        assert float(image.text[figures.SMALLEST_TEXT_KEY]) == pytest.approx(10 * fig.dpi / 72, abs=0.01)
    plt.close(fig)


def _saved(fig) -> bytes:
    import io

    out = io.BytesIO()
    fig.savefig(out, format="png")
    return out.getvalue()


def _figure_alt_extension():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "book" / "_ext" / "figure_alt.py"
    spec = importlib.util.spec_from_file_location("figure_alt", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_book_gives_each_figure_its_description_and_a_full_size_link(tmp_path):
    """book/_ext/figure_alt.py: an output image whose PNG carries a description gets it as alt
    text, and every PNG image is wrapped in a link to its file under _images/."""
    from types import SimpleNamespace

    from docutils import nodes

    ext = _figure_alt_extension()
    fig = figures.hbars(["eager", "CUDA graph"], [30.0, 12.0], LABEL, "Time per token", "ms per token")
    (tmp_path / "out").mkdir()
    figures.save(fig, tmp_path / "out" / "described.png")
    plt.imsave(tmp_path / "out" / "plain.png", [[0.0, 1.0]])
    assert ext.png_description(tmp_path / "out" / "described.png") == figures.description(fig)
    assert ext.png_description(tmp_path / "out" / "plain.png") is None
    doctree = nodes.section()
    described, plain = nodes.image(uri="out/described.png"), nodes.image(uri="out/plain.png")
    doctree += [nodes.paragraph("", "", described), nodes.paragraph("", "", plain)]
    app = SimpleNamespace(
        srcdir=str(tmp_path),
        builder=SimpleNamespace(format="html", get_target_uri=lambda doc: f"{doc}.html"),
        env=SimpleNamespace(images={"out/described.png": ({"x"}, "d1.png"), "out/plain.png": ({"x"}, "p1.png")}),
    )
    ext._describe_and_link(app, doctree, "notebooks/chapter")
    assert described["alt"] == figures.description(fig)
    assert "alt" not in plain  # no description: the browser test fails on it
    links = [image.parent for image in (described, plain)]
    assert [link["refuri"] for link in links] == ["../_images/d1.png", "../_images/p1.png"]
    assert all(isinstance(link, nodes.reference) for link in links)
    plt.close(fig)
