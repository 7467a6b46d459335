"""The page of "Where kernels come from": every number and short text its prose glues, and the tables
it shows, from one run, the published decode step of "The kernels in one token" and a published
serving engine's figures."""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

from labsupport import runs
from labsupport.chapters import published
from labsupport.glue import NOT_GLUED

from . import (
    COMPILED,
    DECODE_CHAPTER,
    EAGER,
    attention_backends,
    by_source,
    compiled_call_text,
    decode_kernels,
    fused_backends_text,
    fusion_kernels,
    fusion_table,
    math_kernels,
    per_call_column,
    timing_note,
)

# Each table's column formats, by the Page field that holds the table.
TABLE_FORMATS = {
    "sources": {"GPU ms": "{:.2f}", "share of GPU time": "{:.0%}"},
    "fusion_kernel_table": {"µs": "{:.2f}"},
    "fusion_times_table": {"GPU µs (profiler)": "{:.2f}", "per call µs (CUDA events)": "{:.0f}"},
    "attention_table": {
        "context": "{:,.0f}",
        "GPU µs (profiler)": "{:.1f}",
        "per call µs": "{:.0f}",
        "kernels": "{:.0f}",
    },
}


@dataclass
class Page:
    """The kernels of a decode step by the library they come from, RMSNorm fused by torch.compile,
    one attention under several backends, and a serving engine's published decode step."""

    run_label: str
    # the decode step, by source
    decode_label: str
    sources_found: str
    # the fusion
    rms_eager_kernels: int
    rms_compiled_kernels: int
    eager_us: float
    compiled_us: float
    eager_gpu_us: float
    compiled_gpu_us: float
    fusion_err: float
    fused_name: str
    timing_note: str
    compiled_call_text: str
    # the attention backends
    backends_ok: int
    backends_tried: int
    math_kernels: int
    fused_backends_text: str
    # a serving engine, published (published.HYBRID_27B_VLLM_HEADLINE, prefixed v_)
    v_decode_kernels: int
    v_decode_ms: float
    v_tokens_per_s: float
    v_eager_kernels: int
    v_launch_calls_with_graphs: int
    v_lm_head_ms: float
    v_lm_head_rows: int
    v_prefill_ms: float
    v_prefill_tokens: int
    # the answers of "Try this"
    try_fastest_text: str
    try_fusion_gpu_ratio: float
    try_fusion_call_ratio: float
    # what the tables and the figure show
    decode_run: runs.Run | None = field(metadata=NOT_GLUED)  # None without a recorded decode step
    sources: pd.DataFrame | None = field(metadata=NOT_GLUED)  # the decode step's GPU time by source, by_source
    fusion_kernel_table: pd.DataFrame = field(metadata=NOT_GLUED)
    fusion_times_table: pd.DataFrame = field(metadata=NOT_GLUED)
    attention_table: pd.DataFrame = field(metadata=NOT_GLUED)


def fastest_text(backends: pd.DataFrame) -> str:
    """The backend with the least time per call at the longest context any backend ran at."""
    ran = backends[backends.status == "ok"]
    if not len(ran):
        return "No backend ran in this run"
    longest = ran[ran.context == ran.context.max()]
    column = per_call_column(ran)
    fastest = longest.loc[longest[column].idxmin()]
    return (
        f"At {int(fastest.context):,d} tokens, *{fastest.backend}*: {fastest[column]:.0f} µs per call "
        f"({fastest.gpu_ns / 1e3:.1f} µs of GPU time)"
    )


def attention_display(backends: pd.DataFrame) -> pd.DataFrame:
    """The backends as the page shows them: per call, the minimum (the median in runs from before
    the interleaved timing)."""
    per_call = per_call_column(backends)
    return backends.assign(gpu_us=backends.gpu_ns / 1e3)[
        ["backend", "context", "kernels", "kernel", "source", "gpu_us", per_call]
    ].rename(columns={"gpu_us": "GPU µs (profiler)", per_call: "per call µs"})


def page(run: runs.Run, root=None) -> Page:
    """The page of `run`, with the decode step published under the runs folder `root` (default:
    the book's); without one, the label says why and the sources are "none"."""
    fusion = fusion_table(run).set_index("variant")
    backends = attention_backends(run)
    fused = fusion_kernels(run)
    try:
        decode_run = runs.load_run(DECODE_CHAPTER, root=root)
        sources = by_source(decode_kernels(decode_run))
        decode_label = f"run `{decode_run.run_id}` of the chapter *The kernels in one token*"
        sources_found = ", ".join(sources.index)
    except runs.RunError as e:
        decode_run, sources = None, None
        decode_label, sources_found = f"no recorded decode step ({e})", "none"
    eager, compiled = fusion.loc[EAGER], fusion.loc[COMPILED]
    return Page(
        run_label=run.cited,
        decode_label=decode_label,
        sources_found=sources_found,
        rms_eager_kernels=int(eager.kernels),
        rms_compiled_kernels=int(compiled.kernels),
        eager_us=float(eager["per call µs (CUDA events)"]),
        compiled_us=float(compiled["per call µs (CUDA events)"]),
        eager_gpu_us=float(eager["GPU µs (profiler)"]),
        compiled_gpu_us=float(compiled["GPU µs (profiler)"]),
        fusion_err=float(run.results["fusion_max_abs_diff"]),
        fused_name=", ".join(f"`{name}`" for name in fused.loc[fused.variant == COMPILED, "kernel"]),
        timing_note=timing_note(run),
        compiled_call_text=compiled_call_text(run),
        backends_ok=len(backends[backends.status == "ok"].backend.unique()),
        backends_tried=len(backends.backend.unique()),
        math_kernels=math_kernels(run),
        fused_backends_text=fused_backends_text(run),
        **{f"v_{name}": value for name, value in published.HYBRID_27B_VLLM_HEADLINE.items()},
        try_fastest_text=fastest_text(backends),
        try_fusion_gpu_ratio=float(eager["GPU µs (profiler)"] / compiled["GPU µs (profiler)"]),
        try_fusion_call_ratio=float(eager["per call µs (CUDA events)"] / compiled["per call µs (CUDA events)"]),
        decode_run=decode_run,
        sources=sources,
        fusion_kernel_table=fused,
        fusion_times_table=fusion.reset_index(),
        attention_table=attention_display(backends),
    )
