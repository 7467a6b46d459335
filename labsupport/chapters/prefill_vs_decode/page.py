"""The page of "Prompt phase vs decode phase": every number and short text its prose glues,
computed from a loaded run (page()); the tables its cells show are tables.py's. The sentences stay
in the notebook's markdown; only conditional fragments are made here."""

from __future__ import annotations

import dataclasses
from dataclasses import asdict, dataclass

import pandas as pd

from labsupport import glue, runs
from labsupport.measure import harness

from .analysis import (
    bandwidth,
    crossover,
    layer_gemms,
    limits,
    phases,
    prefill_timing,
    prompt_sweep,
    shape,
)
from .ceilings import (
    ceiling_notes,
    gemm_points,
    none_as_nan,
    pass_points,
    ridge_text,
    ridges,
    roofline_clusters,
)
from .measuring import LM_HEAD


@dataclass
class Page:
    """What the page says: one prefill against one decode step (p_ and d_), the two yardsticks,
    the gate projection of one layer (gate_), the roofline's clusters (rd_ decode, rp_ prefill, w_
    the whole passes), the prompt sweep and its crossover (s_, x_), each GPU's ridge (r_) and the
    answers of Try this (try_)."""

    run_label: str
    param_prompt_len: int
    param_repeats: int
    # the two passes
    p_wall_ms: float
    d_wall_ms: float
    p_wall_q1_ms: float
    p_wall_q3_ms: float
    p_wall_median_ms: float
    p_wall_repeats: int
    d_wall_q1_ms: float
    d_wall_q3_ms: float
    d_wall_median_ms: float
    d_wall_repeats: int
    p_gpu_busy_ms: float
    d_gpu_busy_ms: float
    p_kernels: int
    d_kernels: int
    p_matmul_kernels: int
    d_matmul_kernels: int
    p_gflop: float
    d_gflop: float
    p_gb: float
    d_gb: float
    p_flop_per_byte: float
    d_flop_per_byte: float
    p_tflops: float
    d_tflops: float
    p_tflops_busy: float
    d_tflops_busy: float
    p_tbs: float
    d_tbs: float
    p_tbs_busy: float
    d_tbs_busy: float
    p_mfu_datasheet: float
    p_mfu_gemm: float
    d_mfu_datasheet: float
    d_mfu_gemm: float
    p_mfu_busy_datasheet: float
    p_mfu_busy_gemm: float
    d_mfu_busy_datasheet: float
    d_mfu_busy_gemm: float
    p_mbu_datasheet: float
    p_mbu_measured: float
    d_mbu_datasheet: float
    d_mbu_measured: float
    p_mbu_busy_datasheet: float
    p_mbu_busy_measured: float
    d_mbu_busy_datasheet: float
    d_mbu_busy_measured: float
    p_busy_frac: float
    d_busy_frac: float
    work_ratio: float
    busy_ratio: float
    time_ratio: float
    wall_host_text: str
    prefill_timing_note: str
    # the model and the limits
    weights_b: float
    lm_head_m: float
    layers: int
    heads: int
    head_dim: int
    kv_heads: int
    kv_kb: float
    ridge_sheet: float
    bw_tbs: float
    bw_name: str
    bw_short: str
    bw_sentence: str
    datasheet_name: str
    gemm_note: str
    bandwidth_note: str
    # one layer's gate projection
    layer: int
    gate_in: int
    gate_out: int
    gate_mb: float
    gate_rows: int
    gate_d_us: float
    gate_d_fpb: float
    gate_d_tbs: float
    gate_d_tflops: float
    gate_p_fpb: float
    gate_p_tflops: float
    gate_time_ratio: float
    # the roofline
    rd_fpb_max: float
    rd_tbs_min: float
    rd_tbs_max: float
    rd_of_datasheet_min: float
    rd_of_datasheet_max: float
    rd_matmul_share: float
    rd_slowest: str
    rd_fastest: str
    rd_others: str
    rp_fpb_min: float
    rp_fpb_max: float
    rp_tflops_min: float
    rp_tflops_max: float
    rp_of_datasheet_min: float
    rp_of_datasheet_max: float
    rp_matmul_share: float
    rp_slowest: str
    rp_fastest: str
    rp_others: str
    rp_lm_tbs: float
    w_d_of: float
    w_p_of: float
    # the prompt sweep
    sweep_status: str
    x_flat_until: int
    x_floor_ms: float
    x_measured_tokens: float
    x_datasheet_tokens: float
    x_measured_ridge_tokens: float
    x_saturates_at: int
    x_best_matmul_tflops: float
    s_floor_per_token_us: float
    s_first_len: int
    s_first_us: float
    s_last_len: int
    s_last_us: float
    s_last_tokens_s: float
    s_last_tflops: float
    s_last_mm_share: float
    s_last_attn_share: float
    s_host_text: str
    s_bound_text: str
    # each GPU's ridge
    ridge_text: str
    r_cross_over: float
    r_other_gpu: str
    r_other_over_own: float
    r_other_ridge: float
    # Try this
    try_floor_x_wall: float
    try_floor_x_busy: float
    try_us_target: float
    try_sweep_answer: str


