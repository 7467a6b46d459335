"""The folded rungs' tilings are settled in the whole step (closing_the_gap.settle_folded_tilings):
the folded-norms step's QKV's and gate/up's where two tie alone, and one tiling for every GEMV of it;
the FP8 folded step's QKV's and gate/up's two fastest FP8 tilings. Which tilings count as tied, on
recorded runs' tuning tables; the step built with each, checked and timed, the fastest kept where the
rung will read it (gemv.CHOSEN_FOLDED, or gemv.CHOSEN_FP8), and the trials marked as the page reads
them; the page's sentence. The step runs on the
tiny model, on a CPU, in Triton's interpreter (its waits are no-ops there)."""

import os
from types import SimpleNamespace

import pandas as pd
import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"  # before any kernel is built

pytest.importorskip("triton")
from labsupport.chapters import closing_the_gap as ch  # noqa: E402
from labsupport.measure import models  # noqa: E402
from labsupport.measure.kernels import gemv  # noqa: E402

from .conftest import RUNS, folded_and_rounded  # noqa: E402

pytestmark = pytest.mark.unit
# An H100 run whose tuner kept 4 rows of 2,048 for both GEMVs, 8 of 1,024 next within 0.3% alone
TUNED_4X2048 = "20261207T002010Z-h100-80gb-hbm3"
FUSIONS = {f.label: f for f in (gemv.PLAIN, gemv.Fusion(silu=True), gemv.Fusion(norm=True),
                                gemv.Fusion(norm=True, silu=True), gemv.Fusion(residual=True))}  # fmt: skip
CONFIG_FIELDS = ("block_n", "block_k", "num_warps", "num_stages", "split_k", "ctas_per_sm", "chunk")


def recorded_trials(run_id: str, fp8: bool = False) -> list[gemv.Trial]:
    """The run's gemv_tuning.csv as the tuner's trials (BF16, not persistent; or FP8's)."""
    t = pd.read_csv(RUNS / ch.CHAPTER / run_id / "gemv_tuning.csv")
    t = t[t.weights.eq("fp8")] if fp8 else t[t.weights.ne("fp8") & t.ctas_per_sm.eq(0)]
    fields = [f for f in CONFIG_FIELDS if f in t.columns]  # chunk: recorded from 20261207T133436Z on
    return [
        gemv.Trial(r.n, r.k, FUSIONS[r.fusion], gemv.Config(**{f: int(getattr(r, f)) for f in fields}),
                   r.us, r.tbs, chosen=bool(r.chosen), weights=r.weights, early=bool(r.early),
                   chosen_early=bool(r.chosen_early))
        for r in t.itertuples()
    ]  # fmt: skip


def qwen3_8b():
    return SimpleNamespace(config=SimpleNamespace(to_dict=lambda: dict(models.QWEN3_8B)))


def tiles(trials) -> list[tuple[int, int]]:
    return [(t.config.block_n, t.config.block_k) for t in trials]


def test_the_two_fastest_tilings_within_the_tie_are_tried_and_a_clear_winner_alone():
    trials, cases = recorded_trials(TUNED_4X2048), ch.folded_tie_cases(qwen3_8b())
    assert cases == {"qkv": (6144, 4096, gemv.PLAIN), "gate_up": (24576, 4096, gemv.Fusion(silu=True))}
    assert tiles(ch.near_ties(trials, cases["qkv"])) == [(4, 2048), (8, 1024)]  # 17.39 and 17.43 us
    assert tiles(ch.near_ties(trials, cases["gate_up"])) == [(4, 2048), (8, 1024)]  # a third within 1%, left out
    assert len(ch.near_ties(trials, cases["gate_up"], most=5)) == 3
    assert tiles(ch.near_ties(trials, cases["qkv"], within=0.001)) == [(4, 2048)]  # 0.2% apart: no tie
    # only the trials timed as the rung launches them (PDL, weights first), and none where none were
    assert all(t.early for t in ch.near_ties(trials, cases["gate_up"], most=5))
    assert ch.near_ties([t for t in trials if not t.early], cases["qkv"]) == []


