"""The chapter "Launch overhead": its live cells on a CPU (tiny model, the two eager variants),
the order they measure in (every timing before every profile), and its analysis of its fixture
run."""

from pathlib import Path

import pytest

from labsupport import runs
from labsupport.chapters import launch_overhead as lo
from labsupport.chapters import shared
from labsupport.measure import hardware, harness, steps

from .conftest import FIXTURES, fixture_run
from .live_cells import run_live_cells, watch_harness
from .page_names import unglued

pytestmark = pytest.mark.unit

NOTEBOOK = "notebooks/launch_overhead.ipynb"


def _record(tmp_path_factory, fail_profile=None, **params):
    """A CPU run of the live cells, into a copy of the published runs (the page reads the shared
    quantities of the other owners' runs)."""
    import shutil

    from .conftest import RUNS

    root = tmp_path_factory.mktemp("copy") / "runs"
    shutil.copytree(RUNS, root)
    calls = []
    mp = pytest.MonkeyPatch()
    mp.setenv("LABSUPPORT_RUNS", str(root))
    watch_harness(mp, calls, fail_profile)
    real_interleaved = harness.interleaved

    def interleaved(variants, **kw):
        calls.append(("interleaved", tuple(variants)))
        return real_interleaved(variants, **kw)

    mp.setattr(harness, "interleaved", interleaved)
    try:
        ns = run_live_cells(NOTEBOOK, **{"preset": "tiny", "prompt_len": 16, "repeats": 3, "allow_cpu": True, **params})
    finally:
        mp.undo()
    return ns["run"], calls, ns["vals"]


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    run, calls, _ = _record(tmp_path_factory)
    return run, calls


@pytest.mark.live
def test_every_timing_comes_before_every_profile(tiny_run):
    """On a CPU only the two eager steps run: profiled here, timed by "The kernels in one token"."""
    run, calls = tiny_run
    kinds = [c[0] for c in calls]
    assert kinds == ["profile", "profile"], calls  # no timing of the eager steps in this chapter
    assert {what for kind, what in calls if kind == "profile"} == {"decode_step"}
    t = run.table("step_times")
    assert t.empty and list(t.columns) == lo.STEP_TIME_COLUMNS
    assert "ceilings.csv" not in run.meta["files"]  # the ceilings are why-a-gpu's
    assert run.results["method"]["wall_times"].startswith("host clock")
    assert "timed none of the forms" in lo.timing_note(run)


@pytest.mark.live
def test_every_variant_has_a_row_and_only_ok_rows_have_profiles(tiny_run):
    run, _ = tiny_run
    v = run.table("variants")
    assert list(v.variant) == list(lo.VARIANTS)
    ok = v[v.status == "ok"]
    assert list(ok.variant) == ["eager", "eager-static"]
    assert v[v.status != "ok"].status.str.contains("needs a CUDA GPU").all()
    assert ok[["kernels", "profiled_step_ns", "launch_calls"]].notna().all().all()
    assert ok[["wall_ms_median", "wall_ms_min", "wall_ms_q1", "wall_ms_q3"]].isna().all().all()
    assert (ok.graphs_compiled_while_profiling == 0).all()
    files = set(run.meta["files"])
    assert {lo.trace_file(x) for x in lo.VARIANTS} & files == {lo.trace_file("eager"), lo.trace_file("eager-static")}


