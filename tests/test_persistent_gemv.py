"""The persistent GEMV (gemv.Config.ctas_per_sm > 0, labsupport.measure.kernels.persistent_gemv)
computes what PyTorch computes while each program walks several blocks of rows, the tuner keeps its
choice apart from the plain GEMV's, and the options that need it refuse to run without it. On a CPU,
in float32, in Triton's interpreter (persistent_gemv.INTERPRETER_SMS stand for the SMs). Its
folded-norms epilogues (sumsq_in, sumsq_out, argmax), the chain of Σx² rows and the persistent
rung's whole step on the tiny model are tested with the other folded GEMVs, in test_norm_fusion."""

import os
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"  # before any kernel is built

from labsupport.measure.models import qwen3_decode  # noqa: E402

pytest.importorskip("triton")
from labsupport.measure.kernels import gemv, persistent_gemv  # noqa: E402

from .conftest import assert_gemv_products  # noqa: E402

pytestmark = pytest.mark.unit
CLOSE = dict(rtol=1e-4, atol=1e-4)
# K = 100 and 2 x 25 rows below: no block divides either, so the last chunk of K and the last
# block of rows are cut short, and the programs walk unequal numbers of blocks
CONFIGS = {
    "one-per-sm": gemv.Config(2, 32, 4, 2, ctas_per_sm=1),
    "two-per-sm": gemv.Config(4, 64, 4, 3, ctas_per_sm=2),
    "one-chunk-past-k": gemv.Config(4, 128, 4, 2, ctas_per_sm=1),
}


