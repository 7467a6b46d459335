"""Publishing as one step: everything a publication changes is staged first, then a single
rename of runs/published.json commits it.

    p = promotion.stage(root, night_id, manifest, files, book_html, book_dir)  # may fail: nothing changed
    promotion.commit(p)                                                         # the flip, then completion

`stage` writes the new published.json, history.csv and drift reports into
runs/.promote-<id>/ and moves the built book beside its target (<book_dir>/../.html-<id>);
its plan.json, written last, records what goes where and the SHA-256 of the new manifest.
Until the flip, no published file and no byte of the served book has changed.

`commit` replaces runs/published.json with the staged one (the flip: from here on the
publication has happened), then completes it: the staged history and reports are renamed
into place and the book folder is exchanged with the staged one in one renameat2 call.
Signals are held off from the flip to the end of completion. Completion is idempotent: a
process killed after the flip leaves runs/.promote-<id>/ behind, and `recover` (run by the
next nightly or live command, under the lock) finishes it. A staged promotion whose manifest
was never flipped in is discarded by `recover`.
"""

from __future__ import annotations

import ctypes
import errno
import hashlib
import json
import os
import shutil
import signal
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from labsupport import runs
from labsupport.runs.writer import fsync_dir

PREFIX = ".promote-"
PLAN = "plan.json"
HELD_SIGNALS = {signal.SIGTERM, signal.SIGINT, signal.SIGHUP}


class PromotionError(RuntimeError):
    """Completing a flipped publication failed (the publication itself stands)."""


@dataclass
class Promotion:
    root: Path
    night: str
    stage: Path
    manifest_sha256: str
    files: list[str]  # paths under root, staged under stage/ with the same path
    book: Path | None = None  # the staged book, beside book_dir
    book_dir: Path | None = None
    book_inode: int | None = None

    @property
    def plan(self) -> dict:
        return {
            "night": self.night,
            "manifest_sha256": self.manifest_sha256,
            "files": self.files,
            "book": str(self.book) if self.book else None,
            "book_dir": str(self.book_dir) if self.book_dir else None,
            "book_inode": self.book_inode,
        }


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _fsync_dir(path: Path) -> None:
    fsync_dir(path)


def _write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def staged_book_path(book_dir: Path, night: str) -> Path:
    return book_dir.with_name(f".{book_dir.name}-{night}")


def stage(
    root: Path,
    night: str,
    manifest: dict[str, str],
    files: dict[str, bytes],
    book_html: Path | None = None,
    book_dir: Path | None = None,
) -> Promotion:
    """Stage a publication: the new manifest, whole files to replace under `root`
    (e.g. {"history.csv": ..., "nightly/<id>-drift.md": ...}) and optionally a built book
    for `book_dir`. Changes nothing that is published."""
    runs.check_run_id(night, "promotion")
    for rel in files:
        parts = Path(rel).parts
        if Path(rel).is_absolute() or ".." in parts or not all(runs.FILE_PATTERN.match(p) for p in parts):
            raise ValueError(f"cannot stage {rel!r}: not a plain path inside the runs folder")
    st = root / f"{PREFIX}{night}"
    if st.exists():
        shutil.rmtree(st)
    st.mkdir()
    data = runs.manifest_bytes(manifest)
    _write(st / runs.MANIFEST, data)
    for rel, content in files.items():
        _write(st / rel, content)
    p = Promotion(root, night, st, _sha(data), sorted(files))
    if book_html is not None:
        p.book_dir = Path(book_dir)
        p.book = staged_book_path(p.book_dir, night)
        p.book_dir.parent.mkdir(parents=True, exist_ok=True)
        if p.book.exists():
            shutil.rmtree(p.book)
        shutil.move(str(book_html), p.book)
        p.book_inode = os.stat(p.book).st_ino
    _write(st / PLAN, (json.dumps(p.plan, indent=2) + "\n").encode())
    _fsync_dir(st)
    return p


