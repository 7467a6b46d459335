"""The chapter "A hybrid model's token": its measuring cells on the tiny hybrid on a CPU, and
its analysis on the frozen H200 run of the 27B hybrid (tests/fixtures/runs/)."""

import base64
import io
import json
import re

import pandas as pd
import pytest

from labsupport import runs
from labsupport.chapters import hybrid_model_token as hybrid
from labsupport.chapters import published
from labsupport.measure import hardware, harness, models
from labsupport.measure.models import gated_deltanet
from labsupport.traces import kernels, trace

from .conftest import FIXTURES, REPO, ceilings_on_another_gpu, fixture_run
from .live_cells import parameters, watch_harness
from .test_launch_overhead import modern_copy, replay_notebook

pytestmark = pytest.mark.unit

NOTEBOOK = "notebooks/hybrid_model_token.ipynb"
# The registry's CPU parameters for this chapter, with the contexts the tests ask for.
TINY = {"preset": "tiny-hybrid", "prompt_len": 16, "repeats": 2, "contexts": [8, 64, 256]}


def run_measuring_cells(params: dict) -> dict:
    """Execute the notebook's cells in this process, live on the CPU, up to the one that loads
    the run (as papermill would, the parameters set after the parameters cell); returns the
    notebook's namespace. In-process, so that the tests can watch the harness."""
    nb = json.loads((REPO / NOTEBOOK).read_text())
    ns: dict = {}
    for cell in nb["cells"]:
        if cell["cell_type"] != "code":
            continue
        exec(compile("".join(cell["source"]), f"{NOTEBOOK}:{cell.get('id')}", "exec"), ns)
        if "parameters" in cell["metadata"].get("tags", []):
            ns.update(parameters(**{"allow_cpu": True, **params}))
        if cell.get("id") == "hy-load-run":
            return ns
    raise AssertionError("the notebook has no cell hy-load-run")


def _record_tiny(tmp_path_factory, calls: list, fail_profile=None, **params) -> runs.Run:
    root = tmp_path_factory.mktemp("runs")
    mp = pytest.MonkeyPatch()
    mp.setenv("LABSUPPORT_RUNS", str(root))
    watch_harness(mp, calls, fail_profile)  # a CPU profile counts as a GPU one: a later timing raises
    real_interleaved = harness.interleaved

    def interleaved(variants, **kw):
        calls.append(("time", kw["what"]))
        return real_interleaved(variants, **kw)

    mp.setattr(harness, "interleaved", interleaved)
    try:
        return run_measuring_cells({**TINY, **params})["run"]
    finally:
        mp.undo()


@pytest.fixture(scope="module")
def tiny_hybrid_calls():
    return []


@pytest.fixture(scope="module")
def tiny_hybrid_run(tmp_path_factory, tiny_hybrid_calls):
    return _record_tiny(tmp_path_factory, tiny_hybrid_calls)


@pytest.fixture(scope="module")
def h200_run():
    return fixture_run(hybrid.CHAPTER)


