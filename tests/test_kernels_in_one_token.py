"""The chapter's analysis on its fixture run, and its live cells on a CPU (tiny model)."""

import statistics

import pandas as pd
import pytest
import torch

from labsupport.chapters import kernels_in_one_token as one_token
from labsupport.measure import decode, environment, hardware, harness

from .conftest import FIXTURES, tree_bytes
from .live_cells import run_live_cells, watch_harness
from .page_names import unglued

pytestmark = pytest.mark.unit

NOTEBOOK = "notebooks/kernels_in_one_token.ipynb"
TINY = dict(preset="tiny", prompt_len=16, contexts=[16, 32], repeats=2, fresh_processes=1, allow_cpu=True)


def test_summary_is_consistent_with_the_tables(published, published_kernels):
    s = one_token.summary(published)
    census = published.table("census").set_index("kind")
    assert s.kernels == census.loc["total", "kernels"] == len(published_kernels)
    assert s.matmul_kernels == census.loc["matrix multiply", "kernels"]
    assert s.matmul_ms == pytest.approx(census.loc["matrix multiply", "gpu_ns"] / 1e6)
    assert s.matmul_tbs == pytest.approx(s.matmul_gb / s.matmul_ms)
    assert s.gpu_busy_ms <= s.kernel_ms + 1e-9
    assert s.gpu_busy_ms < s.wall_ms
    walls = published.table("step_times").wall_ms
    assert s.wall_ms == walls.min()  # the book's estimator: the minimum
    assert s.wall_median_ms == statistics.median(walls) and s.trials == len(walls)
    assert s.wall_ms <= s.wall_q1_ms <= s.wall_median_ms <= s.wall_q3_ms <= s.wall_max_ms
    assert s.idle_ms == pytest.approx(s.wall_ms - s.gpu_busy_ms)
    assert s.kernel_interval_us == pytest.approx(s.wall_ms * 1e3 / s.kernels)
    assert s.datasheet_name == "H200 SXM" and s.datasheet_tbs == 4.8
    assert s.best_case_ms == pytest.approx(15.1368 / 4.8, rel=1e-4)
    assert s.math_ms_datasheet == pytest.approx(2 * 7_568_097_280 / 989e12 * 1e3)
    assert s.attention_kernels == s.layers == 36


def test_census_beside_published_keeps_them_apart(published):
    t = one_token.census_beside_published(published)
    assert [c[0] for c in t.columns].count("H100 (published)") == 3
    assert t.loc["total", ("H100 (published)", "kernels")] == 2398
    total = published.table("census").set_index("kind").loc["total", "kernels"]
    assert t.loc["total", ("H200 (this run)", "kernels")] == total


def test_layer_views(published):
    s = one_token.summary(published)
    layer = one_token.layer_kernels(published, one_token.middle_layer(published))
    assert len(layer) == s.kernels_per_layer
    assert layer["start µs"].min() == 0 and layer["start µs"].is_monotonic_increasing
    assert {"self_attn.q_proj", "mlp.down_proj", "input_layernorm"} <= set(layer.module)
    per_layer = one_token.per_layer(published)
    assert (per_layer["all kernels"] == s.kernels_per_layer).all()
    outside = one_token.outside_layers(published)
    assert per_layer["all kernels"].sum() + outside.kernels.sum() == s.kernels


def test_context_sweep_table(published):
    sweep = one_token.context_sweep(published)
    assert list(sweep.context) == published.parameters["contexts"]
    assert ((sweep["attention share"] > 0) & (sweep["attention share"] < 1)).all()
    layers = published.results["model"]["layers"]
    # One attention kernel per layer, or two where cuDNN adds its reduction step (longer contexts).
    assert sweep.attention_kernels.isin([layers, 2 * layers]).all()


