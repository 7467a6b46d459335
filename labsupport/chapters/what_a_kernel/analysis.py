"""The chapter's analysis of a recorded run: the adds' launches and times, the cache, the
adds out of the cache, the queue; and the sentences that depend on what the run measured."""

from __future__ import annotations

import re
from dataclasses import dataclass

import pandas as pd

from labsupport import runs
from labsupport.chapters import shared
from labsupport.measure import hardware
from labsupport.traces import kernels, trace

from .measuring import BURST_TRACE, OUR_ADD, TORCH_ADD


def _dims_product(s) -> float:
    """The product of a launch dimension such as "1024,1,1"; NaN when it holds no number
    (an empty or missing grid)."""
    dims = [int(v) for v in re.findall(r"\d+", "" if s is None or s != s else str(s))]
    out = 1
    for v in dims:
        out *= v
    return out if dims else float("nan")


def launch_config(k: pd.DataFrame) -> pd.DataFrame:
    """Grid, block and thread counts of each kernel in a kernel table (NaN where the table
    gives no launch dimensions)."""
    blocks = k.grid.map(_dims_product).astype("Int64") if len(k) else pd.Series([], dtype="Int64")
    tpb = k.block.map(_dims_product).astype("Int64") if len(k) else pd.Series([], dtype="Int64")
    return pd.DataFrame(
        {
            "kernel": k.name.map(kernels.short_name),
            "grid (blocks)": k.grid,
            "block (threads)": k.block,
            "blocks": blocks,
            "threads per block": tpb,
            "threads": blocks * tpb,
            "registers/thread": k.registers,
            "µs": k.dur_ns / 1e3,
        }
    )


# Replay ---------------------------------------------------------------------------------


def add_kernels(run: runs.Run) -> pd.DataFrame:
    """The two adds' kernels, their kinds by today's rules."""
    k = run.table("add_kernels", dtype={"grid": str, "block": str, "stream": str})
    k["kind"] = k.name.map(kernels.classify)
    return k


def launches(run: runs.Run) -> pd.DataFrame:
    """The launch configuration of each add's kernel, by implementation (one kernel each)."""
    k = add_kernels(run)
    return launch_config(k).assign(implementation=k.implementation.values).set_index("implementation")


def sync_costs(run: runs.Run) -> pd.Series:
    """The µs of each way of waiting for the GPU, by what was timed: the minimum of its trials (the
    book's estimator for host-timed numbers; every run has it)."""
    return run.table("sync").set_index("what").us_min


def sync_table(run: runs.Run) -> pd.DataFrame:
    """Each way of waiting: minimum (the estimator), quartiles where the run has them (runs from
    before the interleaved timing have none), median and maximum, in µs."""
    s = run.table("sync")
    cols = [c for c in ("us_min", "us_q1", "us_median", "us_q3", "us_max") if c in s.columns]
    return s[["what", *cols]].rename(columns={c: f"µs ({c[3:]})" for c in cols})


def per_call_us(run: runs.Run, impl: str) -> float:
    """One add's time per call in µs (CUDA events around the call): the minimum of its trials."""
    t = run.table("add_times").set_index("implementation")
    return float(t.loc[impl, "ms_min" if "ms_min" in t.columns else "ms_median"]) * 1e3


def burst_kernels(run: runs.Run) -> pd.DataFrame:
    k = trace.read_kernels(run.file(BURST_TRACE), origin="burst")
    k["kind"] = k.name.map(kernels.classify)
    return k


def queue_summary(run: runs.Run) -> dict:
    q = run.table("queue")
    s = run.results["queue"]
    call = q.call_return_us - q.call_start_us
    gpu_each = q.gpu_done_us.diff().dropna()
    last = q.loc[q.launch.idxmax()]  # the last launch of the burst
    return {
        # the least of the burst's launch calls (the book's estimator), with the median and quartiles
        "launch_call_us": float(call.min()),
        "launch_call_us_q1": float(call.quantile(0.25)),
        "launch_call_us_median": float(call.median()),
        "launch_call_us_q3": float(call.quantile(0.75)),
        "host_issue_all_ms": s["host_issue_all_us"] / 1e3,
        "gpu_done_all_ms": float(last.gpu_done_us) / 1e3,
        "host_sync_returned_ms": s["host_sync_returned_us"] / 1e3,
        "gpu_per_add_us": float(gpu_each.median()),
        "queue_depth_at_last_launch": int((q.gpu_done_us > last.call_return_us).sum()),
        "add_tbs": s["bytes_per_add"] / (float(gpu_each.median()) * 1e-6) / 1e12,
        "add_mb": s["bytes_per_add"] / 1e6,
    }


def headline(run: runs.Run) -> dict:
    q = queue_summary(run)
    return {
        "launch call µs": q["launch_call_us"],
        "torch add µs": per_call_us(run, TORCH_ADD),
        "Triton add µs": per_call_us(run, OUR_ADD),
    }


def add_table(run: runs.Run) -> pd.DataFrame:
    """Each implementation's kernel time on the GPU (profiler) beside its time per call
    from Python (CUDA events around the call, which include getting the launch out: the minimum
    of the trials, the two implementations timed interleaved)."""
    k = add_kernels(run)
    t = run.table("add_times").set_index("implementation")
    rows = []
    for impl, sub in k.groupby("implementation", sort=False):
        kernel_us = sub.dur_ns.sum() / 1e3
        rows.append(
            {
                "implementation": impl,
                "kernel µs (profiler)": kernel_us,
                "per call µs (CUDA events)": per_call_us(run, impl),
                "GB/s during the kernel": t.loc[impl, "bytes"] / (kernel_us * 1e-6) / 1e9,
            }
        )
    return pd.DataFrame(rows).set_index("implementation")