@pytest.mark.live
def test_tiny_hybrid_times_everything_before_profiling(tiny_hybrid_run, tiny_hybrid_calls):
    run, calls = tiny_hybrid_run, tiny_hybrid_calls
    # the backend's prompt and its step timed in turn, round after round, in one interleaved timing
    assert [c for c in calls if c[0] == "time"] == [("time", "reference: prefill, eager")]
    assert [c[0] for c in calls] == ["time", "profile", "profile"], calls
    assert [c[1] for c in calls if c[0] == "profile"] == ["prefill", "decode_step"]
    t = run.table("step_times")
    assert set(zip(t.backend, t["mode"], strict=True)) == {("reference", "eager")} and t.clean.all()
    assert len(t) == run.parameters["repeats"]
    p = run.table("prefill").set_index("backend")
    assert bool(p.loc["reference", "clean"]) and p.loc["fla", "status"].startswith("not run")
    assert (
        p.loc["reference", "wall_ms_min"] <= p.loc["reference", "wall_ms_median"] <= p.loc["reference", "wall_ms_max"]
    )
    v = run.table("variants").set_index(["backend", "mode"])
    ok = v.loc[("reference", "eager")]
    assert ok.status == "ok" and bool(ok.clean) and ok.graphs_compiled_while_profiling == 0
    assert (ok.wall_ms_median, ok.wall_ms_min, ok.wall_ms_max) == pytest.approx(
        (t.wall_ms.median(), t.wall_ms.min(), t.wall_ms.max())
    )
    assert (ok.wall_ms_q1, ok.wall_ms_q3) == pytest.approx((t.wall_ms.quantile(0.25), t.wall_ms.quantile(0.75)))
    est = harness.table_estimate(t)  # every trial with its round's probe reading: the fast-host median
    assert ok.wall_ms_estimate == pytest.approx(est.value) and ok.wall_ms_fast_trials == est.trials
    assert list(t["round"]) == list(range(run.parameters["repeats"])), "each repeat labelled with its round"
    assert "ceilings.csv" not in run.meta["files"], "the ceilings are those of Why a GPU"
    assert "round after round" in hybrid.timing_note(run)
    assert v.loc[("reference", "cuda-graph"), "status"] == "not run: needs a CUDA GPU"
    assert list(run.table("variants").columns) == hybrid.VARIANT_COLUMNS
    assert run.results["method"]["wall_times"].startswith("host clock")
    assert run.results["model"]["layer_types"] == list(models.hf_config("tiny-hybrid").layer_types)
    assert "before the first profile" in hybrid.timing_note(run)
    assert not [f for f in run.meta["files"] if f.startswith(".prefill")], "the prompt's trace is not kept"
    g = run.table("cache_growth")
    assert sorted(set(g.context)) == TINY["contexts"] and (g.status == "ok").all()


@pytest.mark.live
def test_tiny_hybrid_variants_table(tiny_hybrid_run):
    v = hybrid.variants(tiny_hybrid_run).set_index(["backend", "mode"])
    ok = v.loc[("reference", "eager")]
    assert ok["wall min ms"] <= ok["wall ms"] <= ok["wall max ms"]  # the estimate: the fast-host median
    assert ok["wall min ms"] <= ok["wall q1 ms"] <= ok["wall median ms"] <= ok["wall q3 ms"]
    assert ok["wall q3 ms"] <= ok["wall max ms"]
    col = hybrid.measured_column(tiny_hybrid_run)
    assert col in v and v[col].isna().all(), "a CPU run measures no ceiling"
    assert v.loc[v.status != "ok", ["wall min ms", "wall max ms"]].isna().all().all()


@pytest.mark.live
def test_tiny_hybrid_profile_failing_after_timing_leaves_no_half_row(tmp_path_factory):
    calls = []
    run = _record_tiny(
        tmp_path_factory, calls, fail_profile=lambda kw: True, backends=["reference"], repeats=1, contexts=[8]
    )
    p = run.table("prefill").set_index("backend")
    assert p.loc["reference", "status"].startswith("failed while profiling (after it was timed)")
    assert p[["kernels", "wall_ms_median"]].isna().all().all()
    v = run.table("variants").set_index("mode")
    assert v.loc["eager", "status"].startswith("failed while profiling (after it was timed)")
    assert v[["kernels", "wall_ms_median"]].isna().all().all()
    assert run.table("step_times").empty
    assert hybrid.trace_file("reference", "eager") not in run.meta["files"]


def test_gpu_variants_switched_off_are_recorded_with_the_reason():
    """The bookkeeping of the GPU path, without a GPU: which modes a backend runs, and the row
    each mode left out gets (a variant is never left out silently)."""
    p = hybrid.Params(backends=["reference"], cuda_graphs=False, compile_backends=[], device="cuda")
    rec = hybrid.Recorder(p, say=lambda msg: None)
    assert rec.usable == ["reference"] and rec.modes("reference") == ["eager"]
    v = rec.variants().set_index("mode")
    assert list(v.index) == ["cuda-graph", "compile"] and list(rec.variants().columns) == hybrid.VARIANT_COLUMNS
    assert (v.status == "not run: switched off in this run's parameters").all()
    p = hybrid.Params(backends=["reference"], compile_backends=["reference"], device="cuda")
    assert hybrid.Recorder(p, say=lambda msg: None).modes("reference") == ["eager", "cuda-graph", "compile"]


def test_unknown_backend_is_refused_before_measuring(runs_root):
    with pytest.raises(gated_deltanet.UnknownBackendError):
        run_measuring_cells({**TINY, "backends": ["nope"]})
    assert not any(runs_root.rglob("meta.json")) and not any(runs_root.rglob(".incomplete-*"))
    with pytest.raises(runs.RunError):
        hybrid.load("no-such-run")


