"""Why a GPU: the batch sweep's bytes with the KV cache, its limits, its irregular points and the
ridge beside the published H100 figure, on the recorded runs and on new-style runs built from
them (structure and arithmetic; no timings as pass/fail)."""
import math

import matplotlib.pyplot as plt
import pytest

from labsupport.measure import hardware, models
from labsupport import runs
from labsupport.chapters import why_a_gpu as ch

from .test_chapters_measured import derived_run, new_style_sweep


@pytest.fixture(scope="module")
def run():
    return ch.load()


@pytest.fixture(params=["recorded", "new-style"])
def any_run(request, run, tmp_path):
    """The recorded run, and a new-style one: the profiled step's context, and a read stream in
    its ceilings (hardware.Ceilings.read_*), as today's record() writes them."""
    if request.param == "recorded":
        return run
    ceil = run.table("ceilings").assign(read_bytes=4 * 2**30, read_ms_median=1.0, read_ms_min=0.99,
                                        read_ms_max=1.02, read_by="sum")
    return derived_run(run, tmp_path, {"batch_sweep": new_style_sweep(run), "ceilings": ceil})


def test_bytes_per_step_count_the_kv_cache(any_run):
    s = ch.sweep(any_run)
    c, kv = ch.counts(any_run), any_run.results["kv_bytes_per_token"]
    context = s.context_profiled if "context_profiled" in s else s.context_end
    assert (s.context == context).all()
    assert (s["weights bytes"] == c.decode_bytes).all()
    assert (s["KV bytes"] == s.batch * context * kv).all()
    assert (s["bytes"] == s["weights bytes"] + s["KV bytes"]).all()
    assert s["KV bytes"].is_monotonic_increasing
    # Operations: the matrix multiplies' plus attention's (4 per head dimension per query head per layer
    # per context token); attention's own intensity is then the query heads per key-value head.
    cfg = models.preset_config(any_run.parameters["preset"])
    a = ch.attention_flop_per_context_token(any_run)
    assert a == 4 * cfg["num_attention_heads"] * cfg["head_dim"] * cfg["num_hidden_layers"]
    assert a / kv == cfg["num_attention_heads"] / cfg["num_key_value_heads"]
    assert (s.FLOP == s.batch * (c.decode_flops + context * a)).all()
    assert s["FLOP/byte"].to_numpy() == pytest.approx((s.FLOP / s.bytes).to_numpy())
    assert s["attention TB/s"].to_numpy() == pytest.approx((s["KV bytes"] / s.attention_ns * 1e-3).to_numpy())
    assert s["other ms"].to_numpy() == pytest.approx(((s.kernel_ns - s.matmul_ns - s.attention_ns) / 1e6).to_numpy())
    shown = ch.bytes_display(any_run)
    assert len(shown) == len(s) <= 15
    assert shown["KV cache GB"].to_numpy() == pytest.approx((s["KV bytes"] / 1e9).to_numpy())


def test_limits_are_drawn_at_the_limits(any_run):
    s = ch.sweep(any_run)
    lim = hardware.run_limits(any_run)
    c = ch.counts(any_run)
    read_tbs, name = hardware.measured_read(lim)
    assert name == ("read" if "read_bytes" in any_run.table("ceilings") else "copy")
    assert s["memory limit ms"].to_numpy() == pytest.approx((s.bytes / (lim.datasheet_tbs * 1e12) * 1e3).to_numpy())
    assert s["math limit ms"].to_numpy() == pytest.approx((s.FLOP / (lim.datasheet_tflops * 1e12) * 1e3).to_numpy())
    assert (s["limit ms"] == s[["memory limit ms", "math limit ms"]].max(axis=1)).all()
    assert s["read floor ms"].to_numpy() == pytest.approx((s.bytes / (read_tbs * 1e12) * 1e3).to_numpy())
    # The matrix multiplies' memory limit is the weight matrices at the datasheet's bandwidth, at every batch.
    assert (s["matmul memory limit ms"] == c.matmul_bytes / (lim.datasheet_tbs * 1e9)).all()
    assert s["matmul math limit ms"].to_numpy() == pytest.approx(
        (s.batch * c.decode_flops / (lim.datasheet_tflops * 1e9)).to_numpy())
    # The whole step's memory limit grows with the KV cache, from the weights' alone.
    assert s["memory limit ms"].is_monotonic_increasing
    assert (s["memory limit ms"] > s["matmul memory limit ms"]).all()
    n = ch.sweep_numbers(any_run)
    assert n["lim_b1"] == s["limit ms"].iloc[0] and n["lim_bmax"] == s["limit ms"].iloc[-1]
    assert n["x_bmax"] == pytest.approx(s["GPU ms"].iloc[-1] / s["limit ms"].iloc[-1])
    assert n["mm_b1_of_limit"] == pytest.approx(s["matmul memory limit ms"].iloc[0] / s["matmul ms"].iloc[0])
    assert n["cat_gb_bmax"] == pytest.approx(2 * s["KV bytes"].iloc[-1] / 1e9)
    assert n["kv_share_bmax"] == pytest.approx(s["KV bytes"].iloc[-1] / s.bytes.iloc[-1])


