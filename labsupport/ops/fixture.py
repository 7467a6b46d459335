"""`python -m labsupport fixture <chapter> [run id]`: freeze a chapter's run as its unit-test
fixture. The chapter's published run (or `run id`) in the runs folder is loaded checked against
its declaration, copied whole to tests/fixtures/runs/<chapter>/<run id>/ (the one run the unit
tests read of it: tests/conftest.py `fixture_run`), and named in that folder's published.json.
The chapter's earlier fixture runs are removed, after the new one is in place."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from labsupport import chapters, runs
from labsupport.runs.provenance import REPO_ROOT

FIXTURES = REPO_ROOT / "tests" / "fixtures" / "runs"


def freeze(slug: str, run_id: str | None = None, root: Path | None = None, fixtures: Path = FIXTURES) -> Path:
    """Copy the run to the fixtures (see the module's docstring); returns its fixture folder.
    RunError (one line) when the chapter has no such run or the run is damaged."""
    chapter = chapters.by_slug(slug)
    root = root or runs.runs_root()
    if run_id is None and slug not in runs.published(root):
        raise runs.RunError(f"{slug} has no published run in {root}: record one (python -m labsupport live {slug})")
    run = chapter.load(run_id, root)
    for name in run.meta["files"]:
        run.file(name)  # every file whole (its digest), traces parsed
    dest = fixtures / slug / run.run_id
    if dest.exists():
        raise runs.RunError(f"{dest} is there already; nothing was copied")
    tmp = fixtures / slug / f".freezing-{run.run_id}"
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(run.path, tmp)
    tmp.rename(dest)
    manifest = fixtures / runs.MANIFEST
    named = json.loads(manifest.read_text()) if manifest.is_file() else {}
    named[slug] = run.run_id
    part = manifest.with_name(f".{manifest.name}.tmp-{os.getpid()}")
    part.write_text(json.dumps(named, indent=2, sort_keys=True) + "\n")
    part.replace(manifest)
    for older in (fixtures / slug).iterdir():
        if older.is_dir() and not older.is_symlink() and older.name != run.run_id:
            shutil.rmtree(older)
    return dest