def test_nothing_is_built_where_nothing_ties_and_the_one_tiling_was_not_timed(monkeypatch):
    monkeypatch.setattr(gemv, "CHOSEN_EARLY", {})
    monkeypatch.setattr(gemv, "CHOSEN_FOLDED", {})
    trials = recorded_trials(TUNED_4X2048)
    for t in trials:  # a qwen3-8b-sized model is never built: no tie, no step
        t.us = t.us * (1 + 0.02 * (t.config.block_n != 4 or t.config.block_k != 2048))
    assert ch.settle_folded_tilings(qwen3_8b(), None, None, "cpu", trials, "bfloat16") == []
    assert ch.settle_folded_tilings(qwen3_8b(), None, None, "cpu", [], "bfloat16") == []
    assert gemv.CHOSEN_EARLY == gemv.CHOSEN_FOLDED == {}
    assert ch.one_tiling(trials, ch.folded_step_cases(qwen3_8b())) is None  # that run timed 4 x 1,024 with 8 warps


def test_the_one_tiling_is_a_candidate_and_its_trials_are_found_for_every_gemv_of_the_step():
    one = gemv.Config(*ch.STEP_ONE_TILING)
    assert one in gemv.CANDIDATES and (one.block_n, one.block_k, one.num_warps) == (4, 1024, 4)
    cases = ch.folded_step_cases(qwen3_8b())
    assert cases == {
        "qkv": (6144, 4096, gemv.PLAIN), "o_proj": (4096, 4096, gemv.Fusion(residual=True)),
        "gate_up": (24576, 4096, gemv.Fusion(silu=True)), "down": (4096, 12288, gemv.Fusion(residual=True)),
        "lm_head": (151936, 4096, gemv.PLAIN),
    }  # fmt: skip
    trials = [gemv.Trial(*case, c, 1.0, 1.0, early=early) for case in cases.values()
              for c in (one, gemv.CANDIDATES[0]) for early in (False, True)]  # fmt: skip
    picks = ch.one_tiling(trials, cases)
    assert set(picks) == set(cases) and all(t.config == one and t.early for t in picks.values())
    assert ch.one_tiling([t for t in trials if t.n != 4096 or t.k != 12288 or not t.early], cases) is None


# An H100 run whose tuner kept 4 rows of 1,024 with 4 warps for QKV and gate/up, and 4 of 2,048 with 8 for
# down_proj with the residual
TUNED_ONE = "20261207T082204Z-h100-80gb-hbm3"


def test_the_step_on_one_tiling_is_tried_where_any_gemv_of_the_tuners_step_runs_another(monkeypatch):
    trials, model = recorded_trials(TUNED_ONE), qwen3_8b()
    one = gemv.Config(*ch.STEP_ONE_TILING)
    early = {(t.n, t.k, t.fusion): t.config for t in trials if t.chosen_early}
    monkeypatch.setattr(gemv, "CHOSEN_EARLY", early)
    monkeypatch.setattr(gemv, "CHOSEN_FOLDED", {})
    cases = ch.folded_step_cases(model)
    assert {name: early[case] == one for name, case in cases.items()} == {
        "qkv": True, "o_proj": True, "gate_up": True, "down": False, "lm_head": True}  # fmt: skip
    tries = ch.folded_tries(model, trials)
    assert [sorted(t) for t in tries] == [["gate_up", "qkv"], sorted(cases)]  # the tuner's pair, then every GEMV
    assert all(t.config == one for t in tries[0].values()) and all(t.config == one for t in tries[1].values())
    monkeypatch.setitem(gemv.CHOSEN_EARLY, cases["down"], one)  # the tuner's step on that tiling throughout
    assert len(ch.folded_tries(model, trials)) == 1
    assert ch.settle_folded_tilings(model, None, None, "cpu", trials, "bfloat16") == []  # nothing else to build


