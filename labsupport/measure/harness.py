"""The measuring harness every chapter uses: time a region, profile a region, check what
came back.

Two rules hold for every number in the book (the methodology page shows why, measured):

1. **Wall times are taken where the profiler cannot touch them.** After a torch.profiler
   session, Kineto leaves NVIDIA's profiling interface (CUPTI) attached to the process and
   every later kernel launch pays for it (pytorch/pytorch#146604). Asking Kineto to detach it
   (``TEARDOWN_CUPTI=1``) makes every later profile in the process record no kernels with the
   torch of the lent GPU box. So CUPTI stays attached, and :func:`time_region` refuses to run
   once the process has profiled: a chapter times everything first, then profiles. Timings in
   processes of their own come from :mod:`labsupport.measure.fresh`.
2. **A profile warms up inside its own session** (``torch.profiler.schedule``: the first steps
   are traced and thrown away, so CUPTI's start-up and dropped events at session start stay
   out of the kept step), and a profile that captured no GPU kernel on a GPU stops the
   recording at once: an empty kernel table is never written.
"""

from __future__ import annotations

import contextlib
import gc
import os
import statistics
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from labsupport.traces import trace

_profiles_in_process = 0
_chapter = "labsupport"


class ProfileError(RuntimeError):
    """A profile came back without the GPU kernels it should hold."""


class TimingError(RuntimeError):
    """A wall time was asked for where the profiler would distort it."""


def for_chapter(name: str) -> None:
    """Name the chapter now recording, so that an error says which chapter failed."""
    global _chapter
    _chapter = name


def profiled() -> bool:
    """Whether this process has profiled a GPU (CUPTI is then attached for good)."""
    return _profiles_in_process > 0


def sync(device: str) -> None:
    """Wait for the GPU ("cuda" or one of them, "cuda:1"); nothing on a CPU."""
    if str(device).startswith("cuda"):
        import torch

        torch.cuda.synchronize()


@dataclass
class Timing:
    """Repeated timings of one region, in ms.

    `wall`: from the call to the GPU having finished (host clock, synchronised); `issue`:
    until the Python call returned, when the CPU has queued every kernel; `gpu`: between CUDA
    events recorded before and after the call on the stream (empty on a CPU). `clean` says
    the process had not profiled before."""

    what: str
    wall_ms: list[float]
    issue_ms: list[float]
    gpu_ms: list[float] = field(default_factory=list)
    clean: bool = True

    @property
    def median(self) -> float:
        return statistics.median(self.wall_ms)

    @property
    def low(self) -> float:
        return min(self.wall_ms)

    @property
    def high(self) -> float:
        return max(self.wall_ms)

    def rows(self, **keys) -> list[dict]:
        """One row per repeat, with `keys` (e.g. variant="eager") in every row."""
        rows = [
            {**keys, "repeat": i, "wall_ms": w, "issue_ms": s, "clean": self.clean}
            for i, (w, s) in enumerate(zip(self.wall_ms, self.issue_ms, strict=True))
        ]
        for r, g in zip(rows, self.gpu_ms, strict=False):  # no CUDA events on a CPU: no column
            r["gpu_ms"] = g
        return rows

    def summary(self, prefix: str = "wall_ms") -> dict:
        return {
            f"{prefix}_median": self.median,
            f"{prefix}_min": self.low,
            f"{prefix}_max": self.high,
            f"{prefix}_repeats": len(self.wall_ms),
            "clean": self.clean,
        }


