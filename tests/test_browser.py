"""The rendered book in a real browser.

Headless Chromium opens every page of the freshly built book (the `built_book` fixture),
served over http from 127.0.0.1, and checks what a reader would see: no console or page
errors, every image loaded, no unresolved glue and no missing numbers, every chapter page
naming the run it shows, and a table of contents that reaches every page of _toc.yml.

At 390 px (a phone) every page is also checked for what a reader there would see: no sideways
scrolling, every figure (img, svg) whole on the screen (not wider than it, not cut off by a box
that scrolls), and no Python object's repr in the text (`<IPython.core.display.Markdown
object>`, `<Figure size ...>`, `... object at 0x...`): a value that a cell displayed instead of
its content. test_the_checks_catch_a_broken_page shows that these checks fail on such a page.

Every figure is also checked for what a phone reader needs: its smallest text at least
figures.MIN_TEXT_PX[390] px high as the page shows it at 390 px (the height of that text in the
PNG, which labsupport.figures writes into it, times the scale the page shows the image at), a
link to its full-size file, and alt text that describes it (words, not a file path). Tables: at
390 px none wider than MAX_TABLE_SCREENS screens, at 1280 px none that hides columns behind a
scroll bar. Each page's height and the depth of its first figure, at 1280 and 390 px, are written
to build/screenshots/layout.json; ASSERT_PAGE_LAYOUT switches the assertion that every chapter
keeps them under MAX_PAGE_HEIGHT_PX and MAX_FIRST_FIGURE_PX at 1280 (folds closed).

To look at a book already built instead of building one, set LABSUPPORT_BOOK_HTML to its HTML
folder (e.g. _build/html after `python -m labsupport book`).

A full-page screenshot of every page is saved to build/screenshots/<page>.png (git-ignored),
so that a reviewer can look at the book without building it; build/screenshots/report.json
lists what each page did, including the requests to outside hosts that were blocked (the
machines that build the book have no internet, so such requests are aborted and reported,
not counted as failures).

The test needs the Python package playwright (requirements.txt) and Debian's Chromium
(`apt-get install chromium`; Playwright's own browser download is never used). Without
them it is skipped, unless the environment variable CI is set: then it fails.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import threading
import time
import warnings
from dataclasses import asdict, dataclass, field
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml

from labsupport import chapters, figures

pytestmark = pytest.mark.book

# A chapter page at 1280 px, its folds closed: at most this tall, its first figure at most this far
# down. The measurement is always made and written to build/screenshots/layout.json; this switch
# turns the assertion on (test_chapter_page_height_and_first_figure).
ASSERT_PAGE_LAYOUT = True
MAX_PAGE_HEIGHT_PX = 15_000
MAX_FIRST_FIGURE_PX = 2_000
MAX_TABLE_SCREENS = 2  # at 390 px, no table wider than twice the screen

REPO = Path(__file__).resolve().parent.parent
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
SCREENSHOTS = REPO / "build" / "screenshots"
# Chromium runs as root on the build machines, without a GPU and without internet.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
]
VIEWPORT = {"width": 1280, "height": 900}  # wide enough for the sidebar to show
PAGE_TIMEOUT_MS = 30_000

# Text that means a value never arrived: a missing number, or pandas' and Python's way of
# showing one (possibly with the unit the format string added).
MISSING = re.compile(r"(nan|NaN|NAN|None|<NA>|NaT|-?inf)\s*(%|[a-zA-Zµ/]+)?")
NUMBER = re.compile(r"[-+−]?(\d[\d,  ]*\.?\d*|\.\d+)([eE][-+]?\d+)?\s*(%|×|x|[a-zA-Zµ/]+)?")


# Any console or page error fails the test. Two came from the Jupyter Book 1.x stack and are
# fixed in the book itself: sphinx-thebe's repeated `const THEBE_JS_URL` script
# (book/_ext/one_script_each.py) and pydata-sphinx-theme's empty colour mode
# (`html_context: {default_mode: auto}` in _config.yml).


def _ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def _toc_files(node) -> list[str]:
    """Every `file:` of _toc.yml, in book order."""
    found = []
    if isinstance(node, dict):
        if "file" in node:
            found.append(str(node["file"]))
        for key in ("parts", "chapters", "sections"):
            for child in node.get(key) or []:
                found += _toc_files(child)
    return found


def _page_name(path: str) -> str:
    """A toc file (or html path) without its extension: 'notebooks/kernels_in_one_token'."""
    return re.sub(r"\.(md|ipynb|html|rst)$", "", path)


TOC = yaml.safe_load((REPO / "_toc.yml").read_text())
ROOT_PAGE = _page_name(TOC["root"])
TOC_PAGES = [ROOT_PAGE] + [_page_name(f) for f in _toc_files(TOC) if _page_name(f) != ROOT_PAGE]
PAGES = ["index"] + TOC_PAGES


def _shot_name(page: str) -> str:
    """build/screenshots/<this>.png: the page's file name, or its path if two pages share one."""
    name = Path(page).name
    return name if [Path(p).name for p in TOC_PAGES].count(name) == 1 else page.replace("/", "-")


def _is_chapter(page: str) -> bool:
    return page in {_page_name(c.notebook) for c in chapters.CHAPTERS}


def _chapter_of(page: str) -> chapters.Chapter:
    by_notebook = {_page_name(c.notebook): c for c in chapters.CHAPTERS}
    assert page in by_notebook, f"{page} is in _toc.yml but not in labsupport.chapters.CHAPTERS"
    return by_notebook[page]


