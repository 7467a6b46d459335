"""The host's side of a profiled step and where its idle time sits: the prompt phase host against device, the CPU time
of one kind of call, who issued the step's memsets; every stretch of a profiled step with no kernel running, by where
it falls, what the host did before the first kernel, and the summary the page quotes.
"""

from __future__ import annotations

import bisect
import re
import statistics
from dataclasses import dataclass

import pandas as pd

from labsupport import runs
from labsupport.chapters.hybrid_model_token.analysis import kernel_table
from labsupport.chapters.hybrid_model_token.measuring import trace_file, wall_column
from labsupport.traces import kernels, trace


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


GAP_NS = 2000  # a gap between kernels this long or longer is listed on its own (with its neighbours)


def _gpu_side_events(events: list[dict], t0: int) -> list[tuple[int, int, str]]:
    """Memsets and memcpys on the GPU (not kernels, so not in the kernel table): (start, end, name),
    times relative to t0."""
    out = []
    for e in events:
        if e.get("ph") == "X" and e.get("cat") in ("gpu_memset", "gpu_memcpy") and "dur" in e:
            s = trace.ns(e["ts"]) - t0
            out.append((s, s + trace.ns(e["dur"]), e["name"].split(" (")[0]))
    return sorted(out)


def step_gaps(run: runs.Run, backend: str, mode: str) -> pd.DataFrame:
    """Every stretch of the profiled step in which no kernel ran: from the step's start to the
    first kernel, between kernels (after the latest end so far), and from the last kernel's end to
    the step's end (the `decode_step` annotation, which ends once the GPU has finished).

    Columns: place ("before the first kernel", "inside one graph" when both neighbours came from
    the same graph launch, "between two launches", "after the last kernel"), start_ns, dur_ns,
    before and after (short names of the neighbouring kernels), after_source (the library of the
    kernel after), other_gpu_work (memsets and memcpys that ran in the gap)."""
    events = trace.load_events(run.file(trace_file(backend, mode)))
    span = trace.origin_span_ns(events)
    t0 = next(
        trace.ns(e["ts"])
        for e in events
        if e.get("ph") == "X" and e.get("cat") == "user_annotation" and e.get("name") == "decode_step"
    )
    k = kernel_table(run, backend, mode).sort_values(["start_ns", "end_ns"]).reset_index(drop=True)
    if k.empty:
        return pd.DataFrame(
            columns=[
                "place",
                "start_ns",
                "dur_ns",
                "before",
                "after",
                "before_source",
                "after_source",
                "other_gpu_work",
            ]
        )
    graph = k.launch_api.eq("cudaGraphLaunch")
    ends = k.end_ns.cummax()
    rows = [
        {
            "place": "before the first kernel",
            "start_ns": 0,
            "dur_ns": int(k.start_ns.iloc[0]),
            "before": "",
            "after": k.short_name.iloc[0],
            "before_source": "",
            "after_source": kernels.source(k.name.iloc[0]),
        }
    ]
    prev_end = ends.shift().iloc[1:]
    gap = k.start_ns.iloc[1:] - prev_end
    same_graph = (
        graph.iloc[1:].values
        & graph.shift().fillna(False).iloc[1:].values
        & (k.correlation.iloc[1:].values == k.correlation.shift().iloc[1:].values)
    )
    for i, g, same in zip(gap.index, gap.values, same_graph, strict=True):
        if g <= 0:
            continue
        rows.append(
            {
                "place": "inside one graph" if same else "between two launches",
                "start_ns": int(prev_end[i]),
                "dur_ns": int(g),
                "before": k.short_name[i - 1],
                "after": k.short_name[i],
                "before_source": kernels.source(k.name[i - 1]),
                "after_source": kernels.source(k.name[i]),
            }
        )
    last = int(k.end_ns.max())
    rows.append(
        {
            "place": "after the last kernel",
            "start_ns": last,
            "dur_ns": max(span - last, 0),
            "before": k.short_name.iloc[-1],
            "after": "",
            "before_source": kernels.source(k.name.iloc[-1]),
            "after_source": "",
        }
    )
    out = pd.DataFrame(rows)
    other = _gpu_side_events(events, t0)
    starts = [s for s, _, _ in other]

    def work_in(s, d):
        lo, hi = bisect.bisect_left(starts, s), bisect.bisect_right(starts, s + d)
        names = [n for _, _, n in other[lo:hi]]
        return ", ".join(f"{names.count(n)} {n.lower()}" for n in dict.fromkeys(names))

    out["other_gpu_work"] = [work_in(s, d) for s, d in zip(out.start_ns, out.dur_ns, strict=True)]
    return out