@pytest.mark.live
def test_headline_is_keyed_by_backend_and_mode(h200_run, tiny_hybrid_run):
    for run in (h200_run, tiny_hybrid_run):
        v = run.table("variants").set_index(["backend", "mode"])
        ref = v.loc[("reference", "eager")]
        assert hybrid.headline(run) == {
            "eager kernels": ref.kernels,
            "eager wall ms": ref[hybrid.wall_column(v)],  # the book's estimator (the minimum in older runs)
            "best wall ms": v.loc[v.status == "ok", hybrid.wall_column(v)].min(),
        }


# The recorded H200 run of the 27B hybrid -------------------------------------------------


def test_recorded_run_has_every_backend_and_mode(h200_run):
    v = hybrid.variants(h200_run)
    assert (v.status == "ok").all(), v[v.status != "ok"]
    assert set(zip(v.backend, v["mode"], strict=True)) == {(b, m) for b in ("reference", "fla") for m in hybrid.MODES}
    assert h200_run.results["backend_versions"]["fla"] == "0.6.0"
    graphs = v[v["mode"] == "cuda-graph"]
    assert (graphs["launch calls"] == 1).all(), "one replay call launches the whole graph"
    eager = v[v["mode"] == "eager"]
    assert (eager["launch calls"] == eager.kernels).all()


def test_recorded_cache_growth_matches_the_27b_configuration(h200_run):
    cfg = models.hf_config("qwen3.5-27b")
    g = hybrid.cache_growth(h200_run)
    assert (g["KV bytes per token"] == 16 * 2 * cfg.num_key_value_heads * cfg.head_dim * 2).all()  # 65,536
    conv = (2 * 16 * 128 + 48 * 128) * 4 * 2
    state = 48 * 128 * 128 * 4
    assert (g["linear-attention state MB"] * 1e6).tolist() == pytest.approx([48 * (conv + state)] * len(g))


def test_recorded_layers_by_type(h200_run):
    for backend in ("reference", "fla"):
        k = hybrid.kernel_table(h200_run, backend, "eager")
        per_layer = k.dropna(subset=["layer"]).groupby("layer").size()
        types = h200_run.results["model"]["layer_types"]
        for kind in ("linear_attention", "full_attention"):
            counts = {per_layer[i] for i, t in enumerate(types) if t == kind}
            assert len(counts) == 1, f"{backend}: every {kind} layer runs the same kernels"
        t = hybrid.per_layer_type(k).set_index("layer type")
        assert t.loc["linear attention", "layers"] == 48 and t.loc["full attention", "layers"] == 16
    fla = hybrid.kernel_table(h200_run, "fla", "eager")
    rec = fla[fla.name == "fused_recurrent_gated_delta_rule_fwd_kernel"]
    assert len(rec) == 48 and set(rec.part) == {"linear_attn"}
    assert set(rec.name.map(kernels.source)) == {"flash-linear-attention (Triton)"}
    ref = hybrid.kernel_table(h200_run, "reference", "eager")
    assert not ref.name.map(kernels.source).eq("flash-linear-attention (Triton)").any()


def test_recorded_lm_head_is_the_largest_kernel(h200_run):
    head = hybrid.lm_head(h200_run)
    assert head.rows == 248_320 and head.gb == pytest.approx(248_320 * 5120 * 2 / 1e9)
    assert head.is_largest and head.ms > head.floor_ms_datasheet


def test_recorded_time_budget_adds_up(h200_run):
    tb = hybrid.time_budget(h200_run)
    v = h200_run.table("variants")
    assert list(zip(tb.backend, tb["mode"], strict=True)) == list(zip(v.backend, v["mode"], strict=True))
    busy = (v.gpu_busy_ns / 1e6).values
    parts = (tb["matrix multiplies ms"] + tb["other kernels ms"]).values
    assert parts == pytest.approx(v.kernel_ns.values / 1e6)
    assert parts == pytest.approx(busy, rel=0.01)  # one stream: kernels hardly overlap
    assert ((tb["GPU idle ms"] - (tb["wall ms"] - busy)).abs() < 1e-9).all()
    gb = h200_run.results["model"]["matmul_bytes"] / 1e9
    assert tb["matmul TB/s"].tolist() == pytest.approx((gb / tb["matrix multiplies ms"]).tolist())


