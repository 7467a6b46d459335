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
3. **Host-timed numbers are taken interleaved, on a fast host, and reported by their median
   there.** The lent box's host changes speed over minutes (an eager decode step moves between
   about 21 and 33 ms), so variants that are compared are timed in rounds (A B C, B C A, ...) by
   :func:`interleaved`, and every round reads a fixed CPU-only workload
   (:mod:`labsupport.measure.hostprobe`) that each of its trials carries (`probe_ms`). A trial is a
   fast-host trial when its reading is within FAST_HOST of the best reading of its measurement;
   the estimator (:data:`ESTIMATOR`, :func:`estimate`) is the median of those trials, with their
   minimum, quartiles and count beside it. A measurement with fewer than MIN_FAST_TRIALS of them,
   judged by the best reading of the run so far (so that one taken wholly on a slow host is not
   judged by its own slow best), waits and times more rounds (bounded by hostprobe.RETRY_BUDGET_S
   per run), then is noted as taken on a slow host. Runs recorded before per-trial readings fall
   back to the minimum.
"""

from __future__ import annotations

import contextlib
import gc
import math
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
# the host has two speeds, and a minimum picks a rare fast moment out of a slow run, where the
# median of the trials taken on a fast host is a time the step takes, run after run).
ESTIMATOR = "fast-host median"
FALLBACK_ESTIMATOR = "minimum"  # runs recorded before per-trial probe readings
FAST_HOST = 1.15  # a trial whose probe read within this of the measurement's best is a fast-host trial
MIN_FAST_TRIALS = 10  # fewer fast-host trials than this: wait, time more rounds, then call the host slow
RETRY_WAIT_S = 10.0  # the wait before each retry (the host switches speed within minutes)
RETRIES = 2  # retries after the first try: 3 tries in all

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


@dataclass(frozen=True)
class Estimate:
    """A host-timed quantity by the book's estimator: `value` is the median of the fast-host trials
    (`basis` "fast-host median"), or, for trials without probe readings, the minimum of all of them
    (`basis` "minimum"); `low`, `q1`, `q3` of the same trials, `trials` of them out of `of`."""

    value: float
    low: float
    q1: float
    q3: float
    trials: int
    of: int
    basis: str
    best_probe_ms: float = float("nan")


def _finite(xs) -> bool:
    """Whether every probe reading is there (a CSV cell left empty reads back as NaN)."""
    try:
        return len(xs) > 0 and all(math.isfinite(float(x)) for x in xs)
    except (TypeError, ValueError):
        return False


def fast_host(wall_ms: list[float], probe_ms: list[float] | None, best_ms: float | None = None) -> list[float]:
    """The trials taken while the probe read within FAST_HOST of its best reading among them, or of
    `best_ms` where given (the best of several measurements compared); all of them without readings."""
    if probe_ms is None or not _finite(probe_ms) or len(probe_ms) != len(wall_ms):
        return list(wall_ms)
    best = min(map(float, probe_ms)) if best_ms is None else best_ms
    return [float(w) for w, p in zip(wall_ms, probe_ms, strict=True) if float(p) <= best * FAST_HOST]


def estimate(wall_ms: list[float], probe_ms: list[float] | None = None, best_ms: float | None = None) -> Estimate:
    """The book's estimator of trials `wall_ms`, each with the probe reading `probe_ms` taken
    nearest to it (None, or a list with a missing value: a run from before per-trial readings,
    estimated by the minimum). `best_ms`: the best reading to judge the trials by, where two
    measurements are compared (default: the best of `probe_ms`). No fast-host trial: NaN."""
    walls = [float(w) for w in wall_ms]
    if not walls:
        nan = float("nan")
        return Estimate(nan, nan, nan, nan, 0, 0, ESTIMATOR)
    if probe_ms is None or not _finite(probe_ms) or len(probe_ms) != len(walls):
        return Estimate(
            min(walls), min(walls), quantile(walls, 0.25), quantile(walls, 0.75), len(walls), len(walls),
            FALLBACK_ESTIMATOR,
        )  # fmt: skip
    best = min(map(float, probe_ms)) if best_ms is None else best_ms
    fast = fast_host(walls, probe_ms, best)
    if not fast:
        nan = float("nan")
        return Estimate(nan, nan, nan, nan, 0, len(walls), ESTIMATOR, best)
    return Estimate(
        float(statistics.median(fast)), min(fast), quantile(fast, 0.25), quantile(fast, 0.75), len(fast), len(walls),
        ESTIMATOR, best,
    )  # fmt: skip


def table_estimate(df, wall: str = "wall_ms", best_ms: float | None = None) -> Estimate:
    """The estimator of a table of trials (one row per trial, `probe_ms` where the run recorded it)."""
    probes = list(df["probe_ms"]) if "probe_ms" in df else None
    return estimate(list(df[wall]), probes, best_ms)


def estimate_column(columns, prefix: str = "wall_ms") -> str:
    """The column of a summary table that holds the estimator: `{prefix}_estimate` (the fast-host
    median) where the run recorded it, else `{prefix}_min` (runs from before per-trial readings)."""
    return f"{prefix}_estimate" if f"{prefix}_estimate" in columns else f"{prefix}_min"


@dataclass
class Timing:
    """Repeated timings of one region, in ms.

    `wall`: from the call to the GPU having finished (host clock, synchronised); `issue`:
    until the Python call returned, when the CPU has queued every kernel; `gpu`: between CUDA
    events recorded before and after the call on the stream (empty on a CPU). `clean` says
    the process had not profiled before. `rounds` gives, per trial, the round of an
    :func:`interleaved` measurement it was taken in (empty for a block of repeats), `probe_ms` the
    host probe's reading nearest to each trial; `slow_host`: too few fast-host trials even after
    the retries."""

    what: str
    wall_ms: list[float]
    issue_ms: list[float]
    gpu_ms: list[float] = field(default_factory=list)
    clean: bool = True
    rounds: list[int] = field(default_factory=list)
    probe_ms: list[float] = field(default_factory=list)
    slow_host: bool = False

    @property
    def median(self) -> float:
        return statistics.median(self.wall_ms)

    @property
    def low(self) -> float:
        """The minimum of all the trials."""
        return min(self.wall_ms)

    @property
    def fast(self) -> Estimate:
        """The book's estimator (ESTIMATOR) with its minimum, quartiles and count."""
        return estimate(self.wall_ms, self.probe_ms or None)

    @property
    def estimate(self) -> float:
        return self.fast.value

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
        for r, p in zip(rows, self.probe_ms, strict=False):
            r["probe_ms"] = p
        return rows

    def summary(
        self,
        *,
        fast: bool = True,
        issue: bool = False,
        count: str | None = "wall_ms_repeats",
        clean: str | None = "clean",
    ) -> dict:
        """A summary table's row of this timing, the one every chapter writes: the minimum, quartiles,
        median and maximum of all the trials (`wall_ms_*`), with `fast` the estimator with its
        fast-host spread (where per-trial probe readings exist), with `issue` the median issue time,
        the count of trials under the column `count` and the clean flag under `clean` (None: left
        out; the tables recorded so far name them differently)."""
        row = spread(self.wall_ms, "wall_ms", (self.probe_ms or None) if fast else None)
        if count:
            row[count] = len(self.wall_ms)
        if issue:
            row["issue_ms_median"] = float(statistics.median(self.issue_ms))
        if clean:
            row[clean] = self.clean
        return row


