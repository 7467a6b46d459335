"""Chapter "What a kernel is": one vector add as one kernel (torch's and our Triton one),
its launch configuration, the same add on vectors too large for the L2 cache, and the
asynchronous queue between the CPU and the GPU.

Live, every time is taken before the first profile of the process (labsupport.measure.harness):
the ceilings, the adds per call, the adds out of the cache, the queue, what a
synchronisation costs; then the profiles (the two adds' kernels, the burst's trace)."""
from __future__ import annotations

import re
import time
from dataclasses import dataclass

import pandas as pd

from labsupport.measure import hardware, harness, profiler
from labsupport.traces import kernels, trace
from labsupport import runs
from labsupport.measure import recording

CHAPTER = "what-a-kernel"
BURST_TRACE = "burst_trace.json.gz"
TORCH_ADD, OUR_ADD = "torch (a + b)", "ours (Triton)"


@dataclass
class Params:
    n: int = 1 << 20              # elements of the vector add (fits in the L2 cache)
    block: int = 1024             # elements per program of our Triton kernel
    num_warps: int = 4
    burst: int = 200              # launches in the queue demonstration
    burst_n: int = 1 << 26        # elements per add in the burst: big enough that the GPU lags
    hbm_n: int = 1 << 28          # elements per vector of the add that does not fit in L2 (3 GiB moved)
    repeats: int = 100
    device: str = "cuda"


def _progress(msg: str) -> None:
    print(f"[{CHAPTER}] {msg}", flush=True)


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
    return pd.DataFrame({
        "kernel": k.name.map(kernels.short_name),
        "grid (blocks)": k.grid, "block (threads)": k.block,
        "blocks": blocks, "threads per block": tpb, "threads": blocks * tpb,
        "registers/thread": k.registers, "µs": k.dur_ns / 1e3,
    })


def _before_any_profile(what: str) -> None:
    """The queue is timed by hand (a clock reading around every launch); like every time, it
    must come before the process's first profile."""
    if harness.profiled():
        raise harness.TimingError(f"{CHAPTER}: {what}: must be timed before the first profile in the process")


def measure_queue(burst: int, n: int) -> tuple[pd.DataFrame, dict]:
    """Launch `burst` vector adds back to back and time both sides.

    Host side: the time each launch call takes to return. GPU side: a CUDA event recorded
    after each launch says when that kernel finished. The CPU is done launching long before
    the GPU is done computing: the launches wait in a queue (a CUDA stream).
    """
    import torch

    _before_any_profile("the queue")
    a = torch.randn(n, device="cuda")
    b = torch.randn(n, device="cuda")
    out = torch.empty_like(a)
    for _ in range(3):
        torch.add(a, b, out=out)
    torch.cuda.synchronize()
    start = torch.cuda.Event(enable_timing=True)
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(burst)]
    host = []
    t0 = time.perf_counter_ns()
    start.record()
    for i in range(burst):
        t = time.perf_counter_ns()
        torch.add(a, b, out=out)
        ends[i].record()
        host.append((t - t0, time.perf_counter_ns() - t0))
    t_issued = time.perf_counter_ns() - t0
    torch.cuda.synchronize()
    t_done = time.perf_counter_ns() - t0
    rows = [{"launch": i, "call_start_us": s / 1e3, "call_return_us": e / 1e3,
             "gpu_done_us": start.elapsed_time(ends[i]) * 1e3} for i, (s, e) in enumerate(host)]
    summary = {"host_issue_all_us": t_issued / 1e3, "host_sync_returned_us": t_done / 1e3,
               "bytes_per_add": 3 * n * 4}
    return pd.DataFrame(rows), summary


