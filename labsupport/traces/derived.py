"""Writing and checking the tables replay reads (labsupport.traces.replay) from a recorded trace:
derived with the exact parser (labsupport.traces.trace) when a run is recorded, by
`python -m labsupport derive` for an older run, and again by validation, which compares them
with what the trace gives now. A module of its own so that the reader (replay) needs no parser
and the parser needs nothing of this."""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

import pandas as pd

from labsupport.traces import trace
from labsupport.traces.replay import (
    ARG_KEYS,
    EVENT_COLUMNS,
    FORMAT,
    REGION_COLUMNS,
    StoredTableError,
    csv_gz,
    sha256_hex,
    stored,
    table_names,
    trace_base,
)


def derive(events: list[dict], device: str) -> dict[str, bytes]:
    """The stored tables of a trace's events, as bytes: {"events": ..., "kernels": ..., "regions": ...}."""
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
    return {"events": csv_gz(ev), "kernels": csv_gz(k), "regions": csv_gz(regions)}


def write_beside(trace_path: Path, device: str, events_list: list[dict] | None = None) -> dict[str, dict]:
    """Derive the tables of the trace at `trace_path` and write them beside it; returns the
    "derived" records for meta.json ({table name: record}). Digests are the caller's to list."""
    trace_path = Path(trace_path)
    evs = trace.parse_events(trace_path) if events_list is None else events_list
    digest = sha256_hex(trace_path.read_bytes())
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


def derive_folder(folder: Path, device: str, traces: set[str] | None = None) -> dict[str, dict]:
    """Write the stored tables of every profiler trace in a run's folder (of those named in
    `traces`, if given); returns the "derived" records for its meta.json. A .json file that is not
    a Chrome trace gets none."""
    folder = Path(folder)
    out = {}
    for p in sorted(folder.iterdir()):
        if p.name.startswith(".") or not p.is_file() or trace_base(p.name) is None:
            continue
        if traces is not None and p.name not in traces:
            continue
        try:
            evs = trace.parse_events(p)
        except trace.TraceError:
            continue  # not a profiler trace (or a damaged one: validation reports it)
        out.update(write_beside(p, device, evs))
    return out
