"""The host's side of a profiled step: the prompt phase host against device, the CPU time of
one kind of call, and who issued the step's memsets."""

from __future__ import annotations

import bisect
import re
import statistics
from dataclasses import dataclass

import pandas as pd

from labsupport import runs
from labsupport.chapters.hybrid_model_token.keys import trace_file, wall_column
from labsupport.traces import trace


def prefill_host_device(run: runs.Run) -> pd.DataFrame:
    """The prompt phase of each backend, host against device: kernels, GPU busy (the profiled
    prompt), wall time (the least of the repeats, the median, the slowest; no profiler), the GPU idle that leaves
    (wall - busy), and both per kernel launched."""
    p = run.table("prefill")
    p = p[p.status == "ok"]
    out = pd.DataFrame(
        {"backend": p.backend, "kernels": p.kernels, "GPU busy ms": p.gpu_busy_ns / 1e6, "wall ms": p[wall_column(p)]}
    )
    out["wall median ms"] = p.wall_ms_median.values
    out["wall min ms"] = p.wall_ms_min if "wall_ms_min" in p else float("nan")
    out["wall max ms"] = p.wall_ms_max if "wall_ms_max" in p else float("nan")
    out["GPU idle ms"] = out["wall ms"] - out["GPU busy ms"]
    out["wall µs per kernel"] = out["wall ms"] * 1e3 / out.kernels
    out["idle µs per kernel"] = out["GPU idle ms"] * 1e3 / out.kernels
    return out.reset_index(drop=True)


@dataclass
class HostCall:
    """How long the CPU spent in one kind of call in a profiled step (medians over its calls)."""

    name: str
    calls: int
    total_us: float  # the call, everything inside it included
    launch_us: float  # of which in CUDA launch calls (runtime or driver)
    operators_us: float  # of which in PyTorch operators called from it (allocations, ...)


def host_call(run: runs.Run, backend: str, name: str, mode: str = "eager") -> HostCall:
    """The CPU time of the calls named `name` (a CPU operator or an autograd function such as
    flash-linear-attention's FusedRecurrentFunction) in a profiled step, and how much of each
    went to CUDA launch calls and to PyTorch operators inside it; the rest is Python and
    whatever else the call does that the profiler does not name."""
    events = trace.load_events(run.file(trace_file(backend, mode)))
    cpu = [
        e
        for e in events
        if e.get("ph") == "X" and "dur" in e and e.get("cat") in ("cpu_op", "cuda_runtime", "cuda_driver")
    ]
    # Only the calls made inside the profiled step (the `decode_step` annotation): the trace also
    # holds what ran around it (the profiler's warm-up steps leave CPU events behind).
    region = next(
        e for e in events if e.get("ph") == "X" and e.get("cat") == "user_annotation" and e.get("name") == "decode_step"
    )
    r0 = trace.ns(region["ts"])
    r1 = r0 + trace.ns(region["dur"])
    calls = [e for e in cpu if e.get("cat") == "cpu_op" and e.get("name") == name and r0 <= trace.ns(e["ts"]) <= r1]
    by_thread: dict = {}
    for e in cpu:
        s = trace.ns(e["ts"])
        by_thread.setdefault(e["tid"], []).append((s, s + trace.ns(e["dur"]), e))
    # Sorted by start, so each call looks only at the events that start inside it (bisect),
    # not at every event of its thread: a 27B eager step has tens of thousands.
    starts = {}
    for tid, xs in by_thread.items():
        xs.sort(key=lambda x: x[0])
        starts[tid] = [x[0] for x in xs]
    totals, launches, ops = [], [], []
    for c in calls:
        s, end = trace.ns(c["ts"]), trace.ns(c["ts"]) + trace.ns(c["dur"])
        xs, st = by_thread[c["tid"]], starts[c["tid"]]
        window = xs[bisect.bisect_left(st, s) : bisect.bisect_right(st, end)]
        inner = [(a, b, e) for a, b, e in window if b <= end and e is not c]
        launch = sum(b - a for a, b, e in inner if e["cat"] != "cpu_op" and "Launch" in e["name"])
        # operators directly inside: not nested in another operator inside the call
        top, last_end = 0, -1
        for a, b, _e in sorted((x for x in inner if x[2]["cat"] == "cpu_op"), key=lambda x: (x[0], -x[1])):
            if a >= last_end:
                top += b - a
                last_end = b
        totals.append(end - s)
        launches.append(launch)
        ops.append(top)
    med = lambda xs: statistics.median(xs) / 1e3 if xs else float("nan")  # noqa: E731
    return HostCall(name=name, calls=len(calls), total_us=med(totals), launch_us=med(launches), operators_us=med(ops))


def memsets_by_module(run: runs.Run, backend: str, mode: str = "eager") -> pd.DataFrame:
    """The memsets of a profiled step (GPU work that is not a kernel), by the module and the
    operator whose call issued them (layer numbers dropped: `mlp.down_proj`), with their size.
    Only an eager step's trace labels modules."""
    events = trace.load_events(run.file(trace_file(backend, mode)))
    launches = trace.launch_events(events)
    sets = [e for e in events if e.get("ph") == "X" and e.get("cat") == "gpu_memset"]
    found = [(m, launches.get(m.get("args", {}).get("correlation"))) for m in sets]
    queries = [(ln["pid"], ln["tid"], trace.ns(ln["ts"])) for _, ln in found if ln is not None]
    ops = iter(trace.enclosing_names(trace.complete_events(events, {"cpu_op"}), queries))
    modules = iter(trace.enclosing_names(trace.complete_events(events, {"user_annotation"}), queries))
    rows = []
    for m, ln in found:
        op, module = (next(ops), next(modules)) if ln is not None else ("", "")
        rows.append(
            {
                "module": re.sub(r"^layers\.\d+\.", "", module) or "(unlabelled)",
                "operator": op or "–",
                "bytes": int(m.get("args", {}).get("bytes", 0)),
            }
        )
    df = pd.DataFrame(rows, columns=["module", "operator", "bytes"])
    return (
        df.groupby(["module", "operator", "bytes"])
        .size()
        .rename("memsets")
        .reset_index()
        .sort_values("memsets", ascending=False)
        .reset_index(drop=True)
    )
