"""Every failure point of the nightly, with the book build on (a tiny fake book) and the
chapters faked (tests/nightly_driver.py): a failure anywhere before the flip of
runs/published.json leaves the published files and the served book byte for byte as they
were; from the flip on, the night is published and complete (finished by `recover` when the
process was killed). Failures are raised exceptions, SIGTERM, and a process killed outright
(os._exit, as kill -9)."""

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from labsupport import chapters, runs
from labsupport.ops import history, leftovers, nightly, status
from labsupport.runs import lock, promotion

from . import nightly_driver as driver
from .conftest import REPO, RUNS, tree_bytes

pytestmark = pytest.mark.unit

CHAPTER = driver.CHAPTER
ALL_AFTER = list(driver.POINTS)
PRE_FLIP = [p for p in ALL_AFTER if p not in driver.PUBLISHED_AFTER]


# The night's chapter starts from a small run (the tiny model on a CPU, its trace 24 kB): the
# point of these tests is the failure handling, and drift.compare re-parses both traces.
SMALL_RUNS = Path(__file__).resolve().parent / "fixtures" / "small-runs"


class Night:
    def __init__(self, tmp_path: Path):
        self.root = tmp_path / "runs"
        self.logs = tmp_path / "nightly-logs"
        self.book = tmp_path / "site" / "html"
        pub = runs.list_runs(CHAPTER, SMALL_RUNS)[-1]
        shutil.copytree(SMALL_RUNS / CHAPTER / pub, self.root / CHAPTER / pub)
        (self.root / "published.json").write_bytes(runs.manifest_bytes({CHAPTER: pub}))
        shutil.copy(RUNS / "history.csv", self.root / "history.csv")
        shutil.copytree(RUNS / "nightly", self.root / "nightly")
        self.book.mkdir(parents=True)
        (self.book / "index.html").write_text("<p>the book served before the night</p>\n")
        self.old_run = pub

    def snapshot(self):
        return tree_bytes(self.root), tree_bytes(self.book)

    def published_files(self, night_id):
        """What is published: every file but the night's own unpublished run and hidden
        leftovers (the lock, a staged publication, a partial run)."""
        return {
            k: v
            for k, v in tree_bytes(self.root).items()
            if not any(part.startswith(".") for part in Path(k).parts) and f"/{night_id}/" not in f"/{k}"
        }

    def night_id(self):
        ids = sorted(p.name for p in self.logs.iterdir()) if self.logs.is_dir() else []
        return ids[-1] if ids else None

    def leftovers_beside_book(self):
        return sorted(p.name for p in self.book.parent.iterdir() if p.name != self.book.name)


@pytest.fixture
def night(tmp_path, monkeypatch):
    n = Night(tmp_path)
    monkeypatch.setenv("LABSUPPORT_RUNS", str(n.root))
    driver.install(n.logs, n.book, monkeypatch.setattr)
    old = signal.getsignal(signal.SIGTERM)
    yield n
    signal.signal(signal.SIGTERM, old)


def run_night(capsys):
    rc = nightly.main([CHAPTER], {}, allow_cpu=True)
    out = capsys.readouterr()
    return rc, out.out, out.err


def assert_complete(n: Night, night_id: str):
    """The night is published and complete: runs, manifest, history, report, book agree."""
    assert runs.published(n.root)[CHAPTER] == night_id
    runs.check_published(chapters.CHAPTERS, n.root)
    assert (history.read(n.root).published_as == f"nightly {night_id}").sum() > 0
    assert (n.root / "nightly" / f"{night_id}-drift.md").is_file()
    assert (n.root / "nightly" / f"{night_id}-drift.json").is_file()
    assert night_id in (n.book / "index.html").read_text()
    assert status.published_night() == night_id
    assert not list(n.root.glob(".*")), "no staged publication, lock or temporary file is left"


def recover(n: Night):
    with lock.held(n.root, "test") as lk:
        return leftovers.recover(n.root, lk.stale, n.book, n.logs)


def test_a_good_night_is_complete(night, capsys):
    rc, out, err = run_night(capsys)
    assert rc == 0, err
    nid = night.night_id()
    assert_complete(night, nid)
    assert f"nightly {nid} published 1 chapters" in out and f"{CHAPTER} 1 s" in out
    assert night.leftovers_beside_book() == []
    assert runs.list_runs(CHAPTER, night.root) == sorted([night.old_run, nid])


