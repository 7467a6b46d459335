"""Sphinx extension: the gallery page (book/gallery.md), its tables made from the runs under
runs/gallery/ and the book's published runs (labsupport.ops.gallery_page), and a zip per
gallery run under <html>/download/gallery/ to download it.

The tables are added when the page's source is read, as raw HTML in which every text from a
run is escaped; a damaged gallery run stops the build with the RunError naming it, as a damaged
published run does. Each zip holds runs/<chapter>/<run id>/ with only the files its meta.json
lists (and meta.json, pack.json), copied after the run was loaded checked, never a link.
"""

import os
import shutil
import zipfile
from pathlib import Path

PAGE = "book/gallery"
MARK = "<!-- gallery tables -->"


def _root(app) -> Path:
    return Path(os.environ.get("LABSUPPORT_RUNS", Path(app.srcdir) / "runs"))


def _tables(app, docname, source):
    if docname != PAGE:
        return
    from labsupport.ops import gallery_page

    table = gallery_page.html(gallery_page.rows(_root(app)), prefix="../")
    source[0] = source[0].replace(MARK, "```{raw} html\n" + table + "\n```")


def write_zips(root: Path, dst: Path) -> list[Path]:
    """One zip per gallery run in `dst`; returns them."""
    from labsupport.ops import gallery, gallery_page, pack

    dst.mkdir(parents=True, exist_ok=True)
    out = []
    for e in gallery.entries(root):
        path = dst / gallery_page.download_name(e)
        with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
            for name in [*sorted(e.run.meta["files"]), "meta.json", pack.PACK_JSON]:
                src = e.run.path / name
                if src.is_symlink() or not src.is_file():
                    continue
                # A trace is gzip already: stored as it is, not compressed a second time for nothing.
                stored = zipfile.ZIP_STORED if src.suffix == ".gz" else None
                z.write(src, f"runs/{e.run.chapter}/{e.run.run_id}/{name}", compress_type=stored)
        out.append(path)
    return out


def _serve(app, exception):
    if exception is not None or app.builder.format != "html":
        return
    from labsupport.ops import gallery_page

    dst = Path(app.outdir) / gallery_page.DOWNLOADS
    shutil.rmtree(dst, ignore_errors=True)
    write_zips(_root(app), dst)


def setup(app):
    app.connect("source-read", _tables)
    # After serve_package (priority 500), which empties <html>/download/ first.
    app.connect("build-finished", _serve, priority=650)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