def _published_run_id(chapter: chapters.Chapter) -> str:
    from labsupport import runs

    return runs.published_run_id(chapter.slug, root=REPO / "runs")


def _figures_in_executed_notebook(html_root: Path, page: str) -> int:
    """How many figures the executed notebook shows: image outputs of cells not removed, and the
    figures its cells glue for the prose to paste (myst-nb keeps those in <page>.glue.json)."""
    executed = html_root.parent / "jupyter_execute" / page
    nb = json.loads(executed.with_suffix(".ipynb").read_text())
    count = 0
    for cell in nb["cells"]:
        tags = set(cell.get("metadata", {}).get("tags", []))
        if cell["cell_type"] != "code" or tags & {"remove-cell", "remove-output"}:
            continue
        for out in cell.get("outputs", []):
            count += any(m.startswith("image/") for m in out.get("data", {}))
    glued = executed.with_suffix(".glue.json")
    if glued.exists():
        count += sum(any(m.startswith("image/") for m in v["data"]) for v in json.loads(glued.read_text()).values())
    return count


def _is_number(text: str) -> bool:
    return bool(NUMBER.fullmatch(text.strip()))


# Where things lie on the page, at the width it is opened at: its height (folds closed, as it
# loads), the top of its first figure (an image a cell printed or the prose pastes), every figure (its file, its alt
# text, the link around it, its natural and shown widths) and every table (the width of its
# content, and how much of it a scroll box hides).
LAYOUT = """(main) => {
  const outputs = Array.from(main.querySelectorAll('.cell_output img, figure img'));
  const first = outputs.length ? outputs[0].getBoundingClientRect().top + window.scrollY : null;
  return {
    height: document.documentElement.scrollHeight,
    first_figure: first,
    figures: Array.from(main.querySelectorAll('img')).filter(i => i.naturalWidth >= 48).map(i => {
      const a = i.closest('a[href]');
      return {src: i.currentSrc || i.src, alt: i.getAttribute('alt'), link: a ? a.href : null,
              natural: i.naturalWidth, shown: i.getBoundingClientRect().width};
    }),
    tables: Array.from(main.querySelectorAll('table')).map(t => {
      let hidden = 0;  // what the table's own scroll box (itself, or the nearest around it) hides
      for (let e = t; e && e !== main; e = e.parentElement) {
        const o = getComputedStyle(e).overflowX;
        if (o === 'auto' || o === 'scroll') { hidden = e.scrollWidth - e.clientWidth; break; }
      }
      return {width: Math.max(t.getBoundingClientRect().width, t.scrollWidth), hidden: hidden,
              head: Array.from(t.querySelectorAll('th')).slice(0, 3).map(h => h.textContent.trim())};
    }),
  };
}"""

# What the page shows, collected in the browser in one go.
COLLECT = (
    """async () => {
  const LAYOUT = """
    + LAYOUT
    + """;
  const imgs = Array.from(document.images);
  await Promise.all(imgs.map(i => i.complete ? null :
      new Promise(r => { i.addEventListener('load', r); i.addEventListener('error', r); })));
  const main = document.querySelector('main') || document.body;
  return {
    title: document.title,
    text: document.body.innerText,
    images: imgs.map(i => ({src: i.currentSrc || i.src, width: i.naturalWidth,
                            in_output: !!i.closest('.cell_output, figure')})),
    pasted: Array.from(document.querySelectorAll('.pasted-text')).map(e => e.textContent),
    tables: Array.from(main.querySelectorAll('table')).map(t => ({
      in_output: !!t.closest('.cell_output'),
      rows: Array.from(t.querySelectorAll('tbody tr')).map(
          tr => Array.from(tr.querySelectorAll('td')).map(td => td.textContent.trim())),
    })),
    nav: Array.from(document.querySelectorAll('nav.bd-docs-nav a[href]')).map(a => a.href),
    links: Array.from(main.querySelectorAll('a[href]')).map(a => a.href),
    // Each table against the text column: a wider table must scroll inside a box of its own
    // (itself or an ancestor with overflow-x auto/scroll) that fits the column.
    column: main.getBoundingClientRect().width,
    table_fit: Array.from(main.querySelectorAll('table')).map(t => {
      const w = t.getBoundingClientRect().width;
      let box = null;
      for (let e = t; e && e !== main; e = e.parentElement) {
        const o = getComputedStyle(e).overflowX;
        if (o === 'auto' || o === 'scroll') { box = e; break; }
      }
      return {width: w, box: box ? box.getBoundingClientRect().width : null,
              head: Array.from(t.querySelectorAll('th')).slice(0, 3).map(h => h.textContent.trim())};
    }),
    explorers: main.querySelectorAll('.explorer, .jupyter-widgets, .widget-box').length,
    layout: LAYOUT(main),
  };
}"""
)

# How far the page scrolls sideways on a phone-sized screen.
OVERFLOW = "() => document.documentElement.scrollWidth - window.innerWidth"
NARROW = {"width": 390, "height": 844}

