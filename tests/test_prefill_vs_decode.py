"""Chapter "Prompt phase vs decode phase": the FLOP and byte arithmetic against hand counts
for Qwen3-8B, the notebook's live cells on a CPU with the tiny model and the analysis of their
run (every wall time before the first profile, one measurement per configuration), the
analysis of a recorded H200 run (the frozen copy under tests/fixtures/runs), and the chapter
notebook executed live and in replay through papermill."""

import json
import re
import statistics

import nbformat
import pandas as pd
import papermill as pm
import pytest
import torch

from labsupport import chapters, runs
from labsupport.chapters import cells
from labsupport.chapters import prefill_vs_decode as ch
from labsupport.measure import decode, environment, hardware, harness, models
from labsupport.ops import validate
from labsupport.traces import kernels, trace

from .conftest import FIXTURES, REPO, fixture_run, with_shared_owners
from .live_cells import parameters

pytestmark = pytest.mark.unit

NOTEBOOK = REPO / "notebooks" / "prefill_vs_decode.ipynb"
# The sweep contains prompt_len, so the phase table and the sweep share one measurement; the
# notebook test below runs the other case (prompt_len outside the sweep).
TINY = dict(preset="tiny", prompt_len=16, prompt_lens=[1, 8, 16, 32], repeats=3, device="cpu")

# Qwen3-8B, counted by hand from its configuration.
HIDDEN, INTER, LAYERS, HEADS, KV_HEADS, HEAD_DIM, VOCAB = 4096, 12288, 36, 32, 8, 128, 151_936
LAYER_MATMUL = LAYERS * (
    2 * HIDDEN * HEADS * HEAD_DIM  # q_proj, o_proj
    + 2 * HIDDEN * KV_HEADS * HEAD_DIM  # k_proj, v_proj
    + 3 * HIDDEN * INTER
)  # gate, up, down
LM_HEAD = VOCAB * HIDDEN
NORMS = LAYERS * (2 * HIDDEN + 2 * HEAD_DIM) + HIDDEN  # two RMSNorms a layer, q/k norms, final norm
KV_PER_TOKEN = 2 * LAYERS * KV_HEADS * HEAD_DIM * 2  # K and V, every layer, BF16
PER_PAIR = 4 * LAYERS * HEADS * HEAD_DIM  # QK^T and PV, one query-key pair


@pytest.fixture(scope="module")
def qwen():
    return ch.preset_shape("qwen3-8b")


def test_qwen3_8b_shape_matches_hand_counts(qwen):
    assert LAYER_MATMUL == 6_945_767_424 and LAYER_MATMUL + LM_HEAD == 7_568_097_280
    assert (qwen.layers, qwen.heads, qwen.kv_heads, qwen.head_dim) == (LAYERS, HEADS, KV_HEADS, HEAD_DIM)
    assert qwen.lm_head_parameters == LM_HEAD
    assert qwen.layer_matmul_parameters == LAYER_MATMUL
    assert qwen.weight_bytes == 2 * (LAYER_MATMUL + LM_HEAD + NORMS) == 15_136_811_008
    assert qwen.kv_bytes_per_token == KV_PER_TOKEN == 147_456


