"""The page of "A hybrid model's token": every number and short text its prose glues, computed from a
loaded run (page()); the paragraphs that exist only for some runs are prose.py's, the tables its cells
show tables.py's. The sentences stay in the notebook's markdown; only conditional fragments are made here."""

from __future__ import annotations

import dataclasses
from dataclasses import asdict, dataclass

import pandas as pd

from labsupport import runs
from labsupport.chapters import published
from labsupport.measure import hardware

from .analysis import (
    best_variant,
    cache_growth,
    census_by_group,
    census_by_kind,
    kernel_table,
    limits,
    lm_head,
    mixer_by_module,
    ok_variants,
    per_layer_type,
    prefill,
    prefill_flop,
    time_budget,
    timing_note,
    variants,
)
from .idle import (
    idle_summary,
)
from .measuring import MODES
from .prose import beside_published_texts, fla_section, graph_text, host_text, inside_graph_text, prefill_text

NAN = float("nan")


@dataclass
class Page:
    """What the page says: the model and its floor, the cache as the context grows, the eager reference
    step (ref_) and its layers (lin_ linear attention, full_ full attention), the LM head (head_), the
    fastest variant (best_) and where its idle time sits (idle_), the prompt phase, the published vLLM
    profile (p_) beside this run (bp_), and the answers of Try this (try_)."""

    run_label: str
    transformers_version: str
    torch_version: str
    # the model and the floor it sets
    params_b: float
    layers: int
    n_linear: int
    n_full: int
    decode_gb: float
    prompt_len: int
    sheet_tbs: float
    floor_ms_sheet: float
    measured_tbs: str  # the practical ceiling and the floor at it, or why there is none (text)
    floor_ms_measured: str
    measured_text: str
    # the cache as the context grows
    kv_per_token: float
    state_mb: float
    ctx_first: int
    ctx_last: int
    kv_mb_first: float
    kv_mb_last: float
    # the eager reference step
    ref_kernels: int
    ref_wall: float
    ref_wall_median: float
    ref_wall_q1: float
    ref_wall_q3: float
    ref_wall_max: float
    ref_busy: float
    ref_busy_pct: float
    ref_idle: float
    ref_limit: float
    ref_other_ms: float
    mm_gb: float
    mm_ms: float
    mm_tbs: float
    mm_sheet_pct: float
    mm_vs_ceiling: str  # "and 72% of the practical ceiling", or why there is none
    mm_note: str
    gemms: int
    splitk: int
    conv_kind_text: str
    lin_group_kernels: int
    lin_share: float
    lin_kernels: float
    full_kernels: float
    lin_mixer_kernels: float
    lin_mixer_us: float
    full_mixer_kernels: float
    full_mixer_us: float
    in_projs: int
    fla_section: str
    # the LM head
    head_rows: int
    head_cols: int
    head_gb: float
    head_ms: float
    head_tbs: float
    head_floor_ms: float
    head_largest: str
    head_note: str
    # every variant, and the fastest
    failed_text: str
    timing_note: str
    best: str
    best_wall: float
    best_tokens: float
    best_speedup: float
    best_limit: float
    best_kernels: int
    best_mm_ms: float
    best_other_ms: float
    best_idle_ms: float
    # where the fastest variant's idle time sits
    idle_variant: str
    idle_wall_ms: float
    idle_idle_ms: float
    idle_profiled_ms: float
    idle_profiled_idle_ms: float
    idle_before_first_ms: float
    idle_inside_graph_ms: float
    idle_host_estimate_ms: float
    idle_host_ms: float
    idle_graph_text: str
    idle_inside_text: str
    idle_host_text: str
    # the prompt phase
    ref_prefill_kernels: int
    ref_prefill_ms: float
    ref_prefill_median_ms: float
    ref_prefill_busy: float
    prefill_text: str
    # beside the published vLLM profile
    p_prefill_tokens: int
    p_decode_kernels: int
    p_decode_ms: float
    p_tokens_per_s: float
    p_launch_calls_with_graphs: int
    p_eager_kernels: int
    p_lm_head_ms: float
    p_prefill_ms: float
    p_gemms: int
    p_splitk: int
    p_recur: int
    p_recur_per_layer: float
    bp_gb: float
    bp_tflop: float
    bp_intro: str
    bp_text: str
    bp_gpus_text: str
    # Try this
    try_ctx_10x: int
    try_kv_10x_gb: float
    try_idle_answer: str


