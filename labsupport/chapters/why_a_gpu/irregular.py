"""The sweep's irregular points (matrix multiplies slower than a larger batch's): the kernel
counts per step, cuBLAS's split-K reduce kernels (read from the run of *Prompt phase vs decode
phase*), the kernels chosen at each batch size (`batch_matmuls`), and what the data cannot say."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from labsupport import runs
from labsupport.traces import kernels

from .batch_sweep import sweep
from .one_token import counts

BUMP_TOLERANCE = 0.05  # a batch's matmuls slower than a larger batch's by more than this
PREFILL_CHAPTER = "prefill-vs-decode"
SPLIT_K_REDUCE = "splitKreduce"


def irregular_batches(run: runs.Run, tol: float = BUMP_TOLERANCE) -> list[int]:
    """Batch sizes whose matrix multiplies took longer (by more than `tol`) than those of a
    larger batch, which does more of the same work."""
    mm = sweep(run).set_index("batch")["matmul ms"]
    return [int(b) for b in mm.index if mm[b] > (1 + tol) * mm[mm.index > b].min()]


def kernel_count_groups(run: runs.Run) -> list[tuple[int, list[int]]]:
    """The sweep's kernel count per step, as runs of consecutive batch sizes with one count."""
    s = sweep(run).sort_values("batch")
    groups: list[tuple[int, list[int]]] = []
    for b, n in zip(s.batch, s.kernels, strict=True):
        if groups and groups[-1][0] == n:
            groups[-1][1].append(int(b))
        else:
            groups.append((int(n), [int(b)]))
    return groups


def _batches(bs: list[int]) -> str:
    return f"batch {bs[0]}" if len(bs) == 1 else f"batches {bs[0]}–{bs[-1]}"


@dataclass
class SplitK:
    """cuBLAS's split-K reduce kernels in the matrix multiplies of the chapter *Prompt phase vs
    decode phase*: its decode step (one token) and its prefill (`tokens_many` tokens)."""

    run_id: str
    tokens_many: int
    matmul_few: int  # matrix-multiply kernels (the reduce kernels included)
    matmul_many: int
    reduce_few: int
    reduce_many: int
    modules: list[str]  # the modules (layer number dropped) whose products ran split-K at one token

    @property
    def only_reduces_differ(self) -> bool:
        """Whether the two steps' matrix-multiply kernel counts differ by their reduce kernels alone."""
        return self.matmul_few - self.reduce_few == self.matmul_many - self.reduce_many


def split_k_evidence(prefill: runs.Run | None) -> SplitK | None:
    """The split-K reduce kernels of a run of *Prompt phase vs decode phase* (`prefill`), or None
    where there is no such run or it lacks its kernel tables."""
    if prefill is None:
        return None
    try:
        few, many = prefill.table("kernels-decode"), prefill.table("kernels-prefill")
        tokens = int(prefill.parameters["prompt_len"])
    except (runs.RunError, OSError, KeyError, ValueError):
        return None

    def mm(k):
        k = k[k.kind == "matrix multiply"]
        names = k.short_name if "short_name" in k else k.name.map(kernels.short_name)
        return k, names.astype(str).str.contains(SPLIT_K_REDUCE)

    kf, rf = mm(few)
    km, rm = mm(many)
    modules = list(dict.fromkeys(kf.module[rf].astype(str).str.replace(r"^.*layers\.\d+\.", "", regex=True)))
    return SplitK(
        run_id=prefill.run_id,
        tokens_many=tokens,
        matmul_few=len(kf),
        matmul_many=len(km),
        reduce_few=int(rf.sum()),
        reduce_many=int(rm.sum()),
        modules=modules,
    )


