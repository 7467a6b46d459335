"""Putting run data into the book's prose with myst-nb's `glue`, and into its tables.

Tables (`table`, and `styled` for a Styler of one's own) escape HTML in their cells and
headers: a kernel or op name such as `<img onerror=...>` recorded in a run shows as text, never
as a tag. Markdown glued from run data is escaped the same way outside its code spans. Importing
this module changes nothing in pandas.
"""

from __future__ import annotations

import html
import re

import pandas as pd


def styled(df: pd.DataFrame, formats=None, **format_kw):
    """`df.style`, escaping HTML in every cell and in the index and column labels, with `formats`
    (and `na_rep`, `subset`, ... as Styler.format takes them) applied, escaped too. Every cell is
    escaped first, then the formats applied to the cells they name (a format of some columns, or
    of a `subset`, leaves the others escaped); a later .format() of the caller's would reset the
    columns it touches to unescaped text, so pass formats here instead."""
    styler = df.style.format(escape="html")
    if formats is not None or format_kw:
        styler = styler.format(formats, escape="html", **format_kw)
    return styler.format_index(escape="html", axis=0).format_index(escape="html", axis=1)


_CODE_SPAN = re.compile(r"(`+)(.+?)\1", re.S)


def md_safe(text: str) -> str:
    """Markdown with `<`, `>` and `&` escaped outside code spans (inside them markdown shows
    HTML as text already): markdown formatting stays, HTML from run data does not render."""
    out, pos = [], 0
    for m in _CODE_SPAN.finditer(text):
        out += [html.escape(text[pos : m.start()], quote=False), m.group(0)]
        pos = m.end()
    out.append(html.escape(text[pos:], quote=False))
    return "".join(out)


def glue(name: str, value, display: bool = False) -> None:
    """myst_nb.glue, when myst-nb is installed (the book build).

    A GPU box that only runs the notebooks live (papermill, no Sphinx) need not carry
    myst-nb and its Sphinx dependencies; there the values are simply not glued, which
    only the book build reads.
    """
    try:
        import myst_nb
    except ImportError:
        return
    if type(value).__module__ == "numpy" and hasattr(value, "item"):
        value = value.item()  # np.float64 would be shown as 'np.float64(...)', unformattable
    myst_nb.glue(name, value, display=display)


def glue_figure(name: str, fig) -> None:
    """Glue a figure for a `{glue:figure}` directive, and close it so that its cell shows nothing:
    the page shows the figure once, where the prose pastes it (a chapter's answer, above the cell
    that draws it). Its PNG carries the figure's description (labsupport.figures.describe), which
    the book's alt text reads. Without myst-nb (a live run on a GPU box) the cell shows it."""
    try:
        import myst_nb
    except ImportError:
        return
    import matplotlib.pyplot as plt

    myst_nb.glue(name, fig, display=False)
    plt.close(fig)


def glue_all(values: dict, prefix: str = "") -> None:
    """Glue every value of a dict under `prefix + key`."""
    for key, value in values.items():
        glue(prefix + key, value)


def glue_text(name: str, text: str) -> None:
    """Glue a string for `{glue:md}` (plain `{glue}` would show it with quotes); HTML in it is
    escaped (md_safe)."""
    from IPython.display import Markdown

    glue(name, Markdown(md_safe(text)))


# A Page field's metadata for a table or frame its display cells show: glue_page leaves it out.
NOT_GLUED = {"glue": False}


def failures_text(failures: list[str], every: str, not_every: str) -> str:
    """The line over a table whose rows may have failed: `every` when none did, else `not_every`
    followed by each failure (`what: why`), as one sentence."""
    return every if not failures else f"{not_every}: {'; '.join(failures)}."