def page(run: runs.Run) -> Page:
    """The page of `run`."""
    numbers = {
        "run_label": run.cited,
        "transformers_version": run.provenance.get("transformers", "?"),
        "torch_version": run.provenance.get("torch", "?"),
        **_model(run),
        **_cache(run),
        **_reference(run),
        **_layers(run),
        **_lm_head(run),
        **_variants(run),
        **_idle(run),
        **_prompt(run),
        **_published(run),
        **_try_this(run),
    }
    return Page(**{f.name: numbers[f.name] for f in dataclasses.fields(Page)})


def _best(run: runs.Run) -> pd.Series:
    """The fastest variant that ran (its row of ok_variants)."""
    ran = ok_variants(run)
    return ran.loc[ran["wall ms"].idxmin()]


# Where the run of *Why a GPU* was recorded on another GPU (or is not there), its ceiling says
# nothing of this one: the page sets the step against the datasheet alone (shared.limits_for).
NO_CEILING = (
    "No practical ceiling was measured on this GPU (the run of *Why a GPU* that this page reads, where there is "
    "one, was recorded on another GPU), so the step is set against the datasheet alone."
)


def _reference_row(run: runs.Run) -> pd.Series:
    """The eager step with transformers' own Gated DeltaNet code."""
    return ok_variants(run).set_index(["backend", "mode"]).loc[("reference", "eager")]


def _model(run: runs.Run) -> dict:
    """The model, and the floor its weights set at the datasheet's and the practical ceiling's bandwidth."""
    model, lim = run.results["model"], limits(run)
    sheet_tbs, measured_tbs = lim.datasheet_tbs or NAN, lim.ceiling_tbs or NAN
    return {
        "params_b": model["parameters"] / 1e9,
        "layers": model["layers"],
        "n_linear": model["layer_types"].count("linear_attention"),
        "n_full": model["layer_types"].count("full_attention"),
        "decode_gb": model["decode_bytes"] / 1e9,
        "prompt_len": run.parameters["prompt_len"],
        "sheet_tbs": sheet_tbs,
        "floor_ms_sheet": model["decode_bytes"] / 1e9 / sheet_tbs,
        "measured_tbs": "none on this GPU" if measured_tbs != measured_tbs else f"{measured_tbs:.2f} TB/s",
        "floor_ms_measured": "–"
        if measured_tbs != measured_tbs
        else f"{model['decode_bytes'] / 1e9 / measured_tbs:.2f} ms",
        # weight reads are compared with the practical ceiling of the run of "Why a GPU" (shared.limits_for)
        "measured_text": NO_CEILING
        if measured_tbs != measured_tbs
        else "The practical ceiling is the best rate at which any kernel read this GPU's memory in that run, "
        "never a copy's: a decode step reads its weights and writes next to nothing.",
    }


def _cache(run: runs.Run) -> dict:
    """The cache after the shortest and the longest context measured."""
    growth = cache_growth(run)
    by_context = growth.set_index("context")
    first, last = growth.context.min(), growth.context.max()
    return {
        "kv_per_token": by_context.loc[last, "KV bytes per token"],
        "state_mb": by_context.loc[last, "linear-attention state MB"],
        "ctx_first": first,
        "ctx_last": last,
        "kv_mb_first": by_context.loc[first, "full-attention KV cache MB"],
        "kv_mb_last": by_context.loc[last, "full-attention KV cache MB"],
    }


