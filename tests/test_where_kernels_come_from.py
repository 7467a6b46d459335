"""Chapter "Where kernels come from": the analysis on the recorded runs (tests/fixtures: the
decode step by source, with each source's most time-consuming kernel as its example; the
fusion; the attention backends; how the per-call times were taken), the notebook committed
with the parameters a smoke run sets, and its measuring cells run live on the CPU with the two
GPU-only parts replaced by CPU stand-ins, profiling as on a GPU, to check that every time is
taken before a profile."""

import functools
import re
import shutil

import pandas as pd
import pytest

from labsupport import runs
from labsupport.chapters import cells
from labsupport.chapters import where_kernels_come_from as ch
from labsupport.measure import decode, environment, harness
from labsupport.traces import kernels, replay

from .conftest import FIXTURES, fixture_run
from .notebook_cells import code_cells, run_live
from .page_names import prose_names, unglued

pytestmark = pytest.mark.unit

NOTEBOOK = "where_kernels_come_from.ipynb"


@pytest.fixture(scope="module")
def run():
    return fixture_run(ch.CHAPTER)


@pytest.fixture(scope="module")
def decode_kernels():
    return ch.decode_kernels(fixture_run(ch.DECODE_CHAPTER))


def test_every_recorded_kernel_has_a_known_source():
    for chapter, table in (
        ("kernels-in-one-token", "kernels"),
        ("model-code-to-kernels", "mlp_kernels"),
        ("what-a-kernel", "add_kernels"),
        (ch.CHAPTER, "fusion_kernels"),
    ):
        names = set(fixture_run(chapter).table(table).name)
        assert not [n for n in names if kernels.source(n) == "other"], table


def test_example_kernel_is_the_sum_of_launches_not_the_first_or_the_longest():
    k = pd.DataFrame(
        {"name": ["cutlass_80_simt_sgemm_first"] + ["nvjet_small"] * 10 + ["gemv_big"], "dur_ns": [1] + [3] * 10 + [20]}
    )
    src = ch.by_source(k)
    assert list(src.index) == ["cuBLAS/cuBLASLt"] and src.loc["cuBLAS/cuBLASLt", "kernels"] == 12
    assert src.loc["cuBLAS/cuBLASLt", "example kernel"] == "nvjet_small", "30 ns in all beats one 20 ns launch"


def test_decode_step_by_source(decode_kernels):
    k = decode_kernels
    src = ch.by_source(k)
    assert src.kernels.sum() == len(k)
    assert set(src.index) == {"cuBLAS/cuBLASLt", "cuDNN", "PyTorch (ATen)"}
    assert src.loc["cuBLAS/cuBLASLt", "kernels"] == (k.kind == "matrix multiply").sum()
    assert src["GPU ms"].sum() == pytest.approx(k.dur_ns.sum() / 1e6)
    assert src["share of GPU time"].sum() == pytest.approx(1.0)
    assert list(src.index) == [s for s in kernels.SOURCES if s in set(src.index)]
    source = k.name.map(kernels.source)
    for s, row in src.iterrows():
        by_name = k[source == s].groupby("name").dur_ns.sum()
        assert row["example kernel"] == kernels.short_name(by_name.idxmax()), s
        assert by_name.max() >= k[source == s].dur_ns.max() - 1, "the example takes at least the longest launch's time"


def test_fusion_kernels_and_table(run):
    f = ch.fusion_kernels(run)
    assert set(f.variant) == {ch.EAGER, ch.COMPILED}
    assert list(f.kind) == list(run.table("fusion_kernels").name.map(kernels.classify)), "today's kinds"
    assert set(f.kind) <= set(kernels.KINDS) and "other" not in set(f.kind)
    eager, compiled = f[f.variant == ch.EAGER], f[f.variant == ch.COMPILED]
    assert len(eager) == 8 and set(eager.source) == {"PyTorch (ATen)"}
    assert len(compiled) == 1 and set(compiled.source) == {"Triton (torch.compile)"}
    assert re.match(r"triton_\w+_fused_", compiled.kernel.item())
    t = ch.fusion_table(run).set_index("variant")
    counts = f.variant.value_counts()
    assert (t.kernels == counts.reindex(t.index)).all()
    raw = run.table("fusion_kernels")
    assert (t["GPU µs (profiler)"] == raw.groupby("variant").dur_ns.sum().reindex(t.index) / 1e3).all()
    h = ch.headline(run)
    assert h["RMSNorm kernels eager"] == t.loc[ch.EAGER, "kernels"] == 8
    assert h["RMSNorm kernels compiled"] == t.loc[ch.COMPILED, "kernels"] == 1
    assert run.results["fusion_max_abs_diff"] < 0.05