@pytest.mark.parametrize("point", PRE_FLIP)
def test_an_exception_before_the_flip_changes_nothing(night, capsys, monkeypatch, point):
    before = night.snapshot()
    driver.inject(point, "after", "raise", monkeypatch.setattr)
    rc, out, err = run_night(capsys)
    lines = [ln for ln in err.splitlines() if ln.startswith("nightly failed:")]
    assert rc == 1 and len(lines) == 1, err
    assert f"injected failure after {point}" in lines[0] and "nothing was published" in lines[0]
    assert night.snapshot() == before
    assert night.leftovers_beside_book() == []
    # The next night succeeds.
    monkeypatch.setattr(*_real(point))
    rc, out, err = run_night(capsys)
    assert rc == 0, err
    assert_complete(night, night.night_id())


# The functions the driver wraps, as the nightly uses them (its chapters faked).
REAL = {p: getattr(m, n) for p, (m, n) in driver.POINTS.items()}
REAL["run_chapters"] = driver.fake_run_chapters


def _real(point):
    module, name = driver.POINTS[point]
    return module, name, REAL[point]


@pytest.mark.parametrize("point", ["run_chapters", "build_book", "stage"])
def test_sigterm_before_the_flip_changes_nothing(night, capsys, monkeypatch, point):
    before = night.snapshot()
    driver.inject(point, "after", "term", monkeypatch.setattr)
    rc, out, err = run_night(capsys)
    lines = [ln for ln in err.splitlines() if ln.startswith("nightly failed:")]
    assert rc == 1 and len(lines) == 1 and "interrupted (signal 15)" in lines[0], err
    assert night.snapshot() == before
    aside = list(night.logs.glob(f"*/failed-runs/{CHAPTER}/*"))
    assert len(aside) == 1 and (aside[0] / "meta.json").is_file(), "the night's run is set aside, whole"


@pytest.mark.parametrize(
    "point,when", [("flip", "after"), ("complete", "after"), ("cleanup", "after"), ("prune", "after")]
)
@pytest.mark.parametrize("how", ["raise", "term"])
def test_a_failure_after_the_flip_leaves_the_night_published_and_complete(night, capsys, monkeypatch, point, when, how):
    driver.inject(point, when, how, monkeypatch.setattr)
    rc, out, err = run_night(capsys)
    nid = night.night_id()
    assert rc == 0, err
    assert "nightly failed" not in err and "nothing was published" not in err
    assert f"nightly {nid} published" in out + err
    assert runs.published(night.root)[CHAPTER] == nid
    assert (night.logs / nid / "failed-runs").exists() is False, "published runs are never set aside"
    recover(night)  # removes what clean-up could not (a replaced book)
    assert_complete(night, nid)
    assert night.leftovers_beside_book() == []


def test_completion_that_keeps_failing_is_reported_and_finished_later(night, capsys, monkeypatch):
    driver.inject("install_book", "before", "raise", monkeypatch.setattr)
    rc, out, err = run_night(capsys)
    nid = night.night_id()
    assert rc == 1 and f"nightly {nid} is published" in err and "not complete" in err, err
    assert "nothing was published" not in err
    assert runs.published(night.root)[CHAPTER] == nid
    assert list(night.root.glob(".promote-*")), "the staged publication waits for recovery"
    monkeypatch.setattr(*_real("install_book"))
    assert any("completed the publication" in line for line in recover(night))
    assert_complete(night, nid)