def test_kv_ridge_solves_for_the_ridge(run):
    sheet = hardware.datasheet(run.provenance["gpu"])
    c, kv, a = ch.counts(run), run.results["kv_bytes_per_token"], ch.attention_flop_per_context_token(run)

    def intensity(batch, context):
        return batch * (c.decode_flops + a * context) / (c.decode_bytes + batch * context * kv)

    for sh in (sheet, ch.H100):
        k = ch.kv_ridge(run, sh)
        assert k.context == ch.sweep(run).context.iloc[-1]
        assert intensity(k.batch, k.context) == pytest.approx(sh.ridge_flop_per_byte)
        assert k.cap == pytest.approx(ch.kv_cap(run))
        assert intensity(1e12, k.context) == pytest.approx(k.cap, rel=1e-3)
        # At the longest context that still reaches the ridge, the cap is the ridge; beyond it, no batch does.
        at_max = ch.kv_ridge(run, sh, context=math.floor(k.max_context))
        assert at_max.batch > k.batch
        assert ch.kv_ridge(run, sh, context=math.ceil(k.max_context) + 1).batch == float("inf")
    # The faster memory of the same math reaches the ridge at a smaller batch.
    assert ch.kv_ridge(run, sheet).batch < ch.kv_ridge(run, ch.H100).batch


def test_ridge_beside_the_published_h100_figure(run):
    cmp = ch.ridge_comparison(run)
    pub = cmp.iloc[0]
    assert pub["from"].startswith("published") and pub.GPU == "H100 SXM"
    assert pub.batch == ch.PUBLISHED_H100_RIDGE_REQUESTS
    assert pub["GPU's datasheet ridge"] == pytest.approx(989 / 3.35)
    assert cmp["batch / ridge"].to_numpy() == pytest.approx((cmp.batch / cmp["GPU's datasheet ridge"]).to_numpy())
    r = ch.ridge(run)
    assert r.measured_batch in set(cmp.batch) and r.ceilings_batch in set(cmp.batch)
    kv_rows = cmp[cmp["where math becomes the limit"].str.startswith("whole step")]
    assert set(kv_rows.GPU) == {"H100 SXM", hardware.datasheet(run.provenance["gpu"]).name}
    assert len(cmp) <= 15
    text = ch.ridge_text(run)
    assert "Raw," in text and "Normalised" in text and "What else differs" in text
    assert run.provenance["transformers"] in text and run.provenance["torch"] in text


def test_ridge_text_on_a_gpu_without_a_datasheet(run, tmp_path):
    other = derived_run(run, tmp_path)
    meta = other.meta
    meta["provenance"] = {**meta["provenance"], "gpu": "NVIDIA Imaginary GPU"}
    unknown = runs.Run(chapter=other.chapter, run_id=other.run_id, path=other.path, meta=meta)
    assert "no datasheet" in ch.ridge_text(unknown)
    s = ch.sweep(unknown)
    assert s["limit ms"].isna().all()
    assert len(ch.ridge_comparison(unknown)) == 4   # published, two measured rows, the H100 with the KV cache


def test_irregular_points_of_the_recorded_sweep(run):
    s = ch.sweep(run).set_index("batch")
    bumps = ch.irregular_batches(run)
    for b in bumps:
        later = s.loc[s.index > b, "matmul ms"]
        assert s.loc[b, "matmul ms"] > (1 + ch.BUMP_TOLERANCE) * later.min()
    for b in set(s.index) - set(bumps):
        later = s.loc[s.index > b, "matmul ms"]
        assert later.empty or s.loc[b, "matmul ms"] <= (1 + ch.BUMP_TOLERANCE) * later.min()
    groups = ch.kernel_count_groups(run)
    assert [b for _, bs in groups for b in bs] == list(s.index)
    assert all(n == s.loc[b, "kernels"] for n, bs in groups for b in bs)


