"""Text from a run never leaves the place it is shown in.

Every text field of a packed run that the gallery page shows (the GPU's name, the versions, the
commit, the date, the clocks, the dtype and preset, the label, a step's name) is fed markup and
line breaks: MyST fences and directives, a <script>, a </table>, U+2028 and U+2029.
`gallery add` refuses each such run in one line and writes nothing. Placed under runs/gallery/
by hand (past `add`), the gallery page is built by Sphinx with the book's own extension
(book/_ext/serve_gallery.py) and opened in headless Chromium: no script ran, no heading was
added, no file was included, the table kept its rows and cells, and a run whose text holds a
line break is left out with a line saying why. The same build with the refusal switched off
shows what the second layer does alone: the text stays inside its cell.
"""

from __future__ import annotations

import csv
import io
import json
import os
import shutil
import subprocess
import sys
import unicodedata

import pytest

from labsupport.ops import gallery, pack, run_text

from .conftest import FIXTURES, REPO, tree_bytes
from .test_browser import browser  # noqa: F401 (the module's Chromium, skipped or failed as there)
from .test_gallery import members, resealed, write

pytestmark = pytest.mark.unit

CHAPTER = "launch-overhead"
PAYLOADS = (
    "\n```",
    "{raw} html",
    "{literalinclude} ../../secret.txt",
    "<script>document.title='XSS'</script>",
    "</table>",
    "\u2028",
    "\u2029",
)
SECRET = "TOP-SECRET-FILE-CONTENT"
# A payload that breaks out of a MyST fence: a heading, a file outside the book, and a raw script.
BREAKOUT = (
    "H200\n```\n\n# Injected heading\n\n```{literalinclude} ../../secret.txt\n```\n\n"
    "```{raw} html\n<script>document.title='XSS'</script>\n```\n"
)
PRINTABLE = "```{raw} html <script>document.title='XSS'</script></table><td>cell</td> {literalinclude} ../../secret.txt"
# Every text field the page shows: where it is recorded, and its key.
FIELDS = [
    *(("provenance", k) for k in ("gpu", "torch", "cuda", "driver", "git_commit", "utc_time")),
    *(("provenance", k) for k in ("nvidia_smi_clocks_max_sm", "nvidia_smi_power_limit")),
    ("parameters", "dtype"),
    ("parameters", "preset"),
    ("pack", "label"),
    ("table", "variant"),
]

SHOWN_AS = {"gpu": "GPU", "label": "source", "variant": "step"}  # the page's name where it has its own


def _refused(text: str) -> bool:
    return any(unicodedata.category(c) in run_text.REFUSED_CATEGORIES for c in text)


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    """A packed launch-overhead run, as its archive's members, with the clocks recorded."""
    tmp = tmp_path_factory.mktemp("packed")
    run_id = sorted(p.name for p in (FIXTURES / CHAPTER).iterdir())[-1]
    shutil.copytree(FIXTURES / CHAPTER / run_id, tmp / "src" / CHAPTER / run_id)
    (tmp / "src" / "published.json").write_text(json.dumps({CHAPTER: run_id}))
    archive, _ = pack.pack(CHAPTER, root=tmp / "src", out_dir=tmp)
    return members(archive), run_id


def poisoned(files: dict, run_id: str, fields, text: str) -> dict:
    """`files` with `text` put into each of `fields` (first, so that a field the page cuts short
    shows it), both manifests resealed to match: a well-formed lie."""
    meta = json.loads(files[f"{run_id}/meta.json"])
    man = json.loads(files[f"{run_id}/pack.json"])
    table = None
    for where, key in fields:
        if where in ("provenance", "parameters"):
            meta[where][key] = text + str(meta[where].get(key, ""))
        elif where == "pack":
            man[key] = text
        else:
            rows = list(csv.DictReader(io.StringIO(files[f"{run_id}/variants.csv"].decode())))
            for r in rows:  # every variant's name: whichever is fastest shows as the run's step
                r[key] = text + r[key]
            out = io.StringIO()
            w = csv.DictWriter(out, fieldnames=list(rows[0]), lineterminator="\n")
            w.writeheader()
            w.writerows(rows)
            table = out.getvalue().encode()
    files = {**files, f"{run_id}/pack.json": json.dumps(man).encode()}
    if table is not None:
        files = resealed(files, run_id, "variants.csv", table)
        meta["files"] = json.loads(files[f"{run_id}/meta.json"])["files"]
    return resealed(files, run_id, "meta.json", json.dumps(meta).encode())