def _reference(run: runs.Run) -> dict:
    """The eager reference step: its time, its matrix multiplies' reads, and its kernels by kind."""
    ref, lim = _reference_row(run), limits(run)
    budget = time_budget(run).set_index(["backend", "mode"]).loc[("reference", "eager")]
    by_kind = census_by_kind(run)
    convolutions = by_kind.loc["convolution", ("reference", "kernels")] if "convolution" in by_kind.index else 0
    return {
        "ref_kernels": ref.kernels,
        "ref_wall": ref["wall ms"],
        "ref_wall_median": ref["wall median ms"],
        "ref_wall_q1": ref["wall q1 ms"],
        "ref_wall_q3": ref["wall q3 ms"],
        "ref_wall_max": ref["wall max ms"],
        "ref_busy": ref["GPU busy ms"],
        "ref_busy_pct": ref["GPU busy ms"] / ref["wall ms"],
        "ref_idle": ref["wall ms"] - ref["GPU busy ms"],
        "ref_limit": ref["of datasheet limit"],
        "ref_other_ms": budget["other kernels ms"],
        "mm_gb": run.results["model"]["matmul_bytes"] / 1e9,
        "mm_ms": budget["matrix multiplies ms"],
        "mm_tbs": budget["matmul TB/s"],
        "mm_sheet_pct": budget["matmul TB/s"] / (lim.datasheet_tbs or NAN),
        "mm_vs_ceiling": f"and {budget['matmul TB/s'] / lim.ceiling_tbs:.0%} of the practical ceiling"
        if lim.ceiling_tbs
        else "(no practical ceiling was measured on this GPU)",
        "mm_note": hardware.above_ceiling_note(f"Their {budget['matmul TB/s']:.2f} TB/s", budget["matmul TB/s"], lim),
        "gemms": int(budget["GEMM kernels"]),
        "splitk": int(budget["split-K reduce kernels"]),
        "conv_kind_text": "The short convolution of each Gated DeltaNet layer has a kind of its own, "
        f"*convolution* ({convolutions:,.0f} kernels in the reference step)."
        if convolutions
        else "",
    }


def _layers(run: runs.Run) -> dict:
    """One layer of each type in the reference step, and the token mixer with flash-linear-attention."""
    ref_kernels = kernel_table(run, "reference", "eager")
    groups = census_by_group(ref_kernels)
    types = per_layer_type(ref_kernels).set_index("layer type")
    linear, full = types.loc["linear attention"], types.loc["full attention"]
    return {
        "lin_group_kernels": groups.loc["linear attention (Gated DeltaNet)", "kernels"],
        "lin_share": groups.loc["linear attention (Gated DeltaNet)", "share"],
        "lin_kernels": linear["kernels per layer"],
        "full_kernels": full["kernels per layer"],
        "lin_mixer_kernels": linear["mixer kernels"],
        "lin_mixer_us": linear["mixer µs"],
        "full_mixer_kernels": full["mixer kernels"],
        "full_mixer_us": full["mixer µs"],
        "in_projs": int(sum(str(module).startswith("in_proj") for module in mixer_by_module(run).index)),
        "fla_section": fla_section(run, linear),
    }


def _lm_head(run: runs.Run) -> dict:
    """The last matrix multiply, one row per vocabulary entry."""
    head, model = lm_head(run, "reference"), run.results["model"]
    return {
        "head_rows": head.rows,
        "head_cols": model["lm_head_bytes"] // (head.rows * model["bytes_per_parameter"]),
        "head_gb": head.gb,
        "head_ms": head.ms,
        "head_tbs": head.tbs,
        "head_floor_ms": head.floor_ms_datasheet if head.floor_ms_datasheet else NAN,
        "head_largest": "is the longest kernel of the whole step"
        if head.is_largest
        else "is not the longest kernel of this step (the table shows which is)",
        "head_note": hardware.above_ceiling_note(f"The LM head's {head.tbs:.2f} TB/s", head.tbs, limits(run)),
    }


