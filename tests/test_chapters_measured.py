"""The analysis of chapters 1-4 and 6 on their recorded H200 runs (and, for chapters 1-3, on
new-style runs built from them), and the order in which chapters 1-3 measure (on a CPU)."""
import math
import re
import shutil

import pandas as pd
import pytest
import torch

from labsupport import chapters, runs
from labsupport.chapters import model_code_to_kernels as code_to_kernels, where_kernels_come_from as kernel_sources, launch_overhead, kernels_in_one_token as one_token, what_a_kernel, why_a_gpu
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


def torch_rmsnorm(x, w, eps=1e-6):
    """Stand-in for our Triton RMSNorm on a CPU (Triton's interpreter has no bfloat16)."""
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * w


# What a kernel is -----------------------------------------------------------------------

def test_vector_add_launches(run_of):
    run = run_of(what_a_kernel)
    k = what_a_kernel.add_kernels(run)
    cfg = what_a_kernel.launch_config(k).assign(impl=k.implementation.values)
    assert list(cfg.impl) == ["torch (a + b)", "ours (Triton)"], "one kernel each"
    n, block, warps = (run.parameters[p] for p in ("n", "block", "num_warps"))
    assert (cfg.threads == cfg.blocks * cfg["threads per block"]).all()
    ours = cfg.iloc[1]
    assert ours.kernel == "add_kernel" and kernels.source(k.name.iloc[1]) == "Triton (ours)"
    assert ours.blocks == math.ceil(n / block) and ours["threads per block"] == warps * 32
    torch_row = cfg.iloc[0]
    assert "CUDAFunctor_add" in torch_row.kernel and n % torch_row.threads == 0  # each thread: n/threads pairs
    assert run.results["triton_matches_torch"] is True
    assert set(k.kind) == {"elementwise"}, "kinds by today's rules"


def test_launch_config_without_launch_dimensions():
    empty = pd.DataFrame(columns=["name", "grid", "block", "registers", "dur_ns"])
    assert what_a_kernel.launch_config(empty).empty
    odd = pd.DataFrame({"name": ["a", "b", "c"], "grid": ["", None, "4,2,1"], "block": ["128,1,1", "odd", "32"],
                        "registers": [1, 2, 3], "dur_ns": [1, 2, 3]})
    cfg = what_a_kernel.launch_config(odd)
    assert cfg.blocks.isna().tolist() == [True, True, False] and cfg.threads.isna().tolist() == [True, True, False]
    assert cfg.blocks.iloc[2] == 8 and cfg["threads per block"].iloc[0] == 128 and cfg.threads.iloc[2] == 256


def test_the_queue(run_of):
    run = run_of(what_a_kernel)
    q = run.table("queue")
    assert len(q) == run.parameters["burst"]
    assert (q.call_return_us >= q.call_start_us).all() and q.gpu_done_us.is_monotonic_increasing
    s = what_a_kernel.queue_summary(run)
    assert s["host_issue_all_ms"] < s["gpu_done_all_ms"] <= s["host_sync_returned_ms"] + 1e-3
    assert 0 < s["queue_depth_at_last_launch"] <= run.parameters["burst"]
    assert s["add_mb"] == 3 * run.parameters["burst_n"] * 4 / 1e6
    bk = what_a_kernel.burst_kernels(run)
    assert len(bk) == 40 and (bk.launch_ns <= bk.start_ns).all()


