"""The analysis of chapters 1-4 and 6 on their recorded H200 runs (and, for chapters 1-3, on
new-style runs built from them), and the order in which chapters 1-3 measure (on a CPU)."""
import math
import re
import shutil

import pandas as pd
import pytest
import torch

from labsupport import chapters, runs
from labsupport.chapters import model_code_to_kernels as code_to_kernels, where_kernels_come_from as kernel_sources, kernels_in_one_token as one_token, what_a_kernel, why_a_gpu
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