# What the page shows on a phone: its text, and where each figure (an image, or an svg that is
# not an icon of the theme) lies against the screen and against every box around it that clips
# or scrolls (a figure partly outside such a box is shown in part).
NARROW_COLLECT = (
    """async () => {
  const LAYOUT = """
    + LAYOUT
    + """;
  const imgs = Array.from(document.images);
  await Promise.all(imgs.map(i => i.complete ? null :
      new Promise(r => { i.addEventListener('load', r); i.addEventListener('error', r); })));
  const main = document.querySelector('main') || document.body;
  const screen = document.documentElement.clientWidth;
  const figures = Array.from(main.querySelectorAll('img, svg')).filter(e => {
    if (e.tagName.toLowerCase() === 'svg' && (e.parentElement.closest('svg') ||
        e.closest('button, a.headerlink, .headerlink, .copybtn, .admonition-title, nav'))) return false;
    const r = e.getBoundingClientRect();
    return r.width >= 48 && r.height >= 48;  // icons are smaller
  }).map(e => {
    const r = e.getBoundingClientRect();
    let cut = null;
    for (let a = e.parentElement; a && a !== document.body; a = a.parentElement) {
      if (getComputedStyle(a).overflowX === 'visible') continue;
      const b = a.getBoundingClientRect();
      if (r.left < b.left - 1 || r.right > b.right + 1) { cut = b.width; break; }
    }
    return {src: (e.currentSrc || e.src || e.tagName).toString().slice(-80), width: r.width,
            left: r.left, right: r.right, cut_by_box_px: cut};
  });
  return {text: document.body.innerText, screen: screen, figures: figures, layout: LAYOUT(main)};
}"""
)

# A Python object's repr where its content should be: a cell displayed an object (an
# IPython Markdown, a matplotlib figure) instead of rendering it.
OBJECT_REPR = re.compile(
    r"<IPython\.[\w.]+ object>|<(IPython|matplotlib|pandas|labsupport)\.[\w.]+[ >]|<Figure size \d"
    r"|\bobject at 0x[0-9a-fA-F]+|<[A-Za-z_][\w.]* object>"
)


def object_reprs(text: str) -> list[str]:
    """The object reprs in a page's text."""
    return sorted({m.group(0) for m in OBJECT_REPR.finditer(text)})


def figures_not_whole(narrow: dict) -> list[str]:
    """The figures of a page (NARROW_COLLECT's answer) not shown whole on the screen."""
    screen = narrow["screen"]
    bad = []
    for f in narrow["figures"]:
        if f["width"] > screen + 1 or f["right"] > screen + 1 or f["left"] < -1:
            where = f"{f['left']:.0f}..{f['right']:.0f}"
            bad.append(f"{f['src']}: {f['width']:.0f} px wide at {where} on a {screen} px screen")
        elif f["cut_by_box_px"] is not None:
            bad.append(f"{f['src']}: {f['width']:.0f} px wide in a box of {f['cut_by_box_px']:.0f} px (shown in part)")
    return bad


# Alt text that is a file's name or path rather than words about the figure.
PATH_LIKE = re.compile(r"\.(png|jpe?g|gif|svg|webp)\b|_build/|jupyter_execute|^\S+$", re.I)
MIN_ALT_WORDS = 8


def _image_name(url: str) -> str:
    return Path(urlsplit(url).path).name


def figure_link_and_alt_problems(layout: dict) -> list[str]:
    """The figures of a page (a LAYOUT answer) with no link to their own full-size file, or whose
    alt text is missing, a path, or too short to say what the figure shows."""
    bad = []
    for f in layout["figures"]:
        name, alt = _image_name(f["src"]), " ".join((f["alt"] or "").split())
        if not alt or PATH_LIKE.search(alt) or len(alt.split()) < MIN_ALT_WORDS:
            bad.append(f"{name}: alt text {alt[:80]!r} does not describe the figure")
        if not f["link"] or _image_name(f["link"]) != name:
            bad.append(f"{name}: no link to the full-size image (its link: {f['link']})")
    return bad


def figure_text_px(html_root: Path, layout: dict) -> list[tuple[float, str]]:
    """Each PNG figure of a page (a LAYOUT answer) with the height of its smallest text as the page
    shows it: that text's height in the PNG (labsupport.figures.SMALLEST_TEXT_KEY, written when
    the figure was drawn) times the scale the image is shown at; NaN where the PNG does not say."""
    from PIL import Image

    found = []
    for f in layout["figures"]:
        path = html_root / urlsplit(f["src"]).path.lstrip("/")
        if path.suffix.lower() != ".png":
            continue
        with Image.open(path) as im:
            im.load()
            smallest = float((im.text or {}).get(figures.SMALLEST_TEXT_KEY, "nan"))
        found.append((smallest * f["shown"] / f["natural"], _image_name(f["src"])))
    return found


def small_text_problems(html_root: Path, layout: dict) -> list[str]:
    """The figures whose smallest text is under figures.MIN_TEXT_PX[390] px as a page 390 px wide
    shows them (or whose PNG does not say how small its text is)."""
    least = figures.MIN_TEXT_PX[390]
    return [
        f"{name}: its smallest text is {px:.1f} px high at 390 px" if px == px else f"{name}: its PNG has no text size"
        for px, name in figure_text_px(html_root, layout)
        if not px >= least
    ]


def wide_tables(layout: dict, limit_px: float) -> list[str]:
    """The tables of a page (a LAYOUT answer) wider than `limit_px`."""
    return [f"{t['head']}: {t['width']:.0f} px" for t in layout["tables"] if t["width"] > limit_px + 1]


def hidden_columns(layout: dict) -> list[str]:
    """The tables of a page (a LAYOUT answer) whose scroll box hides part of them."""
    return [f"{t['head']}: {t['hidden']:.0f} px hidden" for t in layout["tables"] if t["hidden"] > 1]


