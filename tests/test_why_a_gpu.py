"""Why a GPU, on the frozen copy of its recorded H200 run (tests/fixtures/runs) and on an
old-style run derived from it (no read stream, no kernel time, wall times taken after the
profiles): the arithmetic, the matrix-vector product, the batch sweep with its KV cache, limits,
ridge and irregular points, the published H100 figure, the figures and the explorer (structure
and arithmetic; no timings as pass/fail). Then the notebook's measuring cells, live on a CPU
with the tiny model: every time before the first profile, and a batch that runs out of memory."""

import json
import math
import shutil
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
import pytest
import torch

from labsupport import runs
from labsupport.chapters import why_a_gpu as ch
from labsupport.measure import decode, hardware, harness, models

from .conftest import FIXTURES, fixture_run
from .live_cells import parameters
from .page_names import prose_names, unglued

pytestmark = pytest.mark.unit

NOTEBOOK = Path(__file__).resolve().parent.parent / "notebooks" / "why_a_gpu.ipynb"
MATVEC_BYTES = 12288 * 4096 * 2  # Qwen3-8B's gate projection in BF16


def derived_run(run, root, tables=None, drop_files=(), drop_results=()):
    """A copy of `run` under `root` with some tables replaced, and some files and results left out."""
    tables = tables or {}
    with runs.RunWriter(
        run.declaration, run.parameters, run.run_id, root=root, meta={"provenance": run.provenance}
    ) as w:
        for name in run.meta["files"]:
            if name in drop_files or name.removesuffix(".csv") in tables:
                continue
            if name.endswith(".csv"):
                w.write_table(name[:-4], run.table(name[:-4]))
            else:
                shutil.copy(run.path / name, w.path / name)
        for name, df in tables.items():
            w.write_table(name, df)
        w.extra.update({k: v for k, v in run.results.items() if k not in drop_results})
    return runs.load_run(run.declaration, run.run_id, root=root)


def old_style(run, root):
    """`run` as runs recorded before the harness: no read stream in the ceilings, no profiled
    kernel time of the product (nor a `timing` column), the sweep's wall times without their
    range and taken after the profiles, only the context after the timed steps, no kernels
    per batch size."""
    ceil = run.table("ceilings").drop(
        columns=["read_bytes", "read_ms_median", "read_ms_min", "read_ms_max", "read_by", "read_tbs"]
    )
    mv = run.table("matvec")
    mv = mv[mv.timing != ch.KERNEL_TIME].drop(columns="timing")
    sweep = run.table("batch_sweep").drop(
        columns=["wall_ms_max", "issue_ms_median", "wall_repeats", "wall_clean", "context_profiled"]
    )
    return derived_run(
        run,
        root,
        {"ceilings": ceil, "matvec": mv, "batch_sweep": sweep},
        drop_files=("batch_matmuls.csv", "batch_times.csv"),
        drop_results=("method", "matvec_kernels"),
    )


@pytest.fixture(scope="module")
def run():
    return fixture_run("why-a-gpu")


@pytest.fixture(scope="module")
def prefill():
    return fixture_run("prefill-vs-decode")


@pytest.fixture(params=["recorded", "old-style"])
def any_run(request, run, tmp_path):
    return run if request.param == "recorded" else old_style(run, tmp_path)


# One token's arithmetic and the matrix-vector product -------------------------------------


def test_per_token_arithmetic(any_run):
    ar = ch.arithmetic(any_run).set_index("ceilings")
    sheet = ar.loc[ch.DATASHEET]
    assert sheet["math ms"] == pytest.approx(2 * 7_568_097_280 / 989e12 * 1e3)
    assert sheet["memory ms"] == pytest.approx(15_136_811_008 / 4.8e12 * 1e3)
    assert sheet["ridge FLOP/byte"] == pytest.approx(989 / 4.8)
    lim = hardware.run_limits(any_run)
    text = ch.memory_ceiling_text(any_run)
    if lim.read_tbs is None:  # before the read stream: no read rate but the product's, no practical ceiling
        assert set(ar.index) == {ch.DATASHEET} and ch.practical_ceiling_tbs(any_run) is None
        assert math.isnan(ch.shared(any_run)["ceiling_tbs"]) and math.isnan(ch.shared(any_run)["measured_ridge"])
        assert text.startswith("the matrix-vector product below read")
        return
    assert set(ar.index) == {ch.DATASHEET, ch.MEASURED}
    measured = ar.loc[ch.MEASURED]
    # The measured row reads at the practical ceiling: the best read rate, never the copy (which is faster here).
    best = lim.read_tbs  # this run measured no read kernels: its best read is the read stream
    assert lim.copy_tbs > best and measured["TB/s"] == pytest.approx(best) == ch.practical_ceiling_tbs(any_run)
    assert ch.shared(any_run)["ceiling_tbs"] == pytest.approx(best)
    assert ch.shared(any_run)["measured_ridge"] == pytest.approx(lim.gemm_tflops / best) == lim.measured_ridge
    assert measured["TFLOP/s"] == pytest.approx(lim.gemm_tflops)
    assert (ar["memory / math"] > 50).all()
    shown = ch.arithmetic_display(any_run)
    assert list(shown.index) == ["H200 SXM datasheet", "measured on this GPU"]
    assert f"{best:.2f} TB/s (read stream (matrix-vector product), 4 GiB), is the practical ceiling" in text
    assert f"{lim.read_tbs:.2f} TB/s" in text and ch.ceilings(any_run).read_by in text
    assert f"copy moved {lim.copy_tbs:.2f} TB/s" in text and "not a read rate" in text


