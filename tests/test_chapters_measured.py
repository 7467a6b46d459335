"""The analysis of chapters 1 and 6 on their recorded H200 runs (and, for chapter 1, on new-style
runs built from them), and the order in which chapter 1 measures (on a CPU); chapters 2-4 have
their own test files."""
import shutil

import pandas as pd
import pytest
import torch

from labsupport import chapters, runs
from labsupport.chapters import model_code_to_kernels as code_to_kernels, launch_overhead, kernels_in_one_token as one_token, why_a_gpu
from labsupport.measure import hardware, harness
from labsupport.traces import kernels
from labsupport.ops import status


@pytest.fixture(scope="module")
def run_of():
    return lambda module: module.load()


# Helpers: runs derived from the recorded ones, and the order of a record() --------------

def derived_run(run, root, tables=None, extra=None):
    """A copy of `run` under `root` with some tables replaced or added (new-style tables built
    from the recorded ones) and results added."""
    tables = tables or {}
    with runs.RunWriter(run.chapter, run.parameters, run.run_id, root=root,
                        meta={"provenance": run.provenance}) as w:
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


# Why a GPU ------------------------------------------------------------------------------

def test_per_token_arithmetic(run_of):
    run = run_of(why_a_gpu)
    ar = why_a_gpu.arithmetic(run).set_index("ceilings")
    sheet = ar.loc["H200 SXM datasheet"]
    assert sheet["math ms"] == pytest.approx(2 * 7_568_097_280 / 989e12 * 1e3)
    assert sheet["memory ms"] == pytest.approx(15_136_811_008 / 4.8e12 * 1e3)
    assert sheet["ridge FLOP/byte"] == pytest.approx(989 / 4.8)
    measured = ar.loc["measured on this GPU"]
    lim = hardware.run_limits(run)
    assert measured["TB/s"] == pytest.approx(lim.read_or_copy_tbs) and measured["TFLOP/s"] == pytest.approx(lim.gemm_tflops)
    if lim.read_tbs is None:  # a run from before the read stream: the copy is the memory ceiling
        assert measured["TB/s"] == pytest.approx(why_a_gpu.ceilings(run).copy_tbs)
        assert "device-to-device copy" in why_a_gpu.memory_ceiling_text(run)
    assert (ar["memory / math"] > 50).all()


def test_matvec_rates_of_the_recorded_run(run_of):
    run = run_of(why_a_gpu)
    mv = why_a_gpu.matvec(run)
    assert (mv["GB/s"] == mv.bytes / (mv.ms_median * 1e-3) / 1e9).all()
    assert (mv[mv.dtype == "bfloat16"].bytes == 12288 * 4096 * 2).all()
    assert set(mv.timing) <= {why_a_gpu.KERNEL_TIME, why_a_gpu.PER_CALL, why_a_gpu.HOST_CLOCK}
    assert (mv[mv.device.str.startswith("CPU")].timing == why_a_gpu.HOST_CLOCK).all()
    m = why_a_gpu.matvec_summary(run)
    assert m.gpu_ms == (m.gpu_kernel_ms if m.gpu_kernel_ms is not None else m.gpu_call_ms)
    assert m.speedup == pytest.approx(min(m.cpu32_ms, m.cpu16_ms) / m.gpu_ms)


def new_style_matvec(run):
    """The recorded product as a new run records it: the GPU's kernel time (here the identical
    12288 x 4096 product of the chapter "From model code to kernels", profiled), its time per
    call, the CPU in float32 and BF16; rows in another order than record() writes them."""
    old = why_a_gpu.matvec(run)
    gate = code_to_kernels.load().table("mlp_kernels").query("module == 'gate = x @ W_gate'")
    kernel_ms = gate.dur_ns.sum() / 1e6
    gpu = old[old.timing == why_a_gpu.PER_CALL].iloc[0]
    kernel = {**gpu.to_dict(), "timing": why_a_gpu.KERNEL_TIME, "ms_median": kernel_ms, "ms_min": kernel_ms}
    mv = pd.concat([old, pd.DataFrame([kernel])], ignore_index=True).iloc[::-1]
    mv["GB/s"] = mv.bytes / (mv.ms_median * 1e-3) / 1e9
    return mv, kernel_ms, list(gate.name.map(kernels.short_name))


