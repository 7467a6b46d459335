"""Write a run atomically (RunWriter), and replace one file atomically (write_atomic)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import pandas as pd

from labsupport.runs import formats, provenance
from labsupport.runs.paths import FILE_PATTERN, RUN_ID_PATTERN, RunError, check_chapter, new_run_id, runs_root


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class RunWriter:
    """Write a run atomically.

    with RunWriter(declaration, params) as run:  # the chapter's (labsupport.chapters.Chapter)
        run.write_table("census", df)
    # here runs/kernels-in-one-token/<run_id>/ exists, whole; on error, nothing does
    """

    def __init__(
        self,
        declaration,
        parameters: dict,
        run_id: str | None = None,
        root: Path | None = None,
        meta: dict | None = None,
    ):
        self.declaration = declaration  # what the tables are checked against (runs.tables)
        self.chapter = check_chapter(declaration.slug)
        self.parameters = dict(parameters)
        self.run_id = run_id or new_run_id()
        if not RUN_ID_PATTERN.match(self.run_id):
            raise RunError(f"bad run id {self.run_id!r}: expected e.g. 20261129T233000Z-h200")
        self.chapter_dir = (root or runs_root()) / self.chapter
        self.final = self.chapter_dir / self.run_id
        self.tmp = self.chapter_dir / f".incomplete-{self.run_id}"
        self.meta = dict(meta or {})
        self.extra: dict = {}
        # Called with the run's folder once everything is written, before the files are listed:
        # writes files derived from the others and returns what meta.json's "derived" says of them
        # (labsupport.measure.recording sets it: the replay tables of the profiler traces).
        self.derive = None

    def __enter__(self) -> RunWriter:
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

    def _files(self) -> list[Path]:
        """The run's files: plain names at the top of the run folder; hidden scratch files
        (a trace being written, say) are removed, anything else is an error."""
        files = []
        for p in sorted(self.tmp.iterdir()):
            if p.name.startswith(".") and (p.is_file() or p.is_symlink()):
                p.unlink()
            elif p.is_symlink() or not p.is_file() or not FILE_PATTERN.match(p.name):
                raise RunError(
                    f"run {self.run_id} of {self.chapter}: {p.name!r} is not a plain file name "
                    f"(runs hold regular files only)"
                )
            else:
                files.append(p)
        return files

    def _check_tables(self, files: list[Path]) -> None:
        """Every table readable, every number in its declared range (the chapter's declaration) and no
        key repeated, checked before the run exists: one RunError naming the file and what is wrong."""
        from labsupport.runs.tables import check_table, read_table

        for p in files:
            if p.suffix == ".csv":
                try:
                    df = read_table(p)
                except RunError:
                    continue  # an empty table is the validation's to report
                check_table(df, self.final / p.name, self.declaration)

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc_type is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)
            return False
        try:
            derived = self.derive(self.tmp) if self.derive is not None else {}
            files = self._files()
            self._check_tables(files)
            meta = {
                "chapter": self.chapter,
                "format": formats.CURRENT,
                "run_id": self.run_id,
                "parameters": self.parameters,
                "provenance": self.meta.get("provenance") or provenance.collect(),
                "results": self.extra,
                "files": {p.name: sha256(p) for p in files},
            }
            if derived:
                meta["derived"] = derived
            (self.tmp / "meta.json").write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
            for p in files + [self.tmp / "meta.json"]:
                with open(p, "rb") as f:
                    os.fsync(f.fileno())
            os.rename(self.tmp, self.final)
        except BaseException:
            shutil.rmtree(self.tmp, ignore_errors=True)
            raise
        fsync_dir(self.chapter_dir)
        return False


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
    fsync_dir(path.parent)
