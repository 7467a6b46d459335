"""Sphinx extension: serve what a reader needs to run a downloaded chapter on their own GPU.

After an HTML build, <html>/download/ holds a wheel of labsupport built from the sources the
book was built from (in a scratch copy, so no stale build folder leaks into it) and the
requirements a GPU box needs beside its own PyTorch and transformers. The page "Run a chapter
yourself" links them.
"""

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path


def _serve(app, exception):
    if exception is not None or app.builder.format != "html":
        return
    repo = Path(app.srcdir)
    dst = Path(app.outdir) / "download"
    shutil.rmtree(dst, ignore_errors=True)
    dst.mkdir(parents=True)
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "src"
        shutil.copytree(repo / "labsupport", src / "labsupport", ignore=shutil.ignore_patterns("__pycache__"))
        shutil.copy(repo / "pyproject.toml", src / "pyproject.toml")
        subprocess.run(
            [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(dst), str(src)],
            check=True,
        )
    shutil.copy(repo / "requirements-gpubox.txt", dst / "requirements-gpubox.txt")


def setup(app):
    app.connect("build-finished", _serve)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