def test_matvec_rates_and_summary(any_run):
    mv = ch.matvec(any_run)
    assert (mv["GB/s"] == mv.bytes / (mv.ms_median * 1e-3) / 1e9).all()
    assert (mv[mv.dtype == "bfloat16"].bytes == MATVEC_BYTES).all()
    assert set(mv.timing) <= {ch.KERNEL_TIME, ch.PER_CALL, ch.HOST_CLOCK}
    assert (mv[mv.device.str.startswith("CPU")].timing == ch.HOST_CLOCK).all()
    m = ch.matvec_summary(any_run)
    assert m.shape == "12288 x 4096" and m.mb == MATVEC_BYTES / 1e6
    assert m.gpu_ms == (m.gpu_kernel_ms if m.gpu_kernel_ms is not None else m.gpu_call_ms)
    assert m.speedup == pytest.approx(min(m.cpu32_ms, m.cpu16_ms) / m.gpu_ms)
    text = ch.matvec_text(any_run)
    assert f"{m.gpu_call_ms * 1e3:.1f} µs" in text
    # A CPU slower in BF16 than in float32: the text says float32 is the fair number.
    assert (m.cpu16_ms > m.cpu32_ms) == ("float32 is the fair CPU number" in text)


def test_matvec_kernel_time_where_the_run_profiled_it(run, tmp_path):
    m = ch.matvec_summary(run)
    assert m.gpu_kernel_ms and m.gpu_ms == m.gpu_kernel_ms and m.gpu_kernel_ms <= m.gpu_call_ms
    assert m.gpu_kernel_gbs == pytest.approx(MATVEC_BYTES / (m.gpu_kernel_ms * 1e-3) / 1e9)
    assert m.kernels == run.results["matvec_kernels"] and m.kernels
    text = ch.matvec_text(run)
    assert "the GPU's kernel time" in text and f"{m.gpu_kernel_ms * 1e3:.1f} µs" in text and m.kernels[0] in text
    old = ch.matvec_summary(old_style(run, tmp_path))
    assert old.gpu_kernel_ms is None and old.gpu_ms == old.gpu_call_ms == m.gpu_call_ms and old.kernels == []
    assert "did not profile the kernel" in ch.matvec_text(old_style(run, tmp_path / "again"))


# The batch sweep ---------------------------------------------------------------------------


def test_batch_sweep_and_ridge(run):
    s = ch.sweep(run)
    assert list(s.batch) == run.parameters["batches"][: len(s)]
    # The wall time is the minimum of the trials (the book's estimator); tokens/s are taken at it.
    assert (s["wall ms"] == s.wall_ms_min).all() and (s["tokens/s"] == s.batch / (s.wall_ms_min / 1e3)).all()
    assert (s["matmul ms"] <= s["GPU ms"]).all()
    assert ch.smallest(s).batch == 1 and ch.largest(s).batch == s.batch.max()
    r = ch.ridge(run)
    big = ch.largest(s)
    assert r.measured_batch == pytest.approx(r.flat_ms / r.ms_per_sequence)
    assert r.ms_per_sequence == pytest.approx(big["matmul ms"] / big.batch)
    assert r.flat_ms == pytest.approx(s.loc[s.batch <= 8, "matmul ms"].median()) == ch.flat_ms(s)
    assert r.flat_until in set(s.batch) and r.flat_until < s.batch.max()
    assert ch.bound_at(run, 1) == s.regime.iloc[0] and ch.bound_at(run, int(big.batch)) == s.regime.iloc[-1]
    assert r.datasheet_batch == pytest.approx(206.04, abs=0.01)
    lim = hardware.run_limits(run)
    assert r.ceilings_batch == pytest.approx(lim.gemm_tflops / ch.practical_ceiling_tbs(run))
    h = ch.headline(run)
    assert h["ridge batch"] == r.measured_batch and h["copy TB/s"] == pytest.approx(lim.copy_tbs)


def test_a_batch_out_of_memory_is_left_out_of_the_sweep(run, tmp_path):
    s = run.table("batch_sweep")
    oom = pd.DataFrame([{"batch": 2 * int(s.batch.max()), "status": "out of memory"}])
    with_oom = derived_run(run, tmp_path, {"batch_sweep": pd.concat([s, oom], ignore_index=True)})
    assert list(ch.sweep(with_oom).batch) == list(s.batch)


def interleaved_run(run, root, b1_ms=None, scale=None):
    """`run` as a run of the new method: the sweep timed interleaved (results' sweep_method), with
    quartiles; `b1_ms` sets the batch-1 step's minimum, `scale(row)` every wall time."""
    sw = run.table("batch_sweep").copy()
    if scale is not None:
        for col in ("wall_ms_min", "wall_ms_median", "wall_ms_max"):
            sw[col] = [scale(r) * r[col] / r.wall_ms_min for _, r in sw.iterrows()]
    if b1_ms is not None:
        sw.loc[sw.batch == 1, "wall_ms_min"] = b1_ms
    sw["wall_ms_q1"] = (sw.wall_ms_min + sw.wall_ms_median) / 2
    sw["wall_ms_q3"] = (sw.wall_ms_median + sw.wall_ms_max) / 2
    derived = derived_run(run, root, {"batch_sweep": sw})
    derived.results["sweep_method"] = ch.SWEEP_METHOD
    return derived