def test_kv_cache_text_is_about_the_longest_context(published):
    longest = max(one_token.context_sweep(published).context)
    text = one_token.kv_cache_text(published)
    assert text.startswith(f"At {longest:,} tokens the cache holds")
    assert "With a static cache" in text


def test_shared_quantities_of_the_fixture_run(published):
    """The eager step for the whole book, from an old run (timed one block after another)."""
    from labsupport.chapters import shared

    got = shared.owner_values("kernels-in-one-token", published)  # checked against the declaration
    s = one_token.summary(published)
    assert got["eager_wall_ms"] == s.wall_ms == min(published.table("step_times").wall_ms)
    assert got["eager_arrival_us"] == pytest.approx(s.wall_ms * 1e3 / s.kernels)
    row = published.table("context_sweep").set_index("context").loc[published.parameters["prompt_len"]]
    assert got["static_wall_ms"] == row.static_wall_ms_min and got["static_kernels"] == row.static_kernels
    assert got["eager_issue_ms"] <= got["eager_wall_ms"]


def test_the_eager_step_is_the_median_of_its_fast_host_trials(published, monkeypatch):
    """A run whose trials carry probe readings: the shared eager step is the median of those taken
    within 15% of the best reading, with their quartiles, minimum and count, and the page says so."""
    from labsupport.chapters import shared

    real = published.table

    def with_probe(name, **kw):
        t = real(name, **kw)
        if name == "step_times":
            t["probe_ms"] = [7.0 if i % 3 else 14.0 for i in range(len(t))]  # one trial in three on a slow host
        return t

    monkeypatch.setattr(published, "table", with_probe)
    t = with_probe("step_times")
    fast = t[t.probe_ms == 7.0].wall_ms
    got = shared.owner_values("kernels-in-one-token", published)
    assert got["eager_wall_ms"] == pytest.approx(fast.median()) and got["eager_fast_trials"] == len(fast)
    assert got["eager_wall_min_ms"] == fast.min() and got["eager_trials"] == len(t)
    assert got["eager_wall_median_ms"] == pytest.approx(t.wall_ms.median())
    s = one_token.summary(published)
    assert "median of the" in one_token.estimator_text(s.estimator, s.fast_trials, s.trials)


def test_an_old_run_says_it_is_estimated_by_the_minimum(published):
    s = one_token.summary(published)
    assert s.estimator == "minimum" and "before each trial carried" in one_token.estimator_text(
        s.estimator, s.fast_trials, s.trials
    )
    assert "before the plain script" in one_token.plain_text(published)


def test_the_plain_script_is_compared_by_the_same_estimator(published, monkeypatch):
    real, files = published.table, dict(published.meta["files"])
    plain = real("step_times")[["repeat", "wall_ms"]].rename(columns={"repeat": "trial"})
    plain["wall_ms"] *= 1.2  # 20% slower: they do not agree
    plain["probe_ms"] = 7.0
    monkeypatch.setattr(
        published, "table", lambda name, **kw: plain if name == "plain_eager_step" else real(name, **kw)
    )
    monkeypatch.setitem(published.meta, "files", {**files, "plain_eager_step.csv": {}})
    p = one_token.plain_step(published)
    assert p.ratio == pytest.approx(plain.wall_ms.median() / min(real("step_times").wall_ms))
    assert not p.agree and "differ by more than 10%" in one_token.plain_text(published)
    plain["probe_ms"] = 30.0  # the plain script ran while the host was slow: not compared
    with_probe = real("step_times").assign(probe_ms=7.0)
    monkeypatch.setattr(
        published,
        "table",
        lambda name, **kw: plain if name == "plain_eager_step" else with_probe if name == "step_times" else real(name),
    )
    assert one_token.plain_step(published).plain.trials == 0
    assert "not compared" in one_token.plain_text(published)


def test_summary_takes_the_ceilings_it_is_given(published):
    lim = hardware.Limits("H200 SXM", 989.0, 4.8, 700.0, 4.0, 4.2)
    s = one_token.summary(published, lim)
    assert s.read_tbs == 4.2 and s.matmul_fraction_read == pytest.approx(s.matmul_tbs / 4.2)


