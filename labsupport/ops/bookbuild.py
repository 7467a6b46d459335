"""Build the book (`make book`, and the nightly's staged build): check the runs first, run
jupyter-book with its output kept in a log, and when it fails say why in one line, last.

A run that is damaged is found before the build starts (labsupport.runs.check_published) and
reported as that one line. When the build fails anyway, the labsupport errors in its log
(a notebook's RunError, say) are found and the first is printed last, after jupyter-book's
own output, instead of being buried in it.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from labsupport import runs
from labsupport.ops import history
from labsupport.runs.provenance import REPO_ROOT

ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
ERROR = re.compile(r"\b(RunError|ParamError|NoGPUError): (.+)$")
HTML_DIR = REPO_ROOT / "_build" / "html"


class BuildError(RuntimeError):
    """The book did not build (the message is the one-line reason)."""


def check_runs(root: Path) -> None:
    """The runs the book replays are whole (every file, every trace, the declared columns of
    every table, every number in its range, no declared table empty) and the history reads:
    else one BuildError line naming the file (and the column and row of a bad value)."""
    from labsupport import chapters

    declared = {c.slug: c.columns for c in chapters.CHAPTERS}
    try:
        for run in runs.check_published(root).values():
            for name in run.meta["files"]:
                if name.endswith(".csv"):
                    df = run.table(name[:-4])  # every value in its declared range (chapters.RANGES)
                    if df.empty and name in declared.get(run.chapter, {}):
                        raise runs.RunError(f"{run.path / name} has no rows")
        history.read(root)
    except runs.RunError as e:
        raise BuildError(str(e)) from None


def first_error(log: str) -> str | None:
    """The first labsupport error line in a build log (colour codes removed)."""
    for line in ANSI.sub("", log).splitlines():
        m = ERROR.search(line)
        if m:
            return f"{m.group(1)}: {m.group(2).strip()}"
    return None


def build(runs_root: Path | None = None, out: Path | None = None, log: Path | None = None, echo: bool = True) -> Path:
    """Build the HTML from `runs_root` (default: runs/) into `out` (default: the repository's
    _build/); returns the HTML folder, or raises BuildError with one line."""
    root = runs_root or runs.runs_root()
    check_runs(root)
    log = log or REPO_ROOT / "build" / "book.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    jb = Path(sys.executable).with_name("jupyter-book")
    cmd = [
        str(jb) if jb.exists() else "jupyter-book",
        "build",
        str(REPO_ROOT),
        "--all",
        "--warningiserror",
        "--keep-going",
        "--builder",
        "html",
    ]
    if out is not None:
        cmd += ["--path-output", str(out)]
    env = {**os.environ, "LABSUPPORT_RUNS": str(root)}
    with open(log, "w") as f:
        p = subprocess.Popen(
            cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace"
        )
        for line in p.stdout:
            f.write(line)
            if echo:
                sys.stdout.write(line)
        rc = p.wait()
    if rc != 0:
        found = first_error(log.read_text(errors="replace"))
        raise BuildError(f"{found or f'jupyter-book exited with {rc}'} (full log: {log})")
    return (out / "_build" / "html") if out is not None else HTML_DIR