def layout_numbers(html_root: Path, v) -> dict:
    """A page's height, its first figure's depth and its widest table at 1280 and 390 px, the
    columns hidden at 1280 and the smallest figure text at 390 (build/screenshots/layout.json)."""
    out = {}
    for width, layout in ((1280, v.shown.get("layout")), (390, v.narrow.get("layout"))):
        if not layout:
            continue
        out[str(width)] = {
            "height": layout["height"],
            "first_figure": None if layout["first_figure"] is None else round(layout["first_figure"]),
            "widest_table": round(max((t["width"] for t in layout["tables"]), default=0)),
        }
    if v.shown.get("layout"):
        out["1280"]["hidden_table_px"] = round(max((t["hidden"] for t in v.shown["layout"]["tables"]), default=0))
    if v.narrow.get("layout"):
        sizes = [px for px, _ in figure_text_px(html_root, v.narrow["layout"]) if px == px]  # NaN: not known
        out["390"]["smallest_figure_text"] = round(min(sizes), 2) if sizes else None
    return out


@dataclass
class PageVisit:
    page: str
    url: str = ""
    status: int | None = None
    title: str = ""
    console_errors: list = field(default_factory=list)
    page_errors: list = field(default_factory=list)
    failed_requests: list = field(default_factory=list)  # to 127.0.0.1, status >= 400 or no answer
    blocked_requests: list = field(default_factory=list)  # to outside hosts, aborted
    screenshot: str = ""
    narrow_overflow_px: int | None = None  # sideways scroll at 390 px
    narrow: dict = field(default_factory=dict)  # what NARROW_COLLECT returned at 390 px
    narrow_screenshot: str = ""
    seconds: float = 0.0
    shown: dict = field(default_factory=dict)  # what COLLECT returned


def _shown_path(path: Path) -> str:
    """A screenshot's path for the report: from the repository root when it lies inside it."""
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)


class _QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, *args):  # no access log on the test's stderr
        pass


class Site:
    """The book served over http, and a Chromium that visits its pages (once each)."""

    def __init__(self, html_root: Path, browser, shots: Path = SCREENSHOTS):
        self.html_root = html_root
        self.browser = browser
        self.shots = shots  # where the screenshots go
        handler = functools.partial(_QuietHandler, directory=str(html_root))
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler)  # port 0: a free port
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.base = f"http://127.0.0.1:{self.server.server_address[1]}/"
        self.visits: dict[str, PageVisit] = {}

    def close(self):
        self.server.shutdown()
        self.server.server_close()

    def visit(self, page: str) -> PageVisit:
        if page not in self.visits:
            self.visits[page] = self._visit(page)
        return self.visits[page]

    def _visit(self, page: str) -> PageVisit:
        """Open the page (`page`.html under the site) at 1280 px, then at 390 px."""
        v = PageVisit(page)
        t0 = time.monotonic()
        ctx = self.browser.new_context(viewport=VIEWPORT, service_workers="block")
        p = ctx.new_page()
        p.set_default_timeout(PAGE_TIMEOUT_MS)

        def route(r):
            host = urlsplit(r.request.url).hostname
            if host == "127.0.0.1" or r.request.url.startswith(("data:", "blob:")):
                r.continue_()
            else:
                v.blocked_requests.append(r.request.url)
                r.abort("blockedbyclient")

        def on_console(msg):
            if msg.type != "error":
                return
            where = (msg.location or {}).get("url", "")
            if where in v.blocked_requests or "ERR_BLOCKED_BY_CLIENT" in msg.text:
                return  # the outside request we aborted ourselves; reported as blocked
            v.console_errors.append(f"{msg.text} ({where}:{(msg.location or {}).get('lineNumber')})")

        def on_response(resp):
            if urlsplit(resp.url).hostname == "127.0.0.1" and resp.status >= 400:
                v.failed_requests.append(f"{resp.status} {resp.url}")

        def on_failed(req):
            if urlsplit(req.url).hostname == "127.0.0.1":
                v.failed_requests.append(f"{req.failure} {req.url}")

        p.route("**/*", route)
        p.on("console", on_console)
        p.on("pageerror", lambda e: v.page_errors.append(str(e)))
        p.on("response", on_response)
        p.on("requestfailed", on_failed)
        try:
            resp = p.goto(self.base + page + ".html", wait_until="load")
            v.status = resp.status if resp else None
            if page == "index":  # a redirect to the root page of the toc
                p.wait_for_url(self.base + ROOT_PAGE + ".html", wait_until="load")
            v.url = p.url
            v.shown = p.evaluate(COLLECT)
            v.title = v.shown.pop("title")
            if page != "index":  # index.html is the root page, already shot under its own name
                shot = self.shots / f"{_shot_name(page)}.png"
                p.screenshot(path=str(shot), full_page=True)
                v.screenshot = _shown_path(shot)
        finally:
            ctx.close()
        narrow = self.browser.new_context(viewport=NARROW, service_workers="block")
        try:
            q = narrow.new_page()
            q.set_default_timeout(PAGE_TIMEOUT_MS)
            q.route("**/*", route)
            q.goto(self.base + page + ".html", wait_until="load")
            if page == "index":  # a redirect to the root page of the toc
                q.wait_for_url(self.base + ROOT_PAGE + ".html", wait_until="load")
            v.narrow_overflow_px = int(q.evaluate(OVERFLOW))
            v.narrow = q.evaluate(NARROW_COLLECT)
            if page != "index":
                shot = self.shots / f"{_shot_name(page)}-390px.png"
                q.screenshot(path=str(shot), full_page=True)
                v.narrow_screenshot = _shown_path(shot)
        finally:
            narrow.close()
            v.seconds = round(time.monotonic() - t0, 2)
        return v