def test_context_walls_are_read_by_the_minimum(published):
    sweep = one_token.context_sweep(published)
    assert (sweep["wall ms"] == sweep.wall_ms_min).all()
    assert (sweep["static wall ms"] == sweep.static_wall_ms_min).all()
    text = one_token.context_wall_text(published)
    assert text.startswith("By the minimum of its trials")


def test_a_slow_median_is_explained_from_the_run(published, monkeypatch):
    """The published run's 4,096-token median (59 ms against a 30 ms minimum): said so, with the numbers."""
    real = published.table

    def slow_4096(name, **kw):
        t = real(name, **kw)
        if name == "context_sweep":
            t.loc[t.context == 4096, ["wall_ms_median", "wall_ms_min", "wall_ms_max"]] = [59.08, 29.98, 63.37]
        return t

    monkeypatch.setattr(published, "table", slow_4096)
    text = one_token.context_wall_text(published)
    assert "At 4,096 tokens the median" in text and "59.1 ms" in text and "30.0 ms" in text
    assert "2.0 times their minimum" in text and "the host did" in text


def test_static_copies_of_an_old_run_are_said_plainly(published):
    assert one_token.static_copies(published) is None
    text = one_token.kv_cache_text(published)
    assert "recorded the copies by kind only" in text and "grow in proportion to the context" in text
    assert "not broken down" not in text