def test_prefill_and_decode_work_of_qwen3_8b(qwen):
    pre = ch.forward_work(qwen, 512)
    assert pre.matmul_flops == 2 * 512 * LAYER_MATMUL + 2 * LM_HEAD == 7_113_710_501_888
    assert pre.attention_flops == PER_PAIR * (512 * 513 // 2) == 77_460_406_272
    assert pre.flops == pre.matmul_flops + pre.attention_flops
    assert pre.bytes == qwen.weight_bytes + 512 * KV_PER_TOKEN
    dec = ch.forward_work(qwen, 1, 512)
    assert dec.matmul_flops == 2 * (LAYER_MATMUL + LM_HEAD) == models.preset_counts("qwen3-8b").decode_flops
    assert dec.attention_flops == PER_PAIR * 513
    assert dec.bytes == qwen.weight_bytes + 513 * KV_PER_TOKEN
    assert dec.flop_per_byte == pytest.approx(dec.flops / dec.bytes) and dec.flop_per_byte < 1.1
    assert ch.phase_work(qwen, "prefill", 512) == pre and ch.phase_work(qwen, "decode", 512) == dec
    with pytest.raises(ValueError, match="unknown phase 'sample'"):
        ch.phase_work(qwen, "sample", 512)


def test_intensity_and_the_ridge_in_tokens(qwen):
    assert ch.matmul_intensity(qwen, 1) == 1.0  # each 2-byte weight does 2 operations
    assert ch.matmul_intensity(qwen, 512) == pytest.approx((512 * LAYER_MATMUL + LM_HEAD) / (LAYER_MATMUL + LM_HEAD))
    for n in (1, 206, 4096):
        assert ch.tokens_at_intensity(qwen, ch.matmul_intensity(qwen, n)) == pytest.approx(n)
    sheet = hardware.datasheet("NVIDIA H200")
    lim = ch.Limits(sheet.name, sheet.bf16_tflops, sheet.bandwidth_tbs, 780.0, 4.25, ceiling_tbs=4.4)
    assert lim.datasheet_ridge == pytest.approx(206.04, abs=0.01)
    assert lim.measured_ridge == pytest.approx(780 / 4.4), "the GEMM rate over the practical ceiling, not the copy"
    # The LM head, run for the last token only, lowers the intensity: the ridge needs more tokens.
    assert 206 < ch.tokens_at_intensity(qwen, lim.datasheet_ridge) < 230


def test_weights_are_set_against_the_practical_ceiling_never_the_copy():
    copy_only = ch.Limits("H200 SXM", 989.0, 4.8, 780.0, 4.2)
    with_ceiling = ch.Limits("H200 SXM", 989.0, 4.8, 780.0, 4.2, read_tbs=4.3, ceiling_tbs=4.4)
    assert ch.bandwidth(copy_only).tbs is None and ch.measured_ridge(copy_only) is None
    assert ch.bandwidth(with_ceiling) == ch.Bandwidth(4.4, "practical ceiling", "practical ceiling")
    assert ch.measured_ridge(with_ceiling) == 780.0 / 4.4
    assert ch.bandwidth(ch.Limits(None, None, None, None, None)).tbs is None


# --- the live path on a CPU ------------------------------------------------------------------


def run_live_cells(**params) -> runs.Run:
    """Run the notebook's live cells in this process, as papermill would with `params` (the
    parameters cell, then every code cell up to the one that loads the run), and return the run."""
    nb = nbformat.read(NOTEBOOK, as_version=4)
    cells = [c for c in nb.cells if c.cell_type == "code"]
    code = [c.source for c in cells]
    first = next(i for i, c in enumerate(cells) if "parameters" in c.metadata.get("tags", []))
    end = next(i for i, src in enumerate(code) if "run = ch.load(run_id)" in src)
    ns: dict = {}
    exec(code[first], ns)  # the cells before it install labsupport where it is missing: here it is not
    ns.update(parameters(**params))
    for src in code[first + 1 : end + 1]:
        exec(src, ns)
    return ns["run"]


def live_params(preset, prompt_len, prompt_lens, repeats, device) -> dict:
    """The notebook's parameters for the run that ch.Params(...) describes."""
    return {
        "preset": preset,
        "prompt_len": prompt_len,
        "prompt_lens": prompt_lens,
        "repeats": repeats,
        "allow_cpu": device == "cpu",
    }


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """A run of the tiny model on the CPU, recorded as on a GPU: every profile counts as one
    that leaves CUPTI attached, so a wall time taken after it raises harness.TimingError."""
    root = tmp_path_factory.mktemp("runs")
    profile = harness.profile_region

    def profile_as_on_a_gpu(*args, **kwargs):
        k = profile(*args, **kwargs)
        harness._profiles_in_process += 1
        return k

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LABSUPPORT_RUNS", str(root))
        mp.setattr(harness, "_profiles_in_process", 0)
        mp.setattr(harness, "profile_region", profile_as_on_a_gpu)
        run = run_live_cells(**live_params(**TINY))
        assert harness.profiled(), "the run profiled"
    assert run.path.parent.parent == root
    return run


@pytest.mark.live
def test_live_run_on_cpu_has_every_artifact(tiny_run):
    files = set(tiny_run.meta["files"])
    assert set(ch.ARTIFACTS) <= files
    assert "ceilings.csv" not in files, "no ceilings without a GPU"
    assert not any(f.startswith(".") for f in files), "the sweep's scratch trace is not kept"
    assert tiny_run.provenance["device"] == "cpu"
    assert tiny_run.parameters == {**TINY, "dtype": "bfloat16", "model": ""}  # the defaults, recorded
    assert not list(tiny_run.path.parent.glob(".incomplete-*"))
    assert validate.check_run(chapters.by_slug(ch.CHAPTER), tiny_run) == []


@pytest.mark.live
def test_phases_are_consistent_with_the_run_files(tiny_run):
    p = ch.phases(tiny_run)
    sh = ch.shape(tiny_run)
    n = TINY["prompt_len"]
    per_pair = 4 * sh.layers * sh.heads * sh.head_dim
    pre, dec = p["prefill"], p["decode"]
    assert pre.flops == n * 2 * sh.layer_matmul_parameters + 2 * sh.lm_head_parameters + per_pair * n * (n + 1) // 2
    assert dec.flops == 2 * sh.matmul_parameters + per_pair * (n + 1)
    assert pre.bytes == sh.weight_bytes + n * sh.kv_bytes_per_token
    assert dec.bytes == sh.weight_bytes + (n + 1) * sh.kv_bytes_per_token
    assert (pre.new_tokens, pre.cached_tokens, dec.new_tokens, dec.cached_tokens) == (n, 0, 1, n)
    times = tiny_run.table("phase_times")
    census = tiny_run.table("census")
    for ph, x in p.items():
        k = trace.read_kernels(tiny_run.file(ch.trace_file(ph)), device="cpu", origin=ch.ORIGIN[ph])
        assert x.kernels == len(k) == len(ch.kernel_table(tiny_run, ph)) > 0
        c = census[census.phase == ph].set_index("kind")
        assert c.loc["total", "kernels"] == x.kernels
        assert c.loc["matrix multiply", "kernels"] == x.matmul_kernels > 0
        assert x.matmul_ms == pytest.approx(c.loc["matrix multiply", "gpu_ns"] / 1e6)
        walls = times.loc[times.phase == ph, "wall_ms"]
        # the book's estimator (the fast-host median) with the quartiles of the same trials, the minimum,
        # median and maximum of all of them
        est = harness.table_estimate(times[times.phase == ph])
        assert len(walls) == TINY["repeats"] and x.wall_ms == est.value and x.wall_min_ms == walls.min()
        assert x.wall_median_ms == statistics.median(walls) and est.basis == "fast-host median"
        assert x.wall_q1_ms <= x.wall_ms <= x.wall_q3_ms and x.wall_min_ms <= x.wall_median_ms <= x.wall_max_ms
        assert x.gpu_busy_ms <= x.kernel_ms + 1e-9
        assert x.tflops == pytest.approx(x.flops / (x.wall_ms * 1e-3) / 1e12)
        assert x.tbs == pytest.approx(x.bytes / (x.wall_ms * 1e-3) / 1e12)
        assert x.mfu_datasheet is None and x.mbu_measured is None, "no limits known on a CPU"
    assert pre.flop_per_byte > dec.flop_per_byte
    table = ch.phase_table(tiny_run)
    assert list(table.columns) == list(ch.PHASES) and table.loc["kernels", "decode"] == dec.kernels
    u = ch.utilisation(tiny_run)
    assert len(u) == 4 and u.drop(columns=["phase", "time"]).isna().all().all()
    assert set(zip(u.phase, u.time, strict=True)) == {(ph, t) for ph in ch.PHASES for t in ch.TIME_LABELS}


@pytest.mark.live
def test_every_wall_time_is_clean_and_recorded_with_its_method(tiny_run):
    times = tiny_run.table("phase_times")
    assert set(times.phase) == set(ch.PHASES) and times.clean.all()
    assert "issue_ms" in times and (times.issue_ms <= times.wall_ms).all()
    sweep = tiny_run.table("prompt_sweep")
    assert sweep.wall_clean.all()
    # every length and the decode step timed in the same rounds (interleaved): one trial of each per round
    assert list(sweep.wall_repeats) == [TINY["repeats"]] * len(TINY["prompt_lens"])
    assert (sweep.wall_ms_q1 <= sweep.wall_ms_median).all() and (sweep.wall_ms_min <= sweep.wall_ms_q1).all()
    for ph in ch.PHASES:
        assert sorted(times.loc[times.phase == ph, "round"]) == list(range(TINY["repeats"]))
    assert set(tiny_run.results["method"]) >= {"wall_times", "gpu_times", "teardown_cupti", "host"}


@pytest.mark.live
def test_one_measurement_of_the_prefill_in_both_tables(tiny_run):
    """The phase table's prefill and the sweep's row for the same prompt length are one timing
    and one profile."""
    pt = ch.prefill_timing(tiny_run)
    assert pt.shared and pt.sweep_ms == pt.phase_ms == ch.phases(tiny_run)["prefill"].wall_ms
    assert pt.phase_repeats == pt.sweep_repeats == TINY["repeats"]
    times = tiny_run.table("phase_times")
    walls = times.loc[times.phase == "prefill", "wall_ms"]
    row = tiny_run.table("prompt_sweep").set_index("prompt_len").loc[TINY["prompt_len"]]
    assert (row.wall_ms_min, row.wall_ms_max) == (walls.min(), walls.max())
    k = ch.kernel_table(tiny_run, "prefill")
    assert row.kernels == len(k) and row.gpu_busy_ns == trace.busy_ns(k.start_ns, k.end_ns)
    assert row.kernel_ns == k.dur_ns.sum()
    s = ch.prompt_sweep(tiny_run).set_index("prompt_len")
    assert s.loc[TINY["prompt_len"], "wall ms"] == ch.phases(tiny_run)["prefill"].wall_ms


@pytest.mark.live
def test_a_different_sweep_timing_is_not_called_the_same_measurement(tiny_run, tmp_path):
    import shutil

    root = tmp_path / "runs"
    shutil.copytree(tiny_run.path, root / ch.CHAPTER / tiny_run.run_id)
    run = runs.load_run(ch.DECLARATION, tiny_run.run_id, root=root, verify=False)
    s = run.table("prompt_sweep")
    s.loc[s.prompt_len == TINY["prompt_len"], harness.estimate_column(s.columns)] *= 1.5
    s.to_csv(run.path / "prompt_sweep.csv", index=False)
    pt = ch.prefill_timing(run)
    assert not pt.shared and pt.sweep_ms == pytest.approx(1.5 * pt.phase_ms)


@pytest.mark.live
def test_kernel_tables_recompute_from_the_traces(tiny_run):
    for ph in ch.PHASES:
        stored, fresh = ch.kernel_table(tiny_run, ph), ch.recompute_kernels(tiny_run, ph)
        assert list(stored.name) == list(fresh.name) and list(stored.dur_ns) == list(fresh.dur_ns)
        assert list(stored.kind) == list(fresh.name.map(kernels.classify))
        assert sorted(stored.layer.dropna().unique()) == [0, 1]
    c = ch.census(tiny_run)
    assert c.loc["total", ("prefill", "kernels")] == len(ch.kernel_table(tiny_run, "prefill"))
    assert c.loc["total", ("decode", "share")] == 1.0


@pytest.mark.live
def test_the_same_matrices_in_both_phases(tiny_run):
    g = ch.layer_gemms(tiny_run)
    cfg = models.preset_config("tiny")
    assert tiny_run.results["gemm_layer"] == cfg["num_hidden_layers"] // 2
    assert list(g.module) == list(ch.GEMM_MODULES) * 2 and list(g.phase) == ["prefill"] * 7 + ["decode"] * 7
    assert (g.rows == g.phase.map({"prefill": TINY["prompt_len"], "decode": 1})).all()
    by_key = g.set_index(["phase", "module"])
    gate = by_key.loc[("prefill", "mlp.gate_proj")]
    assert (gate["in"], gate["out"]) == (cfg["hidden_size"], cfg["intermediate_size"])
    k_proj = by_key.loc[("decode", "self_attn.k_proj")]
    assert k_proj["out"] == cfg["num_key_value_heads"] * cfg["head_dim"]
    assert (g.flops == 2 * g.rows * g["in"] * g["out"]).all()
    assert (g.bytes == 2 * (g["in"] * g["out"] + g.rows * (g["in"] + g["out"]))).all()
    assert (g.kernels >= 1).all() and (g.dur_ns > 0).all()
    assert (g.tflops == g.flops / g.dur_ns / 1e3).all()
    t = ch.layer_gemm_table(tiny_run)
    assert list(t.index) == list(ch.GEMM_MODULES)
    assert t.loc["mlp.gate_proj", ("weight", "in × out")] == f"{cfg['hidden_size']} × {cfg['intermediate_size']}"


@pytest.mark.live
def test_prompt_sweep_rows_follow_the_parameters(tiny_run):
    raw = tiny_run.table("prompt_sweep")
    assert list(raw.prompt_len) == TINY["prompt_lens"] and set(raw.status) == {"ok"}
    assert list(ch.KIND_COLUMNS) == list(kernels.KINDS), "one column per kind, whatever the kinds are"
    kinds = raw[list(ch.KIND_COLUMNS.values())].sum(axis=1)
    assert (kinds == raw.kernel_ns).all(), "every kernel's time is in one kind's column"
    s = ch.prompt_sweep(tiny_run)
    sh = ch.shape(tiny_run)
    assert s.set_index("prompt_len").loc[1, "FLOP/byte"] == 1.0
    assert list(s["matmul flops"]) == [ch.forward_work(sh, n).matmul_flops for n in TINY["prompt_lens"]]
    assert (s["ms per token"] == s["wall ms"] / s.prompt_len).all()
    c = ch.crossover(tiny_run)
    assert c.measured_tokens == pytest.approx(c.floor_ms / c.ms_per_token)
    assert c.flat_until in TINY["prompt_lens"] and c.saturates_at in TINY["prompt_lens"]
    assert c.datasheet_ridge is None and c.measured_ridge_tokens is None
    assert ch.ceiling_notes(tiny_run) == {
        "gemm": "This run measured no GEMM rate.",
        "bandwidth": "This run measured no bandwidth.",
    }
    roof = ch.roofline(tiny_run)
    assert roof.prompt_len.min() == 1 and roof.prompt_len.max() == 32
    assert roof["datasheet TFLOP/s"].isna().all()
    h = ch.headline(tiny_run)
    assert set(h) == {
        "prefill ms",
        "decode ms",
        "prefill GPU ms",
        "decode GPU ms",
        "prefill TFLOP/s (GPU busy)",
        "crossover tokens",
    }
    assert all(isinstance(float(v), float) and v == v for v in h.values())


@pytest.mark.live
def test_out_of_memory_rows_are_kept_and_skipped(tiny_run, tmp_path):
    import shutil

    root = tmp_path / "runs"
    shutil.copytree(tiny_run.path, root / ch.CHAPTER / tiny_run.run_id)
    run = runs.load_run(ch.DECLARATION, tiny_run.run_id, root=root, verify=False)
    s = run.table("prompt_sweep")
    oom = pd.DataFrame([{"prompt_len": 32, "status": "out of memory"}])  # as record() writes it
    s = pd.concat([s[s.prompt_len != 32], oom], ignore_index=True)
    s.to_csv(run.path / "prompt_sweep.csv", index=False)
    assert list(ch.prompt_sweep(run).prompt_len) == [1, 8, 16]
    assert ch.roofline(run).prompt_len.max() == 32


def test_unknown_preset_is_a_clear_error(runs_root):
    with pytest.raises(models.UnknownPresetError, match="unknown model preset 'no-such-model'"):
        run_live_cells(**live_params(**{**TINY, "preset": "no-such-model"}))
    assert not list(runs_root.rglob("*.csv"))


def test_live_mode_without_a_gpu_is_refused(runs_root):
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    with pytest.raises(environment.EnvironmentProblem, match="live mode needs a CUDA GPU"):  # first cell
        run_live_cells(**live_params(**{**TINY, "device": "cuda"}))
    with pytest.raises(decode.NoGPUError, match="only allowed for tests"):
        run_live_cells(**live_params(**{**TINY, "preset": "qwen3-8b"}))
    assert not list(runs_root.rglob("*.csv"))


# --- the notebook ----------------------------------------------------------------------------


def test_notebook_shows_its_measuring_code():
    """The cells that measure are shown (not collapsed or removed), run in live mode only, and
    call the harness; the parameters cell names this chapter's defaults. (Clean outputs and the
    kernel are checked for every notebook in test_notebooks.py.)"""
    nb = nbformat.read(NOTEBOOK, as_version=4)
    assert nb.cells[0].cell_type == "markdown" and nb.cells[0].source.startswith("# ")
    code = [c for c in nb.cells if c.cell_type == "code"]
    (params,) = [c for c in code if "parameters" in c.metadata.get("tags", [])]
    assert params.source == cells.PARAMETERS and ch.Params().preset == "qwen3-8b"
    assert not [c for c in code if {"remove-input", "remove-cell"} & set(c.metadata.get("tags", []))]
    live = [c for c in code if 'if mode == "live":' in c.source]
    assert len(live) == 4 and not any(c.metadata.get("tags") for c in live)
    shown = "".join(c.source for c in live)
    for call in (
        "recording.PendingRun(",
        "source.for_params(",  # the preset, or the `model` folder
        "ch.time_passes(",
        "harness.profile_region(",
        "w.write_table(",
        "ch.load(run_id)",
    ):
        assert call in shown or any(call in c.source and not c.metadata.get("tags") for c in code), call


def _glued(nb) -> set[str]:
    return {
        o["metadata"]["scrapbook"]["name"]
        for c in nb.cells
        if c.cell_type == "code"
        for o in c.get("outputs", [])
        if "scrapbook" in o.get("metadata", {})
    }


@pytest.mark.live
def test_notebook_runs_live_on_cpu_through_papermill(runs_root, tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    with_shared_owners(runs_root)
    out = tmp_path / NOTEBOOK.name
    params = parameters(preset="tiny", prompt_len=16, prompt_lens=[1, 8, 32], repeats=2, allow_cpu=True)
    pm.execute_notebook(
        str(NOTEBOOK), str(out), parameters=params, cwd=str(NOTEBOOK.parent), kernel_name="python3", progress_bar=False
    )
    nb = nbformat.read(out, as_version=4)
    text = json.dumps([c.get("outputs", []) for c in nb.cells])
    assert "Traceback" not in text
    assert text.count("image/png") >= 4
    (run_dir,) = (runs_root / ch.CHAPTER).iterdir()
    meta = json.loads((run_dir / "meta.json").read_text())
    assert meta["parameters"]["preset"] == "tiny" and meta["parameters"]["prompt_lens"] == [1, 8, 32]
    # Every number the prose shows is glued by the notebook (none typed in by hand).
    prose = "".join(c.source for c in nb.cells if c.cell_type == "markdown")
    used = set(re.findall(r"\{glue:(?:text|md)\}`([^`:]+)", prose))
    assert used and used <= _glued(nb), used - _glued(nb)


# --- a recorded H200 run (the frozen copy under tests/fixtures/runs) --------------------------


@pytest.fixture(scope="module")
def recorded():
    run = fixture_run(ch.CHAPTER)
    assert "method" in run.results and run.provenance["device"] == "cuda", "a run recorded with the harness"
    return run


def test_recorded_run_shows_one_prefill_timing(recorded):
    """The prefill of the chapter's prompt is shown in the phase table and in the prompt sweep:
    one measurement (a run recorded with the harness times it once)."""
    pt = ch.prefill_timing(recorded)
    assert pt.prompt_len == recorded.parameters["prompt_len"]
    assert pt.phase_ms == ch.phases(recorded)["prefill"].wall_ms
    assert pt.sweep_ms is not None and pt.shared, pt
    assert pt.phase_repeats == pt.sweep_repeats == recorded.parameters["repeats"]
    s = ch.prompt_sweep(recorded).set_index("prompt_len")
    assert s.loc[pt.prompt_len, "wall ms"] == pytest.approx(pt.phase_ms, rel=1e-12)


def test_recorded_census_counts_every_kernel_by_todays_kinds(recorded):
    c = ch.census(recorded)
    assert [k for k in c.index if k != "total"] == list(kernels.KINDS)
    for ph in ch.PHASES:
        k = ch.kernel_table(recorded, ph)
        assert c.loc["total", (ph, "kernels")] == len(k) == ch.phases(recorded)[ph].kernels
        assert list(k.kind) == list(k.name.map(kernels.classify))


def test_recorded_rates_stay_under_the_datasheet_and_every_excess_is_explained(recorded):
    lim = ch.limits(recorded)
    a = ch.achieved_rates(recorded)
    assert set(a.unit) == {"TFLOP/s", "TB/s"} and (a.value > 0).all()
    assert not a["above datasheet"].any(), a[a["above datasheet"]]
    notes = ch.ceiling_notes(recorded)
    bw = ch.bandwidth(lim)
    assert bw.tbs == (lim.read_tbs or lim.copy_tbs)
    for unit, key, measured in (("TFLOP/s", "gemm", lim.gemm_tflops), ("TB/s", "bandwidth", bw.tbs)):
        rows = a[a.unit == unit]
        top = rows.loc[rows.value.idxmax()]
        assert top.measured == measured
        if top["above measured"]:
            shown = f"{top.value:.0f}" if unit == "TFLOP/s" else f"{top.value:.2f}"
            assert (
                top.figure.lower() in notes[key].lower()
                and shown in notes[key]
                and "not a limit of the hardware" in notes[key]
                or "counts the bytes it reads plus those it writes" in notes[key]
            )
            assert "datasheet" in notes[key]
        else:
            assert notes[key].startswith("No ")
    # The phase table's MBU is against the read stream where the run measured one.
    d = ch.phases(recorded)["decode"]
    assert d.mbu_busy_measured == pytest.approx(d.tbs_busy / bw.tbs)
    assert list(ch.utilisation(recorded).columns)[-1] == f"MBU vs {bw.short}"


# --- the roofline and the ridges ---------------------------------------------------------------


def _check_points(run):
    """gemm_points() of any run: one point per weight matrix and phase, FLOPs and bytes from
    the shapes, time from the kernels the module launched, rates and roofs from those."""
    pts = ch.gemm_points(run)
    sh, lim, n = ch.shape(run), ch.limits(run), run.parameters["prompt_len"]
    shapes = run.results["gemm_shapes"]
    assert list(pts.module) == list(ch.ROOFLINE_MODULES) * 2 and list(pts.phase) == ["prefill"] * 8 + ["decode"] * 8
    lm = pts[pts.module == ch.LM_HEAD]
    assert (lm.rows == 1).all() and (lm.instances == 1).all(), "the LM head runs once, for the last token"
    assert (lm["in"] * lm["out"] == sh.lm_head_parameters).all()
    layer = pts[pts.module != ch.LM_HEAD]
    assert (layer.rows == layer.phase.map({"prefill": n, "decode": 1})).all()
    assert (layer.instances == sh.layers).all(), "every decoder layer's kernels are in the profile"
    assert [list(shapes[m]) for m in layer.module] == [[i, o] for i, o in zip(layer["in"], layer["out"], strict=True)]
    assert (pts.flops == pts.instances * 2 * pts.rows * pts["in"] * pts["out"]).all()
    assert (
        pts.bytes == pts.instances * sh.bytes_per_value * (pts["in"] * pts["out"] + pts.rows * (pts["in"] + pts["out"]))
    ).all()
    assert (pts.tflops == pts.flops / pts.dur_ns / 1e3).all() and (pts.tbs == pts.bytes / pts.dur_ns / 1e3).all()
    for ph in ch.PHASES:
        k = ch.kernel_table(run, ph)
        k = k[k.kind == ch.MATMUL]
        for r in pts[pts.phase == ph].itertuples():
            mine = k[(k.module == r.module) if r.module == ch.LM_HEAD else k.module.str.endswith("." + r.module)]
            assert r.dur_ns == mine.dur_ns.sum() > 0 and r.kernels == len(mine)
        c = ch.roofline_clusters(run)[ph]
        assert c.matmul_share == pytest.approx(pts[pts.phase == ph].dur_ns.sum() / k.dur_ns.sum())
        assert 0 < c.matmul_share <= 1
    # The roofs: the lesser of the math and bandwidth times FLOP per byte.
    bw = ch.bandwidth(lim).tbs
    for col, tflops, tbs in (
        ("roof_datasheet", lim.datasheet_tflops, lim.datasheet_tbs),
        ("roof_measured", lim.gemm_tflops, bw),
    ):
        if tflops and tbs:
            assert (pts[col] == [min(tflops, tbs * x) for x in pts.flop_per_byte]).all()
        else:
            assert pts[col].isna().all()
    return pts


@pytest.mark.live
def test_roofline_points_of_the_tiny_run(tiny_run):
    pts = _check_points(tiny_run)
    assert pts.roof_datasheet.isna().all(), "no limits known on a CPU"
    t = ch.roofline_table(tiny_run)
    assert list(t.index) == list(ch.ROOFLINE_MODULES) and set(ch.SHORT) == set(ch.ROOFLINE_MODULES)
    assert t.loc[ch.LM_HEAD, ("prefill", "rows")] == 1
    assert t.loc["self_attn.q_proj", ("prefill", "rows")] == TINY["prompt_len"]
    assert not ch.ridges(tiny_run)[0].this_gpu, "no datasheet for a CPU: the rows are other GPUs'"
    assert "No datasheet is known" in ch.ridge_text(tiny_run)
    import matplotlib.pyplot as plt

    plt.close(ch.roofline_figure(tiny_run))


def test_roofline_of_the_recorded_run(recorded):
    pts = _check_points(recorded)
    lim = ch.limits(recorded)
    assert (pts.tflops <= pts.roof_datasheet).all(), "nothing above the datasheet's roof"
    one_row = pts[pts.rows == 1]
    assert set(one_row.phase[one_row.module != ch.LM_HEAD]) == {"decode"}
    assert (one_row.flop_per_byte < 1).all() and (one_row.flop_per_byte > 0.99).all()
    assert (pts[pts.rows > 1].flop_per_byte > lim.datasheet_ridge).all()
    # On the slope, the share of the roof is the share of the bandwidth.
    assert one_row.of_datasheet_roof.values == pytest.approx((one_row.tbs / lim.datasheet_tbs).values, rel=1e-3)
    c = ch.roofline_clusters(recorded)
    assert (c["decode"].bound, c["prefill"].bound) == ("memory", "compute")
    assert c["decode"].points == 8 and c["prefill"].points == 7, "the prefill's LM head is one row, like decode's"
    p = pts[(pts.phase == "prefill") & (pts.rows > 1)]
    assert (c["prefill"].tflops_min, c["prefill"].tflops_max) == (p.tflops.min(), p.tflops.max())
    w = ch.pass_points(recorded).set_index("phase")
    for ph, x in ch.phases(recorded).items():
        assert w.loc[ph, "tflops"] == x.tflops_busy and w.loc[ph, "flop_per_byte"] == x.flop_per_byte
    # Every rate the roofline shows is in achieved_rates(), so an excess over a ceiling is explained.
    a = ch.achieved_rates(recorded)
    top = pts.loc[pts.tbs.idxmax()]
    assert top.tbs in set(a.value)
    import matplotlib.pyplot as plt

    fig = ch.roofline_figure(recorded)
    labels = [" ".join(t.get_text().split()) for t in fig.axes[0].get_legend().get_texts()]  # as one line
    assert any(f"ridge {lim.datasheet_ridge:.0f} FLOP/byte" in s for s in labels)
    assert any(f"{ch.bandwidth(lim).short} {ch.bandwidth(lim).tbs:.2f} TB/s" in s for s in labels)
    plt.close(fig)


def test_each_gpus_ridge_raw_and_normalised(recorded):
    rs = ch.ridges(recorded)
    sh, lim, cr = ch.shape(recorded), ch.limits(recorded), ch.crossover(recorded)
    pre = ch.phases(recorded)["prefill"]
    fpb = pre.flop_per_byte  # one number: the pass's FLOP per byte, as the page's table gives it
    names = {r.gpu for r in rs if r.limits == "datasheet"}
    assert {"H100 SXM", "H200 SXM"} <= names and len(names) == len([r for r in rs if r.limits == "datasheet"])
    for r in rs:
        assert r.ridge == pytest.approx(r.peak_tflops / r.bandwidth_tbs)
        assert r.ridge_tokens == pytest.approx(ch.tokens_at_intensity(sh, r.ridge))
        assert r.prefill_over_ridge == pytest.approx(fpb / r.ridge)
        if r.this_gpu:
            assert r.crossover_over_ridge == pytest.approx(cr.measured_tokens / r.ridge_tokens)
            assert r.mfu == pytest.approx(pre.tflops / r.peak_tflops)
            assert r.mfu_busy == pytest.approx(pre.tflops_busy / r.peak_tflops)
        else:  # a measurement on one GPU is never set against another GPU's limit
            assert r.crossover_over_ridge is None and r.mfu is None and r.mfu_busy is None
    own = [r for r in rs if r.this_gpu and r.limits == "datasheet"]
    assert [r.gpu for r in own] == [lim.datasheet_name]
    (meas,) = [r for r in rs if r.limits == "measured"]
    assert meas.this_gpu and meas.source == "measured on this GPU (GEMM rate, practical ceiling)"
    assert meas.ridge == pytest.approx(ch.measured_ridge(lim)) == pytest.approx(lim.gemm_tflops / lim.ceiling_tbs)
    h100 = next(r for r in rs if r.gpu == "H100 SXM")
    assert h100.ridge == pytest.approx(989 / 3.35)
    text = ch.ridge_text(recorded)
    assert f"{h100.ridge:.0f} FLOP per byte on an H100 SXM" in text and "not known" in text
    assert f"{h100.ridge / own[0].ridge:.2f} times this GPU's" in text
    assert f"{own[0].mfu:.1%} of {own[0].peak_tflops:.0f} TFLOP/s" in text
    t = ch.ridge_table(recorded)
    assert len(t) == len(rs) and t["prefill MFU, wall"].isna().sum() == sum(r.mfu is None for r in rs)


def test_the_recorded_run_sets_weights_against_the_practical_ceiling(recorded):
    """Every pass that reads weights is set against the practical ceiling (here the read stream,
    the best read of a ceilings run without read kernels), never the copy."""
    lim = ch.limits(recorded)
    assert lim.read_tbs and lim.copy_tbs and ch.bandwidth(lim).tbs == lim.ceiling_tbs == lim.read_tbs
    pts = ch.gemm_points(recorded)
    assert (pts.roof_measured == [min(lim.gemm_tflops, lim.ceiling_tbs * x) for x in pts.flop_per_byte]).all()
    import matplotlib.pyplot as plt

    fig = ch.roofline_figure(recorded)
    labels = " ".join(" ".join(t.get_text() for t in fig.axes[0].get_legend().get_texts()).split())  # as one line
    assert f"practical ceiling {lim.ceiling_tbs:.2f} TB/s" in labels
    plt.close(fig)
    note = ch.ceiling_notes(recorded)["bandwidth"]
    # the read stream is the shared ceilings run's: a kernel of this run may beat it, and the note says so
    assert f"practical ceiling, {lim.ceiling_tbs:.2f} TB/s" in note
    assert note.startswith("No figure here is above") or "not a limit of the hardware" in note


@pytest.mark.book
def test_notebook_replays_the_recorded_run(recorded, tmp_path, monkeypatch):
    import shutil

    root = tmp_path / "runs"
    shutil.copytree(FIXTURES / ch.CHAPTER, root / ch.CHAPTER)
    with_shared_owners(root)
    monkeypatch.setenv("LABSUPPORT_RUNS", str(root))
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    out = tmp_path / NOTEBOOK.name
    pm.execute_notebook(
        str(NOTEBOOK),
        str(out),
        parameters={"mode": "replay", "run_id": recorded.run_id},
        cwd=str(NOTEBOOK.parent),
        kernel_name="python3",
        progress_bar=False,
    )
    nb = nbformat.read(out, as_version=4)
    text = json.dumps([c.get("outputs", []) for c in nb.cells])
    assert "Traceback" not in text and recorded.run_id in text
    assert [p.name for p in (root / ch.CHAPTER).iterdir()] == [recorded.run_id], "replay writes no run"
    glued = _glued(nb)
    assert {"floor_ms", "datasheet_tbs", "step_gb"} <= glued  # the book's shared quantities, under their names
    assert not {"lim_datasheet_tbs", "weight_gb", "try_floor_ms"} & glued  # never under the chapter's own
    prose = "".join(c.source for c in nb.cells if c.cell_type == "markdown")
    used = set(re.findall(r"\{glue:(?:text|md)\}`([^`:]+)", prose))
    assert used <= _glued(nb), used - _glued(nb)


def test_the_passes_table_holds_every_number_of_the_page_table_unrounded(recorded):
    """The page shows 15 rounded rows; the CSV link under them downloads every number."""
    t = ch.passes_table(recorded).set_index("field")
    p, lim = ch.phases(recorded), ch.limits(recorded)
    assert len(t) > 15 and t.index.is_unique
    assert t.loc["wall_ms", "prefill"] == p["prefill"].wall_ms
    assert t.loc["wall_max_ms", "decode"] == p["decode"].wall_max_ms
    assert t.loc["mbu_busy_measured", "decode"] == p["decode"].mbu_busy_measured
    assert t.loc["datasheet_tflops", "prefill"] == lim.datasheet_tflops
    assert t.loc["measured_tbs", "decode"] == ch.bandwidth(lim).tbs


# --- the page: every number and text the prose glues ------------------------------------------


def test_every_glue_name_of_the_prose_is_a_page_field_or_a_shared_quantity():
    """The page cell glues the Page's fields and the book's shared quantities; nothing else glues."""

    from labsupport.chapters import shared

    from .page_names import page_names, unglued, unshown

    shared_names = set(shared.QUANTITIES) | {f"shared_run_{o.replace('-', '_')}" for o in shared.OWNERS}
    assert unglued(NOTEBOOK, ch.Page) == set()
    assert unshown(NOTEBOOK, ch.Page) == set()  # no field the prose does not show
    assert not page_names(ch.Page) & shared_names  # a shared quantity is glued under its name once, by shared


def test_page_of_the_recorded_run_against_its_tables(recorded):
    from labsupport.chapters import shared

    values = shared.values()
    p = ch.page(recorded, values)
    times = recorded.table("phase_times")
    for phase, prefix in (("prefill", "p"), ("decode", "d")):
        assert getattr(p, f"{prefix}_kernels") == len(recorded.table(ch.kernels_table_name(phase)))
        assert getattr(p, f"{prefix}_wall_ms") == harness.table_estimate(times[times.phase == phase]).value
        assert getattr(p, f"{prefix}_wall_repeats") == (times.phase == phase).sum()
    assert p.param_prompt_len == p.gate_rows == recorded.parameters["prompt_len"]
    assert p.busy_ratio == pytest.approx(p.p_gpu_busy_ms / p.d_gpu_busy_ms)
    assert recorded.run_id in p.run_label and p.run_label.startswith(recorded.provenance["gpu"])
    sweep = recorded.table("prompt_sweep")
    ran = sweep[sweep.status == "ok"]
    assert (p.s_first_len, p.s_last_len) == (ran.prompt_len.min(), ran.prompt_len.max())
    assert len(ran) == len(sweep) and p.sweep_status == "Every prompt length ran."
    assert p.try_floor_x_wall == p.d_wall_ms / values["floor_ms"].value
    us_per_token = ran[harness.estimate_column(ran.columns)] * 1e3 / ran.prompt_len
    assert p.try_us_target == pytest.approx(2 * us_per_token.min(), rel=1e-12)
    cheapest = ran.prompt_len[us_per_token < p.try_us_target].min()
    assert p.try_sweep_answer.startswith(f"{cheapest:,d} tokens")
    assert p.bw_short == "practical ceiling" and f"{p.bw_tbs:.2f} TB/s" in p.bw_sentence
    assert p.datasheet_name == f"{hardware.datasheet(recorded.provenance['gpu']).name} datasheet"
    assert p.rd_slowest.startswith("`") and p.rp_fastest.startswith("`")
    assert p.r_other_gpu != recorded.provenance["gpu"] and "H100" in p.r_other_gpu
    # the launch-bound prompts: the GPU idle more than a fifth of their wall time
    shown = ch.prompt_sweep(recorded).set_index("prompt_len")
    bound = shown[shown["GPU ms"] / shown["wall ms"] < 0.8]
    assert p.s_bound_text == f"launch-bound up to {bound.index.max():,d} tokens here"
    assert p.s_host_text.startswith(f"Up to {bound.index.max():,d} tokens")


@pytest.mark.live
def test_page_of_a_run_on_a_cpu_says_what_it_lacks(tiny_run):
    """A run without a datasheet or measured ceilings: the page says so instead of a number."""
    from labsupport.chapters import shared

    p = ch.page(tiny_run, shared.values())
    assert p.datasheet_name == "no datasheet known for this GPU"
    assert p.bw_sentence == "no bandwidth (this run measured no ceilings)"
    assert p.ridge_sheet != p.ridge_sheet and p.bw_tbs != p.bw_tbs  # NaN: no limit known
    assert p.param_prompt_len == TINY["prompt_len"] and p.s_last_len == max(TINY["prompt_lens"])
    assert p.prefill_timing_note.startswith("The prefill's wall time is one measurement")
