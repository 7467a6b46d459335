"""Recorded runs: write one atomically, publish it, and load it back for replay.

Layout: runs/<chapter>/<run_id>/ holds CSV tables, a compressed raw profiler
trace and meta.json (provenance, parameters, and a SHA-256 of every file);
runs/published.json maps each chapter to the run the book replays.

A run is first written to a hidden `.incomplete-<run_id>` folder and renamed into
place only when it is whole; published.json is replaced atomically (one rename),
so several chapters are promoted together or not at all. A failed or interrupted
run never changes what the book shows.

Everything read from runs/ is checked at this boundary: chapter names and run ids match
their patterns and stay inside the runs folder, the files a meta.json lists are plain names
of regular files (no links), provenance is complete, and a table or trace that cannot be
read is one RunError naming the file.
"""
from __future__ import annotations

import gzip
import hashlib
import json
import os
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from labsupport.runs import provenance
from labsupport.runs.provenance import REPO_ROOT

MANIFEST = "published.json"
RUN_ID_PATTERN = re.compile(r"^[0-9]{8}T[0-9]{6}Z(-[A-Za-z0-9_]+)*$")
CHAPTER_PATTERN = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)*$")
FILE_PATTERN = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_+-]*(\.[A-Za-z0-9_+-]+)*$")


class RunError(RuntimeError):
    """A run that is missing, incomplete or corrupt (the message is one line naming it)."""


def check_chapter(chapter, where: str = "") -> str:
    """`chapter` if it is a chapter name (lower-case words joined by '-'), else RunError."""
    if not isinstance(chapter, str) or not CHAPTER_PATTERN.match(chapter):
        raise RunError(f"{where or 'chapter'}: {chapter!r} is not a chapter name (e.g. kernels-in-one-token)")
    return chapter


def check_run_id(run_id, where: str = "") -> str:
    """`run_id` if it is a run id, else RunError."""
    if not isinstance(run_id, str) or not RUN_ID_PATTERN.match(run_id):
        raise RunError(f"{where or 'run id'}: {run_id!r} is not a run id (e.g. 20261129T233000Z-h200)")
    return run_id


def run_dir(chapter: str, run_id: str, root: Path | None = None, where: str = "") -> Path:
    """The folder of a run, after checking both names and that it lies inside the runs folder
    (neither the chapter folder nor the run folder may be a link)."""
    root = root or runs_root()
    check_chapter(chapter, where)
    check_run_id(run_id, where)
    path = root / chapter / run_id
    for p in (root / chapter, path):
        if p.is_symlink():
            raise RunError(f"{p} is a symbolic link; runs are read only from real folders under {root}")
    if path.exists() and not path.resolve().is_relative_to(root.resolve()):
        raise RunError(f"{path} resolves outside {root}")
    return path


def runs_root() -> Path:
    """The runs folder (LABSUPPORT_RUNS overrides it, for tests and scratch runs)."""
    return Path(os.environ.get("LABSUPPORT_RUNS", REPO_ROOT / "runs"))


def new_run_id(tag: str = "") -> str:
    """A sortable id: the UTC time, then an optional tag such as the GPU."""
    stamp = provenance.utc_now().replace("-", "").replace(":", "")
    tag = re.sub(r"[^A-Za-z0-9]+", "-", tag).strip("-").lower()
    return f"{stamp}-{tag}" if tag else stamp


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class RunWriter:
    """Write a run atomically.

        with RunWriter("kernels-in-one-token", params) as run:
            run.write_table("census", df)
        # here runs/kernels-in-one-token/<run_id>/ exists, whole; on error, nothing does
    """

    def __init__(self, chapter: str, parameters: dict, run_id: str | None = None,
                 root: Path | None = None, meta: dict | None = None):
        self.chapter = check_chapter(chapter)
        self.parameters = dict(parameters)
        self.run_id = run_id or new_run_id()
        if not RUN_ID_PATTERN.match(self.run_id):
            raise RunError(f"bad run id {self.run_id!r}: expected e.g. 20261129T233000Z-h200")
        self.chapter_dir = (root or runs_root()) / chapter
        self.final = self.chapter_dir / self.run_id
        self.tmp = self.chapter_dir / f".incomplete-{self.run_id}"
        self.meta = dict(meta or {})
        self.extra: dict = {}

    def __enter__(self) -> "RunWriter":
        if self.final.exists():
            raise RunError(f"run {self.final} already exists")
        self.chapter_dir.mkdir(parents=True, exist_ok=True)
        if self.tmp.exists():
            shutil.rmtree(self.tmp)
        self.tmp.mkdir()
        return self

    @property
    def path(self) -> Path:
        return self.tmp

    def write_table(self, name: str, df: pd.DataFrame) -> Path:
        path = self.tmp / f"{name}.csv"
        df.to_csv(path, index=False)
        return path

    def write_json(self, name: str, obj) -> Path:
        path = self.tmp / f"{name}.json"
        path.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")
        return path

    def _files(self) -> list[Path]:
        """The run's files: plain names at the top of the run folder; hidden scratch files
        (a trace being written, say) are removed, anything else is an error."""
        files = []
        for p in sorted(self.tmp.iterdir()):
            if p.name.startswith(".") and (p.is_file() or p.is_symlink()):
                p.unlink()
            elif p.is_symlink() or not p.is_file() or not FILE_PATTERN.match(p.name):
                raise RunError(f"run {self.run_id} of {self.chapter}: {p.name!r} is not a plain file name "
                               f"(runs hold regular files only)")
            else:
                files.append(p)
        return files

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc_type is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)
            return False
        try:
            files = self._files()
            meta = {
                "chapter": self.chapter,
                "run_id": self.run_id,
                "parameters": self.parameters,
                "provenance": self.meta.get("provenance") or provenance.collect(),
                "results": self.extra,
                "files": {p.name: _sha256(p) for p in files},
            }
            (self.tmp / "meta.json").write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
            for p in files + [self.tmp / "meta.json"]:
                with open(p, "rb") as f:
                    os.fsync(f.fileno())
            os.rename(self.tmp, self.final)
        except BaseException:
            shutil.rmtree(self.tmp, ignore_errors=True)
            raise
        _fsync_dir(self.chapter_dir)
        return False