def split_k_per_layer(run: runs.Run, ev: SplitK | None) -> pd.Series | None:
    """Split-K products per layer at each batch size, read from the sweep's kernel counts: where
    the profiles of one token and of many differ by their split-K reduce kernels alone, the many
    had none, and the sweep's largest count less its smallest is the one token's reduces, each
    kernel above the sweep's smallest count is read as one split-K reduce. None where the
    evidence does not support that reading."""
    s = sweep(run).set_index("batch")
    extra = s.kernels - s.kernels.min()
    layers = counts(run).layers
    if (
        ev is None
        or not ev.only_reduces_differ
        or ev.reduce_many != 0
        or s.index.min() != 1
        or int(extra[1]) != ev.reduce_few - ev.reduce_many
        or (extra % layers).any()
    ):
        return None
    return extra // layers


def _runs_of(series: pd.Series) -> list[tuple[int, list[int]]]:
    out: list[tuple[int, list[int]]] = []
    for b, v in series.items():
        if out and out[-1][0] == v:
            out[-1][1].append(int(b))
        else:
            out.append((int(v), [int(b)]))
    return [(("none" if v == 0 else v), bs) for v, bs in out]


def _around(batches, b: int, n: int) -> list[int]:
    """The batch sizes just before `b`, `b` itself, and up to `n`."""
    bs = sorted(batches)
    before = [x for x in bs if x < b][-1:]
    return before + [x for x in bs if b <= x <= n]


