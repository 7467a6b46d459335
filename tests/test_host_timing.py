"""Host-timed numbers: variants timed interleaved in rounds, reported by the minimum with the
quartiles, and the host probe read around them (labsupport.measure.harness, hostprobe)."""

from __future__ import annotations

import time

import pytest

from labsupport.measure import harness, hostprobe


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


def test_a_slow_phase_moves_the_median_and_not_the_minimum():
    """Two trials in three on a host twice as slow: the minimum stays at the work's own cost."""
    calls = {"n": 0}

    def work():
        calls["n"] += 1
        time.sleep(0.004 if calls["n"] % 3 else 0.002)

    t = harness.interleaved({"work": work}, device="cpu", rounds=20, warmup=0)["work"]
    assert t.estimate == t.low == min(t.wall_ms)
    assert t.low < 3.5 < t.median
    s = t.summary()
    assert s["wall_ms_min"] <= s["wall_ms_q1"] <= s["wall_ms_median"] <= s["wall_ms_q3"] <= s["wall_ms_max"]


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
    8-10 ms at the night's best), or its own slowest reading against its quickest."""
    from labsupport import runs
    from labsupport.chapters import data_files

    run = runs.load_run("what-a-kernel")
    if "host_probe" not in run.results:
        return  # a run recorded before the probe
    own = hostprobe.assess(run.results["host_probe"])
    best = data_files.host_reference_ms(run)
    assert best is not None and best <= own.best_ms
    text = data_files.host_text(run)
    slow = own.median_ms >= hostprobe.SLOW * best or own.worst_ms >= hostprobe.SLOW * own.best_ms
    assert ("slower than usual" in text) == slow
