"""One run as the gallery page shows it, and the checks its row must pass to be shown.

The numbers are read from each run's own tables, whichever of them its chapter records:

- *step ms*: the least step time of the run's fastest step form that gives the step's answers and
  reads its bytes (an FP8 rung has a floor of its own and is left out); `host` when timed by the
  host's clock, `CUDA events` when by events on the GPU's stream;
- *x floor*: that time over the floor, the step's bytes (meta.json: results.model.decode_bytes) at
  the datasheet's bandwidth of the run's GPU; empty when the GPU is not in the datasheet table;
- *GPU-busy*: the share of the eager step's span (first kernel start to last kernel end, one
  profiled step) in which a kernel ran; *kernels*: kernels in that step; *µs per kernel*: the
  span over the kernels, the time between kernel arrivals on average (profiled);
- *matmul x bandwidth*: the best rate any one matrix-vector product reached (closing-the-gap's
  matmuls table) over the datasheet bandwidth.

`problems` is what `gallery add` refuses and what keeps a row off the page: a text field holding
a character run_text refuses, a number that is not finite, and numbers of one run that
contradict each other (a step that moves its bytes faster than its GPU's datasheet bandwidth, a
GPU busier than the whole step, a step more than STEP_OVER_EAGER times its own profiled eager
step).
"""

from __future__ import annotations

import math

import pandas as pd

from labsupport import runs
from labsupport.chapters.closing_the_gap import FP8_RUNGS
from labsupport.measure import hardware
from labsupport.ops import pack, run_text

STEP_TABLES = {"launch-overhead": ("variants", "variant"), "closing-the-gap": ("rungs", "rung")}
# Step forms that read other bytes than the step's own (FP8 weights): each has a floor of its own, so
# none may stand as the run's step against the step's floor.
OWN_FLOOR = {"closing-the-gap": set(FP8_RUNGS)}
# The profiled eager step is slower than the unprofiled one (the profiler's cost), never faster than
# the fastest form by this much: a step this many times its span is a number that was not measured.
STEP_OVER_EAGER = 10
LABEL_CHARS = 120
PROVENANCE = ("torch", "cuda", "driver", "git_commit", "utc_time")  # shown, each under its own name
CLOCKS = ("nvidia_smi_clocks_max_sm", "nvidia_smi_power_limit")
NUMBERS = ("step ms", "floor ms", "x floor", "GPU-busy", "kernels", "µs per kernel", "eager span ms")


def _f(v) -> float:
    """A number, infinite ones kept (problems() refuses them); NaN for what is not a number."""
    try:
        return float(v)
    except (TypeError, ValueError):
        return math.nan


def _eager(t: pd.DataFrame) -> dict:
    ok = t[t.status.astype(str) == "ok"] if "status" in t else t
    row = ok.iloc[0] if len(ok) else None
    if row is None or not {"kernels", "gpu_busy_ns", "first_kernel_ns", "last_kernel_end_ns"} <= set(ok.columns):
        return {}
    span = _f(row.last_kernel_end_ns) - _f(row.first_kernel_ns)
    k = _f(row.kernels)
    return {
        "kernels": k,
        "GPU-busy": _f(row.gpu_busy_ns) / span if span > 0 else math.nan,
        "µs per kernel": span / k / 1e3 if k > 0 else math.nan,
        "eager span ms": span / 1e6,
    }


def _best_step(t: pd.DataFrame, name_col: str, own_floor=frozenset()) -> tuple[float, str, str]:
    """(ms, form, timed by) of the fastest step form with a time that gives the step's answers
    (where the table says: its `passed` column) and reads the step's own bytes (not in `own_floor`)."""
    ok = t[t.status.astype(str) == "ok"] if "status" in t else t
    if "passed" in ok:
        ok = ok[ok.passed.astype(str) == "True"]
    ok = ok[~ok[name_col].astype(str).isin(own_floor)]
    best = (math.nan, "", "")
    for _, r in ok.iterrows():
        for col, how in (("gpu_ms_min", "CUDA events"), ("wall_ms_min", "host")):
            v = _f(r.get(col))
            if v == v and not (best[0] <= v):
                best = (v, str(r[name_col]), how)
                break
    return best


def step_bytes(run: runs.Run) -> float | None:
    """The step's bytes (results.model.decode_bytes), None when the run does not record them."""
    model = run.results.get("model") if isinstance(run.results, dict) else None
    if not isinstance(model, dict) or "decode_bytes" not in model:
        return None
    return _f(model["decode_bytes"])


