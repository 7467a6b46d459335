"""What the chapter's measuring cell uses: its parameters, the names of what it measures (the
keys of its tables' rows), the queue timed by hand, and one add's time per call as a row.

Live, every time is taken before the first profile of the process (labsupport.measure.harness):
the ceilings, the adds per call, the adds out of the cache, the queue, what a
synchronisation costs; then the profiles (the two adds' kernels, the burst's trace)."""

from __future__ import annotations

import time
from dataclasses import dataclass

import pandas as pd

from labsupport.measure import harness

CHAPTER = "what-a-kernel"
BURST_TRACE = "burst_trace.json.gz"
# The two implementations of the add: the key of each row of add_times, hbm_add and add_kernels.
TORCH_ADD, OUR_ADD = "torch (a + b)", "ours (Triton)"
# The region each add is profiled in (its kernels are those launched inside it).
PROFILE_REGION = {TORCH_ADD: "torch add", OUR_ADD: "triton add"}
# What a synchronisation costs: the key of each row of sync.
SYNC_IDLE = "torch.cuda.synchronize() on an idle GPU"
SYNC_ITEM = "x.item(): read one number back to the CPU"
SYNC_TINY = "launch one tiny kernel and wait for it"


@dataclass
class Params:
    n: int = 1 << 20  # elements of the vector add (fits in the L2 cache)
    block: int = 1024  # elements per program of our Triton kernel
    num_warps: int = 4
    burst: int = 200  # launches in the queue demonstration
    burst_n: int = 1 << 26  # elements per add in the burst: big enough that the GPU lags
    hbm_n: int = 1 << 28  # elements per vector of the add that does not fit in L2 (3 GiB moved)
    repeats: int = 100
    device: str = "cuda"


def progress(msg: str) -> None:
    print(f"[{CHAPTER}] {msg}", flush=True)


def l2_cache_bytes() -> int | None:
    """The L2 cache size the GPU reports (None where torch does not say)."""
    import torch

    l2 = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", None)
    return int(l2) if l2 else None


def per_call_row(impl: str, t: harness.Timing, n: int) -> dict:
    """One implementation's time per call: CUDA events around the call (the host clock on a
    CPU), median, min and max."""
    ms = pd.Series(t.gpu_ms or t.wall_ms)
    return {
        "implementation": impl,
        "n": n,
        "ms_median": float(ms.median()),
        "ms_min": float(ms.min()),
        "ms_max": float(ms.max()),
        "repeats": len(ms),
        "bytes": 3 * n * 4,
        "clean": t.clean,
    }


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
    rows = [
        {
            "launch": i,
            "call_start_us": s / 1e3,
            "call_return_us": e / 1e3,
            "gpu_done_us": start.elapsed_time(ends[i]) * 1e3,
        }
        for i, (s, e) in enumerate(host)
    ]
    summary = {
        "host_issue_all_us": t_issued / 1e3,
        "host_sync_returned_us": t_done / 1e3,
        "bytes_per_add": 3 * n * 4,
    }
    return pd.DataFrame(rows), summary
