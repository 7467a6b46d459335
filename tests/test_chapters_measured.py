"""The analysis of chapters 1-4 and 6 on their recorded H200 runs."""
import math
import re

import pytest

from labsupport import (chapters, code_to_kernels, hardware, kernel_sources, kernels, launch_overhead, one_token, runs,
                        status, what_a_kernel, why_a_gpu)


@pytest.fixture(scope="module")
def run_of():
    return lambda module: module.load()


# Why a GPU ------------------------------------------------------------------------------

def test_per_token_arithmetic(run_of):
    run = run_of(why_a_gpu)
    ar = why_a_gpu.arithmetic(run).set_index("ceilings")
    sheet = ar.loc["H200 SXM datasheet"]
    assert sheet["math ms"] == pytest.approx(2 * 7_568_097_280 / 989e12 * 1e3)
    assert sheet["memory ms"] == pytest.approx(15_136_811_008 / 4.8e12 * 1e3)
    assert sheet["ridge FLOP/byte"] == pytest.approx(989 / 4.8)
    measured = ar.loc["measured on this GPU"]
    c = why_a_gpu.ceilings(run)
    assert measured["TB/s"] == pytest.approx(c.copy_tbs) and measured["TFLOP/s"] == pytest.approx(c.gemm_tflops)
    assert (ar["memory / math"] > 50).all()


def test_matvec_rates(run_of):
    mv = run_of(why_a_gpu).table("matvec")
    assert list(mv.dtype) == ["bfloat16", "float32", "bfloat16"]
    assert (mv["GB/s"] == mv.bytes / (mv.ms_median * 1e-3) / 1e9).all()
    assert mv.bytes.iloc[0] == 12288 * 4096 * 2


def test_batch_sweep_and_ridge(run_of):
    run = run_of(why_a_gpu)
    s = why_a_gpu.sweep(run)
    assert list(s.batch) == run.parameters["batches"][:len(s)]
    assert (s["FLOP/byte"].round(6) == (s.batch * 7_568_097_280 * 2 / (7_568_097_280 * 2)).round(6)).all()
    assert (s["tokens/s"] == s.batch / (s.wall_ms_median / 1e3)).all()
    assert (s["matmul ms"] <= s["GPU ms"]).all()
    r = why_a_gpu.ridge(run)
    assert r.measured_batch == pytest.approx(r.floor_ms / r.ms_per_sequence)
    assert r.ms_per_sequence == pytest.approx(s["matmul ms"].iloc[-1] / s.batch.iloc[-1])
    assert r.flat_until in set(s.batch) and r.flat_until < s.batch.max()
    assert why_a_gpu.bound_at(run, 1) == "memory-bound"
    assert r.datasheet_batch == pytest.approx(206.04, abs=0.01)


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


def test_the_queue(run_of):
    run = run_of(what_a_kernel)
    q = run.table("queue")
    assert len(q) == run.parameters["burst"]
    assert (q.call_return_us >= q.call_start_us).all() and q.gpu_done_us.is_monotonic_increasing
    s = what_a_kernel.queue_summary(run)
    assert s["host_issue_all_ms"] < s["gpu_done_all_ms"] <= s["host_sync_returned_ms"] + 1e-3
    assert 0 < s["queue_depth_at_last_launch"] <= run.parameters["burst"]
    bk = what_a_kernel.burst_kernels(run)
    assert len(bk) == 40 and (bk.launch_ns <= bk.start_ns).all()


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
    assert (v["of datasheet limit"] < 1).all() and (v["of measured copy"] < 1).all()
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
    assert len(t) == len(chapters.CHAPTERS) and t["notebook s"].notna().all()
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
