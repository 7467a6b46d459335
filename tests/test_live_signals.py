"""`live` stopped by SIGTERM or SIGINT (Ctrl-C) while its notebook measures: the real command on
the CPU with the tiny model. It ends its kernel and the kernel's children, releases its lock,
leaves no scratch folder, records no run (not even later, from an orphaned kernel) and says one
line."""

import os
import signal
import subprocess
import sys
import time

import pytest

from labsupport.ops import children
from labsupport.runs import lock

from .conftest import REPO, cpu_args, tree_bytes, wait_until_measuring

CHAPTER = "kernels-in-one-token"

pytestmark = pytest.mark.live


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_stopped_live_command_ends_its_kernel_and_releases_its_lock(copied_runs, tmp_path, signum):
    logs = tmp_path / "live-logs"
    env = {
        **os.environ,
        "LABSUPPORT_RUNS": str(copied_runs),
        "LABSUPPORT_LIVE_DIR": str(logs),
        "LABSUPPORT_NIGHTLY_DIR": str(tmp_path / "nightly-logs"),
        "LABSUPPORT_BOOK_DIR": str(tmp_path / "html"),
        "PYTHONPATH": str(REPO),
    }
    before = tree_bytes(copied_runs)
    # In a session of its own, as a terminal's foreground job: Ctrl-C is SIGINT to its group.
    p = subprocess.Popen(
        [sys.executable, "-m", "labsupport", "live", *cpu_args(CHAPTER)],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )

    wait_until_measuring(p, logs, CHAPTER)  # the notebook's log shows the model being built
    below = children.descendants(p.pid)  # the kernel and whatever it started
    assert below, "a kernel runs the notebook"
    assert (copied_runs / lock.NAME).is_file()
    os.killpg(p.pid, signum)
    out, err = p.communicate(timeout=120)
    name = signal.Signals(signum).name
    said = [ln for ln in err.splitlines() if ln.startswith("live:")]
    assert p.returncode == 1 and len(said) == 1 and err.strip().splitlines()[-1] == said[0], err[-3000:]
    assert said[0] == f"live: stopped by {name}; {CHAPTER}'s run not recorded, the lock released", said
    assert "Traceback" not in err, err[-3000:]
    assert not (copied_runs / lock.NAME).exists()
    assert not list(logs.glob(f"{children.SCRATCH}*")), "the scratch folder is removed"
    assert not [pid for pid in below if children.is_running(pid)], "the kernel and its children are ended"
    time.sleep(5)  # an orphaned kernel would go on measuring, then write its run
    assert tree_bytes(copied_runs) == before, "no run is written, then or later"
    assert not list(copied_runs.glob(f"{CHAPTER}/.incomplete-*"))