def measure_sync(repeats: int, device: str = "cuda") -> pd.DataFrame:
    """What waiting for the GPU costs when it has nothing left to do, and a round trip.

    Each of these calls waits for the GPU itself, so the host clock alone times it (the
    harness is asked for no synchronisation or CUDA events of its own: device "cpu")."""
    import torch

    x = torch.ones(1, device=device)
    rows = []
    for name, fn in (("torch.cuda.synchronize() on an idle GPU", lambda: harness.sync(device)),
                     ("x.item(): read one number back to the CPU", lambda: x.item()),
                     ("launch one tiny kernel and wait for it", lambda: (x.add_(0), harness.sync(device)))):
        t = harness.time_region(fn, what=name, device="cpu", repeats=repeats, warmup=3)
        us = pd.Series(t.wall_ms) * 1e3
        rows.append({"what": name, "us_median": float(us.median()), "us_min": float(us.min()),
                     "us_max": float(us.max()), "clean": t.clean})
    return pd.DataFrame(rows)


def _per_call_row(impl: str, t: harness.Timing, n: int) -> dict:
    """One implementation's time per call: CUDA events around the call (the host clock on a
    CPU), median, min and max."""
    ms = pd.Series(t.gpu_ms or t.wall_ms)
    return {"implementation": impl, "n": n, "ms_median": float(ms.median()), "ms_min": float(ms.min()),
            "ms_max": float(ms.max()), "repeats": len(ms), "bytes": 3 * n * 4, "clean": t.clean}


def time_adds(a, b, params: Params, repeats: int, warmup: int = 10) -> list[dict]:
    """torch's add and ours on vectors `a` and `b`, each call timed with CUDA events."""
    from labsupport.measure import triton_kernels

    n = a.numel()
    adds = ((TORCH_ADD, lambda: a + b),
            (OUR_ADD, lambda: triton_kernels.add(a, b, params.block, params.num_warps)))
    return [_per_call_row(impl, harness.time_region(fn, what=f"{impl}, {n} elements", device=params.device,
                                                    repeats=repeats, warmup=warmup), n)
            for impl, fn in adds]


