"""The page of "Why a GPU": every number and short text its prose glues, and the tables it shows,
from one run (with the shared eager step of "The kernels in one token" and the split-K kernels of
"Prompt phase vs decode phase")."""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

from labsupport import glue, runs
from labsupport.chapters import shared
from labsupport.glue import NOT_GLUED
from labsupport.measure import hardware

from .batch_sweep import (
    AGREEMENT,
    REGIME_RULE,
    batch1_check,
    bytes_display,
    context_note,
    interleaved,
    largest,
    regime_text,
    ridge,
    smallest,
    sweep,
    sweep_display,
    sweep_note,
    sweep_numbers,
)
from .comparisons import (
    PREFILL_CHAPTER,
    PUBLISHED_H100_RIDGE_REQUESTS,
    PUBLISHED_H100_RIDGE_SOURCE,
    irregular_text,
    kv_ridge,
    ridge_display,
    ridge_pair_text,
    ridge_text,
    split_k_evidence,
)
from .measuring import CHAPTER, SETUP_COPY, SETUP_ROWS
from .one_token import (
    DATASHEET,
    arithmetic_display,
    arithmetic_rows,
    ceilings_label,
    counts,
    matvec,
    matvec_summary,
    matvec_text,
    memory_ceiling_text,
)

EAGER = ("eager_wall_ms", "eager_gpu_busy_ms", "eager_kernels")  # the shared eager step's quantities


def _never_if_inf(fmt: str):
    return lambda v: "never" if v == float("inf") else fmt.format(v)


# Each table's column formats, by the Page field that holds the table.
TABLE_FORMATS = {
    "arithmetic_table": {
        "TFLOP/s": "{:.0f}",
        "TB/s": "{:.2f}",
        "math ms": "{:.4f}",
        "memory ms": "{:.2f}",
        "memory / math": "{:.0f}×",
        "ridge FLOP/byte": "{:.0f}",
    },
    "matvec_table": {"µs (median)": "{:,.1f}", "GB/s": "{:,.0f}"},
    "bytes_table": {
        "KV cache GB": "{:.2f}",
        "KV share": "{:.0%}",
        "FLOP per byte": "{:.0f}",
        "limit ms": "{:.2f}",
        "GPU busy ms": "{:.2f}",
        "GPU busy / limit": "{:.1f}×",
    },
    "ridge_table": {
        "batch": _never_if_inf("{:,.0f}"),
        "GPU's datasheet ridge": "{:.0f}",
        "batch / ridge": _never_if_inf("{:.0%}"),
    },
    "sweep_table": {
        "matmul ms": "{:.2f}",
        "matmul TFLOP/s": "{:.0f}",
        "GPU ms": "{:.2f}",
        "wall ms": "{:.2f}",
        "wall median": "{:.2f}",
        "tokens/s": "{:,.0f}",
    },
}


@dataclass
class Page:
    """One token's arithmetic against the GPU's two limits, one matrix-vector product on the CPU and
    the GPU, and the batch sweep: its bytes, limits, regimes, ridge and throughput."""

    # one token's arithmetic
    weights_b: float
    gflop: float
    sheet_name: str
    sheet_math_ms: float
    sheet_ratio: float
    meas_math_ms: float
    meas_ratio: float
    meas_bw_text: str
    run_label: str
    # the matrix-vector product
    mv_shape: str
    mv_mb: float
    mv_text: str
    # the sweep and its ridge
    flat_ms: float
    crossing: float  # where the matmuls' two lines cross (a batch; not the ridge)
    ridge_sheet: float
    flat_until: int
    b1_gpu_ms: float
    b1_wall_ms: float
    bmax: int
    bmax_tflops: float
    bmax_tokens: float
    b1_tokens: float
    param_prompt_len: int
    sweep_note: str
    steps_note: str
    context_note: str
    regime_rule: str
    regime_text: str
    ridge_pair: str
    irregular_text: str
    ridge_text: str
    pub_ridge: float
    pub_ridge_source: str
    b1_note: str
    # the sweep's numbers (sweep_numbers), prefixed s_
    s_kv_kb_per_token: float
    s_context: int
    s_kv_b1_mb: float
    s_kv_bmax_gb: float
    s_kv_share_bmax: float
    s_bytes_bmax_gb: float
    s_weights_gb: float
    s_attn_fpb: float
    s_attn_tbs_bmax: float
    s_attn_ms_bmax: float
    s_attn_of_sheet: float
    s_fpb_bmax: float
    s_cap: float
    s_mm_limit_ms: float
    s_mm_ceil_ms: float
    s_mm_b1_ms: float
    s_mm_b1_of_limit: float
    s_bmax_mfu: float
    s_bmax_of_gemm: float
    s_lim_b1: float
    s_lim_bmax: float
    s_gpu_b1: float
    s_gpu_bmax: float
    s_x_b1: float
    s_x_bmax: float
    s_other_b1: float
    s_other_bmax: float
    s_mm_bmax: float
    s_attn_b1_ms: float
    s_cat_gb_bmax: float
    # the takeaways and the exercises
    tk_cpu_x: float
    tk_tokens_x: float
    kv_ridge_batch: float
    tk_b1_busy: float
    # what the tables and the explorer show
    arithmetic_table: pd.DataFrame = field(metadata=NOT_GLUED)
    matvec_table: pd.DataFrame = field(metadata=NOT_GLUED)
    bytes_table: pd.DataFrame = field(metadata=NOT_GLUED)
    ridge_table: pd.DataFrame = field(metadata=NOT_GLUED)
    sweep_table: pd.DataFrame = field(metadata=NOT_GLUED)
    sweep_panels: dict = field(metadata=NOT_GLUED)  # one HTML panel per batch size, for glue.html_explorer


