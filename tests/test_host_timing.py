"""Host-timed numbers: variants timed interleaved in rounds, each trial with the host probe's
reading of its round, reported by the median of the fast-host trials with their minimum, quartiles
and count; too few of them: retried, then noted as a slow host (labsupport.measure.harness,
hostprobe)."""

from __future__ import annotations

import time
from pathlib import Path

import pandas as pd
import pytest

from labsupport import chapters
from labsupport.measure import harness, hostprobe

pytestmark = pytest.mark.unit


def test_interleaved_rotates_the_order_and_labels_rounds():
    order = []
    variants = {name: (lambda n=name: order.append(n)) for name in "ABC"}
    out = harness.interleaved(variants, device="cpu", rounds=3, warmup=0, what="abc")
    assert order == list("ABCBCACAB")
    assert list(out) == list("ABC")
    for t in out.values():
        assert t.rounds == [0, 1, 2] and len(t.wall_ms) == 3 and t.clean


def test_interleaved_runs_setup_outside_the_timed_span():
    t = harness.interleaved(
        {"slow setup": (lambda: None, lambda: time.sleep(0.02) or ())}, device="cpu", rounds=4, warmup=1
    )["slow setup"]
    assert max(t.wall_ms) < 15


def test_the_estimator_is_the_median_of_the_fast_host_trials():
    """Half the trials on a host twice as slow (the probe reads twice as long): the estimator is the
    median of the fast half, not the rare quickest trial and not the median of all."""
    walls = [21.0, 22.0, 20.0, 23.0, 21.5] + [31.0, 32.0, 33.0, 30.0, 14.0]  # 14: a freak quick trial
    probes = [7.0, 7.5, 7.2, 8.0, 7.1] + [14.0, 15.0, 13.5, 16.0, 14.5]
    e = harness.estimate(walls, probes)
    assert e.basis == harness.ESTIMATOR == "fast-host median"
    assert e.trials == 5 and e.of == 10 and e.value == 21.5 and e.low == 20.0
    assert e.q1 == 21.0 and e.q3 == 22.0 and e.best_probe_ms == 7.0
    assert harness.fast_host(walls, probes) == [21.0, 22.0, 20.0, 23.0, 21.5]  # 8.0 <= 7.0 * 1.15
    s = harness.spread(walls, "wall_ms", probes)
    assert s["wall_ms_estimate"] == 21.5 and s["wall_ms_fast_trials"] == 5 and s["wall_ms_min"] == 14.0
    assert harness.too_few_fast(e)  # 5 fast-host trials of 10 taken


def test_trials_are_judged_against_a_common_best_where_two_are_compared():
    walls, probes = [30.0, 31.0, 32.0], [14.0, 14.5, 15.0]
    assert harness.estimate(walls, probes).trials == 3  # alone: its own best, 14 ms
    e = harness.estimate(walls, probes, best_ms=7.0)  # beside trials taken at 7 ms: none at that speed
    assert e.trials == 0 and e.of == 3 and e.value != e.value


def test_a_measurement_that_is_not_a_headline_never_waits(monkeypatch):
    hostprobe.reset()
    _probe_sequence(monkeypatch, [7.0] + [14.0] * 11)
    t = harness.interleaved({"a": lambda: None}, device="cpu", rounds=12, warmup=0, retries=2)["a"]
    assert len(t.wall_ms) == 12 and not t.slow_host and hostprobe.slow_notes() == []


def test_trials_without_probe_readings_fall_back_to_the_minimum():
    """A run recorded before per-trial probe readings: the old estimator, said as such."""
    walls = [30.0, 28.0, 40.0, 41.0]
    for probes in (None, [float("nan")] * 4, [7.0, 7.0]):
        e = harness.estimate(walls, probes)
        assert e.basis == harness.FALLBACK_ESTIMATOR == "minimum" and e.value == 28.0 and e.trials == 4
    assert "wall_ms_estimate" not in harness.spread(walls, "wall_ms")
    assert harness.estimate_column(["wall_ms_min"]) == "wall_ms_min"
    assert harness.estimate_column(["wall_ms_min", "wall_ms_estimate"]) == "wall_ms_estimate"


def _probe_sequence(monkeypatch, readings):
    it = iter(readings)
    monkeypatch.setattr(hostprobe, "sample", lambda: next(it))


