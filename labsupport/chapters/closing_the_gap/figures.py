"""The chapter's own figures (the generic ones are in labsupport.figures)."""

from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd

from labsupport import figures
from labsupport.chapters.closing_the_gap.params import RUNG_SHORT


def ladder_figure(split: pd.DataFrame, floor_ms: float, passed: dict, label: str, texts: dict | None = None):
    """Each rung's wall time as three stacked parts (time_split): the floor, kernel time above
    it, and GPU idle; a dashed line at the floor, the one limit the ladder climbs towards; each bar
    labelled with its wall time and its multiple of its floor (an FP8 rung's is its own, shorter:
    its floor part is drawn to it, and its label says so). A bar far longer than the others
    (eager's) is cut at the axis's end, its label saying so. A rung that fails the same-answers
    check is labelled so. `texts` gives a rung's time as text (a shared quantity's own digits)."""
    parts = [("floor ms", "#2f4b7c"), ("kernels above floor ms", "#f2b880"), ("GPU idle ms", "#c9c9c9")]
    fig, ax = plt.subplots(figsize=(figures.WIDTH, 0.38 * len(split) + 2.2))  # 20 rungs within a page
    names = split.rung.map(RUNG_SHORT)
    walls = split["wall ms"].sort_values(ascending=False)
    xmax = float(walls.iloc[0]) * 1.45
    if len(walls) > 1 and walls.iloc[0] > 2.5 * walls.iloc[1]:
        xmax = float(walls.iloc[1]) * 1.9
    left = pd.Series(0.0, index=split.index)
    for col, color in parts:
        width = split[col].clip(lower=0)
        ax.barh(names, width, left=left, color=color, label=col.removesuffix(" ms"))
        left = left + width
    own = split["floor ms"] if "floor ms" in split else pd.Series(floor_ms, index=split.index)
    for y, (i, rung, wall) in enumerate(zip(split.index, split.rung, split["wall ms"], strict=True)):
        fl = float(own[i]) if isinstance(own, pd.Series) else floor_ms
        text = f"{(texts or {}).get(rung) or f'{wall:.2f}'} ms" + (f", {wall / fl:.2f}x" if fl == fl and fl else "")
        text += " its own floor" if fl == fl and floor_ms == floor_ms and abs(fl - floor_ms) > 1e-9 else ""
        text += " (wrong answers)" if passed.get(rung) is False else ""
        cut = left[i] > xmax
        ax.text(xmax * 0.99 if cut else left[i] + xmax * 0.01, y, text + (" →" if cut else ""), va="center",
                ha="right" if cut else "left", fontsize=10, color="#222")  # fmt: skip
    if floor_ms == floor_ms:  # not NaN: the GPU's datasheet is known
        ax.axvline(floor_ms, color="#2f4b7c", ls="--", lw=1)
    ax.set_xlim(0, xmax)
    ax.set_xlabel("ms per token (minimum of the trials; x = multiple of the floor)")
    ax.set_title("From eager to the floor, one rung at a time", loc="left")
    first, last = split.iloc[0], split.iloc[-1]
    takeaway = (
        f"{RUNG_SHORT.get(first.rung, first.rung)} takes {first['wall ms']:.2f} ms per token, "
        f"{RUNG_SHORT.get(last.rung, last.rung)} {last['wall ms']:.2f} ms"
        + (f"; the floor is {floor_ms:.2f} ms." if floor_ms == floor_ms else ".")
    )
    return finish(fig, ax, label, legend_y=-0.18, takeaway=takeaway)


def matmul_figure(m: pd.DataFrame, ceiling_tbs: float | None, datasheet_tbs: float | None, label: str):
    """TB/s of each weight shape's matmul for one token: cuBLAS and our Triton GEMV side by side,
    with the practical ceiling (the best rate measured) and the datasheet's (the limit) as lines."""
    fig, ax = plt.subplots(figsize=(figures.WIDTH, 0.6 * len(m) + 2.2))
    y = pd.Series(range(len(m)), dtype=float)
    ax.barh(y - 0.2, m.cublas_tbs, height=0.4, color=figures.THEIRS, label="cuBLAS (torch)")
    ax.barh(y + 0.2, m.triton_tbs, height=0.4, color=figures.OURS, label="our Triton GEMV")
    for i, r in enumerate(m.itertuples()):
        ax.text(r.triton_tbs + 0.05, i + 0.2, f"{r.triton_tbs:.2f}", va="center", fontsize=10)
        ax.text(r.cublas_tbs + 0.05, i - 0.2, f"{r.cublas_tbs:.2f}", va="center", fontsize=10, color="#555")
    ax.set_yticks(list(y), [f"{r.matrix} ({r.bytes / 1e6:,.0f} MB)" for r in m.itertuples()])
    if ceiling_tbs:
        ax.axvline(ceiling_tbs, color="#2f4b7c", ls="--", lw=1, label=f"practical ceiling ({ceiling_tbs:.2f})")
    if datasheet_tbs:
        ax.axvline(datasheet_tbs, color="#b94a48", ls=":", lw=1.2, label=f"datasheet ({datasheet_tbs:.1f})")
    top = max([m.cublas_tbs.max(), m.triton_tbs.max(), ceiling_tbs or 0, datasheet_tbs or 0])
    ax.set_xlim(0, top * 1.1)  # room for the value labels and the datasheet's line
    ax.set_xlabel("TB/s of weights read (one token, inside a CUDA graph)")
    ax.set_title("Every matmul of a token, by weight shape", loc="left")
    faster = int((m.triton_tbs > m.cublas_tbs).sum())
    takeaway = f"Our Triton GEMV reads faster than cuBLAS for {faster} of the {len(m)} weight shapes."
    return finish(fig, ax, label, legend_y=-0.16, takeaway=takeaway)


def finish(fig, ax, label: str, legend_y: float, takeaway: str):
    """The end both horizontal-bar figures share: first row on top, the legend under the axes,
    no horizontal grid lines, then figures.finish (the footer, the description)."""
    ax.invert_yaxis()
    ax.legend(ncol=2, frameon=False, loc="upper center", bbox_to_anchor=(0.4, legend_y))
    ax.grid(axis="y", visible=False)
    return figures.finish(fig, label, takeaway)