EAGER = {"eager_wall_ms": 29.85, "eager_gpu_busy_ms": 7.52, "eager_kernels": 2218}


def test_how_the_wall_times_were_taken(any_run, run, tmp_path):
    shown = ch.sweep_display(any_run)
    s = ch.sweep(any_run)
    assert not ch.interleaved(any_run) and "wall q1–q3" not in shown  # recorded before the quartiles
    assert list(shown["wall ms"]) == list(s.wall_ms_min) and list(shown["wall median"]) == list(s.wall_ms_median)
    if "wall_clean" in s:
        assert ch.wall_times_clean(any_run)
        note = ch.sweep_note(any_run, EAGER, "k1")
        assert "measured the old way" in note and "back to back on the same growing cache" in note
        one = s.set_index("batch").loc[1]
        assert f"{one.wall_ms_min:.1f} ms (the minimum of 5" in note and "29.9 ms in *The kernels in one token*" in note
        assert f"{one.wall_ms_min / 29.85:.1f} times" in note and "run `k1`" in note
    else:
        # A run recorded before the harness timed each batch size after profiling it: the page says so.
        assert not ch.wall_times_clean(any_run) and "upper bound" in ch.sweep_note(any_run, EAGER)
    new = interleaved_run(run, tmp_path / "new")
    shown = ch.sweep_display(new)
    assert ch.interleaved(new) and "wall q1–q3" in shown
    assert "in an order that rotates from round to round" in ch.sweep_note(new)


def test_the_batch_1_step_against_the_shared_eager_step(run, tmp_path):
    # The check itself: more than 10% apart is flagged.
    assert ch.Batch1(32.0, 33.0, 12, 30.0).agrees and ch.Batch1(27.5, 28.0, 12, 30.0).agrees
    assert not ch.Batch1(33.1, 34.0, 12, 30.0).agrees and not ch.Batch1(26.9, 27.0, 12, 30.0).agrees
    assert ch.Batch1(90.9, 90.9, 5, 29.85).ratio == pytest.approx(90.9 / 29.85)
    # The recorded (old-method) run's batch-1 step is flagged: about twice the eager step.
    old = ch.batch1_check(run, EAGER["eager_wall_ms"])
    assert old.sweep_ms == ch.sweep(run).set_index("batch").loc[1, "wall_ms_min"] and not old.agrees
    # The eager step is the shared one, from the fixture run of "The kernels in one token".
    from labsupport.chapters import shared

    eager = shared.owner_values("kernels-in-one-token", fixture_run("kernels-in-one-token"))
    assert ch.batch1_check(run, eager["eager_wall_ms"]).eager_ms == eager["eager_wall_ms"]
    close = interleaved_run(run, tmp_path / "close", b1_ms=31.0)
    c = ch.batch1_check(close, 29.85)
    assert c.agrees and c.trials == 5
    note = ch.sweep_note(close, EAGER, "k1")
    assert "took 31.0 ms (the minimum of 5), 4% above the eager step's 29.9 ms." in note
    far = interleaved_run(run, tmp_path / "far", b1_ms=40.0)
    assert not ch.batch1_check(far, 29.85).agrees
    assert "more than 10% apart" in ch.sweep_note(far, EAGER, "k1")
    assert "more than" not in ch.sweep_note(close, EAGER, "k1")
    short = derived_run(run, tmp_path / "short", {"batch_sweep": run.table("batch_sweep").query("batch > 1")})
    assert ch.batch1_check(short, 29.85) is None


def test_each_batch_size_falls_in_one_regime(run, tmp_path):
    s = ch.sweep(run)
    assert set(s.regime) <= {ch.OVERHEAD, ch.MEMORY, ch.COMPUTE}
    # The recorded run (the old method): the GPU busy for under half of every step, so every batch
    # size is overhead-bound; the GPU's own time is memory-bound while the matmuls stay flat.
    assert (s["GPU ms"] / s["wall ms"] < ch.batch_sweep.OVERHEAD_BUSY).all() and (s.regime == ch.OVERHEAD).all()
    flat = ch.flat_ms(s)
    assert list(s["GPU regime"]) == [
        ch.COMPUTE if m > ch.batch_sweep.FLAT_TOLERANCE * flat else ch.MEMORY for m in s["matmul ms"]
    ]
    g = ch.regime_batches(run, "GPU regime")
    assert g[ch.MEMORY] == [1, 2, 4, 8, 16, 32, 64, 128] and g[ch.COMPUTE][0] == 160
    assert ch.regime_text(run) == (
        "By wall time: overhead-bound, batches 1 to 512. By the GPU's own time alone: memory-bound, batches 1 "
        "to 128; compute-bound, batches 160 to 512."
    )
    # A quiet host: the wall time just above the GPU's busy time past batch 64, three times it below.
    quiet = interleaved_run(run, tmp_path, scale=lambda r: r.gpu_busy_ns / 1e6 * (3 if r.batch <= 64 else 1.2))
    q = ch.sweep(quiet).set_index("batch").regime
    assert q[1] == q[64] == ch.OVERHEAD and q[128] == ch.MEMORY and q[512] == ch.COMPUTE
    assert ch.bound_at(quiet, 128) == ch.MEMORY and "memory-bound, batch 128;" in ch.regime_text(quiet)
    assert list(ch.sweep_display(quiet).regime) == list(q)


