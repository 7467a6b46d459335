"""No orphans: the nightly and live commands end every process they started (a notebook's
kernel, jupyter-book and its kernels, fresh timing processes) on every exit path, SIGTERM and
SIGINT included (`Stopped`), and remove their scratch folder (TMPDIR of their children, inside
their log folder)."""

from __future__ import annotations

import os
import shutil
import signal
import time
from contextlib import contextmanager, suppress
from pathlib import Path

SCRATCH = ".scratch-"  # <log dir>/.scratch-<pid>: a command's TMPDIR; `recover` removes a killed one's


class Stopped(KeyboardInterrupt):
    """SIGTERM or SIGINT, raised where the command is, so that its clean-up runs (`finally`
    blocks, no_orphans, the lock's release) instead of the process vanishing with its kernel left
    running. `note` is what the command says of its state when it ends."""

    def __init__(self, signum: int):
        super().__init__(f"signal {signum}")
        self.signum, self.note = signum, ""

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name


def stop(signum, frame):
    """A signal handler: raise Stopped."""
    raise Stopped(signum)


@contextmanager
def stopped_by_signals(signums=(signal.SIGTERM, signal.SIGINT)):
    """Within the block, the first of the signals `signums` raises Stopped, and later ones are
    ignored, so that the clean-up it starts is not cut short (the handlers before are restored after)."""

    def once(signum, frame):
        for s in signums:
            signal.signal(s, signal.SIG_IGN)
        raise Stopped(signum)

    old = {s: signal.signal(s, once) for s in signums}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def descendants(pid: int | None = None) -> list[int]:
    """The processes below `pid` (this one by default), read from /proc (empty where there is none)."""
    pid = pid or os.getpid()
    parent = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for e in entries:
        if not e.isdigit():
            continue
        try:
            stat = Path(f"/proc/{e}/stat").read_text()
        except OSError:
            continue
        parent[int(e)] = int(stat.rsplit(")", 1)[1].split()[1])
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        kids = [c for c, pp in parent.items() if pp == p]
        out += kids
        todo += kids
    return out


def end_descendants(grace_s: float = 3.0) -> list[int]:
    """SIGTERM every process below this one, then SIGKILL those still there after `grace_s`;
    returns the pids that were ended."""
    pids = descendants()
    for p in pids:
        with suppress(OSError):
            os.kill(p, signal.SIGTERM)
    deadline = time.time() + grace_s
    while time.time() < deadline and any(is_running(p) for p in pids):
        time.sleep(0.05)
    for p in [*pids, *descendants()]:
        if is_running(p):
            with suppress(OSError):
                os.kill(p, signal.SIGKILL)
    return pids


def scratch_owner(folder: Path) -> int | None:
    """The pid a scratch folder is named after (`.scratch-<pid>`), None for any other name."""
    tail = folder.name[len(SCRATCH) :] if folder.name.startswith(SCRATCH) else ""
    return int(tail) if tail.isdigit() else None


def is_running(pid: int) -> bool:
    """Whether process `pid` exists and is not a zombie (a child of ours is reaped first)."""
    with suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@contextmanager
def no_orphans(scratch: Path | None = None):
    """Around a command: its children's TMPDIR is `scratch` (created, then removed), and
    whatever processes are left below it at the end are ended."""
    old = os.environ.get("TMPDIR")
    if scratch is not None:
        scratch.mkdir(parents=True, exist_ok=True)
        os.environ["TMPDIR"] = str(scratch)
    try:
        yield
    finally:
        end_descendants()
        if scratch is not None:
            if old is None:
                os.environ.pop("TMPDIR", None)
            else:
                os.environ["TMPDIR"] = old
            shutil.rmtree(scratch, ignore_errors=True)
