"""The static explorer: every panel rendered in the page, switched by inline JavaScript."""

import json
import re

import pandas as pd
import pytest

from labsupport import glue

pytestmark = pytest.mark.unit


def test_html_explorer_holds_every_panel_in_order_and_cannot_close_its_script():
    h = glue.html_explorer("batch sweep", "batch", {1: "<b>one</b>", 16: "sixteen </script><i>x</i>"}).data
    assert h.count("<script>") == 1 and h.count("</script>") == 1, "a panel cannot end the script early"
    keys = json.loads(re.search(r"const keys = (\[.*?\]);", h).group(1))
    panels = json.loads(re.search(r"const panels = (\[.*?\]);", h).group(1).replace("<\\/", "</"))
    assert keys == ["1", "16"] and panels == ["<b>one</b>", "sixteen </script><i>x</i>"]
    assert 'max="1"' in h and 'id="explorer-batch_sweep-panel"' in h
    assert "<b>one</b></div>" in h, "the first panel is shown before any script runs"
    assert "http" not in h, "nothing is fetched"


def test_html_explorer_needs_a_panel():
    with pytest.raises(ValueError):
        glue.html_explorer("x", "x", {})


def test_number_formats_for_reading():
    assert glue.number_format(pd.Series([2218, 1163])) == "{:,.0f}"
    assert glue.number_format(pd.Series([4.64, 0.0])) == "{:.2f}"
    assert glue.number_format(pd.Series([0.012, 0.4])) == "{:.3f}"
    assert glue.number_format(pd.Series([15.14, 31.2])) == "{:,.1f}"
    assert glue.number_format(pd.Series([1234.5, 999.9])) == "{:,.0f}"


def test_table_limits_rows_formats_numbers_and_links_the_csv():
    df = pd.DataFrame(
        {
            "name": [f"k{i}" for i in range(40)],
            "us": [4.640000 + i / 10 for i in range(40)],
            "kernels": [1000 * i for i in range(40)],
        }
    )
    h = glue.table(df, csv_href="../runs/x/1/t.csv", wrap=("name",)).data
    assert h.count("<tr>") == 16, "a header row and 15 rows"
    assert "4.640000" not in h and "4.64" in h and "14,000" in h
    assert "the first 15 of 40 rows" in h and 'href="../runs/x/1/t.csv"' in h
    assert "overflow-wrap: anywhere" in h and "index_name" not in h


def test_csv_download_carries_the_whole_table_in_the_link():
    import base64
    import io
    import re

    df = pd.DataFrame({"quantity": [f"q{i}" for i in range(19)], "prefill": [i / 3 for i in range(19)]})
    h = glue.csv_download(df, "a<b>.csv", "every <number>").data
    data = re.search(r'href="data:text/csv;base64,([^"]+)"', h).group(1)
    back = pd.read_csv(io.StringIO(base64.b64decode(data).decode()))
    pd.testing.assert_frame_equal(back, df)
    assert 'download="a&lt;b&gt;.csv"' in h and "every &lt;number&gt;" in h and "(19 rows, CSV)" in h


def test_glue_page_glues_each_field_by_its_name_text_as_markdown(monkeypatch):
    from dataclasses import dataclass, field

    glued = {}
    monkeypatch.setattr(glue, "glue", lambda name, value, display=False: glued.__setitem__(name, value))

    @dataclass
    class Page:
        best_text: str
        wall_ms: float
        frame: object = field(default=None, metadata={"glue": False})

    glue.glue_page(Page("<b>fast</b> `x<y`", 4.2, pd.DataFrame({"a": [1]})))
    assert set(glued) == {"best_text", "wall_ms"}, "a field marked glue=False is left to the display cells"
    assert glued["wall_ms"] == 4.2
    assert glued["best_text"].data == "&lt;b&gt;fast&lt;/b&gt; `x<y`", "text is markdown, escaped outside code"


def test_table_cells_name_their_columns_and_mark_text():
    """Every cell of glue.table carries its column's name (data-label, escaped), for the cards a
    phone shows (book/_static/book.css); only a column of words is marked `text` (it may break a
    long word on a wide screen), never one of numbers or of formatted number ranges."""
    df = pd.DataFrame(
        {
            "rung <i>": ["eager, as written", "CUDA graph"],
            "median (quartiles)": ["5.80 (5.79–5.81)", "4.30 (4.30–4.32)"],
            "ms": [28.1, 9.22],
        }
    )
    h = glue.table(df).data
    cells = re.findall(r'<td [^>]*class="data row(\d) col(\d)( text)?"[^>]*data-label="([^"]*)"', h)
    assert len(cells) == 6 == h.count("<td ")
    labels = {col: label for _, col, _, label in cells}
    assert labels == {"0": "rung &lt;i&gt;", "1": "median (quartiles)", "2": "ms"}
    assert {col for _, col, text, _ in cells if text} == {"0"}


def test_glue_figure_glues_the_described_png_and_leaves_the_cell_showing_nothing(monkeypatch):
    """A chapter's answer pastes its figure ({glue:figure}); the cell that draws it must show
    nothing (the figure appears once), and the glued PNG must carry the description that the
    book's alt text reads (book/_ext/figure_alt.py)."""
    import base64
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import myst_nb.ext.glue
    from IPython.core.interactiveshell import InteractiveShell
    from IPython.core.pylabtools import select_figure_formats
    from PIL import Image

    from labsupport import figures

    select_figure_formats(InteractiveShell.instance(), {"png"})  # as the notebook kernel's inline backend does
    shown = []
    monkeypatch.setattr(myst_nb.ext.glue, "ipy_display", lambda bundle, **kw: shown.append(bundle))
    fig, ax = plt.subplots()
    ax.plot([1, 2], [3, 4])
    ax.set_title("Tokens per second")
    figures.describe(fig, "memory sets the pace")
    glue.glue_figure("speed_fig", fig)
    (bundle,) = shown
    assert not [k for k in bundle if k.startswith("image/")], "the cell itself would show the figure"
    png = bundle["application/papermill.record/image/png"]
    with Image.open(io.BytesIO(png if isinstance(png, bytes) else base64.b64decode(png))) as im:
        im.load()
        assert "memory sets the pace" in im.text[figures.DESCRIPTION_KEY]
    assert fig.number not in plt.get_fignums(), "left open, the inline backend shows the figure again under its cell"


def test_failures_text_is_the_every_line_or_each_failure_in_one_sentence():
    assert (
        glue.failures_text([], "Every prompt length ran.", "Not every prompt length ran") == "Every prompt length ran."
    )
    said = glue.failures_text(["8 tokens: failed: out of memory", "16 tokens: not run"], "Every ran.", "Not every ran")
    assert said == "Not every ran: 8 tokens: failed: out of memory; 16 tokens: not run."


def test_no_prose_shows_a_text_field_of_its_page_through_glue_text():
    """glue.glue_page glues a Page's text as Markdown, for {glue:md}: {glue:text} would print the
    object's repr on the page ("<IPython.core.display.Markdown object>")."""
    import importlib

    from labsupport import chapters

    from .page_names import text_roles_on_markdown

    wrong = {}
    for ch in chapters.CHAPTERS:
        page = importlib.import_module(f"labsupport.chapters.{ch.slug.replace('-', '_')}").Page
        if names := text_roles_on_markdown(ch.notebook, page):
            wrong[ch.slug] = sorted(names)
    assert not wrong, f"use {{glue:md}} for these: {wrong}"
