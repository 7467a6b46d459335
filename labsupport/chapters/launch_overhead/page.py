"""The page of "Launch overhead": every number and short conditional fragment its markdown glues
(Page, one field per glue name), and the frames its figure and table cells show, from a run, the
shared quantities and the book's ceilings."""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

from labsupport import glue, runs
from labsupport.chapters import shared
from labsupport.chapters.launch_overhead.analysis import (
    breakdown,
    eager_summary,
    kernel_table,
    measured_column,
    one_layer,
    variants,
)
from labsupport.chapters.launch_overhead.params import SHARED_PREFIX, VARIANTS
from labsupport.chapters.launch_overhead.static_cache import static_cache_diff, static_cache_summary
from labsupport.glue import NOT_GLUED
from labsupport.measure import hardware, harness


@dataclass
class Page:
    """The eager step's wait for the CPU, the fixes side by side (the fastest named, against the
    bandwidth limits), what the static cache adds, and where each profiled step's time went."""

    run_label: str
    prompt_len: int
    # the eager step (e_*: this page's own numbers of it; the shared ones are glued by their names)
    busy_pct: float
    e_idle_ms: float
    e_cpu_per_kernel_us: float
    e_kernel_interval_us: float
    e_launch_call_us: float
    e_profiled_span_ms: float
    e_profiled_ratio: float
    e_launch_share: float
    # the fixes
    best: str
    best_wall: shared.Shown
    best_tokens: float
    eager_tokens: float
    best_limit: float
    best_measured: float
    best_speedup: float
    best_note: str
    n_failed: int
    failed_text: str
    timing_note: str
    measured_text: str
    # what the static cache adds
    sc_open_text: str
    sc_graph_text: str
    sc_layer_text: str
    sc_top_text: str
    sc_end_text: str
    # where the rest of the time goes
    profiled_note: str
    # the answers of "Try this"
    try_best_wall_per_kernel_us: float
    try_best_kernels: int
    try_best_launch_calls: int
    try_eager_gap_share: float
    try_best_gap_share: float
    # what the display cells show
    timeline_kernels: pd.DataFrame = field(metadata=NOT_GLUED)
    timeline_title: str = field(metadata=NOT_GLUED)
    fixes: pd.DataFrame = field(metadata=NOT_GLUED)  # the fixes table as shown
    measured_column: str = field(metadata=NOT_GLUED)
    fixed: pd.DataFrame = field(metadata=NOT_GLUED)  # the variants that ran, by key
    # the call paths that differ, as shown; None: the two eager steps were not both profiled
    static_diff: pd.DataFrame | None = field(metadata=NOT_GLUED)
    breakdown: pd.DataFrame = field(metadata=NOT_GLUED)


def page(run: runs.Run, vals: dict, lim: hardware.Limits) -> Page:
    """The page of `run`, with `vals` the shared quantities (shared.glue_values) and `lim` the
    book's ceilings (shared.limits)."""
    eager = eager_summary(run, vals)  # unprofiled numbers: the shared ones; profiled ones: this run's eager profile
    table = variants(run, vals, lim)
    fixed = table[table.status == "ok"].set_index("variant")
    best = fixed["wall ms"].idxmin()  # a variant key
    column = measured_column(run, lim)
    walls = table.set_index("variant")["wall ms"]
    steps = breakdown(run, walls)
    # the unprofiled wall times as the page shows them
    wall_texts = {key: vals[f"{prefix}_wall_ms"].text for key, prefix in SHARED_PREFIX.items()}
    gaps = steps.set_index("variant")
    layer_kernels, layer_what = one_layer(kernel_table(run, "eager"), run.results["model"]["layers"])
    best_tbs = run.results["model"]["decode_bytes"] / 1e9 / fixed.loc[best, "wall ms"]  # GB/ms = TB/s
    diff = static_cache_diff(run) if _both_eager_steps_ran(run) else None
    return Page(
        run_label=run.cited,
        prompt_len=run.parameters["prompt_len"],
        busy_pct=eager.gpu_busy_ms / eager.wall_ms,
        e_idle_ms=eager.idle_ms,
        e_cpu_per_kernel_us=eager.cpu_per_kernel_us,
        e_kernel_interval_us=eager.kernel_interval_us,
        e_launch_call_us=eager.launch_call_us,
        e_profiled_span_ms=eager.profiled_span_ms,
        e_profiled_ratio=eager.profiled_ratio,
        e_launch_share=eager.launch_share,
        best=VARIANTS[best],
        best_wall=shared.Shown(vals[f"{SHARED_PREFIX[best]}_wall_ms"].text),
        best_tokens=fixed.loc[best, "tokens/s"],
        eager_tokens=fixed.loc["eager", "tokens/s"],
        best_limit=fixed.loc[best, "of datasheet limit"],
        best_measured=fixed.loc[best, column],
        best_speedup=fixed.loc["eager", "wall ms"] / fixed.loc[best, "wall ms"],
        best_note=hardware.above_ceiling_note(f"Its effective {best_tbs:.2f} TB/s", best_tbs, lim),
        n_failed=int((table.status != "ok").sum()),
        failed_text=failed_text(table),
        timing_note=timing_note(run),
        measured_text=measured_text(column, lim),
        **static_cache_texts(run, table, vals, diff),
        profiled_note=profiled_note(steps, wall_texts),
        try_best_wall_per_kernel_us=fixed.loc[best, "wall ms"] * 1e3 / fixed.loc[best, "kernels"],
        try_best_kernels=int(fixed.loc[best, "kernels"]),
        try_best_launch_calls=int(fixed.loc[best, "launch calls"]),
        try_eager_gap_share=gaps.loc["eager", "gaps between kernels ms"] / gaps.loc["eager", "profiled step ms"],
        try_best_gap_share=gaps.loc[best, "gaps between kernels ms"] / gaps.loc[best, "profiled step ms"]
        if best in gaps.index
        else float("nan"),
        timeline_kernels=layer_kernels,
        timeline_title=f"Eager decode step, {layer_what} "
        f"(profiled: {eager.profiled_ratio:.1f}× the unprofiled step's time, gaps widened)",
        fixes=fixes_table(table, column),
        measured_column=column,
        fixed=fixed,
        static_diff=None if diff is None else diff.drop(columns=["row", "eager µs", "static µs"]),
        breakdown=steps,
    )