@dataclass
class Cache:
    """Whether the small add's working set fits in the GPU's L2 cache."""

    working_set_bytes: int
    l2_bytes: int | None  # as the GPU reports it; None for runs that did not record it

    @property
    def fits(self) -> bool | None:
        return None if self.l2_bytes is None else self.working_set_bytes <= self.l2_bytes


def cache(run: runs.Run) -> Cache:
    t = run.table("add_times").set_index("implementation")
    l2 = run.results.get("l2_cache_bytes")
    return Cache(working_set_bytes=int(t.loc[TORCH_ADD, "bytes"]), l2_bytes=int(l2) if l2 else None)


def hbm_add(run: runs.Run) -> pd.DataFrame | None:
    """The adds on vectors far larger than L2, against the datasheet's memory bandwidth and
    the copy measured in the run (a copy, like an add, reads and writes); None for runs that
    did not time them."""
    if "hbm_add.csv" not in run.meta["files"]:
        return None
    h = run.table("hbm_add")
    lim = shared.limits_for(run)
    h["GB/s"] = h.bytes / (h.ms_median * 1e-3) / 1e9
    h["of datasheet"] = h["GB/s"] / (lim.datasheet_tbs * 1e3) if lim.datasheet_tbs else float("nan")
    h["of measured copy"] = h["GB/s"] / (lim.copy_tbs * 1e3) if lim.copy_tbs else float("nan")
    return h


# The chapter's sentences that depend on what the run measured ---------------------------


def l2_text(run: runs.Run) -> str:
    """Where the small add's bytes came from: the L2 cache, said plainly, with its size where
    the run recorded it, and against the datasheet's memory bandwidth."""
    sheet = hardware.datasheet_or_none(run.provenance["gpu"])
    c = cache(run)
    kernel_gbs = float(add_table(run).loc[TORCH_ADD, "GB/s during the kernel"])
    ws = c.working_set_bytes / 2**20
    if c.fits is False:
        return (
            f"Its {ws:.1f} MiB working set is larger than this GPU's {c.l2_bytes / 2**20:.0f} MiB L2 cache, "
            "so this is the rate of the GPU's memory."
        )
    if c.l2_bytes:
        where = f"its {ws:.1f} MiB working set fits in this GPU's {c.l2_bytes / 2**20:.0f} MiB L2 cache"
    else:
        where = (
            f"its {ws:.1f} MiB working set is small enough to stay in the GPU's L2 cache (this run did not "
            "record the cache's size)"
        )
    if sheet and kernel_gbs > sheet.bandwidth_tbs * 1e3:
        return (
            f"That is faster than the {sheet.name} datasheet's memory bandwidth of {sheet.bandwidth_tbs:.1f} "
            f"TB/s, and possible only because {where}: the on-chip cache between the streaming "
            "multiprocessors and the GPU's memory (HBM). The add ran again and again on the same vectors, so "
            "its bytes came from L2, not from memory: this rate is not a memory bandwidth."
        )
    return (
        f"Its bytes came from the L2 cache, not from the GPU's memory (HBM): {where}, the on-chip cache "
        "between the streaming multiprocessors and memory, and the add ran again and again on the same vectors."
    )


def hbm_text(run: runs.Run) -> str:
    """The adds out of the cache, against the datasheet and the measured copy (runs from
    before timed only the burst's adds, which are out of the cache too)."""
    h = hbm_add(run)
    if h is None:
        q = queue_summary(run)
        return (
            f"This run did not time an add larger than the L2 cache on its own. The adds of the burst below, "
            f"{q['add_mb']:,.0f} MB each, are: each ran at {q['add_tbs']:.2f} TB/s."
        )
    lim, c = shared.limits_for(run), cache(run)
    t = h.set_index("implementation")
    tr, ou = t.loc[TORCH_ADD], t.loc[OUR_ADD]
    vs = []
    if lim.datasheet_tbs:
        vs.append(f"{tr['of datasheet']:.0%} of the {lim.datasheet_name} datasheet's {lim.datasheet_tbs:.1f} TB/s")
    if lim.copy_tbs and tr["of measured copy"] <= 1:
        vs.append(
            f"{tr['of measured copy']:.0%} of the {lim.copy_tbs:.2f} TB/s a large copy reached in the run "
            "of *Why a GPU* (a copy, like an add, reads and writes)"
        )
    elif lim.copy_tbs:
        vs.append(
            f"{tr['of measured copy']:.0%} of the {lim.copy_tbs:.2f} TB/s a large copy reached in the run "
            "of *Why a GPU*: that copy is a rate measured in practice, not a limit, and the datasheet's peak is "
            "the ceiling "
            "that holds"
        )
    times_l2 = f", {tr.bytes / c.l2_bytes:,.0f} times the L2 cache" if c.l2_bytes else ""
    return (
        f"With {int(tr.n):,d} elements per vector ({tr.bytes / 2**30:.1f} GiB moved per add{times_l2}), the same "
        f"two kernels must read and write the GPU's memory. Timed with CUDA events, torch's add took "
        f"{tr.ms_median:.3f} ms per call: {tr['GB/s']:,.0f} GB/s"
        + (", " + " and ".join(vs) if vs else "")
        + f". Ours reached {ou['GB/s']:,.0f} GB/s. This is the speed of memory; the small add's was the speed of L2."
    )