def record(params: Params | None = None, run_id: str | None = None, allow_cpu: bool = False,
           progress=_progress) -> runs.Run:
    """Measure this GPU now and write a new run (not published).

    Order: ceilings; the adds per call; the adds out of the cache; the queue; what a
    synchronisation costs; then (the process's first profiles) the two adds' kernels and the
    burst's trace."""
    import torch

    from labsupport.measure import triton_kernels

    params = params or Params()
    device = params.device
    harness.for_chapter(CHAPTER)
    with recording.writer(CHAPTER, params, run_id, allow_cpu=allow_cpu) as w:
        w.extra["method"] = harness.method()
        if device == "cuda":
            hardware.record_ceilings(w, progress)
            l2 = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", None)
            w.extra["l2_cache_bytes"] = int(l2) if l2 else None
        a = torch.randn(params.n, device=device)
        b = torch.randn(params.n, device=device)
        ours = triton_kernels.add(a, b, block=params.block, num_warps=params.num_warps)
        w.extra["triton_matches_torch"] = bool(torch.equal(ours, a + b))

        # 1. Every time first, before any profile.
        progress(f"timing torch's vector add and ours (Triton), {params.n} elements")
        w.write_table("add_times", pd.DataFrame(time_adds(a, b, params, params.repeats)))
        progress(f"timing both adds on {params.hbm_n} elements per vector ({3 * params.hbm_n * 4 / 2**30:.1f} GiB moved)")
        big_a = torch.randn(params.hbm_n, device=device)
        big_b = torch.randn_like(big_a)
        w.write_table("hbm_add", pd.DataFrame(time_adds(big_a, big_b, params, max(params.repeats // 5, 5), warmup=3)))
        del big_a, big_b
        if device == "cuda":
            torch.cuda.empty_cache()
            progress(f"the queue: {params.burst} launches back to back")
            queue, summary = measure_queue(params.burst, params.burst_n)
            w.write_table("queue", queue)
            w.extra["queue"] = summary
        progress("what a synchronisation costs")
        w.write_table("sync", measure_sync(params.repeats, device))

        # 2. Then the profiles.
        progress("profiling torch's vector add and ours (Triton)")
        tmp = w.path / ".t.json.gz"
        k_torch = profiler.kernels_of(lambda: a + b, tmp, device=device, origin="torch add")
        k_ours = profiler.kernels_of(lambda: triton_kernels.add(a, b, params.block, params.num_warps), tmp,
                                     device=device, origin="triton add")
        tmp.unlink()
        k_torch["implementation"], k_ours["implementation"] = TORCH_ADD, OUR_ADD
        k = pd.concat([k_torch, k_ours], ignore_index=True)
        k["kind"] = k.name.map(kernels.classify)
        w.write_table("add_kernels", k)
        burst_a = torch.randn(params.burst_n // 8, device=device)
        burst_b = torch.randn_like(burst_a)
        burst_out = torch.empty_like(burst_a)
        profiler.record_trace(lambda: [torch.add(burst_a, burst_b, out=burst_out) for _ in range(40)],
                              w.path / BURST_TRACE, device=device, origin="burst")
    return runs.load_run(CHAPTER, w.run_id)


# Replay ---------------------------------------------------------------------------------

def load(run_id: str | None = None) -> runs.Run:
    return runs.load_run(CHAPTER, run_id)


def add_kernels(run: runs.Run) -> pd.DataFrame:
    """The two adds' kernels, their kinds by today's rules."""
    k = run.table("add_kernels", dtype={"grid": str, "block": str, "stream": str})
    k["kind"] = k.name.map(kernels.classify)
    return k


def burst_kernels(run: runs.Run) -> pd.DataFrame:
    k = trace.read_kernels(run.file(BURST_TRACE), origin="burst")
    k["kind"] = k.name.map(kernels.classify)
    return k


def queue_summary(run: runs.Run) -> dict:
    q = run.table("queue")
    s = run.results["queue"]
    call = q.call_return_us - q.call_start_us
    gpu_each = q.gpu_done_us.diff().dropna()
    return {
        "launch_call_us": float(call.median()),
        "host_issue_all_ms": s["host_issue_all_us"] / 1e3,
        "gpu_done_all_ms": float(q.gpu_done_us.iloc[-1]) / 1e3,
        "host_sync_returned_ms": s["host_sync_returned_us"] / 1e3,
        "gpu_per_add_us": float(gpu_each.median()),
        "queue_depth_at_last_launch": int((q.gpu_done_us > q.call_return_us.iloc[-1]).sum()),
        "add_tbs": s["bytes_per_add"] / (float(gpu_each.median()) * 1e-6) / 1e12,
        "add_mb": s["bytes_per_add"] / 1e6,
    }


def headline(run: runs.Run) -> dict:
    q = queue_summary(run)
    t = run.table("add_times").set_index("implementation").ms_median * 1e3
    return {"launch call µs": q["launch_call_us"], "torch add µs": float(t.loc[TORCH_ADD]),
            "Triton add µs": float(t.loc[OUR_ADD])}


def add_table(run: runs.Run) -> pd.DataFrame:
    """Each implementation's kernel time on the GPU (profiler) beside its time per call
    from Python (CUDA events around the call, which include getting the launch out)."""
    k = add_kernels(run)
    t = run.table("add_times").set_index("implementation")
    rows = []
    for impl, sub in k.groupby("implementation", sort=False):
        kernel_us = sub.dur_ns.sum() / 1e3
        rows.append({"implementation": impl, "kernel µs (profiler)": kernel_us,
                     "per call µs (CUDA events)": t.loc[impl, "ms_median"] * 1e3,
                     "GB/s during the kernel": t.loc[impl, "bytes"] / (kernel_us * 1e-6) / 1e9})
    return pd.DataFrame(rows)


@dataclass
class Cache:
    """Whether the small add's working set fits in the GPU's L2 cache."""

    working_set_bytes: int
    l2_bytes: int | None       # as the GPU reports it; None for runs that did not record it

    @property
    def fits(self) -> bool | None:
        return None if self.l2_bytes is None else self.working_set_bytes <= self.l2_bytes


def cache(run: runs.Run) -> Cache:
    t = run.table("add_times")
    l2 = run.results.get("l2_cache_bytes")
    return Cache(working_set_bytes=int(t.bytes.iloc[0]), l2_bytes=int(l2) if l2 else None)


def hbm_add(run: runs.Run) -> pd.DataFrame | None:
    """The adds on vectors far larger than L2, against the datasheet's memory bandwidth and
    the copy measured in the run (a copy, like an add, reads and writes); None for runs that
    did not time them."""
    if "hbm_add.csv" not in run.meta["files"]:
        return None
    h = run.table("hbm_add")
    lim = hardware.run_limits(run)
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
    kernel_gbs = float(add_table(run).iloc[0]["GB/s during the kernel"])
    ws = c.working_set_bytes / 2**20
    if c.fits is False:
        return (f"Its {ws:.1f} MiB working set is larger than this GPU's {c.l2_bytes / 2**20:.0f} MiB L2 cache, "
                "so this is the rate of the GPU's memory.")
    if c.l2_bytes:
        where = f"its {ws:.1f} MiB working set fits in this GPU's {c.l2_bytes / 2**20:.0f} MiB L2 cache"
    else:
        where = (f"its {ws:.1f} MiB working set is small enough to stay in the GPU's L2 cache (this run did not "
                 "record the cache's size)")
    if sheet and kernel_gbs > sheet.bandwidth_tbs * 1e3:
        return (f"That is faster than the {sheet.name} datasheet's memory bandwidth of {sheet.bandwidth_tbs:.1f} "
                f"TB/s, and possible only because {where}: the on-chip cache between the streaming "
                "multiprocessors and the GPU's memory (HBM). The add ran again and again on the same vectors, so "
                "its bytes came from L2, not from memory: this rate is not a memory bandwidth.")
    return (f"Its bytes came from the L2 cache, not from the GPU's memory (HBM): {where}, the on-chip cache "
            "between the streaming multiprocessors and memory, and the add ran again and again on the same vectors.")


def hbm_text(run: runs.Run) -> str:
    """The adds out of the cache, against the datasheet and the measured copy (runs from
    before timed only the burst's adds, which are out of the cache too)."""
    h = hbm_add(run)
    if h is None:
        q = queue_summary(run)
        return (f"This run did not time an add larger than the L2 cache on its own. The adds of the burst below, "
                f"{q['add_mb']:,.0f} MB each, are: each ran at {q['add_tbs']:.2f} TB/s.")
    lim, c = hardware.run_limits(run), cache(run)
    t = h.set_index("implementation")
    tr, ou = t.loc[TORCH_ADD], t.loc[OUR_ADD]
    vs = []
    if lim.datasheet_tbs:
        vs.append(f"{tr['of datasheet']:.0%} of the {lim.datasheet_name} datasheet's {lim.datasheet_tbs:.1f} TB/s")
    if lim.copy_tbs and tr["of measured copy"] <= 1:
        vs.append(f"{tr['of measured copy']:.0%} of the {lim.copy_tbs:.2f} TB/s a large copy reached in this run "
                  "(a copy, like an add, reads and writes)")
    elif lim.copy_tbs:
        vs.append(f"{tr['of measured copy']:.0%} of the {lim.copy_tbs:.2f} TB/s a large copy reached in this run: "
                  "that copy is a rate measured in practice, not a limit, and the datasheet's peak is the ceiling "
                  "that holds")
    times_l2 = f", {tr.bytes / c.l2_bytes:,.0f} times the L2 cache" if c.l2_bytes else ""
    return (f"With {int(tr.n):,d} elements per vector ({tr.bytes / 2**30:.1f} GiB moved per add{times_l2}), the same "
            f"two kernels must read and write the GPU's memory. Timed with CUDA events, torch's add took "
            f"{tr.ms_median:.3f} ms per call: {tr['GB/s']:,.0f} GB/s" + (", " + " and ".join(vs) if vs else "")
            + f". Ours reached {ou['GB/s']:,.0f} GB/s. This is the speed of memory; the small add's was the speed of L2.")