def test_l2_and_the_add_out_of_the_cache(run_of, tmp_path):
    """A new-style run built from the recorded one: the L2 size the GPU reports, the ceilings
    (the H200's, as recorded by "Why a GPU") and the add on vectors far larger than L2 (here the
    burst's recorded adds, 805 MB each)."""
    run = run_of(what_a_kernel)
    if "method" in run.results:  # recorded with the harness: the L2 size and the add out of the cache
        c, h = what_a_kernel.cache(run), what_a_kernel.hbm_add(run)
        assert c.l2_bytes > 0 and c.fits == (c.working_set_bytes <= c.l2_bytes)
        assert h is not None and (h["GB/s"] > 0).all()
        assert "L2" in what_a_kernel.l2_text(run) and "GB/s" in what_a_kernel.hbm_text(run)
        return
    assert what_a_kernel.cache(run).l2_bytes is None and what_a_kernel.hbm_add(run) is None
    assert "did not record the cache's size" in what_a_kernel.l2_text(run)
    assert "did not time an add larger" in what_a_kernel.hbm_text(run)
    q = what_a_kernel.queue_summary(run)
    n = run.parameters["burst_n"]
    ms = q["gpu_per_add_us"] / 1e3
    hbm = pd.DataFrame([{"implementation": impl, "n": n, "ms_median": ms, "ms_min": ms, "ms_max": ms, "repeats": 1,
                         "bytes": 3 * n * 4, "clean": True} for impl in (what_a_kernel.TORCH_ADD, what_a_kernel.OUR_ADD)])
    l2 = 50 * 2**20
    ceilings = why_a_gpu.load().table("ceilings")
    new = derived_run(run, tmp_path, {"hbm_add": hbm, "ceilings": ceilings}, {"l2_cache_bytes": l2})
    c = what_a_kernel.cache(new)
    assert c.working_set_bytes == 3 * run.parameters["n"] * 4 and c.fits
    h = what_a_kernel.hbm_add(new)
    assert h["GB/s"].iloc[0] == pytest.approx(q["add_tbs"] * 1e3)
    assert h["of datasheet"].iloc[0] == pytest.approx(h["GB/s"].iloc[0] / 4800)
    lim = hardware.run_limits(new)
    assert h["of measured copy"].iloc[0] == pytest.approx(h["GB/s"].iloc[0] / (lim.copy_tbs * 1e3))
    text = what_a_kernel.hbm_text(new)
    assert f"{h['GB/s'].iloc[0]:,.0f} GB/s" in text and "datasheet" in text and "copy" in text
    l2_text = what_a_kernel.l2_text(new)
    assert "50 MiB L2 cache" in l2_text
    kernel_gbs = what_a_kernel.add_table(new)["GB/s during the kernel"].iloc[0]
    assert ("faster than the H200 SXM datasheet" in l2_text) == (kernel_gbs > 4800)
    small = derived_run(run, tmp_path / "small", extra={"l2_cache_bytes": 2**20})
    assert not what_a_kernel.cache(small).fits and "larger than this GPU's" in what_a_kernel.l2_text(small)


def test_what_a_kernel_times_everything_before_it_profiles(runs_root, calls, monkeypatch):
    from labsupport.measure import decode, triton_kernels
    monkeypatch.setattr(decode, "require_device", lambda device, allow_cpu=False: device)
    monkeypatch.setattr(triton_kernels, "add", lambda a, b, block=1024, num_warps=4: a + b)
    params = what_a_kernel.Params(n=4096, hbm_n=8192, burst_n=1024, repeats=3, device="cpu")
    run = what_a_kernel.record(params, progress=lambda m: None)
    assert_times_before_profiles(calls)
    assert [w for k, w in calls if k == "profile"] == ["torch add", "triton add", "burst"]
    h = run.table("hbm_add")
    assert list(h.implementation) == [what_a_kernel.TORCH_ADD, what_a_kernel.OUR_ADD] and (h.n == 8192).all()
    assert (h.bytes == 3 * 8192 * 4).all() and h.clean.all()
    assert len(run.table("sync")) == 3 and run.table("add_times").clean.all()
    assert set(what_a_kernel.add_kernels(run).implementation) == {what_a_kernel.TORCH_ADD, what_a_kernel.OUR_ADD}


def test_the_queue_refuses_after_a_profile(monkeypatch):
    monkeypatch.setattr(harness, "profiled", lambda: True)
    with pytest.raises(harness.TimingError, match="the queue"):
        what_a_kernel.measure_queue(2, 16)


# From model code to kernels -------------------------------------------------------------

def test_mlp_lines_and_kernels(run_of):
    run = run_of(code_to_kernels)
    t = code_to_kernels.mlp_table(run)
    assert list(t.line) == list(code_to_kernels.MLP_LINES)
    k = run.table("mlp_kernels")
    kinds = k.groupby("module").kind.apply(set)
    assert kinds["gate = x @ W_gate"] == {"matrix multiply"} and kinds["up = x @ W_up"] == {"matrix multiply"}
    assert kinds["h = silu(gate) * up"] == {"elementwise"}
    assert t.kernels.iloc[2] == 2, "silu and the multiply are two kernels"
    assert t["MB moved"].iloc[0] == pytest.approx((12288 * 4096 + 4096 + 12288) * 2 / 1e6)


