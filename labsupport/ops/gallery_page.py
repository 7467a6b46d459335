"""The gallery page's tables: every gallery run beside the book's published run of its chapter,
one row per GPU and form (dtype, preset), each set against its own GPU's floor and ceilings
(labsupport.ops.gallery_row says what each number is).

A row is shown only if it passes gallery_row.problems, the check `gallery add` makes: a run
placed under runs/gallery/ by hand that fails it (a control character in a text, a number that
is not finite, numbers that contradict each other) is left out, with a line under its chapter's
table naming it and why. Every text reaches the HTML through run_text.to_html (escaped for where
it lands); the HTML is put on the page as it is (book/_ext/serve_gallery.py), never read by a
markup parser again.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from labsupport import chapters, runs
from labsupport.ops import gallery, gallery_row
from labsupport.ops.run_text import to_html

PUBLISHED = "the book's published run"
DOWNLOADS = "download/gallery"  # under the HTML folder


@dataclass
class Shown:
    """The rows the page shows, and a line for each run left out (keyed by chapter)."""

    rows: pd.DataFrame
    left_out: dict[str, list[str]] = field(default_factory=dict)


def gather(root: Path | None = None) -> Shown:
    """Every gallery run and, for each chapter that has one, the book's published run: those that
    pass gallery_row.problems as rows, the others as lines saying why they are left out."""
    root = root or runs.runs_root()
    found = gallery.entries(root)
    candidates = []
    published = runs.published(root)
    in_gallery = {(e.run.chapter, e.run.run_id) for e in found}
    for chapter in sorted({e.run.chapter for e in found}):
        if chapter in published and (chapter, published[chapter]) not in in_gallery:
            run = runs.load_run(chapters.by_slug(chapter), published[chapter], root)
            candidates.append(gallery_row.row(run, PUBLISHED, f"download/runs/{chapter}.zip"))
    for e in found:
        source = gallery_row.source(e.manifest.get("label"))
        candidates.append(gallery_row.row(e.run, source, f"{DOWNLOADS}/{download_name(e)}"))
    shown, left_out = [], {}
    for r in candidates:
        problems = gallery_row.problems(r)
        if problems:
            left_out.setdefault(r["chapter"], []).append(problems[0])
        else:
            shown.append(r)
    return Shown(pd.DataFrame(shown), left_out)


def rows(root: Path | None = None) -> pd.DataFrame:
    """The rows the page shows."""
    return gather(root).rows


def download_name(e: gallery.Entry) -> str:
    """The zip's file name: chapter, run id and GPU; a run id too long for one file name is
    replaced by its digest."""
    name = f"{e.run.chapter}-{e.run.run_id}-{e.gpu_slug}.zip"
    if len(name.encode()) <= gallery.MAX_NAME_BYTES:
        return name
    return f"{e.run.chapter}-{hashlib.sha256(e.run.run_id.encode()).hexdigest()[:20]}-{e.gpu_slug}.zip"


COLUMNS = ("GPU", "dtype", "preset", "source", "step", "step ms", "x floor", "GPU-busy", "kernels", "µs per kernel")


def _cell(col: str, v) -> str:
    if isinstance(v, float):
        if v != v:
            return "–"
        if col in ("GPU-busy", "matmul x bandwidth"):
            return f"{v:.0%}"
        return f"{v:,.0f}" if col == "kernels" else f"{v:.2f}"
    return to_html(v, col)


def _rows_html(g: pd.DataFrame, cols: list[str], prefix: str) -> list[str]:
    body = []
    for _, r in g.iterrows():
        cells = []
        for c in cols:
            if c == "download":
                cells.append(f'<td><a href="{to_html(prefix + r[c], c, attribute=True)}">zip</a></td>')
            elif c == "step ms" and r["timed by"]:
                cells.append(f"<td>{_cell(c, r[c])} <small>({to_html(r['timed by'], 'timed by')})</small></td>")
            elif c == "provenance":
                cells.append(f"<td>{to_html(gallery_row.provenance(r), c)}</td>")
            elif c == "x floor" and r[c] != r[c]:
                cells.append(f"<td>– <small>({to_html(r['datasheet'], 'datasheet')})</small></td>")
            else:
                cells.append(f"<td>{_cell(c, r.get(c, math.nan))}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return body


def html(shown: Shown, prefix: str = "../") -> str:
    """The page's tables, one per chapter, every text through run_text.to_html; under each, the
    runs of its chapter left out and why. `prefix` leads from the page to the HTML folder's root
    (downloads)."""
    df = shown.rows
    chapters = sorted(set(df.chapter if not df.empty else ()) | set(shown.left_out))
    if not chapters:
        return "<p>The gallery has no runs yet.</p>"
    parts = []
    for chapter in chapters:
        parts.append(f"<h2>{to_html(chapter, 'chapter')}</h2>")
        g = df[df.chapter == chapter] if not df.empty else df
        if len(g):
            cols = [*COLUMNS, *(["matmul x bandwidth"] if "matmul x bandwidth" in g else []), "provenance", "download"]
            head = "".join(f"<th>{to_html(c, 'column')}</th>" for c in cols)
            # .table-wrap (book/_static/book.css): a table wider than the screen scrolls in its box.
            parts.append(
                f"<div class='table-wrap'><table class='gallery'><thead><tr>{head}</tr></thead>"
                f"<tbody>{''.join(_rows_html(g, cols, prefix))}</tbody></table></div>"
            )
        for line in shown.left_out.get(chapter, []):
            parts.append(f"<p class='gallery-left-out'>Left out: {to_html(line, 'note')}</p>")
    return "\n".join(parts)