def numbers(run: runs.Run) -> dict:
    """The normalised numbers of one run (those its chapter's tables allow)."""
    files = run.meta["files"]
    sheet = hardware.datasheet_or_none(run.provenance.get("gpu", ""))
    nbytes = step_bytes(run)
    known = sheet and sheet.bandwidth_tbs and nbytes is not None and nbytes == nbytes
    floor = nbytes / sheet.bandwidth_tbs / 1e9 if known else math.nan
    out = {"floor ms": floor, "step ms": math.nan, "step": "", "timed by": "", "step bytes": nbytes}
    if run.chapter in STEP_TABLES and f"{STEP_TABLES[run.chapter][0]}.csv" in files:
        table, col = STEP_TABLES[run.chapter]
        t = run.table(table)
        out.update(_eager(t))
        out["step ms"], out["step"], out["timed by"] = _best_step(t, col, OWN_FLOOR.get(run.chapter, set()))
    elif run.chapter == "kernels-in-one-token" and {"census.csv", "step_times.csv"} <= set(files):
        census, steps = run.table("census"), run.table("step_times")
        census = census[census.kind.astype(str) != "total"]  # the kinds, without their total row
        gpu = pd.to_numeric(steps.get("gpu_ms"), errors="coerce").min() if "gpu_ms" in steps else math.nan
        wall = pd.to_numeric(steps.wall_ms, errors="coerce").min()
        k = _f(census.kernels.sum())
        busy_ms = _f(census.gpu_ms.sum())
        step = gpu if gpu == gpu else wall
        out.update({"step ms": step, "step": "eager", "timed by": "CUDA events" if gpu == gpu else "host"})
        out.update({"kernels": k, "GPU-busy": busy_ms / step if step > 0 else math.nan})
        out["µs per kernel"] = step * 1e3 / k if k > 0 else math.nan
        if "kernels.csv" in files:  # the profiled step's kernels
            kernels = run.table("kernels")
            out["eager span ms"] = (_f(kernels.end_ns.max()) - _f(kernels.start_ns.min())) / 1e6
    if "matmuls.csv" in files and sheet and sheet.bandwidth_tbs:
        mm = run.table("matmuls")
        best = max(_f(mm[c].max()) for c in ("cublas_tbs", "triton_tbs") if c in mm)
        out["matmul x bandwidth"] = best / sheet.bandwidth_tbs
    out["x floor"] = out["step ms"] / floor if floor == floor else math.nan
    out["datasheet"] = sheet.name if sheet else "not in the table: its measured ceilings only"
    return out


def source(label) -> str:
    """What a gallery run is, as its row says: its label (pack.json), cut short."""
    text = str(label or "a reader's run")
    return "gallery: " + (text if len(text) <= LABEL_CHARS else text[: LABEL_CHARS - 1] + "…")


def row(run: runs.Run, source: str, download: str) -> dict:
    """The row of `run`: its texts as recorded (run_text escapes them where they are shown; the
    provenance's, one field each, so a refusal names the field) and its numbers."""
    p, f = run.provenance, pack.form(run)
    clocks = pack.clocks(p)
    return {
        "chapter": run.chapter,
        "GPU": f["gpu"],
        "dtype": f["dtype"],
        "preset": f["preset"],
        "run": run.run_id,
        "source": source,
        **numbers(run),
        **{key: str(p.get(key)) for key in PROVENANCE},
        **{key: str(clocks[key]) for key in CLOCKS if key in clocks},
        "download": download,
    }


def provenance(r: dict) -> str:
    """The provenance cell's text: versions, commit, date, and the clocks where recorded."""
    text = f"torch {r['torch']}, CUDA {r['cuda']}, driver {r['driver']}, "
    text += f"commit {r['git_commit'][:10]}, {r['utc_time'][:10]}"
    clock, power = (r.get(name) if isinstance(r.get(name), str) else None for name in CLOCKS)
    if clock is None and power is None:
        return text + "; clocks and power limit not recorded"
    return text + f"; SM clock max {clock or 'not recorded'} MHz, power limit {power or 'not recorded'} W"


def problems(r: dict) -> list[str]:
    """Why row `r` may not be shown, each one line naming its run and the field or number (empty:
    it may)."""
    named = f"run {r['run']} of {r['chapter']}"
    out = []
    for field, value in r.items():
        if isinstance(value, str):
            try:
                run_text.checked(value, field)
            except run_text.UnsafeText as e:
                out.append(f"{named}: {e}")
    nbytes = r.get("step bytes")
    if nbytes is not None and not (math.isfinite(nbytes) and nbytes > 0):
        out.append(f"{named}: its step's bytes (results.model.decode_bytes) are {nbytes}, not a positive number")
    for name in (*NUMBERS, "matmul x bandwidth"):
        v = r.get(name, math.nan)
        if isinstance(v, float) and math.isinf(v):
            out.append(f"{named}: {name} is {v}, not a finite number")
    step, floor, busy, span = (r.get(k, math.nan) for k in ("step ms", "floor ms", "GPU-busy", "eager span ms"))
    if step > 0 and floor > 0 and step < floor and math.isfinite(step):
        out.append(
            f"{named}: x floor {step / floor:.2f}: its step of {step:.4g} ms would move the step's bytes "
            f"faster than its GPU's datasheet bandwidth allows (floor {floor:.4g} ms)"
        )
    if step <= 0:
        out.append(f"{named}: its step takes {step:.4g} ms")
    if busy > 1 and math.isfinite(busy):
        out.append(f"{named}: GPU busy {busy:.0%}: its kernels ran longer than the step they ran in")
    if span > 0 and step > STEP_OVER_EAGER * span and math.isfinite(step):
        out.append(
            f"{named}: its step of {step:.4g} ms is {step / span:,.0f}x its own profiled eager step "
            f"({span:.4g} ms), more than the {STEP_OVER_EAGER}x a slower form could be"
        )
    return out