def test_every_trial_carries_the_probe_reading_of_its_round(monkeypatch):
    _probe_sequence(monkeypatch, [7.0, 14.0, 7.1])
    out = harness.interleaved({"a": lambda: None, "b": lambda: None}, device="cpu", rounds=3, warmup=0)
    assert out["a"].probe_ms == out["b"].probe_ms == [7.0, 14.0, 7.1]
    assert [r["probe_ms"] for r in out["a"].rows()] == [7.0, 14.0, 7.1]
    assert out["a"].fast.trials == 2 and not out["a"].slow_host  # 3 trials in all: too few to judge


def test_too_few_fast_host_trials_retry_then_count(monkeypatch):
    """Twelve rounds with one fast reading: the measurement times more rounds, found on a fast host,
    stops at the round that brings it to ten fast-host trials (nine more, not twelve), and keeps
    every trial (the slow ones outside the fast-host set)."""
    hostprobe.reset()
    _probe_sequence(monkeypatch, [14.0] * 11 + [7.0] + [7.2] * 12)
    out = harness.interleaved(
        {"a": lambda: None}, device="cpu", rounds=12, warmup=0, retries=2, retry_wait_s=0, min_fast=10
    )
    t = out["a"]
    assert len(t.wall_ms) == 21 and t.rounds == list(range(21))
    assert t.fast.trials == 10 and not t.slow_host
    assert hostprobe.slow_notes() == [] and any("retry 1" in r["at"] for r in hostprobe.readings())


def test_a_host_that_stays_slow_is_noted_after_the_retries(monkeypatch):
    """Every try bimodal: three tries, then the timing is marked slow and the run notes it."""
    hostprobe.reset()
    _probe_sequence(monkeypatch, ([7.0] + [14.0] * 11) * 3)
    t = harness.interleaved(
        {"a": lambda: None}, device="cpu", rounds=12, warmup=0, retries=2, retry_wait_s=0, min_fast=10
    )["a"]
    assert len(t.wall_ms) == 36 and t.slow_host and t.fast.trials == 3
    (note,) = hostprobe.slow_notes()
    assert note["fast_trials"] == 3 and note["trials"] == 36 and note["best_probe_ms"] == 7.0
    assert t.summary()["wall_ms_fast_trials"] == 3


def test_retries_stay_within_the_runs_budget(monkeypatch):
    """The run's retry budget spent: no more waiting, the host is noted slow at once."""
    hostprobe.reset()
    monkeypatch.setattr(hostprobe, "RETRY_BUDGET_S", 0.0)
    _probe_sequence(monkeypatch, [7.0] + [14.0] * 11)
    t = harness.interleaved(
        {"a": lambda: None}, device="cpu", rounds=12, warmup=0, retries=2, retry_wait_s=0, min_fast=10
    )["a"]
    assert len(t.wall_ms) == 12 and t.slow_host and len(hostprobe.slow_notes()) == 1


def test_a_measurement_wholly_on_a_slow_host_is_judged_by_the_runs_best(monkeypatch):
    """A first measurement reads the host at 7 ms; a second, every trial at 14 ms, would find all its
    trials "fast" against its own best: judged by the run's best so far it retries, then is noted slow
    (the lent box's eager step, timed wholly in the host's slow mode, read 45 ms against 29)."""
    hostprobe.reset()
    it = iter([7.0] * 12 + [14.0] * 36)
    monkeypatch.setattr(hostprobe, "_timed_once", lambda: next(it))
    first = harness.interleaved({"a": lambda: None}, device="cpu", rounds=12, warmup=0, min_fast=10)["a"]
    assert not first.slow_host and hostprobe.best_sample_ms() == 7.0
    t = harness.interleaved(
        {"b": lambda: None}, device="cpu", rounds=12, warmup=0, retries=2, retry_wait_s=0, min_fast=10
    )["b"]
    assert len(t.wall_ms) == 36 and t.slow_host and t.fast.trials == 36  # its own best alone: all "fast"
    (note,) = hostprobe.slow_notes()
    assert note["fast_trials"] == 0 and note["best_probe_ms"] == 7.0
    hostprobe.reset()
    assert hostprobe.best_sample_ms() is None


def test_a_cpu_measurement_does_not_wait_for_its_host(monkeypatch):
    """On a CPU the host is what is timed: too few fast-host trials are noted, never retried."""
    hostprobe.reset()
    _probe_sequence(monkeypatch, [7.0] + [14.0] * 11)
    t = harness.interleaved({"a": lambda: None}, device="cpu", rounds=12, warmup=0, min_fast=10)["a"]
    assert len(t.wall_ms) == 12 and t.slow_host


def test_time_region_probes_every_trial(monkeypatch):
    _probe_sequence(monkeypatch, [7.0, 7.5, 30.0])
    t = harness.time_region(lambda: None, what="x", device="cpu", repeats=3, warmup=1)
    assert t.probe_ms == [7.0, 7.5, 30.0] and t.fast.trials == 2


