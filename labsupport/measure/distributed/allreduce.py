"""An all-reduce sweep on the process group in place (NCCL on GPUs, gloo on a CPU), and the
collectives one step issues.

Latency is the median over repeats of `iters` back-to-back all-reduces divided by `iters`
(as nccl-tests averages), timed until the last one has finished (CUDA events on a GPU: the
host returns from an NCCL all-reduce as soon as it is queued); bus bandwidth is the rate the
links carry in a ring all-reduce, 2(n-1)/n x bytes / time, which is comparable across numbers
of GPUs (nccl-tests' "busbw"). On a GPU every size is timed twice: launched one by one from
Python, as an eager step does, and replayed from a CUDA graph holding the `iters` all-reduces,
as a graphed step does (no host cost between them: the GPU side alone).
"""

from __future__ import annotations

import statistics
import time

from labsupport.measure import harness

# torch is imported where it is used, and CollectiveLog (a torch class) is made on first use
# (__getattr__ below): the chapter's replay reads this module's names and never loads torch.

SWEEP_MIN, SWEEP_MAX = 8 << 10, 256 << 20  # 8 KB .. 256 MB


def sizes(low: int = SWEEP_MIN, high: int = SWEEP_MAX, extra: tuple[int, ...] = ()) -> list[int]:
    """Message sizes in bytes: powers of two from `low` to `high`, plus `extra` (the decode step's)."""
    if low < 2 or high < low:
        raise ValueError(f"all-reduce sweep: sizes must be 2 <= low <= high bytes, got {low} .. {high}")
    out, b = set(extra), low
    while b <= high:
        out.add(b)
        b *= 2
    return sorted(out)


def bus_bandwidth(nbytes, seconds, world: int):
    """Bus bandwidth (bytes/s) of a ring all-reduce of `nbytes` among `world` ranks taking `seconds`."""
    return 2 * (world - 1) / world * nbytes / seconds


def time_burst(x, iters: int, repeats: int, warmup: int = 2) -> list[float]:
    """Seconds per all-reduce of `x` among every rank of the default group: for each repeat, every
    rank waits for its device and meets the others (a barrier), then `iters` all-reduces run back
    to back and the time runs until the last one has finished. On a GPU that is CUDA events on
    the current stream (each all-reduce makes the stream wait for NCCL's), read after a
    synchronize; on a CPU, gloo's all-reduce returns when it is done, and the host clock times it.
    Returns one time per repeat, after `warmup` untimed bursts."""
    import torch
    import torch.distributed as dist

    cuda = x.is_cuda
    out = []
    for i in range(warmup + repeats):
        if cuda:
            torch.cuda.synchronize()
        dist.barrier()
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        t0 = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(x)
        if cuda:
            end.record()
            torch.cuda.synchronize()
            seconds = start.elapsed_time(end) * 1e-3
        else:
            seconds = time.perf_counter() - t0
        if i >= warmup:
            out.append(seconds / iters)
    return out


EAGER, GRAPH = "one by one", "CUDA graph"  # how the all-reduces were launched (allreduce.csv's `launch`)


def time_graph(x, iters: int, repeats: int, warmup: int = 2) -> list[float]:
    """Seconds per all-reduce of `x` (on a GPU) when `iters` of them are captured in one CUDA
    graph and replayed: each repeat, every rank waits for its device and meets the others, then
    CUDA events around one replay. Returns one time per repeat, after `warmup` replays."""
    import torch
    import torch.distributed as dist

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # NCCL's communicator warmed up before the capture
        for _ in range(2):
            dist.all_reduce(x)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(iters):
            dist.all_reduce(x)
    out = []
    for i in range(warmup + repeats):
        torch.cuda.synchronize()
        dist.barrier()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        if i >= warmup:
            out.append(start.elapsed_time(end) * 1e-3 / iters)
    del graph
    return out