def time_region(
    fn, *, what: str, device: str, repeats: int, warmup: int = 3, setup=None, allow_after_profile: bool = False
) -> Timing:
    """Time `fn(*setup())` `repeats` times after `warmup` untimed runs.

    `setup` (e.g. a fresh prefill before each decode step) runs before each repeat, outside
    the timed span. The garbage collector is paused while timing. Refuses to run in a process
    that has profiled (rule 1) unless `allow_after_profile`, which the methodology's
    measurement of the profiler's own effect uses."""
    if profiled() and not allow_after_profile:
        raise TimingError(
            f"{_chapter}: {what}: wall times must be taken before the first profile in a "
            "process (CUPTI stays attached after it); time first, then profile"
        )
    events = str(device).startswith("cuda")  # "cuda:1" too: a rank's own GPU
    if events:
        import torch
    wall, issue, gpu = [], [], []
    gc.collect()
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        for i in range(warmup + repeats):
            args = setup() if setup is not None else ()
            sync(device)
            if events:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
            t0 = time.perf_counter()
            fn(*args)
            t1 = time.perf_counter()
            if events:
                end.record()
            sync(device)
            t2 = time.perf_counter()
            del args
            if i >= warmup:
                wall.append((t2 - t0) * 1e3)
                issue.append((t1 - t0) * 1e3)
                if events:
                    gpu.append(start.elapsed_time(end))
    finally:
        if was_enabled:
            gc.enable()
    return Timing(what=what, wall_ms=wall, issue_ms=issue, gpu_ms=gpu, clean=not profiled())


def profile_region(
    fn, path: Path, *, region: str, device: str, warmup: int = 2, setup=None, labels=None, fence=None
) -> pd.DataFrame:
    """Profile `fn(*setup())` with torch.profiler and return the kernels it launched.

    The session runs `warmup` traced-and-discarded steps, then keeps one (the profiler's own
    `schedule`); the kept step's Chrome trace is written to `path` (.json.gz compressed).
    `setup` runs before each step, outside the `region` annotation, so its kernels (a prefill,
    say) are not counted. `labels` is a context-manager factory (module annotations) entered
    around each step. `fence` (several processes profiling together, each rank of a tensor-parallel
    step) is called before the profiler starts, before and after each of its steps and after it
    stops, so that every process passes each phase together. On a GPU, a profile without kernels
    raises ProfileError."""
    global _profiles_in_process
    from torch.profiler import ProfilerActivity, profile, record_function, schedule

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    path = Path(path)
    path.unlink(missing_ok=True)
    plan = schedule(wait=0, warmup=warmup, active=1, repeat=1)
    # torch warns that a schedule drops the warm-up steps' events: that is the point here.
    warnings.filterwarnings("ignore", message=".*Profiler clears events at the end of each cycle.*")
    fence = fence or (lambda: None)
    fence()
    with profile(
        activities=activities, schedule=plan, on_trace_ready=lambda p: p.export_chrome_trace(str(path))
    ) as prof:
        for _ in range(warmup + 1):
            args = setup() if setup is not None else ()
            sync(device)
            with labels() if labels is not None else contextlib.nullcontext(), record_function(region):
                fn(*args)
                sync(device)  # the region ends when the GPU has finished it
            del args
            fence()
            prof.step()
            fence()
    fence()
    if device == "cuda":  # a CPU-only profile does not attach CUPTI
        _profiles_in_process += 1
    if not path.is_file():
        raise ProfileError(f"{_chapter}: the profile of {region!r} wrote no trace")
    k = trace.region_kernels(path, device=device, region=region)
    if device == "cuda" and k.empty:
        raise ProfileError(
            f"{_chapter}: the profile of {region!r} captured no GPU kernels "
            f"(TEARDOWN_CUPTI={os.environ.get('TEARDOWN_CUPTI')}); nothing was written"
        )
    return k


def method() -> dict:
    """How the numbers of a run were taken, for its meta.json."""
    return {
        "wall_times": "host clock around the call, synchronised, median of repeats; taken before the "
        "first profile in the process (clean) or in fresh processes (labsupport.measure.fresh)",
        "gpu_times": "kernel durations and busy time from one profiled step (torch.profiler, CUPTI), "
        "kept after warm-up steps of the same profiler session",
        "cuda_event_times": "CUDA events recorded on the stream before and after each timed call",
        "teardown_cupti": os.environ.get("TEARDOWN_CUPTI", ""),
        "host": host(),
    }


def host() -> dict:
    """The CPU that launched the kernels, and how loaded it was."""
    model = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    load = os.getloadavg() if hasattr(os, "getloadavg") else (float("nan"),) * 3
    return {
        "cpu_model": model,
        "logical_cpus": os.cpu_count(),
        "loadavg_1m": round(load[0], 2),
        "loadavg_5m": round(load[1], 2),
    }
