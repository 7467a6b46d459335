"""Where a rung's kernel time goes: its profiled step's kernels grouped by name and launch shape
(a GEMV's grid tells which weight it read), timed exclusive of the wait a dependent launch's
duration counts, and summed by part of the step, so that two rungs can be set side by side."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from labsupport import runs
from labsupport.chapters.closing_the_gap.analysis import kernel_table, shape_names, tuning
from labsupport.chapters.closing_the_gap.params import FP8_RUNGS, OWN_OPTIONS, RUNGS, SHARED_RUNGS, built_on, trace_file
from labsupport.traces import kernels


def kernel_groups(run: runs.Run, rung: str) -> pd.DataFrame:
    """Where a rung's kernel time goes, kernel by kernel: its profiled step's kernels grouped by
    name and launch shape (a GEMV's grid tells which weight it read), with kernels per step, µs in
    all (the trace's durations) and exclusive (kernels.exclusive_times: without the time a kernel
    before it was still running, which a dependent launch's duration counts as its wait), µs per
    kernel, share of the kernel time, and for our GEMV the weight bytes read (the matrix found from
    the tuned configs: N / BLOCK_N x split-K programs) and so TB/s, by duration and by exclusive
    time."""
    import math

    k = kernel_table(run, rung)
    k = k.assign(grid=k["grid"].astype(str) if "grid" in k else "").join(kernels.exclusive_times(k))
    if OWN_OPTIONS.get(rung, {}).get("persistent"):  # every persistent GEMV has the same grid
        k["grid"] = _persistent_matrices(k)
    g = k.groupby(["name", "grid"], as_index=False, sort=False).agg(
        kernels=("dur_ns", "size"), ns=("dur_ns", "sum"), exclusive_ns=("exclusive_ns", "sum")
    )
    matrix = {}
    if "gemv_tuning.csv" in run.meta["files"]:
        t = tuning(run)
        fp8 = rung in FP8_RUNGS
        # FP8 is tuned without split-K (its choice is `chosen`), even on the options of a rung that allows it;
        # BF16 rungs launched with the first weights before the wait run the configs timed so (gemv.choose)
        opts = OWN_OPTIONS.get(rung, {})
        col = "chosen"
        if not fp8 and opts.get("fold_norms") and not opts.get("persistent"):
            col = "chosen_folded"  # the folded-norms step's own configs (analysis.tuning)
        elif not fp8 and opts.get("early_weights"):
            col = "chosen_early"
        elif not fp8 and opts.get("split_k"):
            col = "chosen_split"
        w = t[t[col] & (t.weights.eq("fp8") if fp8 else t.weights.ne("fp8"))]  # FP8, or the model's BF16/FP16
        shapes = shape_names(run)
        if fp8:  # the FP8 cases this rung launches: the folded rung's with no norm, the others' with theirs
            w = w.loc[[_fp8_launches(r.fusion, (r.n, r.k) == shapes.get("lm_head"), opts) for r in w.itertuples()]]
        names = {v: n for n, v in shapes.items()}
        for r in w.itertuples():
            name = names.get((r.n, r.k), f"{r.n}x{r.k}")
            if not _reads(rung, name):  # a matrix of the same grid that this rung never launches
                continue
            blocks = math.ceil(r.n / r.block_n) * int(r.split_k)
            hit = (name, r.n * r.k * (1 if fp8 else 2))
            if hit not in matrix.setdefault(blocks, []):
                matrix[blocks].append(hit)
    sizes = (
        {name: int(b) for name, b in run.table("matmuls")[["matrix", "bytes"]].itertuples(index=False)}
        if ("matmuls.csv" in run.meta["files"])
        else {}
    )
    rows = []
    for r in g.itertuples():
        blocks = math.prod(int(x) for x in r.grid.split(",")) if "," in r.grid else None
        hit = matrix.get(blocks, []) if "gemv" in r.name else []
        if r.grid in sizes:  # a persistent GEMV, named by its place in the step
            hit = [(r.grid, sizes[r.grid])]
        if r.name in WHOLE and set(LAYER_MATRICES) <= set(sizes):  # a layer's matrices (the step's, and the LM head)
            layer_bytes = sum(sizes[m] for m in LAYER_MATRICES)
            layers = run.results["model"]["layers"]
            step_bytes = layer_bytes * layers + sizes.get("lm_head", 0)
            hit = [(WHOLE[r.name].weight, layer_bytes if r.name == "layer_kernel" else step_bytes)]
        # several weights of one grid (o_proj and down_proj have the same rows): each read equally often
        label = " / ".join(h[0] for h in hit)
        nbytes = sum(h[1] for h in hit) / len(hit) if hit else float("nan")
        us = r.ns / 1e3
        rows.append({"kernel": kernels.short_name(r.name), "weight": label, "grid": r.grid, "kernels": r.kernels,
                     "µs": us, "exclusive µs": r.exclusive_ns / 1e3, "µs per kernel": us / r.kernels,
                     "MB": nbytes * r.kernels / 1e6})  # fmt: skip
    out = pd.DataFrame(rows)
    out["share"] = out["µs"] / out["µs"].sum()
    out["TB/s"] = out.MB / out["µs"]  # MB per µs is TB/s
    out["TB/s exclusive"] = out.MB / out["exclusive µs"].where(out["exclusive µs"] > 0)
    return out.sort_values("µs", ascending=False).reset_index(drop=True)


def _fp8_launches(fusion: str, lm_head: bool, opts: dict) -> bool:
    """Whether an FP8 rung with `opts` launches a GEMV tuned as `fusion` (a label of gemv.Fusion) at a
    shape (`lm_head`: the LM head's): with folded norms none carries a norm; without, the matrices after
    a norm carry it, so the only plain one is the LM head, and gate/up always has its norm."""
    if opts.get("fold_norms"):
        return "norm" not in fusion
    return fusion != "silu" and (fusion != "plain" or lm_head)


# The parts of a step its exclusive time is split into where two rungs are compared (exclusive_parts):
# o_proj and down_proj apart or together (a plain GEMV launches both on one grid), the attention kernels.
SAME_PART = {"o_proj": "o_proj / down_proj", "down_proj": "o_proj / down_proj"}


@dataclass(frozen=True)
class Whole:
    """A kernel that does several parts of the step at once (qwen3_decode.Options.layer_kernel,
    step_kernel): the part it is, the weights it reads, and the parts of a step of separate kernels
    it replaces (None: all but the embedding row's copy)."""

    part: str
    weight: str
    replaces: tuple[str, ...] | None


WHOLE = {
    "layer_kernel": Whole("layer", "every matrix of a layer", ("qkv (fused)", "o_proj / down_proj", "gate_up (fused)",
                                                               "attention")),
    "step_kernel": Whole("step", "every matrix of the step", None),
}  # fmt: skip


def exclusive_parts(run: runs.Run, rung: str) -> pd.Series:
    """A rung's exclusive kernel time per step (kernel_groups), in µs, by part: each weight its GEMVs
    read (o_proj and down_proj as one), and every other kernel by its kind ("attention", ...)."""
    from labsupport.traces import kinds

    g = kernel_groups(run, rung)
    as_part = SAME_PART | {w.weight: w.part for w in WHOLE.values()}
    named = g.weight.fillna("").astype(str).map(lambda w: as_part.get(w, w))
    part = named.where(named != "", g.kernel.map(kinds.classify))
    return g.groupby(part.values)["exclusive µs"].sum()


def costlier_rungs(run: runs.Run, ladder_rows: pd.DataFrame) -> pd.DataFrame:
    """Each of our rungs slower than the rung it is built on (params.built_on, both with numbers and
    traces in this run, and both BF16 or both FP8: weights of one width): its best time above the third
    quartile of the rung before's trials; with the part whose exclusive time grew most (the layer kernel
    against the parts it replaces): rung, before, ms, before ms, part, part µs, before part µs."""
    own = [r for r in RUNGS if r not in SHARED_RUNGS]
    timed = ladder_rows.set_index("rung")
    traced = {r for r in own if trace_file(r) in run.meta["files"]}
    rows = []
    for rung in own[1:]:
        before = built_on(rung)
        if (rung in FP8_RUNGS) != (before in FP8_RUNGS):  # an FP8 rung on a BF16 one's options reads other bytes
            continue
        if not {before, rung} <= traced or not {before, rung} <= set(timed.index):
            continue
        ms, was, spread = timed.loc[rung, "ms"], timed.loc[before, "ms"], timed.loc[before, "q3"]
        if not (ms == ms and was == was) or ms <= max(was, spread if spread == spread else was):
            continue  # not slower than the rung before's trials
        a, b = exclusive_parts(run, rung), exclusive_parts(run, before)
        b = as_parts_of(a, b)
        grew = a.sub(b, fill_value=0.0).idxmax()
        rows.append({"rung": rung, "before": before, "ms": ms, "before ms": was, "part": grew,
                     "part µs": a.get(grew, 0.0), "before part µs": b.get(grew, 0.0)})  # fmt: skip
    return pd.DataFrame(rows, columns=["rung", "before", "ms", "before ms", "part", "part µs", "before part µs"])


def as_parts_of(parts: pd.Series, before: pd.Series) -> pd.Series:
    """The rung before's exclusive µs by part (exclusive_parts), cut as `parts` is: where `parts` has
    the part of a kernel that does several (WHOLE) and `before` has not, the parts of `before` it
    replaces summed into it."""
    for whole in WHOLE.values():
        if whole.part in parts and whole.part not in before:
            gone = [p for p in before.index if p != "copy/convert/concat"] if whole.replaces is None else whole.replaces
            replaced = before.reindex(list(gone)).sum()
            before = pd.concat([before.drop(list(gone), errors="ignore"), pd.Series({whole.part: replaced})])
    return before


# The matrices whose concatenation (matmuls.csv's "qkv (fused)", "gate_up (fused)") a fused rung reads in
# their place: a GEMV of a fused rung is never one of them, even where its grid is theirs.
FUSED_AWAY = ("q_proj", "k_proj / v_proj", "gate_proj / up_proj")


def _reads(rung: str, matrix: str) -> bool:
    """Whether the GEMVs of `rung` read `matrix` (a name of matmuls.csv): a fused rung the
    concatenations, the others the separate weights."""
    if OWN_OPTIONS.get(rung, {}).get("fused"):
        return matrix not in FUSED_AWAY
    return not matrix.endswith("(fused)")


# The matrices a layer of our folded decode step reads, in launch order, then the LM head's
# (qwen3_decode.layer and Qwen3Decoder.step; the names are matmuls.csv's).
LAYER_MATRICES = ("qkv (fused)", "o_proj", "gate_up (fused)", "down_proj")


def _persistent_matrices(k: pd.DataFrame) -> pd.Series:
    """The matrix each GEMV of a persistent rung's step read, by launch order (its grid, the same
    for every matrix, cannot tell); other kernels keep their grid."""
    gemvs = k[k.name.str.contains("gemv")].sort_values("start_ns").index
    layers, extra = divmod(len(gemvs) - 1, len(LAYER_MATRICES))
    if extra or len(gemvs) == 0:  # not one step of our folded decoder: left unnamed
        return k["grid"]
    names = [*LAYER_MATRICES * layers, "lm_head"]
    return k["grid"].where(~k.index.isin(gemvs), pd.Series(names, index=gemvs))
