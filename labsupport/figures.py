"""Figures in one style, each with a one-line provenance footer (GPU, run id, date)."""

from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd

from labsupport.traces.kernels import KINDS

KIND_COLORS = {
    "matrix multiply": "#3b6ea8",
    "elementwise": "#e0913a",
    "copy/convert/concat": "#5aa469",
    "reduction": "#b94a48",
    "attention": "#8361a8",
    "convolution": "#2a9d8f",
    "other": "#8c8c8c",
}
OURS, THEIRS = "#3b6ea8", "#bdbdbd"

plt.rcParams.update(
    {
        "figure.dpi": 110,
        "savefig.dpi": 110,
        "font.size": 10,
        "axes.spines.top": False,
        "axes.spines.right": False,
        "axes.grid": True,
        "grid.alpha": 0.25,
        "axes.titleweight": "bold",
        "axes.titlesize": 11,
    }
)


def footer(fig, label: str) -> None:
    """Stamp the run's provenance under the figure."""
    fig.text(0.01, 0.005, f"Measured: {label}", fontsize=8.5, color="#444", ha="left", va="bottom")


def finish(fig, label: str):
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    footer(fig, label)
    return fig


def census_bars(ours: pd.DataFrame, published: pd.DataFrame, label: str, gpu: str):
    """Kernel count and GPU time by kind: this run beside the published H100 profile."""
    o_all, p_all = ours.set_index("kind"), published.set_index("kind")
    # Kinds that neither profile has (convolution, in a model without one) are left out.
    kinds = [k for k in KINDS if o_all["kernels"].get(k, 0) or k in p_all.index]
    o = o_all.reindex(kinds)
    p = p_all.reindex(kinds)
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    y = range(len(kinds))
    h = 0.38
    for ax, ours_col, pub_col, title in (
        (axes[0], o["kernels"], p["kernels"], "Kernels per token"),
        (axes[1], o["gpu_ns"] / 1e6, p["gpu_ms"], "GPU time per token (ms)"),
    ):
        ax.barh([i - h / 2 for i in y], ours_col, h, color=[KIND_COLORS[k] for k in kinds], label=f"{gpu} (this run)")
        ax.barh([i + h / 2 for i in y], pub_col, h, color=THEIRS, label="H100 (published)")
        ax.set_yticks(list(y), kinds)
        ax.invert_yaxis()
        ax.set_title(title)
        ax.grid(axis="y", visible=False)
    axes[1].set_yticklabels([])
    axes[0].legend(loc="lower right", fontsize=8, frameon=False)
    return finish(fig, label)


def timeline(kernels: pd.DataFrame, label: str, title: str):
    """Kernels of a slice of the step as bars on a time axis: CPU launch calls above, GPU
    kernels below, coloured by kind. The white space between GPU bars is the GPU waiting."""
    t0 = min(
        kernels.start_ns.min(),
        kernels.launch_ns[kernels.launch_ns > 0].min() if (kernels.launch_ns > 0).any() else kernels.start_ns.min(),
    )
    fig, ax = plt.subplots(figsize=(11, 2.9))
    for r in kernels.itertuples():
        ax.broken_barh(
            [((r.start_ns - t0) / 1e3, r.dur_ns / 1e3)], (0, 0.8), color=KIND_COLORS.get(r.kind, KIND_COLORS["other"])
        )
        if r.launch_dur_ns > 0:
            ax.broken_barh([((r.launch_ns - t0) / 1e3, r.launch_dur_ns / 1e3)], (1.2, 0.8), color="#444")
    ax.set_yticks([0.4, 1.6], ["GPU kernels", "CPU launches"])
    ax.set_xlabel("time (µs)")
    ax.set_title(title)
    ax.grid(axis="y", visible=False)
    handles = [plt.Rectangle((0, 0), 1, 1, color=KIND_COLORS[k]) for k in KINDS if k in set(kernels.kind)]
    ax.legend(
        handles,
        [k for k in KINDS if k in set(kernels.kind)],
        ncol=6,
        fontsize=7.5,
        loc="upper center",
        bbox_to_anchor=(0.5, -0.32),
        frameon=False,
    )
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    footer(fig, label)
    return fig