def test_matvec_kernel_time_and_per_call(run_of, tmp_path):
    run = run_of(why_a_gpu)
    if "method" in run.results:  # recorded with the harness: it has the kernel time itself
        m = why_a_gpu.matvec_summary(run)
        assert m.gpu_kernel_ms and m.gpu_ms == m.gpu_kernel_ms and m.gpu_kernel_ms <= m.gpu_call_ms
        assert m.gpu_kernel_gbs == pytest.approx(12288 * 4096 * 2 / (m.gpu_kernel_ms * 1e-3) / 1e9)
        text = why_a_gpu.matvec_text(run)
        assert "kernel time" in text and f"{m.gpu_call_ms * 1e3:.1f} µs" in text
        return
    mv, kernel_ms, names = new_style_matvec(run)
    new = derived_run(run, tmp_path, {"matvec": mv}, {"matvec_kernels": names})
    m = why_a_gpu.matvec_summary(new)
    assert m.gpu_kernel_ms == pytest.approx(kernel_ms) and m.gpu_ms == m.gpu_kernel_ms
    assert m.gpu_kernel_gbs == pytest.approx(12288 * 4096 * 2 / (kernel_ms * 1e-3) / 1e9)
    assert m.gpu_call_ms == pytest.approx(why_a_gpu.matvec_summary(run).gpu_call_ms)
    assert m.speedup == pytest.approx(min(m.cpu32_ms, m.cpu16_ms) / kernel_ms)
    text = why_a_gpu.matvec_text(new)
    assert f"{kernel_ms * 1e3:.1f} µs" in text and f"{m.gpu_call_ms * 1e3:.1f} µs" in text
    assert "kernel time" in text and names[0] in text
    # The recorded CPU was slower in BF16 than in float32: the text says float32 is the fair number.
    assert (m.cpu16_ms > m.cpu32_ms) == ("slow path" in text and "float32 is the fair CPU number" in text)
    assert "did not profile the kernel" in why_a_gpu.matvec_text(run)  # the recorded run predates it


def new_style_sweep(run):
    """The recorded sweep as a new run records it: wall min/max, clean, the profiled step's
    context, and a batch size that ran out of memory."""
    s = run.table("batch_sweep")
    s = s.assign(wall_ms_max=s.wall_ms_median + (s.wall_ms_median - s.wall_ms_min), issue_ms_median=s.wall_ms_min,
                 wall_repeats=run.parameters["steps"], wall_clean=True,
                 context_profiled=run.parameters["prompt_len"] + why_a_gpu.DECODE_WARMUP + 1)
    oom = pd.DataFrame([{"batch": 2 * int(s.batch.max()), "status": "out of memory"}])
    return pd.concat([s, oom], ignore_index=True)


def test_batch_sweep_new_columns(run_of, tmp_path):
    run = run_of(why_a_gpu)
    new = derived_run(run, tmp_path, {"batch_sweep": new_style_sweep(run)})
    s = why_a_gpu.sweep(new)
    assert (s.status == "ok").all() and len(s) == len(why_a_gpu.sweep(run))
    kv = new.results["kv_bytes_per_token"]
    assert (s.bytes == why_a_gpu.counts(new).decode_bytes + s.batch * s.context_profiled * kv).all()
    shown = why_a_gpu.sweep_display(new)
    assert list(shown["wall min–max"]) == [f"{lo:.1f}–{hi:.1f}" for lo, hi in zip(s.wall_ms_min, s.wall_ms_max)]
    assert why_a_gpu.wall_times_clean(new) and "before the process's first profile" in why_a_gpu.sweep_note(new)
    if "method" not in run.results:
        # A run recorded before the harness timed each batch size after profiling it: the page says
        # so, and shows no range.
        assert not why_a_gpu.wall_times_clean(run) and "upper bound" in why_a_gpu.sweep_note(run)
        assert "wall min–max" not in why_a_gpu.sweep_display(run)