def page(run: runs.Run, shared_values: dict | None = None) -> Page:
    """The page of `run`. `shared_values`: the book's shared quantities (shared.glue_values(), which
    glues them too); read from the published runs when not given."""
    from labsupport.chapters import shared

    floor_ms = (shared_values or shared.values())["floor_ms"].value  # the step's bytes over the datasheet bandwidth
    sweep = prompt_sweep(run)
    numbers = {
        "run_label": run.cited,
        **{f"param_{k}": v for k, v in run.parameters.items() if isinstance(v, int)},
        **_passes(run),
        **_limits(run),
        **_gate(run),
        **_roofline(run),
        **_sweep(run, sweep),
        **_ridges(run),
        **_try_this(run, sweep, floor_ms),
    }
    return Page(**{f.name: numbers[f.name] for f in dataclasses.fields(Page)})


def _prefixed(prefix: str, record) -> dict:
    """A record's fields under `prefix`, None as NaN (a limit this run does not know)."""
    return {f"{prefix}{k}": none_as_nan(v) for k, v in asdict(record).items()}


def _passes(run: runs.Run) -> dict:
    """One prefill against one decode step: their numbers, ratios, and where their wall times come from."""
    passes = phases(run)
    prefill, decode = passes["prefill"], passes["decode"]
    return {
        **_prefixed("p_", prefill),
        **_prefixed("d_", decode),
        "p_gflop": prefill.flops / 1e9,
        "d_gflop": decode.flops / 1e9,
        "p_gb": prefill.bytes / 1e9,
        "d_gb": decode.bytes / 1e9,
        "work_ratio": prefill.flops / decode.flops,
        "time_ratio": prefill.wall_ms / decode.wall_ms,
        "busy_ratio": prefill.gpu_busy_ms / decode.gpu_busy_ms,
        "p_busy_frac": prefill.gpu_busy_ms / prefill.wall_ms,
        "d_busy_frac": decode.gpu_busy_ms / decode.wall_ms,
        "wall_host_text": wall_host_text(run),
        "prefill_timing_note": prefill_timing_note(run),
    }


def wall_host_text(run: runs.Run) -> str:
    """Which host the wall times of the phase table come from: the trials the estimator rests on,
    and the host probe's readings while they were taken."""
    times = run.table("phase_times")
    decode = harness.table_estimate(times[times["phase"] == "decode"])
    if decode.basis != harness.ESTIMATOR:
        return (
            f"These wall times are the minimum of each pass's {decode.of} trials: the run was recorded before each "
            "trial carried a host-probe reading, so which speed of the host they come from is known only from "
            "the probe's readings around them (listed with the run's files below)."
        )
    return (
        f"These wall times are the median of the trials taken while the host probe read within "
        f"{harness.FAST_HOST - 1:.0%} of its best reading in the run, {decode.best_probe_ms:.2f} ms ({decode.trials} "
        f"of the decode step's {decode.of} trials): the host at its fast speed, as in the other chapters' wall times."
    )