def spread(values: list[float], prefix: str, probe_ms: list[float] | None = None) -> dict:
    """`{prefix}_min`, `_q1`, `_median`, `_q3` and `_max` of all of `values`; with per-trial probe
    readings also the estimator, `{prefix}_estimate` (the median of the fast-host trials), with
    `_fast_min`, `_fast_q1`, `_fast_q3` and `_fast_trials` beside it (the run's results note a
    measurement left with too few: hostprobe.slow_notes)."""
    out = {
        f"{prefix}_min": float(min(values)),
        f"{prefix}_q1": quantile(values, 0.25),
        f"{prefix}_median": float(statistics.median(values)),
        f"{prefix}_q3": quantile(values, 0.75),
        f"{prefix}_max": float(max(values)),
    }
    e = estimate(values, probe_ms)
    if e.basis == ESTIMATOR:
        out |= {
            f"{prefix}_estimate": e.value,
            f"{prefix}_fast_min": e.low,
            f"{prefix}_fast_q1": e.q1,
            f"{prefix}_fast_q3": e.q3,
            f"{prefix}_fast_trials": e.trials,
        }
    return out


def run_best(probe_ms: list[float]) -> float | None:
    """The best probe reading to judge a measurement's trials by while the run is measuring: the
    quicker of its own best and the run's best so far (hostprobe.best_sample_ms); None without readings."""
    own = [float(p) for p in probe_ms if p == p]
    best = [b for b in (min(own) if own else None, hostprobe.best_sample_ms()) if b is not None]
    return min(best) if best else None


