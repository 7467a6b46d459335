"""Read a torch.profiler (Kineto) Chrome trace into a kernel table.

Each GPU kernel is joined to the CPU call that launched it through the
correlation id the CUDA runtime assigns to both, and from there to the
innermost PyTorch operator (aten::mm, ...) and the innermost module annotation
(layers.3.mlp.down_proj, ...) that was running on that CPU thread at the time.

Times are integer nanoseconds. Kineto writes microseconds with three decimals
on an absolute clock (about 16 significant digits), which a float64 cannot hold
exactly, so the file is parsed with Decimal.

Why not torch's own `prof.key_averages()`: it aggregates, and loses the
per-kernel start/end, stream, grid and the launching op that the chapters need;
and it is not available when replaying a recorded trace.
"""

from __future__ import annotations

import gzip
import json
import os
from decimal import Decimal
from pathlib import Path

import pandas as pd

from labsupport.traces import replay

# Operators that only create views or metadata: on a CPU run they are not "kernels".
_CPU_NON_KERNELS = {
    "aten::view",
    "aten::reshape",
    "aten::_reshape_alias",
    "aten::as_strided",
    "aten::t",
    "aten::transpose",
    "aten::expand",
    "aten::slice",
    "aten::select",
    "aten::unsqueeze",
    "aten::squeeze",
    "aten::_unsafe_view",
    "aten::alias",
    "aten::permute",
    "aten::empty",
    "aten::empty_strided",
    "aten::resolve_conj",
    "aten::resolve_neg",
    "aten::detach",
    "aten::lift_fresh",
    "aten::item",
    "aten::_local_scalar_dense",
    "aten::is_nonzero",
    "aten::split",
    "aten::unbind",
    "aten::narrow",
    "aten::chunk",
    "aten::flatten",
    "aten::empty_like",
    "aten::result_type",
    "aten::_has_compatible_shallow_copy_type",
    "aten::is_same_size",
    "aten::set_",
    "aten::contiguous",
    "aten::expand_as",
    "aten::view_as",
    "aten::unflatten",
    "aten::movedim",
    "aten::numpy_T",
    "aten::matrix_H",
    "aten::dim",
    "aten::detach_",
    "aten::split_with_sizes",
}

KERNEL_COLUMNS = [
    "name",
    "start_ns",
    "end_ns",
    "dur_ns",
    "stream",
    "grid",
    "block",
    "registers",
    "shared_mem",
    "correlation",
    "launch_api",
    "launch_ns",
    "launch_dur_ns",
    "op",
    "module",
]


class TraceError(ValueError):
    """A profiler trace that cannot be read."""


def ns(x) -> int:
    """A trace timestamp or duration (microseconds, as text or float) in integer nanoseconds,
    exactly (Decimal: a float would round 5138519848339.056 us)."""
    return int((Decimal(x) * 1000).to_integral_value())


# The same cap as labsupport.runs.load.MAX_TRACE_BYTES (this layer imports no other): a
# trace that expands beyond it (a decompression bomb) is refused in one line, unread.
MAX_TRACE_BYTES = int(os.environ.get("LABSUPPORT_MAX_TRACE_BYTES", 512 << 20))


def load_events(path: Path) -> list[dict]:
    """The traceEvents of a (gzip-compressed or plain) Chrome trace; for a trace of a run that
    stores its tables (labsupport.traces.replay), its complete ("X") events read from the stored
    table, which is what every analysis walks, without parsing the trace."""
    tables = _stored(path)
    if tables is not None:
        return replay.events(tables)
    return parse_events(path)


def _stored(path: Path) -> dict | None:
    """The checked stored tables of a trace (replay.stored), None without; a tampered, stale or
    unlisted table is a TraceError, never a fall-back to parsing."""
    try:
        return replay.stored(Path(path))
    except replay.StoredTableError as e:
        raise TraceError(str(e)) from None


