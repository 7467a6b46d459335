"""Kernel tables: readable names, counts and GPU time by kind, the most time-consuming kernel of
each kind or source, and the decoder layer and model part that launched each kernel. The kinds
and sources themselves are judged by name in labsupport.traces.kinds and .sources."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from labsupport.traces.kinds import KINDS, classify
from labsupport.traces.sources import SOURCES, source
from labsupport.traces.trace import busy_ns

__all__ = [
    "KINDS",
    "SOURCES",
    "annotate",
    "census",
    "classify",
    "example_kernel",
    "exclusive_times",
    "gpu_busy_ns",
    "profile_row",
    "short_name",
    "source",
    "source_census",
    "top_kernels",
    "unrecognised",
    "variant_times",
]

_HINT = re.compile(r"([A-Za-z]\w*?(?:_kernel_cuda|_kernel_impl|_kernel|Functor\w*|Ops)|CatArray\w*)\b")
_GENERIC = {
    "BinaryFunctor",
    "AUnaryFunctor",
    "BUnaryFunctor",
    "gpu_kernel_impl_nocast",
    "gpu_kernel_impl",
    "CUDAFunctorOnOther_add",
    "elementwise_kernel",
    "vectorized_elementwise_kernel",
    "unrolled_elementwise_kernel",
    "reduce_kernel",
}


def short_name(name: str, width: int = 70) -> str:
    """A readable kernel name: template arguments and parameters dropped, the functor
    that tells generic PyTorch kernels apart kept in brackets
    (`vectorized_elementwise_kernel [CUDAFunctor_add]`)."""
    s = re.sub(r"^void\s+", "", name).replace("(anonymous namespace)::", "")
    depth, out = 0, []
    for ch in s:
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth = max(0, depth - 1)
        elif depth == 0:
            out.append(ch)
    base = re.sub(r"\(.*$", "", "".join(out)).strip()
    base = re.sub(r"^(at::native::|at::)", "", base)
    hints = [h for h in _HINT.findall(s[s.find("<") :]) if h not in _GENERIC] if "<" in s else []
    if hints and hints[0] not in base:
        base = f"{base} [{hints[0]}]"
    return base if len(base) <= width else base[: width - 1] + "…"


def census(kernels: pd.DataFrame) -> pd.DataFrame:
    """Kernel count and GPU time by kind (integer nanoseconds, so it recomputes exactly).

    `kernels` needs columns `kind` and `dur_ns`. Rows follow KINDS (a kind outside them, from a
    table classified by other rules, follows them: a kernel is never dropped); a total row ends it.
    """
    g = kernels.groupby("kind")["dur_ns"].agg(kernels="count", gpu_ns="sum")
    g = g.reindex([*KINDS, *sorted(set(g.index) - set(KINDS))], fill_value=0).rename_axis("kind").reset_index()
    total_ns = int(g["gpu_ns"].sum())
    g["kernels"] = g["kernels"].astype(int)
    g["gpu_ns"] = g["gpu_ns"].astype("int64")
    g.loc[len(g)] = ["total", int(g["kernels"].sum()), total_ns]
    g["gpu_ms"] = (g["gpu_ns"] / 1e6).round(4)
    g["share"] = (g["gpu_ns"] / total_ns).round(4) if total_ns else 0.0
    return g


def source_census(kernels: pd.DataFrame) -> pd.DataFrame:
    """Kernel count and GPU time by source (SOURCES order; sources without kernels left out):
    columns `source`, `kernels`, `gpu_ns`. `kernels` needs `name` and `dur_ns`; a kernel no rule
    knows is counted under "other"."""
    g = kernels.assign(source=kernels["name"].map(source)).groupby("source")["dur_ns"]
    g = g.agg(kernels="count", gpu_ns="sum")
    return g.reindex([s for s in SOURCES if s in g.index]).reset_index()


def unrecognised(kernels: pd.DataFrame) -> pd.Series:
    """The kernels no kind or source rule knows (kind or source "other"), counted by short name,
    most launches first: what the census counts under "other", by name."""
    kinds = kernels["kind"] if "kind" in kernels else kernels["name"].map(classify)
    other = kernels[(kinds == "other") | (kernels["name"].map(source) == "other")]
    return other["name"].map(short_name).value_counts()


def top_kernels(k: pd.DataFrame, by: str = "kind") -> pd.Series:
    """For each kind (or source, or any other column named `by`), its most time-consuming
    kernel: the full name whose launches add up to the most GPU time (`dur_ns` summed over
    every launch of that name). Ties go to the name that sorts first.

    `k` needs `name` and `dur_ns`; a missing `kind` or `source` column is computed from the
    names. The result is indexed by the values of `by`, in KINDS or SOURCES order for those.
    """
    if by not in k.columns:
        if by not in ("kind", "source"):
            raise KeyError(f"no column {by!r} in the kernel table")
        k = k.assign(**{by: k["name"].map(classify if by == "kind" else source)})
    per_name = k.groupby([by, "name"], sort=False)["dur_ns"].sum().reset_index()
    per_name = per_name.sort_values([by, "dur_ns", "name"], ascending=[True, False, True], kind="stable")
    top = per_name.drop_duplicates(by).set_index(by)["name"]
    order = {"kind": KINDS, "source": SOURCES}.get(by)
    if order is not None:
        top = top.reindex([v for v in order if v in top.index])
    top.name = "example kernel"
    return top


def example_kernel(k: pd.DataFrame, by: str, value: str) -> str:
    """The kernel shown as the example of one kind or source (`by` = "kind" or "source"):
    its most time-consuming one (see top_kernels)."""
    top = top_kernels(k, by)
    if value not in top.index:
        raise KeyError(f"no kernel of {by} {value!r} in the table")
    return top[value]


def annotate(df: pd.DataFrame) -> pd.DataFrame:
    """Add kind, a readable short name, and the decoder layer and part of the model
    (self_attn, mlp, a norm, lm_head, ...) that launched each kernel."""
    df = df.copy()
    # By distinct name (a step launches the same few hundred kernels thousands of times).
    names = df["name"].unique()
    df["kind"] = df["name"].map(dict(zip(names, map(classify, names), strict=True)))
    df["short_name"] = df["name"].map(dict(zip(names, map(short_name, names), strict=True)))
    layer = df["module"].str.extract(r"^layers\.(\d+)(?:\.|$)")[0]
    df["layer"] = pd.to_numeric(layer, errors="coerce").astype("Int64")
    part = df["module"].str.extract(r"^layers\.\d+\.([A-Za-z_]+)")[0]
    df["part"] = part.fillna(df["module"].where(df["layer"].isna(), "residual add"))
    df.loc[df["module"] == "", "part"] = "outside modules"
    return df


def gpu_busy_ns(k: pd.DataFrame) -> int:
    """The time the GPU was busy running any of the kernels of table `k` (overlaps counted once)."""
    return busy_ns(k.start_ns, k.end_ns)


def exclusive_times(k: pd.DataFrame) -> pd.DataFrame:
    """Each kernel's exclusive time and the gap before it, for one profiled step's kernels `k`
    (`start_ns`, `end_ns`): the time charged to a kernel when the kernels before it overlap it.

    A kernel launched with programmatic dependent launch starts before the one before it ends and
    waits, and its duration in the trace counts that wait: durations summed count the shared time
    twice. In start order, with `before` the latest end of every kernel before it, a kernel's
    exclusive time is end - max(start, before) (0 if it ends before `before`), and the gap before
    it start - before (0 if it starts earlier). Exclusive times and gaps add up, exactly, to the
    span from the first kernel's start to the last one's end; the exclusive times alone to the
    busy time (gpu_busy_ns). Returns `exclusive_ns` and `gap_before_ns` (int64), indexed as `k`.
    """
    start, end = k.start_ns.to_numpy(dtype="int64"), k.end_ns.to_numpy(dtype="int64")
    order = np.lexsort((end, start))  # by start, ties by end
    s, e = start[order], end[order]
    before = np.concatenate([s[:1], np.maximum.accumulate(e)[:-1]])  # the first kernel: nothing before
    exclusive, gap = np.empty_like(s), np.empty_like(s)
    exclusive[order] = np.maximum(e - np.maximum(s, before), 0)
    gap[order] = np.maximum(s - before, 0)
    return pd.DataFrame({"exclusive_ns": exclusive, "gap_before_ns": gap}, index=k.index)


def profile_row(k: pd.DataFrame, *, total: bool = True, bounds: bool = False) -> dict:
    """A summary table's row of one profiled step's kernels `k`, the one every chapter writes: how
    many, the GPU's busy time, with `total` the sum of their durations (`kernel_ns`), with `bounds`
    the first kernel's start and the last one's end on the step's clock."""
    row = {"kernels": len(k), "gpu_busy_ns": gpu_busy_ns(k)}
    if total:
        row["kernel_ns"] = int(k.dur_ns.sum())
    if bounds:
        row |= {"first_kernel_ns": int(k.start_ns.min()), "last_kernel_end_ns": int(k.end_ns.max())}
    return row


def variant_times(k: pd.DataFrame, times: pd.DataFrame, per_call: str) -> pd.DataFrame:
    """Each variant of one call timed two ways, a row per row of `times` (its timings from Python,
    with each variant's kernel count): its kernels, their GPU time summed from the profiled kernels
    `k` (both tables with a `variant` column), and its time per call, column `per_call` (µs)."""
    gpu = k.groupby("variant").dur_ns.sum() / 1e3
    return pd.DataFrame(
        {
            "variant": times.variant,
            "kernels": times.kernels,
            "GPU µs (profiler)": times.variant.map(gpu).values,
            "per call µs (CUDA events)": times[per_call],
        }
    )
