"""Load a run back, checked at the boundary: its meta.json, its files and their digests, its tables."""

from __future__ import annotations

import gzip
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from labsupport.runs import formats, provenance
from labsupport.runs.paths import FILE_PATTERN, MANIFEST, RunError, check_chapter, check_run_id, run_dir, runs_root
from labsupport.runs.tables import check_table, first_line, read_table
from labsupport.runs.writer import sha256


@dataclass
class Run:
    """A recorded run, read back for replay."""

    chapter: str
    run_id: str
    path: Path
    meta: dict = field(repr=False)
    # The chapter's declaration its tables are checked against (runs.tables); None for a run opened
    # only to publish or copy it (open_run), whose tables are not read.
    declaration: object = field(default=None, repr=False, compare=False)

    @property
    def provenance(self) -> dict:
        return self.meta["provenance"]

    @property
    def parameters(self) -> dict:
        return self.meta["parameters"]

    @property
    def results(self) -> dict:
        return self.meta.get("results", {})

    def file(self, name: str) -> Path:
        """A file of the run, by its plain name; a trace (.json, .json.gz) must also parse."""
        if not isinstance(name, str) or not FILE_PATTERN.fullmatch(name) or name not in self.meta["files"]:
            raise RunError(f"run {self.run_id} of {self.chapter} has no file {name!r}")
        path = self.path / name
        if path.is_symlink() or not path.is_file():
            raise RunError(f"{path} is missing or not a regular file")
        if name.endswith((".json", ".json.gz")):
            _check_json(path, self.meta["files"][name])
        return path

    def table(self, name: str, **read_csv_args) -> pd.DataFrame:
        """A CSV table of the run, with the columns its chapter declares; an empty, unreadable or
        short table, a number out of its range or a repeated key is a RunError naming the file."""
        if self.declaration is None:
            raise RunError(f"run {self.run_id} of {self.chapter} was opened without its chapter's declaration")
        path = self.file(f"{name}.csv")
        df = read_table(path, self.declaration.columns_of(path.name), **read_csv_args)
        check_table(df, path, self.declaration)
        return df

    @property
    def label(self) -> str:
        """A one-line provenance footer for figures."""
        p = self.provenance
        return f"{p['gpu']} · run {self.run_id} · {p['utc_time'][:10]} · torch {p['torch']}"

    @property
    def cited(self) -> str:
        """The run as a page's prose names it (markdown): its GPU, its id as code, its day."""
        return f"{self.provenance['gpu']}, run `{self.run_id}`, {self.provenance['utc_time'][:10]}"


MAX_TRACE_BYTES = int(os.environ.get("LABSUPPORT_MAX_TRACE_BYTES", 512 << 20))  # decompressed
_JSON_CHECKED: set[tuple[str, str]] = set()


def _check_json(path: Path, digest: str) -> None:
    """A (possibly gzip-compressed) JSON file must decompress whole and parse (checked once
    per process and content)."""
    key = (str(path), digest)
    if key in _JSON_CHECKED:
        return
    try:
        with gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb") as f:
            data = f.read(MAX_TRACE_BYTES + 1)
        if len(data) > MAX_TRACE_BYTES:
            raise RunError(
                f"{path} expands to more than {MAX_TRACE_BYTES >> 20} MiB, more than any trace a run holds; not reading it"
            )
        json.loads(data)
    except (OSError, EOFError, ValueError) as e:  # gzip: truncated/corrupt; json: not JSON
        raise RunError(f"{path} is not a readable trace: {first_line(e)}") from None
    _JSON_CHECKED.add(key)


def published(root: Path | None = None) -> dict[str, str]:
    """The manifest of published runs: {chapter: run_id} (empty if there is no manifest yet;
    a manifest that exists but cannot be read, or names a bad chapter or run id, is an error,
    never an empty manifest)."""
    path = (root or runs_root()) / MANIFEST
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise RunError(f"{path} is corrupt: {first_line(e)}") from None
    if not isinstance(data, dict):
        raise RunError(f"{path} is corrupt: expected an object mapping chapters to run ids")
    for chapter, run_id in data.items():
        check_chapter(chapter, f"{path}")
        check_run_id(run_id, f"{path}: chapter {chapter}")
    return data


def published_run_id(chapter: str, root: Path | None = None) -> str:
    run_id = published(root).get(chapter)
    if not run_id:
        raise RunError(
            f"no published run for chapter {chapter!r} in {(root or runs_root()) / MANIFEST}; "
            f"record one with `python -m labsupport live {chapter}` on a GPU box"
        )
    return run_id


