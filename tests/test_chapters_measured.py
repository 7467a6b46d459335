"""The analysis of chapters 1 and 6 on their recorded H200 runs (and, for chapter 1, on new-style
runs built from them), and the order in which chapter 1 measures (on a CPU); chapters 2-4 have
their own test files."""

import shutil

import pytest

from labsupport import chapters, runs
from labsupport.chapters import kernels_in_one_token as one_token
from labsupport.chapters import launch_overhead
from labsupport.measure import hardware, harness
from labsupport.ops import status


@pytest.fixture(scope="module")
def run_of():
    return lambda module: module.load()


# Helpers: runs derived from the recorded ones, and the order of a record() --------------


def derived_run(run, root, tables=None, extra=None):
    """A copy of `run` under `root` with some tables replaced or added (new-style tables built
    from the recorded ones) and results added."""
    tables = tables or {}
    with runs.RunWriter(run.chapter, run.parameters, run.run_id, root=root, meta={"provenance": run.provenance}) as w:
        for name in run.meta["files"]:
            if name.endswith(".csv"):
                if name[:-4] not in tables:
                    w.write_table(name[:-4], run.table(name[:-4]))
            else:
                shutil.copy(run.path / name, w.path / name)
        for name, df in tables.items():
            w.write_table(name, df)
        w.extra.update({**run.results, **(extra or {})})
    return runs.load_run(run.chapter, run.run_id, root=root)


@pytest.fixture
def calls(monkeypatch):
    """Every time_region and profile_region call, in order, as ("time"/"profile", what)."""
    order = []
    real_time, real_profile = harness.time_region, harness.profile_region

    def time_region(fn, *, what, **kw):
        order.append(("time", what))
        return real_time(fn, what=what, **kw)

    def profile_region(fn, path, *, region, **kw):
        order.append(("profile", region))
        return real_profile(fn, path, region=region, **kw)

    monkeypatch.setattr(harness, "time_region", time_region)
    monkeypatch.setattr(harness, "profile_region", profile_region)
    return order


def assert_times_before_profiles(order):
    kinds = [k for k, _ in order]
    assert "time" in kinds and "profile" in kinds
    first_profile = kinds.index("profile")
    assert "time" not in kinds[first_profile:], f"a time after a profile: {order[first_profile:]}"


# Launch overhead ------------------------------------------------------------------------


def test_the_fixes_table(run_of):
    run = run_of(launch_overhead)
    v = launch_overhead.variants(run).set_index("variant")
    V = launch_overhead.VARIANTS
    assert list(v.index) == list(V.values()) and (v.status == "ok").all()
    eager = v.loc[V["eager"]]
    assert eager["launch calls"] == eager.kernels, "eager: one launch call per kernel"
    assert v.loc[V["cuda-graph"], "launch calls"] == 1
    assert v.loc[V["compile-reduce-overhead"], "kernels"] < eager.kernels
    assert (v["of datasheet limit"] < 1).all() and (v[launch_overhead.measured_column(run)] < 1).all()
    assert (v["tokens/s"] == 1e3 / v["wall ms"]).all()
    sheet = hardware.datasheet("NVIDIA H200")
    assert eager["of datasheet limit"] == pytest.approx(15_136_811_008 / (eager["wall ms"] / 1e3) / 4.8e12)
    assert sheet.bandwidth_tbs == 4.8


def test_breakdown_adds_up(run_of):
    b = launch_overhead.breakdown(run_of(launch_overhead))
    parts = b[["before first kernel ms", "kernels running ms", "gaps between kernels ms", "after last kernel ms"]]
    assert (parts.sum(axis=1) - b["profiled step ms"]).abs().max() < 1e-9
    assert (parts >= 0).all().all()


def test_eager_summary_and_layer_labels(run_of):
    run = run_of(launch_overhead)
    e = launch_overhead.eager_summary(run)
    assert e.kernels == 2218 == launch_overhead.kernel_table(run, "eager").shape[0]
    assert e.gpu_busy_ms < e.wall_ms and e.issue_ms <= e.wall_ms
    k = launch_overhead.kernel_table(run, "eager")
    sel, what = launch_overhead.one_layer(k, 36)
    assert what.startswith("decoder layer") and len(sel) == one_token.summary(one_token.load()).kernels_per_layer


# The status page --------------------------------------------------------------------------


def test_status_page_data():
    t = status.published_table()
    # A run whose notebook was interrupted after it recorded has no notebook time: shown empty.
    assert len(t) == len(chapters.CHAPTERS) and (t["notebook s"].dropna() > 0).all()
    assert (t.run == [runs.published_run_id(c) for c in t.chapter]).all()
    assert "No structural change" in status.latest_drift()
    fig = status.history_figure("test")
    assert len([a for a in fig.axes if a.get_visible()]) >= 6
