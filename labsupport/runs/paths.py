"""Where runs live and what their names may be: the runs folder, chapter names, run ids."""

from __future__ import annotations

import os
import re
from pathlib import Path

from labsupport.runs import provenance
from labsupport.runs.provenance import REPO_ROOT

MANIFEST = "published.json"
RUN_ID_PATTERN = re.compile(r"^[0-9]{8}T[0-9]{6}Z(-[A-Za-z0-9_]+)*$")
CHAPTER_PATTERN = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)*$")
FILE_PATTERN = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_+-]*(\.[A-Za-z0-9_+-]+)*$")


class RunError(RuntimeError):
    """A run that is missing, incomplete or corrupt (the message is one line naming it)."""


def check_chapter(chapter, where: str = "") -> str:
    """`chapter` if it is a chapter name (lower-case words joined by '-'), else RunError."""
    if not isinstance(chapter, str) or not CHAPTER_PATTERN.match(chapter):
        raise RunError(f"{where or 'chapter'}: {chapter!r} is not a chapter name (e.g. kernels-in-one-token)")
    return chapter


def check_run_id(run_id, where: str = "") -> str:
    """`run_id` if it is a run id, else RunError."""
    if not isinstance(run_id, str) or not RUN_ID_PATTERN.match(run_id):
        raise RunError(f"{where or 'run id'}: {run_id!r} is not a run id (e.g. 20261129T233000Z-h200)")
    return run_id


def run_dir(chapter: str, run_id: str, root: Path | None = None, where: str = "") -> Path:
    """The folder of a run, after checking both names and that it lies inside the runs folder
    (neither the chapter folder nor the run folder may be a link)."""
    root = root or runs_root()
    check_chapter(chapter, where)
    check_run_id(run_id, where)
    path = root / chapter / run_id
    for p in (root / chapter, path):
        if p.is_symlink():
            raise RunError(f"{p} is a symbolic link; runs are read only from real folders under {root}")
    if path.exists() and not path.resolve().is_relative_to(root.resolve()):
        raise RunError(f"{path} resolves outside {root}")
    return path


def inside(root: Path, rel, where: str) -> Path:
    """`root`/`rel` after checking `rel` is a plain relative path of plain names (no '..', not
    absolute, no hidden part) whose every existing step is a real folder or file under `root`
    (no symbolic link on the way) on the same filesystem; else one RunError naming `where`."""
    if not isinstance(rel, str) or not rel or rel.startswith("/") or "\\" in rel:
        raise RunError(f"{where}: {rel!r} is not a plain relative path inside {root}")
    parts = rel.split("/")
    if not all(FILE_PATTERN.match(p) for p in parts):
        raise RunError(f"{where}: {rel!r} is not a plain relative path inside {root} (no '..', no hidden names)")
    dev = os.stat(root).st_dev
    path = root
    for part in parts:
        path = path / part
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            break
        if path.is_symlink():
            raise RunError(f"{where}: {path} is a symbolic link; refusing to follow it")
        if st.st_dev != dev:
            raise RunError(f"{where}: {path} is on another filesystem than {root}")
    return path


def check_real_dir(path: Path, where: str = "") -> Path:
    """`path` if it is not a symbolic link (it may not exist yet), else one RunError."""
    if path.is_symlink():
        raise RunError(f"{where + ': ' if where else ''}{path} is a symbolic link; refusing to write through it")
    return path


def runs_root() -> Path:
    """The runs folder (LABSUPPORT_RUNS overrides it, for tests, scratch runs and a reader's
    runs folder anywhere, `~` allowed): the book's runs/ in a checkout of the book, else runs/
    in the working directory (a reader who installed labsupport from the book's wheel and
    unpacked a chapter's runs, served by the book, beside its notebook)."""
    if os.environ.get("LABSUPPORT_RUNS"):
        return Path(os.environ["LABSUPPORT_RUNS"]).expanduser()
    return REPO_ROOT / "runs" if (REPO_ROOT / "_toc.yml").is_file() else Path.cwd() / "runs"


def new_run_id(tag: str = "") -> str:
    """A sortable id: the UTC time, then an optional tag such as the GPU."""
    stamp = provenance.utc_now().replace("-", "").replace(":", "")
    tag = re.sub(r"[^A-Za-z0-9]+", "-", tag).strip("-").lower()
    return f"{stamp}-{tag}" if tag else stamp