def test_generated_source(run):
    excerpt = ch.fused_kernel_excerpt(run)
    assert excerpt.startswith("@triton.jit") and "def triton_" in excerpt and "tl.load" in excerpt
    assert len(excerpt.splitlines()) <= 40


def test_attention_backends_table(run):
    a = ch.attention_backends(run)
    assert set(a.backend) == set(ch.BACKENDS)
    assert set(a.context) == set(run.parameters["contexts"])
    ok = a[a.status == "ok"]
    distinct = ok.kernel_names.map(lambda s: len([n for n in s.split(";") if n]))
    assert (distinct >= 1).all() and (ok.kernels >= distinct).all()
    assert ok.source.map(lambda s: s != "" and "other" not in s).all()
    assert a.loc[a.status != "ok", "status"].str.startswith("not available").all()
    by = ok.set_index(["backend", "context"])
    assert "cuDNN" in by.loc[("CUDNN_ATTENTION", 256), "source"]
    assert "FlashAttention" in by.loc[("FLASH_ATTENTION", 256), "source"]
    assert "PyTorch (ATen)" in by.loc[("EFFICIENT_ATTENTION", 256), "source"]
    assert by.loc[("MATH", 256), "kernels"] > 3 and "cuBLAS" in by.loc[("MATH", 256), "source"]
    assert ch.math_kernels(run) == by.loc[("MATH", min(run.parameters["contexts"])), "kernels"]
    assert (ok.max_abs_diff < 0.05).all()


def test_fused_backends_said_from_the_run(run):
    """Not "one fused kernel each": FlashAttention runs a split-KV kernel and a combine kernel."""
    f = ch.fused_backends(run).set_index("backend")
    assert f.loc["FLASH_ATTENTION", "fewest"] == f.loc["FLASH_ATTENTION", "most"] == 2
    assert f.loc["EFFICIENT_ATTENTION", "most"] == 1
    text = ch.fused_backends_text(run)
    assert "*FLASH_ATTENTION* 2 kernels" in text and "*EFFICIENT_ATTENTION* 1 kernel" in text
    assert "*CUDNN_ATTENTION* 1 to 2 (by context) kernels" in text and "combines" in text
    assert "one fused kernel each" not in text and text.startswith("the fused ones 1 to 2 kernels each: ")


def test_compiled_call_tied_to_the_host(run, tmp_path):
    t = run.table("fusion_times").set_index("variant")
    text = ch.compiled_call_text(run)
    assert "us_min" not in t.columns and ch.per_call_column(t) == "us_median", "an old run: the median"
    assert f"{t.loc[ch.COMPILED, 'us_median']:.0f} µs (median of its calls)" in text
    assert f"took {t.loc[ch.COMPILED, 'issue_us_median']:.0f} µs to return" in text
    assert "guards" in text and "cannot say" in text, "this run cannot split guards from the wrapper"
    assert ch.compiled_host_us(run) is None
    # a run that kept the compiled call's profile splits it
    import gzip
    import json

    from labsupport.runs.writer import sha256

    new = _copy(run, tmp_path)
    events = [
        {"ph": "X", "cat": "user_annotation", "name": "TorchDynamo Cache Lookup", "ts": 0, "dur": 12.5},
        {"ph": "X", "cat": "cpu_op", "name": "Torch-Compiled Region: 0/0", "ts": 13, "dur": 30.0},
        {"ph": "X", "cat": "cuda_driver", "name": "cuLaunchKernel", "ts": 20, "dur": 4.0},
    ]
    with gzip.open(new.path / ch.COMPILED_TRACE, "wt") as f:
        json.dump({"traceEvents": events}, f)
    new.meta["files"][ch.COMPILED_TRACE] = sha256(new.path / ch.COMPILED_TRACE)
    assert ch.compiled_host_us(new) == {"guards": 12.5, "compiled region": 30.0, "launch calls": 4.0}
    assert "guards 12 µs, compiled region 30 µs, launch calls 4 µs" in ch.compiled_call_text(new)