def failed_text(table: pd.DataFrame) -> str:
    """Every variant ran, or which did not and why."""
    failed = table[table.status != "ok"]
    reasons = [f"*{VARIANTS[row.variant]}*: {row.status}" for row in failed.itertuples()]
    return glue.failures_text(reasons, "Every variant ran.", "Not every variant ran")


def measured_text(column: str, lim: hardware.Limits) -> str:
    """What the fixes table's practical-ceiling column compares with (or that it is empty)."""
    if lim.ceiling_tbs is None:
        return f"*{column}* is empty: no practical ceiling was measured on this GPU."
    return (
        f"*{column}* uses the practical ceiling of the run of *Why a GPU* ({lim.ceiling_tbs:.2f} TB/s), the best "
        "rate at which any kernel read this GPU's memory: a step reads its weights and writes next to nothing."
    )


def fixes_table(table: pd.DataFrame, column: str) -> pd.DataFrame:
    """The fixes side by side as the page shows them (variants()): labels, kernels over launch calls,
    the wall estimate with its quartiles, and which run measured it."""

    def wall(value, low, high, digits):
        if value != value:
            return "–"
        return f"{value:.{digits}f} ({low:.{digits}f}–{high:.{digits}f})".replace(" (nan–nan)", "")

    digits = [1 if source != "this run" else 2 for source in table["from"]]  # the eager rows: the shared digits
    return pd.DataFrame(
        {
            "variant": table.variant.map(VARIANTS),
            "kernels / launch calls": [
                "–" if count != count else f"{count:,.0f} / {calls:,.0f}"
                for count, calls in zip(table["kernels"], table["launch calls"], strict=True)
            ],
            "GPU busy ms": table["GPU busy ms"],
            "wall ms, estimate (quartiles)": list(
                map(wall, table["wall ms"], table["wall q1 ms"], table["wall q3 ms"], digits)
            ),
            "measured in": [
                "this run" if source == "this run" else f"The kernels in one token ({source})"
                for source in table["from"]
            ],
            "tokens/s": table["tokens/s"],
            "of datasheet limit": table["of datasheet limit"],
            column: table[column],
        }
    )


def _both_eager_steps_ran(run: runs.Run) -> bool:
    statuses = run.table("variants").set_index("variant").status
    return statuses.get("eager") == "ok" and statuses.get("eager-static") == "ok"