def too_few_fast(e: Estimate, min_fast: int = MIN_FAST_TRIALS) -> bool:
    """Whether an estimate rests on fewer than `min_fast` fast-host trials, where enough trials were
    taken to have them (smoke and CPU runs time fewer in all: never slow)."""
    return e.of >= min_fast and e.trials < min_fast


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
    fn,
    *,
    what: str,
    device: str,
    repeats: int,
    warmup: int = 3,
    setup=None,
    allow_after_profile: bool = False,
    min_fast: int = 0,
) -> Timing:
    """Time `fn(*setup())` `repeats` times after `warmup` untimed runs.

    `setup` (e.g. a fresh prefill before each decode step) runs before each repeat, outside
    the timed span; the host probe is sampled before each timed repeat, and the repeat carries
    the reading; with `min_fast`, fewer fast-host trials than that are noted as a slow host (no retry:
    the headline measurements are interleaved). The garbage collector is paused while timing.
    Refuses to run in a process that has profiled (rule 1) unless `allow_after_profile`, which the
    methodology's measurement of the profiler's own effect uses."""
    if profiled() and not allow_after_profile:
        raise TimingError(
            f"{_chapter}: {what}: wall times must be taken before the first profile in a "
            "process (CUPTI stays attached after it); time first, then profile"
        )
    wall, issue, gpu, probe = [], [], [], []
    gc.collect()
    was_enabled = gc.isenabled()
    gc.disable()
    hostprobe.read(f"before {what}")
    try:
        for i in range(warmup + repeats):
            if i >= warmup:
                probe.append(hostprobe.sample())
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
    t = Timing(what=what, wall_ms=wall, issue_ms=issue, gpu_ms=gpu, clean=not profiled(), probe_ms=probe)
    judged = estimate(wall, probe or None, run_best(probe))
    if min_fast and too_few_fast(judged, min_fast):
        t.slow_host = True
        hostprobe.note_slow(what, judged.trials, len(wall), judged.best_probe_ms)
    return t


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
    retries: int | None = None,
    retry_wait_s: float = RETRY_WAIT_S,
    min_fast: int = 0,
) -> dict[str, Timing]:
    """Time several variants of a region in rounds, so that a change of the host's speed
    touches all of them alike: each round times every variant `per_round` times, in an order
    that rotates from round to round (A B C, B C A, C A B, ...).

    `variants` maps a name to `fn` or to `(fn, setup)`; `setup()` (a fresh prefill, a cache
    reset) runs before each trial, outside the timed span. Each variant first runs `warmup`
    untimed trials. The host probe is sampled at the start of every round, and each trial of the
    round carries that reading (`probe_ms`); its full reading (labsupport.measure.hostprobe) is
    taken before the first round, every `probe_every` rounds (0: once, halfway) and after the last.
    A headline measurement passes `min_fast` (MIN_FAST_TRIALS; the default 0: never retried nor
    noted, as the measurements of the ranks of a multi-GPU step must stay in step): when a variant
    has fewer fast-host trials than that (and at least that many trials), the measurement waits
    `retry_wait_s` and times up to `rounds` more rounds (stopping at the round that brings it to
    `min_fast`), up to `retries` times within the run's retry
    budget (hostprobe.RETRY_BUDGET_S; `retries` None: RETRIES on a GPU, none on a CPU, where the
    host is what is timed); if still too few, its timings are marked `slow_host` and the run notes
    it. Refuses to run in a process that has profiled, like time_region. Returns {name: Timing}, in
    `variants`' order, each trial labelled with its round."""
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
    label = what or "trials"
    if retries is None:
        retries = RETRIES if str(device).startswith("cuda") else 0

    def trial(name: str, keep: int | None, probe: float = float("nan")) -> None:
        fn, setup = calls[name]
        w, i, g = timed_call(fn, setup, device)
        if keep is not None:
            t = out[name]
            t.wall_ms.append(w)
            t.issue_ms.append(i)
            t.rounds.append(keep)
            t.probe_ms.append(probe)
            if g is not None:
                t.gpu_ms.append(g)

    def fewest_fast() -> Estimate:  # judged by the run's best reading so far, not by the measurement's own alone
        best = run_best([p for t in out.values() for p in t.probe_ms])
        return min((estimate(t.wall_ms, t.probe_ms or None, best) for t in out.values()), key=lambda e: e.trials)

    gc.collect()
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        for name in names:
            for _ in range(warmup):
                trial(name, None)
        hostprobe.read(f"before {label}")
        done, tries = 0, 0
        while True:
            t0 = time.perf_counter()
            last = done + rounds
            for r in range(done, done + rounds):
                probe = hostprobe.sample()
                order = names[r % len(names) :] + names[: r % len(names)]
                for name in order:
                    for _ in range(per_round):
                        trial(name, r, probe)
                last = r + 1
                if tries and not too_few_fast(fewest_fast(), min_fast):
                    break  # a retry stops at the round that brings the fast-host trials up to min_fast
                if (r + 1) % every == 0 and r + 1 < done + rounds:
                    hostprobe.read(f"{label}, after round {r + 1}")
                    if progress is not None:
                        progress(f"  {what or 'timing'}: round {r + 1}/{done + rounds}")
            done, took = last, time.perf_counter() - t0
            e = fewest_fast()
            if not min_fast or not too_few_fast(e, min_fast):
                break
            if tries >= retries or hostprobe.retry_left_s() < retry_wait_s + took:
                for t in out.values():
                    t.slow_host = True
                hostprobe.note_slow(label, e.trials, e.of, e.best_probe_ms)
                if progress is not None:
                    progress(f"  {what or 'timing'}: {e.trials} fast-host trials of {e.of}: the host was slow")
                break
            tries += 1
            if progress is not None:
                progress(
                    f"  {what or 'timing'}: {e.trials} fast-host trials of {e.of}; waiting {retry_wait_s:.0f} s, "
                    f"then {rounds} more rounds (retry {tries}/{retries})"
                )
            gc.enable()
            time.sleep(retry_wait_s)
            gc.collect()
            gc.disable()
            hostprobe.spend_retry(retry_wait_s + took)
            hostprobe.read(f"{label}, retry {tries}")
        hostprobe.read(f"after {label}")
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