def load(stage_dir: Path) -> Promotion | None:
    """The promotion staged in `stage_dir`, or None when its plan was never written whole."""
    try:
        plan = json.loads((stage_dir / PLAN).read_text())
        return Promotion(
            stage_dir.parent,
            plan["night"],
            stage_dir,
            plan["manifest_sha256"],
            list(plan["files"]),
            Path(plan["book"]) if plan["book"] else None,
            Path(plan["book_dir"]) if plan["book_dir"] else None,
            plan["book_inode"],
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None


def flipped(p: Promotion) -> bool:
    """Whether the staged manifest is the published one (the publication happened)."""
    path = p.root / runs.MANIFEST
    return path.is_file() and _sha(path.read_bytes()) == p.manifest_sha256


@contextmanager
def signals_held():
    """Hold off SIGTERM, SIGINT and SIGHUP (they are delivered when the block ends)."""
    old = signal.pthread_sigmask(signal.SIG_BLOCK, HELD_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def flip(p: Promotion) -> None:
    """The one step that publishes: runs/published.json replaced by the staged manifest."""
    os.replace(p.stage / runs.MANIFEST, p.root / runs.MANIFEST)
    _fsync_dir(p.root)


def commit(p: Promotion) -> None:
    """Flip, then complete; a failure during completion is a PromotionError (the flip stands,
    and `recover` finishes the rest). A failure before the flip changed nothing."""
    with signals_held():
        try:
            flip(p)
        except BaseException:
            if not flipped(p):
                raise
        try:
            complete(p)
        except Exception as e:
            raise PromotionError(f"published, but completing the publication failed: {type(e).__name__}: {e}") from None


def complete(p: Promotion) -> None:
    """Put the staged history, reports and book in place (idempotent), then drop the stage."""
    for rel in p.files:
        src, dst = p.stage / rel, p.root / rel
        if src.exists():
            dst.parent.mkdir(parents=True, exist_ok=True)
            os.replace(src, dst)
            _fsync_dir(dst.parent)
    if p.book is not None:
        _install_book(p)
    shutil.rmtree(p.stage)
    _fsync_dir(p.root)


def _inode(path: Path) -> int | None:
    try:
        return os.lstat(path).st_ino
    except FileNotFoundError:
        return None


def _install_book(p: Promotion) -> None:
    if _inode(p.book_dir) == p.book_inode:
        return  # already in place; p.book (if any) holds the book it replaced
    if _inode(p.book) != p.book_inode:
        raise PromotionError(f"the staged book {p.book} is missing")
    if not p.book_dir.exists() and not p.book_dir.is_symlink():
        os.rename(p.book, p.book_dir)
    else:
        exchange(p.book, p.book_dir)
    _fsync_dir(p.book_dir.parent)


def exchange(a: Path, b: Path) -> None:
    """Swap two paths atomically (Linux renameat2 RENAME_EXCHANGE); where the system cannot,
    two renames, with `recover` finishing a swap cut between them."""
    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except AttributeError:
        fn = None
    if fn is not None:
        AT_FDCWD, RENAME_EXCHANGE = -100, 2
        if fn(AT_FDCWD, os.fsencode(str(a)), AT_FDCWD, os.fsencode(str(b)), RENAME_EXCHANGE) == 0:
            return
        err = ctypes.get_errno()
        if err not in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP):
            raise OSError(err, f"cannot exchange {a} and {b}: {os.strerror(err)}")
    aside = b.with_name(f".{b.name}-replaced")
    if aside.exists():
        shutil.rmtree(aside)
    os.rename(b, aside)
    os.rename(a, b)
    os.rename(aside, a)


def discard(p: Promotion | None, stage_dir: Path) -> None:
    """Drop a promotion that was never flipped in (its staged book too)."""
    if p is not None and p.book is not None and p.book.exists() and _inode(p.book) == p.book_inode:
        shutil.rmtree(p.book)
    shutil.rmtree(stage_dir, ignore_errors=True)


def cleanup(p: Promotion) -> None:
    """After completion: remove the book that the new one replaced."""
    if p.book is None:
        return
    if p.book.exists() and _inode(p.book) != p.book_inode:
        shutil.rmtree(p.book)
    aside = p.book_dir.with_name(f".{p.book_dir.name}-replaced")
    if aside.exists():
        shutil.rmtree(aside)


def pending(root: Path) -> list[Path]:
    return sorted(d for d in root.glob(f"{PREFIX}*") if d.is_dir()) if root.is_dir() else []


def recover(root: Path) -> list[str]:
    """Finish every flipped promotion left by a killed process and discard the others;
    returns one line per promotion handled. Call with the lock held."""
    done = []
    for d in pending(root):
        p = load(d)
        if p is not None and flipped(p):
            with signals_held():
                complete(p)
            cleanup(p)
            done.append(f"completed the publication of {p.night} (it was interrupted after its flip)")
        else:
            discard(p, d)
            done.append(f"discarded the staged publication {d.name} (never flipped in)")
    return done