def glue_page(page) -> None:
    """Glue every field of a chapter's `Page` (a dataclass whose field names are the page's glue names):
    text as markdown for `{glue:md}` (escaped, glue_text), any other value as it is. A field whose
    metadata says {"glue": False} (a table or frame the page's display cells show) is not glued."""
    import dataclasses

    for f in dataclasses.fields(page):
        if not f.metadata.get("glue", True):
            continue
        value = getattr(page, f.name)
        if isinstance(value, str):
            glue_text(f.name, value)
        else:
            glue(f.name, value)


def perfetto_link(href: str, title: str) -> str:
    """An "Open in Perfetto" link (HTML) for the trace served at `href`, relative to the page:
    book/_static/perfetto.js fetches the trace and posts it to a ui.perfetto.dev window it
    opens. Without the script the link opens Perfetto empty, to load the downloaded file."""
    return (
        f'<a class="perfetto-open" href="https://ui.perfetto.dev" data-trace="{html.escape(href)}" '
        f'data-title="{html.escape(title)}" target="_blank" rel="opener">Open in Perfetto</a>'
    )


def trace_download(run, name: str):
    """The download link for a raw profiler trace, with how to open it (and a link that opens
    it in Perfetto at once)."""
    from IPython.display import HTML

    run.file(name)
    href = f"../runs/{run.chapter}/{run.run_id}/{name}"
    size = run.file(name).stat().st_size
    size = f"{size / 1e6:.1f} MB" if size >= 1e5 else f"{size / 1e3:.0f} kB"
    return HTML(
        f'<p class="trace-download">Raw profiler trace behind this figure: '
        f'<a href="{html.escape(href)}" download><code>{html.escape(name)}</code></a> '
        f"({size}, run {html.escape(run.run_id)}): "
        f"{perfetto_link(href, f'{name} ({run.chapter}, run {run.run_id})')}. "
        f'Or open the downloaded file in <a href="https://ui.perfetto.dev">Perfetto</a> (Open trace file) or '
        f"in Chrome at <code>chrome://tracing</code> (Load); both read the compressed file as it is.</p>"
    )


def html_explorer(name: str, label: str, panels: dict) -> object:
    """An explorer that works in the static book: a slider over the keys of `panels` (in
    order) showing the HTML panel of the chosen key. Every panel is rendered here, from the
    recorded run, and the page switches between them with a few lines of inline JavaScript:
    nothing is fetched, so the page works offline. (ipywidgets need a live kernel; the live
    notebook can keep them beside this.)"""
    import json

    from IPython.display import HTML

    if not panels:
        raise ValueError("an explorer needs at least one panel")
    ident = re.sub(r"[^A-Za-z0-9_]", "_", name)
    keys = [str(k) for k in panels]
    bodies = json.dumps([str(v) for v in panels.values()]).replace("</", "<\\/")
    return HTML(
        f'<div class="explorer" id="explorer-{ident}">'
        f'<label for="explorer-{ident}-range">{html.escape(label)} '
        f'<output id="explorer-{ident}-key">{html.escape(keys[0])}</output></label><br>'
        f'<input type="range" id="explorer-{ident}-range" min="0" max="{len(keys) - 1}" step="1" value="0" '
        f'style="width: min(100%, 28em)">'
        f'<div id="explorer-{ident}-panel" aria-live="polite">{list(panels.values())[0]}</div>'
        "<script>(function () {"
        f"const keys = {json.dumps(keys)}; const panels = {bodies};"
        f'const r = document.getElementById("explorer-{ident}-range");'
        f'const k = document.getElementById("explorer-{ident}-key");'
        f'const p = document.getElementById("explorer-{ident}-panel");'
        'r.addEventListener("input", function () { k.textContent = keys[r.value]; p.innerHTML = panels[r.value]; });'
        "})();</script></div>"
    )


