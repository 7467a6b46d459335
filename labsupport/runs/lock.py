"""One writer at a time on a runs folder: `nightly` and `live` hold an exclusive lock on
<runs>/.lock for their whole run.

The lock is an flock on that file, which the kernel releases when its holder dies, however it
dies; the file holds who took it (pid, start time, command, run id). A second command stops at
once with one line naming the running one. A lock file left by a killed holder is stale: the
next command takes it over and is told whose it was, so it can clean up after it.
"""

from __future__ import annotations

import fcntl
import json
import os
import sys
from contextlib import contextmanager
from pathlib import Path

from labsupport.runs import provenance

NAME = ".lock"


class Busy(RuntimeError):
    """Another command holds the lock (the message is one line naming it)."""


class Lock:
    """A held lock: `stale` is what a killed holder had written (None if there was none)."""

    def __init__(self, path: Path, fd: int, info: dict, stale: dict | None):
        self.path, self.fd, self.info, self.stale = path, fd, info, stale

    def note(self, **info) -> None:
        """Add to what the lock file says about this holder (e.g. the run id once chosen)."""
        self.info.update(info)
        data = (json.dumps(self.info, sort_keys=True) + "\n").encode()
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, data, 0)
        os.fsync(self.fd)


def describe(info: dict) -> str:
    what = info.get("what", "a command")
    run = f" (run {info['run_id']})" if info.get("run_id") else ""
    return f"{what}{run}, pid {info.get('pid', '?')}, started {info.get('started', '?')}: {info.get('command', '?')}"


def _read(fd: int) -> dict | None:
    raw = os.pread(fd, 1 << 16, 0)
    if not raw.strip():
        return None
    try:
        info = json.loads(raw)
    except ValueError:
        return {"what": "unknown holder", "command": raw[:80].decode(errors="replace").strip()}
    return info if isinstance(info, dict) else {"what": "unknown holder"}


def acquire(root: Path, what: str) -> Lock:
    """Take the lock of the runs folder `root`, or raise Busy naming the holder."""
    root.mkdir(parents=True, exist_ok=True)
    path = root / NAME
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read(fd) or {}
            os.close(fd)
            raise Busy(f"another {describe(holder)} holds {path}; not starting") from None
        # The holder before us may have removed the file between our open and our flock.
        try:
            same = os.stat(path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    stale = _read(fd)
    info = {
        "what": what,
        "pid": os.getpid(),
        "started": provenance.utc_now(),
        "command": " ".join(["python -m labsupport", *sys.argv[1:]]),
    }
    lock = Lock(path, fd, info, stale)
    lock.note()
    return lock


def release(lock: Lock) -> None:
    """Remove the lock file, then let go of it (a waiting opener re-checks the inode)."""
    try:
        lock.path.unlink(missing_ok=True)
    finally:
        os.close(lock.fd)


@contextmanager
def held(root: Path, what: str):
    lock = acquire(root, what)
    try:
        yield lock
    finally:
        release(lock)
