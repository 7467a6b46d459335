"""The chapter's analysis, from a recorded run: the floor, the ladder of rungs (time, kernels,
bandwidth, gap to the floor, same answers), where each rung's time goes, the kernels of each
rung by kind, the matmuls shape by shape, and the best rung's remaining time."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from labsupport import runs
from labsupport.chapters.closing_the_gap.params import ERROR_FACTOR, TARGET_X_FLOOR, trace_file
from labsupport.measure import hardware
from labsupport.traces import kernels, trace


@dataclass
class Floor:
    """The shortest a step can take: its weight bytes read once at a bandwidth."""

    decode_bytes: int
    measured_tbs: float | None  # the read stream (or, in older runs, the copy) measured in the run
    measured_word: str  # "read" or "copy"
    datasheet_tbs: float | None

    @property
    def measured_ms(self) -> float:
        return self.decode_bytes / self.measured_tbs / 1e9 if self.measured_tbs else float("nan")

    @property
    def datasheet_ms(self) -> float:
        return self.decode_bytes / self.datasheet_tbs / 1e9 if self.datasheet_tbs else float("nan")

    @property
    def target_ms(self) -> float:
        return TARGET_X_FLOOR * self.measured_ms


def floor(run: runs.Run) -> Floor:
    lim = hardware.run_limits(run)
    tbs, word = hardware.measured_read(lim)
    return Floor(int(run.results["model"]["decode_bytes"]), tbs, word, lim.datasheet_tbs)


def kernel_table(run: runs.Run, rung: str) -> pd.DataFrame:
    """Kernels of one rung's profiled step (from its raw trace), with kind and source."""
    device = run.provenance.get("device", "cuda")
    return kernels.annotate(trace.read_kernels(run.file(trace_file(rung)), device=device))


def ladder(run: runs.Run) -> pd.DataFrame:
    """One row per rung, by key: status, whether it gives eager's answers, kernels, GPU-busy
    (profiled), wall (median, fastest, slowest; clean), idle (wall - busy), the weight
    bandwidth it reaches (weights / wall), its wall over the measured and datasheet floors, and
    the ms it saves against the rung before it (the waterfall)."""
    r = run.table("rungs")
    f = floor(run)
    ok = r.status == "ok"
    out = pd.DataFrame({"rung": r.rung, "status": r.status})
    out["same answers"] = r.passed.astype(str).eq("True")
    out["kernels"] = r.kernels
    out["GPU busy ms"] = r.gpu_busy_ns / 1e6
    out["wall ms"] = r.wall_ms_median
    out["wall min ms"] = r.wall_ms_min
    out["wall max ms"] = r.wall_ms_max
    out["idle ms"] = out["wall ms"] - out["GPU busy ms"]
    out["TB/s"] = f.decode_bytes / 1e9 / out["wall ms"]
    out["x floor"] = out["wall ms"] / f.measured_ms
    out["x datasheet floor"] = out["wall ms"] / f.datasheet_ms
    out["compile s"] = r.compile_s
    out.loc[~ok, out.columns[3:]] = float("nan")
    # The waterfall: what each rung saves against the last rung before it that ran.
    out["ms saved"] = out["wall ms"].ffill().shift(1) - out["wall ms"]
    return out.reset_index(drop=True)


def best(run: runs.Run) -> str:
    """The fastest rung that gives eager's answers (a rung that fails the check is not a result)."""
    d = ladder(run)
    good = d[(d.status == "ok") & d["same answers"]]
    return str(good.loc[good["wall ms"].idxmin(), "rung"])


def time_split(run: runs.Run) -> pd.DataFrame:
    """Where each rung's wall time goes, in three parts that add up to it: the floor (the weights
    read once at the measured bandwidth), kernel time above the floor (GPU-busy - floor), and
    the GPU idle (wall - GPU-busy, from the clean wall and the profiled busy time)."""
    d = ladder(run)
    d = d[d.status == "ok"]
    f = floor(run)
    fl = f.measured_ms if f.measured_tbs else 0.0  # a run without a measured ceiling (a CPU) has no floor
    return pd.DataFrame(
        {
            "rung": d.rung,
            "floor ms": fl,
            "kernels above floor ms": d["GPU busy ms"] - fl,
            "GPU idle ms": d["idle ms"],
            "wall ms": d["wall ms"],
        }
    ).reset_index(drop=True)


