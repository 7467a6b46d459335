"""The page of "The kernels in one token": every number and short conditional fragment its markdown
glues (Page, one field per glue name), the frames its figure and table cells show, and the prose
fragments only this page says (how the step was estimated, the plain script beside it, the walls
across contexts, the KV cache's copies)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import pandas as pd

from labsupport import runs
from labsupport.chapters import published, shared
from labsupport.chapters.kernels_in_one_token.analysis import (
    PLAIN_AGREEMENT,
    attention_kernel_names,
    census_beside_published,
    context_sweep,
    fresh_processes,
    kernel_table,
    middle_layer,
    plain_step,
    profiler_effect,
    static_copies,
    summary,
)
from labsupport.chapters.kernels_in_one_token.matrices import gemv_by_shape, kv_cache_traffic
from labsupport.glue import NOT_GLUED
from labsupport.measure import hardware, harness, models

H100 = "NVIDIA H100 80GB HBM3"  # the GPU of the published profile the page compares with
FAST_WITHIN = harness.FAST_HOST - 1  # the fast-host trials: the probe read within this of its best
PARAMETERS = ("batch", "prompt_len", "repeats", "context_repeats", "fresh_processes")  # glued as param_<name>
SLOW = 1.25  # a median this many times the estimate: the slow trials are the host's, not the step's


@dataclass
class Page:
    """One token's kernels counted and sorted by kind beside a published profile, how near the
    matrix multiplies come to the memory limit, how much of the token the GPU is busy, one layer
    kernel by kernel, and what a longer context adds (attention, the KV cache's copies)."""

    run_label: str
    gpu: str
    model_dtype: str
    datasheet_name: str
    # the run's parameters
    param_batch: int
    param_prompt_len: int
    param_repeats: int
    param_context_repeats: int
    param_fresh_processes: int
    # the census and the matrix multiplies (the shared eager numbers are glued by their own names)
    kernel_ms: float
    idle_ms: float
    busy_fraction: float
    matmul_kernels: int
    matmul_ms: float
    matmul_gb: float
    math_ms_datasheet: float
    matmul_fraction_datasheet: float
    layers: int
    kernels_per_layer: int
    attention_kernels: int
    attention_kernel: str
    read_fraction_text: shared.Shown
    copy_fraction_text: shared.Shown
    gemv_text: str
    lm_head_note: str
    # how the step was timed
    estimator_text: str
    fast_host_within: float
    plain_text: str
    plain_wall_ms: float
    plain_ratio: float
    fresh_n: int
    profiled_span_ms: float
    profiled_ratio: float
    fresh_note: str
    timeline_note: str
    # the published H100 profile, and each token against its own GPU's floor
    p_token_ms: float
    p_token_ms_second_run: float
    p_gpu_busy_ms: float
    p_gpu_wait_ms: float
    p_kernel_interval_us: float
    p_kernel_mean_us: float
    p_matmul_bytes_gb: float
    p_matmul_ms: float
    p_matmul_tbs: float
    p_matmul_fraction_of_datasheet: float
    p_best_case_ms: float
    p_attention_kernels: int
    p_floor_ms: float
    p_token_of_floor: float
    p_kernels: int
    token_of_floor: float
    h100_tbs: float
    d_elementwise: int
    d_copy: int
    # longer contexts
    context_wall_text: str
    kv_text: str
    # the answers of "Try this" (and the last takeaway)
    try_ctx_last: int
    try_attn_share_last: float
    try_elementwise_n: int
    try_elementwise_share: float
    try_busy_tokens: float
    try_wall_tokens: float
    # what the display cells show
    census: pd.DataFrame = field(metadata=NOT_GLUED)  # ours beside the published one, one heading per column
    bandwidths: dict = field(metadata=NOT_GLUED)  # name -> TB/s: the matrix multiplies against the limits
    gemv: pd.DataFrame = field(metadata=NOT_GLUED)  # the weight matrices by shape (gemv_by_shape)
    gemv_table: pd.DataFrame = field(metadata=NOT_GLUED)
    fresh_table: pd.DataFrame | None = field(metadata=NOT_GLUED)  # None: a run without fresh processes
    timeline_kernels: pd.DataFrame = field(metadata=NOT_GLUED)
    timeline_title: str = field(metadata=NOT_GLUED)
    sweep: pd.DataFrame = field(metadata=NOT_GLUED)  # the context sweep (context_sweep)
    kv_traffic: pd.DataFrame = field(metadata=NOT_GLUED)  # the KV cache's traffic by context (kv_cache_traffic)
    kv_table: pd.DataFrame = field(metadata=NOT_GLUED)  # the same, as shown
    static_copies: pd.DataFrame | None = field(metadata=NOT_GLUED)  # None: a run without context_ops.csv


def page(run: runs.Run, vals: dict, lim: hardware.Limits) -> Page:
    """The page of `run`, with `vals` the shared quantities (shared.glue_values) and `lim` the
    book's ceilings (shared.limits)."""
    nan = float("nan")
    step = summary(run, lim)
    wall = vals["eager_wall_ms"].value
    plain = plain_step(run)
    fresh = fresh_processes(run)
    effect = profiler_effect(run)
    span = nan if effect is None else float(effect.set_index("condition").loc["inside the profiler", "wall_ms_median"])
    h100 = hardware.datasheet(H100)
    headline = published.QWEN3_8B_H100_HEADLINE
    p_floor_ms = headline["matmul_bytes_gb"] / h100.bandwidth_tbs
    ours, theirs = (
        run.table("census").set_index("kind").kernels,
        published.QWEN3_8B_H100_CENSUS.set_index("kind").kernels,
    )
    shapes = gemv_by_shape(run)
    gemv = shapes.set_index("projection")
    sweep = context_sweep(run)
    layer = middle_layer(run)
    kernels = kernel_table(run)
    traffic = kv_cache_traffic(run)

    def fraction(ceiling):  # the matrix multiplies' rate as a share of a shared ceiling, as its one text
        return shared.Shown("–" if not ceiling or ceiling != ceiling else f"{step.matmul_tbs / ceiling:.0%}")

    return Page(
        run_label=run.cited,
        gpu=step.gpu,
        model_dtype=models.dtype_label(models.run_dtype(run)),  # runs before the parameter: BF16
        datasheet_name=step.datasheet_name or "no datasheet known for this GPU",
        **{f"param_{name}": run.parameters[name] for name in PARAMETERS},
        kernel_ms=step.kernel_ms,
        idle_ms=step.idle_ms,
        busy_fraction=step.busy_fraction,
        matmul_kernels=step.matmul_kernels,
        matmul_ms=step.matmul_ms,
        matmul_gb=step.matmul_gb,
        math_ms_datasheet=nan if step.math_ms_datasheet is None else step.math_ms_datasheet,
        matmul_fraction_datasheet=nan if step.matmul_fraction_datasheet is None else step.matmul_fraction_datasheet,
        layers=step.layers,
        kernels_per_layer=step.kernels_per_layer,
        attention_kernels=step.attention_kernels,
        attention_kernel=", ".join(f"`{name}`" for name in attention_kernel_names(run)) or "none",
        read_fraction_text=fraction(vals["read_tbs"].value),
        copy_fraction_text=fraction(vals["copy_tbs"].value),
        gemv_text=gemv_text(gemv),
        lm_head_note=hardware.above_ceiling_note(
            f"The LM head's {gemv.loc['lm_head', 'tbs']:.2f} TB/s", float(gemv.loc["lm_head", "tbs"]), lim
        ),
        estimator_text=estimator_text(step.estimator, step.fast_trials, step.trials),
        fast_host_within=FAST_WITHIN,
        plain_text=plain_text(run),
        plain_wall_ms=plain.plain.value if plain else nan,
        plain_ratio=plain.ratio if plain else nan,
        fresh_n=nan if effect is None else 0 if fresh is None else len(fresh),
        profiled_span_ms=span,
        profiled_ratio=span / wall,
        fresh_note=fresh_note(fresh if effect is not None else None, measured=effect is not None),
        timeline_note=timeline_note(span, wall),
        **{f"p_{name}": value for name, value in headline.items()},
        p_floor_ms=p_floor_ms,
        p_token_of_floor=p_floor_ms / headline["token_ms"],
        p_kernels=int(theirs["total"]),
        token_of_floor=vals["floor_ms"].value / wall,
        h100_tbs=h100.bandwidth_tbs,
        d_elementwise=int(ours["elementwise"] - theirs["elementwise"]),
        d_copy=int(ours["copy/convert/concat"] - theirs["copy/convert/concat"]),
        context_wall_text=context_wall_text(run),
        kv_text=kv_cache_text(run),
        **try_answers(run, step, sweep),
        census=census_table(run),
        bandwidths={
            "reached by the matrix multiplies": step.matmul_tbs,
            **({"read stream measured on this GPU": vals["read_tbs"].value} if vals["read_tbs"].value else {}),
            "copy measured on this GPU (read + write)": vals["copy_tbs"].value or 0.0,
            f"{step.datasheet_name} datasheet": vals["datasheet_tbs"].value or 0.0,
        },
        gemv=shapes,
        gemv_table=gemv_table(shapes),
        fresh_table=None if fresh is None else fresh_table(fresh),
        timeline_kernels=kernels[kernels.layer == layer],
        timeline_title=timeline_title(layer, span, wall),
        sweep=sweep,
        kv_traffic=traffic,
        kv_table=kv_table(traffic),
        static_copies=static_copies(run),
    )


def timeline_title(layer: int, span: float, wall: float) -> str:
    """The timeline's title: the layer, and how much the profiler stretched the step (NaN `span`: not recorded)."""
    stretched = (
        "profiled: gaps wider than unprofiled"
        if math.isnan(span)
        else f"profiled: span {span:.1f} ms, {span / wall:.1f}× the unprofiled {wall:.1f} ms"
    )
    return f"Decoder layer {layer}: CPU launches and GPU kernels ({stretched})"


def fresh_note(fresh: pd.DataFrame | None, measured: bool = False) -> str:
    """The step in fresh processes, none of which profiled (None: a run that predates them, or, where
    the profiler's effect was `measured`, a run that timed none: a model folder's, or fresh_processes=0)."""
    if fresh is None and measured:
        return (
            "No fresh process timed this run's step (a fresh process builds a preset, not a model folder): its "
            "wall times are this process's, taken before it profiled."
        )
    if fresh is None:
        return (
            "This run predates the timing in fresh processes; its wall times were taken after the "
            "process had profiled, which slows every launch (see *Methodology*)."
        )
    return (
        f"In {len(fresh)} fresh processes, none of which ever profiled, the same step's minimum was "
        + ", ".join(f"{low:.1f}" for low in fresh.wall_ms_min)
        + " ms (medians "
        + ", ".join(f"{median:.1f}" for median in fresh.wall_ms_median)
        + " ms): the table below shows every process."
    )


def timeline_note(span: float, wall: float) -> str:
    """How much the profiler stretched the step the timeline shows (NaN `span`: not recorded)."""
    if math.isnan(span):
        return (
            "This is the profiled step: the profiler slows the CPU side, so the gaps here are "
            "wider than in an unprofiled step (this run did not record by how much). The GPU's own kernel "
            "times are what a profile is for."
        )
    return (
        f"This is the profiled step, and the profiler slows the CPU side: the step's span under "
        f"the profiler was {span:.1f} ms, {span / wall:.1f} times the {wall:.1f} ms of an unprofiled step "
        "(the estimate above), so every gap here is wider than in an unprofiled step. The GPU's own kernel "
        "times are what a profile is for."
    )


def gemv_text(gemv: pd.DataFrame) -> str:
    """The weight matrices' read rates, the small ones first (gemv_by_shape, by projection)."""
    mlp = gemv.loc[["gate_proj", "up_proj", "down_proj"], "tbs"]
    return (
        f"The small projections are the slow ones: `k_proj` and `v_proj` ({gemv.loc['k_proj', 'shape']}, "
        f"{gemv.loc['k_proj', 'bytes'] / 1e6:.0f} MB each) read at {gemv.loc['k_proj', 'tbs']:.2f} and "
        f"{gemv.loc['v_proj', 'tbs']:.2f} TB/s, `q_proj` and `o_proj` ({gemv.loc['q_proj', 'bytes'] / 1e6:.0f} MB) at "
        f"{gemv.loc['q_proj', 'tbs']:.2f} and {gemv.loc['o_proj', 'tbs']:.2f}, "
        f"the MLP's three ({gemv.loc['up_proj', 'bytes'] / 1e6:.0f} MB) at {mlp.min():.2f}-{mlp.max():.2f}, "
        f"and the LM head ({gemv.loc['lm_head', 'bytes'] / 1e9:.2f} GB) at {gemv.loc['lm_head', 'tbs']:.2f} TB/s."
    )


def try_answers(run: runs.Run, step, sweep: pd.DataFrame) -> dict:
    """The answers of "Try this" and the last takeaway: attention's share at the longest context, the
    elementwise kernels' count and share, and the tokens per second busy against wall."""
    nan = float("nan")
    shares = sweep[sweep["attention share"].notna()]
    last = shares.iloc[-1] if len(shares) else None
    kernels = run.table("kernels")
    by_kind = kernels.groupby("kind").dur_ns.agg(["size", "sum"])
    elementwise = by_kind.loc["elementwise"] if "elementwise" in by_kind.index else None
    return {
        "try_ctx_last": nan if last is None else int(last["context"]),
        "try_attn_share_last": nan if last is None else float(last["attention share"]),
        "try_elementwise_n": 0 if elementwise is None else int(elementwise["size"]),
        "try_elementwise_share": 0.0 if elementwise is None else float(elementwise["sum"] / kernels.dur_ns.sum()),
        "try_busy_tokens": 1e3 / step.gpu_busy_ms if step.gpu_busy_ms else nan,
        "try_wall_tokens": 1e3 / step.wall_ms if step.wall_ms else nan,
    }


def census_table(run: runs.Run) -> pd.DataFrame:
    """census_beside_published with one heading per column ("kernels, H200 (this run)")."""
    table = census_beside_published(run)
    table.columns = [f"{what}, {who}" for who, what in table.columns]
    return table.reset_index().rename(columns={"index": "kind"})


def gemv_table(shapes: pd.DataFrame) -> pd.DataFrame:
    """The weight matrices by shape (gemv_by_shape) as the page shows them."""
    shown = shapes.assign(MB=shapes.bytes / 1e6).rename(
        columns={"us_per_call": "µs per call", "tbs": "TB/s", "split_k": "split-K"}
    )
    return shown[["projection", "shape", "MB", "µs per call", "TB/s", "split-K", "kernel"]]


def fresh_table(fresh: pd.DataFrame) -> pd.DataFrame:
    """The fresh processes as the page shows them."""
    columns = {
        "process": "process",
        "wall_ms_min": "min ms",
        "wall_ms_median": "median ms",
        "wall_ms_max": "max ms",
        "cpu_model": "CPU",
        "loadavg_1m_before": "load (1 min) before",
    }
    return fresh[list(columns)].rename(columns=columns)


def kv_table(traffic: pd.DataFrame) -> pd.DataFrame:
    """The KV cache's traffic by context as the page shows it: the two caches' GPU time in one
    column, and only the columns the run measured."""
    shown = traffic.assign(
        **{
            "GPU ms, dynamic / static": [
                "–" if dynamic != dynamic else f"{dynamic:.2f} / " + ("–" if static != static else f"{static:.2f}")
                for dynamic, static in zip(traffic["GPU ms, dynamic"], traffic["GPU ms, static"], strict=True)
            ]
        }
    )
    columns = ["context", "cache GB", "concat GB moved", "cat ms", "attention ms", "attention TB/s"]
    columns.append("GPU ms, dynamic / static")
    return shown[[c for c in columns if shown[c].notna().any()]]


def estimator_text(basis: str, fast: int, trials: int) -> str:
    """How a host-timed number was estimated, as a fragment of a sentence: the median of the
    fast-host trials, or, for a run recorded before per-trial probe readings, the minimum (said so)."""
    if basis == harness.ESTIMATOR:
        return f"median of the {fast} trials of {trials} taken on a fast host"
    return f"minimum of {trials} trials (a run recorded before each trial carried a host-probe reading)"


def plain_text(run: runs.Run) -> str:
    """The plain script's step beside the book's, as a sentence (said plainly when the run has none)."""
    p = plain_step(run)
    if p is None:
        return "This run was recorded before the plain script ran beside the book's measurement."
    if not p.plain.trials or not p.book.trials:
        return (
            "The same step was also timed by a plain transformers script outside the book's harness "
            "(`benchmarks/plain_eager_step.py`, in a fresh process), but the host ran at another speed then: "
            f"{p.plain.trials} of its {p.plain.of} trials and {p.book.trials} of the book's {p.book.of} were taken "
            f"within {FAST_WITHIN:.0%} of the best probe reading of the two, {p.plain.best_probe_ms:.2f} ms, so the "
            "two are not compared."
        )
    verdict = "they agree" if p.agree else f"they differ by more than {PLAIN_AGREEMENT:.0%}"
    return (
        f"The same step timed by a plain transformers script outside the book's harness "
        f"(`benchmarks/plain_eager_step.py`, in a fresh process, {p.plain.trials} fast-host trials of "
        f"{p.plain.of}) took {p.plain.value:.1f} ms by the same estimator, {p.ratio:.2f} times the book's "
        f"{p.book.value:.1f} ms: {verdict}."
    )


def context_wall_text(run: runs.Run) -> str:
    """What the wall times across contexts show: the estimate against the GPU's busy time, and
    any context whose median of all trials stands far above its estimate (slow trials), said from
    the run."""
    sw = context_sweep(run)
    first, last = sw.iloc[0], sw.iloc[-1]
    new = "wall_ms_estimate" in sw  # runs with per-trial probe readings: the fast-host median
    by = "the book's estimator" if new else "the minimum of its trials"
    text = (
        f"By {by}, the dynamic cache's step took {first['wall ms']:.1f} ms at "
        f"{int(first.context):,} tokens and {last['wall ms']:.1f} ms at {int(last.context):,}, while the GPU's busy "
        f"time grew from {first['GPU busy ms']:.2f} to {last['GPU busy ms']:.2f} ms: the GPU still waits for the "
        "CPU most of the step, so the wall time barely moves."
    )
    slow = sw[sw["wall ms (median)"] > SLOW * sw["wall ms"]]
    for _, r in slow.iterrows():
        n = int(r.get("wall_repeats", 0) or 0) or int(run.parameters.get("context_repeats", 0) or 0)
        text += (
            f" At {int(r.context):,} tokens the median of all {n or 'few'} trials, {r.wall_ms_median:.1f} ms, "
            f"is {r.wall_ms_median / r['wall ms']:.1f} times {'the estimate' if new else 'their minimum'}, "
            f"{r['wall ms']:.1f} ms (slowest "
            f"{r.wall_ms_max:.1f} ms), while the GPU's busy time there, {r.gpu_busy_ns / 1e6:.2f} ms, is in "
            "line with its neighbours': the step did not get slower, the host did during those trials"
        )
        text += (
            " (this run timed each context's trials one block after another; runs since interleave the two caches "
            "in rounds, so that a slow spell of the host touches both alike)."
            if "wall_ms_q1" not in sw
            else "."
        )
    return text


def kv_cache_text(run: runs.Run) -> str:
    """What the long-context steps say about the KV cache, in two or three sentences."""
    traffic = kv_cache_traffic(run)
    t = traffic.loc[traffic.context.idxmax()]  # the longest context measured
    lim = hardware.run_limits(run)
    sheet = (
        f" ({t['attention TB/s'] / lim.datasheet_tbs:.0%} of the datasheet's {lim.datasheet_tbs:.1f})"
        if lim.datasheet_tbs
        else ""
    )
    ctx = f"{int(t.context):,}"
    if t["cat ms"] == t["cat ms"]:
        concat = (
            f"every step it reads the whole cache and writes it again, {t['concat GB moved']:.1f} GB moved, "
            f"and its concatenations take {t['cat ms']:.2f} ms ({t['concat TB/s']:.2f} TB/s)"
        )
    else:
        concat = (
            f"every step it reads the whole cache and writes it again, {t['concat GB moved']:.1f} GB moved; "
            f"this run recorded the copy kernels' time only as a kind, {t['copy ms']:.2f} ms"
        )
    text = (
        f"At {ctx} tokens the cache holds {t['cache GB']:.1f} GB. transformers' dynamic cache appends each new "
        f"token by concatenation: {concat}. Attention itself reads the cache once, {t['cache GB']:.1f} GB in "
        f"{t['attention ms']:.2f} ms, {t['attention TB/s']:.2f} TB/s{sheet}."
    )
    if t["GPU ms, static"] == t["GPU ms, static"]:
        text += (
            f" With a static cache, allocated once at its full length so that the new token's keys and values "
            f"are written in place, the concatenations at {ctx} tokens take {t['cat ms, static']:.2f} ms. Yet "
            f"transformers' eager step does not get faster for it: all its copies and conversions take "
            f"{t['copy ms, static']:.2f} ms ({t['copy ms']:.2f} ms with the dynamic cache) and attention over "
            f"the preallocated cache {t['attention ms, static']:.2f} ms, so the step's GPU time is "
            f"{t['GPU ms, static']:.2f} ms instead of {t['GPU ms, dynamic']:.2f} ms (wall "
            f"{t['wall ms, static']:.1f} ms against {t['wall ms, dynamic']:.1f} ms, by the minimum of the trials). "
            + static_copies_text(run, traffic)
        )
    else:
        text += " This run did not measure the same step with a static cache; runs recorded since do."
    return text


def static_copies_text(run: runs.Run, traffic: pd.DataFrame) -> str:
    """Where the static cache's copies come from: by call path where the run recorded them
    (context_ops.csv), else what the run does show, their growth with the context."""
    t = traffic.dropna(subset=["copy ms, static"])
    lo, hi = t.iloc[0], t.iloc[-1]
    per_k = (hi["copy ms, static"] - lo["copy ms, static"]) / ((hi.context - lo.context) / 1000) * 1e3
    grow = (
        f"They grow in proportion to the context: {lo['copy ms, static']:.2f} ms at {int(lo.context):,} tokens, "
        f"{hi['copy ms, static']:.2f} ms at {int(hi.context):,}, about {per_k:.0f} µs more per 1,000 tokens, as a "
        "copy of the whole cache at every step would."
    )
    if "context_ops.csv" not in run.meta["files"]:
        return (
            grow + " This run recorded the copies by kind only, not by the operations that made them; runs recorded "
            "since keep every profiled step's kernels by call path (context_ops.csv), and the page breaks them down "
            "from it."
        )
    return grow + " The table below breaks them down by the chain of operators that launched them."