@pytest.mark.parametrize("early", [False, True], ids=["", "early"])
@pytest.mark.parametrize("config", CONFIGS.values(), ids=CONFIGS.keys())
def test_the_persistent_gemv_gives_pytorchs_products_with_programs_walking_several_blocks(config, early):
    k, i = 100, 25
    blocks = -(-2 * i // config.block_n)
    assert persistent_gemv.programs(blocks, config.ctas_per_sm, "cpu") < blocks, "each program walks several blocks"
    assert_gemv_products(config, early=early, k=k, rows=i, seed=11)


def test_the_persistent_grid_is_its_programs_per_sm_and_never_more_than_the_blocks():
    sms = persistent_gemv.INTERPRETER_SMS
    assert persistent_gemv.programs(100, 2, "cpu") == 2 * sms
    assert persistent_gemv.programs(4, 2, torch.device("cpu")) == 4


def test_a_persistent_gemv_takes_no_split_k():
    with pytest.raises(ValueError, match="takes no split-K"):
        gemv.Config(2, 32, 4, 2, split_k=3, ctas_per_sm=1)


def test_the_persistent_rung_needs_pdl_and_folded_norms():
    from labsupport.chapters import closing_the_gap as ch

    folded = {**ch.OWN_OPTIONS["folded-norms"], "persistent": True}
    assert ch.OWN_OPTIONS["persistent"] == folded
    qwen3_decode.Options(**folded)
    no_pdl = {"fused": True, "matmul": "triton", "fuse_gemv": True, "fold_norms": True}
    for without in (no_pdl, ch.OWN_OPTIONS["one-attention"]):  # no pdl; no folded norms
        with pytest.raises(ValueError, match="persistent needs pdl=True and fold_norms=True"):
            qwen3_decode.Options(**without, persistent=True)


def test_the_persistent_choice_is_kept_apart_from_the_plain_ones(monkeypatch):
    plain, mine = gemv.Config(4, 1024, 8, 2), gemv.Config(2, 2048, 8, 3, ctas_per_sm=2)
    monkeypatch.setattr(gemv, "CHOSEN", {(8, 16, gemv.PLAIN): plain})
    monkeypatch.setattr(gemv, "CHOSEN_SPLIT", {})
    monkeypatch.setattr(gemv, "CHOSEN_PERSISTENT", {})
    assert gemv.choose(8, 16, gemv.PLAIN, persistent=True) == gemv.PERSISTENT_DEFAULT  # untuned: never the plain one
    gemv.CHOSEN_PERSISTENT[(8, 16, gemv.PLAIN)] = mine
    assert gemv.choose(8, 16, gemv.Fusion(residual=True), persistent=True, split=True) == mine
    assert gemv.choose(8, 16, gemv.PLAIN) == plain and gemv.choose(8, 16, gemv.PLAIN, split=True) == plain


def test_tune_with_persistent_candidates_fills_only_the_persistent_table(monkeypatch):
    """tune's bookkeeping, with the timing stood in for (it needs a GPU): each case's fastest
    persistent candidate goes into CHOSEN_PERSISTENT and is marked chosen_persistent, nothing into
    the other tables, and a candidate that fails leaves the others."""
    broken = gemv.PERSISTENT_CANDIDATES[0]
    us = {c: 10.0 + i for i, c in enumerate(gemv.PERSISTENT_CANDIDATES)}

    def timed(n, k, config, **_):
        if config == broken:
            raise RuntimeError("out of resources")
        return us[config]

    monkeypatch.setattr(gemv, "fused_call", lambda n, k, fusion, config, **_: config)
    monkeypatch.setattr(gemv, "time_per_call_us", timed)
    for table in ("CHOSEN", "CHOSEN_SPLIT", "CHOSEN_EARLY", "CHOSEN_FP8", "CHOSEN_PERSISTENT"):
        monkeypatch.setattr(gemv, table, {})
    said = []
    cases = [(64, 32, gemv.PLAIN), (64, 32, gemv.Fusion(silu=True))]
    trials = gemv.tune(cases, progress=said.append, persistent=True)
    assert len(trials) == 2 * (len(gemv.PERSISTENT_CANDIDATES) - 1) and any("failed" in s for s in said)
    fastest = gemv.PERSISTENT_CANDIDATES[1]
    assert dict.fromkeys(cases, fastest) == gemv.CHOSEN_PERSISTENT
    assert gemv.CHOSEN == gemv.CHOSEN_SPLIT == gemv.CHOSEN_EARLY == gemv.CHOSEN_FP8 == {}
    rows = [t.as_row() for t in trials]
    assert not any(r["chosen"] or r["chosen_split"] or r["chosen_early"] or r["early"] for r in rows)
    assert [r["ctas_per_sm"] for r in rows if r["chosen_persistent"]] == [fastest.ctas_per_sm] * 2
    with pytest.raises(ValueError, match="not fp8"):
        gemv.tune(cases, persistent=True, fp8=True)


def test_a_persistent_a_plain_and_an_early_timed_config_of_one_block_shape_are_rows_of_their_own():
    import pandas as pd

    from labsupport import runs
    from labsupport.chapters import closing_the_gap as ch
    from labsupport.runs import tables

    shape = (2, 2048, 8, 3)
    rows = [gemv.Trial(64, 32, gemv.PLAIN, gemv.Config(*shape, ctas_per_sm=c), 5.0, 1.0).as_row() for c in (0, 2)]
    # and one config timed both ways it is launched (gemv.tune): two rows, told apart by `early`
    rows.append(gemv.Trial(64, 32, gemv.PLAIN, gemv.Config(*shape), 4.0, 1.2, early=True).as_row())
    tables.check_key(pd.DataFrame(rows), Path("gemv_tuning.csv"), ch.DECLARATION)  # no repeated key
    with pytest.raises(runs.RunError, match="repeat the key"):
        tables.check_key(pd.DataFrame([*rows, rows[-1]]), Path("gemv_tuning.csv"), ch.DECLARATION)


def test_tune_keeps_a_bf16_config_for_each_way_of_launching_it(monkeypatch):
    """Each BF16 candidate is timed alone (rungs 7-11: CHOSEN, CHOSEN_SPLIT) and again with PDL and
    the first weights before the wait (CHOSEN_EARLY, the rungs launched so), each way's fastest kept
    and marked in its rows; one that wins only one way is kept for that way only."""
    alone_best, early_best = gemv.CANDIDATES[0], gemv.CANDIDATES[1]

    def timed(n, k, call, **_):
        config, early = call
        return 5.0 if config == (early_best if early else alone_best) else 10.0

    monkeypatch.setattr(gemv, "fused_call", lambda n, k, fusion, config, early=False, **_: (config, early))
    monkeypatch.setattr(gemv, "time_per_call_us", timed)
    for table in ("CHOSEN", "CHOSEN_SPLIT", "CHOSEN_EARLY", "CHOSEN_FP8", "CHOSEN_PERSISTENT"):
        monkeypatch.setattr(gemv, table, {})
    case = (64, 32, gemv.Fusion(residual=True))
    rows = [t.as_row() for t in gemv.tune([case], progress=lambda _: None, split_candidates=[])]
    assert len(rows) == 2 * len(gemv.CANDIDATES) and sum(r["early"] for r in rows) == len(gemv.CANDIDATES)
    assert gemv.CHOSEN == gemv.CHOSEN_SPLIT == {case: alone_best}
    assert gemv.CHOSEN_EARLY == {case: early_best}  # noqa: SIM300
    kept = {(r["block_n"], r["block_k"], r["num_warps"], r["early"]) for r in rows if r["chosen"] or r["chosen_early"]}
    assert kept == {(alone_best.block_n, alone_best.block_k, alone_best.num_warps, False),
                    (early_best.block_n, early_best.block_k, early_best.num_warps, True)}  # fmt: skip
    assert not any(r["chosen"] for r in rows if r["early"])
    assert not any(r["chosen_early"] for r in rows if not r["early"])


def test_tune_times_the_folded_gate_up_as_its_rung_runs_it_and_every_other_case_alone(monkeypatch):
    """Gate/up with SiLU and no norm is the folded rungs': tune asks fused_call for it in their form
    (PDL, weights first, a Σx² scalar) only, and keeps its winner for every table, with FP8 weights too
    (rung 20's); the plain and normed cases are never timed in it."""
    asked = []

    def call(n, k, fusion, config, folded=False, **_):
        asked.append((fusion, folded))
        return config

    monkeypatch.setattr(gemv, "fused_call", call)
    monkeypatch.setattr(gemv, "time_per_call_us", lambda n, k, call, **_: 10.0)
    for table in ("CHOSEN", "CHOSEN_SPLIT", "CHOSEN_EARLY", "CHOSEN_FP8", "CHOSEN_PERSISTENT"):
        monkeypatch.setattr(gemv, table, {})
    silu, norm_silu = gemv.Fusion(silu=True), gemv.Fusion(norm=True, silu=True)
    gemv.tune([(64, 32, gemv.PLAIN), (64, 32, norm_silu), (64, 32, silu)], progress=lambda _: None)
    assert {f for f, folded in asked if folded} == {silu} and (silu, False) not in asked
    assert (gemv.PLAIN, False) in asked and (norm_silu, False) in asked  # the others alone, then with `early`
    assert (gemv.CHOSEN_EARLY[(64, 32, silu)] == gemv.CHOSEN[(64, 32, silu)]) and len(gemv.CHOSEN_EARLY) == 3
    asked.clear()
    gemv.tune([(64, 32, silu), (64, 32, norm_silu)], progress=lambda _: None, fp8=True)
    assert {f for f, folded in asked if folded} == {silu} and (silu, False) not in asked
    assert (norm_silu, False) in asked and len(gemv.CHOSEN_FP8) == 2