def test_analysis_of_a_cpu_run(tmp_path_factory):
    run, _, vals = _record(tmp_path_factory)
    own = lo.variants(run).set_index("variant")
    assert own[["wall ms", "tokens/s"]].isna().all().all()  # no eager timing of its own
    v = lo.variants(run, vals).set_index("variant")
    eager, static = v.loc["eager"], v.loc["eager-static"]
    # The eager steps' numbers are the shared ones, from the run of "The kernels in one token".
    assert eager["wall ms"] == vals["eager_wall_ms"].value and eager.kernels == vals["eager_kernels"].value
    assert eager["GPU busy ms"] == vals["eager_gpu_busy_ms"].value
    assert static["wall ms"] == vals["static_wall_ms"].value
    assert eager["from"] == vals["eager_wall_ms"].run.run_id != run.run_id
    assert eager["tokens/s"] == pytest.approx(1e3 / eager["wall ms"])
    assert lo.measured_column(run) in v  # no ceilings on a CPU: the column is there, empty
    assert v.loc["cuda-graph", ["kernels", "wall ms"]].isna().all()
    e = lo.eager_summary(run, vals)
    assert (e.kernels, e.wall_ms, e.issue_ms) == (
        vals["eager_kernels"].value,
        vals["eager_wall_ms"].value,
        vals["eager_issue_ms"].value,
    )
    assert e.launch_share == pytest.approx(e.launch_call_us / e.kernel_interval_us)
    assert e.profiled_ratio == pytest.approx(e.profiled_span_ms / e.wall_ms)
    b = lo.breakdown(run, v["wall ms"])
    parts = b[["before first kernel ms", "kernels running ms", "gaps between kernels ms", "after last kernel ms"]]
    assert (parts.sum(axis=1) - b["profiled step ms"]).abs().max() < 1e-9
    assert (b["profiled / unprofiled"] == b["profiled step ms"] / b["unprofiled wall ms"]).all()
    p = lo.page(run, vals, shared.limits())
    assert p.n_failed == 3 and p.failed_text.startswith("Not every variant ran: ")
    assert (
        p.failed_text.count("not run: needs a CUDA GPU") == 3
        and "*CUDA graph of the static-cache step*" in p.failed_text
    )
    assert p.best in (lo.VARIANTS["eager"], lo.VARIANTS["eager-static"])
    assert p.timing_note == "This run timed none of the forms this chapter owns (they need a CUDA GPU)."


def test_a_variant_failing_in_its_profile_leaves_no_half_row(tmp_path_factory):
    seen = []

    def second_profile_fails(kw):
        seen.append(kw["region"])
        return len(seen) == 2  # eager-static

    run, calls, _ = _record(tmp_path_factory, fail_profile=second_profile_fails, repeats=1)
    v = run.table("variants").set_index("variant")
    assert v.loc["eager", "status"] == "ok"
    assert v.loc["eager-static", "status"].startswith("failed while profiling")
    assert v.loc["eager-static", ["kernels", "wall_ms_median"]].isna().all()
    assert lo.trace_file("eager-static") not in run.meta["files"]


def test_an_empty_gpu_profile_stops_the_recording(runs_root, monkeypatch):
    def empty(fn, path, **kw):
        raise harness.ProfileError("launch-overhead: the profile of 'decode_step' captured no GPU kernels")

    monkeypatch.setattr(harness, "profile_region", empty)
    with pytest.raises(harness.ProfileError, match="captured no GPU kernels"):
        run_live_cells(NOTEBOOK, preset="tiny", prompt_len=8, repeats=1, allow_cpu=True)
    assert not any(runs_root.rglob("meta.json"))


def test_the_owned_forms_are_timed_interleaved_from_step_times(tmp_path):
    """A run of today's format: the owned forms' trials labelled by round; wall by the minimum."""
    run = fixture_run("launch-overhead")
    t = run.table("step_times")
    w = lo.wall_stats(run)
    g = t[t.variant == "cuda-graph"].wall_ms
    assert w.loc["cuda-graph", "wall ms"] == g.min() == lo.shared(run)["graph_wall_ms"]
    assert (
        w.loc["cuda-graph", "wall q1 ms"] <= w.loc["cuda-graph", "wall median ms"] <= w.loc["cuda-graph", "wall q3 ms"]
    )
    assert "one variant after another" in lo.timing_note(run)

    class Run:
        def table(self, name):
            return t.assign(round=t.repeat, clean=True)

    assert "interleaved in" in lo.timing_note(Run())


def test_profiled_figures_say_how_much_longer_the_profiled_step_was():
    run = fixture_run("launch-overhead")
    v = lo.variants(run).set_index("variant")
    bd = lo.breakdown(run, v["wall ms"])
    note = lo.profiled_note(bd, {"eager": "29.1"})
    assert "against 29.1 ms unprofiled" in note
    ratio = bd.set_index("variant").loc["eager", "profiled / unprofiled"]
    assert ratio > 1 and f"({ratio:.1f}×)" in note
    assert "wider than unprofiled" in lo.profiled_note(lo.breakdown(run))  # without the walls: said, unquantified