def test_recorded_census_by_kind(h200_run):
    c = hybrid.census_by_kind(h200_run)
    v = h200_run.table("variants").set_index(["backend", "mode"])
    for backend in ("reference", "fla"):
        assert c.loc["total", (backend, "kernels")] == v.loc[(backend, "eager"), "kernels"]
        assert c.loc["total", (backend, "GPU ms")] * 1e6 == pytest.approx(v.loc[(backend, "eager"), "kernel_ns"])
    # flash-linear-attention replaces the reference recurrence by one attention-kind kernel per layer
    assert c.loc["attention", ("fla", "kernels")] - c.loc["attention", ("reference", "kernels")] == 48
    assert c.loc["matrix multiply", ("fla", "kernels")] == c.loc["matrix multiply", ("reference", "kernels")]


# Where the idle time sits, the prompt host against device, beside the published profile ------


def test_recorded_gaps_and_busy_make_the_profiled_step(h200_run):
    backend, mode = hybrid.best_variant(h200_run)
    v = h200_run.table("variants").set_index(["backend", "mode"])
    assert v.loc[(backend, mode), "wall_ms_median"] == v.wall_ms_median.min()
    gaps = hybrid.step_gaps(h200_run, backend, mode)
    k = hybrid.kernel_table(h200_run, backend, mode)
    span = trace.origin_span_ns(trace.load_events(h200_run.file(hybrid.trace_file(backend, mode))))
    assert gaps.dur_ns.sum() + trace.busy_ns(k.start_ns, k.end_ns) == span, "idle and busy make the whole step"
    assert (gaps.dur_ns >= 0).all()
    first, last = gaps.loc[gaps.start_ns.idxmin()], gaps.loc[gaps.start_ns.idxmax()]
    assert (first.place, last.place) == ("before the first kernel", "after the last kernel")
    places = hybrid.idle_places(gaps)
    total, parts = places.set_index("group").loc["total"], places[places.group != "total"]
    assert total["gaps"] == len(gaps) == parts.gaps.sum()
    assert total["idle ms"] == pytest.approx(parts["idle ms"].sum()) == pytest.approx(gaps.dur_ns.sum() / 1e6)
    assert len(places) <= 15
    s = hybrid.idle_summary(h200_run, backend, mode)
    assert s.idle_ms == pytest.approx(s.wall_ms - s.busy_ms)
    assert s.busy_ms * 1e6 == pytest.approx(v.loc[(backend, mode), "gpu_busy_ns"])
    assert s.before_first_ms + s.between_launches_ms + s.inside_graph_ms + s.after_last_ms == pytest.approx(
        s.profiled_idle_ms, abs=0.01
    )  # busy from variants.csv; the trace's union may differ by rounding
    assert s.host_estimate_ms == pytest.approx(s.idle_ms - s.inside_graph_ms)
    if mode != "eager":
        assert s.graph_launches >= 1 and s.compiled_regions >= (1 if mode == "compile" else 0)
    host = hybrid.host_before_first_kernel(h200_run, backend, mode)
    assert 0 < len(host) <= 12 and host["starts at ms"].is_monotonic_increasing
    graph = k[k.launch_api == "cudaGraphLaunch"]
    first = (graph if len(graph) else k).start_ns.min() / 1e6
    assert (host["starts at ms"] < first).all()


def test_recorded_memsets_by_module(h200_run):
    for backend in ("reference", "fla"):
        sets = hybrid.memsets_by_module(h200_run, backend)
        events = trace.load_events(h200_run.file(hybrid.trace_file(backend, "eager")))
        assert sets.memsets.sum() == sum(1 for e in events if e.get("cat") == "gpu_memset")
        assert (sets.module != "(unlabelled)").any()


def test_recorded_prefill_host_and_device(h200_run):
    p = hybrid.prefill_host_device(h200_run)
    raw = h200_run.table("prefill")
    assert len(p) == (raw.status == "ok").sum()
    assert (p["GPU idle ms"] == p["wall ms"] - p["GPU busy ms"]).all()
    assert p["wall µs per kernel"].tolist() == pytest.approx((p["wall ms"] * 1e3 / p.kernels).tolist())
    assert p["idle µs per kernel"].tolist() == pytest.approx((p["GPU idle ms"] * 1e3 / p.kernels).tolist())
    assert (p["wall min ms"] <= p["wall ms"]).all() and (p["wall ms"] <= p["wall max ms"]).all()