def test_time_region_notes_a_slow_host_only_when_asked(monkeypatch):
    hostprobe.reset()
    _probe_sequence(monkeypatch, ([7.0] + [14.0] * 11) * 2)
    assert not harness.time_region(lambda: None, what="x", device="cpu", repeats=12, warmup=0).slow_host
    assert hostprobe.slow_notes() == []
    t = harness.time_region(lambda: None, what="y", device="cpu", repeats=12, warmup=0, min_fast=10)
    assert t.slow_host and [n["what"] for n in hostprobe.slow_notes()] == ["y"]


def test_interleaved_reads_the_host_probe_before_between_and_after():
    hostprobe.reset()
    harness.interleaved({"a": lambda: None, "b": lambda: None}, device="cpu", rounds=4, warmup=0, what="ab")
    at = [r["at"] for r in hostprobe.readings()]
    assert at[0] == "before ab" and at[-1] == "after ab" and any("after round" in a for a in at[1:-1])
    assert all(r["ms"] > 0 for r in hostprobe.readings())


def test_interleaved_refuses_after_a_profile(monkeypatch):
    monkeypatch.setattr(harness, "profiled", lambda: True)
    with pytest.raises(harness.TimingError, match="before the first profile"):
        harness.interleaved({"a": lambda: None}, device="cpu", rounds=1)


def test_quantile_matches_linear_interpolation():
    assert harness.quantile([4, 1, 3, 2], 0.25) == pytest.approx(1.75)
    assert harness.quantile([5.0], 0.75) == 5.0


def test_host_speed_flags_a_slow_host():
    steady = [{"at": str(i), "ms": 10.0 + 0.1 * i, "t_s": i} for i in range(5)]
    s = hostprobe.assess(steady)
    assert s.readings == 5 and not s.slow and s.spread < 1.05
    drifted = steady + [{"at": "late", "ms": 14.0, "t_s": 9}]
    assert hostprobe.assess(drifted).slow and "slowest" in hostprobe.assess(drifted).why
    assert hostprobe.assess(steady, reference_ms=7.0).slow  # slower than the published run's host
    assert hostprobe.assess([]) is None


class _Run:
    def __init__(self, probe):
        self.results = {"host_probe": probe}
        self.run_id, self.chapter = "r", "c"
        self.provenance = {"gpu": "a GPU no published run was recorded on"}
        self.meta = {"files": {}}  # no tables of trials


def test_drift_flags_a_run_recorded_on_a_slower_host():
    from labsupport.ops import drift

    published = _Run([{"at": "a", "ms": 10.0, "t_s": 0}, {"at": "b", "ms": 10.2, "t_s": 1}])
    slow = _Run([{"at": "a", "ms": 14.0, "t_s": 0}, {"at": "b", "ms": 14.1, "t_s": 1}])
    h = drift.host_speed(slow, published)
    assert h["slow"] and "published run" in h["why"]
    assert "Host slower than usual" in drift.host_line(h)
    assert not drift.host_speed(published, published)["slow"]
    assert drift.host_speed(_Run([]), published) == {}
    assert "before the probe existed" in drift.host_line({})


def test_the_page_says_when_the_host_was_slow():
    from labsupport.chapters import data_files

    steady = _Run([{"at": "a", "ms": 10.0, "t_s": 0}, {"at": "b", "ms": 10.5, "t_s": 1}])
    drifting = _Run([{"at": "a", "ms": 10.0, "t_s": 0}, {"at": "b", "ms": 16.0, "t_s": 60}])
    assert "held its speed" in data_files.host_text(steady)
    assert "slower than usual" in data_files.host_text(drifting)
    assert data_files.host_banner(steady).data == ""
    assert "A slow host" in data_files.host_banner(drifting).data
    assert "before the host probe existed" in data_files.host_text(_Run([]))


def test_a_run_slow_from_start_to_end_is_flagged_against_the_hosts_best():
    """What a kernel is's published run: the page says its host was slow exactly when the probe's
    typical reading was slow against the host's best in the other runs (a run slow from start to
    end, steady in itself, as one recorded at HEAD on the H200 was: 14-18 ms throughout against
    8-10 ms at the night's best), or its own slowest reading against its quickest. A run that keeps
    only its fast-host trials (results["host_slow"]) is slow when one of its measurements kept too
    few of them, or when even its quickest reading was slow against the host's best."""
    from labsupport import runs
    from labsupport.chapters import data_files

    run = runs.load_run(chapters.by_slug("what-a-kernel"))
    if "host_probe" not in run.results:
        return  # a run recorded before the probe
    own = hostprobe.assess(run.results["host_probe"])
    best = data_files.host_reference_ms(run)
    assert best is not None and best <= own.best_ms
    text = data_files.host_text(run)
    if "host_slow" in run.results:
        slow = bool(run.results["host_slow"]) or own.best_ms >= hostprobe.SLOW * best
    else:
        slow = own.median_ms >= hostprobe.SLOW * best or own.worst_ms >= hostprobe.SLOW * own.best_ms
    assert ("slower than usual" in text) == slow