def idle_places(
    gaps: pd.DataFrame, min_gap_ns: int = GAP_NS, groups: int = 3, width: int | None = None
) -> pd.DataFrame:
    """Where the profiled step's idle time sits, at most `groups` + 5 rows: before the first
    kernel; between launches; the largest kinds of gap inside a graph (at least `min_gap_ns`,
    grouped by the kernels before and after them, `groups` of them); every other gap inside a
    graph; after the last kernel; and a total. Kernel names are cut to `width` characters if given.
    `group` keys the rows ("before", "between", "graph-long" (one row per pair of kernels),
    "graph-others", "after", "total"); `where` says it for display."""

    def cut(name):
        return name if width is None or len(name) <= width else name[: width - 1] + "…"

    def row(key, where, g, before="", after=""):
        return {
            "group": key,
            "where": where,
            "gaps": len(g),
            "idle ms": g.dur_ns.sum() / 1e6,
            "median µs": g.dur_ns.median() / 1e3 if len(g) else float("nan"),
            "kernel before": cut(before),
            "kernel after": cut(after),
            "also in the gaps": ", ".join(dict.fromkeys(w for w in g.other_gpu_work if w)) or "–",
        }

    rows = []
    first = gaps[gaps.place == "before the first kernel"]
    rows.append(row("before", "before the first kernel", first, "", next(iter(first.after), "")))
    between = gaps[gaps.place == "between two launches"]
    if len(between) == 1:
        rows.append(
            row("between", "between two launches", between, *next(zip(between.before, between.after, strict=True)))
        )
    elif len(between):
        rows.append(row("between", "between two launches", between, "(various)", "(various)"))
    inside = gaps[gaps.place == "inside one graph"]
    big = inside[inside.dur_ns >= min_gap_ns]
    shown = []
    if len(big):
        by = big.groupby(["before", "after"]).dur_ns.sum().sort_values(ascending=False)
        for before, after in by.index:
            g = big[(big.before == before) & (big.after == after)]
            if len(g) < 2 or len(shown) == groups:
                continue
            shown.append(g.index)
            rows.append(row("graph-long", f"in the graph, ≥ {min_gap_ns / 1e3:.0f} µs", g, before, after))
    rest = inside.drop([i for idx in shown for i in idx])
    if len(rest):
        longer = int((rest.dur_ns >= min_gap_ns).sum())
        where = "in the graph, the others" + (f" ({longer} ≥ {min_gap_ns / 1e3:.0f} µs)" if longer else "")
        rows.append(row("graph-others", where, rest, "(various)", "(various)"))
    last = gaps[gaps.place == "after the last kernel"]
    rows.append(row("after", "after the last kernel", last, next(iter(last.before), ""), ""))
    total = row("total", "total", gaps)
    total["median µs"] = float("nan")
    total["also in the gaps"] = ""
    rows.append(total)
    return pd.DataFrame(rows)


