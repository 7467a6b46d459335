"""Chapter "What a kernel is": one vector add as one kernel (torch's and our Triton one),
its launch configuration, and the asynchronous queue between the CPU and the GPU."""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import pandas as pd

from . import hardware, kernels, profiler, runs, trace

CHAPTER = "what-a-kernel"
BURST_TRACE = "burst_trace.json.gz"


@dataclass
class Params:
    n: int = 1 << 20              # elements of the vector add
    block: int = 1024             # elements per program of our Triton kernel
    num_warps: int = 4
    burst: int = 200              # launches in the queue demonstration
    burst_n: int = 1 << 26        # elements per add in the burst: big enough that the GPU lags
    repeats: int = 100
    device: str = "cuda"


def _progress(msg: str) -> None:
    print(f"[{CHAPTER}] {msg}", flush=True)


def launch_config(k: pd.DataFrame) -> pd.DataFrame:
    """Grid, block and thread counts of each kernel in a kernel table."""
    def prod(s):
        out = 1
        for v in str(s).split(","):
            out *= int(v)
        return out

    return pd.DataFrame({
        "kernel": k.name.map(kernels.short_name),
        "grid (blocks)": k.grid, "block (threads)": k.block,
        "blocks": k.grid.map(prod), "threads per block": k.block.map(prod),
        "threads": k.grid.map(prod) * k.block.map(prod),
        "registers/thread": k.registers, "µs": k.dur_ns / 1e3,
    })


def measure_queue(burst: int, n: int) -> tuple[pd.DataFrame, dict]:
    """Launch `burst` vector adds back to back and time both sides.

    Host side: the time each launch call takes to return. GPU side: a CUDA event recorded
    after each launch says when that kernel finished. The CPU is done launching long before
    the GPU is done computing: the launches wait in a queue (a CUDA stream).
    """
    import torch

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


def measure_sync(repeats: int) -> pd.DataFrame:
    """What waiting for the GPU costs when it has nothing left to do, and a round trip."""
    import torch

    x = torch.ones(1, device="cuda")
    rows = []
    for name, fn in (("torch.cuda.synchronize() on an idle GPU", torch.cuda.synchronize),
                     ("x.item(): read one number back to the CPU", lambda: x.item()),
                     ("launch one tiny kernel and wait for it", lambda: (x.add_(0), torch.cuda.synchronize()))):
        fn()
        ts = []
        for _ in range(repeats):
            t = time.perf_counter_ns()
            fn()
            ts.append((time.perf_counter_ns() - t) / 1e3)
        rows.append({"what": name, "us_median": statistics.median(ts), "us_min": min(ts)})
    return pd.DataFrame(rows)


def record(params: Params | None = None, run_id: str | None = None, progress=_progress) -> runs.Run:
    import torch

    from . import triton_kernels

    params = params or Params()
    with runs.live_writer(CHAPTER, params, run_id) as w:
        a = torch.randn(params.n, device="cuda")
        b = torch.randn(params.n, device="cuda")
        ours = triton_kernels.add(a, b, block=params.block, num_warps=params.num_warps)
        w.extra["triton_matches_torch"] = bool(torch.equal(ours, a + b))
        progress("profiling torch's vector add and ours (Triton)")
        tmp = w.path / ".t.json.gz"
        k_torch = profiler.kernels_of(lambda: a + b, tmp, origin="torch add")
        k_ours = profiler.kernels_of(lambda: triton_kernels.add(a, b, params.block, params.num_warps), tmp,
                                     origin="triton add")
        tmp.unlink()
        k_torch["implementation"], k_ours["implementation"] = "torch (a + b)", "ours (Triton)"
        k = pd.concat([k_torch, k_ours], ignore_index=True)
        k["kind"] = k.name.map(kernels.classify)
        w.write_table("add_kernels", k)
        times = []
        for impl, fn in (("torch (a + b)", lambda: a + b),
                         ("ours (Triton)", lambda: triton_kernels.add(a, b, params.block, params.num_warps))):
            t = hardware.time_cuda_ms(fn, repeats=params.repeats, warmup=10)
            times.append({"implementation": impl, "ms_median": statistics.median(t), "ms_min": min(t),
                          "bytes": 3 * params.n * 4})
        w.write_table("add_times", pd.DataFrame(times))

        progress(f"the queue: {params.burst} launches back to back")
        queue, summary = measure_queue(params.burst, params.burst_n)
        w.write_table("queue", queue)
        w.extra["queue"] = summary
        burst_a = torch.randn(params.burst_n // 8, device="cuda")
        burst_b = torch.randn_like(burst_a)
        burst_out = torch.empty_like(burst_a)
        profiler.record_trace(lambda: [torch.add(burst_a, burst_b, out=burst_out) for _ in range(40)],
                              w.path / BURST_TRACE, origin="burst")
        progress("what a synchronisation costs")
        w.write_table("sync", measure_sync(params.repeats))
    return runs.load_run(CHAPTER, w.run_id)


def load(run_id: str | None = None) -> runs.Run:
    return runs.load_run(CHAPTER, run_id)


def add_kernels(run: runs.Run) -> pd.DataFrame:
    return run.table("add_kernels", dtype={"grid": str, "block": str, "stream": str})


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
    }


def headline(run: runs.Run) -> dict:
    q = queue_summary(run)
    t = run.table("add_times").set_index("implementation").ms_median * 1e3
    return {"launch call µs": q["launch_call_us"], "torch add µs": float(t.iloc[0]), "Triton add µs": float(t.iloc[1])}


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
