"""Chapter "From model code to kernels": the analysis on its recorded H200 run and on the
recorded decode step it reads (tests/fixtures), and the notebook's measuring cells run live on
a CPU (tiny model) to check that every time is taken before a profile."""

import functools
import math

import pytest
import torch

from labsupport.chapters import model_code_to_kernels as ch
from labsupport.measure import decode, environment, harness
from labsupport.measure.kernels import triton_kernels

from .conftest import FIXTURES, fixture_run
from .notebook_cells import assert_times_before_profiles, run_live
from .page_names import prose_names, unglued

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def run():
    return fixture_run(ch.CHAPTER)


def torch_rmsnorm(x, w, eps=1e-6):
    """Stand-in for our Triton RMSNorm on a CPU (Triton's interpreter has no bfloat16)."""
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * w


def test_mlp_lines_and_kernels(run):
    t = ch.mlp_table(run).set_index("line")
    assert list(t.index) == list(ch.MLP_LINES)
    kinds = run.table("mlp_kernels").groupby("module").kind.apply(set)
    assert kinds[ch.GATE] == {"matrix multiply"} and kinds[ch.UP] == {"matrix multiply"}
    assert kinds[ch.ACT] == {"elementwise"}
    assert t.loc[ch.ACT, "kernels"] == 2, "silu and the multiply are two kernels"
    assert t.loc[ch.GATE, "MB moved"] == pytest.approx((12288 * 4096 + 4096 + 12288) * 2 / 1e6)
    assert t.loc[ch.ACT, "MB moved"] == pytest.approx(3 * 12288 * 2 / 1e6)


def test_rmsnorm_as_written_and_fused(run):
    as_written = ch.rmsnorm_kernels(run)
    assert list(as_written.kind) == [
        "copy/convert/concat",
        "elementwise",
        "reduction",
        "elementwise",
        "elementwise",
        "elementwise",
        "copy/convert/concat",
        "elementwise",
    ]
    assert list(as_written.step) == [step for _, step in ch.RMSNORM_AS_WRITTEN]
    assert "step" not in ch.rmsnorm_kernels(run, ch.OURS), "one kernel: no steps to name"
    t = ch.rmsnorm_table(run).set_index("variant")
    assert set(t.index) == {ch.AS_WRITTEN, ch.F_RMS_NORM, ch.OURS}
    ours = t.loc[ch.OURS]
    assert ours.kernels == 1 and ours["max |difference|"] < 0.05
    assert ours["GPU µs (profiler)"] < t.loc[ch.AS_WRITTEN, "GPU µs (profiler)"]
    h = ch.headline(run)
    times = run.table("rmsnorm_times").set_index("variant")
    assert h["RMSNorm kernels"] == t.loc[ch.AS_WRITTEN, "kernels"] == 8
    assert h["fused RMSNorm µs"] == times.loc[ch.OURS, "us_min"], "the minimum: the book's estimator"
    assert (t["per call µs (CUDA events)"] == times.us_min.reindex(t.index)).all()
    assert (t["median µs"] == times.us_median.reindex(t.index)).all()
    assert h["MLP kernels"] == len(run.table("mlp_kernels"))


def test_operator_to_kernel_table():
    decode_run = fixture_run(ch.DECODE_CHAPTER)
    k = ch.decode_kernels(decode_run)
    assert len(k) == len(decode_run.table("kernels"))
    layer = ch.middle_layer(decode_run)
    assert layer == decode_run.results["model"]["layers"] // 2
    table = ch.op_to_kernels(k, layer)
    assert table.kernels.sum() == (k.layer == layer).sum() == ch.kernels_per_layer(k)
    assert {"self_attn.q_proj", "mlp.down_proj", "input_layernorm"} <= set(table.module)