# The words of method()["wall_times"] that say a run's measurements were judged by the run's best
# reading so far (data_files.slow_tables judges the runs recorded before by their trial tables).
RUN_BEST_RULE = "run's best reading so far"


def judged_by_run_best(results: dict) -> bool:
    """Whether a run's harness judged each headline measurement's fast-host trials by the run's
    best reading so far (and retried it, and noted it in results["host_slow"])."""
    return RUN_BEST_RULE in str((results.get("method") or {}).get("wall_times", ""))


def method() -> dict:
    """How the numbers of a run were taken, for its meta.json."""
    return {
        "wall_times": "host clock around the call, synchronised; variants compared are timed interleaved in "
        "rounds (harness.interleaved), many short trials each, each trial with the host probe's reading of its "
        "round; reported by the median of the fast-host trials (probe within "
        f"{FAST_HOST - 1:.0%} of its best reading in the measurement; the estimator) with their minimum, quartiles "
        f"and count; a headline measurement with fewer than {MIN_FAST_TRIALS} trials within {FAST_HOST - 1:.0%} of the "
        f"{RUN_BEST_RULE} waits and retries, then is noted as taken on a slow host; taken before the first "
        "profile in the process (clean) or in fresh processes "
        "(labsupport.measure.fresh)",
        "estimator": ESTIMATOR,
        "fast_host": {
            "within": FAST_HOST,
            "min_trials": MIN_FAST_TRIALS,
            "retries": RETRIES,
            "retry_budget_s": hostprobe.RETRY_BUDGET_S,
        },
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