@pytest.mark.live
def test_live_cells_on_cpu_write_a_valid_run(copied_runs, monkeypatch):
    """Into a copy of the published runs: the page reads the other owners' shared quantities."""
    calls = []
    watch_harness(monkeypatch, calls)
    real_interleaved = harness.interleaved

    def interleaved(variants, **kw):
        calls.append(("interleaved", kw["what"], tuple(variants)))
        return real_interleaved(variants, **kw)

    monkeypatch.setattr(harness, "interleaved", interleaved)
    run = run_live_cells(NOTEBOOK, **TINY)["run"]
    assert run.path.parent.parent == copied_runs
    assert run.provenance["device"] == "cpu"
    assert {"kernels.csv", "census.csv", "step_times.csv", "context_sweep.csv", "trace.json.gz"} <= set(
        run.meta["files"]
    )
    assert set(run.results) == {"method", "model", "host_probe", "host_slow", "compile"}
    # Every timing before the first profile, but the one that measures the profiler's effect; the two
    # caches interleaved at every context, the prompt's length (16, not in `contexts`) included.
    first = calls.index(("profile", "decode_step"))
    before = [c for c in calls[:first] if c[0] == "interleaved"]
    assert before == [("interleaved", f"decode step, {n} tokens", ("dynamic", "static")) for n in (16, 32)]
    assert [c for c in calls[first:] if c[0] in ("time", "interleaved")] == [
        ("interleaved", "decode step, 16 tokens, after a profile", ("dynamic",))
    ]
    assert not [c for c in calls if c[0] == "time"]  # no block-by-block timing left
    assert "ceilings.csv" not in run.meta["files"]  # the ceilings are why-a-gpu's
    pd.testing.assert_frame_equal(one_token.recompute_census(run), run.table("census"), check_dtype=False)
    k = one_token.kernel_table(run)
    assert {"matrix multiply", "attention", "reduction"} <= set(k.kind)
    assert sorted(k.layer.dropna().unique()) == [0, 1]
    times = run.table("step_times")
    assert len(times) == 2 and times.clean.all() and list(times["round"]) == [0, 1]
    assert (times.probe_ms > 0).all()  # every trial carries the host probe's reading of its round
    plain = run.table("plain_eager_step")  # the plain script, in a fresh process, the same number of trials
    assert len(plain) == 2 and (plain.wall_ms > 0).all() and (plain.probe_ms > 0).all()
    assert one_token.plain_step(run).plain.of == 2
    effect = run.table("profiler_effect").set_index("condition")
    assert list(effect.index) == ["fresh process", "before profiling", "after profiling", "inside the profiler"]
    assert effect.loc["before profiling", "wall_ms_min"] == pytest.approx(min(times.wall_ms))
    # The context sweep's row at the prompt length is the step measured above, not a second measurement.
    sweep = run.table("context_sweep").set_index("context")
    assert list(sweep.index) == [16, 32]
    assert sweep.loc[16, "wall_ms_estimate"] == one_token.summary(run).wall_ms == harness.table_estimate(times).value
    assert sweep.loc[16, "kernels"] == one_token.summary(run).kernels
    assert sweep.loc[16, "wall_repeats"] == sweep.loc[16, "static_wall_repeats"] == 2  # `repeats` rounds
    assert sweep.loc[32, "wall_repeats"] == one_token.Params().context_repeats
    ct = run.table("context_times")
    assert set(zip(ct.context, ct.cache, strict=True)) == {(c, k) for c in (16, 32) for k in ("dynamic", "static")}
    assert list(ct[(ct.context == 16) & (ct.cache == "dynamic")].wall_ms) == list(times.wall_ms)
    # The shared quantities of a new run, and the kernels of every profiled step by call path.
    from labsupport.chapters import shared

    got = shared.owner_values("kernels-in-one-token", run)
    assert got["static_wall_ms"] == sweep.loc[16, "static_wall_ms_estimate"] and got["eager_trials"] == 2
    ops = one_token.context_ops(run)
    assert set(ops.cache) == {"dynamic", "static"} and (ops.kernels > 0).all()
    for (ctx, cache), g in ops.groupby(["context", "cache"]):
        col = "kernels" if cache == "dynamic" else "static_kernels"
        assert g.kernels.sum() == sweep.loc[ctx, col]
    copies = one_token.static_copies(run)
    assert copies is not None and copies["share"].sum() == pytest.approx(1.0)
    assert "breaks them down" in one_token.kv_cache_text(run)
    # Both caches at every context, timed before any profile.
    assert sweep.wall_clean.all() and sweep.static_wall_clean.all()
    assert (sweep.static_kernels > 0).all() and (sweep.cat_ns > 0).all()
    assert set(run.table("context_census").cache) == {"dynamic", "static"}
    assert list(run.table("context_sweep").status) == ["ok", "ok"]
    assert not list(copied_runs.rglob(".incomplete-*")) and not list(run.path.glob(".*"))
    # The page of a CPU run: every context has its attention share, the one fresh process is said.
    p = one_token.page(run, shared.values(given={one_token.CHAPTER: run}), shared.limits())
    assert p.try_ctx_last == 32 and p.fresh_n == 1 and p.fresh_note.startswith("In 1 fresh processes")
    assert p.static_copies is not None and len(p.timeline_kernels) == p.kernels_per_layer


def test_live_mode_without_a_gpu_is_refused(runs_root):
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    with pytest.raises(environment.EnvironmentProblem, match="live mode needs a CUDA GPU"):  # first cell
        run_live_cells(NOTEBOOK, preset="qwen3-8b")
    with pytest.raises(decode.NoGPUError, match="only allowed for tests"):
        run_live_cells(NOTEBOOK, preset="qwen3-8b", allow_cpu=True)
    assert list(runs_root.iterdir()) == []


def test_unknown_preset_fails_before_any_work(runs_root):
    with pytest.raises(ValueError, match="unknown model preset 'qwen9'"):
        run_live_cells(NOTEBOOK, **{**TINY, "preset": "qwen9"})
    assert list(runs_root.iterdir()) == []


