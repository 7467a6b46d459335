"""Sphinx extension: the gallery page (book/gallery.md), its tables made from the runs under
runs/gallery/ and the book's published runs (labsupport.ops.gallery_page), and a zip per
gallery run under <html>/download/gallery/ to download it.

The page holds the directive `gallery-tables`; its HTML is made in Python, every text from a run
escaped by labsupport.ops.run_text, and put on the page as a raw HTML node: no text of a run is
ever in the page's source, so none is read by the MyST parser (a backtick fence or a directive in
a GPU's name stays text). A damaged gallery run stops the build with the RunError naming it, as a
damaged published run does; a run that fails gallery_row.problems is left out, with a line
saying why. Each zip holds runs/<chapter>/<run id>/ with only the files its meta.json lists (and
meta.json, pack.json), copied after the run was loaded checked, never a link. *Run a chapter
yourself* holds `profile-report`: the report of the gallery's newest `profile` run, a literal block.
"""

import os
import shutil
import zipfile
from pathlib import Path

from docutils import nodes
from sphinx.util.docutils import SphinxDirective


def _root(app) -> Path:
    return Path(os.environ.get("LABSUPPORT_RUNS", Path(app.srcdir) / "runs"))


class GalleryTables(SphinxDirective):
    """The gallery's tables, as HTML made from the runs: one raw HTML node, never MyST."""

    def run(self):
        from labsupport.ops import gallery_page

        prefix = "../" * self.env.docname.count("/")  # from the page to the HTML folder's root
        table = gallery_page.html(gallery_page.gather(_root(self.env.app)), prefix=prefix)
        return [nodes.raw("", table, format="html")]


class ProfileReport(SphinxDirective):
    """What `python -m labsupport profile` printed for the newest such run of the gallery, made
    from the run (labsupport.ops.profile.report) as a literal block: docutils escapes its text."""

    def run(self):
        from labsupport.ops import gallery, profile

        run = profile.example([e.run for e in gallery.entries(_root(self.env.app))])
        if run is None:
            return [nodes.paragraph(text="The gallery holds no run of profile yet.")]
        src = run.results["model_source"]
        said = (
            f"What it printed for {src['architecture']} from {src['folder']}/ on {run.provenance['gpu']}, "
            f"run {run.run_id} of the gallery:"
        )
        return [nodes.paragraph(text=said), nodes.literal_block(text="\n".join(profile.report(run)))]


def write_zips(root: Path, dst: Path) -> list[Path]:
    """One zip per gallery run in `dst`; returns them."""
    from labsupport.ops import gallery, gallery_page

    dst.mkdir(parents=True, exist_ok=True)
    out = []
    for e in gallery.entries(root):
        path = dst / gallery_page.download_name(e)
        with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
            for name in gallery.files(e):
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
    app.add_directive("gallery-tables", GalleryTables)
    app.add_directive("profile-report", ProfileReport)
    # After serve_package (priority 500), which empties <html>/download/ first.
    app.connect("build-finished", _serve, priority=650)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