def test_recorded_host_time_of_a_call(h200_run):
    fr = hybrid.host_call(h200_run, "fla", "FusedRecurrentFunction")
    k = hybrid.kernel_table(h200_run, "fla", "eager")
    assert fr.calls == (k.op == "FusedRecurrentFunction").sum() > 0, "one call per recurrence kernel it launches"
    assert fr.launch_us > 0 and fr.launch_us + fr.operators_us <= fr.total_us
    mm = hybrid.host_call(h200_run, "reference", "aten::mm")
    assert 0 < mm.calls <= (hybrid.kernel_table(h200_run, "reference", "eager").op == "aten::mm").sum()
    assert mm.operators_us == 0, "aten::mm calls no other operator"
    none = hybrid.host_call(h200_run, "reference", "FusedRecurrentFunction")
    assert none.calls == 0 and none.total_us != none.total_us


def test_beside_published_on_each_gpus_own_limit(h200_run):
    pub = published.HYBRID_27B_VLLM_HEADLINE
    b = hybrid.beside_published(h200_run)
    keyed = b.set_index(hybrid.BESIDE_KEYS)
    m = h200_run.results["model"]
    assert (b["of its GPU's limit"] == b["limit ms"] / b.ms).all()
    h100 = hardware.datasheet("NVIDIA H100 80GB HBM3")
    ours = hardware.datasheet(h200_run.provenance["gpu"])
    pub_decode, pub_prompt = keyed.loc[("published", "decode", "vllm")], keyed.loc[("published", "prompt", "vllm")]
    assert pub_decode.ms == pub["decode_ms"] and pub_prompt.ms == pub["prefill_ms"]
    assert pub_decode["limit ms"] == pytest.approx(m["decode_bytes"] / 1e9 / h100.bandwidth_tbs)
    flop = hybrid.prefill_flop(h200_run, pub["prefill_tokens"])
    head = m["lm_head_bytes"] // m["bytes_per_parameter"]
    assert flop == 2 * (m["matmul_weight_parameters"] - head) * pub["prefill_tokens"] + 2 * head
    assert pub_prompt["limit ms"] == pytest.approx(flop / (h100.bf16_tflops * 1e12) * 1e3)
    ours_rows = b[b.source == hybrid.OURS]
    decode = ours_rows[ours_rows.what.str.startswith("decode")]
    assert decode["limit ms"].tolist() == pytest.approx([m["decode_bytes"] / 1e9 / ours.bandwidth_tbs] * len(decode))
    ok = hybrid.ok_variants(h200_run)
    best = ok.loc[ok["wall ms"].idxmin()]
    assert len(decode) == 1 and keyed.loc[("ours", "decode", best.backend), "ms"] == best["wall ms"]
    assert len(ours_rows[ours_rows.what.str.contains("prompt")]) == len(hybrid.prefill(h200_run))


def test_recorded_mixer_by_module_and_its_csv(h200_run):
    mix = hybrid.mixer_by_module(h200_run)
    for backend in ("reference", "fla"):
        full = hybrid.mixer_kernels(hybrid.kernel_table(h200_run, backend, "eager"))
        assert mix.loc["total", (backend, "kernels")] == len(full)
        assert mix.loc["total", (backend, "µs")] == pytest.approx(full["µs"].sum())
        assert mix[(backend, "kernels")].drop("total").sum() == len(full)
        html = hybrid.csv_link(full, "a<b>.csv", "the <list>").data
        assert "<list>" not in html and "a<b>" not in html
        data = re.search(r'href="data:text/csv;base64,([^"]+)"', html).group(1)
        back = pd.read_csv(io.StringIO(base64.b64decode(data).decode()))
        assert len(back) == len(full) and list(back.columns) == list(full.columns)
    assert len(mix) <= 15


@pytest.mark.live
def test_tiny_hybrid_analysis_and_page(tiny_hybrid_run, tmp_path):
    run = tiny_hybrid_run
    backend, mode = hybrid.best_variant(run)
    assert (backend, mode) == ("reference", "eager")
    places = hybrid.idle_places(hybrid.step_gaps(run, backend, mode))
    assert places.set_index("group").loc["total", "gaps"] == places[places.group != "total"].gaps.sum()
    b = hybrid.beside_published(run)
    assert b[b.side == "published"]["limit ms"].isna().all(), "another model is not set against the published one"
    assert len(hybrid.prefill_host_device(run)) == 1
    text = replay_notebook(NOTEBOOK, run, tmp_path)
    assert "Traceback" not in text and "not the published profile's configuration" in text