@pytest.mark.live
def test_interrupted_live_run_leaves_published_run_untouched(copied_runs, monkeypatch):
    before = tree_bytes(copied_runs)

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(harness, "interleaved", interrupted)
    with pytest.raises(KeyboardInterrupt):
        run_live_cells(NOTEBOOK, **TINY)
    assert tree_bytes(copied_runs) == before


@pytest.mark.live
def test_out_of_memory_at_a_long_context_is_recorded(copied_runs, monkeypatch):
    real = decode.profile_decode_step

    def oom_at_long_context(model, prompt, *a, **k):  # when the long context is profiled
        if prompt.ids.shape[1] >= 32:
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        return real(model, prompt, *a, **k)

    monkeypatch.setattr(decode, "profile_decode_step", oom_at_long_context)
    run = run_live_cells(NOTEBOOK, **TINY)["run"]
    sweep = run.table("context_sweep")
    assert list(sweep.status) == ["ok", "out of memory (profile)"]
    assert list(one_token.context_sweep(run).context) == [16]


def test_every_eager_trial_gets_its_nearest_probe_reading(published, monkeypatch):
    """A run from before per-trial readings (readings before, every few rounds and after the trials,
    as the published H200 runs hold them): each trial gets the reading nearest its round; a run whose
    trials carry readings: their own; the figure shows every trial."""
    real = published.table
    what = f"decode step, {published.parameters['prompt_len']} tokens"
    monkeypatch.setattr(
        published,
        "table",
        lambda name, **kw: real(name, **kw).assign(round=range(20)) if name == "step_times" else real(name, **kw),
    )
    probe = [
        {"at": "run opened", "ms": 99.0},
        {"at": f"before {what}", "ms": 12.0},
        {"at": f"{what}, after round 10", "ms": 8.0},
        {"at": f"after {what}", "ms": 7.0},
        {"at": f"before {what}, after a profile", "ms": 50.0},
    ]
    monkeypatch.setitem(published.results, "host_probe", probe)
    t = one_token.step_trials(published)
    assert len(t) == 20 and set(t.reading) == {"the nearest reading by round"}
    # rounds 0-4 nearest "before" (-0.5), 5-14 nearest "after round 10" (9.5), 15-19 nearest "after" (19.5)
    assert list(t.probe_ms) == [12.0] * 5 + [8.0] * 10 + [7.0] * 5
    monkeypatch.setattr(
        published,
        "table",
        lambda name, **kw: real(name, **kw).assign(probe_ms=7.5) if name == "step_times" else real(name, **kw),
    )
    own = one_token.step_trials(published)
    assert (own.probe_ms == 7.5).all() and set(own.reading) == {"its own round's reading"}
    fig = one_token.probe_figure(pd.concat([t, own]), published.label)
    assert [len(c.get_offsets()) for c in fig.axes[0].collections] == [20, 20]


def test_the_probe_figure_builds_without_trials(published):
    empty = one_token.kept_trials(root=published.path.parent.parent.parent / "no-runs-here")
    assert empty.empty
    fig = one_token.probe_figure(empty, "no run")
    assert "no kept run" in fig.axes[0].texts[0].get_text()


def test_the_plain_script_is_skipped_where_the_repository_is_not(tmp_path, monkeypatch):
    """labsupport installed from its wheel has no benchmarks/ folder: the chapter records without it."""
    from labsupport.runs import provenance

    monkeypatch.setattr(provenance, "REPO_ROOT", tmp_path)
    params = one_token.Params(device="cpu", prompt_len=8)
    assert one_token.plain_eager_step(params, tmp_path / "plain.csv", trials=2, tiny=True) is None


# The page, on the fixture run ---------------------------------------------------------------


@pytest.fixture(scope="module")
def fixture_page(published):
    from labsupport.chapters import shared

    vals = shared.values(given={one_token.CHAPTER: published}, root=FIXTURES)
    return vals, one_token.page(published, vals, shared.limits(root=FIXTURES))


