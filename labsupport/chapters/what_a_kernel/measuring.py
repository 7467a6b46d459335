"""What the chapter's measuring cells use: its parameters, the names of what they measure (the
keys of its tables' rows), the GPU's L2 cache size, and one add's time per call as a row.

Live, every time is taken before the first profile of the process (labsupport.measure.harness):
the ceilings, the adds per call, the adds out of the cache, the queue, what a
synchronisation costs; then the profiles (the two adds' kernels, the burst's trace)."""

from __future__ import annotations

from labsupport.measure import harness

from .declaration import DECLARATION

CHAPTER, load, progress = DECLARATION.slug, DECLARATION.load, DECLARATION.progress  # its declaration's
BURST_TRACE = "burst_trace.json.gz"
# The two implementations of the add: the key of each row of add_times, hbm_add and add_kernels.
TORCH_ADD, OUR_ADD = "torch (a + b)", "ours (Triton)"
# The region each add is profiled in (its kernels are those launched inside it).
PROFILE_REGION = {TORCH_ADD: "torch add", OUR_ADD: "triton add"}
# What a synchronisation costs: the key of each row of sync.
SYNC_IDLE = "torch.cuda.synchronize() on an idle GPU"
SYNC_ITEM = "x.item(): read one number back to the CPU"
SYNC_TINY = "launch one tiny kernel and wait for it"


def l2_cache_bytes() -> int | None:
    """The L2 cache size the GPU reports (None where torch does not say)."""
    import torch

    l2 = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", None)
    return int(l2) if l2 else None


def per_call_row(impl: str, t: harness.Timing, n: int) -> dict:
    """One implementation's time per call: CUDA events around the call (the host clock on a
    CPU), taken interleaved with the other implementation (harness.interleaved): the minimum
    (the book's estimator), the quartiles, the median and the maximum."""
    ms = list(t.gpu_ms or t.wall_ms)
    return {
        "implementation": impl,
        "n": n,
        **harness.spread(ms, "ms"),
        "repeats": len(ms),
        "bytes": 3 * n * 4,
        "clean": t.clean,
    }


def wait_row(what: str, t: harness.Timing) -> dict:
    """One way of waiting for the GPU, timed on the host clock (interleaved with the others): the
    minimum (the estimator), the quartiles, the median and the maximum, in µs."""
    us = [w * 1e3 for w in t.wall_ms]
    return {
        "what": what,
        **harness.spread(us, "us"),
        "repeats": len(us),
        "clean": t.clean,
    }
