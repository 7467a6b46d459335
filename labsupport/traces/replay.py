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
re-derives every table from its trace and compares (check). A trace with no stored tables (a run
recorded before them, a scratch trace being measured) is parsed as before.
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import io
import json
import os
from decimal import Decimal
from pathlib import Path

import pandas as pd

FORMAT = 1
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


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _csv_gz(df: pd.DataFrame) -> bytes:
    """A table as gzip-compressed CSV, byte for byte the same for the same table (mtime 0)."""
    text = df.to_csv(index=False, lineterminator="\n").encode()
    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb", mtime=0, compresslevel=9) as f:
        f.write(text)
    return buf.getvalue()


def derive(events: list[dict], device: str) -> dict[str, bytes]:
    """The stored tables of a trace's events, as bytes: {"events": ..., "kernels": ..., "regions": ...}."""
    from labsupport.traces import trace

    x = [e for e in events if e.get("ph") == "X" and "dur" in e and "ts" in e]
    rows = []
    for e in x:
        a = e.get("args") if isinstance(e.get("args"), dict) else {}
        kept = {k: a[k] for k in ARG_KEYS if k in a}
        rows.append(
            (
                e.get("cat", ""),
                e.get("name", ""),
                json.dumps(e.get("pid")),
                json.dumps(e.get("tid")),
                str(e["ts"]),
                str(e["dur"]),
                json.dumps(kept, sort_keys=True, default=str) if kept else "",
            )
        )
    ev = pd.DataFrame(rows, columns=EVENT_COLUMNS)
    k = trace.kernel_table(events, device=device, origin="\0no origin")  # times on the trace's clock
    annotations = trace.complete_events(events, {"user_annotation"})
    regions = pd.DataFrame(
        [(e["name"], trace.ns(e["ts"]), trace.ns(e["dur"])) for e in annotations], columns=REGION_COLUMNS
    )
    return {"events": _csv_gz(ev), "kernels": _csv_gz(k), "regions": _csv_gz(regions)}


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
    trace at `path`, checked against its run's meta.json; None when the trace has none (no table
    beside it). A table beside it that its meta.json does not list, whose digest differs, or that was
    derived from another trace, is a StoredTableError (one line)."""
    path = Path(path)
    names = table_names(path.name)
    present = {s: path.parent / n for s, n in names.items() if (path.parent / n).exists()}
    if not present:
        return None
    meta = _meta(path.parent) or {}
    files, derived = meta.get("files", {}), meta.get("derived", {})
    if not isinstance(files, dict) or not isinstance(derived, dict):
        files, derived = {}, {}
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
    return _sha256(Path(path).read_bytes())


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


def write_beside(trace_path: Path, device: str, events_list: list[dict] | None = None) -> dict[str, dict]:
    """Derive the tables of the trace at `trace_path` and write them beside it; returns the
    "derived" records for meta.json ({table name: record}). Digests are the caller's to list."""
    from labsupport.traces import trace

    trace_path = Path(trace_path)
    evs = trace.parse_events(trace_path) if events_list is None else events_list
    digest = _sha256(trace_path.read_bytes())
    out = {}
    for s, data in derive(evs, device).items():
        name = table_names(trace_path.name)[s]
        tmp = trace_path.parent / f".{name}.tmp-{os.getpid()}"
        tmp.write_bytes(data)
        os.replace(tmp, trace_path.parent / name)
        out[name] = {"from": trace_path.name, "trace_sha256": digest, "device": device, "format": FORMAT}
    return out


def check(trace_path: Path, device: str | None = None) -> str | None:
    """None when the stored tables of the trace at `trace_path` are what its trace gives now (or it
    has none); else one line saying which differs."""
    from labsupport.traces import trace

    trace_path = Path(trace_path)
    try:
        tables = stored(trace_path)
    except StoredTableError as e:
        return str(e)
    if tables is None:
        return None
    fresh = derive(trace.parse_events(trace_path), device or tables["device"] or "cuda")
    for s, data in fresh.items():
        p = tables[s]
        if gzip.decompress(p.read_bytes()) != gzip.decompress(data):
            return f"{p} differs from the table its trace {trace_path.name} gives; it was not derived from it"
    return None


def derive_folder(folder: Path, device: str) -> dict[str, dict]:
    """Write the stored tables of every profiler trace in a run's folder; returns the "derived"
    records for its meta.json. A .json file that is not a Chrome trace gets none."""
    from labsupport.traces import trace

    folder = Path(folder)
    out = {}
    for p in sorted(folder.iterdir()):
        if p.name.startswith(".") or not p.is_file() or trace_base(p.name) is None:
            continue
        try:
            evs = trace.parse_events(p)
        except trace.TraceError:
            continue  # not a profiler trace (or a damaged one: validation reports it)
        out.update(write_beside(p, device, evs))
    return out