def census(run: runs.Run) -> pd.DataFrame:
    """Kernels and GPU ms by kind, one column pair (rung, "kernels" / "gpu_ms") per rung that
    ran (index: kind, total last)."""
    r = run.table("rungs")
    parts = []
    for rung in r.rung[r.status == "ok"]:
        c = kernels.census(kernel_table(run, rung)).set_index("kind")
        parts.append(c[["kernels", "gpu_ms"]].rename(columns=lambda col, rung=rung: (rung, col)))
    out = pd.concat(parts, axis=1)
    out.columns = pd.MultiIndex.from_tuples(out.columns)
    return out


def fidelity(run: runs.Run) -> pd.DataFrame:
    """Same answers, per rung: the largest logit difference from eager's, the largest error
    against the float32 step, that error over eager's own (a rung passes at ERROR_FACTOR or
    less, with eager's greedy token), cosine similarity with eager's logits, same token."""
    r = run.table("rungs")
    r = r[r.status == "ok"]
    return pd.DataFrame(
        {
            "rung": r.rung,
            "max |Δ logit| vs eager": r.max_abs_diff,
            "max error vs float32": r.max_abs_err,
            "error / eager's": r.max_abs_err / r.eager_abs_err,
            "cosine": r.cosine,
            "same token": r.same_token.astype(str).eq("True"),
            "passed": r.passed.astype(str).eq("True"),
        }
    ).reset_index(drop=True)


def matmuls(run: runs.Run) -> pd.DataFrame:
    """Each weight shape's matmul for one token: cuBLAS against our Triton GEMV, µs and TB/s,
    and each as a fraction of the run's measured read bandwidth."""
    m = run.table("matmuls")
    f = floor(run)
    out = m[["matrix", "n", "k", "bytes", "cublas_us", "triton_us", "cublas_tbs", "triton_tbs"]].copy()
    out["MB"] = out.bytes / 1e6
    for lib in ("cublas", "triton"):
        out[f"{lib} of read"] = out[f"{lib}_tbs"] / f.measured_tbs if f.measured_tbs else float("nan")
    out["speed-up"] = out.cublas_us / out.triton_us
    return out


def remaining(run: runs.Run, rung: str) -> pd.DataFrame:
    """What the kernels of `rung`'s profiled step spent their time on, from its first kernel's
    start to its last kernel's end: matmul kernels (beside what their weights take at the floor),
    every other kind of kernel, and the gaps between kernels. The rows add up to that span.
    (The time before the first kernel and after the last is the profiler's and the replay
    call's; the clean wall time, measured without the profiler, is in `ladder`.)"""
    k = kernel_table(run, rung)
    f = floor(run)
    busy = trace.busy_ns(k.start_ns, k.end_ns)
    span = int(k.end_ns.max() - k.start_ns.min())
    c = kernels.census(k).set_index("kind")
    fl = f.measured_ms * 1e6 if f.measured_tbs else 0.0
    rows = [("matrix multiply kernels", int(c.loc["matrix multiply", "gpu_ns"]), fl)]
    rows += [
        (f"{kind} kernels", int(c.loc[kind, "gpu_ns"]), 0.0)
        for kind in c.index
        if kind not in ("matrix multiply", "total")
    ]
    rows += [
        ("kernels overlapping each other", busy - int(c.loc["total", "gpu_ns"]), 0.0),  # streams in parallel
        ("gaps between kernels", span - busy, 0.0),
    ]
    out = pd.DataFrame(rows, columns=["part", "ns", "floor_ns"])
    out = out[out.ns != 0]
    out["ms"] = out.ns / 1e6
    out["floor ms"] = out.floor_ns / 1e6
    out["above floor ms"] = out.ms - out["floor ms"]
    return out[["part", "ms", "floor ms", "above floor ms"]].reset_index(drop=True)


