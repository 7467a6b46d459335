"""What killed or failed commands leave behind, and where it goes: set aside (moved out of
runs/ into the command's log folder) or cleaned, never anywhere the book or the status page
reads. Called with the runs folder's lock held (labsupport.runs.lock), so nothing else is writing.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from labsupport import runs
from labsupport.ops import history
from labsupport.runs import promotion


def set_aside(root: Path, run_id: str, aside: Path, complete: bool = True) -> list[str]:
    """Move the runs recorded as `run_id` that are not published out of runs/ into
    `aside`/<chapter>/ (partial ones always, whole ones if `complete`); returns what was moved."""
    try:
        published = runs.published(root)
    except runs.RunError:
        published = None  # unreadable manifest: move nothing that could be published
    moved = []
    for chapter_dir in sorted(p for p in root.iterdir() if p.is_dir() and runs.CHAPTER_PATTERN.match(p.name)):
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
    there any more before a publication; older code left them)."""
    d = root / "nightly"
    if not d.is_dir():
        return []
    nights = _published_nights(root)
    if nights is None:
        return []
    return sorted(p for p in d.glob("*-drift.*") if p.name.split("-drift.")[0] not in nights)


def recover(root: Path, stale: dict | None, book_dir: Path | None, nightly_dir: Path) -> list[str]:
    """Finish or discard staged publications, set aside a killed holder's runs, move orphan
    drift reports and remove temporary files; one line per thing done."""
    done = promotion.recover(root)
    if book_dir is not None:  # staged books of discarded nights, books replaced by a publication
        for d in book_dir.parent.glob(f".{book_dir.name}-*"):
            if d.is_dir() and not d.is_symlink():
                shutil.rmtree(d)
                done.append(f"removed the left-over book folder {d}")
    if stale:
        rid = stale.get("run_id")
        done.append(
            f"took over the lock of {stale.get('what', 'a command')} pid {stale.get('pid', '?')} "
            f"(started {stale.get('started', '?')}), which is no longer running"
        )
        if rid and runs.RUN_ID_PATTERN.match(str(rid)):
            aside = Path(stale.get("aside") or nightly_dir / rid / "failed-runs")
            moved = set_aside(root, rid, aside, complete=not stale.get("keep_runs"))
            if moved:
                done.append(f"set aside its unpublished runs ({', '.join(moved)}) in {aside}")
    for report in orphan_reports(root):
        night = report.name.split("-drift.")[0]
        dest = nightly_dir / night if runs.RUN_ID_PATTERN.match(night) else nightly_dir / "orphans"
        dest.mkdir(parents=True, exist_ok=True)
        shutil.move(str(report), dest / report.name)
        done.append(f"moved {report.name}, the report of a night that never published, to {dest}")
    for tmp in [*root.glob(".*.tmp*"), *root.glob("nightly/.*.tmp*")]:
        if tmp.is_file():
            tmp.unlink()
            done.append(f"removed the temporary file {tmp}")
    return done