@dataclass
class Run:
    """A recorded run, read back for replay."""

    chapter: str
    run_id: str
    path: Path
    meta: dict = field(repr=False)

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
        if not isinstance(name, str) or not FILE_PATTERN.match(name) or name not in self.meta["files"]:
            raise RunError(f"run {self.run_id} of {self.chapter} has no file {name!r}")
        path = self.path / name
        if path.is_symlink() or not path.is_file():
            raise RunError(f"{path} is missing or not a regular file")
        if name.endswith((".json", ".json.gz")):
            _check_json(path, self.meta["files"][name])
        return path

    def table(self, name: str, **read_csv_args) -> pd.DataFrame:
        """A CSV table of the run, with the columns its chapter declares (chapters.py); an
        empty, unreadable or short table is a RunError naming the file."""
        path = self.file(f"{name}.csv")
        return read_table(path, _declared_columns(self.chapter, path.name), **read_csv_args)

    @property
    def label(self) -> str:
        """A one-line provenance footer for figures."""
        p = self.provenance
        return f"{p['gpu']} · run {self.run_id} · {p['utc_time'][:10]} · torch {p['torch']}"


def _declared_columns(chapter: str, name: str) -> tuple[str, ...]:
    from labsupport import chapters

    known = {c.slug: c for c in chapters.CHAPTERS}
    return known[chapter].columns.get(name, ()) if chapter in known else ()


def read_table(path: Path, required=(), **read_csv_args) -> pd.DataFrame:
    """Read a CSV file of a run: empty, unparsable or lacking a `required` column is one
    RunError naming the file."""
    try:
        df = pd.read_csv(path, **read_csv_args)
    except pd.errors.EmptyDataError:
        raise RunError(f"{path} is empty") from None
    except (pd.errors.ParserError, UnicodeDecodeError, ValueError) as e:
        raise RunError(f"{path} is not a readable table: {_first_line(e)}") from None
    missing = [c for c in required if c not in df.columns]
    if missing:
        raise RunError(f"{path} lacks column{'s' if len(missing) > 1 else ''} {', '.join(missing)} "
                       f"(it has {', '.join(map(str, df.columns))})")
    return df


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0] if text else type(e).__name__


_JSON_CHECKED: set[tuple[str, str]] = set()