def _kill_at(n: Night, point: str, when: str):
    env = {**os.environ, "LABSUPPORT_RUNS": str(n.root), "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "tests.nightly_driver", str(n.root), str(n.logs), str(n.book), point, when, "kill"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.parametrize("point,when", [(p, "after") for p in ALL_AFTER] + [("install_book", "before")])
def test_killed_at_each_point(night, point, when):
    before = night.snapshot()
    r = _kill_at(night, point, when)
    assert r.returncode == 137, r.stderr[-2000:]
    nid = night.night_id()
    flipped = point in driver.PUBLISHED_AFTER
    if not flipped:
        # Nothing published changed, not a byte of the book either.
        assert night.published_files(nid) == {k: v for k, v in before[0].items()}
        assert tree_bytes(night.book) == before[1]
    else:
        assert runs.published(night.root)[CHAPTER] == nid
    # The next command (here `recover`, which every nightly and live run does first) finishes
    # a flipped night and sets aside the rest.
    env = {
        **os.environ,
        "LABSUPPORT_RUNS": str(night.root),
        "LABSUPPORT_NIGHTLY_DIR": str(night.logs),
        "LABSUPPORT_BOOK_DIR": str(night.book),
        "PYTHONPATH": str(REPO),
    }
    r = subprocess.run(
        [sys.executable, "-m", "labsupport", "recover"], cwd=REPO, env=env, capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0, r.stderr
    if flipped:
        assert_complete(night, nid)
    else:
        assert night.snapshot() == before
        if nid and point != "recover":
            assert "took over the lock" in r.stdout
    assert night.leftovers_beside_book() == []


def test_the_night_after_a_killed_one_succeeds(night, capsys):
    r = _kill_at(night, "build_book", "after")
    assert r.returncode == 137
    killed = night.night_id()
    rc, out, err = run_night(capsys)
    assert rc == 0, err
    assert "took over the lock" in out and "set aside its unpublished runs" in out
    assert (night.logs / killed / "failed-runs" / CHAPTER / killed / "meta.json").is_file()
    assert_complete(night, night.night_id())


def test_a_failed_nights_report_never_reaches_the_status_page(night, capsys, monkeypatch):
    """An old nightly wrote its report before publishing; a report of a night that never
    published is moved out of runs/nightly/, and the status page shows the published night's."""
    pub_night = status.published_night()
    orphan = night.root / "nightly" / "20991231T000000Z-h200-drift.md"
    orphan.write_text("# Drift report: a night that never published\n")
    (night.root / "nightly" / "20991231T000000Z-h200-drift.json").write_text(
        '{"timing_threshold": 0.25, "chapters": []}\n'
    )
    assert status.published_night() == pub_night, "not the newest by name"
    recover(night)
    assert not orphan.exists() and (night.logs / "20991231T000000Z-h200" / orphan.name).is_file()


def test_a_book_that_does_not_build_stops_the_night(night, capsys, monkeypatch):
    from labsupport.ops import bookbuild

    def broken(**kw):
        raise bookbuild.BuildError("RunError: /x/kernels.csv lacks column op (full log: /x/book.log)")

    monkeypatch.setattr(bookbuild, "build", broken)
    before = night.snapshot()
    rc, out, err = run_night(capsys)
    lines = [ln for ln in err.splitlines() if ln.startswith("nightly failed:")]
    assert rc == 1 and len(lines) == 1, err
    assert "the book did not build from the new runs: RunError: /x/kernels.csv lacks column op" in lines[0]
    assert night.snapshot() == before


def test_live_publishes_run_and_history_in_one_step(night, capsys, monkeypatch):
    from labsupport.ops import live

    def fake_run_chapter(ch, run_id, params, log_dir, root=None):
        driver.fake_run_chapters([ch], run_id, params, log_dir)
        return log_dir / "x.ipynb"

    monkeypatch.setattr(live, "run_chapter", fake_run_chapter)
    monkeypatch.setattr(live, "LOG_DIR", night.logs)
    assert live.main([CHAPTER], {}, allow_cpu=True) == 0
    rid = runs.published(night.root)[CHAPTER]
    assert rid != night.old_run and f"{CHAPTER}: published run {rid}" in capsys.readouterr().out
    assert (history.read(night.root).published_as == f"live {rid}").sum() > 0
    assert not list(night.root.glob(".*")), "no lock or staged publication is left"
    # Killed between its flip and the history: the next command completes it.
    driver.inject("flip", "after", "raise", monkeypatch.setattr)
    monkeypatch.setattr(promotion, "complete", lambda p: (_ for _ in ()).throw(OSError("disk full")))
    assert live.main([CHAPTER], {}, allow_cpu=True) == 1
    err = capsys.readouterr().err
    rid2 = runs.published(night.root)[CHAPTER]
    assert rid2 != rid and f"run {rid2} published" in err and "recover" in err
    assert not (history.read(night.root).published_as == f"live {rid2}").any()
    monkeypatch.setattr(promotion, "complete", REAL["complete"])
    monkeypatch.setattr(promotion, "flip", REAL["flip"])
    recover(night)
    assert (history.read(night.root).published_as == f"live {rid2}").sum() > 0