def prefill_timing_note(run: runs.Run) -> str:
    """Whether the phase table and the prompt sweep show one timing of the prefill (runs since the
    chapter timed each configuration once) or two."""
    timing = prefill_timing(run)
    if timing.shared:
        return (
            f"The prefill's wall time is one measurement ({timing.phase_repeats} timed prefills): the prompt-length "
            f"sweep below shows the same one in its {timing.prompt_len:,}-token row."
        )
    if timing.sweep_ms is not None:
        return (
            "This run was recorded before the chapter timed each configuration once: it timed the "
            f"{timing.prompt_len:,}-token prefill in two separate passes of the same process, {timing.phase_ms:.2f} "
            f"ms (minimum) in the table below and {timing.sweep_ms:.2f} ms in the prompt-length sweep further down. "
            "Runs recorded since time it once, and both places show that one number."
        )
    return f"(The prompt-length sweep below has no {timing.prompt_len:,}-token row.)"


def _limits(run: runs.Run) -> dict:
    """The model's shape behind the counts, and the limits every rate is set against."""
    model, lim = shape(run), limits(run)
    measured = bandwidth(lim)
    notes = ceiling_notes(run)
    return {
        "weights_b": model.matmul_parameters / 1e9,
        "lm_head_m": model.lm_head_parameters / 1e6,
        "layers": model.layers,
        "heads": model.heads,
        "head_dim": model.head_dim,
        "kv_heads": model.kv_heads,
        "kv_kb": model.kv_bytes_per_token / 1e3,
        "ridge_sheet": none_as_nan(lim.datasheet_ridge),
        "bw_tbs": none_as_nan(measured.tbs),
        "bw_name": measured.name,
        "bw_short": measured.short,
        "bw_sentence": f"the practical ceiling ({lim.ceiling_tbs:.2f} TB/s: the best rate at which any kernel read "
        "this GPU's memory, never a copy's)"
        if lim.ceiling_tbs
        else "no bandwidth (this run measured no ceilings)",
        "datasheet_name": f"{lim.datasheet_name} datasheet"
        if lim.datasheet_name
        else "no datasheet known for this GPU",
        "gemm_note": notes["gemm"],
        "bandwidth_note": notes["bandwidth"],
    }


def _gate(run: runs.Run) -> dict:
    """The MLP's gate projection of the compared layer, in both phases."""
    gate = layer_gemms(run)
    gate = gate[gate.module == "mlp.gate_proj"].set_index("phase")
    decode, prefill = gate.loc["decode"], gate.loc["prefill"]
    return {
        "layer": int(run.results["gemm_layer"]),
        "gate_in": int(decode["in"]),
        "gate_out": int(decode["out"]),
        "gate_mb": decode["in"] * decode["out"] * shape(run).bytes_per_value / 1e6,
        "gate_rows": int(prefill["rows"]),
        "gate_d_us": decode["dur_ns"] / 1e3,
        "gate_d_fpb": decode["flop_per_byte"],
        "gate_d_tbs": decode["tbs"],
        "gate_d_tflops": decode["tflops"],
        "gate_p_fpb": prefill["flop_per_byte"],
        "gate_p_tflops": prefill["tflops"],
        "gate_time_ratio": prefill["dur_ns"] / decode["dur_ns"],
    }


def _roofline(run: runs.Run) -> dict:
    """Every matrix multiply of both passes on the roofline, by cluster (rd_, rp_), and the whole passes (w_)."""
    clusters, whole = roofline_clusters(run), pass_points(run).set_index("phase")
    numbers = {}
    for phase, key in (("decode", "rd"), ("prefill", "rp")):
        cluster = clusters[phase]
        numbers |= _prefixed(f"{key}_", cluster)
        numbers |= {f"{key}_slowest": f"`{cluster.slowest}`" if cluster.slowest else "(none)"}
        numbers |= {f"{key}_fastest": f"`{cluster.fastest}`" if cluster.fastest else "(none)"}
        numbers |= {f"{key}_others": cluster.others or "none"}
        numbers[f"w_{key[1]}_of"] = whole.loc[phase, "tflops"] / whole.loc[phase, "roof_datasheet"]
    heads = gemm_points(run)
    heads = heads[heads.phase == "prefill"].set_index("module")
    numbers["rp_lm_tbs"] = float(heads.loc[LM_HEAD, "tbs"]) if LM_HEAD in heads.index else float("nan")
    return numbers