def attention_share(sweep: pd.DataFrame, label: str):
    """Attention's share of the step's GPU time as the context grows."""
    fig, ax = plt.subplots(1, 2, figsize=(10, 3.5))
    ax[0].plot(sweep.context, sweep["attention share"] * 100, "o-", color=KIND_COLORS["attention"])
    ax[0].set_xscale("log", base=2)
    ax[0].set_xlabel("tokens in the KV cache")
    ax[0].set_ylabel("attention share of GPU time (%)")
    ax[0].set_title("Attention's share grows with context")
    ax[1].stackplot(
        sweep.context,
        sweep["GPU ms"] - sweep["attention ms"],
        sweep["attention ms"],
        colors=["#c9d6e8", KIND_COLORS["attention"]],
        labels=["everything else", "attention"],
    )
    ax[1].set_xscale("log", base=2)
    ax[1].set_xlabel("tokens in the KV cache")
    ax[1].set_ylabel("GPU time per token (ms)")
    ax[1].set_title("GPU time per token")
    ax[1].legend(loc="upper left", fontsize=8, frameon=False)
    for a in ax:
        a.set_xticks(list(sweep.context), [f"{c // 1024}k" if c >= 1024 else str(c) for c in sweep.context])
    return finish(fig, label)


def layer_parts(table: pd.DataFrame, label: str):
    """Kernels (bars) and GPU time (labels) of each part of one decoder layer, in order."""
    fig, ax = plt.subplots(figsize=(9, 0.36 * len(table) + 1.4))
    ax.barh(list(table.index), table.kernels, color=OURS)
    for i, (n, us) in enumerate(zip(table.kernels, table["GPU µs"], strict=False)):
        ax.text(n, i, f" {n} kernels, {us:.1f} µs", va="center", fontsize=8.5)
    ax.invert_yaxis()
    ax.set_xlabel("kernels")
    ax.set_xlim(0, table.kernels.max() * 1.6)
    ax.set_title("One decoder layer: kernels launched by each part")
    ax.grid(axis="y", visible=False)
    return finish(fig, label)


def bandwidth_bars(values: dict[str, float], label: str):
    """Bandwidths side by side (TB/s): what the matmuls reached against the limits."""
    fig, ax = plt.subplots(figsize=(7, 2.6))
    names = list(values)
    ax.barh(names, [values[n] for n in names], color=[OURS if "reached" in n else THEIRS for n in names])
    for i, n in enumerate(names):
        ax.text(values[n], i, f" {values[n]:.2f}", va="center", fontsize=9)
    ax.invert_yaxis()
    ax.set_xlabel("TB/s")
    ax.set_title("Memory bandwidth: reached by the matrix multiplies vs the limits")
    ax.grid(axis="y", visible=False)
    return finish(fig, label)


def hbars(
    labels,
    values,
    label: str,
    title: str,
    xlabel: str,
    colors=None,
    fmt="{:.2f}",
    log=False,
    width: float = 8,
    annotate: bool = True,
):
    """Horizontal bars with their values written at the end."""
    fig, ax = plt.subplots(figsize=(width, 0.45 * len(labels) + 1.3))
    ax.barh(list(labels), list(values), color=colors or OURS)
    if annotate:
        for i, v in enumerate(values):
            if v == v:  # not NaN
                ax.text(v, i, " " + fmt.format(v), va="center", fontsize=8.5)
    ax.invert_yaxis()
    if log:
        ax.set_xscale("log")
    ax.set_xlabel(xlabel)
    ax.set_title(title)
    ax.grid(axis="y", visible=False)
    return finish(fig, label)