def test_ridge_pair_text_gets_the_direction_right(run):
    text = ch.ridge_pair_text(run)
    # Less bandwidth per FLOP (the H100) means the larger ridge: 295 against the H200's 206.
    assert "H100" in text and "at 295 FLOP/byte" in text and "at 206 FLOP/byte" in text
    assert text.index("295") < text.index("206") and "less bandwidth per FLOP needs the larger batch" in text


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
    assert (s.batch * (c.decode_flops + context * a) == s.FLOP).all()
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
    assert s["memory limit ms"].to_numpy() == pytest.approx((s.bytes / (lim.datasheet_tbs * 1e12) * 1e3).to_numpy())
    assert s["math limit ms"].to_numpy() == pytest.approx((s.FLOP / (lim.datasheet_tflops * 1e12) * 1e3).to_numpy())
    assert (s["limit ms"] == s[["memory limit ms", "math limit ms"]].max(axis=1)).all()
    # Dashed: the bytes at the practical ceiling (the best rate any kernel of the run reached).
    ceil = ch.practical_ceiling_tbs(any_run)
    if ceil is None:  # a run without a read stream has no practical ceiling: never the copy
        assert s["ceiling ms"].isna().all()
    else:
        assert ceil == lim.read_tbs and s["ceiling ms"].to_numpy() == pytest.approx(
            (s.bytes / (ceil * 1e12) * 1e3).to_numpy()
        )
        assert (s["ceiling ms"] >= s["memory limit ms"]).all()  # the floor: no kernel beats it
    # The matrix multiplies' memory limit is the weight matrices at the datasheet's bandwidth, at every batch.
    assert (s["matmul memory limit ms"] == c.matmul_bytes / (lim.datasheet_tbs * 1e9)).all()
    assert s["matmul math limit ms"].to_numpy() == pytest.approx(
        (s.batch * c.decode_flops / (lim.datasheet_tflops * 1e9)).to_numpy()
    )
    # The whole step's memory limit grows with the KV cache, from the weights' alone.
    assert s["memory limit ms"].is_monotonic_increasing
    assert (s["memory limit ms"] > s["matmul memory limit ms"]).all()
    n = ch.sweep_numbers(any_run)
    one, big = s.set_index("batch").loc[1], s.set_index("batch").loc[s.batch.max()]
    assert n["lim_b1"] == one["limit ms"] and n["lim_bmax"] == big["limit ms"]
    assert n["x_bmax"] == pytest.approx(big["GPU ms"] / big["limit ms"])
    assert n["mm_b1_of_limit"] == pytest.approx(one["matmul memory limit ms"] / one["matmul ms"])
    assert n["cat_gb_bmax"] == pytest.approx(2 * big["KV bytes"] / 1e9)
    assert n["kv_share_bmax"] == pytest.approx(big["KV bytes"] / big.bytes)


def test_context_note(any_run):
    note = ch.context_note(any_run)
    s = ch.sweep(any_run)
    assert str(int(ch.largest(s).context)) in note
    assert "profiled step" in note and (("did not record" in note) == ("context_profiled" not in s))


# The ridge with the KV cache, and the published H100 figure ------------------------------


def test_kv_ridge_solves_for_the_ridge(run):
    sheet = hardware.datasheet(run.provenance["gpu"])
    c, kv, a = ch.counts(run), run.results["kv_bytes_per_token"], ch.attention_flop_per_context_token(run)

    def intensity(batch, context):
        return batch * (c.decode_flops + a * context) / (c.decode_bytes + batch * context * kv)

    for sh in (sheet, ch.H100):
        k = ch.kv_ridge(run, sh)
        assert k.context == ch.largest(ch.sweep(run)).context
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
    pub = cmp.set_index("key").loc[ch.PUBLISHED]
    assert pub["from"].startswith("published") and pub.GPU == "H100 SXM"
    assert pub.batch == ch.PUBLISHED_H100_RIDGE_REQUESTS
    assert pub["GPU's datasheet ridge"] == pytest.approx(989 / 3.35)
    assert cmp["batch / ridge"].to_numpy() == pytest.approx((cmp.batch / cmp["GPU's datasheet ridge"]).to_numpy())
    r = ch.ridge(run)
    assert r.measured_batch in set(cmp.batch) and r.ceilings_batch in set(cmp.batch)
    kv_rows = cmp[cmp.key == "kv-cache"]
    assert set(kv_rows.GPU) == {"H100 SXM", hardware.datasheet(run.provenance["gpu"]).name}
    assert len(cmp) <= 15 and "key" not in ch.ridge_display(run)
    text = ch.ridge_text(run)
    assert "Raw," in text and "Normalised" in text and "What else differs" in text
    assert run.provenance["transformers"] in text and run.provenance["torch"] in text


def test_ridge_text_on_a_gpu_without_a_datasheet(run, tmp_path):
    other = derived_run(run, tmp_path)
    meta = other.meta
    meta["provenance"] = {**meta["provenance"], "gpu": "NVIDIA Imaginary GPU"}
    unknown = runs.Run(other.chapter, other.run_id, other.path, meta, declaration=ch.DECLARATION)
    assert "no datasheet" in ch.ridge_text(unknown)
    s = ch.sweep(unknown)
    assert s["limit ms"].isna().all()
    assert len(ch.ridge_comparison(unknown)) == 4  # published, two measured rows, the H100 with the KV cache


# The irregular points -----------------------------------------------------------------------