def number_format(values: pd.Series) -> str:
    """A format for a column of numbers, chosen for reading: integers with thousands
    separators; other numbers with about three significant digits at their typical size."""
    v = pd.to_numeric(values, errors="coerce").dropna()
    if v.empty:
        return "{}"
    if (v == v.round()).all() and v.abs().max() >= 1:
        return "{:,.0f}"
    typical = v.abs().median()
    if typical >= 100:
        return "{:,.0f}"
    if typical >= 10:
        return "{:,.1f}"
    if typical >= 1:
        return "{:.2f}"
    return "{:.3f}"


WORD = r"[A-Za-z_]{4}"  # a column with a word in it holds text (a name); "5.80 (5.79-5.81)" does not
_DATA_CELL = re.compile(r'<td\b([^>]*)\bclass="(data row\d+ col(\d+))"([^>]*?)\s*>')


def labelled_cells(table_html: str, columns, text_columns=()) -> str:
    """A Styler's table with every data cell carrying its column's name (`data-label`, escaped),
    and the cells of `text_columns` (positions) the class `text`: on a narrow screen
    book/_static/book.css shows each row as a card of "name value" lines, so that a table of many
    columns needs no sideways scrolling; on a wide one a text cell may break a long word, a
    number never."""
    multi = isinstance(columns, pd.MultiIndex)
    names = [html.escape(" / ".join(map(str, c)) if multi else str(c)) for c in columns]

    def label(m):
        col = int(m.group(3))
        classes = m.group(2) + (" text" if col in text_columns else "")
        return f'<td{m.group(1)}class="{classes}"{m.group(4)} data-label="{names[col]}">'

    return _DATA_CELL.sub(label, table_html)


def table(
    df: pd.DataFrame, formats: dict | None = None, max_rows: int = 15, csv_href: str | None = None, wrap: tuple = ()
):
    """A table for the page: the index hidden, numbers formatted for reading (number_format,
    unless `formats` names a column's format), missing values as a dash, the text of the
    `wrap` columns allowed to break, and at most `max_rows` rows, with a line saying how many
    more the full table (linked as CSV at `csv_href`) holds. Every cell names its column
    (labelled_cells), for the stacked layout a narrow screen shows."""
    from IPython.display import HTML

    shown = df.head(max_rows)
    fmt = {c: number_format(shown[c]) for c in shown.columns if pd.api.types.is_numeric_dtype(shown[c])}
    fmt.update(formats or {})
    styler = styled(shown, fmt, na_rep="–").hide(axis="index")
    for c in wrap:
        styler = styler.set_properties(
            subset=[c], **{"white-space": "normal", "overflow-wrap": "anywhere", "min-width": "8em"}
        )
    words = [c for c in shown.columns if c not in fmt and shown[c].astype(str).str.contains(WORD).any()]
    text = [i for i, c in enumerate(shown.columns) if c in words]
    out = labelled_cells(styler.set_table_attributes('class="book-table"').to_html(), shown.columns, text)
    parts = []
    if len(df) > max_rows:
        parts.append(f"the first {max_rows} of {len(df):,d} rows")
    if csv_href:
        parts.append(f'<a href="{html.escape(csv_href)}" download>the full table as CSV</a>')
    if parts:
        out += f'<p class="table-note">{"; ".join(parts)}</p>'
    return HTML(f'<div class="table-wrap">{out}</div>')


def run_csv_href(run, name: str) -> str:
    """Where a chapter page finds a table of the run it shows (book/_ext/serve_runs.py)."""
    run.file(name)
    return f"../runs/{run.chapter}/{run.run_id}/{name}"


def csv_download(df: pd.DataFrame, filename: str, text: str):
    """A line under a table with a link that downloads `df` as a CSV file, the data carried in
    the link itself (for a table computed from the run, which no run file holds)."""
    import base64

    from IPython.display import HTML

    data = base64.b64encode(df.to_csv(index=False).encode()).decode()
    return HTML(
        f'<p class="table-note"><a href="data:text/csv;base64,{data}" download="{html.escape(filename)}">'
        f"{html.escape(text)}</a> ({len(df)} rows, CSV)</p>"
    )
