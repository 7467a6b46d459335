"""The chapter "Closing the gap": our decode step and our Triton kernels compute what
transformers computes (on a CPU, in float32, the kernels in Triton's interpreter), the live
cells on a CPU (tiny model, the plain PyTorch rungs), and the analysis of its fixture run,
recorded on the H200."""

import os

import pandas as pd
import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"  # before any kernel is built

from labsupport.chapters import closing_the_gap as ch  # noqa: E402
from labsupport.chapters import published  # noqa: E402
from labsupport.measure import decode, models, qwen3_decode  # noqa: E402

from .conftest import fixture_run  # noqa: E402
from .live_cells import run_live_cells, watch_harness  # noqa: E402

pytest.importorskip("triton")
from labsupport.measure import decode_attention, gemv  # noqa: E402

NOTEBOOK = "notebooks/closing_the_gap.ipynb"


# Our kernels against PyTorch (float32: the interpreter has no bfloat16).


@pytest.mark.parametrize("config", [gemv.Config(2, 64, 4, 2), gemv.Config(8, 32, 4, 2)])
def test_gemv_and_its_fusions_match_pytorch(config):
    g = torch.Generator().manual_seed(0)
    k, i = 96, 40  # K not a multiple of the block: the masks matter
    x, nw = torch.randn(1, 1, k, generator=g), torch.randn(k, generator=g)
    gate, up = torch.randn(i, k, generator=g), torch.randn(i, k, generator=g)
    w = torch.cat([gate, up])
    close = dict(rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(gemv.gemv(x, w, config=config), torch.nn.functional.linear(x, w), **close)
    normed = qwen3_decode.rmsnorm(x, nw, 1e-6)
    torch.testing.assert_close(
        gemv.gemv(x, w, norm_weight=nw, config=config), torch.nn.functional.linear(normed, w), **close
    )
    act = torch.nn.functional.silu(normed @ gate.T) * (normed @ up.T)
    fused = gemv.gemv(x, gemv.interleave(gate, up), norm_weight=nw, silu=True, config=config)
    assert fused.shape == (1, 1, i)
    torch.testing.assert_close(fused, act, **close)
    r = torch.randn(1, 1, 2 * i, generator=g)
    torch.testing.assert_close(gemv.gemv(x, w, residual=r, config=config), r + x @ w.T, **close)


def test_gemv_takes_one_vector_only():
    with pytest.raises(ValueError, match="one vector"):
        gemv.gemv(torch.randn(2, 8), torch.randn(4, 8))


def test_interleave_alternates_gate_and_up_rows():
    gate, up = torch.arange(6.0).reshape(3, 2), 10 + torch.arange(6.0).reshape(3, 2)
    assert gemv.interleave(gate, up)[:, 0].tolist() == [0, 10, 2, 12, 4, 14]


def test_decode_attention_matches_pytorch_across_several_stretches():
    g = torch.Generator().manual_seed(1)
    heads, kv_heads, d, slots, pos = 4, 2, 16, 40, 37  # 37 + 1 positions: two stretches of 32
    qkv = torch.randn(1, 1, (heads + 2 * kv_heads) * d, generator=g)
    qn, kn = torch.randn(d, generator=g), torch.randn(d, generator=g)
    cos, sin = torch.randn(slots, d, generator=g), torch.randn(slots, d, generator=g)
    kc, vc = torch.randn(1, kv_heads, slots, d, generator=g), torch.randn(1, kv_heads, slots, d, generator=g)
    p = torch.tensor([pos])
    shape = qwen3_decode.Shape(heads, kv_heads, d, 1e-6)
    kc_ref, vc_ref = kc.clone(), vc.clone()
    ref = qwen3_decode.attention([qkv], p, cos, sin, kc_ref, vc_ref, qn, kn, shape, fused=True)
    out = decode_attention.decode_attention(qkv, qn, kn, cos, sin, kc, vc, p, heads, 1e-6)
    torch.testing.assert_close(out.reshape(ref.shape), ref, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(kc, kc_ref)  # the new k and v written where PyTorch writes them
    torch.testing.assert_close(vc, vc_ref)


# Our decode step against transformers.


@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(0)
    model = models.build_model("tiny", device="cpu", dtype=torch.float32)
    prompt = decode.Prompt.random(model.config.vocab_size, 1, 40, "cpu")
    return model, prompt, ch.reference(model, prompt)


@pytest.mark.parametrize("rung", list(ch.OWN_OPTIONS))
def test_each_of_our_rungs_gives_transformers_logits(tiny, rung):
    model, prompt, ref = tiny
    opts = qwen3_decode.Options(**ch.OWN_OPTIONS[rung])
    logits, token = qwen3_decode.OwnStep(model, prompt.ids, ref.token, opts, compile=False, graph=False)()
    torch.testing.assert_close(logits, ref.logits, rtol=1e-4, atol=1e-4)
    assert int(token) == int(ref.next_token)
    check = ch.fidelity((logits, token), ref)
    assert check["passed"] and check["same_token"]


def test_the_float32_reference_is_the_model_in_float32(tiny):
    model, prompt, ref = tiny
    # the tiny model is float32 already: its "truth" is itself, to rounding
    assert ref.eager_error < 1e-4
    assert ch.eager_fidelity(ref)["passed"]


def test_a_wrong_step_fails_the_check(tiny):
    _, _, ref = tiny
    wrong = ref.logits.roll(1, dims=-1)  # the right numbers at the wrong tokens
    check = ch.fidelity((wrong, wrong.argmax(-1)), ref)
    assert not check["passed"]
    assert check["max_abs_err"] > ch.ERROR_FACTOR * check["eager_abs_err"]


def test_options_that_do_not_fit_together_are_refused():
    with pytest.raises(ValueError, match="fuse_gemv"):
        qwen3_decode.Options(fuse_gemv=True)
    with pytest.raises(ValueError, match="fused_attention"):
        qwen3_decode.Options(fused_attention=True)
    with pytest.raises(ValueError, match="matmul"):
        qwen3_decode.Options(matmul="cublas")


# The live cells on a CPU.


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    from labsupport.measure import harness

    root = tmp_path_factory.mktemp("runs")
    calls = []
    mp = pytest.MonkeyPatch()
    mp.setenv("LABSUPPORT_RUNS", str(root))
    watch_harness(mp, calls)
    real = harness.interleaved

    def interleaved(variants, **kw):
        calls.append(("interleaved", tuple(variants)))
        return real(variants, **kw)

    mp.setattr(harness, "interleaved", interleaved)
    try:
        run = run_live_cells(NOTEBOOK, preset="tiny", prompt_len=16, repeats=2, allow_cpu=True)["run"]
    finally:
        mp.undo()
    return run, calls


def test_live_cells_time_our_rungs_interleaved_before_profiling_any(tiny_run):
    run, calls = tiny_run
    ran = ["eager", "own-compiled", "fused-projections"]
    ours = ("own-compiled", "fused-projections")  # transformers' rungs are shared: checked and profiled, not timed
    assert calls == [("interleaved", ours)] + [("profile", "decode_step")] * len(ran)
    r = run.table("rungs")
    assert list(r.rung) == list(ch.RUNGS)
    ok = r[r.status == "ok"]
    assert list(ok.rung) == ran
    rest = r[r.status != "ok"].set_index("rung").status
    assert rest.drop("max-autotune").str.contains("needs a CUDA GPU").all()
    assert "launch-overhead" in rest["max-autotune"]
    assert ok.passed.astype(bool).all()
    mine = ok.set_index("rung").loc[list(ours)]
    assert mine.clean.astype(bool).all() and (mine.wall_ms_repeats == 2).all()
    assert (mine.wall_ms_min <= mine.wall_ms_q1).all() and (mine.wall_ms_q1 <= mine.wall_ms_median).all()
    assert ok.set_index("rung").loc["eager", ["wall_ms_min", "wall_ms_median"]].isna().all()  # not timed here
    t = run.table("step_times")
    assert set(t.rung) == set(ours) and set(t["round"]) == {0, 1}
    assert "ceilings.csv" not in run.meta["files"]  # the ceilings are the shared ones
    # a run of another configuration has no shared numbers for transformers' rungs, and its own rungs' times
    lad = ch.ladder(run).set_index("rung")
    assert lad.loc[list(ch.SHARED_RUNGS), "ms"].isna().all()
    assert lad.loc[list(ours), "ms"].tolist() == mine.wall_ms_min.tolist()
    assert ch.best(run) in ours


# The analysis of the H200 run.


@pytest.fixture(scope="module")
def run():
    return fixture_run("closing-the-gap")


def test_ladder_arithmetic(run):
    vals = ch.shared_values()
    lad = ch.ladder(run).set_index("rung")
    f = ch.floor(run)
    assert list(lad.index) == list(ch.RUNGS)
    r = run.table("rungs").set_index("rung")
    # the floor and the ceiling are the shared ones, with one meaning: bytes at the datasheet, at the best rate
    assert f.shared and f.floor_ms == pytest.approx(vals["floor_ms"].value)
    assert f.ceiling_ms == pytest.approx(vals["ceiling_ms"].value) and f.ceiling_ms > f.floor_ms
    for rung, p in ch.SHARED_RUNGS.items():  # transformers' rungs: the owners' numbers, never this run's
        assert lad.loc[rung, "ms"] == vals[f"{p}_wall_ms"].value
        assert lad.loc[rung, "GPU busy ms"] == vals[f"{p}_gpu_busy_ms"].value
        assert lad.loc[rung, "kernels"] == vals[f"{p}_kernels"].value
    assert lad.loc["eager", "median"] == vals["eager_wall_median_ms"].value
    assert lad.loc["max-autotune", "same answers"] is None  # not run here
    for rung in [x for x in lad.index if x not in ch.SHARED_RUNGS]:  # ours: the minimum (old runs: host clock)
        assert lad.loc[rung, "ms"] == r.loc[rung, "wall_ms_min"]
        assert lad.loc[rung, "median"] == r.loc[rung, "wall_ms_median"]
        assert lad.loc[rung, "q1"] <= lad.loc[rung, "median"] <= lad.loc[rung, "q3"]
        assert lad.loc[rung, "GPU busy ms"] == pytest.approx(r.loc[rung, "gpu_busy_ns"] / 1e6)
    assert lad["x floor"].to_numpy() == pytest.approx((lad.ms / f.floor_ms).to_numpy())
    assert (lad["x floor"] > 1).all()  # nothing beats the floor
    # the waterfall adds up: eager's time minus every rung's saving is the last rung's time
    last = lad.index[-1]
    assert lad.loc["eager", "ms"] - lad["ms saved"].sum() == pytest.approx(lad.loc[last, "ms"])


def test_a_new_run_reports_our_rungs_by_their_cuda_event_times(run, tmp_path):
    import hashlib
    import json
    import shutil

    from labsupport import runs

    new = tmp_path / "closing-the-gap" / run.run_id
    shutil.copytree(run.path, new)
    r = pd.read_csv(new / "rungs.csv")
    ours = ~r.rung.isin(list(ch.SHARED_RUNGS))
    for stat, x in (("min", 0.9), ("q1", 0.95), ("median", 1.0), ("q3", 1.05), ("max", 1.1)):
        r[f"gpu_ms_{stat}"] = (r.wall_ms_median * x).where(ours)
    r.to_csv(new / "rungs.csv", index=False)
    meta = json.loads((new / "meta.json").read_text())
    meta["files"]["rungs.csv"] = hashlib.sha256((new / "rungs.csv").read_bytes()).hexdigest()
    (new / "meta.json").write_text(json.dumps(meta))
    lad = ch.ladder(runs.load_run("closing-the-gap", run.run_id, root=tmp_path)).set_index("rung")
    want = r.set_index("rung")
    for rung in want.index[ours.to_numpy()]:
        assert lad.loc[rung, "ms"] == want.loc[rung, "gpu_ms_min"] and lad.loc[rung, "timed by"] == "CUDA events"


def test_compiled_matmuls_from_the_launch_overhead_run():
    from labsupport.chapters import shared

    lo = shared.values()["autotune_wall_ms"].run
    at, ro = ch.compiled_matmuls(lo, "compile-max-autotune"), ch.compiled_matmuls(lo, "compile-reduce-overhead")
    assert ro["library"] == ro["kernels"] > 0  # reduce-overhead leaves every matmul to the library
    assert at["generated"] > 0 and at["generated"] + at["library"] == at["kernels"]
    assert ch.compiled_matmuls(lo, "no-such-variant") is None


def test_best_is_the_fastest_rung_that_gives_eagers_answers(run):
    lad = ch.ladder(run)
    good = lad[lad["same answers"].eq(True)]
    assert ch.best(run) == good.loc[good["ms"].idxmin(), "rung"]
    assert ch.headline(run)["best wall ms"] == good["ms"].min()


def test_time_split_adds_up_to_each_rungs_wall_time(run):
    split = ch.time_split(run)
    parts = split[["floor ms", "kernels above floor ms", "GPU idle ms"]].sum(axis=1)
    assert parts.to_numpy() == pytest.approx(split["wall ms"].to_numpy())


def test_census_by_rung_counts_every_kernel_of_every_trace(run):
    counts = ch.census_by_rung(run).set_index("rung")
    for rung in counts.index:
        k = ch.kernel_table(run, rung)
        assert counts.loc[rung, "total"] == len(k)
        assert counts.drop(columns="total").loc[rung].sum() == len(k)
        assert "other" not in counts.columns  # every kernel has a kind
    # the last rung's attention is our two kernels per layer, counted as attention
    k = ch.kernel_table(run, "fused-attention")
    assert set(k[k.kind == "attention"].name) == {"attention_part_kernel", "attention_combine_kernel"}


def test_remaining_adds_up_to_the_span_of_the_best_rungs_kernels(run):
    best = ch.best(run)
    rem = ch.remaining(run, best)
    k = ch.kernel_table(run, best)
    assert rem.ms.sum() == pytest.approx((k.end_ns.max() - k.start_ns.min()) / 1e6)
    mm = rem.set_index("part").loc["matrix multiply kernels"]
    assert mm["floor ms"] == pytest.approx(ch.floor(run).floor_ms)


def test_matmuls_and_tuning(run):
    m = ch.matmuls(run).set_index("matrix")
    assert m.loc["qkv (fused)", "n"] == m.loc["q_proj", "n"] + 2 * m.loc["k_proj / v_proj", "n"]
    assert (m["speed-up"] == m.cublas_us / m.triton_us).all()
    t = ch.tuning(run)
    chosen = t[t.chosen]
    assert not chosen.duplicated(["n", "k", "fusion"]).any()
    for (n, k, fusion), g in t.groupby(["n", "k", "fusion"]):
        assert g.loc[g.chosen, "us"].iloc[0] == g.us.min(), (n, k, fusion)


def test_fidelity_table_and_the_published_references(run):
    fid = ch.fidelity_table(run).set_index("rung")
    assert fid.loc["eager", "error / eager's"] == pytest.approx(1.0)
    assert (fid.passed == (fid["same token"] & (fid["error / eager's"] <= ch.ERROR_FACTOR))).all()
    table = ch.next_to_published(run, published.NEAR_FLOOR_REFERENCES)
    ours = table[table.source == f"run {run.run_id}"]
    assert len(ours) == 2 and list(table.columns) == list(published.NEAR_FLOOR_REFERENCES.columns)
    assert isinstance(table, pd.DataFrame) and len(table) == len(published.NEAR_FLOOR_REFERENCES) + 2


def test_matmul_launches_read_the_launch_shapes_of_the_trace(run):
    theirs, ours = ch.matmul_launches(run, "fused-projections"), ch.matmul_launches(run, "triton-gemv")
    k = ch.kernel_table(run, "triton-gemv")
    assert ours.kernels.sum() == (k.kind == "matrix multiply").sum()
    gemv_rows = ours[ours.kernel == "gemv_kernel"]
    # our GEMV: N / BLOCK_N programs; the LM head's 151,936 rows in blocks of two
    assert 151_936 // 2 in set(gemv_rows.blocks)
    assert (gemv_rows.blocks > run.provenance["gpu_sms"]).all()
    cublas = theirs[theirs.kernel.str.startswith("nvjet")]
    assert (cublas.blocks <= run.provenance["gpu_sms"]).all()  # what the chapter says of cuBLAS here
    assert (theirs["blocks per SM"] == theirs.blocks / run.provenance["gpu_sms"]).all()


def test_notebook_runs_live_on_cpu_through_papermill(runs_root, monkeypatch, tmp_path):
    """The whole page on the CPU live path (tiny model): measured, then every analysis cell on the
    run just recorded, with the shared quantities read from the owners' published runs."""
    import json
    import shutil

    import nbformat
    import papermill as pm

    from labsupport import runs
    from labsupport.chapters import shared

    from .conftest import REPO

    book = REPO / "runs"
    pub = runs.published(book)
    for owner in shared.OWNERS:
        shutil.copytree(book / owner / pub[owner], runs_root / owner / pub[owner])
    (runs_root / "published.json").write_text(json.dumps({o: pub[o] for o in shared.OWNERS}))
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    out = tmp_path / "closing_the_gap.ipynb"
    nb_path = REPO / NOTEBOOK
    params = {"mode": "live", "preset": "tiny", "prompt_len": 16, "repeats": 2, "allow_cpu": True}
    pm.execute_notebook(
        str(nb_path), str(out), parameters=params, cwd=str(nb_path.parent), kernel_name="python3", progress_bar=False
    )
    nb = nbformat.read(out, as_version=4)
    assert "Traceback" not in json.dumps([c.get("outputs", []) for c in nb.cells])
    (run_dir,) = (runs_root / ch.CHAPTER).iterdir()
    assert json.loads((run_dir / "meta.json").read_text())["parameters"]["preset"] == "tiny"