def test_rmsnorm_as_written_and_fused(run_of):
    run = run_of(code_to_kernels)
    as_written = code_to_kernels.rmsnorm_kernels(run)
    assert list(as_written.kind) == ["copy/convert/concat", "elementwise", "reduction", "elementwise",
                                     "elementwise", "elementwise", "copy/convert/concat", "elementwise"]
    assert list(as_written.step) == [step for _, step in code_to_kernels.RMSNORM_AS_WRITTEN]
    t = code_to_kernels.rmsnorm_table(run).set_index("variant")
    ours = t.loc["ours (one Triton kernel)"]
    assert ours.kernels == 1 and ours["max |difference|"] < 0.05
    assert ours["GPU µs (profiler)"] < t.loc["transformers (as written)", "GPU µs (profiler)"]


def test_code_to_kernels_times_everything_before_it_profiles(runs_root, calls, monkeypatch):
    from labsupport.measure import triton_kernels
    monkeypatch.setattr(triton_kernels, "rmsnorm", torch_rmsnorm)
    run = code_to_kernels.record(code_to_kernels.Params(preset="tiny", repeats=3, device="cpu"), allow_cpu=True,
                                 progress=lambda m: None)
    assert_times_before_profiles(calls)
    assert [w for k, w in calls if k == "profile"] == ["mlp"] + ["rmsnorm"] * 3
    times = run.table("rmsnorm_times")
    assert list(times.columns) == ["variant", "kernels", "us_median", "us_min", "us_max", "max_abs_diff_vs_transformers"]
    assert (times.us_min <= times.us_median).all() and (times.us_median <= times.us_max).all()
    k = run.table("rmsnorm_kernels")
    assert list(times.kernels) == [int((k.variant == v).sum()) for v in times.variant]
    assert set(code_to_kernels.mlp_table(run).line) == set(code_to_kernels.MLP_LINES)
    mlp = run.results["mlp"]
    assert mlp["ms_min"] <= mlp["ms_median"] <= mlp["ms_max"]


def test_operator_to_kernel_table(run_of):
    decode = one_token.load()
    table = code_to_kernels.op_to_kernels(decode, one_token.middle_layer(decode))
    assert table.kernels.sum() == one_token.summary(decode).kernels_per_layer
    assert {"self_attn.q_proj", "mlp.down_proj", "input_layernorm"} <= set(table.module)


# Where kernels come from ----------------------------------------------------------------

def test_every_recorded_kernel_has_a_known_source():
    for chapter_run, table in ((one_token.load(), "kernels"), (code_to_kernels.load(), "mlp_kernels"),
                               (what_a_kernel.load(), "add_kernels"), (kernel_sources.load(), "fusion_kernels")):
        names = set(chapter_run.table(table).name)
        assert not [n for n in names if kernels.source(n) == "other"], table


def test_decode_step_by_source():
    k = one_token.kernel_table(one_token.load())
    src = kernel_sources.by_source(k)
    assert src.kernels.sum() == len(k)
    assert set(src.index) == {"cuBLAS/cuBLASLt", "cuDNN", "PyTorch (ATen)"}
    assert src.loc["cuBLAS/cuBLASLt", "kernels"] == (k.kind == "matrix multiply").sum()
    assert src["share of GPU time"].sum() == pytest.approx(1.0)


def test_fusion_and_generated_source(run_of):
    run = run_of(kernel_sources)
    f = kernel_sources.fusion_kernels(run)
    eager, compiled = f[f.variant == "eager (as written)"], f[f.variant == "torch.compile"]
    assert len(eager) == 8 and set(eager.source) == {"PyTorch (ATen)"}
    assert len(compiled) == 1 and compiled.source.iloc[0] == "Triton (torch.compile)"
    assert re.match(r"triton_\w+_fused_", compiled.kernel.iloc[0])
    excerpt = kernel_sources.fused_kernel_excerpt(run)
    assert excerpt.startswith("@triton.jit") and "def triton_" in excerpt and "tl.load" in excerpt
    assert run.results["fusion_max_abs_diff"] < 0.05


def test_attention_backends(run_of):
    a = kernel_sources.attention_backends(run_of(kernel_sources))
    assert set(a.backend) == set(kernel_sources.BACKENDS)
    ok = a[a.status == "ok"].set_index(["backend", "context"])
    assert "cuDNN" in ok.loc[("CUDNN_ATTENTION", 256), "source"]
    assert "FlashAttention" in ok.loc[("FLASH_ATTENTION", 256), "source"]
    assert "PyTorch (ATen)" in ok.loc[("EFFICIENT_ATTENTION", 256), "source"]
    assert ok.loc[("MATH", 256), "kernels"] > 3 and "cuBLAS" in ok.loc[("MATH", 256), "source"]
    assert (ok.max_abs_diff < 0.05).all()


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
