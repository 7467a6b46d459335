"""`python -m labsupport derive [chapter ...]`: write the replay tables (labsupport.traces.replay)
of runs recorded before runs stored them, each from its own traces, and list them in its meta.json
(files and their digests, and what each was derived from). A run that does not load whole and
unmodified is refused, unchanged; a run whose tables are already there is re-derived the same."""

from __future__ import annotations

import json
from pathlib import Path

from labsupport import runs
from labsupport.runs.paths import CHAPTER_PATTERN
from labsupport.runs.writer import sha256, write_atomic
from labsupport.traces import derived


def derive_run(run: runs.Run) -> list[str]:
    """Write the tables of one run (loaded and checked); returns the names written."""
    device = run.provenance.get("device", "cuda")
    written = derived.derive_folder(run.path, device)
    if not written:
        return []
    meta = json.loads((run.path / "meta.json").read_text())
    for name in written:
        meta["files"][name] = sha256(run.path / name)
    meta["derived"] = {**meta.get("derived", {}), **written}
    write_atomic(run.path / "meta.json", (json.dumps(meta, indent=2, sort_keys=True) + "\n").encode())
    return sorted(written)


def main(chapter_slugs: list[str], root: Path | None = None, say=print) -> int:
    """Derive the runs of each chapter named (all by default); a missing runs folder, a linked
    chapter folder or a run that cannot be written is one RunError (runs before it are done)."""
    root = root or runs.runs_root()
    if not root.is_dir():
        raise runs.RunError(f"the runs folder {root} does not exist or is not a folder; nothing was derived")
    folders = sorted(p for p in root.iterdir() if p.is_dir() and CHAPTER_PATTERN.match(p.name))
    wanted = set(chapter_slugs)
    unknown = wanted - {p.name for p in folders}
    if unknown:
        raise runs.RunError(f"no runs of {', '.join(sorted(unknown))} under {root}")
    for folder in folders:
        if wanted and folder.name not in wanted:
            continue
        runs.check_real_dir(folder, "derive")
        for run_id in runs.list_runs(folder.name, root):
            run = runs.open_run(folder.name, run_id, root)
            try:
                written = derive_run(run)
            except OSError as e:
                raise runs.RunError(
                    f"{folder.name}/{run_id}: its replay tables cannot be written ({e.strerror or e}: "
                    f"{e.filename or run.path}); its meta.json is unchanged"
                ) from None
            total = sum((run.path / n).stat().st_size for n in written)
            say(f"{folder.name}/{run_id}: {len(written)} tables, {total / 1e6:.2f} MB")
    return 0