@pytest.mark.live
def test_the_notebook_times_everything_before_it_profiles(runs_root, calls, monkeypatch):
    real, interleaved = harness.interleaved, []

    def watch(variants, **kw):
        calls.append(("time", kw["what"]))
        interleaved.append(list(variants))
        return real(variants, **kw)

    monkeypatch.setattr(harness, "interleaved", watch)
    monkeypatch.setattr(decode, "require_device", lambda device, allow_cpu=False: device)
    monkeypatch.setattr(triton_kernels, "rmsnorm", torch_rmsnorm)
    monkeypatch.setattr(ch, "Params", functools.partial(ch.Params, device="cpu"))
    monkeypatch.setattr(environment, "check", lambda *a, **k: [])  # a CPU stands in for the GPU
    run = run_live("model_code_to_kernels.ipynb", preset="tiny", repeats=3)
    assert_times_before_profiles(calls)
    assert [w for k, w in calls if k == "profile"] == ["mlp"] + ["rmsnorm"] * 3
    times = run.table("rmsnorm_times")
    assert list(times.columns) == [
        "variant",
        "kernels",
        "us_median",
        "us_min",
        "us_q1",
        "us_q3",
        "us_max",
        "max_abs_diff_vs_transformers",
    ]
    assert interleaved == [["mlp", ch.AS_WRITTEN, ch.F_RMS_NORM, ch.OURS]], "one interleaved timing of all four"
    assert list(times.variant) == [ch.AS_WRITTEN, ch.F_RMS_NORM, ch.OURS]
    assert (times.us_min <= times.us_q1).all() and (times.us_q1 <= times.us_median).all()
    assert (times.us_median <= times.us_q3).all() and (times.us_q3 <= times.us_max).all()
    k = run.table("rmsnorm_kernels")
    assert list(times.kernels) == [int((k.variant == v).sum()) for v in times.variant]
    assert set(ch.mlp_table(run).line) == set(ch.MLP_LINES)
    assert set(run.table("mlp_kernels").module) >= set(ch.MLP_LINES), "each line's kernels under its annotation"
    mlp = run.results["mlp"]
    assert mlp["ms_min"] <= mlp["ms_median"] <= mlp["ms_max"]


def test_the_answer_comes_before_the_measuring_code():
    import json

    from .conftest import REPO

    nb = json.loads((REPO / "notebooks" / "model_code_to_kernels.ipynb").read_text())
    md = [
        i for i, c in enumerate(nb["cells"]) if c["cell_type"] == "markdown" and "## The answer" in "".join(c["source"])
    ]
    live = next(i for i, c in enumerate(nb["cells"]) if 'if mode == "live":' in "".join(c["source"]))
    assert len(md) == 1 and md[0] < live


# The page ------------------------------------------------------------------------------------


def test_the_page_quotes_the_runs_tables(run):
    page = ch.page(run, root=FIXTURES)
    kernels = run.table("mlp_kernels")
    times = run.table("rmsnorm_times").set_index("variant")
    by_line = kernels.groupby("module")
    assert page.mlp_kernels == len(kernels) and page.ew_kernels == by_line.size()[ch.ACT] == 2
    assert page.mlp_us == pytest.approx(kernels.dur_ns.sum() / 1e3)
    assert page.gemm_us == pytest.approx(by_line.dur_ns.sum()[ch.GATE] / 1e3)
    assert page.tk_gemm_share == pytest.approx(1 - by_line.dur_ns.sum()[ch.ACT] / kernels.dur_ns.sum())
    assert page.rms_us == times.loc[ch.AS_WRITTEN, "us_min"] and page.fused_us == times.loc[ch.OURS, "us_min"]
    assert page.tk_call_saved == pytest.approx(times.loc[ch.AS_WRITTEN, "us_min"] - times.loc[ch.OURS, "us_min"])
    assert (page.rms_kernels, page.fused_kernels) == (8, 1) and page.fused_err == 0.0
    assert page.rms_gpu_speedup == pytest.approx(page.rms_gpu_us / page.fused_gpu_us)
    assert page.tokens == run.parameters["tokens"] and page.matrices_dtype.startswith("BF16")
    # one cuBLAS kernel per matrix multiply in this run (no split-K pair)
    assert page.gemm_kernels == 1 and page.gemm_text.startswith(
        "Each matrix multiply is one kernel from cuBLAS (`nvjet"
    )
    # the decoder layer, from the fixture decode step of "The kernels in one token"
    decode_run = fixture_run(ch.DECODE_CHAPTER)
    assert page.decode_label == f"run `{decode_run.run_id}` of the chapter *The kernels in one token*"
    assert page.layer_kernels == page.layer_table.kernels.sum() > 0
    assert list(page.rmsnorm_gpu_us.index) == list(times.index)


def test_the_page_without_a_recorded_decode_step(run, tmp_path):
    page = ch.page(run, root=tmp_path)
    assert math.isnan(page.layer_kernels) and page.layer_table is None
    assert page.decode_label.startswith("no recorded decode step: ")


def test_gemm_text_names_a_split_k_pair():
    text = ch.gemm_text(["gemv_split", "splitKreduce_kernel"])
    assert text.startswith("Each matrix multiply is 2 kernels here (`gemv_split`, `splitKreduce_kernel`)")


def test_every_glue_name_of_the_prose_is_a_page_field_or_a_shared_quantity():

    notebook = "notebooks/model_code_to_kernels.ipynb"
    assert len(prose_names(notebook)) > 20 and unglued(notebook, ch.Page) == set()