def parse_events(path: Path) -> list[dict]:
    """The traceEvents of a (gzip-compressed or plain) Chrome trace, parsed exactly (Decimal)."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as f:
            raw = f.read(MAX_TRACE_BYTES + 1)
        if len(raw) > MAX_TRACE_BYTES:
            raise TraceError(f"{path} expands to more than {MAX_TRACE_BYTES >> 20} MiB; not reading it")
        data = json.loads(raw, parse_float=Decimal)
    except (OSError, EOFError, json.JSONDecodeError, UnicodeDecodeError) as e:
        raise TraceError(f"cannot read profiler trace {path}: {e}") from None
    events = data.get("traceEvents") if isinstance(data, dict) else None
    if not isinstance(events, list):
        raise TraceError(f"{path} is not a Chrome trace (no traceEvents list)")
    return events


def complete_events(events, cats) -> list[dict]:
    """The complete events ("ph": "X", with a duration) of the categories `cats`."""
    return [e for e in events if e.get("ph") == "X" and e.get("cat") in cats and "dur" in e]


def enclosing(intervals: list[tuple[int, int, str]], times: list[int]) -> list[tuple[str, ...]]:
    """For each time, the names of every interval containing it, outermost first.

    Intervals on one CPU thread nest properly (a call is inside its caller), so one
    sweep with a stack of open intervals answers every query.
    """
    iv = sorted(intervals, key=lambda t: (t[0], -(t[1] - t[0])))
    order = sorted(range(len(times)), key=times.__getitem__)
    out: list[tuple[str, ...]] = [()] * len(times)
    stack: list[tuple[int, int, str]] = []
    j = 0
    for q in order:
        t = times[q]
        while j < len(iv) and iv[j][0] <= t:
            while stack and stack[-1][1] <= iv[j][0]:
                stack.pop()
            stack.append(iv[j])
            j += 1
        while stack and stack[-1][1] <= t:
            stack.pop()
        out[q] = tuple(s[2] for s in stack if s[1] > t)
    return out


def _innermost(intervals: list[tuple[int, int, str]], times: list[int]) -> list[str]:
    """For each time, the name of the innermost interval containing it ("" if none)."""
    return [names[-1] if names else "" for names in enclosing(intervals, times)]


def enclosing_names(events: list[dict], queries: list[tuple]) -> list[str]:
    """Innermost enclosing event name for each (pid, tid, t) query, per thread."""
    by_thread: dict = {}
    for e in events:
        s = ns(e["ts"])
        by_thread.setdefault((e["pid"], e["tid"]), []).append((s, s + ns(e["dur"]), e["name"]))
    out = [""] * len(queries)
    grouped: dict = {}
    for i, (pid, tid, t) in enumerate(queries):
        grouped.setdefault((pid, tid), []).append((i, t))
    for key, items in grouped.items():
        names = _innermost(by_thread.get(key, []), [t for _, t in items])
        for (i, _), name in zip(items, names, strict=False):
            out[i] = name
    return out


def kernel_table(events: list[dict], device: str = "cuda", origin: str = "decode_step") -> pd.DataFrame:
    """One row per kernel, in start order, times relative to the `origin` annotation.

    On a CPU trace (device="cpu") the rows are the top-level ATen operators instead,
    since a CPU has no kernel launches to record.
    """
    ops = complete_events(events, {"cpu_op"})
    annotations = complete_events(events, {"user_annotation"})
    origin_ev = [e for e in annotations if e["name"] == origin]
    t0 = ns(origin_ev[0]["ts"]) if origin_ev else 0
    rows = []
    if device == "cpu":
        # A CPU has no kernel launches: count each top-level ATen call (one not made
        # inside another operator) as the CPU's unit of work, views excepted.
        spans = sorted(
            ((ns(e["ts"]), ns(e["ts"]) + ns(e["dur"]), e) for e in ops),
            key=lambda t: (str(t[2]["tid"]), t[0], -(t[1] - t[0])),
        )
        open_end: dict = {}
        for s, end, e in spans:
            if s < open_end.get(e["tid"], -1):
                continue  # nested inside an operator already counted
            open_end[e["tid"]] = end
            if e["name"] in _CPU_NON_KERNELS:
                continue
            rows.append(
                dict(
                    name=e["name"],
                    start_ns=s - t0,
                    end_ns=end - t0,
                    dur_ns=end - s,
                    stream="cpu",
                    grid="",
                    block="",
                    registers=0,
                    shared_mem=0,
                    correlation=-1,
                    launch_api="",
                    launch_ns=s - t0,
                    launch_dur_ns=0,
                    op=e["name"],
                    module=(e["pid"], e["tid"], s),
                )
            )
        modules = enclosing_names(annotations, [r["module"] for r in rows])
        for r, m in zip(rows, modules, strict=False):
            r["module"] = m
    else:
        runtime = {
            e["args"].get("correlation"): e
            for e in complete_events(events, {"cuda_runtime", "cuda_driver"})
            if isinstance(e.get("args"), dict) and "correlation" in e["args"]
        }
        for k in complete_events(events, {"kernel"}):
            a = k.get("args", {})
            s = ns(k["ts"])
            launch = runtime.get(a.get("correlation"))
            if launch is not None:
                ls = ns(launch["ts"])
                where = (launch["pid"], launch["tid"], ls)
                api, lns, ldur = launch["name"], ls - t0, ns(launch["dur"])
            else:
                where, api, lns, ldur = None, "", 0, 0
            rows.append(
                dict(
                    name=k["name"],
                    start_ns=s - t0,
                    end_ns=s + ns(k["dur"]) - t0,
                    dur_ns=ns(k["dur"]),
                    stream=str(a.get("stream", "")),
                    grid=",".join(map(str, a.get("grid", []))),
                    block=",".join(map(str, a.get("block", []))),
                    registers=int(a.get("registers per thread", 0)),
                    shared_mem=int(a.get("shared memory", 0)),
                    correlation=int(a.get("correlation", -1)),
                    launch_api=api,
                    launch_ns=lns,
                    launch_dur_ns=ldur,
                    op=where,
                    module=where,
                )
            )
        found = [r["op"] for r in rows if r["op"] is not None]
        ops_found, modules_found = iter(enclosing_names(ops, found)), iter(enclosing_names(annotations, found))
        for r in rows:
            if r["op"] is None:
                r["op"] = r["module"] = ""
            else:
                r["op"], r["module"] = next(ops_found), next(modules_found)
    df = pd.DataFrame(rows, columns=KERNEL_COLUMNS)
    return df.sort_values(["start_ns", "correlation"], kind="stable").reset_index(drop=True)


def read_kernels(path: Path, device: str = "cuda", origin: str = "decode_step") -> pd.DataFrame:
    """kernel_table() of a trace file: when the trace holds the `origin` annotation, only the
    kernels launched inside it (see `inside_region`). A trace of a run that stores its tables is
    read from its stored kernel table, unparsed."""
    tables = _stored(path)
    if tables is not None and tables["device"] == device:
        k, span = _stored_kernels(tables, device, origin)
        return k if span is None else inside_region(k, span)
    events = parse_events(path)
    k = kernel_table(events, device=device, origin=origin)
    spans = [e for e in complete_events(events, {"user_annotation"}) if e["name"] == origin]
    return inside_region(k, ns(spans[0]["dur"])) if spans else k


def inside_region(k: pd.DataFrame, span_ns: int) -> pd.DataFrame:
    """The rows of a kernel table (times relative to a region's start) launched inside the
    region, which lasted `span_ns`: a profile also holds what ran around the region (a
    prefill before a decode step, say). A kernel whose launch call is not in the trace is
    kept when it starts inside the region."""
    known = k.launch_api != ""
    start = k.launch_ns.where(known, k.start_ns)
    return k[(start >= 0) & (start <= span_ns)].reset_index(drop=True)


def busy_ns(starts, ends) -> int:
    """Length of the union of the intervals [start, end): the time the device was busy."""
    total, cur_s, cur_e = 0, None, None
    for s, e in sorted(zip(starts, ends, strict=False)):
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None:
        total += cur_e - cur_s
    return int(total)


def origin_span_ns(events: list[dict], origin: str = "decode_step") -> int:
    """Duration of the `origin` annotation on the CPU (the profiled step as the host saw it)."""
    for e in complete_events(events, {"user_annotation"}):
        if e["name"] == origin:
            return ns(e["dur"])
    raise TraceError(f"no {origin!r} annotation in the trace")


def region_kernels(path: Path, device: str = "cuda", region: str = "decode_step") -> pd.DataFrame:
    """read_kernels() for a trace that must hold the `region` annotation."""
    tables = _stored(path)
    if tables is not None and tables["device"] == device:
        k, span = _stored_kernels(tables, device, region)
        if span is None:
            raise TraceError(f"no {region!r} annotation in the trace")
        return inside_region(k, span)
    events = parse_events(path)
    span = origin_span_ns(events, region)
    return inside_region(kernel_table(events, device=device, origin=region), span)


def call_paths(events: list[dict], correlations, leave_out: tuple[str, ...] = ()) -> dict:
    """For each kernel (by its launch's correlation id) the chain of CPU operators the launching
    thread was inside when it launched it, outermost first, joined by " › " ("reshape › clone ›
    copy_"; "aten::" left out, and the annotations named in `leave_out`)."""
    launches = launch_events(events)
    ops: dict = {}
    for e in events:
        if e.get("ph") == "X" and e.get("cat") == "cpu_op" and "dur" in e:
            s = ns(e["ts"])
            ops.setdefault((e["pid"], e["tid"]), []).append((s, s + ns(e["dur"]), e["name"]))
    queries: dict = {}
    for c in dict.fromkeys(correlations):
        launch = launches.get(c)
        if launch is not None:
            queries.setdefault((launch["pid"], launch["tid"]), []).append((c, ns(launch["ts"])))
    paths = {}
    for key, items in queries.items():
        for (c, _), stack in zip(items, enclosing(ops.get(key, []), [t for _, t in items]), strict=True):
            paths[c] = " › ".join(n.removeprefix("aten::") for n in stack if n not in leave_out)
    return paths


def launch_events(events: list[dict]) -> dict:
    """The CPU's launch calls (CUDA runtime or driver API) of a trace, by correlation id: the id
    a kernel or memset shares with the call that issued it."""
    return {
        e["args"]["correlation"]: e
        for e in events
        if e.get("ph") == "X"
        and e.get("cat") in ("cuda_runtime", "cuda_driver")
        and isinstance(e.get("args"), dict)
        and "correlation" in e["args"]
    }


def _stored_kernels(tables: dict, device: str, origin: str) -> tuple[pd.DataFrame, int | None]:
    """kernel_table(..., origin) from a trace's stored tables (its kernel table on the trace's own
    clock, and its annotations), and the origin annotation's length (None: not in the trace)."""
    k = replay.kernels(tables)
    regions = replay.regions(tables)
    spans = regions[regions["name"] == origin]
    if spans.empty:
        return k, None
    t0, span = int(spans["ts_ns"].iloc[0]), int(spans["dur_ns"].iloc[0])
    k["start_ns"] -= t0
    k["end_ns"] -= t0
    launched = k["launch_api"] != "" if device != "cpu" else pd.Series(True, index=k.index)
    k.loc[launched, "launch_ns"] -= t0
    return k, span