def static_cache_texts(run: runs.Run, table: pd.DataFrame, vals: dict, diff: pd.DataFrame | None) -> dict[str, str]:
    """The fragments of "What the static cache adds" (sc_*): the two eager steps' kernels and GPU time,
    where inside a layer the extra kernels are, the largest difference (`diff`: static_cache_diff), and
    what it costs; or, without `diff`, why the two steps cannot be compared."""
    statuses = run.table("variants").set_index("variant").status
    if diff is None:
        why = "; ".join(f"*{key}*: {status}" for key, status in statuses.items() if status != "ok")
        return {
            "sc_open_text": "The two eager steps were not both profiled in this run, so they cannot be compared "
            f"here: {why}.",
            **dict.fromkeys(("sc_graph_text", "sc_layer_text", "sc_top_text", "sc_end_text"), ""),
        }
    summary = static_cache_summary(run)
    differs = diff[diff.row == "differs"]
    top = differs.loc[differs["Δ µs"].idxmax()] if len(differs) else None
    walls = table.set_index("variant")["wall ms"]
    slower = walls["eager-static"] > walls["eager"]
    opening = (
        "The static cache is the one change that makes the eager step slower"
        if slower
        else "The static cache changes the eager step's kernels"
    )
    graph_pays = (
        ", and the CUDA graph row above shows that it pays for itself once the addresses stay put."
        if statuses.get("cuda-graph") == "ok" and walls["cuda-graph"] < walls["eager"]
        else "."
    )
    layer_delta = summary.static_layer_kernels - summary.eager_layer_kernels
    attention_delta = summary.static_attn_kernels - summary.eager_attn_kernels
    where = (
        "the extra kernels are all in self-attention"
        if layer_delta == attention_delta
        else f"{summary.eager_layer_kernels} kernels per layer become {summary.static_layer_kernels}; in self-attention"
    )
    return {
        "sc_open_text": f"{opening}: {vals['static_kernels'].text} kernels instead of {vals['eager_kernels'].text} "
        f"and {vals['static_gpu_busy_ms'].text} ms of GPU time instead of {vals['eager_gpu_busy_ms'].text} "
        f"(*The kernels in one token*'s profiles; this run's two profiled steps, compared below: "
        f"{summary.static_kernels - summary.eager_kernels:+,d} kernels, "
        f"{summary.static_busy_ms - summary.eager_busy_ms:+.2f} ms).",
        "sc_graph_text": ""
        if summary.graph_busy_ms is None
        else f"The CUDA graph of the static-cache step runs {vals['graph_kernels'].text} kernels in "
        f"{vals['graph_gpu_busy_ms'].text} ms of GPU time.",
        "sc_layer_text": f"Inside a decoder layer, {where}: {summary.eager_attn_kernels} kernels per layer with the "
        f"dynamic cache, {summary.static_attn_kernels} with the static one ({layer_delta * summary.layers:+,d} over "
        f"{summary.layers} layers); outside the layers (masks and positions for the whole model, sampling) "
        f"{summary.eager_outside_kernels} become {summary.static_outside_kernels}.",
        "sc_top_text": ""
        if top is None
        else f"The largest difference is `{top['call path']}`: {top['Δ kernels']:+,d} kernels, "
        f"{top['Δ µs']:+.0f} µs" + (f", {top['what it is']}." if top["what it is"] else "."),
        "sc_end_text": "None of this is launch overhead: it is what a fixed-address cache costs in eager mode"
        + graph_pays,
    }


def timing_note(run: runs.Run) -> str:
    """How the run's wall times were taken: interleaved in rounds before any profile (the
    harness), one variant after another before any profile, or, in runs recorded before the
    harness, each right after its own profile, with CUPTI attached."""
    t = run.table("step_times")
    if "clean" not in t:
        return (
            "This run is older than the book's measuring harness: each variant was timed right after its "
            "own profile, in the same process, so its wall times carry the profiler's after-effect (CUPTI "
            "stays attached and every later launch pays for it; the methodology page measures how much). "
            "Runs recorded with the current code time every variant before profiling any."
        )
    if t.empty:
        return "This run timed none of the forms this chapter owns (they need a CUDA GPU)."
    if t.clean.astype(str).eq("True").all():
        n = int(t.groupby("variant").size().max())
        how = (
            f"interleaved in {n} rounds (one step of each form per round, in a rotating order, so that a slow "
            "spell of the host touches every form alike)"
            if "round" in t and t["round"].notna().any()
            else f"{n} repeats per variant, one variant after another"
        )
        return f"Every wall time this run took was taken before the first profile in the process, {how}; the table " + (
            "gives the median of the trials taken while the host probe read within "
            f"{harness.FAST_HOST - 1:.0%} of its best reading, the book's estimator, with their quartiles."
            if "probe_ms" in t
            else "gives the minimum, the book's estimator when it was recorded (its trials carry no host-probe "
            "readings), with the quartiles."
        )
    return (
        "Some wall times in this run were taken after a profile in the same process (see `clean` in "
        "`step_times.csv`); they carry the profiler's after-effect."
    )


def profiled_note(bd: pd.DataFrame, texts: dict | None = None) -> str:
    """One sentence for a profiled figure: how much longer the profiled steps were than the
    unprofiled ones (breakdown() with walls), so that no reader takes a profiled gap for a real one.
    `texts`: variant -> the unprofiled wall time as the page shows it (a shared quantity's text)."""
    texts = texts or {}
    b = bd.dropna(subset=["profiled / unprofiled"]) if "profiled / unprofiled" in bd else bd.head(0)
    if b.empty:
        return "These are profiled steps: the profiler slows the CPU side, so their gaps are wider than unprofiled."
    parts = [
        f"{VARIANTS[r.variant]} {r['profiled step ms']:.1f} ms against "
        f"{texts.get(r.variant, format(r['unprofiled wall ms'], '.2f'))} ms unprofiled "
        f"({r['profiled / unprofiled']:.1f}×)"
        for _, r in b.iterrows()
    ]
    return (
        "Profiled steps: the profiler adds its own work on the CPU to every launch, so the gaps in a profiled "
        "step are wider than in an unprofiled one, by as much as its span exceeds the unprofiled wall time: "
        + "; ".join(parts)
        + "."
    )
