"""Sphinx extension: serve the published runs with the book, and each chapter's as one download.

After an HTML build, the published runs of the runs folder the book was built from
(LABSUPPORT_RUNS, or runs/) are copied to <html>/runs/<chapter>/<run id>/, so a chapter page
can link to the raw profiler trace behind a figure. Only what a published run's meta.json
lists is copied, each run checked whole first, and a symbolic link anywhere on the way is
refused (labsupport.runs.copy_published): nothing outside the runs folder reaches the HTML.

Then <html>/download/runs/<chapter>.zip holds what a reader needs to replay that one chapter
outside the repository: a folder `runs/` with the chapter's published run, the published runs
of the chapters it reads (its registry entry's `reads`, and theirs) and of the owners of the
shared quantities (labsupport.chapters.shared), and a published.json naming them. Unpacked
beside the notebook, `runs/` is the runs folder a replay finds (or point LABSUPPORT_RUNS at
it). The page "Run a chapter yourself" links them, in a table this extension writes where the
page has the line DOWNLOADS: a row per chapter of the registry, named by its notebook's title.
"""

import os
import shutil
import tempfile
import zipfile
from pathlib import Path

ARCHIVES = Path("download") / "runs"  # under the HTML folder
DOWNLOADS = "<!-- serve_runs: the table of each chapter's runs -->"


def downloads_table() -> str:
    """A row per chapter, in book order: its title (its notebook's first heading) and its zip."""
    import json

    from labsupport import chapters

    rows = ["| chapter | its runs |", "|---|---|"]
    for c in chapters.CHAPTERS:
        title = "".join(json.loads(c.path.read_text())["cells"][0]["source"]).splitlines()[0].removeprefix("# ")
        rows.append(f'| {title} | <a href="../{ARCHIVES.as_posix()}/{c.slug}.zip" download>{c.slug}.zip</a> |')
    return "\n".join(rows)


def _write_downloads(app, docname, source):
    if DOWNLOADS in source[0]:
        source[0] = source[0].replace(DOWNLOADS, downloads_table())


def needed(slug: str) -> list[str]:
    """The chapters whose published runs a replay of chapter `slug` loads: itself, what it
    reads (and what those read), and the owners of the shared quantities."""
    from labsupport import chapters
    from labsupport.chapters import shared

    by_slug = {c.slug: c for c in chapters.CHAPTERS}
    out, todo = [], [slug, *shared.OWNERS]
    while todo:
        s = todo.pop(0)
        if s in out:
            continue
        out.append(s)
        todo += list(by_slug[s].reads) if s in by_slug else []
    return out


def chapter_archives(src: Path, dst: Path, manifest: dict[str, str]) -> dict[str, Path]:
    """One zip per chapter of `manifest` in `dst` (<chapter>.zip, holding runs/...): the runs
    `needed` names that `manifest` has, copied and checked by labsupport.runs.copy_published."""
    from labsupport import runs

    dst.mkdir(parents=True, exist_ok=True)
    out = {}
    for slug in sorted(manifest):
        subset = {s: manifest[s] for s in needed(slug) if s in manifest}
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp) / "runs"
            runs.copy_published(folder, src, manifest=subset, link=True)
            path = dst / f"{slug}.zip"
            with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
                for f in sorted(folder.rglob("*")):
                    if f.is_file():  # a trace (gzip already) stored as it is
                        z.write(f, f.relative_to(tmp).as_posix(), zipfile.ZIP_STORED if f.suffix == ".gz" else None)
        out[slug] = path
    return out


def _copy_runs(app, exception):
    if exception is not None or app.builder.format != "html":
        return
    from labsupport import runs

    repo = Path(app.srcdir)
    src = Path(os.environ.get("LABSUPPORT_RUNS", repo / "runs"))
    dst = Path(app.outdir) / "runs"
    shutil.rmtree(dst, ignore_errors=True)
    runs.copy_published(dst, src, link=False)


def _serve_archives(app, exception):
    if exception is not None or app.builder.format != "html":
        return
    from labsupport import runs

    repo = Path(app.srcdir)
    src = Path(os.environ.get("LABSUPPORT_RUNS", repo / "runs"))
    dst = Path(app.outdir) / ARCHIVES
    shutil.rmtree(dst, ignore_errors=True)
    chapter_archives(src, dst, runs.published(src))


def setup(app):
    app.connect("source-read", _write_downloads)
    app.connect("build-finished", _copy_runs)
    # After serve_package (priority 500), which empties <html>/download/ first.
    app.connect("build-finished", _serve_archives, priority=600)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
