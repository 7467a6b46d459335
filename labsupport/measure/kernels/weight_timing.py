"""Timing a kernel that reads a weight as it runs inside a decode step: many calls captured in
one CUDA graph and replayed, each on a different copy of the weight, so that no call finds its
weight in the L2 cache left by the one before (a step reads each matrix once, from memory)."""

from __future__ import annotations

# The most weight copies one timing cycles through. Four times the L2 cache in copies of the
# tiny model's 64 x 64 matrix (8 KB) would be 25,600 of them, each call launched from Python
# and captured: a smoke run's tuning took 11 minutes on an H100 for shapes no real model has.
MAX_COPIES = 512


def weight_copies(nbytes: int, l2_bytes: int) -> int:
    """How many copies of a weight of `nbytes` one timing cycles through: enough for four times the
    L2 cache, at least two, at most MAX_COPIES."""
    return min(MAX_COPIES, max(2, -(-4 * l2_bytes // nbytes)))


def time_per_call_us(n: int, k: int, call, repeats: int = 20, fp8: bool = False, dtype=None) -> float:
    """Microseconds per call of `call(x, w)` (which writes its own output) on a BF16 weight of
    shape (N, K) (FP8 with `fp8`; `dtype` torch.float16 for a model in float16: its weights and x),
    as the kernels run inside a decode step's CUDA graph: many calls captured in one graph and
    replayed (no launch gaps from Python), each on a different copy of the weight so that none is
    read from L2 (the copies together are several times the L2 cache). At most MAX_COPIES copies:
    a matrix so small that it needs more (under 4 x L2 / MAX_COPIES, 400 KB on an H200; the smallest
    of Qwen3-8B is 8 MB, of Qwen3-1.7B 4 MB) is the tests' tiny model's, timed partly from L2."""
    import torch

    from labsupport.measure import hardware

    nbytes = n * k * (1 if fp8 else 2)
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    copies = weight_copies(nbytes, l2)
    half = dtype or torch.bfloat16
    dtype = torch.float8_e4m3fn if fp8 else half
    ws = [torch.randn(n, k, device="cuda", dtype=half).to(dtype) for _ in range(copies)]
    x = torch.randn(1, k, device="cuda", dtype=half)
    calls = max(32, copies)

    def run():
        for i in range(calls):
            call(x, ws[i % copies])

    return hardware.graph_us_per_call(run, calls, repeats=repeats, side_stream=True)