def _check_meta(meta, chapter: str, run_id: str, meta_path: Path) -> None:
    if not isinstance(meta, dict):
        raise RunError(f"{meta_path} is corrupt: not a JSON object")
    missing = [k for k in ("chapter", "run_id", "parameters", "provenance", "files") if k not in meta]
    if missing:
        raise RunError(f"{meta_path} is corrupt: it lacks {', '.join(missing)}")
    if (meta["chapter"], meta["run_id"]) != (chapter, run_id):
        raise RunError(
            f"{meta_path} is of run {meta['run_id']!r} of {meta['chapter']!r}, not of run {run_id!r} of {chapter!r}"
        )
    files = meta["files"]
    if not isinstance(files, dict) or not all(isinstance(v, str) for v in files.values()):
        raise RunError(f"{meta_path} is corrupt: 'files' must map file names to SHA-256 digests")
    for name in files:
        if not FILE_PATTERN.fullmatch(name) or name == "meta.json":
            raise RunError(f"{meta_path} lists {name!r}, which is not a plain file name inside the run")
    prov = meta["provenance"]
    if not isinstance(prov, dict):
        raise RunError(f"{meta_path} is corrupt: 'provenance' is not an object")
    lacking = [f for f in provenance.REQUIRED_FIELDS if f not in prov]
    if lacking:
        raise RunError(f"{meta_path}: provenance lacks {', '.join(lacking)}")
    not_text = [f for f in provenance.REQUIRED_FIELDS if not isinstance(prov[f], str) or len(prov[f]) > 4000]
    if not_text:
        raise RunError(f"{meta_path}: provenance field {not_text[0]} is not text")
    if not isinstance(meta["parameters"], dict):
        raise RunError(f"{meta_path} is corrupt: 'parameters' is not an object")


def load_run(declaration, run_id: str | None = None, root: Path | None = None, verify: bool = True) -> Run:
    """Load a run of the chapter `declaration` declares (labsupport.chapters.Chapter; the published
    run by default), checking it is whole and unmodified; its tables are checked against the
    declaration as they are read."""
    run = open_run(declaration.slug, run_id, root, verify)
    run.declaration = declaration
    return run


def open_run(chapter: str, run_id: str | None = None, root: Path | None = None, verify: bool = True) -> Run:
    """A run of chapter `chapter` (its slug), checked whole and unmodified, for what needs its files
    and meta.json only (publishing, copying): its tables cannot be read (Run.table needs load_run)."""
    root = root or runs_root()
    run_id = run_id or published_run_id(chapter, root)
    path = run_dir(chapter, run_id, root)
    meta_path = path / "meta.json"
    if not path.is_dir():
        raise RunError(f"run {run_id!r} of chapter {chapter!r} not found at {path}")
    if meta_path.is_symlink():
        raise RunError(f"{meta_path} is a symbolic link")
    try:
        meta = json.loads(meta_path.read_text())
    except FileNotFoundError:
        raise RunError(f"run {run_id!r} of chapter {chapter!r} is incomplete: no meta.json") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise RunError(f"run {run_id!r} of chapter {chapter!r} is corrupt: meta.json: {first_line(e)}") from None
    _check_meta(meta, chapter, run_id, meta_path)
    if verify:
        for name, digest in meta["files"].items():
            f = path / name
            if f.is_symlink():
                raise RunError(f"{f} is a symbolic link; a run holds regular files only")
            if not f.is_file():
                raise RunError(f"run {run_id!r} of chapter {chapter!r} is incomplete: {name} is missing")
            if sha256(f) != digest:
                raise RunError(
                    f"run {run_id!r} of chapter {chapter!r} is corrupt: {name} does not match its checksum in meta.json"
                )
    return current_format(Run(chapter=chapter, run_id=run_id, path=path, meta=meta))


class OlderFormat(RunError):
    """A run of a format older than this code's, loaded (and verified, unless told not to): the
    refusal every reader of it gets, and the run that derive brings up to date (`run`)."""

    def __init__(self, message: str, run: Run):
        super().__init__(message)
        self.run = run


def current_format(run: Run) -> Run:
    """`run` if its meta.json records this code's format (formats.CURRENT); else one line naming
    the fix: derive for an older run, a newer labsupport for a newer one."""
    fmt = formats.of(run.meta)
    where = f"run {run.run_id!r} of chapter {run.chapter!r}"
    if fmt is None:
        shown = repr(run.meta["format"])[:40]
        raise RunError(f"{run.path / 'meta.json'} is corrupt: its format {shown} is not a format number")
    if fmt > formats.CURRENT:
        raise RunError(
            f"{where} is of format {fmt}, newer than this code's {formats.CURRENT}: "
            "read it with the labsupport that wrote it, or a later one"
        )
    if fmt < formats.CURRENT:
        raise OlderFormat(
            f"{where} is of format {fmt}, older than this code's {formats.CURRENT}: "
            f"bring it up to date with `python -m labsupport derive {run.chapter}`",
            run,
        )
    return run


def check_published(declarations, root: Path | None = None) -> dict[str, Run]:
    """Every published run, loaded with its chapter's declaration (one of `declarations`) and checked
    whole (traces parsed): the first problem is a RunError naming the file."""
    root = root or runs_root()
    by_slug = {d.slug: d for d in declarations}
    out = {}
    for chapter, run_id in published(root).items():
        if chapter not in by_slug:
            raise RunError(f"{root / MANIFEST} publishes chapter {chapter!r}, which no chapter declares")
        run = load_run(by_slug[chapter], run_id, root)
        for name in run.meta["files"]:
            run.file(name)
        out[chapter] = run
    return out