def test_the_page_of_the_fixture_run(published, fixture_page):
    """The page's numbers against the run's own CSV tables, the published profile and the shared quantities."""
    from labsupport.chapters import published as published_profiles

    vals, p = fixture_page
    csv = published.path
    census = pd.read_csv(csv / "census.csv").set_index("kind").kernels
    theirs = published_profiles.QWEN3_8B_H100_CENSUS.set_index("kind").kernels
    assert (p.d_elementwise, p.d_copy) == (
        census["elementwise"] - theirs["elementwise"],
        census["copy/convert/concat"] - theirs["copy/convert/concat"],
    )
    assert p.p_kernels == theirs["total"] == 2398 and p.p_token_ms == 29.3
    kernels = pd.read_csv(csv / "kernels.csv")
    elementwise = kernels[kernels.kind == "elementwise"]
    assert p.try_elementwise_n == len(elementwise) == census["elementwise"]
    assert p.try_elementwise_share == pytest.approx(elementwise.dur_ns.sum() / kernels.dur_ns.sum())
    assert p.kernel_ms == pytest.approx(kernels.dur_ns.sum() / 1e6)
    assert p.kernels_per_layer == kernels.dropna(subset=["layer"]).groupby("layer").size().mode().min() == 61
    assert p.layers == published.results["model"]["layers"] == p.attention_kernels
    sweep = pd.read_csv(csv / "context_sweep.csv")
    longest = sweep[sweep.status == "ok"].iloc[-1]
    assert p.try_ctx_last == longest.context == 32768
    assert p.try_attn_share_last == pytest.approx(longest.attention_ns / longest.kernel_ns)
    fresh = pd.read_csv(csv / "fresh_processes.csv")
    assert p.fresh_n == len(fresh) == published.parameters["fresh_processes"]
    assert all(f"{low:.1f}" in p.fresh_note for low in fresh.wall_ms_min)
    effect = pd.read_csv(csv / "profiler_effect.csv").set_index("condition")
    assert p.profiled_span_ms == effect.loc["inside the profiler", "wall_ms_median"]
    assert p.profiled_ratio == pytest.approx(p.profiled_span_ms / vals["eager_wall_ms"].value)
    assert f"{p.profiled_span_ms:.1f} ms" in p.timeline_note and f"{p.profiled_span_ms:.1f} ms" in p.timeline_title
    walls = pd.read_csv(csv / "step_times.csv").wall_ms
    assert (
        p.estimator_text
        == f"minimum of {len(walls)} trials (a run recorded before each trial carried a host-probe reading)"
    )
    assert p.try_wall_tokens == pytest.approx(1e3 / walls.min())
    assert (
        p.plain_text.startswith("This run was recorded before the plain script") and p.plain_wall_ms != p.plain_wall_ms
    )
    assert p.static_copies is None and "recorded the copies by kind only" in p.kv_text  # no context_ops.csv
    assert (p.param_prompt_len, p.param_repeats, p.param_context_repeats) == (256, 20, 5)
    assert p.run_label == f"NVIDIA H200, run `{published.run_id}`, 2026-11-30" and p.datasheet_name == "H200 SXM"
    assert (p.timeline_kernels.layer == 18).all() and len(p.timeline_kernels) == p.kernels_per_layer
    assert list(p.gemv_table.projection) == list(one_token.PROJECTIONS)
    assert list(p.fresh_table.columns) == ["process", "min ms", "median ms", "max ms", "CPU", "load (1 min) before"]


def test_every_glue_name_of_the_prose_is_glued(fixture_page):
    _, p = fixture_page
    assert unglued(NOTEBOOK, p) == set()


def test_a_run_without_fresh_processes_says_so():
    assert one_token.fresh_note(None).startswith("This run predates the timing in fresh processes")
    assert "did not record by how much" in one_token.timeline_note(float("nan"), 26.6)
    assert one_token.timeline_title(18, float("nan"), 26.6).endswith("(profiled: gaps wider than unprofiled)")
