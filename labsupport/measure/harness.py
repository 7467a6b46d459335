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
3. **Host-timed numbers are taken interleaved, and reported by their minimum.** The lent box's
   host changes speed over minutes (an eager decode step moves between about 30 and 56 ms in one
   process), so variants that are compared are timed in rounds (A B C, B C A, ...) by
   :func:`interleaved`, many short trials each, and every :class:`Timing` reports its minimum
   (the estimator, :data:`ESTIMATOR`) beside its median and quartiles. A fixed CPU-only workload
   (:mod:`labsupport.measure.hostprobe`) is timed before, between and after the trials, so a slow
   host shows in the run.
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

from labsupport.measure import hostprobe
from labsupport.traces import trace

# The estimator every host-timed number of the book is reported by (the methodology page says why:
# timing noise on a fixed workload only ever adds time, so the least of many trials is the closest
# to the work's own cost; Chen & Revels 2016, "Robust benchmarking in noisy environments").
ESTIMATOR = "minimum"

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


def quantile(values: list[float], q: float) -> float:
    """The q-quantile of `values` (linear between order statistics, as numpy's default)."""
    xs = sorted(values)
    if not xs:
        return float("nan")
    pos = q * (len(xs) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


@dataclass
class Timing:
    """Repeated timings of one region, in ms.

    `wall`: from the call to the GPU having finished (host clock, synchronised); `issue`:
    until the Python call returned, when the CPU has queued every kernel; `gpu`: between CUDA
    events recorded before and after the call on the stream (empty on a CPU). `clean` says
    the process had not profiled before. `rounds` gives, per trial, the round of an
    :func:`interleaved` measurement it was taken in (empty for a block of repeats)."""

    what: str
    wall_ms: list[float]
    issue_ms: list[float]
    gpu_ms: list[float] = field(default_factory=list)
    clean: bool = True
    rounds: list[int] = field(default_factory=list)

    @property
    def median(self) -> float:
        return statistics.median(self.wall_ms)

    @property
    def low(self) -> float:
        """The minimum: the book's estimator for host-timed numbers (ESTIMATOR)."""
        return min(self.wall_ms)

    @property
    def estimate(self) -> float:
        return self.low

    @property
    def q1(self) -> float:
        return quantile(self.wall_ms, 0.25)

    @property
    def q3(self) -> float:
        return quantile(self.wall_ms, 0.75)

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
        for r, n in zip(rows, self.rounds, strict=False):
            r["round"] = n
        return rows

    def summary(self, prefix: str = "wall_ms") -> dict:
        """The estimator (minimum), the quartiles and the median, the range and the count."""
        return {**spread(self.wall_ms, prefix), f"{prefix}_repeats": len(self.wall_ms), "clean": self.clean}


def spread(values: list[float], prefix: str) -> dict:
    """`{prefix}_min` (the book's estimator), `_q1`, `_median`, `_q3` and `_max` of `values`."""
    return {
        f"{prefix}_min": float(min(values)),
        f"{prefix}_q1": quantile(values, 0.25),
        f"{prefix}_median": float(statistics.median(values)),
        f"{prefix}_q3": quantile(values, 0.75),
        f"{prefix}_max": float(max(values)),
    }


def timed_call(fn, setup, device: str) -> tuple[float, float, float | None]:
    """One trial: `setup()` (outside the timed span), then `fn(*args)` timed: the wall time until the
    GPU had finished, the issue time until the call returned, and on a GPU the time between CUDA
    events recorded around it on the stream (None on a CPU); all in ms."""
    events = str(device).startswith("cuda")  # "cuda:1" too: a rank's own GPU
    args = setup() if setup is not None else ()
    sync(device)
    if events:
        import torch

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
    return (t2 - t0) * 1e3, (t1 - t0) * 1e3, start.elapsed_time(end) if events else None


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
    wall, issue, gpu = [], [], []
    gc.collect()
    was_enabled = gc.isenabled()
    gc.disable()
    hostprobe.read(f"before {what}")
    try:
        for i in range(warmup + repeats):
            w, s, g = timed_call(fn, setup, device)
            if i >= warmup:
                wall.append(w)
                issue.append(s)
                if g is not None:
                    gpu.append(g)
    finally:
        if was_enabled:
            gc.enable()
    hostprobe.read(f"after {what}")
    return Timing(what=what, wall_ms=wall, issue_ms=issue, gpu_ms=gpu, clean=not profiled())


def interleaved(
    variants: dict,
    *,
    device: str,
    rounds: int,
    per_round: int = 1,
    warmup: int = 2,
    what: str = "",
    probe_every: int = 0,
    allow_after_profile: bool = False,
    progress=None,
) -> dict[str, Timing]:
    """Time several variants of a region in rounds, so that a change of the host's speed
    touches all of them alike: each round times every variant `per_round` times, in an order
    that rotates from round to round (A B C, B C A, C A B, ...).

    `variants` maps a name to `fn` or to `(fn, setup)`; `setup()` (a fresh prefill, a cache
    reset) runs before each trial, outside the timed span. Each variant first runs `warmup`
    untimed trials. The host probe (labsupport.measure.hostprobe) is read before the first
    round, every `probe_every` rounds (0: once, halfway) and after the last. Refuses to run in
    a process that has profiled, like time_region. Returns {name: Timing}, in `variants`' order,
    each trial labelled with its round."""
    if profiled() and not allow_after_profile:
        raise TimingError(
            f"{_chapter}: {what or ', '.join(variants)}: wall times must be taken before the first "
            "profile in a process (CUPTI stays attached after it); time first, then profile"
        )
    names = list(variants)
    if not names or rounds < 1 or per_round < 1:
        raise ValueError("interleaved needs at least one variant, one round and one trial per round")
    calls = {n: (v if isinstance(v, tuple) else (v, None)) for n, v in variants.items()}
    out = {n: Timing(what=f"{what}: {n}" if what else n, wall_ms=[], issue_ms=[]) for n in names}
    every = probe_every if probe_every > 0 else max(1, (rounds + 1) // 2)

    def trial(name: str, keep: int | None) -> None:
        fn, setup = calls[name]
        w, i, g = timed_call(fn, setup, device)
        if keep is not None:
            t = out[name]
            t.wall_ms.append(w)
            t.issue_ms.append(i)
            t.rounds.append(keep)
            if g is not None:
                t.gpu_ms.append(g)

    gc.collect()
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        for name in names:
            for _ in range(warmup):
                trial(name, None)
        hostprobe.read(f"before {what or 'trials'}")
        for r in range(rounds):
            order = names[r % len(names) :] + names[: r % len(names)]
            for name in order:
                for _ in range(per_round):
                    trial(name, r)
            if (r + 1) % every == 0 and r + 1 < rounds:
                hostprobe.read(f"{what or 'trials'}, after round {r + 1}")
                if progress is not None:
                    progress(f"  {what or 'timing'}: round {r + 1}/{rounds}")
        hostprobe.read(f"after {what or 'trials'}")
    finally:
        if was_enabled:
            gc.enable()
    clean = not profiled()
    for t in out.values():
        t.clean = clean
    return out


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
        "wall_times": "host clock around the call, synchronised; variants compared are timed interleaved in "
        "rounds (harness.interleaved), many short trials each; reported by the minimum (the estimator) with "
        "the quartiles and the median; taken before the first profile in the process (clean) or in fresh "
        "processes (labsupport.measure.fresh)",
        "estimator": ESTIMATOR,
        "host_probe": hostprobe.DESCRIPTION,
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
