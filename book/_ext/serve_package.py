"""Sphinx extension: serve what a reader needs to run a downloaded chapter on their own GPU.

After an HTML build, <html>/download/ holds a wheel of labsupport built from the sources the
book was built from (in a scratch copy, so no stale build folder leaks into it) and the
requirements a GPU box needs beside its own PyTorch and transformers. The page "Run a chapter
yourself" links them. The wheel is built while the pages are read (pip in its own process,
started when the builder starts), so that it adds nothing to the build's time.
"""

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

_pending: dict = {}  # the wheel being built: its scratch folder and pip's process


def _start(app):
    if app.builder.format != "html":
        return
    repo = Path(app.srcdir)
    scratch = Path(tempfile.mkdtemp(prefix="labsupport-wheel-"))
    src = scratch / "src"
    shutil.copytree(repo / "labsupport", src / "labsupport", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(repo / "pyproject.toml", src / "pyproject.toml")
    pip = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q"]
    _pending.update(scratch=scratch, proc=subprocess.Popen([*pip, "-w", str(scratch / "wheel"), str(src)]))


def _serve(app, exception):
    if not _pending:
        return
    scratch, proc = _pending.pop("scratch"), _pending.pop("proc")
    try:
        if exception is not None:
            proc.kill()
            proc.wait()
            return
        if proc.wait() != 0:
            raise RuntimeError(f"pip wheel of labsupport exited with {proc.returncode}")
        dst = Path(app.outdir) / "download"
        shutil.rmtree(dst, ignore_errors=True)
        dst.mkdir(parents=True)
        for wheel in (scratch / "wheel").glob("*.whl"):
            shutil.copy(wheel, dst / wheel.name)
        shutil.copy(Path(app.srcdir) / "requirements-gpubox.txt", dst / "requirements-gpubox.txt")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def setup(app):
    app.connect("builder-inited", _start)
    app.connect("build-finished", _serve)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
