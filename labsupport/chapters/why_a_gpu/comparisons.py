"""The sweep set against what else is known. Its irregular points (matrix multiplies slower than a larger batch's):
the kernel counts per step, cuBLAS's split-K reduce kernels (read from the run of *Prompt phase vs decode phase*), the
kernels chosen at each batch size (`batch_matmuls`), and what the data cannot say. And its ridge point with the KV cache
counted, beside the published H100 figure.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from labsupport import runs
from labsupport.chapters import published
from labsupport.chapters.prefill_vs_decode.declaration import DECLARATION as PREFILL_CHAPTER  # noqa: F401 (its run)
from labsupport.measure import hardware
from labsupport.traces import kernels

from .batch_sweep import attention_flop_per_context_token, largest, ridge, sweep
from .one_token import counts

BUMP_TOLERANCE = 0.05  # a batch's matmuls slower than a larger batch's by more than this
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


# Published (cite as published, never ours): the Qwen3-8B H100 profile's ridge, in requests.
PUBLISHED_H100_RIDGE_REQUESTS = 295
PUBLISHED_H100_RIDGE_SOURCE = published.QWEN3_8B_H100_SOURCE
H100 = hardware.DATASHEETS["NVIDIA H100 80GB HBM3"]

# The rows of ridge_comparison, by key (`key` column); `KV_RIDGE` rows are one per GPU.
PUBLISHED, DATASHEET_RIDGE, CEILINGS_RIDGE, MEASURED_CROSSING, KV_RIDGE = (
    "published",
    "datasheet",
    "ceilings",
    "measured",
    "kv-cache",
)


@dataclass
class KVRidge:
    """Where the whole step (weights and KV cache) reaches a ridge point, at one context.

    With B sequences of `context` tokens the step does B·(F + a·context) operations on
    W + B·context·kv bytes: its intensity grows with B but never passes `cap`, the KV cache's
    share alone. `batch` is where the intensity reaches `ridge` (inf when `cap` is below it);
    `max_context` is the longest context at which any batch still reaches it."""

    gpu: str
    ridge: float  # FLOP/byte
    context: int
    batch: float
    cap: float  # FLOP/byte at an unlimited batch
    max_context: float


def kv_ridge(run: runs.Run, sheet: hardware.Datasheet, context: int | None = None) -> KVRidge:
    """The batch where the whole step reaches `sheet`'s ridge point, with this run's model and
    KV cache, at `context` (default: the context of the sweep's largest batch)."""
    c, kv, a = counts(run), run.results["kv_bytes_per_token"], attention_flop_per_context_token(run)
    context = int(context if context is not None else largest(sweep(run)).context)
    r = sheet.ridge_flop_per_byte
    room = c.decode_flops + a * context - r * context * kv
    batch = r * c.decode_bytes / room if room > 0 else float("inf")
    max_context = c.decode_flops / (r * kv - a) if r * kv > a else float("inf")
    return KVRidge(
        gpu=sheet.name,
        ridge=r,
        context=context,
        batch=batch,
        cap=(c.decode_flops + a * context) / (context * kv),
        max_context=max_context,
    )


def ridge_comparison(run: runs.Run) -> pd.DataFrame:
    """The published H100 ridge (in requests) beside this run's, raw and as a share of each GPU's
    own datasheet ridge; and where the whole step, KV cache included, reaches each ridge. Rows
    keyed by `key` (PUBLISHED, DATASHEET_RIDGE, CEILINGS_RIDGE, MEASURED_CROSSING, KV_RIDGE)."""
    sheet = hardware.run_datasheet(run)  # at the run's dtype
    r = ridge(run)
    gpu = sheet.name if sheet else run.provenance["gpu"]
    own = sheet.ridge_flop_per_byte if sheet else float("nan")
    rows = [
        (
            PUBLISHED,
            "math becomes the limit (published)",
            H100.name,
            PUBLISHED_H100_RIDGE_REQUESTS,
            H100.ridge_flop_per_byte,
            "published (source in the text)",
        )
    ]
    if sheet:
        rows.append((DATASHEET_RIDGE, "datasheet ridge (weights only)", gpu, own, own, f"{sheet.name} datasheet"))
    rows += [
        (CEILINGS_RIDGE, "measured ceilings: GEMM rate / practical ceiling", gpu, r.ceilings_batch, own, "this run"),
        (MEASURED_CROSSING, "matrix multiplies' times cross (measured)", gpu, r.measured_batch, own, "this run"),
    ]
    for sh in [H100] + ([sheet] if sheet and sheet != H100 else []):
        k = kv_ridge(run, sh)
        rows.append(
            (
                KV_RIDGE,
                f"whole step with the KV cache, {k.context}-token context",
                sh.name,
                k.batch,
                sh.ridge_flop_per_byte,
                f"computed here: this run's model, {sh.name} datasheet",
            )
        )
    df = pd.DataFrame(
        rows, columns=["key", "where math becomes the limit", "GPU", "batch", "GPU's datasheet ridge", "from"]
    )
    df["batch / ridge"] = df["batch"] / df["GPU's datasheet ridge"]
    return df[["key", "where math becomes the limit", "GPU", "batch", "GPU's datasheet ridge", "batch / ridge", "from"]]


def ridge_display(run: runs.Run) -> pd.DataFrame:
    """The comparison as the chapter shows it (no keys)."""
    return ridge_comparison(run).drop(columns="key")


def ridge_text(run: runs.Run) -> str:
    """The published H100 ridge beside this run's, raw and normalised, and what else differs."""
    cmp = ridge_comparison(run).set_index("key")
    pub = cmp.loc[PUBLISHED]
    r = ridge(run)
    sheet = hardware.run_datasheet(run)  # at the run's dtype
    gpu = sheet.name if sheet else run.provenance["gpu"]
    pub_text = (
        f"the published {PUBLISHED_H100_RIDGE_REQUESTS} is {pub['batch / ridge']:.0%} of the H100's "
        f"({H100.bf16_tflops:.0f} TFLOP/s over {H100.bandwidth_tbs:.2f} TB/s = {H100.ridge_flop_per_byte:.0f} "
        "FLOP per byte; it matches that ratio, so it reads as the datasheet's arithmetic rather than a "
        "measured crossing, and the book has no published batch sweep to set beside this one)"
    )
    if sheet:
        share = r.measured_batch / sheet.ridge_flop_per_byte
        where = (
            "close to where its datasheet puts it"
            if abs(share - 1) <= 0.15
            else "beyond where its datasheet puts it"
            if share > 1
            else "before where its datasheet puts it"
        )
        first = (
            f"Raw, {PUBLISHED_H100_RIDGE_REQUESTS} against this run's measured {r.measured_batch:.0f} reads as "
            f"if the {gpu} turned compute-bound at a much smaller batch. Normalised to each GPU's own datasheet "
            f"ridge: {pub_text}, and this run's measured crossing is {share:.0%} of the {gpu}'s "
            f"({sheet.ridge_flop_per_byte:.0f}), {where}."
        )
        if sheet.bf16_tflops == H100.bf16_tflops and sheet.bandwidth_tbs != H100.bandwidth_tbs:
            first += (
                f" The two GPUs have the same datasheet math rate ({sheet.bf16_tflops:.0f} TFLOP/s) and differ "
                f"in bandwidth ({H100.bandwidth_tbs:.2f} against {sheet.bandwidth_tbs:.2f} TB/s): faster "
                f"memory, not slower math, brings the {gpu}'s ridge to a smaller batch."
            )
    else:
        first = (
            f"Normalised to the H100's own datasheet ridge, {pub_text}. This run's GPU ({gpu}) has no datasheet "
            f"in the book, so its measured crossing ({r.measured_batch:.0f}) cannot be set against its own ridge."
        )
    parts = [first]
    h100 = kv_ridge(run, H100)
    own = kv_ridge(run, sheet) if sheet and sheet != H100 else None

    def at(k: KVRidge) -> str:
        if k.batch == float("inf"):
            return f"no batch on the {k.gpu}"
        return f"about {k.batch:,.0f} sequences on the {k.gpu}"

    both = f"{at(own)} and {at(h100)}" if own else at(h100)
    ctx_max = (
        f"{own.max_context:.0f} tokens on the {own.gpu} ({h100.max_context:.0f} on the {h100.gpu})"
        if own
        else f"{h100.max_context:.0f} tokens on the {h100.gpu}"
    )
    parts.append(
        f"What else differs. Neither ridge counts the KV cache. With this run's {h100.context}-token context "
        f"the whole step reaches the ridge only at {both} (computed from the datasheets and this run's "
        f"model, not measured); at contexts longer than about {ctx_max}, at no batch at all: there, "
        "each sequence's own operations per byte of its cache are below the ridge, and adding sequences "
        "cannot lift the step above it. "
        "The software differs too: the published profile's is named in its source, above; this run "
        f"used transformers {run.provenance.get('transformers', '?')} and PyTorch "
        f"{run.provenance.get('torch', '?')}, eager, on an {run.provenance['gpu']}. A serving engine batches "
        "requests of many "
        "different contexts at once, which moves the crossing again."
    )
    return "\n\n".join(parts)


def ridge_pair_text(run: runs.Run) -> str:
    """The H100's datasheet ridge beside this GPU's, for the exercise on where the ridge falls:
    the GPU with less bandwidth per FLOP has the larger ridge (its BF16 rate over its bandwidth)."""
    sheet = hardware.run_datasheet(run)  # at the run's dtype
    pair = [H100] + ([sheet] if sheet and sheet != H100 else [])
    each = "; the ".join(
        f"{s.name} ({s.bf16_tflops:.0f} TFLOP/s over {s.bandwidth_tbs:.2f} TB/s) at {s.ridge_flop_per_byte:.0f} "
        "FLOP/byte"
        for s in sorted(pair, key=lambda s: s.bandwidth_tbs / s.bf16_tflops)
    )
    if len(pair) == 1:
        return f"From its datasheet, the {each}."
    return f"From the datasheets: the {each}. The one with less bandwidth per FLOP needs the larger batch."
