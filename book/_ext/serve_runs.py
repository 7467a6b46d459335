"""Sphinx extension: serve the recorded runs with the book.

After an HTML build, the runs folder the book was built from (LABSUPPORT_RUNS, or runs/)
is copied to <html>/runs/, so a chapter page can link to the raw profiler trace behind a
figure. Written here because html_extra_path does not follow the links a staging runs
folder is made of, and copies dotfiles (incomplete runs) along.
"""
import os
import shutil
from pathlib import Path


def _copy_runs(app, exception):
    if exception is not None or app.builder.format != "html":
        return
    repo = Path(app.srcdir)
    src = Path(os.environ.get("LABSUPPORT_RUNS", repo / "runs"))
    dst = Path(app.outdir) / "runs"
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(src, dst, symlinks=False, ignore=shutil.ignore_patterns(".*"))


def setup(app):
    app.connect("build-finished", _copy_runs)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