def _check_json(path: Path, digest: str) -> None:
    """A (possibly gzip-compressed) JSON file must decompress whole and parse (checked once
    per process and content)."""
    key = (str(path), digest)
    if key in _JSON_CHECKED:
        return
    try:
        with (gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb")) as f:
            json.loads(f.read())
    except (OSError, EOFError, ValueError) as e:  # gzip: truncated/corrupt; json: not JSON
        raise RunError(f"{path} is not a readable trace: {_first_line(e)}") from None
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
        raise RunError(f"{path} is corrupt: {_first_line(e)}") from None
    if not isinstance(data, dict):
        raise RunError(f"{path} is corrupt: expected an object mapping chapters to run ids")
    for chapter, run_id in data.items():
        check_chapter(chapter, f"{path}")
        check_run_id(run_id, f"{path}: chapter {chapter}")
    return data


def published_run_id(chapter: str, root: Path | None = None) -> str:
    run_id = published(root).get(chapter)
    if not run_id:
        raise RunError(f"no published run for chapter {chapter!r} in {(root or runs_root()) / MANIFEST}; "
                       f"record one with `python -m labsupport live {chapter}` on a GPU box")
    return run_id


def _check_meta(meta, chapter: str, run_id: str, meta_path: Path) -> None:
    if not isinstance(meta, dict):
        raise RunError(f"{meta_path} is corrupt: not a JSON object")
    missing = [k for k in ("chapter", "run_id", "parameters", "provenance", "files") if k not in meta]
    if missing:
        raise RunError(f"{meta_path} is corrupt: it lacks {', '.join(missing)}")
    if (meta["chapter"], meta["run_id"]) != (chapter, run_id):
        raise RunError(f"{meta_path} is of run {meta['run_id']!r} of {meta['chapter']!r}, "
                       f"not of run {run_id!r} of {chapter!r}")
    files = meta["files"]
    if not isinstance(files, dict) or not all(isinstance(v, str) for v in files.values()):
        raise RunError(f"{meta_path} is corrupt: 'files' must map file names to SHA-256 digests")
    for name in files:
        if not FILE_PATTERN.match(name) or name == "meta.json":
            raise RunError(f"{meta_path} lists {name!r}, which is not a plain file name inside the run")
    prov = meta["provenance"]
    if not isinstance(prov, dict):
        raise RunError(f"{meta_path} is corrupt: 'provenance' is not an object")
    lacking = [f for f in provenance.REQUIRED_FIELDS if f not in prov]
    if lacking:
        raise RunError(f"{meta_path}: provenance lacks {', '.join(lacking)}")
    if not isinstance(meta["parameters"], dict):
        raise RunError(f"{meta_path} is corrupt: 'parameters' is not an object")


def load_run(chapter: str, run_id: str | None = None, root: Path | None = None,
             verify: bool = True) -> Run:
    """Load a run (the published one by default), checking it is whole and unmodified."""
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
        raise RunError(f"run {run_id!r} of chapter {chapter!r} is corrupt: meta.json: {_first_line(e)}") from None
    _check_meta(meta, chapter, run_id, meta_path)
    if verify:
        for name, digest in meta["files"].items():
            f = path / name
            if f.is_symlink():
                raise RunError(f"{f} is a symbolic link; a run holds regular files only")
            if not f.is_file():
                raise RunError(f"run {run_id!r} of chapter {chapter!r} is incomplete: {name} is missing")
            if _sha256(f) != digest:
                raise RunError(f"run {run_id!r} of chapter {chapter!r} is corrupt: {name} does not "
                               f"match its checksum in meta.json")
    return Run(chapter=chapter, run_id=run_id, path=path, meta=meta)


def check_published(root: Path | None = None) -> dict[str, Run]:
    """Every published run, loaded and checked whole (traces parsed): the first problem is a
    RunError naming the file."""
    root = root or runs_root()
    out = {}
    for chapter, run_id in published(root).items():
        run = load_run(chapter, run_id, root)
        for name in run.meta["files"]:
            run.file(name)
        out[chapter] = run
    return out


def write_atomic(path: Path, data: bytes) -> None:
    """Replace `path` with `data` in one rename (a hidden temporary file beside it)."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


def manifest_bytes(manifest: dict[str, str]) -> bytes:
    return (json.dumps(dict(sorted(manifest.items())), indent=2) + "\n").encode()


def publish_many(runs_by_chapter: dict[str, str], root: Path | None = None) -> None:
    """Point the book at these runs, all at once: every run is checked first, then the
    manifest is replaced with one atomic rename. (The nightly and live commands publish
    through labsupport.runs.promotion, which also adds the history rows in the same step.)"""
    root = root or runs_root()
    for chapter, run_id in runs_by_chapter.items():
        load_run(chapter, run_id, root)
    write_atomic(root / MANIFEST, manifest_bytes({**published(root), **runs_by_chapter}))


def publish(chapter: str, run_id: str, root: Path | None = None) -> None:
    """Point the book at `run_id` for `chapter` (after checking the run loads), atomically."""
    publish_many({chapter: run_id}, root)


def list_runs(chapter: str, root: Path | None = None) -> list[str]:
    """Ids of the complete runs of a chapter, oldest first."""
    d = (root or runs_root()) / check_chapter(chapter)
    if not d.is_dir() or d.is_symlink():
        return []
    return sorted(p.name for p in d.iterdir() if p.is_dir() and not p.is_symlink()
                  and RUN_ID_PATTERN.match(p.name) and (p / "meta.json").is_file())


def prune(chapter: str, keep: set[str], root: Path | None = None) -> list[str]:
    """Delete the complete runs of `chapter` not in `keep` (never the published one); their
    headline numbers stay in runs/history.csv. Returns the ids removed."""
    root = root or runs_root()
    keep = set(keep) | {published(root).get(chapter)}
    removed = [r for r in list_runs(chapter, root) if r not in keep]
    for r in removed:
        shutil.rmtree(root / chapter / r)
    return removed


def copy_published(dst: Path, root: Path | None = None, manifest: dict[str, str] | None = None,
                   link: bool = True) -> dict[str, Run]:
    """A runs folder at `dst` holding the published runs (of `manifest`, by default the
    published one) and their manifest: each run checked whole, only the files its meta.json
    lists, hard links where possible (`link`), never a symbolic link followed."""
    root = root or runs_root()
    manifest = published(root) if manifest is None else manifest
    out = {}
    for chapter, run_id in sorted(manifest.items()):
        run = load_run(chapter, run_id, root)
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
