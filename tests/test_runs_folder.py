"""A runs folder is only ever what it says it is: nothing under it is followed through a link
(a linked chapter folder is refused by recover, set_aside, prune and load, moving nothing), a
folder that is not a runs folder is refused by recover, nightly and live in one line with nothing
deleted, cleanup deletes only the project's own temporary names, and `derive` says one line for
a folder it cannot read or write."""

import errno
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from labsupport import chapters, runs
from labsupport.ops import leftovers
from labsupport.runs import lock, promotion

from . import nightly_driver as driver
from .conftest import REPO, cpu_args
from .test_nightly_failures import Night
from .test_run_format import as_format_1
from .test_trust import NIGHT, _plan, everything

pytestmark = pytest.mark.unit

CHAPTER = driver.CHAPTER
RID = "20990101T000000Z-h200"


def command(args, root: Path, tmp_path: Path, timeout=300):
    env = {
        **os.environ,
        "LABSUPPORT_RUNS": str(root),
        "LABSUPPORT_NIGHTLY_DIR": str(tmp_path / "nightly-logs"),
        "LABSUPPORT_LIVE_DIR": str(tmp_path / "live-logs"),
        "LABSUPPORT_BOOK_DIR": str(tmp_path / "site" / "html"),
        "PYTHONPATH": str(REPO),
    }
    return subprocess.run(
        [sys.executable, "-m", "labsupport", *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout
    )


def one_line(r) -> str:
    err = r.stderr.strip().splitlines()
    assert r.returncode == 1 and len(err) == 1 and "Traceback" not in r.stderr, r.stdout[-2000:] + r.stderr[-3000:]
    return err[0]


@pytest.fixture
def linked_chapter(tmp_path, monkeypatch):
    """The issue's reproduction with a chapter folder: runs/<chapter> a link to a folder outside
    runs/ holding run RID, a lock of a killed nightly naming RID, and that night's log folder."""
    n = Night(tmp_path)
    monkeypatch.setenv("LABSUPPORT_RUNS", str(n.root))
    outside = tmp_path / "outside" / CHAPTER
    shutil.move(str(n.root / CHAPTER), outside)
    shutil.copytree(outside / n.old_run, outside / RID)
    (outside / RID / "data.txt").write_text("not the project's\n")
    (n.root / CHAPTER).symlink_to(outside)
    (n.root / lock.NAME).write_text(json.dumps({"what": "nightly", "pid": 1, "run_id": RID}))
    (n.logs / RID).mkdir(parents=True)
    return n, outside


def test_recover_refuses_a_linked_chapter_folder_and_moves_nothing(linked_chapter, tmp_path):
    n, outside = linked_chapter
    before = everything(tmp_path)
    line = one_line(command(["recover"], n.root, tmp_path))
    assert f"{n.root / CHAPTER} is a symbolic link" in line
    assert everything(tmp_path) == before
    assert (outside / RID / "data.txt").is_file()


def test_set_aside_prune_and_load_refuse_a_linked_chapter_folder(linked_chapter, tmp_path):
    n, outside = linked_chapter
    before = everything(tmp_path)
    with pytest.raises(runs.RunError, match="is a symbolic link"):
        leftovers.set_aside(n.root, RID, n.logs / RID / "failed-runs")
    with pytest.raises(runs.RunError, match="is a symbolic link"):
        leftovers.pruned_leftovers(n.root)
    assert runs.prune(CHAPTER, set(), n.root) == [] and runs.list_runs(CHAPTER, n.root) == []
    with pytest.raises(runs.RunError, match="is a symbolic link"):
        runs.load_run(chapters.by_slug(CHAPTER), RID, n.root)
    assert everything(tmp_path) == before


def test_a_linked_folder_of_another_name_is_refused_too(tmp_path):
    """The tester's own case: runs/some-project, a link to a folder outside runs/."""
    n = Night(tmp_path)
    (tmp_path / "outside" / "some-project" / RID).mkdir(parents=True)
    (tmp_path / "outside" / "some-project" / RID / "data.txt").write_text("not the project's\n")
    (n.root / "some-project").symlink_to(tmp_path / "outside" / "some-project")
    (n.root / lock.NAME).write_text(json.dumps({"what": "nightly", "pid": 1, "run_id": RID}))
    (n.logs / RID).mkdir(parents=True)
    before = everything(tmp_path)
    assert "some-project is a symbolic link" in one_line(command(["recover"], n.root, tmp_path))
    assert everything(tmp_path) == before


def test_a_plan_through_a_linked_chapter_folder_is_refused(tmp_path):
    """paths.inside refuses a link on the way: here the chapter folder, read by the plan's
    checker directly (recover refuses such a folder before it reads a plan)."""
    n = Night(tmp_path)
    stage = _plan(n, files=[f"{CHAPTER}/{n.old_run}/meta.json"])
    shutil.move(str(n.root / CHAPTER), tmp_path / "outside")
    (n.root / CHAPTER).symlink_to(tmp_path / "outside")
    with pytest.raises(promotion.PlanError, match="is a symbolic link"):
        promotion.load(stage)
    with pytest.raises(runs.RunError, match="is a symbolic link"):
        runs.inside(n.root, f"{CHAPTER}/{n.old_run}/meta.json", "a test")


def test_a_plan_writing_through_a_linked_run_folder_moves_nothing(tmp_path):
    """A real chapter folder whose run folder is a link out of runs/: recover, finishing a
    staged publication whose plan names a file in it, must write nothing there."""
    n = Night(tmp_path)
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep.txt").write_text("outside runs/\n")
    (n.root / CHAPTER / RID).symlink_to(victim)
    stage = _plan(n, files=[f"{CHAPTER}/{RID}/keep.txt"])
    (stage / CHAPTER / RID).mkdir(parents=True)
    (stage / CHAPTER / RID / "keep.txt").write_text("overwritten\n")
    before = everything(tmp_path)
    line = one_line(command(["recover"], n.root, tmp_path))
    assert str(stage / promotion.PLAN) in line and "symbolic link" in line and "nothing was moved or deleted" in line
    assert everything(tmp_path) == before and (victim / "keep.txt").read_text() == "outside runs/\n"
    assert stage.name == f"{promotion.PREFIX}{NIGHT}"


# --- a folder that is not a runs folder ------------------------------------------------------


def not_a_runs_folder(top: Path) -> Path:
    """The issue's reproduction: someone's project, with files named like the temporary files and
    the pruning leftovers cleanup deletes, and a .lock of its own."""
    (top / "project" / ".pruning-important").mkdir(parents=True)
    (top / "project" / ".pruning-important" / "thesis.tex").write_text("\\section{mine}\n")
    (top / ".vimrc.tmp1").write_text("set number\n")
    (top / ".session.tmp").write_text("session\n")
    (top / ".lock").write_text("an editor's lock\n")
    return top


@pytest.mark.parametrize(
    "args",
    [["recover"], ["nightly", *cpu_args(CHAPTER), "--no-book"], ["live", *cpu_args(CHAPTER)]],
    ids=["recover", "nightly", "live"],
)
def test_a_folder_that_is_not_a_runs_folder_is_refused_and_nothing_deleted(tmp_path, args):
    top = not_a_runs_folder(tmp_path / "home")
    before = everything(top)
    r = command(args, top, tmp_path, timeout=600)
    line = one_line(r)
    assert f"{top} is not a runs folder" in line and "'project'" in line and "nothing was changed" in line
    assert everything(top) == before and "[1/1]" not in r.stdout


def test_recover_itself_refuses_a_folder_that_is_not_a_runs_folder(tmp_path):
    """Whoever calls it (the commands check before they take the lock too)."""
    top = not_a_runs_folder(tmp_path / "home")
    before = everything(top)
    with pytest.raises(runs.RunError, match="is not a runs folder"):
        leftovers.recover(top, None, None, tmp_path / "logs")
    assert everything(top) == before


def test_a_folder_without_published_json_is_not_a_runs_folder(tmp_path):
    n = Night(tmp_path)
    (n.root / runs.MANIFEST).unlink()
    before = everything(tmp_path)
    line = one_line(command(["recover"], n.root, tmp_path))
    assert f"{n.root} is not a runs folder: it has no published.json" in line
    assert everything(tmp_path) == before


@pytest.mark.parametrize("state", ["missing", "empty"])
def test_a_missing_or_empty_folder_is_made_a_runs_folder(tmp_path, state):
    root = tmp_path / "runs"
    if state == "empty":
        root.mkdir()
    r = command(["recover"], root, tmp_path)
    assert r.returncode == 0 and r.stdout.strip() == "nothing to recover", r.stderr
    assert sorted(p.name for p in root.iterdir()) == [runs.MANIFEST] and runs.published(root) == {}


def test_cleanup_deletes_only_the_projects_own_temporary_names(tmp_path):
    n = Night(tmp_path)
    own = [
        n.root / ".published.json.tmp-123",
        n.root / ".history.csv.tmp-9",
        n.root / "nightly" / f".{NIGHT}-drift.md.tmp-77",
        n.root / CHAPTER / f".pruning-{RID}" / "meta.json",
    ]
    others = [
        n.root / "nightly" / ".notes.tmp-1",
        n.root / "nightly" / f".{NIGHT}-drift.md.tmp",
        n.root / CHAPTER / ".pruning-important" / "thesis.tex",
        n.logs / ".scratch-mine" / "keep.txt",
    ]
    for p in own + others:
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text("x\n")
    done = leftovers.recover(n.root, None, None, n.logs)
    assert [p for p in own if p.exists()] == [] and all(p.is_file() for p in others), done
    assert f"finished pruning {CHAPTER}/{RID}" in done
    assert sum(line.startswith("removed the temporary file") for line in done) == 3


# --- derive: one line ---------------------------------------------------------------------


def test_derive_on_a_missing_runs_folder_is_one_line(tmp_path):
    line = one_line(command(["derive"], tmp_path / "nowhere", tmp_path))
    assert f"the runs folder {tmp_path / 'nowhere'} does not exist" in line
    assert not (tmp_path / "nowhere").exists()


def test_derive_on_a_read_only_runs_folder_is_one_line(tmp_path, monkeypatch, capsys):
    """Read-only as the file system says it (EROFS; these tests may run as root, for whom a
    chmod is no obstacle), at the first write of a replay table."""
    from labsupport import __main__ as cli

    n = Night(tmp_path)
    as_format_1(n.root / CHAPTER / n.old_run)  # a run recorded before the replay tables: derive writes them
    monkeypatch.setenv("LABSUPPORT_RUNS", str(n.root))
    before = everything(n.root)

    def read_only(path, data):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))

    monkeypatch.setattr(Path, "write_bytes", read_only)  # how labsupport.traces.derived writes a table
    assert cli.main(["derive"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{CHAPTER}/{n.old_run}: refused, left as it was: it cannot be written" in err[0], err
    assert "Read-only file system" in err[0]
    assert everything(n.root) == before