def glue_shared(run: runs.Run) -> dict[str, shared.Value]:
    """Glue the quantities several pages show, and return them: this page owns the ceilings and the
    floor (from `run`); the eager step comes from the published run of "The kernels in one token",
    the compiled steps from "Launch overhead". Where another owner's published run is missing (a bare
    checkout), this page's own are glued and the others shown as a dash."""
    try:
        return shared.glue_values(given={CHAPTER: run})
    except runs.RunError:
        values = {
            name: shared.Value(shared.QUANTITIES[name], value, run)
            for name, value in shared.owner_values(CHAPTER, run).items()
        }
        for name in shared.QUANTITIES:
            glue.glue(name, shared.Shown(values[name].text if name in values else "–"))
        for owner in shared.OWNERS:
            glue.glue(f"shared_run_{owner.replace('-', '_')}", shared.Shown(run.run_id if owner == CHAPTER else "–"))
        return values


def published_prefill() -> runs.Run | None:
    """The published run of "Prompt phase vs decode phase" (its cuBLAS split-K kernels), or None
    where there is none: the text then says what this run cannot tell."""
    try:
        return runs.load_run(PREFILL_CHAPTER)
    except runs.RunError:
        return None


def steps_note(run: runs.Run) -> str:
    """How each timed step saw its context."""
    if not interleaved(run):
        return (
            "In this run (the old method) the steps of each batch size followed one another on one cache, so the "
            f"context grew by a few tokens over the {run.parameters.get('steps', 'few')} timed steps."
        )
    if run.results.get("sweep_setup") == SETUP_COPY:
        return (
            "Every step was timed on a fresh copy of the cache one prefill of its batch left, so each saw the same "
            "context."
        )
    if run.results.get("sweep_setup") == SETUP_ROWS:
        return (
            "Every step was timed on a fresh copy of the first rows (one per sequence of its batch) of the cache "
            "one prefill of the largest batch left, so each saw the same context."
        )
    return "Every step was timed after a fresh prefill, so each saw the same context."


def batch1_note(run: runs.Run, eager: dict | None) -> str:
    """The sweep's own batch-1 step beside the shared eager step (`eager`: its quantities, or None
    where its run is not available)."""
    if eager is None:
        return "the shared eager step's run is not available here, so this page cannot set it beside it."
    check = batch1_check(run, eager["eager_wall_ms"])
    if check is None:
        return "this sweep has no batch 1."
    if interleaved(run):
        return f"{check.sweep_ms:.1f} ms (the minimum of {check.trials}), {check.off:.0%} from the eager step" + (
            "." if check.agrees else f", more than {AGREEMENT:.0%}."
        )
    return (
        f"{check.sweep_ms:.1f} ms, {check.ratio:.1f} times the eager step, measured the old way (back to back on one "
        "growing cache, as the section on the sweep says): read the sweep's wall times, and its tokens per "
        "second at small batches, as the old method's."
    )