def _scratch(tmp_path):
    dst = tmp_path / "runs"
    dst.mkdir()
    (dst / "published.json").write_text("{}")
    return dst


@pytest.fixture
def quick(monkeypatch):
    """`add` without validate.check_run (its checks are tested in test_gallery.py; each takes
    seconds on this run's traces): what is left to refuse a field is the page's own check."""
    from labsupport.ops import validate

    monkeypatch.setattr(validate, "check_run", lambda ch, run, *a: [])


@pytest.mark.parametrize("field", FIELDS, ids=lambda f: f"{f[0]}.{f[1]}")
def test_add_refuses_markup_and_line_breaks_in_every_text_field(packed, tmp_path, quick, field):
    files, run_id = packed
    dst = _scratch(tmp_path)
    archive = write(tmp_path / "x.tar.gz", poisoned(files, run_id, [field], "".join(PAYLOADS)))
    before = tree_bytes(dst)
    with pytest.raises(gallery.GalleryError) as e:
        gallery.add(archive, dst)
    assert "\n" not in str(e.value) and "\u2028" not in str(e.value), str(e.value)
    assert f"{SHOWN_AS.get(field[1], field[1])} holds a control character (U+000A)" in str(e.value), str(e.value)
    assert tree_bytes(dst) == before and not (dst / "gallery").exists()


@pytest.mark.parametrize("payload", [p for p in PAYLOADS if _refused(p)], ids=ascii)
def test_add_refuses_each_line_break_naming_the_field(packed, tmp_path, quick, payload):
    files, run_id = packed
    dst = _scratch(tmp_path)
    with pytest.raises(gallery.GalleryError, match=r"GPU holds a (control character|line separator|paragraph)"):
        gallery.add(write(tmp_path / "x.tar.gz", poisoned(files, run_id, [("provenance", "gpu")], payload)), dst)
    assert not (dst / "gallery").exists()