def _sweep(run: runs.Run, sweep: pd.DataFrame) -> dict:
    """The prompt sweep: the crossover (x_), the shortest and longest prompts (s_), and up to where
    the launches set the prefill's wall time."""
    cross = crossover(run)
    by_len = sweep.set_index("prompt_len")
    first, last = by_len.loc[by_len.index.min()], by_len.loc[by_len.index.max()]
    failed = run.table("prompt_sweep").query("status != 'ok'")
    return {
        **_prefixed("x_", cross),
        "sweep_status": glue.failures_text(
            [f"{row.prompt_len} tokens: {row.status}" for row in failed.itertuples()],
            "Every prompt length ran.",
            "Not every prompt length ran",
        ),
        "s_first_len": int(first.name),
        "s_last_len": int(last.name),
        "s_first_us": first["ms per token"] * 1e3,
        "s_last_us": last["ms per token"] * 1e3,
        "s_last_tokens_s": last["tokens/s"],
        "s_last_tflops": last["TFLOP/s"],
        "s_last_mm_share": last.matmul_ns / last.kernel_ns,
        "s_last_attn_share": last.attention_ns / last.kernel_ns,
        "s_floor_per_token_us": cross.ms_per_token * 1e3,
        **_launch_bound(by_len),
    }


def _launch_bound(by_len: pd.DataFrame) -> dict:
    """The prompt lengths whose GPU sat idle more than a fifth of the wall time: the launches set their time."""
    host = by_len[by_len["GPU ms"] / by_len["wall ms"] < 0.8]
    if len(host) < 2:
        return {
            "s_host_text": "At every length of the sweep the GPU was busy for most of the wall time.",
            "s_bound_text": "at every length measured here, the GPU was busy most of the wall time",
        }
    slow, fast = int(host["wall ms"].idxmax()), int(host["wall ms"].idxmin())
    return {
        "s_host_text": f"Up to {host.index.max():,d} tokens the prefill's wall time does not follow its work: the "
        f"GPU was busy {host['GPU ms'].min():.2f} to {host['GPU ms'].max():.2f} ms, growing with the prompt, while the "
        f"wall time stayed between {host['wall ms'].min():.2f} and {host['wall ms'].max():.2f} ms (the book's "
        f"estimator for each length), the time the CPU takes to launch the {host.kernels.min():,d} to "
        f"{host.kernels.max():,d} kernels one by one. At those lengths the prefill is bound by the launches, like the "
        f"decode step, and the differences between their wall times (here a {slow:,d}-token prompt took "
        f"{host.loc[slow, 'wall ms']:.2f} ms, a {fast:,d}-token one {host.loc[fast, 'wall ms']:.2f} ms) are the "
        "host's, not the GPU's work. From there on the GPU's work sets the time.",
        "s_bound_text": f"launch-bound up to {host.index.max():,d} tokens here",
    }


def _ridges(run: runs.Run) -> dict:
    """This GPU's datasheet ridge against another GPU's."""
    every = ridges(run)
    own = next((r for r in every if r.this_gpu and r.limits == "datasheet"), None)
    other = next((r for r in every if not r.this_gpu), None)
    return {
        "ridge_text": ridge_text(run),
        "r_cross_over": none_as_nan(own and own.crossover_over_ridge),
        "r_other_gpu": other.gpu if other else "another GPU",
        "r_other_ridge": none_as_nan(other and other.ridge),
        "r_other_over_own": other.ridge / own.ridge if own and other else float("nan"),
    }


def _try_this(run: runs.Run, sweep: pd.DataFrame, floor_ms: float) -> dict:
    """The answers of Try this: the decode step against the book's floor, and the cheapest prompts per token."""
    decode = phases(run)["decode"]
    us_per_token = (sweep["wall ms"] * 1e3 / sweep.prompt_len)[sweep.status == "ok"]
    target = 2 * us_per_token.min()  # twice the cheapest per-token cost of the sweep
    cheap = sweep.prompt_len[us_per_token.index][us_per_token < target]
    where = "above" if not cheap.empty and cheap.min() > crossover(run).measured_tokens else "below"
    return {
        "try_floor_x_wall": decode.wall_ms / floor_ms,
        "try_floor_x_busy": decode.gpu_busy_ms / floor_ms,
        "try_us_target": target,
        "try_sweep_answer": "No prompt length of the sweep got there."
        if cheap.empty
        else f"{cheap.min():,d} tokens ({us_per_token[cheap.idxmin()]:.1f} µs per token): {where} the crossover. "
        "Per-token cost falls fastest while the prefill is memory-bound, where extra tokens ride along with the "
        "weights already being read; past the crossover it levels off.",
    }
