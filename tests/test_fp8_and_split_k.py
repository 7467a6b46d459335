"""The FP8 rounding error is measured on the weights, and the split-K rung says what it changed."""

import pandas as pd
import pytest

from labsupport.chapters import closing_the_gap as ch
from labsupport.measure.kernels import gemv_fp8

pytestmark = pytest.mark.unit


def test_rounding_error_of_gaussian_weights_is_measured_not_assumed():
    """E4M3 with one scale per row, on near-Gaussian weights (what build_model gives): about 2.25% on
    average, at most 2^-4 within the normal range, a few subnormals that lose more."""
    import torch

    g = torch.Generator().manual_seed(0)
    mats = [(torch.randn(512, 1024, generator=g) * 0.02).to(torch.bfloat16), torch.randn(300, 64, generator=g)]
    r = gemv_fp8.rounding_error(mats)
    assert r["weights"] == 512 * 1024 + 300 * 64
    assert 0.020 < r["mean"] < 0.025, r
    assert 0.05 < r["max_normal"] <= 2**-4 + 1e-6, r
    assert r["max"] >= r["max_normal"] and 0 <= r["subnormal_share"] < 1e-3
    assert gemv_fp8.rounding_error(mats, rows=37) == pytest.approx(r)  # the same, a few rows at a time


def test_weights_that_e4m3_holds_exactly_have_no_rounding_error():
    import torch

    w = torch.tensor([[448.0, -224.0, 1.0, 1.125], [0.5, 0.25, -0.125, 0.0]])  # row 2: scale 0.5 / 448
    r = gemv_fp8.rounding_error([w])
    assert r["mean"] == 0 and r["max"] == 0 and r["weights"] == 7  # the zero is not a relative error


class _Run:
    """A run's two tables, as split_k_text reads them."""

    def __init__(self, rungs: pd.DataFrame, tuning: pd.DataFrame):
        self.tables = {"rungs": rungs, "gemv_tuning": tuning}

    def table(self, name):
        return self.tables[name].copy()


def _rungs(err_split=0.30):
    return pd.DataFrame(
        {
            "rung": ["fused-attention", "split-k"],
            "status": ["ok", "ok"],
            "kernels": [220, 220],
            "max_abs_err": [0.30, err_split],
        }
    )


def _tuning(split_wins: bool):
    rows = []
    for n, unsplit_us, split_us in ((1024, 4.3, 6.5), (4096, 10.7, 14.1)):
        rows.append({"n": n, "k": 4096, "fusion": "plain", "split_k": 1, "us": unsplit_us})
        rows.append({"n": n, "k": 4096, "fusion": "plain", "split_k": 4, "us": split_us})
    t = pd.DataFrame(rows).assign(weights="bf16")
    if split_wins:
        t.loc[(t.n == 1024) & (t.split_k == 4), "us"] = 3.0
    best = t.groupby(["n", "k", "fusion"]).us.transform("min")
    t["chosen_split"] = t.us == best
    t["chosen"] = t.chosen_split  # the BF16 rungs without split-K choose among split_k 1 only: not read here
    return t


def test_split_k_that_changes_nothing_says_why():
    text = ch.split_k_text(_Run(_rungs(), _tuning(split_wins=False)))
    assert text.startswith("In this run split-K (rung 10) changes nothing: the tuner tried cutting the columns of 2")
    assert "1.32–1.51× slower" in text and "220 kernels, as rung 9's 220, and the same logits" in text


def test_split_k_chosen_names_where_the_rungs_differ():
    text = ch.split_k_text(_Run(_rungs(0.31), _tuning(split_wins=True)))
    assert text == "Rung 10 differs from rung 9 where the tuner chose split-K: 1,024×4,096 (plain, 4 parts)."


def test_a_run_without_the_rung_says_so():
    rungs = _rungs().assign(status=["ok", "failed: out of memory"])
    assert ch.split_k_text(_Run(rungs, _tuning(False))) == "This run has no split-K rung."