def sweep_panels(run: runs.Run) -> dict:
    """The explorer's text for each batch size of the sweep (the live notebook's ipywidgets explorer
    shows the same), keyed by batch size."""
    return {
        batch: (
            f"<b>batch {batch}</b>: GPU time {row['GPU ms']:.2f} ms per step, wall {row['wall ms']:.2f} ms (minimum); "
            f"{row['tokens/s']:,.0f} tokens/s (GPU alone could do {row['GPU tokens/s']:,.0f}); "
            f"weights+KV read at {row['TB/s']:.2f} TB/s; matmuls at {row['matmul TFLOP/s']:.0f} TFLOP/s; "
            f"{row.regime} (the GPU alone: {row['GPU regime']})"
        )
        for batch, row in sweep(run).set_index("batch").iterrows()
    }


def page(run: runs.Run, shared_values: dict[str, shared.Value], prefill: runs.Run | None) -> Page:
    """The page of `run`: `shared_values` are the shared quantities (glue_shared), `prefill` the
    published run of "Prompt phase vs decode phase" or None (published_prefill)."""
    nan = float("nan")
    model_counts, the_ridge = counts(run), ridge(run)
    sheet_row, measured_row = arithmetic_rows(run)
    products, product = matvec(run), matvec_summary(run)
    steps = sweep(run)
    first, last = smallest(steps), largest(steps)  # the rows of the smallest and the largest batch
    eager = {name: shared_values[name].value for name in EAGER} if all(n in shared_values for n in EAGER) else None
    eager_run = shared_values["eager_wall_ms"].run.run_id if eager else None
    cpu_float32 = products[(products.dtype == "float32") & ~products.device.str.contains("NVIDIA")]
    gpu_per_call = products[products.timing.str.startswith("per call")]
    datasheet = hardware.datasheet_or_none(run.provenance["gpu"])
    return Page(
        weights_b=model_counts.matmul_weight_parameters / 1e9,
        gflop=model_counts.decode_flops / 1e9,
        sheet_name=ceilings_label(run, DATASHEET),
        sheet_math_ms=sheet_row["math ms"],
        sheet_ratio=sheet_row["memory / math"],
        meas_math_ms=measured_row["math ms"],
        meas_ratio=measured_row["memory / math"],
        meas_bw_text=memory_ceiling_text(run),
        run_label=run.cited,
        mv_shape=product.shape,
        mv_mb=product.mb,
        mv_text=matvec_text(run),
        flat_ms=the_ridge.flat_ms,
        crossing=the_ridge.measured_batch,
        ridge_sheet=the_ridge.datasheet_batch or nan,
        flat_until=the_ridge.flat_until,
        b1_gpu_ms=first["GPU ms"],
        b1_wall_ms=first["wall ms"],
        bmax=int(last.batch),
        bmax_tflops=last["matmul TFLOP/s"],
        bmax_tokens=last["tokens/s"],
        b1_tokens=first["tokens/s"],
        param_prompt_len=run.parameters["prompt_len"],
        sweep_note=sweep_note(run, eager, eager_run),  # the sweep's batch-1 step beside the shared eager step
        steps_note=steps_note(run),
        context_note=context_note(run),
        regime_rule=REGIME_RULE,
        regime_text=regime_text(run),
        ridge_pair=ridge_pair_text(run),
        irregular_text=irregular_text(run, split_k_evidence(prefill)),
        ridge_text=ridge_text(run),
        pub_ridge=PUBLISHED_H100_RIDGE_REQUESTS,
        pub_ridge_source=PUBLISHED_H100_RIDGE_SOURCE,
        b1_note=batch1_note(run, eager),
        **{f"s_{name}": value for name, value in sweep_numbers(run).items()},
        tk_cpu_x=float(cpu_float32.ms_median.iloc[0] / gpu_per_call.ms_median.iloc[0]),
        tk_tokens_x=float(last["tokens/s"] / first["tokens/s"]),
        kv_ridge_batch=float(kv_ridge(run, datasheet).batch) if datasheet else nan,
        # batch 1 at the shared eager step (its wall time and GPU busy time), not this sweep's own trial
        tk_b1_busy=eager["eager_gpu_busy_ms"] / eager["eager_wall_ms"] if eager else nan,
        arithmetic_table=arithmetic_display(run).reset_index(),
        matvec_table=products.assign(us=products.ms_median * 1e3)[["device", "dtype", "timing", "us", "GB/s"]].rename(
            columns={"timing": "what is timed", "us": "µs (median)"}
        ),
        # the weights are the same at every batch (the prose gives their size): the table leaves them out
        bytes_table=bytes_display(run).drop(columns=["weights GB"]),
        ridge_table=ridge_display(run),
        # the kernels per step hardly change with the batch (the prose does not use them): left out
        sweep_table=sweep_display(run).drop(columns=["kernels"]),
        sweep_panels=sweep_panels(run),
    )