def bumpy(run, root):
    """`run` with an irregular point: batch 192's matrix multiplies 20% slower than batch 256's."""
    s = run.table("batch_sweep")
    at_256 = int(s.loc[s.batch == 256, "matmul_ns"].squeeze())
    s.loc[s.batch == 192, "matmul_ns"] = int(1.2 * at_256)
    return derived_run(run, root, {"batch_sweep": s})


@pytest.mark.parametrize("irregular", [False, True])
def test_irregular_points(run, tmp_path, irregular):
    r = bumpy(run, tmp_path) if irregular else run
    s = ch.sweep(r).set_index("batch")
    bumps = ch.irregular_batches(r)
    assert bumps == ([192] if irregular else [])  # the recorded 192 is within BUMP_TOLERANCE of 256
    for b in bumps:
        later = s.loc[s.index > b, "matmul ms"]
        assert s.loc[b, "matmul ms"] > (1 + ch.BUMP_TOLERANCE) * later.min()
    for b in set(s.index) - set(bumps):
        later = s.loc[s.index > b, "matmul ms"]
        assert later.empty or s.loc[b, "matmul ms"] <= (1 + ch.BUMP_TOLERANCE) * later.min()
    groups = ch.kernel_count_groups(r)
    assert [b for _, bs in groups for b in bs] == list(s.index)
    assert all(n == s.loc[b, "kernels"] for n, bs in groups for b in bs)


def test_split_k_evidence_from_the_prefill_chapter(run, prefill):
    ev = ch.split_k_evidence(prefill)
    assert ev.run_id == prefill.run_id and ev.tokens_many == prefill.parameters["prompt_len"]
    dec = prefill.table("kernels-decode")
    mm = dec[dec.kind == "matrix multiply"]
    assert ev.matmul_few == len(mm) and ev.reduce_few == mm.short_name.str.contains("splitKreduce").sum()
    assert ev.reduce_few > 0 and all("layers." not in m for m in ev.modules)
    per_layer = ch.split_k_per_layer(run, ev)
    assert per_layer is not None, "the recorded runs support the reading"
    s = ch.sweep(run).set_index("batch")
    layers = ch.counts(run).layers
    assert (per_layer * layers == s.kernels - s.kernels.min()).all()
    assert per_layer[1] * layers == ev.reduce_few - ev.reduce_many
    # Evidence that does not fit the reading is not used.
    assert ch.split_k_per_layer(run, None) is None
    odd = ch.SplitK(**{**ev.__dict__, "reduce_few": ev.reduce_few + 1})
    assert ch.split_k_per_layer(run, odd) is None
    assert ch.split_k_evidence(None) is None


def test_irregular_text_says_what_the_kernels_show(run, prefill, tmp_path):
    r = bumpy(run, tmp_path)
    text = ch.irregular_text(r, ch.split_k_evidence(prefill))
    assert "At batch 192 the matrix multiplies" in text and "at batch 256, which does" in text
    assert "`cublasLt::splitKreduce_kernel`" in text and "at batch 192 cuBLAS's heuristics dropped split-K" in text
    assert "This run recorded which matrix-multiply kernels ran" in text  # it has batch_matmuls
    without = ch.irregular_text(r, None)
    assert "splitKreduce" not in without and "this run cannot say" in without


def test_irregular_text_on_an_old_run_says_what_it_cannot_tell(run, tmp_path):
    old = bumpy(old_style(run, tmp_path / "old"), tmp_path / "bumpy")
    text = ch.irregular_text(old, None)
    assert "**Left for a new measurement:**" in text and "cannot tell" in text
    assert "batches 160, 192, 224, 256" in text


def test_no_irregular_point_and_a_short_sweep(run, prefill, tmp_path):
    """A sweep whose matrix multiplies only grow, and a smoke run's two batch sizes."""
    s = run.table("batch_sweep")
    smooth = s.assign(matmul_ns=(s.set_index("batch").loc[1, "matmul_ns"] * (1 + s.batch / 64)).astype(int))
    r1 = derived_run(run, tmp_path / "smooth", {"batch_sweep": smooth})
    ev = ch.split_k_evidence(prefill)
    assert ch.irregular_batches(r1) == []
    assert "no irregular point" in ch.irregular_text(r1, ev)
    short = s[s.batch.isin([1, 16])]
    r2 = derived_run(run, tmp_path / "short", {"batch_sweep": short})
    assert list(ch.sweep(r2).batch) == [1, 16]
    for fn in (ch.bytes_display, ch.ridge_comparison, ch.sweep_numbers, ch.ridge_text, ch.context_note):
        fn(r2)
    ch.irregular_text(r2, ev)


def test_matmul_choice_per_batch(run):
    """The sweep keeps each batch size's matrix-multiply kernels: the text names the kernels and
    their time at both batch sizes, and the table adds up to the sweep."""
    c = ch.matmul_choice(run, [192, 256])
    s = ch.sweep(run).set_index("batch")
    for b in (192, 256):
        assert c[c.batch == b].gpu_ns.sum() == pytest.approx(s.loc[b, "matmul_ns"])
    text = ch.matmul_choice_text(run, 192, 256)
    assert "at batch 192" in text and "at batch 256" in text and "`nvjet" in text


# Figures and the explorer ------------------------------------------------------------------