def test_the_command_refuses_a_run_poisoned_everywhere_in_one_line(packed, tmp_path):
    files, run_id = packed
    dst = _scratch(tmp_path)
    archive = write(tmp_path / "x.tar.gz", poisoned(files, run_id, FIELDS, BREAKOUT))
    before = tree_bytes(tmp_path)
    r = subprocess.run(
        [sys.executable, "-m", "labsupport", "gallery", "add", str(archive)],
        env={**os.environ, "LABSUPPORT_RUNS": str(dst), "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    err = r.stderr.strip().splitlines()
    assert r.returncode == 1 and len(err) == 1 and "Traceback" not in r.stderr, r.stderr
    assert err[0].endswith("nothing was written") and tree_bytes(tmp_path) == before


def test_printable_markup_is_accepted_and_shown_as_text(packed, tmp_path, quick):
    """Markup without a line break is text: `add` files it, and the page escapes it."""
    from labsupport.ops import gallery_page

    files, run_id = packed
    dst = _scratch(tmp_path)
    fields = [("provenance", "gpu"), ("provenance", "torch"), ("pack", "label"), ("table", "variant")]
    gallery.add(write(tmp_path / "x.tar.gz", poisoned(files, run_id, fields, PRINTABLE)), dst)
    page = gallery_page.html(gallery_page.gather(dst))
    assert "<script>" not in page and "</table><td>" not in page and "&lt;/table&gt;&lt;td&gt;" in page
    assert page.count("<tr>") == 2 and page.count("<table") == 1


# --- the page, built by Sphinx with the book's extension, in Chromium ---------------------------


def _place(dst, files: dict, run_id: str, slug: str) -> None:
    """A run put under runs/gallery/<slug>/ by hand: `add` never saw it."""
    folder = dst / "gallery" / slug / CHAPTER / run_id
    folder.mkdir(parents=True)
    for name, data in files.items():
        (folder / name.split("/", 1)[1]).write_bytes(data)


def _build(tmp_path, dst, refusal: bool, monkeypatch) -> str:
    """book/gallery.md built alone by Sphinx (in this process, so that the refusal can be
    switched off) with MyST and book/_ext/serve_gallery.py; the HTML page's path."""
    from sphinx.application import Sphinx

    src = tmp_path / "site"
    (src / "book").mkdir(parents=True)
    shutil.copy(REPO / "book" / "gallery.md", src / "book" / "gallery.md")
    (src / "conf.py").write_text(
        "extensions = ['myst_parser', 'serve_gallery']\nroot_doc = 'book/gallery'\nhtml_theme = 'basic'\n"
    )
    (tmp_path / "secret.txt").write_text(SECRET)  # ../../secret.txt from site/book/gallery.md
    monkeypatch.setenv("LABSUPPORT_RUNS", str(dst))
    monkeypatch.syspath_prepend(str(REPO / "book" / "_ext"))
    if not refusal:
        monkeypatch.setattr(run_text, "checked", lambda value, field: str(value))
    app = Sphinx(str(src), str(src), str(tmp_path / "html"), str(tmp_path / "doctrees"), "html", status=None)
    app.build(force_all=True)
    page = tmp_path / "html" / "book" / "gallery.html"
    assert page.is_file()
    return page


PAGE_FACTS = """() => ({
  title: document.title,
  h1: Array.from(document.querySelectorAll('h1')).map(h => h.innerText),
  h2: Array.from(document.querySelectorAll('h2')).map(h => h.innerText),
  tables: Array.from(document.querySelectorAll('table.gallery')).map(t =>
    Array.from(t.querySelectorAll('tbody tr')).map(r => r.children.length)),
  cells: Array.from(document.querySelectorAll('table.gallery td')).map(td => td.innerText),
  scripts: Array.from(document.querySelectorAll('script')).map(s => s.textContent).filter(t => t.includes('XSS')),
  text: document.body.innerText,
})"""


@pytest.mark.book
@pytest.mark.parametrize("refusal", [True, False], ids=["refused", "escaped only"])
def test_the_built_page_shows_run_text_as_text(packed, tmp_path, browser, monkeypatch, refusal):  # noqa: F811
    files, run_id = packed
    dst = tmp_path / "runs"
    shutil.copytree(FIXTURES / CHAPTER / run_id, dst / CHAPTER / run_id)
    (dst / "published.json").write_text(json.dumps({CHAPTER: run_id}))
    _place(dst, poisoned(files, run_id, FIELDS, PRINTABLE), run_id, "nvidia-h200")
    _place(dst, poisoned(files, run_id, FIELDS, BREAKOUT), run_id, "nvidia-h200-b")
    page = _build(tmp_path, dst, refusal, monkeypatch)
    assert SECRET not in page.read_text()
    ctx = browser.new_context()
    try:
        tab = ctx.new_page()
        errors = []
        tab.on("pageerror", lambda e: errors.append(str(e)))
        tab.goto(page.as_uri(), wait_until="load")
        facts = tab.evaluate(PAGE_FACTS)
    finally:
        ctx.close()
    assert "XSS" not in facts["title"] and facts["title"].startswith("Gallery"), facts["title"]
    assert len(facts["h1"]) == 1 and "Injected" not in " ".join(facts["h1"] + facts["h2"]), facts["h1"]
    assert facts["h2"] == [CHAPTER] and not facts["scripts"] and not errors
    assert SECRET not in facts["text"]
    # The printable run and, unrefused, the other (the published run is one of them: not shown twice).
    shown = 1 if refusal else 2
    assert facts["tables"] == [[12] * shown], facts["tables"]  # no row or cell added by a </table>
    assert "<script>document.title='XSS'</script></table><td>cell</td>" in facts["cells"][3]  # its source
    if refusal:
        assert f"Left out: run {run_id} of {CHAPTER}: GPU holds a control character (U+000A)" in facts["text"]
    else:
        assert "# Injected heading" in facts["text"] and "Left out" not in facts["text"]


def test_run_text_refuses_every_invisible_or_line_ending_character_and_escapes_for_its_place():
    for c in ("\n", "\r", "\t", "\x1b", "\x85", "\u200b", "\u202e", "\ufeff", "\u2028", "\u2029"):
        with pytest.raises(run_text.UnsafeText, match=rf"^GPU holds .* \(U\+{ord(c):04X}\), which is refused$"):
            run_text.to_html(f"NVIDIA{c}H200", "GPU")
    assert run_text.to_html("<b>&\"'", "label") == "&lt;b&gt;&amp;\"'"
    assert run_text.to_html("x\" onmouseover='y'", "href", attribute=True) == "x&quot; onmouseover=&#x27;y&#x27;"
    assert run_text.to_html("NVIDIA H200 · 141 GB", "GPU") == "NVIDIA H200 · 141 GB"
