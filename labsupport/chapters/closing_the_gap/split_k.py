"""What the split-K rung (10) changed against rung 9, said from the run's own tuning table: the
rung only differs where the tuner found a split faster, and on a GPU where it found none the
page says so rather than show two rungs as if they differed."""

from __future__ import annotations

from labsupport import runs
from labsupport.chapters.closing_the_gap.analysis import tuning

CASE = ["n", "k", "fusion"]  # a tuning case: a weight shape and what the GEMV fuses


def split_k_text(run: runs.Run) -> str:
    """Whether rung 10 differs from rung 9: the BF16 cases whose winning configuration cuts the
    columns, or, where none does, that rung 10 runs rung 9's kernels and why (on every case the
    tuner tried split, an unsplit configuration was faster)."""
    rungs = run.table("rungs").set_index("rung")
    if "split-k" not in rungs.index or rungs.loc["split-k", "status"] != "ok":
        return "This run has no split-K rung."
    t = tuning(run)
    t = t[(t.weights == "bf16") & ~t.persistent & ~t.early]  # rung 9's and rung 10's kernels, launched plainly
    split = t[t.split_k > 1]
    if split.empty:
        return "This run's tuner tried no split-K configuration, so rung 10 runs rung 9's kernels."
    picked = t[t.chosen_split & (t.split_k > 1)]
    if len(picked):
        cases = ", ".join(f"{r.n:,}×{r.k:,} ({r.fusion}, {r.split_k} parts)" for r in picked.itertuples())
        return f"Rung 10 differs from rung 9 where the tuner chose split-K: {cases}."
    slower = (split.groupby(CASE).us.min() / t[t.split_k == 1].groupby(CASE).us.min()).dropna()
    text = (
        f"In this run split-K (rung 10) changes nothing: the tuner tried cutting the columns of {len(slower)} cases "
        f"into {', '.join(sorted({str(x) for x in split.split_k}))} parts, and on every one the best split "
        f"configuration was {slower.min():.2f}–{slower.max():.2f}× slower than the best unsplit one, so rung 10 runs "
        "rung 9's kernels"
    )
    if "fused-attention" in rungs.index and rungs.loc["fused-attention", "status"] == "ok":
        a, b = rungs.loc["fused-attention"], rungs.loc["split-k"]
        text += f" ({int(b.kernels):,} kernels, as rung 9's {int(a.kernels):,}"
        text += ", and the same logits)" if a.max_abs_err == b.max_abs_err else ")"
    return text + ", and its time differs from rung 9's only by the spread of the trials."