@pytest.mark.live
@pytest.mark.usefixtures("waits_as_no_ops")
def test_the_step_built_with_each_tied_pair_is_checked_timed_and_the_faster_pair_kept(tiny_with_norms, monkeypatch):
    model, prompt, ref = tiny_with_norms
    cases = ch.folded_tie_cases(model)
    big, other = gemv.Config(16, 64, 4, 2), gemv.Config(8, 64, 4, 2)
    unrelated = (64, 64, gemv.Fusion(residual=True))
    monkeypatch.setattr(gemv, "CHOSEN_EARLY", {**{case: big for case in cases.values()}, unrelated: other})
    monkeypatch.setattr(gemv, "CHOSEN_FOLDED", {})
    trials = [gemv.Trial(*cases["qkv"], big, 10.0, 1.0, early=True, chosen_early=True)]  # QKV: no rival
    trials += [gemv.Trial(*cases["gate_up"], c, us, 1.0, early=True, chosen_early=c == big)
               for c, us in ((big, 20.0), (other, 20.1), (gemv.Config(2, 64, 4, 2), 23.0))]  # fmt: skip
    rows = ch.settle_folded_tilings(model, prompt, ref, "cpu", trials, "float32", rounds=1)
    assert [r["variant"] for r in rows] == ["qkv 16x64, gate_up 16x64", "qkv 16x64, gate_up 8x64"]
    assert [r["tuned"] for r in rows] == [True, False] and not any(r["every"] for r in rows)
    assert all(r["passed"] and r["repeats"] == 1 and r["ms_min"] > 0 and r["within"] == ch.STEP_TIE for r in rows)
    kept = [r for r in rows if r["chosen"]]
    assert kept == [min(rows, key=lambda r: r["ms_median"])]
    pick = gemv.Config(**kept[0]["gate_up"])
    assert {cases["qkv"]: big, cases["gate_up"]: pick} == gemv.CHOSEN_FOLDED  # the folded step's own table
    assert {**{case: big for case in cases.values()}, unrelated: other} == gemv.CHOSEN_EARLY  # the other rungs'
    assert gemv.choose(*cases["gate_up"], early=True, folded=True) == pick  # what the rung built next runs
    assert [t.config for t in trials if t.chosen_folded] == [big, pick]  # one per GEMV, as the page reads them
    assert rows[1]["gate_up_us"] == 20.1 and rows[1]["gate_up"]["block_n"] == 8


@pytest.mark.live
@pytest.mark.usefixtures("waits_as_no_ops")
def test_the_step_with_every_gemv_on_one_tiling_is_built_beside_the_tuners_picks(tiny_with_norms, monkeypatch):
    model, prompt, ref = tiny_with_norms
    every = ch.folded_step_cases(model)
    one, tuned = gemv.Config(*ch.STEP_ONE_TILING), gemv.Config(16, 64, 4, 2)
    monkeypatch.setattr(gemv, "CHOSEN_EARLY", {case: tuned for case in every.values()})
    monkeypatch.setattr(gemv, "CHOSEN_FOLDED", {})
    trials = [gemv.Trial(*case, c, us, 1.0, early=True, chosen_early=c == tuned)
              for case in every.values() for c, us in ((tuned, 10.0), (one, 12.0))]  # fmt: skip
    rows = ch.settle_folded_tilings(model, prompt, ref, "cpu", trials, "float32", rounds=1)
    assert [r["variant"] for r in rows] == ["qkv 16x64, gate_up 16x64", "every GEMV 4x1024, 4 warps"]
    assert [(r["tuned"], r["every"]) for r in rows] == [(True, False), (False, True)]
    assert all(r["passed"] and r["repeats"] == 1 for r in rows) and sum(r["chosen"] for r in rows) == 1
    kept = next(r for r in rows if r["chosen"])
    assert kept is min(rows, key=lambda r: r["ms_median"])
    runs = one if kept["every"] else tuned  # every GEMV of the step runs what the kept step ran
    assert all(gemv.choose(*case, early=True, folded=True) == runs for case in every.values())
    assert all(gemv.choose(*case, early=True) == tuned for case in every.values())  # the other rungs keep theirs
    assert {(t.n, t.k, t.fusion) for t in trials if t.chosen_folded} == set(every.values())
    assert all(t.config == runs for t in trials if t.chosen_folded)


