"""Drive labsupport.ops.nightly fast and break it on purpose, in this process or in a child.

The chapters do not run: `run_chapters` records, as the night's run, a copy of the chapter's
published run (new run id, same files), and the book build writes a tiny HTML folder that
names the runs it was built from. Everything else is the nightly's own code: the lock,
leftovers, checks, validation, drift, history, staging, the flip, completion, pruning.

`inject(point, when, how)` makes the function at `point` fail before or after it runs:
how="raise" raises, how="kill" ends the process at once (os._exit, as kill -9 would: no
handler, no clean-up), how="term" sends this process SIGTERM.

    python -m tests.nightly_driver RUNS NIGHTLY_DIR BOOK_DIR [POINT WHEN HOW]
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import time
from pathlib import Path

from labsupport import runs
from labsupport.ops import bookbuild, history, leftovers, live, nightly
from labsupport.runs import promotion, provenance

CHAPTER = "kernels-in-one-token"

# name: (module, function), in the order the nightly reaches them
POINTS = {
    "recover": (leftovers, "recover"),
    "check_inputs": (nightly, "check_inputs"),
    "run_chapters": (nightly, "run_chapters"),
    "validate_runs": (nightly, "validate_runs"),
    "write_drift": (nightly, "write_drift"),
    "history": (history, "with_rows"),
    "build_book": (nightly, "build_book"),
    "stage": (promotion, "stage"),
    "flip": (promotion, "flip"),
    "install_book": (promotion, "_install_book"),
    "complete": (promotion, "complete"),
    "cleanup": (promotion, "cleanup"),
    "prune": (nightly, "prune"),
}
# Points whose "after" is past the flip (the night is published there).
PUBLISHED_AFTER = {"flip", "install_book", "complete", "cleanup", "prune"}


class Injected(RuntimeError):
    pass


def fake_run_chapters(selected, run_id, params, out_dir):
    """Record, as run `run_id` of each chapter, a copy of its published run."""
    seconds = {}
    for ch in selected:
        src = runs.load_run(ch)
        # recorded now, at this checkout's commit (a run must name a commit of the history to pass)
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        prov = {**src.provenance, "utc_time": now, "git_commit": provenance.git_commit()}
        with runs.RunWriter(ch, src.parameters, run_id, meta={"provenance": prov}) as w:
            for name in src.meta["files"]:
                shutil.copyfile(src.path / name, w.path / name)
            w.extra.update(src.results)
            w.derive = lambda folder, src=src: src.meta.get("derived", {})  # its replay tables, copied with the rest
        seconds[ch.slug] = 1.0
    return seconds


def fake_book(runs_root=None, out=None, log=None, echo=True):
    """A tiny 'book': one page naming the published runs and the history's length."""
    root = Path(runs_root)
    html = Path(out) / "_build" / "html"
    html.mkdir(parents=True)
    rows = len(history.read(root))
    (html / "index.html").write_text(f"<p>{json.dumps(runs.published(root), sort_keys=True)} {rows} rows</p>\n")
    shutil.copytree(root / "nightly", html / "nightly")
    return html


def install(nightly_dir: Path, book_dir: Path, setattr_=setattr) -> None:
    """The fakes, and the nightly's folders redirected (the runs folder is LABSUPPORT_RUNS)."""
    setattr_(nightly, "NIGHTLY_DIR", nightly_dir)
    setattr_(nightly, "BOOK_DIR", book_dir)
    setattr_(nightly, "run_chapters", fake_run_chapters)
    setattr_(bookbuild, "build", fake_book)
    setattr_(live, "check_gpu", lambda allow_cpu: None)
    setattr_(live, "gpu_tag", lambda: "cpu")


def inject(point: str, when: str, how: str, setattr_=setattr) -> None:
    module, name = POINTS[point]
    real = getattr(module, name)

    def fail():
        if how == "kill":
            os._exit(137)
        if how == "term":
            os.kill(os.getpid(), signal.SIGTERM)
            return
        raise Injected(f"injected failure {when} {point}")

    def wrapper(*args, **kw):
        if when == "before":
            fail()
        out = real(*args, **kw)
        if when == "after":
            fail()
        return out

    setattr_(module, name, wrapper)


def main(argv) -> int:
    runs_dir, nightly_dir, book_dir = map(Path, argv[:3])
    os.environ["LABSUPPORT_RUNS"] = str(runs_dir)
    install(nightly_dir, book_dir)
    if len(argv) > 3:
        inject(*argv[3:6])
    return nightly.main([CHAPTER], {}, allow_cpu=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