def test_figures_build(any_run):
    from labsupport import figures

    for fig in (ch.bytes_figure(any_run), ch.throughput_figure(any_run), ch.limits_figure(any_run)):
        assert fig.axes
        # Readable: no text under 9 px on a 1280 px page.
        small = [(round(px, 1), t) for px, t in figures.text_heights_px(fig, 1280) if px < 9]
        assert not small, small
        plt.close(fig)
    fig = ch.limits_figure(any_run)
    labels = " ".join(t.get_text() for ax in fig.axes if ax.get_legend() for t in ax.get_legend().get_texts())
    assert "floor: bytes at 4.80 TB/s (H200 SXM datasheet)" in labels
    assert ("the practical ceiling" in labels) == (ch.practical_ceiling_tbs(any_run) is not None)
    plt.close(fig)
    # The throughput figure names the regimes it shades.
    fig = ch.throughput_figure(any_run)
    texts = {t.get_text() for t in fig.axes[0].texts}
    assert {r.replace("-bound", "-\nbound") for r in ch.sweep(any_run).regime} == texts
    plt.close(fig)


def test_batch_explorer_widget_replays_the_sweep(run):
    box = ch.explorer(run)
    slider, out = box.children
    assert list(slider.options) == list(ch.sweep(run).batch)
    assert "batch 1</b>" in out.value and "overhead-bound" in out.value and "wall 64.73 ms (minimum)" in out.value
    slider.value = max(slider.options)
    assert f"batch {max(slider.options)}</b>" in out.value and ch.bound_at(run, max(slider.options)) in out.value


# The notebook's measuring cells, live on a CPU ------------------------------------------------

TINY = dict(mode="live", preset="tiny", device="cpu", prompt_len=16, batches=[1, 2, 4], rounds=2, matvec_repeats=2)


def run_live_cells(**given):
    """The notebook's code cells up to the one that loads the run, in this process (so that the
    tests can watch the harness), with `given` in place of the parameters' defaults."""
    nb = json.loads(NOTEBOOK.read_text())
    ns: dict = {}
    for cell in nb["cells"]:
        if cell["cell_type"] != "code":
            continue
        src = "".join(cell["source"])
        exec(compile(src, str(NOTEBOOK), "exec"), ns)
        if "parameters" in cell["metadata"].get("tags", []):
            ns.update(parameters(**given))
        if "ch.load(run_id)" in src:
            return ns["run"]
    raise AssertionError("no cell of the notebook loads the run")


@pytest.fixture
def sweeps(monkeypatch, calls):
    """Every interleaved timing the cells make, logged into `calls` as ("time", what) too."""
    real, seen = harness.interleaved, []

    def interleaved(variants, **kw):
        calls.append(("time", kw.get("what", "")))
        seen.append((list(variants), kw))
        return real(variants, **kw)

    monkeypatch.setattr(harness, "interleaved", interleaved)
    return seen


def test_the_notebook_in_float16_records_float16_products(runs_root, calls, sweeps):
    run = run_live_cells(**TINY, dtype="float16")
    assert run.parameters["dtype"] == "float16" and run.results["model"]["bytes_per_parameter"] == 2
    mv = ch.matvec(run)
    assert sorted(set(mv.dtype)) == ["float16", "float32"]
    assert ch.matvec_summary(run).mb == pytest.approx(only_bytes(mv, "float16") / 1e6)


def only_bytes(mv, dtype):
    (b,) = set(mv.loc[mv.dtype == dtype, "bytes"])
    return b


@pytest.mark.live
def test_the_notebook_times_everything_before_it_profiles(runs_root, calls, sweeps):
    run = run_live_cells(**TINY)
    # The batch sizes are timed together, interleaved in rounds, before any profile.
    assert [(v, kw["rounds"], kw["warmup"]) for v, kw in sweeps] == [
        (["batch 1", "batch 2", "batch 4"], TINY["rounds"], ch.DECODE_WARMUP)
    ]
    kinds = [k for k, _ in calls]
    assert "profile" in kinds and "time" not in kinds[kinds.index("profile") :], calls
    assert [w for k, w in calls if k == "profile"] == ["decode_step"] * 3 + ["matvec"]
    assert run.path.parent.parent == runs_root
    defaults = {"dtype": "bfloat16", "model": ""}  # recorded with the rest
    assert run.parameters == {**{k: v for k, v in TINY.items() if k != "mode"}, **defaults}
    s = run.table("batch_sweep")
    assert list(s.batch) == [1, 2, 4] and (s.status == "ok").all() and s.wall_clean.all()
    assert (s.wall_ms_min <= s.wall_ms_q1).all() and (s.wall_ms_q1 <= s.wall_ms_median).all()
    assert (s.wall_ms_median <= s.wall_ms_q3).all() and (s.wall_ms_q3 <= s.wall_ms_max).all()
    p = run.parameters
    # Every step on a copy of its batch's one prefill: the timed and the profiled step both see the prompt alone.
    assert (s.context_end == p["prompt_len"] + 1).all() and (s.context_profiled == p["prompt_len"] + 1).all()
    times = run.table("batch_times")
    assert len(times) == 3 * p["rounds"] and times.clean.all()
    assert sorted(times["round"]) == sorted(list(range(p["rounds"])) * 3)
    assert ch.interleaved(run) and (s.wall_repeats == p["rounds"]).all()
    assert set(run.table("batch_matmuls").batch) <= {1, 2, 4}
    mv = ch.matvec(run)
    assert sorted(zip(mv.timing, mv.dtype, strict=True)) == sorted(
        [
            (ch.KERNEL_TIME, "bfloat16"),
            (ch.PER_CALL, "bfloat16"),
            (ch.HOST_CLOCK, "float32"),
            (ch.HOST_CLOCK, "bfloat16"),
        ]
    )
    assert set(run.results["method"]) == set(harness.method())
    assert set(run.results) - {"host_probe", "host_slow", "compile"} == {  # every run records those three
        "method",
        "model",
        "kv_bytes_per_token",
        "matvec_kernels",
        "sweep_method",
        "sweep_setup",
    }
    assert run.results["sweep_setup"] == ch.SETUP_COPY  # a CPU keeps every batch's prefilled cache
    assert "read_kernels.csv" not in run.meta["files"], "no GPU: no read kernels, no practical ceiling"
    assert set(ch.regimes(ch.sweep(run))) <= {ch.OVERHEAD, ch.MEMORY, ch.COMPUTE}
    assert not list(run.path.glob(".profile*")), "the scratch trace is removed"