def test_the_page_says_which_pairs_the_step_tried_and_which_it_kept():
    pair = lambda bn, bk: {"block_n": bn, "block_k": bk}  # noqa: E731
    rows = [
        {"qkv": pair(4, 2048), "gate_up": pair(4, 2048), "ms_median": 3.7844, "tuned": True, "chosen": False},
        {"qkv": pair(8, 1024), "gate_up": pair(4, 2048), "passed": False, "tuned": False, "chosen": False},
        {"qkv": pair(8, 1024), "gate_up": pair(8, 1024), "ms_median": 3.7312, "tuned": False, "chosen": True},
    ]
    rows = [{**r, "within": 0.005} for r in rows]  # the tie's width as the run recorded it
    text = ch.folded_tilings_text(SimpleNamespace(results={"folded_tilings": rows}))
    assert "QKV's or gate/up's two fastest tilings were within 0.5% of each other" in text
    assert "QKV 4 rows of 2,048 and gate/up 4 rows of 2,048: 3.784 ms (the tuner's picks)" in text
    assert "QKV 8 rows of 1,024 and gate/up 4 rows of 2,048: not timed (its answers failed the check)" in text
    assert text.endswith("QKV 8 rows of 1,024 and gate/up 8 rows of 1,024: 3.731 ms, kept.")
    assert ch.folded_tilings_text(SimpleNamespace(results={})) == ""  # a run recorded before the step settled them


def test_the_page_names_the_step_with_every_gemv_on_one_tiling():
    tiling = {"block_n": 4, "block_k": 1024, "num_warps": 4}
    rows = [
        {"qkv": {"block_n": 4, "block_k": 2048, "num_warps": 8}, "gate_up": {"block_n": 8, "block_k": 1024},
         "ms_median": 5.0317, "tuned": True, "chosen": False, "every": False, "within": 0.01},
        {"qkv": tiling, "gate_up": tiling, "ms_median": 4.9867, "tuned": False, "chosen": True, "every": True,
         "within": 0.01},
    ]  # fmt: skip
    text = ch.folded_tilings_text(SimpleNamespace(results={"folded_tilings": rows}))
    assert text.startswith(" The folded-norms step was built with the tuner's picks and with every GEMV on one tiling, "
                           "4 rows of 1,024 with 4 warps, and timed whole")  # fmt: skip
    assert "QKV 4 rows of 2,048 and gate/up 8 rows of 1,024: 5.032 ms (the tuner's picks)" in text
    assert text.endswith("; every GEMV 4 rows of 1,024 with 4 warps: 4.987 ms, kept.")


# An H100 run whose FP8 tuner kept 16 rows of 512 (8 warps, an accumulator a weight) for the folded step's
# plain QKV at 9.64 us alone, 8 rows of 1,024 (4 warps) next at 10.03: 4% apart
FP8_CHUNK_ONE = "20261207T133436Z-h100-80gb-hbm3"


def test_the_fp8_step_tries_its_two_fastest_fp8_tilings_within_the_wider_tie():
    trials, cases = recorded_trials(FP8_CHUNK_ONE, fp8=True), ch.folded_tie_cases(qwen3_8b())
    qkv = ch.near_ties(trials, cases["qkv"], ch.STEP_TIE_FP8, fp8=True)
    assert [(t.config.block_n, t.config.block_k, t.config.num_warps, t.config.chunk) for t in qkv] == [
        (16, 512, 8, 1), (8, 1024, 4, 0)]  # fmt: skip
    assert [round(t.us, 2) for t in qkv] == [9.64, 10.03] and qkv[0].chosen  # the tuner's pick first
    assert ch.near_ties(trials, cases["qkv"], fp8=True)[1:] == []  # 4% apart: no tie at BF16's width
    assert all(t.weights == "fp8" and t.early for t in qkv)
    assert ch.near_ties(trials, cases["qkv"], ch.STEP_TIE_FP8) == []  # BF16's ties: none among FP8 trials
    tries = ch.folded_tries(qwen3_8b(), trials, fp8=True)
    assert len(tries) == 4 and all(sorted(t) == ["gate_up", "qkv"] for t in tries)  # 2 x 2, no one-tiling step
    assert ch.folded_tries(qwen3_8b(), trials) == []  # BF16's: the FP8 trials are not theirs


