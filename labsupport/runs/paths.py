"""Where runs live and what their names may be: the runs folder, chapter names, run ids."""

from __future__ import annotations

import os
import re
from pathlib import Path

from labsupport.runs import provenance
from labsupport.runs.provenance import REPO_ROOT

MANIFEST = "published.json"
# The longest names allowed, so that every name derived from them stays well under the 255 bytes
# a file name may have: the longest, a packed run's scratch archive
# ".<chapter>-<run id>-<GPU slug>.tar.gz.tmp", is 1 + 64 + 1 + 80 + 1 + 40 + 11 = 198.
MAX_CHAPTER = 64
MAX_RUN_ID = 80
MAX_FILE_NAME = 100
# Each pattern matches a whole name of at most its length: `\Z`, never `$` (which also matches
# before a final newline), so that `.match` and `.fullmatch` agree wherever a pattern is used.
RUN_ID_PATTERN = re.compile(rf"(?=.{{1,{MAX_RUN_ID}}}\Z)[0-9]{{8}}T[0-9]{{6}}Z(-[A-Za-z0-9_]+)*\Z")
CHAPTER_PATTERN = re.compile(rf"(?=.{{1,{MAX_CHAPTER}}}\Z)[a-z0-9]+(-[a-z0-9]+)*\Z")
FILE_PATTERN = re.compile(rf"(?=.{{1,{MAX_FILE_NAME}}}\Z)[A-Za-z0-9_][A-Za-z0-9_+-]*(\.[A-Za-z0-9_+-]+)*\Z")


class RunError(RuntimeError):
    """A run that is missing, incomplete or corrupt (the message is one line naming it)."""


def _not_a(kind: str, name, limit: int, example: str, where: str) -> RunError:
    long = isinstance(name, str) and len(name) > limit
    shown = repr(name[:limit] + "…") if long else repr(name)
    why = f" ({len(name)} characters, more than {limit})" if long else ""
    return RunError(f"{where}: {shown} is not a {kind}{why} (e.g. {example})")


def check_chapter(chapter, where: str = "") -> str:
    """`chapter` if it is a chapter name (lower-case words joined by '-', at most MAX_CHAPTER
    characters), else RunError."""
    if not isinstance(chapter, str) or not CHAPTER_PATTERN.fullmatch(chapter):
        raise _not_a("chapter name", chapter, MAX_CHAPTER, "kernels-in-one-token", where or "chapter")
    return chapter


def check_run_id(run_id, where: str = "") -> str:
    """`run_id` if it is a run id (a UTC stamp, then tags; at most MAX_RUN_ID characters), else RunError."""
    if not isinstance(run_id, str) or not RUN_ID_PATTERN.fullmatch(run_id):
        raise _not_a("run id", run_id, MAX_RUN_ID, "20261129T233000Z-h200", where or "run id")
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
    """A sortable id: the UTC time, then an optional tag such as the GPU (cut to fit MAX_RUN_ID)."""
    stamp = provenance.utc_now().replace("-", "").replace(":", "")
    tag = re.sub(r"[^A-Za-z0-9]+", "-", tag).lower()[: MAX_RUN_ID - len(stamp) - 1].strip("-")
    return f"{stamp}-{tag}" if tag else stamp
