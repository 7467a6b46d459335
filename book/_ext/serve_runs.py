"""Sphinx extension: serve the published runs with the book.

After an HTML build, the published runs of the runs folder the book was built from
(LABSUPPORT_RUNS, or runs/) are copied to <html>/runs/<chapter>/<run id>/, so a chapter page
can link to the raw profiler trace behind a figure. Only what a published run's meta.json
lists is copied, each run checked whole first, and a symbolic link anywhere on the way is
refused (labsupport.runs.copy_published): nothing outside the runs folder reaches the HTML.
"""

import os
import shutil
from pathlib import Path


def _copy_runs(app, exception):
    if exception is not None or app.builder.format != "html":
        return
    from labsupport import runs

    repo = Path(app.srcdir)
    src = Path(os.environ.get("LABSUPPORT_RUNS", repo / "runs"))
    dst = Path(app.outdir) / "runs"
    shutil.rmtree(dst, ignore_errors=True)
    runs.copy_published(dst, src, link=False)


def setup(app):
    app.connect("build-finished", _copy_runs)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
