"""Nothing in runs/ is trusted (issue 28): crafted bookkeeping files (a staged publication's
plan.json, the lock file, a symlinked runs/nightly) change nothing outside runs/ and are one
line naming the file; a full disk, a deleted lock and a kill while pruning leave nothing
half-done; and tests that fail when a protection is removed: the flip is a rename (never a
rewrite in place), signals are held while a publication completes, the lock is an flock."""

import errno
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from labsupport import chapters, runs
from labsupport.ops import leftovers
from labsupport.runs import lock, promotion

from . import nightly_driver as driver
from .conftest import REPO
from .test_nightly_failures import Night, run_night

pytestmark = pytest.mark.unit

CHAPTER = driver.CHAPTER
NIGHT = "20990101T000000Z-cpu"


def everything(top: Path) -> dict:
    """Every path under `top` (links not followed) with the bytes of files, a link's target."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(top, followlinks=False):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            rel = str(p.relative_to(top))
            if p.is_symlink():
                out[rel] = ("link", os.readlink(p))
            elif p.is_file():
                out[rel] = p.read_bytes()
            else:
                out[rel] = "dir"
    return out


def _under(snapshot: dict, top: str) -> dict:
    return {k[len(top) + 1 :]: v for k, v in snapshot.items() if k.startswith(top + "/")}


@pytest.fixture
def world(tmp_path, monkeypatch):
    """A runs folder (a Night's), a book, logs, and a victim folder outside runs/."""
    n = Night(tmp_path)
    monkeypatch.setenv("LABSUPPORT_RUNS", str(n.root))
    driver.install(n.logs, n.book, monkeypatch.setattr)
    victim = tmp_path / "victim"
    (victim / "deep").mkdir(parents=True)
    (victim / "keep.txt").write_text("outside runs/\n")
    (victim / "deep" / "keep.txt").write_text("outside runs/, deeper\n")
    # Inside runs/, in a folder of its own (a runs folder holds only its own names at the top).
    (n.root / "nightly" / "payload.txt").write_text("a file inside runs/\n")
    old = signal.getsignal(signal.SIGTERM)
    yield n, victim
    signal.signal(signal.SIGTERM, old)


def _recover_cmd(n: Night):
    env = {
        **os.environ,
        "LABSUPPORT_RUNS": str(n.root),
        "LABSUPPORT_NIGHTLY_DIR": str(n.logs),
        "LABSUPPORT_BOOK_DIR": str(n.book),
        "PYTHONPATH": str(REPO),
    }
    return subprocess.run(
        [sys.executable, "-m", "labsupport", "recover"], cwd=REPO, env=env, capture_output=True, text=True, timeout=300
    )


def _plan(n: Night, **over) -> Path:
    """A staged publication that looks flipped (its digest is the published manifest's)."""
    stage = n.root / f"{promotion.PREFIX}{NIGHT}"
    stage.mkdir()
    sha = hashlib.sha256((n.root / runs.MANIFEST).read_bytes()).hexdigest()
    plan = {"night": NIGHT, "manifest_sha256": sha, "files": [], "book": None, "book_dir": None, "book_inode": None}
    plan.update(over)
    (stage / promotion.PLAN).write_text(json.dumps(plan))
    return stage


CRAFTED_PLANS = {
    "traversal": lambda n, v: {"files": ["x/../../nightly/payload.txt"]},
    "absolute": lambda n, v: {"files": [str(v / "keep.txt")]},
    "book outside": lambda n, v: {"book": str(v / "deep"), "book_dir": str(v), "book_inode": 2},
    "book root": lambda n, v: {"book": str(v), "book_dir": "/", "book_inode": 1},
    "wrong types": lambda n, v: {"files": "nightly", "book_inode": "1"},
    "other night": lambda n, v: {"night": "../../victim"},
}


@pytest.mark.parametrize("kind", list(CRAFTED_PLANS))
def test_a_crafted_plan_moves_and_deletes_nothing(world, kind):
    n, victim = world
    stage = _plan(n, **CRAFTED_PLANS[kind](n, victim))
    if kind == "traversal":
        (stage / "x").mkdir()
    before = everything(n.root.parent)
    r = _recover_cmd(n)
    err = r.stderr.strip().splitlines()
    assert r.returncode == 1 and len(err) == 1 and "Traceback" not in r.stderr, r.stderr
    assert str(stage / promotion.PLAN) in err[0] and "nothing was moved or deleted" in err[0]
    assert everything(n.root.parent) == before


def test_a_crafted_plan_stops_the_nightly_in_one_line(world, capsys):
    n, victim = world
    _plan(n, files=["x/../../nightly/payload.txt"], book=str(victim), book_dir="/", book_inode=1)
    before = everything(n.root.parent)
    rc, out, err = run_night(capsys)
    assert rc == 1 and len(err.strip().splitlines()) == 1 and "plan.json" in err, err
    assert everything(victim) == _under(before, "victim") and everything(n.root) == _under(before, "runs")


def test_a_linked_stage_or_plan_is_refused(world):
    n, victim = world
    os.symlink(victim, n.root / f"{promotion.PREFIX}{NIGHT}")
    before = everything(n.root.parent)
    r = _recover_cmd(n)
    assert r.returncode == 1 and "symbolic link" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert everything(n.root.parent) == before
    (n.root / f"{promotion.PREFIX}{NIGHT}").unlink()
    stage = _plan(n)
    (stage / promotion.PLAN).unlink()
    os.symlink(victim / "keep.txt", stage / promotion.PLAN)
    before = everything(n.root.parent)
    r = _recover_cmd(n)
    assert r.returncode == 1 and "symbolic link" in r.stderr, r.stderr
    assert everything(n.root.parent) == before


def test_a_plan_writing_through_a_linked_folder_is_refused(world):
    n, victim = world
    shutil.rmtree(n.root / "nightly")
    os.symlink(victim, n.root / "nightly")
    stage = _plan(n, files=["nightly/keep.txt"])
    (stage / "nightly").mkdir()
    (stage / "nightly" / "keep.txt").write_text("overwritten\n")
    before = everything(n.root.parent)
    r = _recover_cmd(n)
    assert r.returncode == 1 and "symbolic link" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert everything(n.root.parent) == before


def test_a_crafted_lock_sets_nothing_aside_where_it_says(world):
    """The lock names a recorded run (unpublished, kept beside the published one) and a
    folder outside runs/: recover moves nothing anywhere the lock names."""
    n, victim = world
    recorded = "20200101T000000Z-h200"
    shutil.copytree(n.root / CHAPTER / n.old_run, n.root / CHAPTER / recorded)
    (n.root / lock.NAME).write_text(
        json.dumps({"what": "nightly", "pid": 1, "run_id": recorded, "aside": str(victim), "evil": ["x"]})
    )
    before = everything(n.root.parent)
    r = _recover_cmd(n)
    assert r.returncode == 0, r.stderr
    assert "ignored evil" in r.stdout
    assert everything(victim) == _under(before, "victim")
    assert (n.root / CHAPTER / recorded / "meta.json").is_file(), "a run its command never made is not set aside"
    # Named by a lock whose command did make its log folder, but published once (history): kept too.
    published_once = n.old_run
    (n.logs / published_once).mkdir(parents=True)
    (n.root / lock.NAME).write_text(json.dumps({"what": "nightly", "pid": 1, "run_id": published_once}))
    r = _recover_cmd(n)
    assert r.returncode == 0 and (n.root / CHAPTER / published_once / "meta.json").is_file()


def test_a_linked_runs_nightly_is_refused_in_one_line(world, capsys):
    n, victim = world
    shutil.rmtree(n.root / "nightly")
    os.symlink(victim, n.root / "nightly")
    before = everything(n.root.parent)
    rc, out, err = run_night(capsys)
    assert rc == 1 and len(err.strip().splitlines()) == 1 and "symbolic link" in err, err
    assert everything(victim) == _under(before, "victim")
    assert runs.published(n.root)[CHAPTER] == n.old_run


def test_a_deleted_lock_file_does_not_let_a_second_command_in(tmp_path):
    first = lock.acquire(tmp_path, "nightly")
    first.note(run_id=NIGHT)
    (tmp_path / lock.NAME).unlink()
    with pytest.raises(lock.Busy):
        lock.acquire(tmp_path, "nightly")
    lock.release(first)
    lock.release(lock.acquire(tmp_path, "nightly"))


def _no_space(*a, **k):
    raise OSError(errno.ENOSPC, "No space left on device")


def test_a_full_disk_when_taking_the_lock_is_one_line_and_leaves_no_lock(world, monkeypatch, capsys):
    n, victim = world
    monkeypatch.setattr(lock.os, "pwrite", _no_space)
    before = everything(n.root)
    from labsupport.__main__ import main

    assert main(["recover"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "No space left on device" in err[0], err
    rc, out, err = run_night(capsys)
    assert rc == 1 and len(err.strip().splitlines()) == 1 and "No space left" in err
    assert everything(n.root) == before, "no empty lock file is left"
    # A killed holder's note survives a full disk (the next command still sees whose it was).
    (n.root / lock.NAME).write_text(json.dumps({"what": "nightly", "pid": 1, "run_id": NIGHT}))
    with pytest.raises(lock.LockError):
        lock.acquire(n.root, "nightly")
    assert json.loads((n.root / lock.NAME).read_text())["run_id"] == NIGHT


def test_a_kill_while_pruning_leaves_no_half_run_listed(world, monkeypatch):
    n, victim = world
    old = "20200101T000000Z-h200"
    shutil.copytree(n.root / CHAPTER / n.old_run, n.root / CHAPTER / old)
    real = shutil.rmtree

    def killed(path, *a, **k):
        (Path(path) / "meta.json").unlink()  # deleted part of the way, then killed
        raise KeyboardInterrupt("killed")

    monkeypatch.setattr(shutil, "rmtree", killed)
    with pytest.raises(KeyboardInterrupt):
        runs.prune(CHAPTER, set(), n.root)
    monkeypatch.setattr(shutil, "rmtree", real)
    assert runs.list_runs(CHAPTER, n.root) == [n.old_run], "the half-deleted run is not listed"
    done = leftovers.recover(n.root, None, n.book, n.logs)
    assert any(f"finished pruning {CHAPTER}/{old}" in d for d in done)
    assert sorted(p.name for p in (n.root / CHAPTER).iterdir()) == [n.old_run]


def test_a_completed_stage_cut_while_deleting_is_not_called_discarded(world):
    n, victim = world
    done_stage = n.root / f"{promotion.DONE_PREFIX}{NIGHT}"
    (done_stage / "nightly").mkdir(parents=True)
    lines = leftovers.recover(n.root, None, n.book, n.logs)
    assert lines == [f"removed the remains of the completed publication {NIGHT}"]
    assert not done_stage.exists()


# --- the flip and the signal holding, tested directly (mutations the nightly's own
# resilience would mask) ---


def _staged(n: Night) -> promotion.Promotion:
    files = {"history.csv": (n.root / "history.csv").read_bytes() + b"\n"}
    return promotion.stage(n.root, NIGHT, {CHAPTER: n.old_run}, files)


def test_the_flip_is_one_rename_of_the_staged_manifest(world):
    """A reader holding runs/published.json open keeps reading the old one whole, and the new
    one is the staged file itself (its inode): never the old file rewritten in place."""
    n, victim = world
    old_bytes = (n.root / runs.MANIFEST).read_bytes()
    p = _staged(n)
    staged_inode = os.stat(p.stage / runs.MANIFEST).st_ino
    with open(n.root / runs.MANIFEST, "rb") as reader:
        promotion.flip(p)
        assert reader.read() == old_bytes
    assert os.stat(n.root / runs.MANIFEST).st_ino == staged_inode
    assert not (p.stage / runs.MANIFEST).exists()


def test_a_signal_during_the_publication_waits_for_its_end(world, monkeypatch):
    """SIGTERM sent between the flip and the completion is delivered only when the whole
    publication is in place (history renamed, stage gone)."""
    n, victim = world
    p = _staged(n)
    seen = []

    def handler(signum, frame):
        seen.append((n.root / f"{promotion.PREFIX}{NIGHT}").exists())
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, handler)
    real = promotion.flip

    def flip_then_term(q):
        real(q)
        os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(promotion, "flip", flip_then_term)
    with pytest.raises(KeyboardInterrupt):
        promotion.commit(p)
    assert seen == [False], "the signal arrived before the publication was complete"
    assert not (n.root / f"{promotion.PREFIX}{NIGHT}").exists()


def test_nightly_lock_is_held_by_a_process_for_its_whole_run(tmp_path):
    """Another process cannot take the lock while it is held (the flock itself)."""
    first = lock.acquire(tmp_path, "nightly")
    try:
        r = subprocess.run(
            [sys.executable, "-c", "import sys; from pathlib import Path; from labsupport.runs import lock;"
             "lock.acquire(Path(sys.argv[1]), 'live')", str(tmp_path)],
            cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert r.returncode == 1 and "Busy" in r.stderr, r.stderr
    finally:
        lock.release(first)


def test_recover_never_follows_a_linked_log_folder(world):
    n, victim = world
    n.logs.parent.mkdir(parents=True, exist_ok=True)
    os.symlink(victim, n.logs)
    before = everything(victim)
    with pytest.raises(runs.RunError):
        leftovers.recover(n.root, {"what": "nightly", "run_id": NIGHT}, n.book, n.logs)
    assert everything(victim) == before


# --- values: a run someone else sealed with fresh checksums ---


def _reseal(run_path: Path, name: str, data: bytes) -> None:
    (run_path / name).write_bytes(data)
    meta = json.loads((run_path / "meta.json").read_text())
    meta["files"][name] = hashlib.sha256(data).hexdigest()
    (run_path / "meta.json").write_text(json.dumps(meta))


def _edit_step_times(n: Night, value: str) -> Path:
    run_path = n.root / CHAPTER / n.old_run
    lines = (run_path / "step_times.csv").read_text().splitlines()
    head = lines[0].split(",")
    row = lines[3].split(",")
    row[head.index("wall_ms")] = value
    lines[3] = ",".join(row)
    _reseal(run_path, "step_times.csv", ("\n".join(lines) + "\n").encode())
    return run_path / "step_times.csv"


@pytest.mark.parametrize("value", ["nan", "-5.0", "1e308", "inf", "fast"])
def test_a_bad_step_time_stops_the_book_and_validation_in_one_line(world, value):
    from labsupport import chapters
    from labsupport.ops import bookbuild, validate

    n, victim = world
    path = _edit_step_times(n, value)
    with pytest.raises(bookbuild.BuildError) as e:
        bookbuild.check_runs(n.root)
    msg = str(e.value)
    assert "\n" not in msg and str(path) in msg and "column wall_ms, row 3" in msg, msg
    run = runs.load_run(chapters.by_slug(CHAPTER), n.old_run, n.root)
    problems = validate.check_run(chapters.by_slug(CHAPTER), run)
    assert any("column wall_ms, row 3" in p for p in problems), problems
    with pytest.raises(runs.RunError, match="column wall_ms, row 3"):
        run.table("step_times")  # what a notebook reads: never shown


def test_a_bad_value_is_refused_when_the_run_is_recorded(world):
    import pandas as pd

    n, victim = world
    bad = r"step_times.csv: column wall_ms, row 2: -1.0 is outside"
    with (
        pytest.raises(runs.RunError, match=bad),
        runs.RunWriter(chapters.by_slug(CHAPTER), {}, NIGHT, root=n.root) as w,
    ):
        w.write_table("step_times", pd.DataFrame({"repeat": [0, 1], "wall_ms": [1.0, -1.0]}))
    assert runs.list_runs(CHAPTER, n.root) == [n.old_run] and not (n.root / CHAPTER / f".incomplete-{NIGHT}").exists()


def test_a_header_only_table_and_a_non_text_gpu_are_one_line(world):
    from labsupport.ops import bookbuild

    n, victim = world
    run_path = n.root / CHAPTER / n.old_run
    header = (run_path / "step_times.csv").read_text().splitlines()[0]
    _reseal(run_path, "step_times.csv", (header + "\n").encode())
    with pytest.raises(bookbuild.BuildError, match="step_times.csv has no rows"):
        bookbuild.check_runs(n.root)
    meta = json.loads((run_path / "meta.json").read_text())
    meta["provenance"]["gpu"] = {"name": ["H200"]}
    (run_path / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(bookbuild.BuildError, match="provenance field gpu is not text"):
        bookbuild.check_runs(n.root)


def test_a_trace_that_expands_past_the_cap_is_one_line(world, monkeypatch):
    import gzip

    from labsupport.ops import bookbuild
    from labsupport.runs import load

    n, victim = world
    monkeypatch.setattr(load, "MAX_TRACE_BYTES", 1 << 20)
    bomb = gzip.compress(b'{"traceEvents": [' + b" " * (4 << 20) + b"]}")
    _reseal(n.root / CHAPTER / n.old_run, "trace.json.gz", bomb)
    with pytest.raises(bookbuild.BuildError, match="expands to more than 1 MiB"):
        bookbuild.check_runs(n.root)


def test_recover_removes_a_dead_commands_scratch_folder_and_keeps_a_running_ones(world):
    """Two commands with different runs folders share one log folder: the second's recovery
    must not take the first one's TMPDIR from under its notebook (it did, in CI)."""
    n, _ = world
    n.logs.mkdir(parents=True, exist_ok=True)
    running = subprocess.Popen(["sleep", "300"])
    try:
        dead = subprocess.Popen(["true"])
        dead.wait()
        kept, gone = n.logs / f".scratch-{running.pid}", n.logs / f".scratch-{dead.pid}"
        for d in (kept, gone):
            (d / "inside").mkdir(parents=True)
        lines = leftovers.recover(n.root, None, n.book, n.logs)
        assert not gone.exists() and f"removed the scratch folder {gone} of a killed command" in lines
        assert (kept / "inside").is_dir()
    finally:
        running.kill()
        running.wait()


def test_no_orphans_ends_grandchildren_and_removes_the_scratch_folder(tmp_path):
    from labsupport.ops import children

    scratch = tmp_path / ".scratch-1"
    with children.no_orphans(scratch):
        assert os.environ["TMPDIR"] == str(scratch)
        # a child that starts a grandchild and exits (as jupyter-book leaves a kernel)
        p = subprocess.Popen(["sh", "-c", "sleep 300 & echo $!; wait"], stdout=subprocess.PIPE, text=True)
        grandchild = int(p.stdout.readline())
    p.wait(timeout=30)
    assert not scratch.exists()
    assert not Path(f"/proc/{grandchild}").exists() or "Z" in Path(f"/proc/{grandchild}/stat").read_text().split()[2]
