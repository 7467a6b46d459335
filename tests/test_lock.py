"""One writer at a time on a runs folder: a second nightly or live stops at once with one
line naming the running one; a lock left by a killed process is taken over."""

import json
import os
import subprocess
import sys
import time

import pytest

from labsupport import chapters, runs
from labsupport.ops import leftovers
from labsupport.runs import lock

from . import nightly_driver as driver
from .conftest import REPO, tree_bytes, wait_while_running
from .test_nightly_failures import Night

pytestmark = pytest.mark.unit

CH = driver.CHAPTER

HOLD = """
import sys, time
from pathlib import Path
from labsupport.runs import lock
lk = lock.acquire(Path(sys.argv[1]), "nightly")
lk.note(run_id="20990101T000000Z-h200")
print("held", flush=True)
time.sleep(float(sys.argv[2])) if sys.argv[2] != "kill" else __import__("os").kill(__import__("os").getpid(), 9)
"""


def hold(root, how="60"):
    p = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(root), how],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert p.stdout.readline().strip() == "held"
    return p


def test_a_second_holder_is_refused_with_the_first_named(tmp_path):
    first = lock.acquire(tmp_path, "nightly")
    first.note(run_id="20990101T000000Z-h200")
    with pytest.raises(lock.Busy) as e:
        lock.acquire(tmp_path, "live")
    msg = str(e.value)
    assert "\n" not in msg and f"pid {os.getpid()}" in msg and "nightly (run 20990101T000000Z-h200)" in msg
    lock.release(first)
    assert not (tmp_path / lock.NAME).exists()
    second = lock.acquire(tmp_path, "live")
    assert second.stale is None, "a lock released cleanly is not stale"
    lock.release(second)


def test_a_killed_holders_lock_is_taken_over_and_its_runs_set_aside(tmp_path):
    root = tmp_path / "runs"  # a runs folder: its manifest, a chapter's folder
    (root / CH / "20990101T000000Z-h200").mkdir(parents=True)
    (root / CH / "20990101T000000Z-h200" / "meta.json").write_text("{}")
    (root / CH / ".incomplete-20990101T000000Z-h200").mkdir()
    (root / runs.MANIFEST).write_bytes(runs.manifest_bytes({}))
    (tmp_path / "logs" / "20990101T000000Z-h200").mkdir(parents=True)  # as fresh_run_id makes it
    p = hold(root, "kill")
    p.wait(timeout=60)
    assert p.returncode == -9 and (root / lock.NAME).exists()
    with lock.held(root, "nightly") as lk:
        assert lk.stale["pid"] == p.pid and lk.stale["run_id"] == "20990101T000000Z-h200"
        done = leftovers.recover(root, lk.stale, None, tmp_path / "logs")
    assert any(f"pid {p.pid}" in d and "no longer running" in d for d in done)
    assert not (root / CH / "20990101T000000Z-h200").exists()
    assert not (root / CH / ".incomplete-20990101T000000Z-h200").exists()
    assert (tmp_path / "logs" / "20990101T000000Z-h200" / "failed-runs" / CH / "20990101T000000Z-h200").is_dir()


@pytest.mark.parametrize("cmd", ["nightly", "live"])
def test_a_second_command_stops_at_once(copied_runs, tmp_path, cmd):
    p = hold(copied_runs)
    try:
        before = tree_bytes(copied_runs)
        env = {
            **os.environ,
            "LABSUPPORT_RUNS": str(copied_runs),
            "PYTHONPATH": str(REPO),
            "LABSUPPORT_NIGHTLY_DIR": str(tmp_path / "logs"),
            "LABSUPPORT_BOOK_DIR": str(tmp_path / "html"),
        }
        t = time.time()
        r = subprocess.run(
            [sys.executable, "-m", "labsupport", cmd, "kernels-in-one-token", "--allow-cpu", "--param", "preset=tiny"],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        err = r.stderr.strip().splitlines()
        assert r.returncode == 1 and len(err) == 1, r.stderr
        assert f"pid {p.pid}" in err[0] and "nightly (run 20990101T000000Z-h200)" in err[0]
        assert "[1/1]" not in r.stdout and time.time() - t < 60
        assert tree_bytes(copied_runs) == before
    finally:
        p.kill()
        p.wait()


def test_two_nightlies_at_once_leave_the_first_one_whole(tmp_path, monkeypatch):
    """The issue's race: a second nightly started while the first runs must neither delete
    the first one's run nor fail with a traceback."""
    n = Night(tmp_path)
    env = {**os.environ, "LABSUPPORT_RUNS": str(n.root), "PYTHONPATH": str(REPO)}
    # The first night holds the lock in its validation step until the test lets it go (a
    # file appears), not for a fixed few seconds that a loaded machine could outlast while the
    # second one starts.
    release = tmp_path / "release-the-first-night"
    slow = f"""
import sys, time
from pathlib import Path
from tests import nightly_driver as d
from labsupport.ops import nightly

real = nightly.validate_runs

def held_until_released(*a, **k):
    deadline = time.time() + 600
    while time.time() < deadline and not Path({str(release)!r}).exists():
        time.sleep(0.1)
    return real(*a, **k)

nightly.validate_runs = held_until_released
sys.exit(d.main(sys.argv[1:]))
"""
    before = set(n.root.glob(f"{driver.CHAPTER}/2*-cpu"))
    first = subprocess.Popen(
        [sys.executable, "-c", slow, str(n.root), str(n.logs), str(n.book)],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        # Until the first night has written its run (it then holds the lock, validating): a run
        # folder that was not there before it started (the starting run is a CPU run too).
        wrote = wait_while_running(first, lambda: bool(set(n.root.glob(f"{driver.CHAPTER}/2*-cpu")) - before))
        assert wrote, "the first night never wrote its run"
        second = subprocess.run(
            [sys.executable, "-m", "tests.nightly_driver", str(n.root), str(tmp_path / "logs2"), str(n.book)],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert second.returncode == 1 and "nightly not started: another nightly" in second.stderr
        assert "Traceback" not in second.stderr
    finally:
        release.touch()
    out, err = first.communicate(timeout=300)
    assert first.returncode == 0, err
    nid = sorted(p.name for p in n.logs.iterdir())[-1]
    assert runs.published(n.root)[driver.CHAPTER] == nid
    runs.check_published(chapters.CHAPTERS, n.root)
    assert json.loads((n.root / "nightly" / f"{nid}-drift.json").read_text())["chapters"]