def census_by_rung(run: runs.Run, column: str = "kernels") -> pd.DataFrame:
    """census() turned for the page: one row per rung (key), one column per kind that has any
    kernel in some rung, and the total; `column` is "kernels" or "gpu_ms"."""
    c = census(run)
    counts = c.xs("kernels", axis=1, level=1)
    kinds = [k for k in c.index if k == "total" or (counts.loc[k] > 0).any()]
    return c.xs(column, axis=1, level=1).loc[kinds].T.rename_axis("rung").reset_index()


def tuning(run: runs.Run) -> pd.DataFrame:
    """Every GEMV config tried on every weight shape, and which won."""
    t = run.table("gemv_tuning")
    t["chosen"] = t.chosen.astype(str).eq("True")
    return t


def headline(run: runs.Run) -> dict:
    d = ladder(run).set_index("rung")
    b = best(run)
    f = floor(run)
    return {
        "eager wall ms": float(d.loc["eager", "wall ms"]),
        "best wall ms": float(d.loc[b, "wall ms"]),
        "best x floor": float(d.loc[b, "x floor"]),
        "floor ms": f.measured_ms,
    }


def tolerance_text() -> str:
    return f"{ERROR_FACTOR:g} times eager's own"


def next_to_published(run: runs.Run, published: pd.DataFrame) -> pd.DataFrame:
    """The best rung's multiple of its floor (measured, and datasheet where the GPU is known),
    in the columns of the published references (`published`), above them."""
    from labsupport.chapters.closing_the_gap.params import RUNGS

    b, f = best(run), floor(run)
    d = ladder(run).set_index("rung")
    rows = []
    base = {"system": f"this book: {RUNGS[b]}", "model": "Qwen3-8B, batch 1", "GPU": run.provenance["gpu"],
            "source": f"run {run.run_id}"}  # fmt: skip
    if f.measured_tbs:
        rows.append(
            {
                **base,
                "x floor": d.loc[b, "x floor"],
                "floor from": f"measured {f.measured_word} ({f.measured_tbs:.2f} TB/s)",
            }
        )
    if f.datasheet_tbs:
        rows.append(
            {**base, "x floor": d.loc[b, "x datasheet floor"], "floor from": f"datasheet ({f.datasheet_tbs:.1f} TB/s)"}
        )
    return pd.concat([pd.DataFrame(rows, columns=published.columns), published], ignore_index=True)


def matmul_launches(run: runs.Run, rung: str) -> pd.DataFrame:
    """How a rung's matrix-multiply kernels were launched, from its trace: one row per kernel
    name (shortened: kernels.short_name) and launch shape, with thread blocks (the grid),
    threads per block, shared memory per block, blocks per SM (the GPU's SM count from
    provenance), kernels per step and mean µs, slowest first. Empty for a run without launch
    shapes (a CPU)."""
    import math

    k = kernel_table(run, rung)
    mm = k[(k.kind == "matrix multiply") & k.grid.astype(str).str.contains(",")]
    if mm.empty:
        return pd.DataFrame(columns=["kernel", "blocks", "threads", "shared KB", "blocks per SM", "kernels", "µs"])
    g = mm.groupby(["name", "grid", "block", "shared_mem"], as_index=False).agg(
        kernels=("dur_ns", "size"), ns=("dur_ns", "mean")
    )
    dims = lambda s: math.prod(int(x) for x in str(s).split(","))  # noqa: E731
    sms = int(run.provenance.get("gpu_sms") or 0)
    out = pd.DataFrame(
        {
            "kernel": g.name.map(kernels.short_name),
            "blocks": g.grid.map(dims),
            "threads": g.block.map(dims),
            "shared KB": g.shared_mem / 1024,
            "kernels": g.kernels,
            "µs": g.ns / 1e3,
        }
    )
    out.insert(4, "blocks per SM", out.blocks / sms if sms else float("nan"))
    return out.sort_values("µs", ascending=False).reset_index(drop=True)
