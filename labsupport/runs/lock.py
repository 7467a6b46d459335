"""One writer at a time on a runs folder: `nightly` and `live` hold an exclusive lock on
<runs>/.lock for their whole run.

The lock is an flock on the runs folder itself, which the kernel releases when its holder
dies, however it dies, and which deleting or replacing the file cannot take away; the file
<runs>/.lock only says who holds it (pid, start time, command, run id). A second command stops
at once with one line naming the running one. A lock file left by a killed holder is stale:
the next command takes it over and is told whose it was, so it can clean up after it. What
the file says is untrusted (anyone can write it): `read_info` keeps only fields of the right
type and shape, and `recover` derives from it nothing but a run id to look for.
"""

from __future__ import annotations

import fcntl
import json
import os
import sys
from contextlib import contextmanager
from pathlib import Path

from labsupport.runs import paths, provenance

NAME = ".lock"
MAX_BYTES = 1 << 16
WHAT = ("nightly", "live", "live --no-publish", "recover", "derive", "test")


class LockError(RuntimeError):
    """The lock cannot be taken (the message is one line)."""


class Busy(LockError):
    """Another command holds the lock (the message is one line naming it)."""


class Lock:
    """A held lock: `stale` is what a killed holder had written (None if there was none)."""

    def __init__(self, path: Path, fd: int, info: dict, stale: dict | None, dir_fd: int = -1):
        self.path, self.fd, self.info, self.stale, self.dir_fd = path, fd, info, stale, dir_fd

    def note(self, **info) -> None:
        """Add to what the lock file says about this holder (e.g. the run id once chosen)."""
        self.info.update(info)
        data = (json.dumps(self.info, sort_keys=True) + "\n").encode()
        # Overwrite, then cut: on a full disk the blocks the file has are reused.
        os.pwrite(self.fd, data, 0)
        os.ftruncate(self.fd, len(data))
        os.fsync(self.fd)


def describe(info: dict) -> str:
    what = info.get("what", "a command")
    run = f" (run {info['run_id']})" if info.get("run_id") else ""
    return f"{what}{run}, pid {info.get('pid', '?')}, started {info.get('started', '?')}: {info.get('command', '?')}"


def read_info(raw: bytes) -> dict | None:
    """What a lock file says, as untrusted input: only `what` (a known command), `pid` (a
    positive int), `started`/`command` (short text), `run_id` (a run id) and `keep_runs` (a
    bool) are kept; anything else is dropped and noted under `invalid`."""
    if not raw.strip():
        return None
    try:
        info = json.loads(raw)
    except ValueError:
        return {"what": "unknown holder", "command": raw[:80].decode(errors="replace").strip(), "invalid": "not JSON"}
    if not isinstance(info, dict):
        return {"what": "unknown holder", "invalid": "not a JSON object"}
    out, dropped = {}, []
    checks = {
        "what": lambda v: isinstance(v, str) and v in WHAT,
        "pid": lambda v: isinstance(v, int) and not isinstance(v, bool) and 0 < v < 1 << 31,
        "started": lambda v: isinstance(v, str) and len(v) <= 40,
        "command": lambda v: isinstance(v, str) and len(v) <= 2000,
        "run_id": lambda v: isinstance(v, str) and bool(paths.RUN_ID_PATTERN.match(v)),
        "keep_runs": lambda v: isinstance(v, bool),
    }
    for key, value in info.items():
        if key in checks and checks[key](value):
            out[key] = value if key != "command" else " ".join(value.split())[:200]
        elif key != "aside":  # older locks named a folder; it is never used
            dropped.append(str(key)[:40])
    if dropped:
        out["invalid"] = f"ignored {', '.join(sorted(dropped))}"
    return out


def _read(fd: int) -> dict | None:
    return read_info(os.pread(fd, MAX_BYTES, 0))


def _holder(path: Path) -> dict:
    try:
        with open(path, "rb") as f:
            return read_info(f.read(MAX_BYTES)) or {}
    except OSError:
        return {}


def acquire(root: Path, what: str) -> Lock:
    """Take the lock of the runs folder `root`, or raise Busy naming the holder (LockError
    when the lock cannot be written, e.g. on a full disk: nothing is left behind)."""
    try:
        root.mkdir(parents=True, exist_ok=True)
        dir_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as e:
        raise LockError(f"cannot open the runs folder {root}: {e.strerror or e}") from None
    path = root / NAME
    try:
        fcntl.flock(dir_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(dir_fd)
        raise Busy(f"another {describe(_holder(path))} holds {path}; not starting") from None
    fd, raw = -1, b""
    try:
        if path.is_symlink() or (path.exists() and not path.is_file()):
            raise LockError(f"{path} is not a regular file; remove it (no command is running)")
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        raw = os.pread(fd, MAX_BYTES, 0)
        stale = read_info(raw)
        info = {
            "what": what,
            "pid": os.getpid(),
            "started": provenance.utc_now(),
            "command": " ".join(["python -m labsupport", *sys.argv[1:]]),
        }
        lock = Lock(path, fd, info, stale, dir_fd)
        lock.note()
    except BaseException as e:
        if fd >= 0:
            if not raw.strip():
                path.unlink(missing_ok=True)  # an empty lock file is never left
            elif os.pread(fd, MAX_BYTES, 0) != raw:  # a killed holder's note is kept for the next command
                try:
                    os.pwrite(fd, raw, 0)
                    os.ftruncate(fd, len(raw))
                except OSError:
                    pass
            os.close(fd)
        os.close(dir_fd)
        if isinstance(e, OSError):
            raise LockError(f"cannot write the lock {path}: {e.strerror or e}; nothing was started") from None
        raise
    return lock


def release(lock: Lock) -> None:
    """Remove the lock file, then let go of it (a waiting opener re-checks the inode)."""
    try:
        try:
            if os.fstat(lock.fd).st_ino == os.stat(lock.path).st_ino:
                lock.path.unlink()
        except FileNotFoundError:
            pass
    finally:
        os.close(lock.fd)
        if lock.dir_fd >= 0:
            os.close(lock.dir_fd)


@contextmanager
def held(root: Path, what: str):
    lock = acquire(root, what)
    try:
        yield lock
    finally:
        release(lock)