def test_split_k_evidence_from_the_prefill_chapter(run):
    ev = ch.split_k_evidence(run)
    assert ev is not None
    pr = runs.load_run(ch.PREFILL_CHAPTER)
    assert ev.run_id == pr.run_id and ev.tokens_many == pr.parameters["prompt_len"]
    dec = pr.table("kernels-decode")
    mm = dec[dec.kind == "matrix multiply"]
    assert ev.matmul_few == len(mm) and ev.reduce_few == mm.short_name.str.contains("splitKreduce").sum()
    assert all("layers." not in m for m in ev.modules)
    per_layer = ch.split_k_per_layer(run, ev)
    if per_layer is not None:
        s = ch.sweep(run)
        layers = ch.counts(run).layers
        assert (per_layer.to_numpy() * layers == (s.kernels - s.kernels.min()).to_numpy()).all()
        assert per_layer.iloc[0] * layers == ev.reduce_few - ev.reduce_many
    # Evidence that does not fit the reading is not used.
    assert ch.split_k_per_layer(run, None) is None
    odd = ch.SplitK(**{**ev.__dict__, "reduce_few": ev.reduce_few + 1})
    assert ch.split_k_per_layer(run, odd) is None


def test_irregular_text_says_what_it_cannot_tell(run):
    text = ch.irregular_text(run, ch.split_k_evidence(run))
    if ch.irregular_batches(run):
        assert "**Left for a new measurement:**" in text and "cannot tell" in text
        assert f"batch {ch.irregular_batches(run)[0]}" in text
    without = ch.irregular_text(run, None)
    assert "splitKreduce" not in without
    if ch.irregular_batches(run):
        assert "this run cannot say" in without


def test_no_irregular_point_and_a_short_sweep(run, tmp_path):
    """A sweep whose matrix multiplies only grow, and a smoke run's two batch sizes."""
    s = run.table("batch_sweep")
    smooth = s.assign(matmul_ns=(s.matmul_ns.iloc[0] * (1 + s.batch / 64)).astype(int))
    r1 = derived_run(run, tmp_path / "smooth", {"batch_sweep": smooth})
    assert ch.irregular_batches(r1) == []
    assert "no irregular point" in ch.irregular_text(r1, ch.split_k_evidence(run))
    short = s[s.batch.isin([1, 16])]
    r2 = derived_run(run, tmp_path / "short", {"batch_sweep": short})
    assert list(ch.sweep(r2).batch) == [1, 16]
    for fn in (ch.bytes_display, ch.ridge_comparison, ch.sweep_numbers, ch.ridge_text, ch.context_note):
        fn(r2)
    ch.irregular_text(r2, ch.split_k_evidence(run))
    # Without the prefill chapter's run beside it (a scratch runs folder), there is no evidence.
    assert ch.split_k_evidence(r2) is None


def test_context_note(any_run):
    note = ch.context_note(any_run)
    assert str(int(ch.sweep(any_run).context.iloc[-1])) in note
    assert ("profiled step" in note) and (("did not record" in note) == ("context_profiled" not in ch.sweep(any_run)))


def test_figures_build(any_run):
    for fig in (ch.bytes_figure(any_run), ch.throughput_figure(any_run)):
        assert fig.axes
        plt.close(fig)
    fig = ch.limits_figure(any_run)
    labels = " ".join(t.get_text() for ax in fig.axes for t in ax.get_legend().get_texts())
    _, name = hardware.measured_read(hardware.run_limits(any_run))
    assert "datasheet" in labels and f"measured {name}" in labels
    plt.close(fig)


def test_matmul_choice_per_batch_on_a_run_that_recorded_it():
    """Runs recorded since the sweep keeps each batch size's matrix-multiply kernels: the text
    names the kernels and their time at both batch sizes, and the table adds up to the sweep."""
    from labsupport.chapters import why_a_gpu

    run = why_a_gpu.load()
    if "batch_matmuls.csv" not in run.meta["files"]:
        pytest.skip("the published run predates the per-batch kernel table")
    c = why_a_gpu.matmul_choice(run, [192, 256])
    s = why_a_gpu.sweep(run).set_index("batch")
    for b in (192, 256):
        assert c[c.batch == b].gpu_ns.sum() == pytest.approx(s.loc[b, "matmul_ns"])
    text = why_a_gpu.matmul_choice_text(run, 192, 256)
    assert "at batch 192" in text and "at batch 256" in text and "`nvjet" in text