def _copy(run, tmp_path):
    root = tmp_path / "runs"
    shutil.copytree(run.path, root / ch.CHAPTER / run.run_id)
    return runs.load_run(ch.DECLARATION, run.run_id, root=root, verify=False)


def test_timing_note_says_how_the_times_were_taken(run, tmp_path):
    assert ch.timing_note(run) == (
        "Every per-call time is the median of 100 timed calls, with CUDA events around "
        "each, taken before anything was profiled in the process."
    )
    new = _copy(run, tmp_path)
    t = new.table("fusion_times")
    t["clean"] = t.variant != ch.EAGER
    t.to_csv(new.path / "fusion_times.csv", index=False)
    assert "after a profile" in ch.timing_note(new)
    t.drop(columns=["repeats", "clean"]).to_csv(new.path / "fusion_times.csv", index=False)
    assert ch.timing_note(new).startswith("This run was recorded before the chapter timed everything ahead of its")


def test_notebook_has_the_parameters_a_smoke_run_sets():
    code = code_cells(NOTEBOOK)
    assert all(not c.outputs and c.execution_count is None for c in code)
    (params,) = [c for c in code if "parameters" in c.metadata.get("tags", [])]
    assert params is code[1] and 'find_spec("labsupport")' in code[0].source  # after the install cell
    assert params.source == cells.PARAMETERS  # the smoke run's values go to the fields of ch.Params
    assert set(ch.DECLARATION.smoke) == {"contexts", "repeats"} and "preset" in ch.DECLARATION.defaults
    assert "params.dtype = environment.dtype_here(params.dtype, params.device)" in "".join(c.source for c in code)


@pytest.mark.live
def test_the_notebook_times_everything_before_it_profiles(runs_root, monkeypatch):
    """The notebook's measuring cells with CPU stand-ins for the GPU-only parts (torch.compile,
    the SDPA backends other than MATH), and every profile counted as one that leaves
    CUPTI attached: a time taken after a profile would raise harness.TimingError."""
    import torch
    import torch.nn.functional as F
    from torch._inductor import utils as inductor_utils

    def attention(heads, kv_heads, head_dim, ctx, dtype, device):
        assert dtype == "bfloat16"  # the notebook's default reaches the measurement
        assert device == "cpu"  # and so does the chapter's device
        q, k = torch.randn(1, heads, 1, head_dim), torch.randn(1, heads, ctx, head_dim)
        out = {b: (None, "not available: no GPU here") for b in ch.BACKENDS}
        out["MATH"] = (lambda: F.scaled_dot_product_attention(q, k, k), 0.0)
        return out

    time_region, profile_region = harness.time_region, harness.profile_region

    def time_on_cpu(fn, **kw):
        t = time_region(fn, **{**kw, "device": "cpu"})
        t.gpu_ms = list(t.wall_ms)  # no CUDA events on a CPU
        return t

    def profile_as_on_a_gpu(fn, path, **kw):
        k = profile_region(fn, path, **{**kw, "device": "cpu"})
        harness._profiles_in_process += 1
        return k

    monkeypatch.setattr(torch, "compile", lambda module, **options: module)  # no compiler for a CPU here
    monkeypatch.setattr(inductor_utils, "run_and_get_code", lambda fn, *args: (fn(*args), ["@triton.jit\n"]))
    monkeypatch.setattr(ch, "attention", attention)
    monkeypatch.setattr(harness, "_profiles_in_process", 0)
    monkeypatch.setattr(harness, "time_region", time_on_cpu)
    monkeypatch.setattr(harness, "profile_region", profile_as_on_a_gpu)
    monkeypatch.setattr(decode, "require_device", lambda device, allow_cpu=False: device)
    monkeypatch.setattr(ch, "Params", functools.partial(ch.Params, device="cpu"))
    monkeypatch.setattr(environment, "check", lambda *a, **k: [])  # a CPU stands in for the GPU
    run = run_live(NOTEBOOK, preset="tiny", contexts=[8, 32], repeats=2)
    assert harness.profiled()
    assert {n for n in run.meta["files"] if not replay.is_derived(n)} == {  # + the trace's replay tables
        "fusion_kernels.csv",
        "fusion_times.csv",
        "fused_rmsnorm_source.py",
        "attention_backends.csv",
        ch.COMPILED_TRACE,
    }
    assert set(run.results["method"]) >= {"wall_times", "gpu_times", "host"}
    t = run.table("fusion_times")
    assert list(t.variant) == [ch.EAGER, ch.COMPILED] and t.clean.all() and (t.repeats == 2).all()
    assert (t.kernels == run.table("fusion_kernels").groupby("variant").size().reindex(t.variant).values).all()
    a = run.table("attention_backends")
    assert list(zip(a.context, a.backend, strict=True)) == [(c, b) for c in (8, 32) for b in ch.BACKENDS]
    ok = a[a.status == "ok"]
    assert list(ok.backend) == ["MATH", "MATH"] and ok.clean.all() and (ok.kernels > 0).all()
    assert ch.timing_note(run).endswith("taken before anything was profiled in the process.")
    assert ch.timing_note(run).startswith("Every per-call time is the least of 2 timed calls")
    for table in (t, ok):
        assert (table.us_min <= table.us_q1).all() and (table.us_q1 <= table.us_median).all()
        assert (table.us_median <= table.us_q3).all() and (table.wall_us_min <= table.wall_us_median).all()
    f = ch.fusion_table(run).set_index("variant")
    assert (f["per call µs (CUDA events)"] == t.set_index("variant").us_min.reindex(f.index)).all()
    assert "guards" in ch.compiled_call_text(run) and ch.compiled_host_us(run) is not None