@pytest.fixture(scope="session")
def book_html(request) -> Path:
    """The HTML folder of the book: LABSUPPORT_BOOK_HTML (a book already built), else the
    session's fresh build (conftest's built_book)."""
    given = os.environ.get("LABSUPPORT_BOOK_HTML")
    if given:
        return Path(given).resolve()
    return request.getfixturevalue("built_book")


@pytest.fixture(scope="module")
def browser():
    missing = []
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        missing.append("the Python package playwright (pip install -r requirements.txt)")
    if not (os.path.isfile(CHROMIUM) and os.access(CHROMIUM, os.X_OK)):
        missing.append(f"Chromium at {CHROMIUM} (apt-get install chromium)")
    if missing:
        reason = "the browser test needs " + " and ".join(missing)
        if _ci():
            pytest.fail(reason + "; CI is set, so this is a failure (.ci/run installs both)")
        pytest.skip(reason)
    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture(scope="module")
def site(browser, book_html):
    shutil.rmtree(SCREENSHOTS, ignore_errors=True)
    SCREENSHOTS.mkdir(parents=True)
    s = Site(book_html, browser)
    try:
        yield s
    finally:
        s.close()
    report = {page: asdict(v) for page, v in s.visits.items()}
    for r in report.values():
        r["shown"] = {"images": r["shown"].get("images", []), "nav": r["shown"].get("nav", [])}
        r["narrow"] = {"figures": r["narrow"].get("figures", [])}
    (SCREENSHOTS / "report.json").write_text(json.dumps(report, indent=1, ensure_ascii=False))
    layout = {page: layout_numbers(s.html_root, v) for page, v in s.visits.items() if page != "index"}
    (SCREENSHOTS / "layout.json").write_text(json.dumps(layout, indent=1))
    blocked = sorted({f"{u} (from {p})" for p, v in s.visits.items() for u in v.blocked_requests})
    if blocked:
        warnings.warn("requests to outside hosts were blocked (no internet here): " + "; ".join(blocked), stacklevel=2)


def test_the_built_pages_are_the_toc_pages(book_html):
    """Every html page of the book is in _toc.yml, and every page of _toc.yml was built."""
    built = {"index"} | {
        _page_name(str(p.relative_to(book_html))) for d in ("book", "notebooks") for p in (book_html / d).glob("*.html")
    }
    assert built == set(PAGES)


@pytest.mark.parametrize("page", PAGES)
def test_page_loads_cleanly(site, page):
    v = site.visit(page)
    assert v.status == 200, f"{page}: http status {v.status}"
    if page == "index":
        assert v.url == site.base + ROOT_PAGE + ".html", f"index.html did not lead to the root page: {v.url}"
    assert not v.page_errors, f"{page}: page errors {v.page_errors}"
    assert not v.console_errors, f"{page}: console errors {v.console_errors}"
    assert not v.failed_requests, f"{page}: failed requests {v.failed_requests}"
    assert v.title and "<no title>" not in v.title, f"{page}: no title"
    assert v.seconds < 20, f"{page}: took {v.seconds} s"


@pytest.mark.parametrize("page", PAGES)
def test_page_images_load(site, page):
    images = site.visit(page).shown["images"]
    broken = [i["src"] for i in images if not i["width"] > 0]
    assert not broken, f"{page}: images that did not load: {broken}"


@pytest.mark.parametrize("page", PAGES)
def test_page_shows_no_placeholders_or_missing_numbers(site, page):
    shown = site.visit(page).shown
    for marker in ("{glue", "glue:"):
        assert marker not in shown["text"], f"{page}: unresolved glue ({marker!r}) in the text"
    bad_pasted = [t for t in shown["pasted"] if not t.strip() or MISSING.fullmatch(t.strip())]
    assert not bad_pasted, f"{page}: glued values that are missing: {bad_pasted}"
    for n, table in enumerate(shown["tables"]):
        cells = [c for row in table["rows"] for c in row]
        bad = [c for c in cells if MISSING.fullmatch(c)]
        assert not bad, f"{page}: table {n} has missing values {bad}"
        if not table["in_output"]:
            continue  # a table written in the prose: its empty cells are the author's; its
            # numbers are glued, and a glued value that is missing is caught above
        # A table a notebook cell printed: a column that holds numbers holds one in every row.
        width = max((len(r) for r in table["rows"]), default=0)
        for col in range(width):
            column = [r[col] for r in table["rows"] if len(r) == width]
            filled = [c for c in column if c]
            if filled and sum(map(_is_number, filled)) * 2 >= len(filled) and len(filled) < len(column):
                raise AssertionError(f"{page}: table {n}, column {col} is numeric but has empty cells: {column}")


@pytest.mark.parametrize("page", [p for p in TOC_PAGES if _is_chapter(p)])
def test_chapter_page_shows_its_run_and_every_figure(site, book_html, page):
    v = site.visit(page)
    run_id = _published_run_id(_chapter_of(page))
    assert run_id in v.shown["text"], f"{page}: the published run {run_id} is not named on the page"
    figures = _figures_in_executed_notebook(book_html, page)
    in_outputs = [i for i in v.shown["images"] if i["in_output"]]
    assert figures > 0, f"{page}: the executed notebook has no figures"
    assert len(in_outputs) == figures, f"{page}: {len(in_outputs)} images shown for {figures} figures"
    assert v.screenshot and (REPO / v.screenshot).stat().st_size > 10_000