@pytest.mark.live
def test_the_notebook_stops_the_sweep_at_a_batch_out_of_memory(runs_root, calls, monkeypatch):
    real = ch.prefill_once

    def prefill_once(model, batch, *args):
        if batch >= 2:
            raise torch.OutOfMemoryError("fake: out of memory")
        return real(model, batch, *args)

    monkeypatch.setattr(ch, "prefill_once", prefill_once)
    run = run_live_cells(**TINY)
    s = run.table("batch_sweep")
    assert list(zip(s.batch, s.status, strict=True)) == [(1, "ok"), (2, "out of memory")], "batch 4 is skipped"
    assert [w for k, w in calls if k == "profile"] == ["decode_step", "matvec"]
    assert list(ch.sweep(run).batch) == [1]


def test_a_copy_of_a_prefill_is_the_state_a_fresh_prefill_leaves():
    """The sweep's steps run on a copy of one prefill (ch.copied_step): the same tensors, in the same
    layout, as a fresh prefill (ch.fresh_step) gives, so the same next token and context."""
    model = models.build_model("tiny", device="cpu", dtype="bfloat16")
    state = ch.prefill_once(model, 2, 16, "cpu")
    fresh_fn, fresh_setup = ch.fresh_step(model, ch.batch_prompt(model, 2, 16, "cpu"))
    copy_fn, copy_setup = ch.copied_step(model, state)
    (fc, ft), (cc, ct) = fresh_setup(), copy_setup()
    for f, c in zip(fc.layers, cc.layers, strict=True):
        assert torch.equal(f.keys, c.keys) and f.keys.stride() == c.keys.stride() and torch.equal(f.values, c.values)
    assert cc.layers[0].keys.data_ptr() != state[0].layers[0].keys.data_ptr(), "a copy, not the kept cache"
    assert torch.equal(fresh_fn(fc, ft), copy_fn(cc, ct)) and fc.get_seq_length() == cc.get_seq_length() == 17
    assert state[0].get_seq_length() == 16, "the kept cache is never stepped"


def test_the_first_rows_of_a_larger_prefill_are_the_state_a_prefill_of_those_rows_leaves():
    """Where the caches of every batch size do not fit together, a batch's steps run on a copy of
    the first rows of the largest batch's prefill (SETUP_ROWS): each tensor the layout a prefill of
    those prompts alone gives, in storage of its own, so the same next tokens and context."""
    model = models.build_model("tiny", device="cpu", dtype="bfloat16")
    state = ch.prefill_once(model, 4, 16, "cpu")
    fresh_fn, fresh_setup = ch.fresh_step(model, decode.Prompt(ch.batch_prompt(model, 4, 16, "cpu").ids[:2]))
    rows_fn, rows_setup = ch.step_for(model, 2, 16, "cpu", state)
    (fc, ft), (rc, rt) = fresh_setup(), rows_setup()
    for f, r in zip(fc.layers, rc.layers, strict=True):
        assert f.keys.shape == r.keys.shape == (2, *state[0].layers[0].keys.shape[1:])
        assert r.keys.is_contiguous() and r.keys.stride() == f.keys.stride() and r.values.stride() == f.values.stride()
        assert r.keys.untyped_storage().nbytes() == r.keys.numel() * r.keys.element_size(), "its own storage"
        torch.testing.assert_close(r.keys, f.keys)
        torch.testing.assert_close(r.values, f.values)
    assert torch.equal(rt, ft) and torch.equal(fresh_fn(fc, ft), rows_fn(rc, rt))
    assert rc.get_seq_length() == 17 and state[0].get_seq_length() == 16, "the kept cache is never stepped"
    assert state[0].layers[0].keys.shape[0] == 4


def test_the_sweep_keeps_one_prefill_where_the_caches_do_not_fit(runs_root, calls, monkeypatch):
    monkeypatch.setattr(ch, "keeps_prefills", lambda *a: False)
    kept = []
    real = ch.prefill_once

    def prefill_once(model, batch, *args):
        kept.append(batch)
        return real(model, batch, *args)

    monkeypatch.setattr(ch, "prefill_once", prefill_once)
    run = run_live_cells(**TINY)
    assert run.results["sweep_setup"] == ch.SETUP_ROWS
    batches = run.parameters["batches"]
    assert kept == [*batches, batches[-1]], "every batch size tried once, then the largest prefilled again and kept"
    s = run.table("batch_sweep")
    assert (s.status == "ok").all() and (s.context_profiled == run.parameters["prompt_len"] + 1).all()
    assert "first rows, one per sequence of its batch" in ch.sweep_note(run)
    assert "first rows" in ch.steps_note(run)