def batch_sweep(
    sweep: pd.DataFrame,
    floor_ms: float,
    ms_per_seq: float,
    ridge_batch: float,
    datasheet_batch: float | None,
    label: str,
):
    """Matmul time per step against batch size (log-log) with the two roofline lines, and
    tokens per second."""
    fig, ax = plt.subplots(1, 2, figsize=(10.5, 3.9))
    b = sweep.batch
    ax[0].plot(b, sweep["matmul ms"], "o-", color=OURS, label="matrix multiplies (measured)")
    ax[0].plot(b, sweep["GPU ms"], "s--", color="#999", ms=4, label="whole step, GPU busy (measured)")
    ax[0].axhline(floor_ms, color=KIND_COLORS["copy/convert/concat"], lw=1, ls=":", label="memory-bound floor")
    line = b[b * ms_per_seq >= floor_ms / 3]
    ax[0].plot(line, line * ms_per_seq, color=KIND_COLORS["reduction"], lw=1, ls=":", label="compute-bound line")
    ax[0].axvline(ridge_batch, color="#555", lw=1)
    ax[0].text(ridge_batch, floor_ms * 0.55, f"measured ridge ≈ {ridge_batch:.0f} ", fontsize=8, ha="right")
    if datasheet_batch:
        ax[0].axvline(datasheet_batch, color="#bbb", lw=1, ls="--")
        ax[0].text(
            datasheet_batch, floor_ms * 0.42, f"datasheet {datasheet_batch:.0f} ", fontsize=8, color="#777", ha="right"
        )
    ax[0].set_xscale("log", base=2)
    ax[0].set_yscale("log")
    ax[0].set_xlabel("batch (sequences decoded together)")
    ax[0].set_ylabel("ms per decode step")
    ax[0].set_title("Flat while memory-bound, then rising")
    ax[0].legend(fontsize=7.5, frameon=False, loc="upper left")
    ax[0].set_ylim(floor_ms * 0.3, max(sweep["GPU ms"].max(), floor_ms) * 3)
    ax[1].plot(b, sweep["GPU tokens/s"], "o-", color=OURS, label="if the GPU never waited (GPU busy)")
    ax[1].plot(b, sweep["tokens/s"], "s--", color="#999", ms=4, label="measured wall time (eager)")
    ax[1].set_xscale("log", base=2)
    ax[1].set_yscale("log")
    ax[1].set_xlabel("batch")
    ax[1].set_ylabel("tokens per second")
    ax[1].set_title("Throughput grows with the batch")
    ax[1].legend(fontsize=7.5, frameon=False)
    return finish(fig, label)


def queue(q: pd.DataFrame, label: str):
    """Per launch: when the CPU's launch call returned, and when the GPU finished that kernel."""
    fig, ax = plt.subplots(figsize=(9, 3.4))
    ax.plot(q.launch, q.call_return_us / 1e3, color="#444", label="CPU: launch call returned")
    ax.plot(q.launch, q.gpu_done_us / 1e3, color=OURS, label="GPU: kernel finished")
    ax.fill_between(
        q.launch, q.call_return_us / 1e3, q.gpu_done_us / 1e3, color=OURS, alpha=0.12, label="waiting in the queue"
    )
    ax.set_xlabel("launch number")
    ax.set_ylabel("ms since the first launch")
    ax.set_title("The CPU runs ahead; the GPU works through the queue")
    ax.legend(fontsize=8, frameon=False)
    return finish(fig, label)


def stacked_breakdown(df: pd.DataFrame, label: str):
    """Where each variant's profiled step went (stacked horizontal bars)."""
    parts = [
        ("before first kernel ms", "#c9c9c9"),
        ("kernels running ms", OURS),
        ("gaps between kernels ms", "#f2b880"),
        ("after last kernel ms", "#8c8c8c"),
    ]
    fig, ax = plt.subplots(figsize=(10, 0.55 * len(df) + 1.6))
    left = pd.Series(0.0, index=df.index)
    for col, color in parts:
        ax.barh(df.variant, df[col], left=left, color=color, label=col.replace(" ms", ""))
        left = left + df[col]
    ax.invert_yaxis()
    ax.set_xlabel("ms (profiled step)")
    ax.set_title("Where the time of one decode step goes")
    ax.legend(ncol=4, fontsize=8, frameon=False, loc="upper center", bbox_to_anchor=(0.5, -0.25))
    ax.grid(axis="y", visible=False)
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    footer(fig, label)
    return fig


