"""Recorded runs: write one atomically, publish it, and load it back for replay.

Layout: runs/<chapter>/<run_id>/ holds CSV tables, a compressed raw profiler
trace and meta.json (provenance, parameters, and a SHA-256 of every file);
runs/published.json maps each chapter to the run the book replays.

A run is first written to a hidden `.incomplete-<run_id>` folder and renamed into
place only when it is whole; published.json is replaced atomically (one rename),
so several chapters are promoted together or not at all. A failed or interrupted
run never changes what the book shows.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from . import provenance
from .provenance import REPO_ROOT

MANIFEST = "published.json"
RUN_ID_PATTERN = re.compile(r"^[0-9]{8}T[0-9]{6}Z[-A-Za-z0-9_.]*$")


class RunError(RuntimeError):
    """A run that is missing, incomplete or corrupt."""


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
        self.chapter = chapter
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

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc_type is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)
            return False
        files = sorted(p for p in self.tmp.rglob("*") if p.is_file())
        meta = {
            "chapter": self.chapter,
            "run_id": self.run_id,
            "parameters": self.parameters,
            "provenance": self.meta.get("provenance") or provenance.collect(),
            "results": self.extra,
            "files": {str(p.relative_to(self.tmp)): _sha256(p) for p in files},
        }
        (self.tmp / "meta.json").write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
        for p in files + [self.tmp / "meta.json"]:
            with open(p, "rb") as f:
                os.fsync(f.fileno())
        os.rename(self.tmp, self.final)
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
        path = self.path / name
        if name not in self.meta["files"] or not path.is_file():
            raise RunError(f"run {self.run_id} of {self.chapter} has no file {name!r}")
        return path

    def table(self, name: str, **read_csv_args) -> pd.DataFrame:
        return pd.read_csv(self.file(f"{name}.csv"), **read_csv_args)

    @property
    def label(self) -> str:
        """A one-line provenance footer for figures."""
        p = self.provenance
        return f"{p['gpu']} · run {self.run_id} · {p['utc_time'][:10]} · torch {p['torch']}"


def published(root: Path | None = None) -> dict[str, str]:
    """The manifest of published runs: {chapter: run_id} (empty if none yet)."""
    path = (root or runs_root()) / MANIFEST
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise RunError(f"{path} is corrupt: {e}") from None
    if not isinstance(data, dict) or not all(isinstance(v, str) for v in data.values()):
        raise RunError(f"{path} is corrupt: expected an object mapping chapters to run ids")
    return data


def published_run_id(chapter: str, root: Path | None = None) -> str:
    run_id = published(root).get(chapter)
    if not run_id:
        raise RunError(f"no published run for chapter {chapter!r} in {(root or runs_root()) / MANIFEST}; "
                       f"record one with `python -m labsupport live {chapter}` on a GPU box")
    return run_id


def load_run(chapter: str, run_id: str | None = None, root: Path | None = None,
             verify: bool = True) -> Run:
    """Load a run (the published one by default), checking it is whole and unmodified."""
    root = root or runs_root()
    run_id = run_id or published_run_id(chapter, root)
    path = root / chapter / run_id
    meta_path = path / "meta.json"
    if not path.is_dir():
        raise RunError(f"run {run_id!r} of chapter {chapter!r} not found at {path}")
    try:
        meta = json.loads(meta_path.read_text())
    except FileNotFoundError:
        raise RunError(f"run {run_id!r} of chapter {chapter!r} is incomplete: no meta.json") from None
    except json.JSONDecodeError as e:
        raise RunError(f"run {run_id!r} of chapter {chapter!r} is corrupt: meta.json: {e}") from None
    missing = [k for k in ("chapter", "run_id", "parameters", "provenance", "files") if k not in meta]
    if missing:
        raise RunError(f"run {run_id!r} of chapter {chapter!r} is corrupt: meta.json lacks {missing}")
    if verify:
        for name, digest in meta["files"].items():
            f = path / name
            if not f.is_file():
                raise RunError(f"run {run_id!r} of chapter {chapter!r} is incomplete: {name} is missing")
            if _sha256(f) != digest:
                raise RunError(f"run {run_id!r} of chapter {chapter!r} is corrupt: {name} does not "
                               f"match its checksum in meta.json")
    return Run(chapter=chapter, run_id=run_id, path=path, meta=meta)


def publish_many(runs_by_chapter: dict[str, str], root: Path | None = None) -> None:
    """Point the book at these runs, all at once: every run is checked first, then the
    manifest is replaced with one atomic rename."""
    root = root or runs_root()
    for chapter, run_id in runs_by_chapter.items():
        load_run(chapter, run_id, root)
    manifest = {**published(root), **runs_by_chapter}
    path = root / MANIFEST
    tmp = path.with_name(f".{MANIFEST}.tmp")
    tmp.write_text(json.dumps(dict(sorted(manifest.items())), indent=2) + "\n")
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(root)


def publish(chapter: str, run_id: str, root: Path | None = None) -> None:
    """Point the book at `run_id` for `chapter` (after checking the run loads), atomically."""
    publish_many({chapter: run_id}, root)


def list_runs(chapter: str, root: Path | None = None) -> list[str]:
    """Ids of the complete runs of a chapter, oldest first."""
    d = (root or runs_root()) / chapter
    if not d.is_dir():
        return []
    return sorted(p.name for p in d.iterdir() if p.is_dir() and not p.name.startswith(".")
                  and (p / "meta.json").is_file())


def prune(chapter: str, keep: set[str], root: Path | None = None) -> list[str]:
    """Delete the complete runs of `chapter` not in `keep` (never the published one); their
    headline numbers stay in runs/history.csv. Returns the ids removed."""
    root = root or runs_root()
    keep = set(keep) | {published(root).get(chapter)}
    removed = [r for r in list_runs(chapter, root) if r not in keep]
    for r in removed:
        shutil.rmtree(root / chapter / r)
    return removed


def live_writer(chapter: str, params, run_id: str | None = None, allow_cpu: bool = False) -> RunWriter:
    """The writer of a new live run of `chapter`, after the checks every chapter makes first:
    a known model preset (if the parameters name one), a GPU to measure (a CPU only for the
    tests' tiny model), provenance collected now, and a run id naming the GPU."""
    from dataclasses import asdict

    from . import decode, models

    if getattr(params, "preset", None):
        models.preset_config(params.preset)
    decode.require_device(params.device, allow_cpu=allow_cpu and getattr(params, "preset", "").startswith("tiny"))
    prov = provenance.collect()
    run_id = run_id or new_run_id(prov["gpu"].replace("NVIDIA", ""))
    return RunWriter(chapter, asdict(params), run_id, meta={"provenance": prov})
