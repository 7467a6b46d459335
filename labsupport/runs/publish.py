"""Publish runs (runs/published.json, one atomic rename), list, prune and copy them."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from labsupport.runs import provenance
from labsupport.runs.load import Run, open_run, published
from labsupport.runs.paths import MANIFEST, RUN_ID_PATTERN, RunError, check_chapter, runs_root
from labsupport.runs.writer import write_atomic


def manifest_bytes(manifest: dict[str, str]) -> bytes:
    return (json.dumps(dict(sorted(manifest.items())), indent=2) + "\n").encode()


def publish_many(runs_by_chapter: dict[str, str], root: Path | None = None) -> None:
    """Point the book at these runs, all at once: every run is checked first, then the
    manifest is replaced with one atomic rename. A run whose commit is not in this repository's
    history is refused (RunError). (The nightly and live commands publish through
    labsupport.runs.promotion, which also adds the history rows in the same step.)"""
    root = root or runs_root()
    for chapter, run_id in runs_by_chapter.items():
        problem = commit_problem(open_run(chapter, run_id, root))
        if problem:
            raise RunError(f"{problem}; not published")
    write_atomic(root / MANIFEST, manifest_bytes({**published(root), **runs_by_chapter}))


def commit_problem(run: Run) -> str | None:
    """Why the commit `run` records is not in this repository's history (where .git is here to
    ask), in one line naming the run; None when it is: a published run is traceable to its code."""
    problem = provenance.commit_problem(run.provenance.get("git_commit", ""))
    return f"run {run.run_id} of {run.chapter}: {problem}" if problem else None


def publish(chapter: str, run_id: str, root: Path | None = None) -> None:
    """Point the book at `run_id` for `chapter` (after checking the run loads), atomically."""
    publish_many({chapter: run_id}, root)


def list_runs(chapter: str, root: Path | None = None) -> list[str]:
    """Ids of the complete runs of a chapter, oldest first."""
    d = (root or runs_root()) / check_chapter(chapter)
    if not d.is_dir() or d.is_symlink():
        return []
    return sorted(
        p.name
        for p in d.iterdir()
        if p.is_dir() and not p.is_symlink() and RUN_ID_PATTERN.match(p.name) and (p / "meta.json").is_file()
    )


def prune(chapter: str, keep: set[str], root: Path | None = None) -> list[str]:
    """Delete the complete runs of `chapter` not in `keep` (never the published one); their
    headline numbers stay in runs/history.csv. Returns the ids removed."""
    root = root or runs_root()
    keep = set(keep) | {published(root).get(chapter)}
    removed = [r for r in list_runs(chapter, root) if r not in keep]
    for r in removed:
        # Moved aside in one rename first, so a kill while deleting leaves no half run that
        # `runs` lists; `recover` deletes a left .pruning- folder.
        aside = root / chapter / f".pruning-{r}"
        if aside.exists():
            shutil.rmtree(aside)
        os.rename(root / chapter / r, aside)
        shutil.rmtree(aside)
    return removed


def copy_published(
    dst: Path, root: Path | None = None, manifest: dict[str, str] | None = None, link: bool = True
) -> dict[str, Run]:
    """A runs folder at `dst` holding the published runs (of `manifest`, by default the
    published one) and their manifest: each run checked whole, only the files its meta.json
    lists, hard links where possible (`link`), never a symbolic link followed."""
    root = root or runs_root()
    manifest = published(root) if manifest is None else manifest
    out = {}
    for chapter, run_id in sorted(manifest.items()):
        run = open_run(chapter, run_id, root)
        target = dst / chapter / run_id
        target.mkdir(parents=True)
        for name in [*run.meta["files"], "meta.json"]:
            src = run.path / name
            if src.is_symlink():
                raise RunError(f"{src} is a symbolic link; refusing to serve it")
            if link:
                try:
                    os.link(src, target / name)
                    continue
                except OSError:
                    pass
            shutil.copyfile(src, target / name)
        out[chapter] = run
    (dst / MANIFEST).write_bytes(manifest_bytes(manifest))
    return out
