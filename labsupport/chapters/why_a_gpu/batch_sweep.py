"""The batch sweep: each step's bytes (weights and KV cache), operations, rates and limits;
the ridge point of its matrix multiplies; the numbers and sentences the chapter quotes."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from labsupport import runs
from labsupport.measure import hardware
from labsupport.measure.models import source

from .measuring import DECODE_WARMUP, SETUP_COPY, SETUP_ROWS, SWEEP_METHOD
from .one_token import counts, practical_ceiling_tbs

# The three regimes of a decode step, and the rule that puts each batch size in one (regimes).
OVERHEAD, MEMORY, COMPUTE = "overhead-bound", "memory-bound", "compute-bound"
OVERHEAD_BUSY = 0.5  # the GPU busy for less than this share of the wall time: the host sets the time
FLAT_TOLERANCE = 1.25  # matmul time within this factor of its flat time: still waiting on memory
REGIME_RULE = (
    f"overhead-bound where the GPU was busy for less than {OVERHEAD_BUSY:.0%} of the step's wall time (the "
    "host launching kernels set the time); otherwise compute-bound where the matrix multiplies took more than "
    f"{FLAT_TOLERANCE:g} times their flat time (their median at batches up to 8), and memory-bound where they did not"
)
AGREEMENT = 0.10  # the sweep's batch-1 step and the shared eager step may differ by this much


def attention_flop_per_context_token(run: runs.Run) -> int:
    """Attention's operations for one new token, per token of context it attends to: the
    scores (Q·Kᵀ) and the weighted sum of the values, a multiply and an add each, for every
    query head of every layer (the model's configuration: its preset's, or its model folder's)."""
    s = source.run_shape(run)
    return 4 * s["num_attention_heads"] * s["head_dim"] * s["num_hidden_layers"]


def sweep(run: runs.Run) -> pd.DataFrame:
    """The batch sweep with the derived rates: per-step times, tokens/s, bytes and operations
    per step (weights and KV cache), bandwidth, FLOP/s, and the step's limits.

    A step must read every weight once (`weights bytes`) and each sequence's KV cache once
    (`KV bytes`: batch x context x bytes per cached token, at the context of the profiled step,
    whose GPU time this is; older runs recorded only the context after all steps, a few tokens
    more). Its operations are the matrix multiplies' (2 per weight per sequence) plus
    attention's (grows with the context). `memory limit ms` is the floor (the bytes at the
    datasheet's bandwidth: no kernel beats it); `limit ms` the roofline, the longer of the floor
    and the operations at the datasheet's math rate; `ceiling ms` the bytes at the practical
    ceiling (the best rate any kernel reached in the run). `wall ms` is the minimum of the timed
    steps (the book's estimator), `wall q1`/`wall q3` their quartiles (NaN in older runs), and
    `regime` where the step falls (regimes)."""
    s = run.table("batch_sweep")
    ok = s[s.status == "ok"].copy()
    c = counts(run)
    kv = run.results["kv_bytes_per_token"]
    lim = hardware.run_limits(run)
    ceil_tbs = practical_ceiling_tbs(run)
    nan = float("nan")
    ok["GPU ms"] = ok.gpu_busy_ns / 1e6
    ok["matmul ms"] = ok.matmul_ns / 1e6
    ok["attention ms"] = ok.attention_ns / 1e6
    ok["other ms"] = (ok.kernel_ns - ok.matmul_ns - ok.attention_ns) / 1e6
    ok["wall ms"] = ok.wall_ms_min
    ok["wall q1"] = ok.wall_ms_q1 if "wall_ms_q1" in ok else nan
    ok["wall q3"] = ok.wall_ms_q3 if "wall_ms_q3" in ok else nan
    ok["tokens/s"] = ok.batch / (ok["wall ms"] / 1e3)
    ok["GPU tokens/s"] = ok.batch / (ok["GPU ms"] / 1e3)
    ok["context"] = ok.context_profiled if "context_profiled" in ok else ok.context_end
    ok["weights bytes"] = c.decode_bytes
    ok["KV bytes"] = ok.batch * ok.context * kv
    ok["bytes"] = ok["weights bytes"] + ok["KV bytes"]
    ok["FLOP"] = ok.batch * (c.decode_flops + ok.context * attention_flop_per_context_token(run))
    ok["FLOP/byte"] = ok["FLOP"] / ok["bytes"]
    ok["TB/s"] = ok["bytes"] / (ok["GPU ms"] / 1e3) / 1e12
    ok["attention TB/s"] = ok["KV bytes"] / (ok["attention ms"] / 1e3) / 1e12
    ok["matmul TFLOP/s"] = c.decode_flops * ok.batch / (ok["matmul ms"] / 1e3) / 1e12
    # The whole step against its limits.
    ok["memory limit ms"] = ok["bytes"] / (lim.datasheet_tbs * 1e9) if lim.datasheet_tbs else nan
    ok["math limit ms"] = ok["FLOP"] / (lim.datasheet_tflops * 1e9) if lim.datasheet_tflops else nan
    ok["limit ms"] = ok[["memory limit ms", "math limit ms"]].max(axis=1, skipna=False)
    ok["ceiling ms"] = ok["bytes"] / (ceil_tbs * 1e9) if ceil_tbs else nan
    ok["of limit"] = ok["limit ms"] / ok["GPU ms"]
    # The matrix multiplies against theirs (the weight matrices' bytes; their operations).
    ok["matmul memory limit ms"] = c.matmul_bytes / (lim.datasheet_tbs * 1e9) if lim.datasheet_tbs else nan
    ok["matmul math limit ms"] = (
        ok.batch * c.decode_flops / (lim.datasheet_tflops * 1e9) if lim.datasheet_tflops else nan
    )
    ok["matmul ceiling ms"] = c.matmul_bytes / (ceil_tbs * 1e9) if ceil_tbs else nan
    ok["matmul GEMM ms"] = ok.batch * c.decode_flops / (lim.gemm_tflops * 1e9) if lim.gemm_tflops else nan
    ok["GPU busy / wall"] = ok["GPU ms"] / ok["wall ms"]
    ok["GPU regime"] = gpu_regimes(ok)
    ok["regime"] = regimes(ok)
    return ok


def flat_ms(s: pd.DataFrame) -> float:
    """The matrix multiplies' time while they wait on memory: their median at batches up to 8."""
    small = s[s.batch <= 8]["matmul ms"]
    return float(small.median()) if len(small) else float(s.loc[s.batch.idxmin(), "matmul ms"])


def gpu_regimes(s: pd.DataFrame) -> pd.Series:
    """What bounds the GPU's own time at each batch size: memory-bound while the matrix
    multiplies take their flat time (the weights' read), compute-bound once their time grows
    with the batch (more than FLAT_TOLERANCE times the flat time)."""
    grown = s["matmul ms"] > FLAT_TOLERANCE * flat_ms(s)
    return pd.Series([COMPUTE if g else MEMORY for g in grown], index=s.index, dtype=object)


def regimes(s: pd.DataFrame) -> pd.Series:
    """Where each batch size's step falls (REGIME_RULE): overhead-bound (the GPU idles most of the
    step: the host launching kernels sets the wall time), else the GPU's regime (gpu_regimes)."""
    busy = s["GPU ms"] / s["wall ms"]
    gpu = gpu_regimes(s)
    return pd.Series([OVERHEAD if b < OVERHEAD_BUSY else g for b, g in zip(busy, gpu, strict=True)], index=s.index)


def regime_batches(run: runs.Run, column: str = "regime") -> dict[str, list[int]]:
    """The batch sizes of the sweep in each regime (`column`: "regime", or "GPU regime" for the
    GPU's own time), an empty list where none falls."""
    s = sweep(run)
    return {name: [int(b) for b in s.batch[s[column] == name]] for name in (OVERHEAD, MEMORY, COMPUTE)}


def regime_text(run: runs.Run) -> str:
    """Which batch sizes fell in which regime, in words."""

    def span(bs: list[int]) -> str:
        if not bs:
            return "none"
        return (
            f"batch {bs[0]}"
            if len(bs) == 1
            else f"batches {bs[0]} to {bs[-1]}"
            if len(bs) > 2
            else (f"batches {bs[0]} and {bs[1]}")
        )

    whole = "; ".join(f"{name}, {span(bs)}" for name, bs in regime_batches(run).items() if bs)
    gpu = "; ".join(f"{name}, {span(bs)}" for name, bs in regime_batches(run, "GPU regime").items() if bs)
    return f"By wall time: {whole}. By the GPU's own time alone: {gpu}."


def smallest(s: pd.DataFrame) -> pd.Series:
    """The sweep's row at its smallest batch."""
    return s.set_index("batch", drop=False).loc[s.batch.min()]


def largest(s: pd.DataFrame) -> pd.Series:
    """The sweep's row at its largest batch."""
    return s.set_index("batch", drop=False).loc[s.batch.max()]


def wall_times_clean(run: runs.Run) -> bool:
    """Whether the sweep's wall times were taken before any profile in the process (older
    runs timed each batch size right after profiling it)."""
    s = sweep(run)
    return "wall_clean" in s and bool(s.wall_clean.astype(bool).all())


def sweep_display(run: runs.Run) -> pd.DataFrame:
    """The sweep as the chapter shows it: the wall time's minimum (the estimator), its quartiles
    where the run recorded them, its median; tokens per second at the minimum; the regime."""
    s = sweep(run)
    out = s[["batch", "kernels", "matmul ms", "matmul TFLOP/s", "GPU ms", "wall ms"]].copy()
    if s["wall q1"].notna().all():
        out["wall q1–q3"] = [f"{lo:.1f}–{hi:.1f}" for lo, hi in zip(s["wall q1"], s["wall q3"], strict=True)]
    out["wall median"] = s.wall_ms_median
    return pd.concat([out, s[["tokens/s", "GPU regime", "regime"]]], axis=1)


def bytes_display(run: runs.Run) -> pd.DataFrame:
    """What each step of the sweep must read (weights, KV cache), its operations per byte,
    and its GPU time against its limit."""
    s = sweep(run)
    return pd.DataFrame(
        {
            "batch": s.batch,
            "weights GB": s["weights bytes"] / 1e9,
            "KV cache GB": s["KV bytes"] / 1e9,
            "KV share": s["KV bytes"] / s["bytes"],
            "FLOP per byte": s["FLOP/byte"],
            "limit ms": s["limit ms"],
            "GPU busy ms": s["GPU ms"],
            "GPU busy / limit": s["GPU ms"] / s["limit ms"],
        }
    )


@dataclass
class Ridge:
    """Where the matrix multiplies turn from memory-bound to compute-bound."""

    flat_ms: float  # matmul time when memory-bound (median over batch <= 8)
    ms_per_sequence: float  # matmul time per sequence when compute-bound (largest batch)
    measured_batch: float  # the batch where the two lines cross
    datasheet_batch: float | None
    ceilings_batch: float  # the measured ridge: GEMM rate / the practical ceiling (hardware.Limits.measured_ridge)
    flat_until: int  # largest batch whose matmul time is within FLAT_TOLERANCE of the flat time


def ridge(run: runs.Run) -> Ridge:
    """Fit the two lines of a roofline to the matmul times of the sweep.

    For one token per sequence each weight (2 bytes) is used for 2·batch operations, so
    the arithmetic intensity is `batch` FLOP/byte and the ridge point in FLOP/byte is a
    batch size.
    """
    s = sweep(run)
    flat = flat_ms(s)
    big = largest(s)
    per_seq = float(big["matmul ms"] / big.batch)
    sheet = hardware.run_datasheet(run)  # at the run's dtype
    lim = hardware.run_limits(run)
    nan = float("nan")
    within = s[s["matmul ms"] <= FLAT_TOLERANCE * flat].batch
    return Ridge(
        flat_ms=flat,
        ms_per_sequence=per_seq,
        measured_batch=flat / per_seq,
        datasheet_batch=sheet.ridge_flop_per_byte if sheet else None,
        ceilings_batch=lim.measured_ridge or nan,
        flat_until=int(within.max()),
    )


def bound_at(run: runs.Run, batch: int) -> str:
    """The regime of the sweep's step at `batch` (regimes)."""
    return str(sweep(run).set_index("batch").loc[batch, "regime"])


def headline(run: runs.Run) -> dict:
    c, r = hardware.run_limits(run), ridge(run)  # a run without ceilings (a CPU): None
    nan = float("nan")
    return {
        "ceiling TB/s": c.ceiling_tbs or nan,
        "copy TB/s": c.copy_tbs or nan,
        "GEMM TFLOP/s": c.gemm_tflops or nan,
        "ridge batch": r.measured_batch,
    }


def interleaved(run: runs.Run) -> bool:
    """Whether the sweep's wall times were taken interleaved (every batch size in rounds, each step
    after a fresh prefill); older runs timed each batch size's steps back to back on one cache."""
    return run.results.get("sweep_method") == SWEEP_METHOD


@dataclass
class Batch1:
    """The sweep's batch-1 step beside the shared eager step (the same step: Qwen3-8B, batch 1,
    the same prompt length, dynamic cache), both by the minimum of their trials."""

    sweep_ms: float
    sweep_median_ms: float
    trials: int
    eager_ms: float

    @property
    def ratio(self) -> float:
        return self.sweep_ms / self.eager_ms

    @property
    def off(self) -> float:
        """How far apart, as a share of the eager step."""
        return abs(self.ratio - 1)

    @property
    def agrees(self) -> bool:
        return self.off <= AGREEMENT


def batch1_check(run: runs.Run, eager_ms: float) -> Batch1 | None:
    """The sweep's batch-1 step against the shared eager step's wall time (`eager_ms`: the
    quantity eager_wall_ms); None where the sweep has no batch 1."""
    s = sweep(run).set_index("batch")
    if 1 not in s.index:
        return None
    one = s.loc[1]
    return Batch1(float(one["wall ms"]), float(one.wall_ms_median), int(one.get("wall_repeats", 0) or 0), eager_ms)


def sweep_note(run: runs.Run, eager: dict | None = None, eager_run: str | None = None) -> str:
    """How the sweep's wall times were taken, and its batch-1 step beside the shared eager step.
    `eager`: the shared quantities' values (eager_wall_ms, eager_gpu_busy_ms, eager_kernels),
    `eager_run` the id of the run they come from."""
    s = sweep(run).set_index("batch")
    check = batch1_check(run, eager["eager_wall_ms"]) if eager else None
    where = f"*The kernels in one token* (run `{eager_run}`)" if eager_run else "*The kernels in one token*"
    if interleaved(run):
        rounds = int(s.wall_repeats.iloc[0]) if "wall_repeats" in s else 0
        setup = run.results.get("sweep_setup")
        copied = setup in (SETUP_COPY, SETUP_ROWS)
        each = {
            SETUP_COPY: "each step on a fresh copy of the cache that one prefill of that batch's prompts left (the "
            "same tensors, in the same layout, as a fresh prefill gives, so every step sees the same context)",
            SETUP_ROWS: "each step on a fresh copy of the first rows, one per sequence of its batch, of the cache "
            "that one prefill of the largest batch's prompts left (the caches of every batch size together do not "
            "fit this GPU's memory; the rows of a sequence are the tensors, in the layout, that a prefill of those "
            "prompts alone gives, so every step sees the same context)",
        }.get(setup, "each step after a fresh prefill of that batch's prompts (so every step sees the same context)")
        text = (
            f"The sweep's wall times were taken like the eager step of {where}: in each of {rounds} rounds one "
            f"step at every batch size, in an order that rotates from round to round, {each}, {DECODE_WARMUP} "
            "untimed steps per batch size first, all before the process's first profile. The table gives the "
            "minimum (the book's estimator), the quartiles and the median; the GPU times come from one step per "
            f"batch size profiled afterwards, {'on a copy of the same cache' if copied else 'after a fresh prefill'}."
        )
        if check:
            side = "above" if check.ratio >= 1 else "below"
            text += (
                f" Its batch-1 step took {check.sweep_ms:.1f} ms (the minimum of {check.trials}), "
                f"{check.off:.0%} {side} the eager step's {check.eager_ms:.1f} ms"
            )
            text += (
                "."
                if check.agrees
                else f": more than {AGREEMENT:.0%} apart. The two were timed in different processes, this one by "
                "its minimum among larger batches, that one by its fast-host median; each run's host-probe readings "
                "are in its results."
            )
        return text
    if not wall_times_clean(run):
        return (
            "This run's sweep was measured the old way: the wall times of each batch size were taken right after "
            "that batch size was profiled, in the same process, and a profile slows every later kernel launch (the "
            "methodology, under *Two instruments*): read its wall-time curve as an upper bound. The ridge point "
            "uses GPU times only."
        )
    n = int(s.wall_repeats.iloc[0]) if "wall_repeats" in s else 0
    text = (
        "This run's sweep was measured the old way, before the book timed host-bound steps interleaved: one batch "
        f"size after another, a fresh prefill, {DECODE_WARMUP} untimed steps, then {n} steps back to back on the "
        "same growing cache, all before the process's first profile."
    )
    if check and eager:
        busy, k1 = float(s.loc[1, "gpu_busy_ns"]) / 1e6, int(s.loc[1, "kernels"])
        lo, hi = float(s["wall ms"].min()), float(s["wall ms"].max())
        text += (
            f" Its batch-1 step took {check.sweep_ms:.1f} ms (the minimum of {n}; median "
            f"{check.sweep_median_ms:.1f}), {check.ratio:.1f} times the eager step's {check.eager_ms:.1f} ms in "
            f"{where}. The kernels were the same ({k1:,} against {int(eager['eager_kernels']):,}; the GPU busy for "
            f"{busy:.2f} ms against {eager['eager_gpu_busy_ms']:.2f}), so the GPU did the same work. Every "
            f"batch size took between {lo:.1f} and {hi:.1f} ms while the GPU's busy time grew from "
            f"{float(s['GPU ms'].min()):.2f} to {float(s['GPU ms'].max()):.2f} ms: the host issued each kernel in "
            f"about {check.sweep_ms * 1e3 / k1:.0f} µs against {check.eager_ms * 1e3 / eager['eager_kernels']:.0f} µs "
            "in the eager step. Those steps were the first decode steps of the process, run back to back on one "
            "growing cache with only a few before them, and nothing else was timed beside them to tell a slow "
            "method from a slow host: the book now times every batch size as it times the eager step, each step "
            "after a fresh prefill, in rounds. Read this run's wall times and tokens per second as the old "
            "method's; the ridge point uses GPU times only."
        )
    return text


def context_note(run: runs.Run) -> str:
    """Which context the KV cache is counted at."""
    s = sweep(run)
    ctx = int(largest(s).context)
    if "context_profiled" in s:
        return f"at the context of the profiled step, {ctx} tokens"
    return (
        f"at the context after the timed steps, {ctx} tokens (this run did not record the profiled step's own, "
        "a few tokens shorter)"
    )


def kv_cap(run: runs.Run) -> float:
    """The whole step's operations per byte at an unlimited batch, at the sweep's context."""
    c, kv = counts(run), run.results["kv_bytes_per_token"]
    ctx = int(largest(sweep(run)).context)
    return (c.decode_flops + attention_flop_per_context_token(run) * ctx) / (ctx * kv)


def sweep_numbers(run: runs.Run) -> dict:
    """The numbers the chapter's sweep sections quote (the smallest batch, `b1`, and the
    largest, `bmax`)."""
    s = sweep(run)
    lim = hardware.run_limits(run)
    kv = run.results["kv_bytes_per_token"]
    one, big = smallest(s), largest(s)
    nan = float("nan")
    return {
        "kv_kb_per_token": kv / 1e3,
        "context": int(big.context),
        "kv_b1_mb": one["KV bytes"] / 1e6,
        "kv_bmax_gb": big["KV bytes"] / 1e9,
        "kv_share_bmax": big["KV bytes"] / big["bytes"],
        "bytes_bmax_gb": big["bytes"] / 1e9,
        "weights_gb": big["weights bytes"] / 1e9,
        "attn_fpb": attention_flop_per_context_token(run) / kv,
        "attn_tbs_bmax": big["attention TB/s"],
        "attn_ms_bmax": big["attention ms"],
        "attn_of_sheet": big["attention TB/s"] / lim.datasheet_tbs if lim.datasheet_tbs else nan,
        "fpb_bmax": big["FLOP/byte"],
        "cap": kv_cap(run),
        "mm_limit_ms": one["matmul memory limit ms"],
        "mm_ceil_ms": one["matmul ceiling ms"],
        "mm_b1_ms": one["matmul ms"],
        "mm_b1_of_limit": one["matmul memory limit ms"] / one["matmul ms"],
        "bmax_mfu": big["matmul TFLOP/s"] / lim.datasheet_tflops if lim.datasheet_tflops else nan,
        "bmax_of_gemm": big["matmul TFLOP/s"] / lim.gemm_tflops if lim.gemm_tflops else nan,
        "lim_b1": one["limit ms"],
        "lim_bmax": big["limit ms"],
        "gpu_b1": one["GPU ms"],
        "gpu_bmax": big["GPU ms"],
        "x_b1": one["GPU ms"] / one["limit ms"],
        "x_bmax": big["GPU ms"] / big["limit ms"],
        "other_b1": one["other ms"],
        "other_bmax": big["other ms"],
        "mm_bmax": big["matmul ms"],
        "attn_b1_ms": one["attention ms"],
        "cat_gb_bmax": 2 * big["KV bytes"] / 1e9,
    }