def test_two_compiled_modes_keep_their_own_entries():
    """The order record() relies on: a second torch.compile of the static step (another
    backend, as another mode is) adds its own entry, and the first compiled step, called again
    for its profile, runs without recompiling (no torch._dynamo.reset() between them)."""
    import torch

    from labsupport.measure import decode, models

    model = models.build_model("tiny")
    ids = decode.Prompt.random(model.config.vocab_size, 1, 8, "cpu").ids
    statics = [steps.StaticStep(model, ids), steps.StaticStep(model, ids)]
    fns = [
        torch.compile(statics[0].forward, backend="eager", fullgraph=True),
        torch.compile(statics[1].forward, backend="aot_eager", fullgraph=True),
    ]
    before = steps.graphs_compiled()
    with torch.no_grad():
        for s, f in zip(statics, fns, strict=True):
            s.prepare()
            f(s.tok, s.pos)
        assert steps.graphs_compiled() - before == 2, "each backend compiled its own graph"
        for s, f in zip(statics, fns, strict=True):
            s.prepare()
            f(s.tok, s.pos)
    assert steps.graphs_compiled() - before == 2, "calling either again recompiled nothing"


# Ceilings ------------------------------------------------------------------------------


def _limits(ceiling=None, copy=4.2, sheet=4.8):
    return hardware.Limits(
        datasheet_name="H200 SXM" if sheet else None,
        datasheet_tflops=989.0 if sheet else None,
        datasheet_tbs=sheet,
        gemm_tflops=800.0,
        copy_tbs=copy,
        read_tbs=ceiling,
        ceiling_tbs=ceiling,
        ceiling_by="read stream (sum), 4 GiB" if ceiling else None,
    )


def test_a_rate_above_the_practical_ceiling_gets_its_sentence():
    assert hardware.above_ceiling_note("It", 4.0, _limits(ceiling=4.3)) == ""
    assert hardware.above_ceiling_note("It", 4.4, _limits()) == "", "the copy is never a ceiling"
    assert hardware.above_ceiling_note("It", float("nan"), _limits()) == ""
    above = hardware.above_ceiling_note("The LM head's 4.40 TB/s", 4.4, _limits(ceiling=4.3))
    assert "practical ceiling, 4.30 TB/s (read stream (sum), 4 GiB)" in above and "not a limit of the hardware" in above
    assert "datasheet's 4.8 TB/s" in above and "(92%)" in above
    above_sheet = hardware.above_ceiling_note("It", 5.0, _limits(ceiling=4.3))
    assert "above even the datasheet's 4.8 TB/s" in above_sheet
    assert "datasheet" not in hardware.above_ceiling_note("It", 4.4, _limits(ceiling=4.3, sheet=None))


# The fixture run (a recorded H200 run) -----------------------------------------------------


def test_fixture_run_replays(runs_root):
    run = fixture_run("launch-overhead")
    v = lo.variants(run)
    assert hardware.run_limits(run).read_tbs and lo.measured_column(run) == "of practical ceiling" in v
    ok = v[v.status == "ok"]
    assert (ok["wall ms"] <= ok["wall q1 ms"]).all() and (ok["wall q1 ms"] <= ok["wall q3 ms"]).all()
    assert (ok["from"] == "this run").all()
    assert "before the first profile" in lo.timing_note(run)
    with pytest.raises(runs.RunError):
        lo.load("no-such-run")  # from the empty runs folder of runs_root


def test_timing_note_of_older_runs():
    t = fixture_run("launch-overhead").table("step_times")

    class Run:  # all timing_note reads of a run: its step times
        def __init__(self, times):
            self.times = times

        def table(self, name):
            return self.times

    assert "older than the book's measuring harness" in lo.timing_note(Run(t.drop(columns=["clean"])))
    assert "after a profile" in lo.timing_note(Run(t.assign(clean=t.repeat > 0)))


# A run recorded with today's code, made from a recorded one -------------------------------