@pytest.mark.book
def test_the_page_replays_a_run_recorded_with_todays_columns(h200_run, tmp_path, monkeypatch):
    run = modern_copy(h200_run, tmp_path / "runs")
    assert "before the first profile" in hybrid.timing_note(run)
    monkeypatch.setenv("LABSUPPORT_RUNS", str(FIXTURES))  # the ceilings of Why a GPU's fixture run: the same GPU
    v = hybrid.variants(run)
    assert hybrid.measured_column(run) == "of practical ceiling" and v["of practical ceiling"].notna().all()
    assert len(hybrid.prefill_host_device(run)) == 2
    text = replay_notebook(NOTEBOOK, run, tmp_path)
    assert "Traceback" not in text and "image/png" in text
    assert "of its GPU" in text and "ours on the GPU named" not in text


@pytest.mark.live
def test_compact_variants_table(h200_run, tiny_hybrid_run):
    for run in (h200_run, tiny_hybrid_run):
        v, c = hybrid.variants(run), hybrid.variants_compact(run)
        assert len(c) == len(v) and ("status" in c) == (v.status != "ok").any()
        assert set(c["mode"]) <= set(hybrid.MODES_SHORT.values())
        ok = v.status == "ok"
        assert (c.loc[ok, "wall ms"] == v.loc[ok, "wall ms"]).all()
        assert c.loc[~ok, "median (quartiles) ms"].eq("–").all()
        col = hybrid.wall_column(run.table("variants"))  # the fast-host median; the minimum in older runs
        assert (v.loc[ok, "wall ms"] == run.table("variants").loc[ok, col]).all(), "the book's estimator"
    places = hybrid.idle_places(hybrid.step_gaps(h200_run, *hybrid.best_variant(h200_run)), width=20)
    assert places[["kernel before", "kernel after"]].map(len).max().max() <= 20


@pytest.mark.parametrize("mode", list(hybrid.MODES))
@pytest.mark.parametrize("backend", ["reference", "fla"])
def test_one_depthwise_convolution_per_linear_attention_layer(h200_run, backend, mode):
    k = trace.read_kernels(h200_run.file(hybrid.trace_file(backend, mode)), device="cuda")
    c = kernels.census(k.assign(kind=k.name.map(kernels.classify))).set_index("kind")
    assert list(c.index) == list(kernels.KINDS) + ["total"]
    assert c.loc["convolution", "kernels"] == h200_run.results["model"]["layer_types"].count("linear_attention")
    assert c.loc["other", "kernels"] == 0


def test_each_hidden_table_has_one_toggle():
    """A cell tagged both hide-input and hide-output gets two toggles with the same prompt ("Show the
    kernels by kind" twice); hide-cell gives one, over the code and its table together."""
    nb = json.loads((REPO / NOTEBOOK).read_text())
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    assert not [c.get("id") for c in code if {"hide-input", "hide-output"} <= set(c["metadata"].get("tags", []))]
    prompts = [c["metadata"].get("mystnb", {}).get("code_prompt_show") for c in code]
    assert prompts.count("Show the kernels by kind") == 1
    assert all("hide-cell" in c["metadata"]["tags"] for c, p in zip(code, prompts, strict=True) if p)


def test_the_answer_comes_before_the_measuring_code():
    nb = json.loads((REPO / NOTEBOOK).read_text())
    heads = [
        i for i, c in enumerate(nb["cells"]) if c["cell_type"] == "markdown" and "## The answer" in "".join(c["source"])
    ]
    measuring = next(i for i, c in enumerate(nb["cells"]) if 'if mode == "live":' in "".join(c["source"]))
    assert len(heads) == 1 and heads[0] < measuring


# --- the page: every number and text the prose glues ------------------------------------------


def test_every_glue_name_of_the_prose_is_a_page_field():
    """The page cell glues the Page's fields, and nothing else glues: every name the markdown uses is one."""
    from .page_names import unglued, unshown

    assert unglued(NOTEBOOK, hybrid.Page) == set() and unshown(NOTEBOOK, hybrid.Page) == set()