def test_the_notebook_shows_its_measuring_code_and_reads_no_other_chapters_module():
    nb = json.loads(NOTEBOOK.read_text())
    code = [("".join(c["source"]), c["metadata"].get("tags", [])) for c in nb["cells"] if c["cell_type"] == "code"]
    measuring = [
        tags
        for src, tags in code
        if any(
            f in src for f in ("recording.PendingRun(", "ch.time_batches(", "ch.profile_batch(", "ch.time_matvec_gpu(")
        )
    ]
    assert len(measuring) >= 3 and not any(measuring), "the measuring cells are visible"
    assert not [src for src, tags in code if "remove-input" in tags or "hide-output" in tags]
    assert [src for src, tags in code if "remove-cell" in tags] == ["ch.explorer(run)"]  # a live widget only
    imports = [line for src, _ in code for line in src.splitlines() if "labsupport.chapters" in line]
    # its own chapter module (its page glues the shared quantities), and the host banner and the box about the run
    assert sorted(set(imports)) == [
        "from labsupport.chapters import data_files",
        "from labsupport.chapters import why_a_gpu as ch",
    ]


# The page ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def shared_values(run):
    from labsupport.chapters import shared

    return shared.values(given={ch.CHAPTER: run}, root=FIXTURES)


def test_the_page_quotes_the_runs_tables(run, prefill, shared_values):
    page = ch.page(run, shared_values, prefill)
    sweep_csv = run.table("batch_sweep").query("status == 'ok'").set_index("batch")
    matvec_csv = run.table("matvec").set_index(["device", "dtype", "timing"])
    assert page.bmax == sweep_csv.index.max() == 512 and page.param_prompt_len == 256
    assert page.b1_gpu_ms == pytest.approx(sweep_csv.loc[1, "gpu_busy_ns"] / 1e6)
    assert page.b1_wall_ms == pytest.approx(sweep_csv.loc[1, "wall_ms_min"])
    cpu = matvec_csv.loc[("CPU (16 threads)", "float32", "host clock"), "ms_median"]
    per_call = matvec_csv.loc[("NVIDIA H200", "bfloat16", "per call (CUDA events)"), "ms_median"]
    assert page.tk_cpu_x == pytest.approx(cpu / per_call)
    assert page.mv_shape == "12288 x 4096" and page.mv_mb == pytest.approx(MATVEC_BYTES / 1e6)
    assert page.tk_tokens_x == pytest.approx(page.bmax_tokens / page.b1_tokens)
    assert page.s_kv_kb_per_token == run.results["kv_bytes_per_token"] / 1e3
    # batch 1 against the shared eager step, from the fixture run of "The kernels in one token"
    eager = {name: shared_values[name].value for name in ("eager_wall_ms", "eager_gpu_busy_ms")}
    assert page.tk_b1_busy == pytest.approx(eager["eager_gpu_busy_ms"] / eager["eager_wall_ms"])
    ratio = sweep_csv.loc[1, "wall_ms_min"] / eager["eager_wall_ms"]  # the old method's sweep: flagged
    assert page.b1_note.startswith(f"{sweep_csv.loc[1, 'wall_ms_min']:.1f} ms, {ratio:.1f} times the eager step")
    assert "over the 5 timed steps" in page.steps_note  # the old method: one growing cache
    assert page.run_label == f"NVIDIA H200, run `{run.run_id}`, {run.provenance['utc_time'][:10]}"
    assert page.sheet_name.endswith("datasheet") and page.sheet_ratio > 100  # memory, not math
    # the tables leave out what the prose gives or does not use; the explorer has one panel per batch size
    assert "kernels" not in page.sweep_table and "weights GB" not in page.bytes_table
    assert list(page.sweep_panels) == list(sweep_csv.index)
    assert f"{sweep_csv.loc[512, 'gpu_busy_ns'] / 1e6:.2f} ms per step" in page.sweep_panels[512]


def test_the_page_without_the_other_chapters_runs(run, shared_values):
    own = {name: value for name, value in shared_values.items() if value.quantity.owner == ch.CHAPTER}
    page = ch.page(run, own, None)
    assert page.b1_note == "the shared eager step's run is not available here, so this page cannot set it beside it."
    assert math.isnan(page.tk_b1_busy) and page.irregular_text == ch.irregular_text(run, None)


def test_the_shared_quantities_show_a_dash_without_the_other_owners_runs(run, monkeypatch):
    from labsupport import glue
    from labsupport.chapters import shared

    def missing(given=None):
        raise runs.RunError("no published run")

    glued = {}
    monkeypatch.setattr(shared, "glue_values", missing)
    monkeypatch.setattr(glue, "glue", lambda name, value, display=False: glued.__setitem__(name, str(value)))
    values = ch.glue_shared(run)
    assert set(glued) == set(shared.QUANTITIES) | {f"shared_run_{o.replace('-', '_')}" for o in shared.OWNERS}
    assert {n for n, text in glued.items() if text != "–"} == set(values) | {"shared_run_why_a_gpu"}
    assert glued["eager_wall_ms"] == "–" and glued["shared_run_why_a_gpu"] == run.run_id


def test_every_glue_name_of_the_prose_is_a_page_field_or_a_shared_quantity():
    assert len(prose_names(NOTEBOOK)) > 60 and unglued(NOTEBOOK, ch.Page) == set()
