"""How long each chapter notebook takes to replay its published run, and how much of that is
spent reading profiler traces (labsupport.traces.trace). The notebook's code cells run in this
process in replay mode, as tests/test_figures.py runs them; the trace functions are timed at
their outermost call.

    PYTHONPATH=$PWD python benchmarks/replay_time.py [chapter ...]
"""

from __future__ import annotations

import functools
import os
import sys
import time

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import nbformat  # noqa: E402

from labsupport import chapters  # noqa: E402
from labsupport.traces import trace  # noqa: E402

TIMED = (
    "load_events",
    "kernel_table",
    "read_kernels",
    "region_kernels",
    "call_paths",
    "launch_events",
    "enclosing_names",
    "complete_events",
    "origin_span_ns",
    "ns",
    "stored_kernels",
    "stored_events",
)
spent = {"s": 0.0, "calls": {}}
depth = [0]


def timed(name, f):
    @functools.wraps(f)
    def wrapper(*a, **kw):
        if depth[0]:
            return f(*a, **kw)
        depth[0] += 1
        t = time.perf_counter()
        try:
            return f(*a, **kw)
        finally:
            spent["s"] += time.perf_counter() - t
            spent["calls"][name] = spent["calls"].get(name, 0) + 1
            depth[0] -= 1

    return wrapper


for name in TIMED:
    if hasattr(trace, name):
        setattr(trace, name, timed(name, getattr(trace, name)))


def replay(chapter) -> tuple[float, float, dict]:
    spent["s"], spent["calls"] = 0.0, {}
    cwd = os.getcwd()
    os.chdir(chapter.path.parent)
    ns = {"mode": "replay"}
    t = time.perf_counter()
    try:
        for cell in nbformat.read(chapter.path, as_version=4).cells:
            if cell.cell_type == "code":
                exec(compile(cell.source, f"<{chapter.path.name}>", "exec"), ns)
                plt.close("all")
    finally:
        os.chdir(cwd)
    return time.perf_counter() - t, spent["s"], dict(spent["calls"])


if __name__ == "__main__":
    wanted = sys.argv[1:]
    for ch in chapters.CHAPTERS:
        if wanted and ch.slug not in wanted:
            continue
        total, reading, calls = replay(ch)
        print(f"{ch.slug:28s} total {total:6.1f} s  reading traces {reading:6.1f} s  {calls}", flush=True)