def modern_copy(run: runs.Run, root, run_id: str | None = None) -> runs.Run:
    """A copy of a published GPU run, under `root`, with the columns today's record() writes
    and older runs lack: `clean` and the fastest/slowest wall time in every table that has wall
    times, CUDA-event `gpu_ms` per repeat, a measured read stream among the ceilings, the
    measuring method in the results. Its checksums are rewritten; it loads like a new run."""
    import hashlib
    import json
    import shutil

    import pandas as pd

    run_id = run_id or run.run_id.split("-")[0] + "-today"
    dst = root / run.chapter / run_id
    shutil.copytree(run.path, dst)
    t = pd.read_csv(dst / "step_times.csv")
    keys = [c for c in ("variant", "backend", "mode") if c in t]
    t["gpu_ms"] = t.wall_ms * 0.9
    t["clean"] = True
    t.to_csv(dst / "step_times.csv", index=False)
    v = pd.read_csv(dst / "variants.csv")
    wall = t.groupby(keys).wall_ms
    idx = pd.MultiIndex.from_frame(v[keys]) if len(keys) > 1 else v[keys[0]]
    v["wall_ms_min"] = wall.min().reindex(idx).values
    v["wall_ms_max"] = wall.max().reindex(idx).values
    v["clean"] = v.status.eq("ok")
    v["graphs_compiled_while_profiling"] = 0
    v.to_csv(dst / "variants.csv", index=False)
    if (dst / "prefill.csv").is_file():
        p = pd.read_csv(dst / "prefill.csv")
        p["clean"] = p.status.eq("ok")
        p.to_csv(dst / "prefill.csv", index=False)
    c = pd.read_csv(dst / "ceilings.csv")
    c["read_bytes"], c["read_ms_median"], c["read_ms_min"], c["read_ms_max"] = 4 * 2**30, 1.0, 0.99, 1.02
    c["read_by"] = "sum"
    c["read_tbs"] = c.read_bytes / (c.read_ms_median * 1e-3) / 1e12
    c.to_csv(dst / "ceilings.csv", index=False)
    meta = json.loads((dst / "meta.json").read_text())
    meta["run_id"] = run_id
    meta["results"]["method"] = harness.method()
    meta["files"] = {name: hashlib.sha256((dst / name).read_bytes()).hexdigest() for name in meta["files"]}
    (dst / "meta.json").write_text(json.dumps(meta, indent=1))
    return runs.load_run(run.declaration, run_id, root=root)


def replay_notebook(notebook: str, run: runs.Run, tmp_path) -> str:
    """Execute a chapter notebook in replay mode on `run` (from the runs folder it lies in);
    returns its outputs as text. A failing cell raises."""
    import json
    import os

    import nbformat
    import papermill as pm

    from .conftest import REPO

    env = {"LABSUPPORT_RUNS": os.environ.get("LABSUPPORT_RUNS")}
    os.environ["LABSUPPORT_RUNS"] = str(run.path.parents[1])
    try:
        out = tmp_path / Path(notebook).name
        pm.execute_notebook(
            str(REPO / notebook),
            str(out),
            parameters={"mode": "replay", "run_id": run.run_id},
            cwd=str(REPO / "notebooks"),
            kernel_name="python3",
            progress_bar=False,
        )
    finally:
        if env["LABSUPPORT_RUNS"] is None:
            os.environ.pop("LABSUPPORT_RUNS", None)
        else:
            os.environ["LABSUPPORT_RUNS"] = env["LABSUPPORT_RUNS"]
    return json.dumps([c.get("outputs", []) for c in nbformat.read(out, as_version=4).cells])


# What the static cache adds ------------------------------------------------------------------


def _check_static_cache(run):
    k_eager, k_static = lo.kernel_table(run, "eager"), lo.kernel_table(run, "eager-static")
    d = lo.static_cache_diff(run)
    assert list(d.row) == ["differs"] * (len(d) - 2) + ["rest", "total"]
    total, rest = d.set_index("row").loc["total"], d.set_index("row").loc["rest"]
    shown = d[d.row == "differs"]
    assert total["call path"] == "total" and rest["call path"].startswith("every other path")
    assert (total["eager kernels"], total["static kernels"]) == (len(k_eager), len(k_static))
    assert total["Δ kernels"] == len(k_static) - len(k_eager)
    for col in ("eager kernels", "static kernels", "Δ kernels", "eager µs", "static µs", "Δ µs"):
        assert shown[col].sum() + rest[col] == pytest.approx(total[col])
    assert (d["Δ kernels"] == d["static kernels"] - d["eager kernels"]).all()
    assert (d["Δ µs"] - (d["static µs"] - d["eager µs"])).abs().max() < 1e-6
    assert ((shown["Δ kernels"] != 0) | (shown["Δ µs"].abs() >= 20)).all(), "only the paths that differ"
    assert rest["Δ kernels"] == 0, "every path whose kernel count differs is listed"
    assert total["eager µs"] * 1e3 == pytest.approx(k_eager.dur_ns.sum())
    s = lo.static_cache_summary(run)
    assert (s.eager_kernels, s.static_kernels) == (len(k_eager), len(k_static))
    assert s.static_busy_ms * 1e6 == pytest.approx(
        int(run.table("variants").set_index("variant").loc["eager-static", "gpu_busy_ns"])
    )
    assert s.eager_attn_kernels <= s.eager_layer_kernels and s.static_attn_kernels <= s.static_layer_kernels
    return d, s