def test_sidebar_reaches_every_page_of_the_toc(site):
    v = site.visit("index")
    reached = {_page_name(urlsplit(u).path.lstrip("/")) for u in v.shown["nav"] if u.startswith(site.base)}
    missing = [p for p in TOC_PAGES if p not in reached]
    assert not missing, f"the sidebar of the root page does not reach {missing}; it reaches {sorted(reached)}"


@pytest.mark.parametrize("page", PAGES)
def test_no_table_wider_than_the_text_column(site, page):
    """At 1280 px a table fits the text column, or scrolls inside a box of its own that does."""
    v = site.visit(page)
    column = v.shown["column"]
    cut = [
        t["head"]
        for t in v.shown["table_fit"]
        if t["width"] > column + 1 and (t["box"] is None or t["box"] > column + 1)
    ]
    assert not cut, f"{page}: tables wider than the {column:.0f} px column: {cut}"


@pytest.mark.parametrize("page", PAGES)
def test_no_sideways_scrolling_on_a_phone(site, page):
    v = site.visit(page)
    assert v.narrow_overflow_px is not None and v.narrow_overflow_px <= 1, (
        f"{page}: the page scrolls {v.narrow_overflow_px} px sideways at 390 px ({v.narrow_screenshot})"
    )


@pytest.mark.parametrize("page", PAGES)
def test_every_figure_is_whole_on_a_phone(site, page):
    """At 390 px every figure scales to the screen: none wider than it, none cut by a box."""
    v = site.visit(page)
    bad = figures_not_whole(v.narrow)
    assert not bad, f"{page}: figures not shown whole at 390 px ({v.narrow_screenshot}): {bad}"


@pytest.mark.parametrize("page", PAGES)
def test_every_figure_is_legible_on_a_phone(site, page):
    """At 390 px no figure's smallest text is under figures.MIN_TEXT_PX[390] px high."""
    v = site.visit(page)
    bad = small_text_problems(site.html_root, v.narrow["layout"])
    assert not bad, f"{page}: figures too small to read at 390 px ({v.narrow_screenshot}): {bad}"


@pytest.mark.parametrize("page", PAGES)
def test_every_figure_opens_full_size_and_says_what_it_shows(site, page):
    v = site.visit(page)
    bad = figure_link_and_alt_problems(v.shown["layout"])
    assert not bad, f"{page}: {bad}"


@pytest.mark.parametrize("page", PAGES)
def test_no_table_wider_than_twice_a_phone_screen(site, page):
    v = site.visit(page)
    bad = wide_tables(v.narrow["layout"], MAX_TABLE_SCREENS * v.narrow["screen"])
    assert not bad, f"{page}: tables wider than {MAX_TABLE_SCREENS} screens at 390 px ({v.narrow_screenshot}): {bad}"


@pytest.mark.parametrize("page", PAGES)
def test_no_table_hides_columns_at_1280(site, page):
    v = site.visit(page)
    bad = hidden_columns(v.shown["layout"])
    assert not bad, f"{page}: tables with columns behind a scroll bar at 1280 px ({v.screenshot}): {bad}"


@pytest.mark.parametrize("page", [p for p in TOC_PAGES if _is_chapter(p)])
def test_chapter_page_height_and_first_figure(site, page):
    """Every chapter page is measured at 1280 px, folds closed (build/screenshots/layout.json);
    with ASSERT_PAGE_LAYOUT on, it is at most MAX_PAGE_HEIGHT_PX tall and its first figure starts
    within MAX_FIRST_FIGURE_PX of the top."""
    layout = site.visit(page).shown["layout"]
    assert layout["height"] > 0 and layout["first_figure"] is not None, f"{page}: no figure measured"
    if ASSERT_PAGE_LAYOUT:
        assert layout["height"] <= MAX_PAGE_HEIGHT_PX, f"{page}: {layout['height']} px tall at 1280 px"
        assert layout["first_figure"] <= MAX_FIRST_FIGURE_PX, (
            f"{page}: its first figure is {layout['first_figure']:.0f} px down at 1280 px"
        )


@pytest.mark.parametrize("page", PAGES)
def test_no_object_repr_in_the_text(site, page):
    """No page shows a Python object's repr where a value or a figure should be."""
    v = site.visit(page)
    found = object_reprs(v.narrow.get("text", "")) + object_reprs(v.shown["text"])
    assert not found, f"{page}: Python object reprs in the page: {sorted(set(found))}"


BROKEN_PAGE = """<!doctype html><html><head><meta name="viewport" content="width=device-width">
<link rel="stylesheet" href="_static/book.css"></head><body><main><div class="bd-article">
<p>The step took &lt;IPython.core.display.Markdown object&gt; ms.</p>
<div class="cell_output"><img src="wide.png" style="width:900px; max-width:none"></div>
<div class="cell_output" style="overflow-x:auto; width:200px"><img src="cut.png" style="max-width:none"></div>
<div class="cell_output"><img src="fits.png"></div>
<div class="cell_output"><img src="scaled.png"></div>
</div></main></body></html>"""


def _png(path: Path, width: int, height: int) -> None:
    import struct
    import zlib

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    raw = b"".join(b"\x00" + b"\x80" * (width * 3) for _ in range(height))
    path.write_bytes(
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
        + chunk(b"IDAT", zlib.compress(raw))
        + chunk(b"IEND", b"")
    )