def host_before_first_kernel(run: runs.Run, backend: str, mode: str, limit: int = 12) -> pd.DataFrame:
    """What the CPU was doing in the profiled step before the GPU started on it: the CPU-side
    events (operators, compiled regions, CUDA calls, the profiler's own) that began before the
    first kernel of a graph (before the first kernel, in a step without graphs), in order, with
    their nesting depth; at most `limit` rows, the deepest dropped first when there are more."""
    events = trace.load_events(run.file(trace_file(backend, mode)))
    step = next(
        e for e in events if e.get("ph") == "X" and e.get("cat") == "user_annotation" and e.get("name") == "decode_step"
    )
    t0, tid = trace.ns(step["ts"]), step["tid"]
    k = kernel_table(run, backend, mode)
    graph = k[k.launch_api == "cudaGraphLaunch"]
    first = (
        int(graph.start_ns.min()) if len(graph) else int(k.start_ns.min()) if len(k) else trace.origin_span_ns(events)
    )
    cats = ("cpu_op", "cuda_runtime", "cuda_driver", "user_annotation", "python_function")
    spans = sorted(
        (trace.ns(e["ts"]) - t0, trace.ns(e["dur"]), e["name"], e.get("cat"))
        for e in events
        if e.get("ph") == "X"
        and "dur" in e
        and e is not step
        and ((e.get("cat") in cats and e.get("tid") == tid) or e.get("cat") == "overhead")
        and 0 <= trace.ns(e["ts"]) - t0 < first
    )
    rows, open_ends = [], []
    for s, d, name, cat in spans:
        while open_ends and open_ends[-1] <= s:
            open_ends.pop()
        name = name if len(name) <= 44 else name[:43] + "…"
        rows.append({"event": name, "kind": cat, "depth": len(open_ends), "starts at ms": s / 1e6, "lasts ms": d / 1e6})
        open_ends.append(s + d)
    out = pd.DataFrame(rows, columns=["event", "kind", "depth", "starts at ms", "lasts ms"])
    while len(out) > limit:
        out = out[out.depth < out.depth.max()]
    return out.reset_index(drop=True)


@dataclass
class IdleSummary:
    backend: str
    mode: str
    wall_ms: float
    busy_ms: float
    idle_ms: float  # timed step: wall - GPU busy
    profiled_ms: float  # the profiled step, start to GPU finished
    profiled_idle_ms: float
    before_first_ms: float
    between_launches_ms: float
    inside_graph_ms: float  # gaps whose both neighbours came from one graph launch
    after_last_ms: float
    host_estimate_ms: float  # idle_ms - inside_graph_ms: what the timed step's idle leaves to the host
    graph_launches: int
    compiled_regions: int
    fla_kernels: int  # flash-linear-attention kernels in the step
    fla_gap_before_us: float  # median gap before / after them
    fla_gap_after_us: float
    graph_gap_us: float  # median of every gap inside a graph


def idle_summary(run: runs.Run, backend: str, mode: str) -> IdleSummary:
    """The idle time of one variant: from its timed steps (wall - busy) and, placed, from its
    profiled step (step_gaps)."""
    v = run.table("variants").set_index(["backend", "mode"]).loc[(backend, mode)]
    gaps = step_gaps(run, backend, mode)
    k = kernel_table(run, backend, mode)
    events = trace.load_events(run.file(trace_file(backend, mode)))
    span = trace.origin_span_ns(events)
    busy = float(v.gpu_busy_ns) / 1e6
    part = gaps.groupby("place").dur_ns.sum() / 1e6
    inside = gaps[gaps.place == "inside one graph"]
    fla = "flash-linear-attention (Triton)"
    near = lambda col: gaps.loc[gaps[col] == fla, "dur_ns"].median() / 1e3 if (gaps[col] == fla).any() else float("nan")  # noqa: E731
    return IdleSummary(
        backend=backend,
        mode=mode,
        wall_ms=float(v[wall_column(v)]),
        busy_ms=busy,
        idle_ms=float(v[wall_column(v)]) - busy,
        profiled_ms=span / 1e6,
        profiled_idle_ms=span / 1e6 - busy,
        before_first_ms=float(part.get("before the first kernel", 0.0)),
        between_launches_ms=float(part.get("between two launches", 0.0)),
        inside_graph_ms=float(part.get("inside one graph", 0.0)),
        after_last_ms=float(part.get("after the last kernel", 0.0)),
        host_estimate_ms=float(v[wall_column(v)]) - busy - float(part.get("inside one graph", 0.0)),
        graph_launches=int(k.loc[k.launch_api == "cudaGraphLaunch", "correlation"].nunique()),
        compiled_regions=sum(
            1
            for e in events
            if e.get("ph") == "X"
            and e.get("cat") == "cpu_op"
            and str(e.get("name", "")).startswith("Torch-Compiled Region")
        ),
        fla_kernels=int(k.name.map(kernels.source).eq(fla).sum()),
        fla_gap_before_us=near("after_source"),
        fla_gap_after_us=near("before_source"),
        graph_gap_us=inside.dur_ns.median() / 1e3 if len(inside) else float("nan"),
    )