def test_static_cache_diff_on_the_fixture_run():
    run = fixture_run("launch-overhead")
    d, s = _check_static_cache(run)
    # every decoder layer runs the same kernels, so the layers and what is outside them make the whole step
    assert s.eager_layer_kernels * s.layers + s.eager_outside_kernels == s.eager_kernels
    assert s.static_layer_kernels * s.layers + s.static_outside_kernels == s.static_kernels
    assert s.graph_busy_ms is not None
    known = d[d.row == "differs"]
    assert (known["what it is"] != "").all(), "every differing path of the recorded run is explained"
    paths = lo.call_paths(run, "eager-static")
    inner = paths.call.str.split(" › ").str[-1]
    assert (inner == paths.op.str.removeprefix("aten::")).all(), "a call path ends at the kernel's own operator"


@pytest.mark.live
def test_static_cache_diff_on_a_cpu_run(tiny_run):
    run, _ = tiny_run
    _check_static_cache(run)
    paths = lo.call_paths(run, "eager")
    assert (paths.call == paths.op.str.removeprefix("aten::")).all()


@pytest.mark.book
def test_the_page_replays_a_run_recorded_with_todays_columns(tmp_path):
    import shutil

    from .conftest import RUNS

    shutil.copytree(RUNS, tmp_path / "runs")  # the other owners' published runs, which the page reads
    run = modern_copy(fixture_run("launch-overhead"), tmp_path / "runs")
    assert "clean" in run.table("step_times") and hardware.run_limits(run).read_tbs
    assert "before the first profile" in lo.timing_note(run)
    _check_static_cache(run)
    text = replay_notebook("notebooks/launch_overhead.ipynb", run, tmp_path)
    assert "Traceback" not in text and "image/png" in text
    assert "The static cache" in text and "of practical ceiling" in text
    assert "Profiled steps: the profiler adds its own work" in text


# The fixes, on the fixture run ---------------------------------------------------------------


def test_the_fixes_table():
    run = fixture_run("launch-overhead")
    v = lo.variants(run).set_index("variant")
    assert list(v.index) == list(lo.VARIANTS) and (v.status == "ok").all()
    eager = v.loc["eager"]
    assert eager["launch calls"] == eager.kernels, "eager: one launch call per kernel"
    assert v.loc["cuda-graph", "launch calls"] == 1
    assert v.loc["compile-reduce-overhead", "kernels"] < eager.kernels
    assert (v["of datasheet limit"] < 1).all() and (v[lo.measured_column(run)] < 1).all()
    assert (v["tokens/s"] == 1e3 / v["wall ms"]).all()
    sheet = hardware.datasheet("NVIDIA H200")
    assert eager["of datasheet limit"] == pytest.approx(15_136_811_008 / (eager["wall ms"] / 1e3) / 4.8e12)
    assert sheet.bandwidth_tbs == 4.8
    h = lo.headline(run)
    assert h == {
        "eager wall ms": eager["wall ms"],
        "best wall ms": v["wall ms"].min(),
        "CUDA graph wall ms": v.loc["cuda-graph", "wall ms"],
    }


def test_breakdown_adds_up():
    b = lo.breakdown(fixture_run("launch-overhead"))
    assert list(b.variant) == list(lo.VARIANTS)
    parts = b[["before first kernel ms", "kernels running ms", "gaps between kernels ms", "after last kernel ms"]]
    assert (parts.sum(axis=1) - b["profiled step ms"]).abs().max() < 1e-9
    assert (parts >= 0).all().all()