def cache_growth(growth: pd.DataFrame, label: str):
    """Cache bytes against context length: the full-attention layers' KV cache grows, the
    linear-attention layers' state stays flat."""
    fig, ax = plt.subplots(figsize=(7.5, 3.8))
    x = growth["context"]
    ax.plot(x, growth["full-attention KV cache MB"], "o-", color=OURS, label="full-attention layers: KV cache")
    ax.plot(
        x,
        growth["linear-attention state MB"],
        "s-",
        color=KIND_COLORS["attention"],
        label="linear-attention layers: fixed state",
    )
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("context (tokens)")
    ax.set_ylabel("MB held by the cache")
    ax.set_title("Cache size as the context grows")
    ax.legend(frameon=False)
    return finish(fig, label)


# --- Prompt phase vs decode phase ------------------------------------------------------------

PHASE_COLORS = {"prefill": "#2a7f62", "decode": "#c0504d"}


def utilisation_bars(df: pd.DataFrame, label: str):
    """MFU and MBU of prefill and decode (wall time and GPU busy), against the datasheet and
    the measured ceilings. `df` is prefill_decode.utilisation(), whose last MBU column names
    the measured bandwidth ("MBU vs measured read", or copy in older runs)."""
    mbu_measured = next(c for c in df.columns if c.startswith("MBU vs measured"))
    fig, axes = plt.subplots(1, 2, figsize=(10.5, 3.6), sharey=True)
    names = [f"{r.phase}, {r.time}" for r in df.itertuples()]
    y = list(range(len(df)))
    h = 0.38
    for ax, (sheet_col, meas_col, title) in zip(
        axes,
        (
            ("MFU vs datasheet", "MFU vs measured GEMM", "Share of peak math (MFU)"),
            ("MBU vs datasheet", mbu_measured, "Share of peak memory bandwidth (MBU)"),
        ),
        strict=False,
    ):
        for off, col, color, name in (
            (-h / 2, meas_col, OURS, meas_col.split(" vs ")[1]),
            (h / 2, sheet_col, THEIRS, "datasheet"),
        ):
            vals = (df[col] * 100).tolist()
            ax.barh([i + off for i in y], [0 if v != v else v for v in vals], h, color=color, label=f"against {name}")
            for i, v in enumerate(vals):
                if v == v:
                    ax.text(v, i + off, f" {v:.1f}%" if v >= 0.1 else f" {v:.2f}%", va="center", fontsize=7.5)
        ax.set_xlim(0, 115)
        ax.set_xlabel("% of the peak")
        ax.set_title(title)
        ax.grid(axis="y", visible=False)
        ax.legend(fontsize=7.5, frameon=False, loc="lower right")
    axes[0].set_yticks(y, names)
    axes[0].invert_yaxis()
    for t in axes[0].get_yticklabels():
        t.set_color(PHASE_COLORS.get(t.get_text().split(",")[0], "#333"))
    return finish(fig, label)


def phase_census_bars(census: pd.DataFrame, label: str):
    """Kernels and GPU time by kind, prefill beside decode. `census` is prefill_decode.census()."""
    kinds = [k for k in KINDS if k in census.index]
    c = census.reindex(kinds)
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    y = list(range(len(kinds)))
    h = 0.38
    for ax, col, title in ((axes[0], "kernels", "Kernels"), (axes[1], "GPU ms", "GPU time (ms)")):
        for off, ph in ((-h / 2, "prefill"), (h / 2, "decode")):
            vals = c[(ph, col)].tolist()
            ax.barh([i + off for i in y], vals, h, color=PHASE_COLORS[ph], label=ph)
            for i, v in enumerate(vals):
                ax.text(v, i + off, f" {v:,.0f}" if col == "kernels" else f" {v:.2f}", va="center", fontsize=7.5)
        ax.set_yticks(y, kinds)
        ax.invert_yaxis()
        ax.set_title(title)
        ax.grid(axis="y", visible=False)
        ax.set_xlim(0, max(c[("prefill", col)].max(), c[("decode", col)].max()) * 1.25)
    axes[1].set_yticklabels([])
    axes[0].legend(fontsize=8, frameon=False, loc="lower right")
    return finish(fig, label)