def test_page_of_the_recorded_run_against_its_tables(h200_run):
    p = hybrid.page(h200_run)
    steps = h200_run.table("variants").set_index(["backend", "mode"])
    estimate = harness.estimate_column(steps.columns)
    ran = steps[steps.status == "ok"]
    assert p.ref_kernels == steps.loc[("reference", "eager"), "kernels"]
    assert p.ref_wall == steps.loc[("reference", "eager"), estimate]
    assert p.ref_busy == steps.loc[("reference", "eager"), "gpu_busy_ns"] / 1e6
    fastest = ran[estimate].idxmin()
    assert p.best_wall == ran.loc[fastest, estimate] and p.best_kernels == ran.loc[fastest, "kernels"]
    assert p.best == f"{fastest[0]}; {hybrid.MODES[fastest[1]]}" == p.idle_variant
    assert p.best_speedup == pytest.approx(p.ref_wall / p.best_wall)
    assert len(ran) == len(steps) and p.failed_text == "Every backend and mode ran."
    model = h200_run.results["model"]
    assert (p.n_linear, p.n_full, p.layers) == (48, 16, model["layers"])
    assert p.decode_gb == model["decode_bytes"] / 1e9
    growth = h200_run.table("cache_growth")
    full = growth[growth.layer_type == "full_attention"].set_index("context").bytes
    assert p.ctx_last == growth.context.max() and p.try_ctx_10x == 10 * p.ctx_last
    assert p.kv_mb_last == pytest.approx(full.loc[p.ctx_last] / 1e6)
    assert p.p_decode_ms == published.HYBRID_27B_VLLM_HEADLINE["decode_ms"]
    assert p.head_rows == model["lm_head_rows"] and p.head_largest.startswith("is the longest kernel")
    # flash-linear-attention ran in this run: the section names its version and both kernel counts
    assert f"fla-core {h200_run.results['backend_versions']['fla']}" in p.fla_section
    assert f"{steps.loc[('fla', 'eager'), 'kernels']:,.0f}" in p.fla_section
    assert p.run_label.startswith(h200_run.provenance["gpu"]) and h200_run.run_id in p.run_label


def test_page_says_what_was_not_measured(h200_run, tmp_path):
    """Without flash-linear-attention's rows the page says they were not measured, and why, and the
    prompt phase has no comparison."""
    import shutil

    copy = tmp_path / hybrid.CHAPTER / h200_run.run_id
    shutil.copytree(h200_run.path, copy)
    steps = pd.read_csv(copy / "variants.csv")
    steps.loc[steps.backend == "fla", "status"] = "not run: fla-core is not installed"
    steps.to_csv(copy / "variants.csv", index=False)
    prompts = pd.read_csv(copy / "prefill.csv")
    prompts[prompts.backend != "fla"].to_csv(copy / "prefill.csv", index=False)
    p = hybrid.page(runs.load_run(hybrid.DECLARATION, h200_run.run_id, root=tmp_path, verify=False))
    assert p.fla_section == (
        "flash-linear-attention's kernels were **not measured** in this run: not run: fla-core is not installed."
    )
    assert p.prefill_text == ""
    assert p.failed_text == "Not everything ran; each row that did not says why in its *status*."


def test_beside_ceilings_of_another_gpu_the_page_sets_the_step_against_the_datasheet_alone(
    h200_run, tmp_path, monkeypatch
):
    """The H200 run beside a run of *Why a GPU* recorded on an H100: no practical ceiling, said so in
    words, no column of it in the table, and the datasheet's numbers as before."""
    monkeypatch.setenv("LABSUPPORT_RUNS", str(ceilings_on_another_gpu(tmp_path)))
    lim = hybrid.limits(h200_run)
    assert lim.datasheet_name == "H200 SXM" and lim.ceiling_tbs is None
    p = hybrid.page(h200_run)
    assert p.measured_tbs == "none on this GPU" and p.floor_ms_measured == "–"
    assert p.measured_text.startswith("No practical ceiling was measured on this GPU")
    assert p.mm_vs_ceiling == "(no practical ceiling was measured on this GPU)"
    assert hybrid.measured_column(h200_run) not in hybrid.variants_compact(h200_run)
    monkeypatch.setenv("LABSUPPORT_RUNS", str(FIXTURES))
    p = hybrid.page(h200_run)
    assert p.measured_tbs.endswith(" TB/s") and p.mm_vs_ceiling.endswith("% of the practical ceiling")
    assert hybrid.measured_column(h200_run) in hybrid.variants_compact(h200_run)