class _Chapter:
    slug = "c"

    def __init__(self, headlines):
        self.headlines = headlines

    def headline(self, run):
        return self.headlines[run.run_id]


def _probed(run_id, best_ms):
    r = _Run([{"at": "a", "ms": best_ms, "t_s": 0}, {"at": "b", "ms": best_ms * 1.05, "t_s": 1}])
    r.run_id, r.meta = run_id, {"files": {}}
    return r


def test_drift_labels_a_move_the_probe_explains_as_host(monkeypatch):
    """The new run's host probe read twice the published run's: its eager wall time 57% slower is
    the host's ("host"), a GPU-timed number that moved is still moved, and so is a wall time that moved
    further than the probe, or against it."""
    from labsupport.ops import drift

    monkeypatch.setattr(chapters, "headline", lambda chapter, run: chapter.headline(run))  # the made-up chapter's

    old, new = _probed("old", 7.0), _probed("new", 14.0)
    chapter = _Chapter(
        {
            "old": {"wall ms": 21.0, "GPU busy ms": 7.5, "best wall ms": 21.0, "eager wall ms": 21.0},
            "new": {"wall ms": 33.0, "GPU busy ms": 10.0, "best wall ms": 60.0, "eager wall ms": 15.0},
        }
    )
    d = drift.compare(chapter, new, old)
    label = {t["metric"]: ("moved" if t["moved"] else "host" if t["host"] else "noise") for t in d.timing}
    assert label == {"wall ms": "host", "GPU busy ms": "moved", "best wall ms": "moved", "eager wall ms": "moved"}
    assert [t["metric"] for t in d.moved] == ["GPU busy ms", "best wall ms", "eager wall ms"]
    md = drift.to_markdown([d], drift.DEFAULT_TIMING_THRESHOLD, "t")
    assert "| wall ms | 21 | 33 | +57.1% | host |" in md
    # The same move with the host at the same speed: moved.
    same = drift.compare(chapter, _probed("new", 7.0), old)
    assert [t["metric"] for t in same.moved] == ["wall ms", "GPU busy ms", "best wall ms", "eager wall ms"]
    # Without probe readings in either run, nothing is explained.
    assert drift.probe_ratios(_probed("new", 7.0), _Run([])) == (None, None)
    assert not drift.explained_by_host(0.57, None, 0.25)


def test_drift_sets_a_run_taken_mostly_on_a_slow_host_against_its_typical_reading(monkeypatch):
    """The published run's quickest probe reading was as fast as the new run's, but most of its
    readings were twice as slow (what-a-kernel's launch call, 19.7 against 9.4 us, probe typical 12.8
    against 5.3 ms): its host-timed number halving is the host's, set against the typical readings."""
    from labsupport.ops import drift

    monkeypatch.setattr(chapters, "headline", lambda chapter, run: chapter.headline(run))
    old = _Run([{"at": str(i), "ms": ms, "t_s": i} for i, ms in enumerate([7.0, 14.0, 14.2, 13.8, 14.1])])
    old.run_id, old.meta = "old", {"files": {}}
    new = _probed("new", 7.0)
    best, typical = drift.probe_ratios(new, old)
    assert best == 1.0 and typical < 0.55
    chapter = _Chapter(
        {"old": {"launch call µs": 19.7, "GPU busy ms": 7.5}, "new": {"launch call µs": 9.4, "GPU busy ms": 3.0}}
    )
    label = {
        t["metric"]: ("moved" if t["moved"] else "host" if t["host"] else "noise")
        for t in drift.compare(chapter, new, old).timing
    }
    assert label == {"launch call µs": "host", "GPU busy ms": "moved"}