def _length_ticks(ax, lengths) -> None:
    ax.set_xticks(list(lengths), [f"{n // 1024}k" if n >= 1024 and n % 1024 == 0 else str(n) for n in lengths])
    ax.minorticks_off()


def gemm_rates(
    g: pd.DataFrame,
    label: str,
    datasheet_tflops=None,
    gemm_tflops=None,
    datasheet_tbs=None,
    measured_tbs=None,
    title_layer: str = "",
    bandwidth_label: str = "measured copy",
):
    """The matrix multiplies of one decoder layer: TFLOP/s (log scale) and TB/s reached in
    prefill and in decode, against the peaks (`measured_tbs`, called `bandwidth_label`: the
    measured read stream, or the copy in older runs). `g` is prefill_decode.layer_gemms()."""
    mods = list(dict.fromkeys(g.module))
    y = list(range(len(mods)))
    h = 0.38
    fig, axes = plt.subplots(1, 2, figsize=(10.5, 0.42 * len(mods) + 2.4), sharey=True)
    for ax, col, title, unit, peaks in (
        (
            axes[0],
            "tflops",
            "Math reached (TFLOP/s, log scale)",
            "TFLOP/s",
            ((gemm_tflops, "measured GEMM", OURS), (datasheet_tflops, "datasheet", "#888")),
        ),
        (
            axes[1],
            "tbs",
            "Memory bandwidth reached (TB/s)",
            "TB/s",
            ((measured_tbs, bandwidth_label, OURS), (datasheet_tbs, "datasheet", "#888")),
        ),
    ):
        for off, ph in ((-h / 2, "prefill"), (h / 2, "decode")):
            x = g[g.phase == ph].set_index("module").reindex(mods)[col]
            ax.barh([i + off for i in y], x.fillna(0), h, color=PHASE_COLORS[ph], label=ph)
            for i, v in enumerate(x):
                if v == v:
                    ax.text(v, i + off, f" {v:.0f}" if v >= 10 else f" {v:.1f}", va="center", fontsize=7.5)
        for value, text, color in peaks:
            if value:
                ax.axvline(
                    value,
                    color=color,
                    lw=1,
                    ls="--",
                    label=f"{text}: {value:.0f} {unit}" if value >= 10 else f"{text}: {value:.2f} {unit}",
                )
        if col == "tflops":
            ax.set_xscale("log")
            ax.set_xlim(max(g[col].min(), 1e-12) / 2, max(g[col].max(), datasheet_tflops or 0) * 4)
        else:
            ax.set_xlim(0, max(g[col].max(), datasheet_tbs or 0, measured_tbs or 0) * 1.2)
        ax.set_title(title)
        ax.grid(axis="y", visible=False)
        ax.legend(fontsize=7.5, frameon=False, ncol=2, loc="upper center", bbox_to_anchor=(0.5, -0.12))
    axes[0].set_yticks(y, mods)
    axes[0].invert_yaxis()
    fig.suptitle(f"The same weight matrices in prefill and in decode{title_layer}", fontsize=11, fontweight="bold")
    return finish(fig, label)


