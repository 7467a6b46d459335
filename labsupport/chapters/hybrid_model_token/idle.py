"""Where a step's idle time sits: every stretch of a profiled step with no kernel running, by
where it falls, what the host did before the first kernel, and the summary the page quotes."""

from __future__ import annotations

import bisect
from dataclasses import dataclass

import pandas as pd

from labsupport import runs
from labsupport.chapters.hybrid_model_token.census import kernel_table
from labsupport.chapters.hybrid_model_token.keys import trace_file, wall_column
from labsupport.traces import kernels, trace

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
