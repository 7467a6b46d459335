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
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from labsupport import runs
from labsupport.runs.paths import inside
from labsupport.runs.writer import fsync_dir

PREFIX = ".promote-"
PLAN = "plan.json"
HELD_SIGNALS = {signal.SIGTERM, signal.SIGINT, signal.SIGHUP}


class PromotionError(RuntimeError):
    """Completing a flipped publication failed (the publication itself stands)."""


class PlanError(runs.RunError):
    """A plan.json that is not one this code wrote: one line naming it; nothing is moved."""


DONE_PREFIX = ".promoted-"  # a completed stage, renamed so, then deleted
DISCARDED_PREFIX = ".discarded-"  # a stage never flipped in, renamed so, then deleted
PLAN_KEYS = {"night", "manifest_sha256", "files", "book", "book_dir", "book_inode"}
MAX_PLAN_BYTES = 1 << 20
MAX_PLAN_FILES = 1000


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
        try:
            inside(root, rel, "staging a publication")
        except runs.RunError as e:
            raise ValueError(str(e)) from None
    st = root / f"{PREFIX}{night}"
    if st.is_symlink():
        raise ValueError(f"{st} is a symbolic link; not staging through it")
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


def load(stage_dir: Path, book_dir: Path | None = None) -> Promotion | None:
    """The promotion staged in `stage_dir`, or None when its plan was never written whole
    (missing, or cut short: not JSON). A plan that parses but is not one `stage` could have
    written is a PlanError naming it: its night must be the folder's, every file a plain path
    inside the runs folder (no link on the way), and its book, if any, the book folder this
    project serves (`book_dir`, from the project's own layout, never from the plan) and the
    staged folder beside it."""
    path = stage_dir / PLAN
    try:
        if path.is_symlink():
            raise PlanError(f"{path} is a symbolic link; not following it, nothing was moved or deleted")
        with open(path, "rb") as f:
            raw = f.read(MAX_PLAN_BYTES + 1)
    except OSError:
        return None
    if len(raw) > MAX_PLAN_BYTES:
        raise PlanError(f"{path} is larger than any plan this code writes; nothing was moved or deleted")
    try:
        plan = json.loads(raw)
    except ValueError:
        return None
    return _parse_plan(plan, stage_dir, book_dir, path)


def _parse_plan(plan, stage_dir: Path, book_dir: Path | None, path: Path) -> Promotion:
    def bad(why: str):
        return PlanError(f"{path} is not a plan this code wrote: {why}; nothing was moved or deleted")

    if not isinstance(plan, dict) or set(plan) != PLAN_KEYS:
        raise bad(f"expected exactly the keys {', '.join(sorted(PLAN_KEYS))}")
    night = plan["night"]
    if not isinstance(night, str) or not runs.RUN_ID_PATTERN.match(night) or stage_dir.name != f"{PREFIX}{night}":
        raise bad(f"night {night!r} is not the run id of its folder {stage_dir.name}")
    sha = plan["manifest_sha256"]
    if not isinstance(sha, str) or len(sha) != 64 or any(c not in "0123456789abcdef" for c in sha):
        raise bad("manifest_sha256 is not a SHA-256 digest")
    files = plan["files"]
    if not isinstance(files, list) or len(files) > MAX_PLAN_FILES:
        raise bad("files is not a list of paths")
    root = stage_dir.parent
    for rel in files:
        try:
            inside(root, rel, str(path))
            inside(stage_dir, rel, str(path))
        except runs.RunError as e:
            raise bad(str(e).split(": ", 1)[-1]) from None
    book, bdir, inode = plan["book"], plan["book_dir"], plan["book_inode"]
    if book is None and bdir is None and inode is None:
        return Promotion(root, night, stage_dir, sha, list(files))
    if book_dir is None:
        raise bad("it names a book folder, and this command serves none")
    book_dir = Path(book_dir)
    if bdir != str(book_dir) or book != str(staged_book_path(book_dir, night)):
        raise bad(f"its book folders are not {book_dir} and the staged one beside it")
    if not isinstance(inode, int) or isinstance(inode, bool) or inode < 0:
        raise bad("book_inode is not an inode number")
    for p in (book_dir.parent, book_dir, Path(book)):
        if p.is_symlink():
            raise bad(f"{p} is a symbolic link")
    return Promotion(root, night, stage_dir, sha, list(files), Path(book), book_dir, inode)