def test_the_nightly_keeps_a_fast_host_run_against_a_slow_host_one(capsys):
    """A new run with a slow-host note does not replace a published run without one, unless
    --accept-slow-host; a published run from before the record (no host_slow) is replaced."""
    from labsupport.ops import nightly

    def run(run_id, notes):
        r = _Run([])
        r.run_id = run_id
        if notes is not None:
            r.results["host_slow"] = notes
        return r

    slow = [{"what": "decode step", "fast_trials": 4, "trials": 36, "best_probe_ms": 7.0}]
    new = {"a": run("new", slow), "b": run("new", slow), "c": run("new", []), "d": run("new", slow)}
    baseline = {"a": run("pub", []), "b": run("pub", None), "c": run("pub", [])}
    assert nightly.kept_published(new, baseline, accept_slow_host=False) == {"a"}
    out = capsys.readouterr().out
    assert out.count("kept the published run") == 1 and "a: kept the published run pub" in out
    assert nightly.kept_published(new, baseline, accept_slow_host=True) == set()
    assert hostprobe.slow_host({}) is None and hostprobe.slow_host({"host_slow": slow})


def test_the_page_says_a_run_kept_too_few_fast_host_trials():
    """A run that records its slow-host measurements: the page says so from the note, and a run
    whose notes are empty says its numbers come from the host's fast speed, bimodal readings or not."""
    from labsupport.chapters import data_files

    bimodal = [{"at": "a", "ms": 7.0, "t_s": 0}, {"at": "b", "ms": 14.0, "t_s": 60}]
    slow = _Run(bimodal)
    slow.results["host_slow"] = [{"what": "decode step", "fast_trials": 4, "trials": 36, "best_probe_ms": 7.0}]
    fast = _Run(bimodal)
    fast.results["host_slow"] = []
    assert "kept fewer than 10 trials on a fast host" in data_files.host_text(slow)
    assert "A slow host" in data_files.host_banner(slow).data and "median of the trials" in (
        data_files.host_banner(slow).data
    )
    assert "at its fast speed" in data_files.host_text(fast) and data_files.host_banner(fast).data == ""


def test_the_command_line_hands_accept_slow_host_to_the_nightly(monkeypatch):
    from labsupport import __main__ as cli
    from labsupport.ops import nightly

    seen = []
    monkeypatch.setattr(nightly, "main", lambda *a, **kw: seen.append(kw["accept_slow_host"]) or 0)
    assert cli.main(["nightly", "--accept-slow-host"]) == 0 and cli.main(["nightly"]) == 0
    assert seen == [True, False]


class _TrialRun:
    """The part of a run that data_files.slow_tables reads: its files and their tables."""

    def __init__(self, names, results=None):
        self.tables = {n: pd.read_csv(TRIALS / f"{n}.csv") for n in names}
        self.meta = {"files": {f"{n}.csv": "" for n in names}}
        self.results = results or {}

    def table(self, name):
        return self.tables[name]


TRIALS = Path(__file__).resolve().parent / "fixtures" / "host_trials"


def test_a_measurement_taken_wholly_on_a_slow_host_is_named_against_the_runs_best_trial():
    """Real trials of one H100 run: the eager step's all read 13.5 ms or more, the plain script's
    from 7.08 ms. Judged by the run's quickest trial reading, the eager step is named; alone, judged
    by its own best, it is not; every batch size of Why a GPU's sweep is named against its own."""
    from labsupport.chapters import data_files

    both = data_files.slow_tables(_TrialRun(["step_times", "plain_eager_step"]))
    assert both == (
        "the trials of step_times.csv were taken while the host probe read well above its quickest trial "
        "reading in the run, 7.08 ms"
    )
    assert data_files.slow_tables(_TrialRun(["step_times"])) == ""
    assert data_files.slow_tables(_TrialRun(["plain_eager_step"])) == ""
    sweep = data_files.slow_tables(_TrialRun(["batch_times"]))
    assert sweep.startswith("the trials of batch_times.csv (all 12 measurements) were taken") and "8.51 ms" in sweep


def test_a_run_whose_harness_judged_by_the_runs_best_keeps_its_own_verdict():
    """The trial tables judge only the runs recorded before the harness judged each measurement by the
    run's best reading so far: one recorded since retried what was slow and noted it in host_slow, and
    its fast-host band is not judged again against a reading taken later in the run (an H100 run in the
    host's fast mode, probe 6.3-8.5 ms, had its eager step named slow against a later 6.32 ms)."""
    from labsupport.chapters import data_files

    judged = _TrialRun(["step_times", "plain_eager_step"], results={"method": harness.method()})
    assert harness.judged_by_run_best(judged.results) and data_files.slow_tables(judged) == ""
    before = _TrialRun(["step_times", "plain_eager_step"], results={"method": {"wall_times": "probe within 15%"}})
    assert not harness.judged_by_run_best(before.results) and data_files.slow_tables(before).startswith("the trials")
