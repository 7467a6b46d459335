"""How fast the host is right now: a fixed CPU-only workload, timed before, between and after
a run's trials.

A decode step in eager PyTorch is host-bound: its wall time is the CPU's time to run Python and
launch kernels. On the lent box the host's speed changes over minutes (the same eager step moves
between about 30 and 56 ms within one process, with no CPU steal), so a host-timed number means
little without the host's speed at the time. The probe is that speed: the same small piece of
Python and PyTorch dispatch (a loop of arithmetic, then tiny tensor operations on the CPU, the
kind of work that launching a kernel is) timed a few times, its least time kept. Readings are
kept per process, in order; a run records them (`results["host_probe"]`), validation compares
them, and the page says when the host was slow.

Every host-timed trial also carries a reading of its own (`sample()`: the workload timed once,
every round of the trials; harness.interleaved), so that a trial can be judged by the host's speed
at its time; a measurement that found too few trials on a fast host after its retries is noted
(`note_slow`), and the run records the notes (`results["host_slow"]`).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

DESCRIPTION = (
    "a fixed CPU-only workload (20,000 iterations of Python arithmetic, then 2,000 tiny tensor "
    "additions on the CPU), timed 3 times, its least time kept; read before, between and after the trials; "
    "and timed once at the start of every round of trials, each trial of the round carrying that reading"
)
# A reading this many times the run's quickest, or the published run's typical one, is a slow host.
SLOW = 1.25


@dataclass
class Reading:
    at: str  # what the process was about to do or had just done
    ms: float  # the workload's least time of its repeats
    t_s: float  # seconds since the first reading of the process


# How long, in all, one run's measurements may spend waiting and retrying for a fast host.
RETRY_BUDGET_S = 180.0

_readings: list[Reading] = []
_t0: float | None = None
_slow: list[dict] = []
_retry_spent_s = 0.0
_best_sample_ms = float("inf")


def workload() -> None:
    """The fixed workload: Python arithmetic, then PyTorch's dispatch on tiny CPU tensors."""
    acc = 0
    for i in range(20_000):
        acc += (i * 7) % 13
    try:
        import torch
    except ImportError:  # pragma: no cover - every box that measures has torch
        return
    a = torch.ones(4)
    for _ in range(2_000):
        a = a + 1.0


def read(at: str, repeats: int = 3) -> Reading:
    """Time the workload now and keep the reading."""
    global _t0
    now = time.perf_counter()
    if _t0 is None:
        _t0 = now
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        workload()
        best = min(best, time.perf_counter() - t)
    r = Reading(at=at, ms=round(best * 1e3, 4), t_s=round(now - _t0, 3))
    _readings.append(r)
    return r


def sample() -> float:
    """The workload timed once, in ms: the reading a host-timed trial carries (only the quickest
    of the run is kept, best_sample_ms)."""
    global _best_sample_ms
    ms = _timed_once()
    _best_sample_ms = min(_best_sample_ms, ms)
    return ms


def _timed_once() -> float:
    t = time.perf_counter()
    workload()
    return round((time.perf_counter() - t) * 1e3, 4)


def best_sample_ms() -> float | None:
    """The quickest trial reading (sample) of this run so far: the host at its best in the run, which
    a measurement taken wholly on a slow host must be judged by (its own best is a slow one)."""
    return _best_sample_ms if _best_sample_ms != float("inf") else None


def note_slow(what: str, fast_trials: int, trials: int, best_ms: float) -> None:
    """Note a measurement that ended with too few fast-host trials (the run records it)."""
    _slow.append({"what": what, "fast_trials": fast_trials, "trials": trials, "best_probe_ms": round(best_ms, 4)})


def slow_notes() -> list[dict]:
    """The measurements of this run that ended on a slow host, oldest first."""
    return [dict(n) for n in _slow]


def slow_host(results: dict) -> bool | None:
    """Whether a run was taken on a slow host by its own record (results["host_slow"]: the
    measurements left with too few fast-host trials); None for runs recorded before the record."""
    notes = results.get("host_slow")
    return None if notes is None else bool(notes)


def retry_left_s() -> float:
    """Seconds this run may still spend waiting and retrying for a fast host."""
    return max(RETRY_BUDGET_S - _retry_spent_s, 0.0)


def spend_retry(seconds: float) -> None:
    global _retry_spent_s
    _retry_spent_s += seconds


def readings() -> list[dict]:
    """Every reading of this process so far, oldest first."""
    return [asdict(r) for r in _readings]


def reset() -> None:
    """Forget the readings, the slow notes and the retry time spent (a new run starts its own)."""
    global _t0, _retry_spent_s, _best_sample_ms
    _readings.clear()
    _slow.clear()
    _t0 = None
    _retry_spent_s = 0.0
    _best_sample_ms = float("inf")


@dataclass(frozen=True)
class HostSpeed:
    """What a run's probe readings say: the quickest, typical and slowest reading (ms), and
    whether the host was slow during the run (its slowest reading SLOW times its quickest, or its
    typical reading SLOW times the `reference`: the published run's typical reading)."""

    readings: int
    best_ms: float
    median_ms: float
    worst_ms: float
    reference_ms: float | None
    slow: bool
    why: str

    @property
    def spread(self) -> float:
        return self.worst_ms / self.best_ms if self.best_ms > 0 else float("nan")


def assess(
    readings: list[dict], reference_ms: float | None = None, reference_what: str = "the reference"
) -> HostSpeed | None:
    """The host's speed over a run (None when the run has no probe readings: recorded before
    the probe existed)."""
    ms = sorted(float(r["ms"]) for r in readings or [] if isinstance(r, dict) and "ms" in r)
    if not ms:
        return None
    best, worst = ms[0], ms[-1]
    mid = ms[len(ms) // 2] if len(ms) % 2 else (ms[len(ms) // 2 - 1] + ms[len(ms) // 2]) / 2
    why = []
    if best > 0 and worst / best >= SLOW:
        why.append(
            f"its slowest probe reading was {worst / best:.2f}x its quickest ({worst:.2f} against {best:.2f} ms)"
        )
    if reference_ms and mid / reference_ms >= SLOW:
        why.append(
            f"its typical probe reading was {mid / reference_ms:.2f}x {reference_what} "
            f"({mid:.2f} against {reference_ms:.2f} ms)"
        )
    return HostSpeed(len(ms), best, mid, worst, reference_ms, bool(why), "; ".join(why))