def test_the_answer_comes_before_the_measuring_code():
    import json

    from .conftest import REPO

    nb = json.loads((REPO / "notebooks" / "where_kernels_come_from.ipynb").read_text())
    md = [
        i for i, c in enumerate(nb["cells"]) if c["cell_type"] == "markdown" and "## The answer" in "".join(c["source"])
    ]
    live = next(i for i, c in enumerate(nb["cells"]) if 'if mode == "live":' in "".join(c["source"]))
    assert len(md) == 1 and md[0] < live


# The page ------------------------------------------------------------------------------------


def test_the_page_quotes_the_runs_tables(run):
    page = ch.page(run, root=FIXTURES)
    times = run.table("fusion_times").set_index("variant")  # a run from before the interleaved timing: medians
    backends = run.table("attention_backends")
    assert (page.rms_eager_kernels, page.rms_compiled_kernels) == (8, 1) == tuple(times.kernels)
    assert page.eager_us == times.loc[ch.EAGER, "us_median"] and page.compiled_us == times.loc[ch.COMPILED, "us_median"]
    assert page.try_fusion_call_ratio == pytest.approx(page.eager_us / page.compiled_us)
    gpu_us = run.table("fusion_kernels").groupby("variant").dur_ns.sum() / 1e3
    assert page.try_fusion_gpu_ratio == pytest.approx(gpu_us[ch.EAGER] / gpu_us[ch.COMPILED])
    assert page.fusion_err == run.results["fusion_max_abs_diff"]
    assert page.backends_tried == backends.backend.nunique() == 4
    assert page.backends_ok == backends[backends.status == "ok"].backend.nunique()
    longest = backends[(backends.status == "ok") & (backends.context == backends.context.max())]
    fastest = longest.loc[longest.us_median.idxmin()]
    assert page.try_fastest_text.startswith(f"At {fastest.context:,d} tokens, *{fastest.backend}*: ")
    assert page.fused_name.startswith("`triton_") and page.fused_name.count("`") == 2
    assert page.v_decode_kernels == 902 and page.v_eager_kernels == 2464  # published, not measured
    assert "per call µs" in page.attention_table and "gpu_ns" not in page.attention_table
    # the decode step by source, from the fixture decode step of "The kernels in one token"
    decode_run = fixture_run(ch.DECODE_CHAPTER)
    assert page.decode_run.run_id == decode_run.run_id and page.sources_found == ", ".join(page.sources.index)
    assert page.sources["GPU ms"].sum() == pytest.approx(decode_run.table("kernels").dur_ns.sum() / 1e6)


def test_the_page_without_a_recorded_decode_step_or_a_backend_that_ran(run, tmp_path):
    page = ch.page(run, root=tmp_path)
    assert page.sources is None and page.sources_found == "none"
    assert page.decode_label.startswith("no recorded decode step (")
    none_ran = ch.attention_backends(run).assign(status="not available: test")
    assert ch.fastest_text(none_ran) == "No backend ran in this run"


def test_every_glue_name_of_the_prose_is_a_page_field():
    notebook = f"notebooks/{NOTEBOOK}"
    assert len(prose_names(notebook)) > 25 and unglued(notebook, ch.Page) == set()