def _variants(run: runs.Run) -> dict:
    """Every backend and mode: which did not run, how the wall times were taken, and the fastest."""
    best, ref = _best(run), _reference_row(run)
    budget = time_budget(run).set_index(["backend", "mode"]).loc[(best.backend, best["mode"])]
    failed = variants(run).query("status != 'ok'")
    return {
        "failed_text": "Every backend and mode ran."
        if failed.empty
        else "Not everything ran; each row that did not says why in its *status*.",
        "timing_note": timing_note(run),
        "best": f"{best.backend}; {MODES[best['mode']]}",
        "best_wall": best["wall ms"],
        "best_tokens": best["tokens/s"],
        "best_speedup": ref["wall ms"] / best["wall ms"],
        "best_limit": best["of datasheet limit"],
        "best_kernels": best.kernels,
        "best_mm_ms": budget["matrix multiplies ms"],
        "best_other_ms": budget["other kernels ms"],
        "best_idle_ms": budget["GPU idle ms"],
    }


def _idle(run: runs.Run) -> dict:
    """Where the fastest variant's idle time sits: its timed and profiled idle, and the texts on its graph,
    the gaps inside it and the host's calls before its first kernel."""
    backend, mode = best_variant(run)
    idle = idle_summary(run, backend, mode)
    return {
        **{f"idle_{name}": value for name, value in asdict(idle).items()},
        "idle_host_ms": idle.before_first_ms + idle.between_launches_ms + idle.after_last_ms,
        "idle_variant": f"{backend}; {MODES[mode]}",
        "idle_graph_text": graph_text(idle),
        "idle_inside_text": inside_graph_text(run, backend, idle),
        "idle_host_text": host_text(run, backend, mode),
    }


def _prompt(run: runs.Run) -> dict:
    """The prompt phase with the reference code, and the host against the device for each backend."""
    by_backend = prefill(run).set_index("backend")
    has_ref = "reference" in by_backend.index
    return {
        "ref_prefill_ms": by_backend.loc["reference", "wall ms"] if has_ref else NAN,
        "ref_prefill_median_ms": by_backend.loc["reference", "wall median ms"] if has_ref else NAN,
        "ref_prefill_kernels": by_backend.loc["reference", "kernels"] if has_ref else NAN,
        "ref_prefill_busy": by_backend.loc["reference", "GPU busy ms"] if has_ref else NAN,
        "prefill_text": prefill_text(run),
    }


def _published(run: runs.Run) -> dict:
    """The published vLLM profile (p_) and this run beside it (bp_)."""
    headline, model = published.HYBRID_27B_VLLM_HEADLINE, run.results["model"]
    counts = published.HYBRID_27B_VLLM_DECODE.set_index("kernels doing").kernels
    recurrence = counts["linear-attention recurrence and conv"]
    return {
        **{f"p_{name}": value for name, value in headline.items()},
        "p_gemms": int(counts["GEMMs"]),
        "p_splitk": int(counts["split-K reduce"]),
        "p_recur": int(recurrence),
        "p_recur_per_layer": recurrence / model["layer_types"].count("linear_attention"),
        "bp_gb": model["decode_bytes"] / 1e9,
        "bp_tflop": prefill_flop(run, headline["prefill_tokens"]) / 1e12,
        **beside_published_texts(run, _best(run).backend),
    }


def _try_this(run: runs.Run) -> dict:
    """The answers of Try this: the cache at ten times the longest context, and the idlest variants."""
    growth = cache_growth(run).set_index("context")
    last = growth.index.max()
    ran = ok_variants(run)
    by_idle = ran.assign(idle_share=1 - ran["GPU busy ms"] / ran["wall ms"]).sort_values("idle_share")
    least, most = by_idle.iloc[0], by_idle.iloc[-1]
    return {
        "try_ctx_10x": int(10 * last),
        "try_kv_10x_gb": 10 * last * growth.loc[last, "KV bytes per token"] / 1e9,
        "try_idle_answer": f"Most idle: {most.backend}, {MODES[most['mode']]} ({most.idle_share:.0%} of its wall "
        f"time); least: {least.backend}, {MODES[least['mode']]} ({least.idle_share:.0%}). "
        "The eager steps wait for the CPU's launches; a CUDA graph launches the whole step at once.",
    }