def sweep(
    message_bytes: list[int], device: str, dtype=None, iters: int = 20, repeats: int = 5, progress=None
) -> list[dict]:
    """Time all-reduces of each size among every rank of the default group (time_burst); one row
    per size. `device` is this rank's ("cuda:1", or "cpu"); `dtype` torch.bfloat16 by default."""
    import torch
    import torch.distributed as dist

    dtype = dtype or torch.bfloat16
    world, rank = dist.get_world_size(), dist.get_rank()
    esize = torch.tensor([], dtype=dtype).element_size()
    rows = []
    for nbytes in message_bytes:
        x = torch.zeros(max(1, nbytes // esize), dtype=dtype, device=device)  # zeros: sums stay finite
        n = x.numel() * esize
        timings = {EAGER: time_burst(x, iters, repeats)}
        if x.is_cuda:
            timings[GRAPH] = time_graph(x, iters, repeats)
        for launch, lat in timings.items():
            med = statistics.median(lat)
            rows.append(
                {
                    "rank": rank,
                    "world": world,
                    "bytes": n,
                    "dtype": str(dtype).removeprefix("torch."),
                    "launch": launch,
                    "iters": iters,
                    "repeats": repeats,
                    "latency_us_median": med * 1e6,
                    "latency_us_min": min(lat) * 1e6,
                    "latency_us_max": max(lat) * 1e6,
                    "algbw_gbs": n / med / 1e9,
                    "busbw_gbs": bus_bandwidth(n, med, world) / 1e9,
                    "timer": "cuda events" if x.is_cuda else "host clock",
                    "clean": not harness.profiled(),
                }
            )
        if progress is not None and rank == 0:
            said = ", ".join(f"{k} {statistics.median(v) * 1e6:.1f} us" for k, v in timings.items())
            progress(f"all-reduce {n:>11,} B: {said}; bus {rows[-1]['busbw_gbs']:.1f} GB/s")
        del x
    return rows


def issued(path, region: str = "decode_step", op: str = "_c10d_functional::all_reduce") -> tuple[int, int]:
    """How many calls of the collective operator `op` the host made inside the `region` of a
    profiler trace, and their summed duration on the host (ns). On a GPU the NCCL kernels
    are the collectives' GPU side; this is their host side, and the only side on a CPU."""
    from labsupport.traces import trace

    events = trace.load_events(path)
    region_ev = [e for e in trace.complete_events(events, {"user_annotation"}) if e["name"] == region]
    if not region_ev:
        raise trace.TraceError(f"no {region!r} annotation in {path}")
    t0 = trace.ns(region_ev[0]["ts"])
    t1 = t0 + trace.ns(region_ev[0]["dur"])
    calls = [e for e in trace.complete_events(events, {"cpu_op"}) if e["name"] == op and t0 <= trace.ns(e["ts"]) <= t1]
    return len(calls), sum(trace.ns(e["dur"]) for e in calls)


def _collective_log_class():
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    class CollectiveLog(TorchDispatchMode):
        """Records every collective (torch.ops._c10d_functional.*, what DTensor and tp_split's
        process-group choice issue; torch.ops.symm_mem's all-reduces, recorded as "all_reduce") run
        inside it: its name, the bytes of its input and their dtype, in order."""

        def __init__(self):
            super().__init__()
            self.rows: list[dict] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            name = func.overloadpacket.__name__
            symm = func.namespace == "symm_mem" and "all_reduce" in name
            if symm or (func.namespace == "_c10d_functional" and name != "wait_tensor" and not name.startswith("_")):
                tensors = [a for a in args if isinstance(a, torch.Tensor)]
                tensors += [t for a in args if isinstance(a, (list, tuple)) for t in a if isinstance(t, torch.Tensor)]
                self.rows.append(
                    {
                        "seq": len(self.rows),
                        "op": "all_reduce" if symm else name,
                        "bytes": sum(t.numel() * t.element_size() for t in tensors),
                        "dtype": str(tensors[0].dtype).removeprefix("torch.") if tensors else "",
                        "shape": "x".join(map(str, tensors[0].shape)) if tensors else "",
                    }
                )
            return func(*args, **kwargs)

    return CollectiveLog


def __getattr__(name: str):
    if name == "CollectiveLog":  # made once, on the first `allreduce.CollectiveLog`
        globals()["CollectiveLog"] = cls = _collective_log_class()
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
