"""What replay reads instead of a profiler trace: tables derived from the trace when its run is
written, stored beside it and listed (with checksums) in the run's meta.json.

For a trace `T.json.gz` of a run:

    T.events.csv.gz   its complete ("X") events: category, name, pid, tid, ts and dur as the
                      trace's own text (so Decimal(ts) is what the exact parser reads), and the
                      arguments the analyses use (ARG_KEYS) as JSON
    T.kernels.csv.gz  trace.kernel_table() of it (integer nanoseconds, on the trace's own clock:
                      origin 0), for the device the run measured
    T.regions.csv.gz  its annotations (user_annotation): name, ts_ns, dur_ns

meta.json lists each under "files" (SHA-256) and under "derived" ({table: {"from": trace,
"trace_sha256": the trace's digest, "device": ...}}). A table is used only when meta.json lists
it, its digest matches and it was derived from the trace as it is now; a table beside a trace that
fails any of these is a TraceError in one line, never a silent fall-back to parsing. Validation
re-derives every table from its trace and compares (check). Every trace a run lists has them from
run format 2 on (labsupport.runs.formats; `python -m labsupport derive` brings an older run to it):
one without them is a TraceError too. Only a trace outside a run (a scratch trace being measured,
before its run is written) has none, and is parsed.
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import io
import json
from decimal import Decimal
from pathlib import Path

import pandas as pd

FORMAT = 1
TABLES_SINCE = 2  # the run format (labsupport.runs.formats) from which every trace a run lists has its tables
SUFFIXES = ("events", "kernels", "regions")
ARG_KEYS = ("correlation", "stream", "grid", "block", "registers per thread", "shared memory", "bytes", "device")
EVENT_COLUMNS = ["cat", "name", "pid", "tid", "ts", "dur", "args"]
REGION_COLUMNS = ["name", "ts_ns", "dur_ns"]


class StoredTableError(ValueError):
    """A stored table that is not the one its run lists (tampered, stale or unlisted)."""


def trace_base(name: str) -> str | None:
    """`trace-eager` for `trace-eager.json.gz` (or .json); None for any other name."""
    for ext in (".json.gz", ".json"):
        if name.endswith(ext) and name != "meta.json":
            return name[: -len(ext)]
    return None


def table_names(trace_name: str) -> dict[str, str]:
    """{"events": "T.events.csv.gz", ...} for trace `T.json.gz`."""
    base = trace_base(trace_name)
    return {s: f"{base}.{s}.csv.gz" for s in SUFFIXES} if base else {}


def is_derived(name: str) -> bool:
    return any(name.endswith(f".{s}.csv.gz") for s in SUFFIXES)


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def csv_gz(df: pd.DataFrame) -> bytes:
    """A table as gzip-compressed CSV, byte for byte the same for the same table (mtime 0)."""
    text = df.to_csv(index=False, lineterminator="\n").encode()
    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb", mtime=0, compresslevel=9) as f:
        f.write(text)
    return buf.getvalue()


def _meta(folder: Path) -> dict | None:
    path = folder / "meta.json"
    if not path.is_file() or path.is_symlink():
        return None
    try:
        meta = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None  # the run loader reports a corrupt meta.json
    return meta if isinstance(meta, dict) else None


def stored(path: Path) -> dict | None:
    """{"events": Path, "kernels": Path, "regions": Path, "device": ...} of the stored tables of the
    trace at `path`, checked against its run's meta.json; None when the trace is outside a run (no
    table beside it, and no meta.json of format TABLES_SINCE or later listing it). A table beside it
    that its meta.json does not list, whose digest differs, or that was derived from another trace,
    and a trace of a run that lacks them, is a StoredTableError (one line)."""
    path = Path(path)
    names = table_names(path.name)
    present = {s: path.parent / n for s, n in names.items() if (path.parent / n).exists()}
    meta = _meta(path.parent) or {}
    files, derived = meta.get("files", {}), meta.get("derived", {})
    if not isinstance(files, dict) or not isinstance(derived, dict):
        files, derived = {}, {}
    if not present:
        run_format = meta.get("format")
        if path.name in files and isinstance(run_format, int) and run_format >= TABLES_SINCE:
            raise StoredTableError(
                f"{path} has no replay tables beside it, which every trace of a run of format {run_format} has; "
                "the run is damaged"
            )
        return None
    out: dict = {}
    for s, n in names.items():
        p = path.parent / n
        record = derived.get(n)
        if s not in present or n not in files or not isinstance(record, dict):
            raise StoredTableError(
                f"{p} is {'missing' if s not in present else 'not listed in meta.json'}; "
                f"re-derive the tables of {path.name} (python -m labsupport derive)"
            )
        if p.is_symlink() or _file_sha256(p) != files[n]:
            raise StoredTableError(f"{p} does not match its checksum in meta.json; not using it")
        if record.get("from") != path.name or record.get("trace_sha256") != files.get(path.name):
            raise StoredTableError(f"{p} was not derived from {path.name} as it is now; re-derive it")
        if record.get("format") != FORMAT:
            raise StoredTableError(f"{p} is of format {record.get('format')!r}, not {FORMAT}; re-derive it")
        out[s] = p
        out["device"] = record.get("device")
    return out


def _file_sha256(path: Path) -> str:
    st = path.stat()
    return _digest(str(path), st.st_mtime_ns, st.st_size)


@functools.lru_cache(maxsize=256)
def _digest(path: str, _mtime_ns: int, _size: int) -> str:
    return sha256_hex(Path(path).read_bytes())


@functools.lru_cache(maxsize=64)
def _read(path: str, digest: str, what: str):
    """A stored table, read once per process and content."""
    if what == "events":
        df = pd.read_csv(path, dtype=str, keep_default_na=False)
        ids = {raw: json.loads(raw) for raw in {*df["pid"], *df["tid"]}}
        with_args = df["args"] != ""
        parsed = iter(json.loads("[" + ",".join(df.loc[with_args, "args"]) + "]"))  # one parse for all
        out = []
        for cat, name, pid, tid, ts, dur, args in df.itertuples(index=False, name=None):
            e = {"ph": "X", "cat": cat, "name": name, "pid": ids[pid], "tid": ids[tid], "ts": Decimal(ts)}
            e["dur"] = Decimal(dur)
            if args:
                e["args"] = next(parsed)
            out.append(e)
        return out
    df = pd.read_csv(path, keep_default_na=False, dtype={"name": str, "stream": str, "grid": str, "block": str})
    return df


def events(tables: dict) -> list[dict]:
    """The trace's complete events, from its stored table (copies: callers may change them)."""
    p = tables["events"]
    return [dict(e) for e in _read(str(p), _file_sha256(p), "events")]


def kernels(tables: dict) -> pd.DataFrame:
    """The trace's kernel table on its own clock, from its stored table."""
    p = tables["kernels"]
    return _read(str(p), _file_sha256(p), "kernels").copy()


def regions(tables: dict) -> pd.DataFrame:
    p = tables["regions"]
    return _read(str(p), _file_sha256(p), "regions").copy()