def test_the_checks_catch_a_broken_page(browser, tmp_path):
    """The phone checks fail on a page with a figure wider than the screen, a figure cut by
    its scroll box, and an object repr; they pass a figure that fits, and one that the book's
    CSS scales down to the screen."""
    (tmp_path / "_static").mkdir()
    shutil.copy(REPO / "book" / "_static" / "book.css", tmp_path / "_static" / "book.css")
    _png(tmp_path / "wide.png", 900, 300)
    _png(tmp_path / "cut.png", 300, 200)
    _png(tmp_path / "fits.png", 300, 200)
    _png(tmp_path / "scaled.png", 900, 300)  # the book's CSS scales it to the screen
    (tmp_path / "broken.html").write_text(BROKEN_PAGE)
    (tmp_path / "shots").mkdir()
    s = Site(tmp_path, browser, shots=tmp_path / "shots")
    try:
        v = s.visit("broken")
    finally:
        s.close()
    assert object_reprs(v.narrow["text"]) == ["<IPython.core.display.Markdown object>"]
    bad = figures_not_whole(v.narrow)
    assert len(bad) == 2, bad
    assert "wide.png" in bad[0] and "on a 390 px screen" in bad[0], bad
    assert "cut.png" in bad[1] and "shown in part" in bad[1], bad
    assert [Path(f["src"]).name for f in v.narrow["figures"]] == ["wide.png", "cut.png", "fits.png", "scaled.png"]
    assert v.narrow_overflow_px > 1  # the 900 px figure also widens the page


WIDE_ROW = "".join(f"<td>unbreakable_cell_text_{i}</td>" for i in range(12))
FIGURES_PAGE = f"""<!doctype html><html><head><meta name="viewport" content="width=device-width">
<link rel="stylesheet" href="_static/book.css"></head><body><main><div class="bd-article">
<div class="cell_output"><a href="described.png"><img src="described.png" alt="ALT"></a></div>
<div class="cell_output"><img src="plain.png" alt="_build/jupyter_execute/plain.png"></div>
<div class="cell_output"><a href="tiny.png"><img src="tiny.png" alt="ALT"></a></div>
<div class="cell_output"><table><thead><tr>{"<th>h</th>" * 12}</tr></thead>
<tbody><tr>{WIDE_ROW}</tr></tbody></table></div>
<div class="cell_output"><div class="table-wrap"><table class="book-table">
<thead><tr><th>rung</th><th>ms</th></tr></thead>
<tbody><tr><td data-label="rung">eager</td><td data-label="ms">30.1</td></tr></tbody></table></div></div>
</div></main></body></html>"""


def test_the_checks_catch_unreadable_figures_and_wide_tables(browser, tmp_path):
    """The figure and table checks fail on a figure with a path for alt text and no link, on one
    whose text the page shows under 7 px, and on a table of twelve unbreakable columns (wider
    than two phone screens, and scrolled at 1280 px); they pass a described, linked, legible
    figure and a table of glue.table's kind."""
    import matplotlib.pyplot as plt
    from PIL import Image, PngImagePlugin

    (tmp_path / "_static").mkdir()
    shutil.copy(REPO / "book" / "_static" / "book.css", tmp_path / "_static" / "book.css")
    fig = figures.hbars(["eager", "CUDA graph"], [30.0, 12.0], "a GPU · a run", "Time per token", "ms per token")
    figures.save(fig, tmp_path / "described.png")
    plt.close(fig)
    _png(tmp_path / "plain.png", 300, 200)
    info = PngImagePlugin.PngInfo()
    info.add_text(figures.SMALLEST_TEXT_KEY, "8.00")  # 8 px in a 900 px PNG: about 3 px at 390
    Image.new("RGB", (900, 300), "white").save(tmp_path / "tiny.png", pnginfo=info)
    page = FIGURES_PAGE.replace('alt="ALT"', f'alt="{figures.description(fig)}"')
    (tmp_path / "figures.html").write_text(page)
    (tmp_path / "shots").mkdir()
    s = Site(tmp_path, browser, shots=tmp_path / "shots")
    try:
        v = s.visit("figures")
    finally:
        s.close()
    alt = figure_link_and_alt_problems(v.shown["layout"])
    assert [a.split(":")[0] for a in alt] == ["plain.png", "plain.png"], alt  # its alt text, its link
    small = small_text_problems(tmp_path, v.narrow["layout"])
    assert [p.split(":")[0] for p in small] == ["plain.png", "tiny.png"], small
    assert "no text size" in small[0] and "at 390 px" in small[1]
    wide = wide_tables(v.narrow["layout"], MAX_TABLE_SCREENS * v.narrow["screen"])
    assert len(wide) == 1 and "'h'" in wide[0], wide
    hidden = hidden_columns(v.shown["layout"])
    assert len(hidden) == 1 and "'h'" in hidden[0], hidden
    assert v.shown["layout"]["first_figure"] is not None and v.shown["layout"]["height"] > 0


@pytest.mark.parametrize("page", PAGES)
def test_local_links_resolve(site, page):
    """Every link of the page's text to a file of the book reaches a file that was built."""
    v = site.visit(page)
    broken = []
    for url in v.shown["links"]:
        if not url.startswith(site.base):
            continue
        path = urlsplit(url).path.lstrip("/") or "index.html"
        target = site.html_root / path
        if not (target.is_file() or (target / "index.html").is_file()):
            broken.append(url[len(site.base) :])
    assert not broken, f"{page}: links to nothing: {broken}"


@pytest.mark.parametrize("page", PAGES)
def test_page_shows_what_it_mentions(site, page):
    """A page that sends the reader to an explorer shows one."""
    v = site.visit(page)
    if re.search(r"explorer (below|above)", v.shown["text"], re.I):
        assert v.shown["explorers"] > 0, f"{page} mentions an explorer it does not show"