def test_batch_sweep_and_ridge(run_of):
    run = run_of(why_a_gpu)
    s = why_a_gpu.sweep(run)
    assert list(s.batch) == run.parameters["batches"][:len(s)]
    # Operations per byte of the whole step (weights and KV cache; tests/test_why_a_gpu.py checks the parts).
    assert s["FLOP/byte"].to_numpy() == pytest.approx((s.FLOP / s.bytes).to_numpy())
    assert (s["tokens/s"] == s.batch / (s.wall_ms_median / 1e3)).all()
    assert (s["matmul ms"] <= s["GPU ms"]).all()
    r = why_a_gpu.ridge(run)
    assert r.measured_batch == pytest.approx(r.floor_ms / r.ms_per_sequence)
    assert r.ms_per_sequence == pytest.approx(s["matmul ms"].iloc[-1] / s.batch.iloc[-1])
    assert r.flat_until in set(s.batch) and r.flat_until < s.batch.max()
    assert why_a_gpu.bound_at(run, 1) == "memory-bound"
    assert r.datasheet_batch == pytest.approx(206.04, abs=0.01)
    lim = hardware.run_limits(run)
    assert r.ceilings_batch == pytest.approx(lim.gemm_tflops / lim.read_or_copy_tbs)


TINY_SWEEP = dict(preset="tiny", device="cpu", prompt_len=16, batches=[1, 2, 4], steps=2, matvec_repeats=2)


def test_why_a_gpu_times_everything_before_it_profiles(runs_root, calls):
    run = why_a_gpu.record(why_a_gpu.Params(**TINY_SWEEP), allow_cpu=True, progress=lambda m: None)
    assert_times_before_profiles(calls)
    assert [w for k, w in calls if k == "profile"] == ["decode_step"] * 3 + ["matvec"]
    s = run.table("batch_sweep")
    assert list(s.batch) == [1, 2, 4] and (s.status == "ok").all() and s.wall_clean.all()
    assert (s.wall_ms_min <= s.wall_ms_median).all() and (s.wall_ms_median <= s.wall_ms_max).all()
    p = run.parameters
    assert (s.context_end == p["prompt_len"] + why_a_gpu.DECODE_WARMUP + p["steps"]).all()
    assert (s.context_profiled == s.context_end - p["steps"] + 1).all()
    times = run.table("batch_times")
    assert len(times) == 3 * p["steps"] and times.clean.all()
    mv = why_a_gpu.matvec(run)
    assert sorted(zip(mv.timing, mv.dtype)) == sorted([(why_a_gpu.KERNEL_TIME, "bfloat16"), (why_a_gpu.PER_CALL, "bfloat16"),
                                                       (why_a_gpu.HOST_CLOCK, "float32"), (why_a_gpu.HOST_CLOCK, "bfloat16")])
    assert set(run.results["method"]) == set(harness.method())


def test_why_a_gpu_out_of_memory_stops_the_sweep(runs_root, calls, monkeypatch):
    real = why_a_gpu.time_batch

    def time_batch(model, batch, *args):
        if batch >= 2:
            raise torch.OutOfMemoryError("fake: out of memory")
        return real(model, batch, *args)

    monkeypatch.setattr(why_a_gpu, "time_batch", time_batch)
    run = why_a_gpu.record(why_a_gpu.Params(**TINY_SWEEP), allow_cpu=True, progress=lambda m: None)
    s = run.table("batch_sweep")
    assert list(zip(s.batch, s.status)) == [(1, "ok"), (2, "out of memory")], "batch 4 is skipped"
    assert [w for k, w in calls if k == "profile"] == ["decode_step", "matvec"]
    assert list(why_a_gpu.sweep(run).batch) == [1]


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


def test_batch_explorer_widget_replays_the_sweep(run_of):
    run = run_of(why_a_gpu)
    box = why_a_gpu.explorer(run)
    slider, out = box.children
    assert list(slider.options) == list(why_a_gpu.sweep(run).batch)
    assert "batch 1</b>" in out.value and "memory-bound" in out.value
    slider.value = slider.options[-1]
    assert f"batch {slider.options[-1]}</b>" in out.value and "compute-bound" in out.value