def test_the_persistent_rungs_trials_are_not_rung_9s():
    """The persistent form is tuned apart (ctas_per_sm > 0): a faster persistent trial is not the
    unsplit kernel that split-K is set against, nor one of the plain GEMV's configurations tried."""
    t = _tuning(split_wins=False)
    persistent = t[t.split_k == 1].assign(us=1.0, ctas_per_sm=2, chosen=False, chosen_split=False)
    both = pd.concat([t.assign(ctas_per_sm=0), persistent], ignore_index=True)
    text = ch.split_k_text(_Run(_rungs(), both))
    assert text == ch.split_k_text(_Run(_rungs(), t)) and "1.32–1.51× slower" in text
    shapes = pd.DataFrame(
        {"matrix": ["a", "b"], "n": [1024, 4096], "k": 4096, "bytes": [8e6, 32e6], "cublas_us": [5.0, 9.0]}
        | {"triton_us": [4.3, 10.7], "cublas_tbs": [1.6, 3.6], "triton_tbs": [1.9, 3.1]}
    )
    floor = ch.Floor(decode_bytes=10**9, datasheet_tbs=4.8, ceiling_tbs=4.2, shared=False)
    run = _Run(_rungs(), both)
    tuned = ch.tuning(run)
    assert tuned.persistent.sum() == 2
    assert "having tried up to 2 configurations on each of 2 cases" in ch.matmul_text(shapes, tuned, floor)


def test_the_tuning_times_name_each_kind_of_tuning_the_run_did():
    class Ran:
        def __init__(self, tuning_s):
            self.results = {"tuning_s": tuning_s}

    ladder = pd.DataFrame({"rung": ["triton-gemv"], "compile s": [3.5]})
    text = ch.compile_text(Ran({"bf16": 18.2, "fp8": 8.1, "persistent": 21.0}), ladder)
    assert text == (
        f"Compiling and warming each of our rungs took: {ch.RUNG_SHORT['triton-gemv']} 3.5 s. Tuning our GEMV took "
        "18 s (BF16, with split-K), 8 s (FP8) and 21 s (persistent)."
    )
    assert ch.compile_text(Ran({"bf16": 18.2}), ladder).endswith("Tuning our GEMV took 18 s (BF16, with split-K).")
    assert ch.compile_text(Ran({}), ladder).endswith("3.5 s.")


@pytest.mark.parametrize(
    ("ceiling", "says"),
    [(3.19, "by 0.3%: within the run-to-run noise"), (3.1985, "by less than 0.1%: within"), (3.0, "timed no kernel")],
)
def test_a_gemv_above_the_ceiling_says_by_how_much_within_the_noise(ceiling, says):
    """Our LM head read 3.1967 TB/s where Why a GPU's run, on the same GPU and commit, recorded 3.1965 for the same
    kernel (closing-the-gap run 20261206T004616Z-h100-80gb-hbm3): a hair above is the noise of one kernel timed
    twice, which validation allows (hardware.CEILING_TOLERANCE); far above, the ceiling's run missed this rate."""
    shapes = pd.DataFrame(
        {"matrix": ["k_proj", "lm_head"], "n": [1024, 151936], "k": 4096, "bytes": [8e6, 1.245e9]}
        | {"cublas_us": [8.3, 436.0], "triton_us": [4.9, 389.4], "cublas_tbs": [1.0, 2.85], "triton_tbs": [1.7, 3.199]}
    )
    floor = ch.Floor(decode_bytes=10**9, datasheet_tbs=3.35, ceiling_tbs=ceiling, shared=False)
    run = _Run(_rungs(), _tuning(split_wins=False).assign(ctas_per_sm=0))
    text = ch.matmul_text(shapes, ch.tuning(run), floor)
    assert f"That is above the practical ceiling, {ceiling:.2f} TB/s" in text and says in text