# The gallery page (book/gallery.md, its tables from labsupport.ops.gallery_page) on a phone: the
# tables, every figure, its download links.
GALLERY = "book/gallery"
GALLERY_COLLECT = """() => {
  const main = document.querySelector('main') || document.body;
  const screen = document.documentElement.clientWidth;
  const tables = Array.from(main.querySelectorAll('table')).map(t => {
    let box = null;
    for (let e = t; e && e !== main; e = e.parentElement) {
      const o = getComputedStyle(e).overflowX;
      if (o === 'auto' || o === 'scroll') { box = e.getBoundingClientRect(); break; }
    }
    const r = t.getBoundingClientRect();
    return {width: r.width, left: r.left, right: r.right,
            box: box ? {left: box.left, right: box.right, width: box.width} : null,
            rows: t.querySelectorAll('tbody tr').length};
  });
  const downloads = Array.from(main.querySelectorAll('table a[href]')).map(a => a.href);
  return {screen: screen, tables: tables, downloads: downloads};
}"""


def test_the_gallery_page_on_a_phone(site, book_html):
    """At 390 px the gallery page does not scroll sideways, shows every figure whole and every
    table within the screen (wider ones scroll in a box of their own that fits it), no object
    repr; each of its rows links a download that is a zip built with the book, holding runs/."""
    import zipfile

    from labsupport.ops import gallery, gallery_page

    v = site.visit(GALLERY)
    assert v.status == 200 and not v.page_errors and not v.console_errors and not v.failed_requests
    assert v.narrow_overflow_px is not None and v.narrow_overflow_px <= 1, v.narrow_screenshot
    assert not figures_not_whole(v.narrow), figures_not_whole(v.narrow)
    assert not object_reprs(v.narrow.get("text", "")) and not object_reprs(v.shown["text"])
    ctx = site.browser.new_context(viewport=NARROW, service_workers="block")
    try:
        q = ctx.new_page()
        q.route("**/*", lambda r: r.continue_() if urlsplit(r.request.url).hostname == "127.0.0.1" else r.abort())
        q.goto(site.base + GALLERY + ".html", wait_until="load")
        got = q.evaluate(GALLERY_COLLECT)
    finally:
        ctx.close()
    screen = got["screen"]
    expected = gallery_page.rows(REPO / "runs")
    assert got["tables"] and sum(t["rows"] for t in got["tables"]) == len(expected)
    for t in got["tables"]:
        shown = t["box"] if t["width"] > screen + 1 else t
        assert shown is not None and shown["left"] >= -1 and shown["right"] <= screen + 1, (t, screen)
    downloads = [u for u in got["downloads"] if "/download/" in u]
    assert len(downloads) == len(expected), downloads
    entries = gallery.entries(REPO / "runs")
    served = {urlsplit(u).path.rsplit("/", 1)[-1] for u in downloads}
    assert {gallery_page.download_name(e) for e in entries} <= served
    for url in downloads:
        assert url.startswith(site.base), url
        path = book_html / urlsplit(url).path.lstrip("/")
        assert path.is_file(), url
        names = zipfile.ZipFile(path).namelist()
        assert names and all(n.startswith("runs/") for n in names), url


# A stand-in for ui.perfetto.dev (no internet here): it answers PING with PONG, as the real UI
# does, and shows in its title what was posted to it.
FAKE_PERFETTO = """<!doctype html><title>waiting</title><script>
window.addEventListener('message', e => {
  if (e.data === 'PING') { e.source.postMessage('PONG', '*'); return; }
  const p = e.data && e.data.perfetto;
  if (!p) return;
  const b = new Uint8Array(p.buffer);
  document.title = JSON.stringify({fileName: p.fileName, title: p.title, bytes: b.length,
                                   gzip: b[0] === 0x1f && b[1] === 0x8b, origin: e.origin});
});
</script>"""


def test_open_in_perfetto_posts_the_served_trace(site, book_html):
    """Clicking "Open in Perfetto" beside a trace opens a ui.perfetto.dev window and, after its
    PONG, posts it the served trace, byte for byte (gzipped, as Perfetto reads it)."""
    page = "notebooks/kernels_in_one_token"
    ctx = site.browser.new_context(viewport=VIEWPORT, service_workers="block")
    try:

        def route(r):
            host = urlsplit(r.request.url).hostname
            if host == "ui.perfetto.dev":
                r.fulfill(status=200, content_type="text/html", body=FAKE_PERFETTO)
            elif host == "127.0.0.1":
                r.continue_()
            else:
                r.abort("blockedbyclient")

        ctx.route("**/*", route)
        p = ctx.new_page()
        p.set_default_timeout(PAGE_TIMEOUT_MS)
        p.goto(site.base + page + ".html", wait_until="load")
        link = p.locator("a.perfetto-open").first
        trace = link.get_attribute("data-trace")
        with ctx.expect_page() as opened:
            link.click()
        ui = opened.value
        ui.wait_for_function("document.title.startsWith('{')")
        got = json.loads(ui.title())
        assert urlsplit(ui.url).hostname == "ui.perfetto.dev"
    finally:
        ctx.close()
    served = (book_html / page).parent / trace
    assert got["fileName"] == Path(trace).name and got["fileName"] in got["title"]
    assert got["bytes"] == served.stat().st_size and got["gzip"], got
    assert got["origin"] == site.base.rstrip("/")