def flipped(p: Promotion) -> bool:
    """Whether the staged manifest is the published one (the publication happened)."""
    path = p.root / runs.MANIFEST
    return path.is_file() and _sha(path.read_bytes()) == p.manifest_sha256


@contextmanager
def signals_held():
    """Hold off SIGTERM, SIGINT and SIGHUP (they are delivered when the block ends). Blocked
    in this thread and, since a signal sent to the process may reach another thread (one of
    a library's), also caught by a handler that only notes it, then re-raised at the end."""
    if threading.current_thread() is not threading.main_thread():
        old = signal.pthread_sigmask(signal.SIG_BLOCK, HELD_SIGNALS)
        try:
            yield
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)
        return
    noted: list[int] = []
    handlers = {s: signal.signal(s, lambda signum, frame: noted.append(signum)) for s in HELD_SIGNALS}
    old = signal.pthread_sigmask(signal.SIG_BLOCK, HELD_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)  # one blocked here is noted now
        for s, h in handlers.items():
            signal.signal(s, h)
        for s in dict.fromkeys(noted):
            signal.raise_signal(s)


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
        src, dst = inside(p.stage, rel, str(p.stage / PLAN)), inside(p.root, rel, str(p.stage / PLAN))
        if src.exists():
            dst.parent.mkdir(parents=True, exist_ok=True)
            os.replace(src, dst)
            _fsync_dir(dst.parent)
    if p.book is not None:
        _install_book(p)
    _drop(p.stage, DONE_PREFIX)
    _fsync_dir(p.root)


def _drop(stage_dir: Path, prefix: str) -> None:
    """Rename a stage to <prefix><night> (one step: no half-deleted .promote- folder is ever
    seen), then delete it; `recover` deletes one a kill left."""
    gone = stage_dir.with_name(prefix + stage_dir.name[len(PREFIX) :])
    if gone.exists():
        shutil.rmtree(gone)
    os.rename(stage_dir, gone)
    shutil.rmtree(gone)


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
    if stage_dir.is_symlink():
        raise PlanError(f"{stage_dir} is a symbolic link; nothing was deleted")
    if p is not None and p.book is not None and p.book.exists() and _inode(p.book) == p.book_inode:
        shutil.rmtree(p.book)
    if stage_dir.is_dir():
        _drop(stage_dir, DISCARDED_PREFIX)


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
    """Staged publications (real folders; a link named so is refused by `recover`)."""
    if not root.is_dir():
        return []
    return sorted(d for d in root.glob(f"{PREFIX}*") if d.is_dir() or d.is_symlink())


def recover(root: Path, book_dir: Path | None = None) -> list[str]:
    """Finish every flipped promotion left by a killed process and discard the others;
    returns one line per promotion handled. Call with the lock held. `book_dir` is the book
    folder this project serves (its layout, not the plan, says where books go). A plan that
    is not one this code wrote is a PlanError: nothing is moved or deleted."""
    done = []
    for d in pending(root):
        if d.is_symlink():
            raise PlanError(f"{d} is a symbolic link, not a staged publication; nothing was moved or deleted")
        p = load(d, book_dir)
        if p is not None and flipped(p):
            with signals_held():
                complete(p)
            cleanup(p)
            done.append(f"completed the publication of {p.night} (it was interrupted after its flip)")
        else:
            discard(p, d)
            done.append(f"discarded the staged publication {d.name} (never flipped in)")
    for prefix, what in ((DONE_PREFIX, "completed"), (DISCARDED_PREFIX, "discarded")):
        for d in sorted(root.glob(f"{prefix}*")) if root.is_dir() else []:
            if d.is_dir() and not d.is_symlink():
                shutil.rmtree(d)
                done.append(f"removed the remains of the {what} publication {d.name[len(prefix) :]}")
    return done