def test_eager_summary_and_layer_labels():
    from labsupport.chapters import kernels_in_one_token as one_token

    run = fixture_run("launch-overhead")
    e = lo.eager_summary(run)
    assert e.kernels == 2218 == lo.kernel_table(run, "eager").shape[0]
    assert e.gpu_busy_ms < e.wall_ms and e.issue_ms <= e.wall_ms
    k = lo.kernel_table(run, "eager")
    sel, what = lo.one_layer(k, 36)
    census = one_token.summary(fixture_run("kernels-in-one-token"))
    assert what.startswith("decoder layer") and len(sel) == census.kernels_per_layer


# The page, on the fixture run ---------------------------------------------------------------


def _fixture_page():
    run = fixture_run("launch-overhead")
    vals = shared.values(given={lo.CHAPTER: run}, root=FIXTURES)
    return run, vals, lo.page(run, vals, shared.limits(root=FIXTURES))


def test_the_page_of_the_fixture_run():
    """The page's numbers against the run's own CSV tables and the shared quantities."""
    import pandas as pd

    run, vals, p = _fixture_page()
    table = pd.read_csv(run.path / "variants.csv").set_index("variant")
    trials = pd.read_csv(run.path / "step_times.csv")
    walls = trials.groupby("variant").wall_ms.min()  # the estimator of a run without probe readings
    walls["eager"], walls["eager-static"] = vals["eager_wall_ms"].value, vals["static_wall_ms"].value
    best = walls.idxmin()
    assert best == "compile-reduce-overhead" and p.best == lo.VARIANTS[best]
    assert p.best_wall.text == vals["compiled_wall_ms"].text
    assert p.best_speedup == pytest.approx(walls["eager"] / walls[best])
    assert p.best_tokens == pytest.approx(1e3 / walls[best]) and p.eager_tokens == pytest.approx(1e3 / walls["eager"])
    assert (p.try_best_kernels, p.try_best_launch_calls) == (
        table.loc[best, "kernels"],
        table.loc[best, "launch_calls"],
    )
    assert p.try_best_wall_per_kernel_us == pytest.approx(walls[best] * 1e3 / table.loc[best, "kernels"])
    eager = table.loc["eager"]
    gaps = eager.last_kernel_end_ns - eager.first_kernel_ns - eager.gpu_busy_ns
    assert p.try_eager_gap_share == pytest.approx(gaps / max(eager.profiled_step_ns, eager.last_kernel_end_ns))
    assert p.busy_pct == pytest.approx(vals["eager_gpu_busy_ms"].value / vals["eager_wall_ms"].value)
    assert p.n_failed == 0 and p.failed_text == "Every variant ran."
    assert p.prompt_len == run.parameters["prompt_len"] == 256
    assert p.run_label == f"NVIDIA H200, run `{run.run_id}`, 2026-11-30"
    assert f"({shared.limits(root=FIXTURES).ceiling_tbs:.2f} TB/s)" in p.measured_text
    assert "one variant after another" in p.timing_note
    # what the static cache adds, against the profiled steps' rows
    extra = int(table.loc["eager-static", "kernels"] - eager.kernels)
    assert f"{extra:+,d} kernels" in p.sc_open_text
    slower = walls["eager-static"] > walls["eager"]
    assert p.sc_open_text.startswith("The static cache is the one change" if slower else "The static cache changes")
    assert p.sc_end_text.endswith("once the addresses stay put.")  # the graph is faster than eager here
    assert p.static_diff is not None and "row" not in p.static_diff
    assert list(p.breakdown.variant) == list(table.index)
    assert list(p.fixed.index) == list(table.index)
    assert p.fixes.loc[p.fixes.variant == lo.VARIANTS[best], "kernels / launch calls"].item() == "834 / 2"


def test_every_glue_name_of_the_prose_is_glued():
    _, _, p = _fixture_page()
    assert unglued(NOTEBOOK, p) == set()


def test_the_failed_text_names_each_variant_that_did_not_run():
    import pandas as pd

    table = pd.DataFrame({"variant": ["eager", "cuda-graph"], "status": ["ok", "not run: needs a CUDA GPU"]})
    assert (
        lo.failed_text(table)
        == "Not every variant ran: *CUDA graph of the static-cache step*: not run: needs a CUDA GPU."
    )