def prompt_sweep(
    sweep: pd.DataFrame,
    roof: pd.DataFrame,
    label: str,
    datasheet_tflops=None,
    gemm_tflops=None,
    crossover_tokens=None,
    datasheet_ridge_tokens=None,
    measured_ridge_tokens=None,
):
    """Prefill against prompt length: time per token (left) and the FLOP/s the matrix
    multiplies reached, under the roofline (right). `sweep` is prefill_decode.prompt_sweep(),
    `roof` prefill_decode.roofline()."""
    fig, ax = plt.subplots(1, 2, figsize=(11, 5.2))
    n = sweep.prompt_len
    a = ax[0]
    a.plot(n, sweep["ms per token"] * 1e3, "o-", color=PHASE_COLORS["prefill"], label="prefill, wall time")
    a.plot(n, sweep["GPU ms per token"] * 1e3, "s--", color="#777", ms=4, label="prefill, GPU busy")
    a.plot(n, sweep["matmul ms per token"] * 1e3, "^:", color=OURS, ms=4, label="its matrix multiplies (GPU)")
    a.set_yscale("log")
    a.set_ylabel("µs per prompt token")
    a.set_title("Time per token falls, then levels off")
    b = ax[1]
    if roof["datasheet TFLOP/s"].notna().any():
        b.plot(roof.prompt_len, roof["datasheet TFLOP/s"], color="#999", lw=1.2, label="roofline, datasheet")
    if roof["measured TFLOP/s"].notna().any():
        b.plot(
            roof.prompt_len,
            roof["measured TFLOP/s"],
            color=OURS,
            lw=1.2,
            alpha=0.6,
            label="roofline, measured ceilings",
        )
    b.plot(n, sweep["matmul TFLOP/s"], "o-", color=PHASE_COLORS["prefill"], label="matrix multiplies reached (GPU)")
    b.plot(n, sweep["TFLOP/s"], "s--", color="#777", ms=4, label="whole prefill, on wall time")
    b.set_yscale("log")
    b.set_ylabel("TFLOP/s")
    b.set_title("Where the matrix multiplies hit the math limit")
    lo = max(min(sweep["TFLOP/s"].min(), sweep["matmul TFLOP/s"].min()) / 3, 1e-12)
    b.set_ylim(lo, max(datasheet_tflops or 0, gemm_tflops or 0, sweep["matmul TFLOP/s"].max()) * 3)
    for value, text, color in ((datasheet_tflops, "datasheet peak", "#999"), (gemm_tflops, "measured GEMM", OURS)):
        if value:
            b.axhline(value, color=color, lw=0.8, ls=":", label=f"{text}: {value:.0f} TFLOP/s")
    for value, text, color, ls in (
        (datasheet_ridge_tokens, "ridge, datasheet", "#999", "--"),
        (measured_ridge_tokens, "ridge, measured ceilings", OURS, "--"),
        (crossover_tokens, "crossover in this sweep", PHASE_COLORS["decode"], "-"),
    ):
        if value:
            for axis in ax:
                axis.axvline(
                    value, color=color, lw=0.9, ls=ls, label=f"{text}: {value:.0f} tokens" if axis is b else None
                )
    for axis in ax:
        axis.set_xscale("log", base=2)
        _length_ticks(axis, n)
        axis.set_xlabel("tokens in the prompt")
        axis.legend(fontsize=7.5, frameon=False, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2)
    return finish(fig, label)


def stacked_parts(df: pd.DataFrame, parts: list[str], label: str, title: str, xlabel: str):
    """One horizontal bar per row of `df` (named by its `variant` column), split into the
    columns `parts`, stacked left to right."""
    colors = [OURS, KIND_COLORS["elementwise"], "#c9c9c9", "#8c8c8c", KIND_COLORS["attention"]]
    fig, ax = plt.subplots(figsize=(10, 0.55 * len(df) + 1.6))
    left = pd.Series(0.0, index=df.index)
    for col, color in zip(parts, colors, strict=False):
        ax.barh(df.variant, df[col], left=left, color=color, label=col.replace(" ms", ""))
        left = left + df[col]
    ax.invert_yaxis()
    ax.set_xlabel(xlabel)
    ax.set_title(title)
    ax.legend(ncol=len(parts), fontsize=8, frameon=False, loc="upper center", bbox_to_anchor=(0.5, -0.25))
    ax.grid(axis="y", visible=False)
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    footer(fig, label)
    return fig
