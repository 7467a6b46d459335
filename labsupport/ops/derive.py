"""`python -m labsupport derive [chapter ...]`: the migration that brings runs of an older format
(labsupport.runs.formats) to the current one, in place: the book's runs and the gallery's
(runs/gallery/<gpu>/, each a runs folder of its own).

Each run is first loaded checked (every file against its SHA-256): a damaged run, or one of a
newer format, is refused in one line and left as it was. A run of an older format gets what each
later format added (MIGRATIONS): new files only, each written by a rename, then its meta.json in
one rename, and last a gallery run's pack.json (which lists every file with its digest). Until
meta.json is replaced the run is the old one, and derive run again finishes it (and a pack.json
left behind). No file the run had changes but those two: meta.json's `files` and `derived` gain
the new files, `format` is set and `migrated` records the step ({from, to, utc_time}); measured
values, parameters and provenance stay as they were. A run already of the current format is left
alone, so a second derive changes nothing."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from labsupport import runs
from labsupport.ops import pack
from labsupport.ops.gallery import GALLERY
from labsupport.runs import formats, lock, provenance
from labsupport.runs.load import OlderFormat
from labsupport.runs.paths import CHAPTER_PATTERN
from labsupport.runs.writer import fsync_dir, sha256, write_atomic
from labsupport.traces import derived, replay


def replay_tables(run: runs.Run, meta: dict) -> list[str]:
    """Format 2: the tables replay reads, beside every trace that has none listed, each derived
    from its own trace for the device the run measured; returns the names written."""
    lacking = set()
    for name in meta["files"]:
        tables = set(replay.table_names(name).values())
        if not tables or tables <= set(meta["files"]):
            continue
        if tables & set(meta["files"]):
            raise runs.RunError(f"{run.path / 'meta.json'} lists some of the replay tables of {name}, not all")
        lacking.add(name)
    written = derived.derive_folder(run.path, run.provenance["device"], lacking)
    for name in written:
        with open(run.path / name, "rb") as f:
            os.fsync(f.fileno())
        meta["files"][name] = sha256(run.path / name)
    if written:
        meta["derived"] = {**meta.get("derived", {}), **written}
    return sorted(written)


# The step that brings a run of each format to the next one.
MIGRATIONS = {1: replay_tables}


def _json(data: dict, indent: int) -> bytes:
    return json.dumps(data, indent=indent, sort_keys=True).encode()


def _pack_manifest(run: runs.Run, meta: dict) -> dict | None:
    """A gallery run's pack.json (None for a run without one), checked before anything is written:
    it lists every file of the run with the digest meta.json gives, and nothing else, but for the
    replay tables derive adds and meta.json itself (a derive stopped between its two renames leaves
    those behind); else a RunError."""
    path = run.path / pack.PACK_JSON
    if not path.is_file() or path.is_symlink():
        return None
    try:
        manifest = json.loads(path.read_text())
        listed = manifest["files"]
        for name, digest in meta["files"].items():
            if name not in listed and name in meta.get("derived", {}):
                continue  # a table derive added, stopped before it could list it here
            if listed[name]["sha256"] != digest:
                raise ValueError
        if set(listed) - set(meta["files"]) - {"meta.json"}:
            raise ValueError
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError):
        raise runs.RunError(f"{path} does not list the run's files as its meta.json does") from None
    return manifest


def _write_pack(run: runs.Run, manifest: dict | None) -> bool:
    """Bring a gallery run's pack.json in line with its files and meta.json (as pack writes it);
    returns whether it changed."""
    if manifest is None:
        return False
    meta = json.loads((run.path / "meta.json").read_text())
    manifest["files"] = {
        name: {"bytes": (run.path / name).stat().st_size, "sha256": sha256(run.path / name)}
        for name in [*meta["files"], "meta.json"]
    }
    data = _json(manifest, 1)
    if data == (run.path / pack.PACK_JSON).read_bytes():
        return False
    write_atomic(run.path / pack.PACK_JSON, data)
    return True


def migrate(run: runs.Run) -> str:
    """Bring `run` (loaded checked, of an older format) to the current format; returns what was
    done, in a few words."""
    meta = json.loads((run.path / "meta.json").read_text())
    manifest = _pack_manifest(run, meta)
    old = formats.of(meta)
    new: list[str] = []
    for step in range(old, formats.CURRENT):
        new += MIGRATIONS[step](run, meta)
    meta["format"] = formats.CURRENT
    meta["migrated"] = [
        *meta.get("migrated", []),
        {"from": old, "to": formats.CURRENT, "utc_time": provenance.utc_now()},
    ]
    write_atomic(run.path / "meta.json", _json(meta, 2) + b"\n")  # as RunWriter writes it
    _write_pack(run, manifest)
    fsync_dir(run.path)
    size = sum((run.path / n).stat().st_size for n in new)
    return f"format {old} -> {formats.CURRENT}: {len(new)} replay tables written ({size / 1e6:.2f} MB)"


def derive_run(chapter: str, run_id: str, root: Path) -> str:
    """Load one run checked and migrate it if it is older; returns what was done. A run that does
    not load (damaged, newer) is one RunError, untouched; so is one that cannot be written, which
    stays the old run until its meta.json is replaced."""
    try:
        run = runs.open_run(chapter, run_id, root)
    except OlderFormat as e:
        run = e.run
    try:
        if run.meta.get("format") == formats.CURRENT:
            synced = _write_pack(run, _pack_manifest(run, run.meta))
            return f"format {formats.CURRENT}, up to date" + ("; its pack.json now lists it as it is" if synced else "")
        return migrate(run)
    except OSError as e:
        raise runs.RunError(
            f"it cannot be written ({e.strerror or e}: {e.filename or run.path}); derive again finishes it"
        ) from None


def runs_folders(root: Path) -> dict[str, Path]:
    """The runs folders under `root`, by how a run's line names them: `root` itself ("") and each
    GPU folder of its gallery ("gallery/<gpu>/")."""
    out = {"": root}
    top = runs.check_real_dir(root / GALLERY, "derive")
    if top.is_dir():
        for gpu in sorted(p for p in top.iterdir() if p.is_dir() and CHAPTER_PATTERN.match(p.name)):
            out[f"{GALLERY}/{gpu.name}/"] = runs.check_real_dir(gpu, "derive")
    return out


def main(chapter_slugs: list[str], root: Path | None = None, say=print, complain=None) -> int:
    """Migrate the runs of each chapter named (all by default), one line per run; a run that is
    refused is one line (`complain`, stderr by default), the others go on. Exit status 1 if any
    was refused. A missing runs folder or a chapter with no runs is one RunError; another command
    holding the runs folder's lock (a nightly, say) is lock.Busy, with nothing changed."""
    complain = complain or (lambda line: print(line, file=sys.stderr))
    root = root or runs.runs_root()
    if not root.is_dir():
        raise runs.RunError(f"the runs folder {root} does not exist or is not a folder; nothing was derived")
    found = {
        prefix: sorted(
            p for p in folder.iterdir() if p.is_dir() and CHAPTER_PATTERN.match(p.name) and p.name != GALLERY
        )
        for prefix, folder in runs_folders(root).items()
    }
    wanted = set(chapter_slugs)
    unknown = wanted - {p.name for folders in found.values() for p in folders}
    if unknown:
        raise runs.RunError(f"no runs of {', '.join(sorted(unknown))} under {root}")
    refused = 0
    with lock.held(root, "derive"):  # no nightly or live writes, publishes or prunes runs meanwhile
        for prefix, folders in found.items():
            for folder in folders:
                if wanted and folder.name not in wanted:
                    continue
                runs.check_real_dir(folder, "derive")
                for run_id in runs.list_runs(folder.name, folder.parent):
                    where = f"{prefix}{folder.name}/{run_id}"
                    try:
                        say(f"{where}: {derive_run(folder.name, run_id, folder.parent)}")
                    except runs.RunError as e:
                        refused += 1
                        complain(f"error: {where}: refused, left as it was: {e}")
    return 1 if refused else 0