def irregular_text(run: runs.Run, ev: SplitK | None) -> str:
    """What the data says about the sweep's irregular points (matrix multiplies slower than a
    larger batch's), and what it cannot say."""
    s = sweep(run).set_index("batch")
    layers = counts(run).layers
    groups = kernel_count_groups(run)
    count_text = ", ".join(f"{n:,} at {_batches(bs)}" for n, bs in groups)
    bumps = irregular_batches(run)
    if not bumps:
        return (
            f"No batch size's matrix multiplies took longer than a larger batch's (by more than "
            f"{BUMP_TOLERANCE:.0%}): this sweep has no irregular point to explain. Kernels per step: {count_text}."
        )
    b = min(bumps)
    later = s.loc[s.index > b]
    n = int(later["matmul ms"].idxmin())
    parts = [
        f"At batch {b} the matrix multiplies took {s.loc[b, 'matmul ms']:.2f} ms, longer than the "
        f"{s.loc[n, 'matmul ms']:.2f} ms at batch {n}, which does {n / b:.2f} times the work: "
        f"{s.loc[b, 'matmul TFLOP/s']:.0f} TFLOP/s against {s.loc[n, 'matmul TFLOP/s']:.0f}."
        + (f" (Also irregular: {', '.join(map(str, bumps[1:]))}.)" if len(bumps) > 1 else "")
    ]
    steps = len(groups) > 1
    parts.append(
        f"The number of kernels per step changes with the batch too: {count_text}."
        + (
            f" Every change is a multiple of {layers}: a whole number of kernels per layer."
            if steps and not any((g[0] - groups[0][0]) % layers for g in groups)
            else ""
        )
    )
    per_layer = split_k_per_layer(run, ev)
    if per_layer is not None:
        where = ", ".join(f"{n_} at {_batches(bs)}" for n_, bs in _runs_of(per_layer))
        big = int(s.index.max())
        fewest = (
            f"batch {big}" if s.loc[big, "kernels"] == s.kernels.min() else "the batch sizes with the fewest kernels"
        )
        mods = ", ".join(f"`{m}`" for m in ev.modules)
        parts.append(
            f"The chapter *Prompt phase vs decode phase* profiled the same weight matrices with one token and with "
            f"{ev.tokens_many} (run `{ev.run_id}`). Their matrix-multiply kernels differ by "
            f"{ev.reduce_few - ev.reduce_many}, all of them cuBLAS's split-K reduce kernel "
            f"(`cublasLt::splitKreduce_kernel`): {ev.reduce_few // layers} per "
            f"layer with one token (after {mods}), none with {ev.tokens_many}. A split-K kernel cuts a product's long "
            "inner dimension into pieces, so that more thread blocks share a small product, and the reduce kernel adds "
            f"the pieces up. In this sweep, batch 1 has exactly that many kernels more than {fewest}. "
            f"Reading every kernel above the fewest as one split-K reduce, the products that ran split-K per layer "
            f"were: {where}."
        )
        if per_layer.get(b, 1) == 0 and per_layer.get(n, 0) > 0:
            parts[-1] += (
                f" So at batch {b} cuBLAS's heuristics dropped split-K, as they do for the largest batches, "
                f"while at batch {n} they still split {int(per_layer[n])} product"
                f"{'s' if per_layer[n] > 1 else ''} per layer; whatever kernels they chose instead ran "
                f"slower for {b} sequences than batch {n}'s did for {n}."
            )
    else:
        parts.append(
            "Which kernels were added or dropped, this run cannot say: it kept no kernel names per batch size."
        )
    if "batch_matmuls.csv" in run.meta["files"]:
        parts.append(matmul_choice_text(run, b, n))
        return "\n\n".join(parts)
    sms = run.provenance.get("gpu_sms")
    tile = 128
    computed = -(-b // tile) * tile
    grid = (
        "a grid with fewer thread blocks than the GPU's "
        + (f"{sms} SMs" if sms else "SMs")
        + ", which leaves some of them idle"
    )
    unknown = (
        f"Which matrix-multiply kernels ran at batch {b}, and why they are slower there, the run cannot tell: "
        "it recorded kernel counts and times per batch size, not the kernels' names or grids. "
    )
    if computed != b:
        tq = (
            f"tiles of {tile} rows, a common size, compute {computed} rows for {b} sequences, "
            f"{1 - b / computed:.0%} of the work thrown away"
        )
        if computed in s.index and s.loc[b, "matmul ms"] > s.loc[computed, "matmul ms"]:
            why = (
                f"Tile quantisation alone ({tq}) would make batch {b} cost as much as batch {computed}, not "
                f"more: the kernels chosen at {b} lose more than that, for a reason such as {grid}. "
            )
        else:
            why = f"Two usual causes would fit, alone or together: tile quantisation ({tq}), and {grid}. "
    else:
        why = f"One usual cause would fit: {grid}. "
    parts.append(
        unknown + why + "**Left for a new measurement:** the matrix multiplies' kernel names and grids at batches "
        f"{', '.join(str(int(x)) for x in _around(s.index, b, n))}."
    )
    return "\n\n".join(parts)


def matmul_choice(run: runs.Run, batches) -> pd.DataFrame:
    """The matrix-multiply kernels cuBLAS ran at each of `batches`, by kernel and grid: how many,
    and their GPU time per step (runs that recorded `batch_matmuls`)."""
    m = run.table("batch_matmuls")
    m = m[m.batch.isin(list(batches))]
    g = (
        m.groupby(["batch", "short_name", "grid"], sort=False)
        .agg(kernels=("kernels", "sum"), gpu_ns=("gpu_ns", "sum"))
        .reset_index()
    )
    g["ms"] = g.gpu_ns / 1e6
    return g.sort_values(["batch", "ms"], ascending=[True, False]).reset_index(drop=True)


def matmul_choice_text(run: runs.Run, b: int, n: int) -> str:
    """What the recorded kernels say about batch `b` being slower than the larger batch `n`."""
    c = matmul_choice(run, [b, n])

    def describe(batch: int) -> str:
        k = c[c.batch == batch]
        reduce = k.short_name.str.contains(SPLIT_K_REDUCE)
        top = k[~reduce].nlargest(3, "ms", keep="first")
        reduces = int(k.loc[reduce, "kernels"].sum())
        names = "; ".join(f"`{r.short_name}` x{int(r.kernels)} ({r.ms:.2f} ms)" for r in top.itertuples())
        return f"at batch {batch}, {k.ms.sum():.2f} ms in all, mostly {names}, with " + (
            f"{reduces} split-K reduce kernels" if reduces else "no split-K"
        )

    return (
        f"This run recorded which matrix-multiply kernels ran at each batch size: {describe(b)}; "
        f"{describe(n)}. So the slow point is cuBLAS's own choice of kernels: for {b} sequences its heuristics "
        f"picked other kernels than for {n}, and those ran slower in total. Why the heuristics choose them is "
        "inside cuBLAS; the kernel names (tile shape, split-K, the layout suffix) are what can be seen."
    )