@pytest.mark.live
@pytest.mark.usefixtures("waits_as_no_ops")
def test_the_fp8_folded_step_built_with_each_pair_keeps_the_faster_in_the_fp8_table(tiny_with_norms, monkeypatch):
    model, prompt, _ = tiny_with_norms
    rounded = ch.reference(folded_and_rounded(model), prompt)  # what the FP8 folded step computes, unrounded
    cases = ch.folded_tie_cases(model)
    plain, each = gemv.Config(16, 64, 4, 2), gemv.Config(8, 64, 4, 2, chunk=1)
    unrelated = (64, 64, gemv.Fusion(residual=True))
    monkeypatch.setattr(gemv, "CHOSEN_FP8", {**{case: plain for case in cases.values()}, unrelated: plain})
    monkeypatch.setattr(gemv, "CHOSEN_FOLDED", {})
    monkeypatch.setattr(gemv, "CHOSEN_EARLY", {})
    trials = [gemv.Trial(*cases["qkv"], c, us, 1.0, chosen=c == plain, weights="fp8", early=True)
              for c, us in ((plain, 10.0), (each, 10.4), (gemv.Config(2, 64, 4, 2), 11.0))]  # fmt: skip
    trials += [gemv.Trial(*cases["gate_up"], plain, 20.0, 1.0, chosen=True, weights="fp8", early=True)]
    trials += [gemv.Trial(*cases["qkv"], each, 1.0, 1.0, early=True)]  # a BF16 trial, faster: not FP8's
    rows = ch.settle_folded_tilings(model, prompt, rounded, "cpu", trials, "bfloat16", rounds=1, fp8=True)
    assert [r["variant"] for r in rows] == ["qkv 16x64 4w, gate_up 16x64 4w", "qkv 8x64 4w chunk 1, gate_up 16x64 4w"]
    assert [r["tuned"] for r in rows] == [True, False] and not any(r["every"] for r in rows)
    assert all(r["passed"] and r["repeats"] == 1 and r["within"] == ch.STEP_TIE_FP8 for r in rows)
    kept = [r for r in rows if r["chosen"]]
    assert kept == [min(rows, key=lambda r: r["ms_median"])]
    pick = gemv.Config(**kept[0]["qkv"])
    assert {cases["qkv"]: pick, cases["gate_up"]: plain, unrelated: plain} == gemv.CHOSEN_FP8
    assert gemv.CHOSEN_FOLDED == {}  # the BF16 folded step's table is not FP8's
    assert gemv.choose(*cases["qkv"], fp8=True) == pick  # what the FP8 folded rung built next runs
    assert [t.config for t in trials if t.chosen and t.weights == "fp8"] == [pick, plain]  # as the page reads them
    assert not trials[-1].chosen and rows[1]["qkv"]["chunk"] == 1 and rows[1]["qkv_us"] == 10.4


def test_the_page_says_which_fp8_pairs_the_step_tried_and_which_it_kept():
    def c(bn, bk, w, chunk=0):
        return {"block_n": bn, "block_k": bk, "num_warps": w, "chunk": chunk}

    rows = [
        {"qkv": c(16, 512, 8, 1), "gate_up": c(32, 512, 8), "ms_median": 2.8692, "tuned": True, "chosen": False},
        {"qkv": c(8, 1024, 4), "gate_up": c(32, 512, 8), "ms_median": 2.8113, "tuned": False, "chosen": True},
    ]
    rows = [{**r, "within": 0.05} for r in rows]
    run = SimpleNamespace(results={"fp8_folded_tilings": rows})
    text = ch.folded_tilings_text(run, fp8=True)
    assert text.startswith(" Timed alone, the FP8 QKV's or gate/up's two fastest tilings were within 5% of each "
                           "other, so the FP8 folded step was built with each pair")  # fmt: skip
    assert ("QKV 16 rows of 512 (8 warps, an accumulator a weight) and gate/up 32 rows of 512 (8 warps): "
            "2.869 ms (the tuner's picks)") in text  # fmt: skip
    assert text.endswith("QKV 8 rows of 1,024 (4 warps) and gate/up 32 rows of 512 (8 warps): 2.811 ms, kept.")
    assert ch.folded_tilings_text(run) == ""  # the BF16 step's sentence reads its own rows
