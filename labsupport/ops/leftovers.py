"""What killed or failed commands leave behind, and where it goes: set aside (moved out of
runs/ into the command's log folder) or cleaned, never anywhere the book or the status page
reads. Called with the runs folder's lock held (labsupport.runs.lock), so nothing else is writing,
and only on a runs folder (check_runs_folder, which the commands call before taking the lock).
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

from labsupport import chapters, runs
from labsupport.ops import children, history
from labsupport.ops.gallery import GALLERY
from labsupport.runs import lock, promotion
from labsupport.runs.provenance import REPO_ROOT

# Where the nightly keeps its logs and the built book lies: here, not in nightly.py, so that
# live (which recovers what a killed nightly left there) need not import nightly, which imports live.
NIGHTLY_DIR = Path(os.environ.get("LABSUPPORT_NIGHTLY_DIR", REPO_ROOT / "build" / "nightly"))
BOOK_DIR = Path(os.environ.get("LABSUPPORT_BOOK_DIR", REPO_ROOT / "_build" / "html"))
REPORTS = "nightly"  # runs/nightly/: the drift reports of published nights
TEMPORARY = re.compile(r"\.(?P<of>.+)\.tmp-[0-9]+")  # labsupport.runs.write_atomic's .<name>.tmp-<pid>
STAGES = (promotion.PREFIX, promotion.DONE_PREFIX, promotion.DISCARDED_PREFIX)  # + a run id
PRUNING = ".pruning-"  # runs/<chapter>/.pruning-<run id>: an old run a prune had moved aside


def _chapter_folders(root: Path) -> list[Path]:
    """The chapters' folders under `root` (named as the registry's chapters; a link is a RunError)."""
    out = []
    for ch in chapters.CHAPTERS:
        d = root / ch.slug
        if d.is_symlink():
            raise runs.RunError(f"{d} is a symbolic link; nothing under a runs folder is followed through one")
        if d.is_dir():
            out.append(d)
    return out


def _written_atomically(root: Path) -> tuple[str, ...]:
    """The files at the top of a runs folder replaced through a temporary .<name>.tmp-<pid>."""
    return (runs.MANIFEST, history.path(root).name)


def _own_top_name(root: Path, name: str) -> bool:
    """Whether `name` is one this project writes at the top of a runs folder."""
    plain = {*_written_atomically(root), lock.NAME, REPORTS, GALLERY, *(ch.slug for ch in chapters.CHAPTERS)}
    temp = TEMPORARY.fullmatch(name)
    stage = next((name[len(p) :] for p in STAGES if name.startswith(p)), "")
    return (
        name in plain
        or bool(temp and temp["of"] in _written_atomically(root))
        or bool(runs.RUN_ID_PATTERN.fullmatch(stage))
    )


def check_runs_folder(root: Path) -> None:
    """`root` must be a runs folder before a command cleans or writes there: published.json,
    and only the registry's chapters' folders and this project's own names, none a link. A
    missing or empty folder is made one (an empty published.json). Anything else is one
    RunError, with nothing changed."""
    if not root.exists() or (root.is_dir() and not any(root.iterdir())):
        root.mkdir(parents=True, exist_ok=True)
        runs.write_atomic(root / runs.MANIFEST, runs.manifest_bytes({}))
        return
    if not root.is_dir():
        raise runs.RunError(f"the runs folder {root} is not a folder; nothing was changed")
    entries = sorted(root.iterdir())
    link = next((p for p in entries if p.is_symlink()), None)
    if link is not None:
        raise runs.RunError(f"{link} is a symbolic link; nothing under a runs folder is followed through one")
    foreign = [p.name for p in entries if not _own_top_name(root, p.name)]
    if foreign:
        why = f"it holds {', '.join(map(repr, foreign[:3]))}{' and more' if len(foreign) > 3 else ''}"
    elif not (root / runs.MANIFEST).is_file():
        why = f"it has no {runs.MANIFEST}"
    else:
        return
    raise runs.RunError(
        f"{root} is not a runs folder: {why} (only {runs.MANIFEST}, the chapters' folders and the files "
        f"this project writes); nothing was changed"
    )


def set_aside(root: Path, run_id: str, aside: Path, complete: bool = True) -> list[str]:
    """Move the runs recorded as `run_id` that are not published out of runs/ into
    `aside`/<chapter>/ (partial ones always, whole ones if `complete`); returns what was moved."""
    try:
        published = runs.published(root)
    except runs.RunError:
        published = None  # unreadable manifest: move nothing that could be published
    moved = []
    for chapter_dir in _chapter_folders(root):
        for d in (chapter_dir / run_id, chapter_dir / f".incomplete-{run_id}"):
            if not d.exists() or d.is_symlink():
                continue
            if d.name == run_id and (not complete or published is None or published.get(chapter_dir.name) == run_id):
                continue
            (aside / chapter_dir.name).mkdir(parents=True, exist_ok=True)
            shutil.move(str(d), aside / chapter_dir.name / d.name)
            moved.append(f"{chapter_dir.name}/{d.name}")
    return moved


def _published_nights(root: Path) -> set[str] | None:
    """Nights with rows in the history (None when there is no readable history to tell)."""
    if not history.path(root).is_file():
        return None
    try:
        h = history.read(root)
    except runs.RunError:
        return None
    return {p.split(" ", 1)[1] for p in h.published_as.astype(str) if p.startswith("nightly ")}


def orphan_reports(root: Path) -> list[Path]:
    """Drift reports under runs/nightly/ of nights that never published (none are written
    there any more before a publication; older code left them): <run id>-drift.md or .json,
    regular files."""
    d = root / REPORTS
    if not d.is_dir() or d.is_symlink():
        return []
    nights = _published_nights(root)
    if nights is None:
        return []
    reports = [p for p in d.glob("*-drift.*") if _night_of(p.name) and p.is_file() and not p.is_symlink()]
    return sorted(p for p in reports if _night_of(p.name) not in nights)


def _night_of(report: str) -> str | None:
    """The night a drift report is named after (<run id>-drift.md or .json), else None."""
    night, _, kind = report.rpartition("-drift.")
    return night if kind in ("md", "json") and runs.RUN_ID_PATTERN.fullmatch(night) else None


def _ever_published(root: Path, run_id: str) -> bool | None:
    """Whether history.csv has rows of `run_id` (None when there is no readable history)."""
    if not history.path(root).is_file():
        return False
    try:
        h = history.read(root)
    except runs.RunError:
        return None
    return bool(h.published_as.astype(str).str.endswith(f" {run_id}").any())


def pruned_leftovers(root: Path) -> list[str]:
    """Old runs a killed prune had moved aside (runs/<chapter>/.pruning-<run id>/, in the
    registry's chapters' folders only): deleted."""
    done = []
    for chapter_dir in _chapter_folders(root):
        for d in sorted(chapter_dir.glob(f"{PRUNING}*")):
            run_id = d.name[len(PRUNING) :]
            if runs.RUN_ID_PATTERN.fullmatch(run_id) and d.is_dir() and not d.is_symlink():
                shutil.rmtree(d)
                done.append(f"finished pruning {chapter_dir.name}/{run_id}")
    return done


def recover(
    root: Path, stale: dict | None, book_dir: Path | None, nightly_dir: Path, live_dir: Path | None = None
) -> list[str]:
    """Finish or discard staged publications, set aside a killed holder's runs, move orphan
    drift reports and remove temporary files; one line per thing done. Where runs are set
    aside comes from the project's layout (`nightly_dir`, `live_dir`: <dir>/<run id>/failed-runs),
    never from the lock file, and only for a run id whose log folder its command created there
    and that was never published; a bookkeeping file that is not what this code writes is a
    RunError naming it, with nothing moved or deleted, and so is a folder that is not a runs
    folder (check_runs_folder)."""
    check_runs_folder(root)
    for d in (root / REPORTS, nightly_dir):
        runs.check_real_dir(d, "recover")
    done = promotion.recover(root, book_dir)
    done += pruned_leftovers(root)
    if book_dir is not None:  # staged books of discarded nights, books replaced by a publication
        for d in book_dir.parent.glob(f".{book_dir.name}-*"):
            night = d.name[len(f".{book_dir.name}-") :]
            if runs.RUN_ID_PATTERN.fullmatch(night) and d.is_dir() and not d.is_symlink():
                shutil.rmtree(d)
                done.append(f"removed the left-over book folder {d}")
    if stale:
        rid = stale.get("run_id")
        done.append(
            f"took over the lock of {stale.get('what', 'a command')} pid {stale.get('pid', '?')} "
            f"(started {stale.get('started', '?')}), which is no longer running"
        )
        if stale.get("invalid"):
            done.append(f"its lock file {root / '.lock'} was not one this code writes ({stale['invalid']})")
        logs = live_dir if str(stale.get("what", "")).startswith("live") and live_dir is not None else nightly_dir
        if rid and runs.RUN_ID_PATTERN.fullmatch(str(rid)):
            aside = logs / rid / "failed-runs"
            ever = _ever_published(root, rid)
            # A whole run is set aside only when its command's log folder exists (it made it
            # before writing the lock) and the run id was never published.
            whole = not stale.get("keep_runs") and (logs / rid).is_dir() and ever is False
            moved = set_aside(root, rid, aside, complete=whole)
            if moved:
                done.append(f"set aside its unpublished runs ({', '.join(moved)}) in {aside}")
    for report in orphan_reports(root):
        dest = nightly_dir / _night_of(report.name)
        dest.mkdir(parents=True, exist_ok=True)
        shutil.move(str(report), dest / report.name)
        done.append(f"moved {report.name}, the report of a night that never published, to {dest}")
    for logs in {nightly_dir, *([live_dir] if live_dir is not None else [])}:
        for d in sorted(logs.glob(f"{children.SCRATCH}*")) if logs.is_dir() else []:
            owner = children.scratch_owner(d)
            # Another command still running (one with another runs folder, under the same log
            # folder) keeps its scratch folder; only a dead command's is removed.
            running = owner is not None and (owner == os.getpid() or children.is_running(owner))
            if owner is not None and d.is_dir() and not d.is_symlink() and not running:
                shutil.rmtree(d)
                done.append(f"removed the scratch folder {d} of a killed command")
    for tmp in temporary_files(root):
        tmp.unlink()
        done.append(f"removed the temporary file {tmp}")
    return done


def temporary_files(root: Path) -> list[Path]:
    """What an atomic write cut short leaves: .<name>.tmp-<pid>, of published.json or the
    history in runs/, of a drift report in runs/nightly/; regular files only, never a link."""
    reports = root / REPORTS

    def own(p: Path) -> bool:
        m = TEMPORARY.fullmatch(p.name)
        if m is None or p.is_symlink() or not p.is_file():
            return False
        if p.parent == root:
            return m["of"] in _written_atomically(root)
        return _night_of(m["of"]) is not None

    found = [
        *root.glob(".*.tmp-*"),
        *(reports.glob(".*.tmp-*") if reports.is_dir() and not reports.is_symlink() else []),
    ]
    return sorted(p for p in found if own(p))
