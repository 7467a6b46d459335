"""The batch sweep: each step's bytes (weights and KV cache), operations, rates and limits;
the ridge point of its matrix multiplies; the numbers and sentences the chapter quotes."""

from __future__ import annotations

import statistics
from dataclasses import dataclass

import pandas as pd

from labsupport import runs
from labsupport.measure import hardware, models
from labsupport.traces import trace

from .one_token import ceilings, counts


def attention_flop_per_context_token(run: runs.Run) -> int:
    """Attention's operations for one new token, per token of context it attends to: the
    scores (Q·Kᵀ) and the weighted sum of the values, a multiply and an add each, for every
    query head of every layer (the model's configuration, from its preset)."""
    cfg = models.preset_config(run.parameters["preset"])
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    return 4 * cfg["num_attention_heads"] * head_dim * cfg["num_hidden_layers"]


def sweep(run: runs.Run) -> pd.DataFrame:
    """The batch sweep with the derived rates: per-step times, tokens/s, bytes and operations
    per step (weights and KV cache), bandwidth, FLOP/s, and the step's limits.

    A step must read every weight once (`weights bytes`) and each sequence's KV cache once
    (`KV bytes`: batch x context x bytes per cached token, at the context of the profiled step,
    whose GPU time this is; older runs recorded only the context after all steps, a few tokens
    more). Its operations are the matrix multiplies' (2 per weight per sequence) plus
    attention's (grows with the context). `limit ms` is the roofline: the longer of the bytes at
    the datasheet's bandwidth and the operations at its math rate; `read floor ms` is the bytes
    at the bandwidth measured in the run (read stream, or copy in older runs)."""
    s = run.table("batch_sweep")
    ok = s[s.status == "ok"].copy()
    c = counts(run)
    kv = run.results["kv_bytes_per_token"]
    lim = hardware.run_limits(run)
    read_tbs, _ = hardware.measured_read(lim)
    nan = float("nan")
    ok["GPU ms"] = ok.gpu_busy_ns / 1e6
    ok["matmul ms"] = ok.matmul_ns / 1e6
    ok["attention ms"] = ok.attention_ns / 1e6
    ok["other ms"] = (ok.kernel_ns - ok.matmul_ns - ok.attention_ns) / 1e6
    ok["tokens/s"] = ok.batch / (ok.wall_ms_median / 1e3)
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
    ok["read floor ms"] = ok["bytes"] / (read_tbs * 1e9) if read_tbs else nan
    ok["of limit"] = ok["limit ms"] / ok["GPU ms"]
    # The matrix multiplies against theirs (the weight matrices' bytes; their operations).
    ok["matmul memory limit ms"] = c.matmul_bytes / (lim.datasheet_tbs * 1e9) if lim.datasheet_tbs else nan
    ok["matmul math limit ms"] = (
        ok.batch * c.decode_flops / (lim.datasheet_tflops * 1e9) if lim.datasheet_tflops else nan
    )
    ok["matmul read floor ms"] = c.matmul_bytes / (read_tbs * 1e9) if read_tbs else nan
    ok["matmul GEMM floor ms"] = ok.batch * c.decode_flops / (lim.gemm_tflops * 1e9) if lim.gemm_tflops else nan
    return ok


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
    """The sweep as the chapter shows it; the wall times' range where the run recorded it."""
    s = sweep(run)
    out = s[["batch", "kernels", "matmul ms", "matmul TFLOP/s", "GPU ms", "wall_ms_median"]].rename(
        columns={"wall_ms_median": "wall ms"}
    )
    if "wall_ms_max" in s:
        out["wall min–max"] = [f"{lo:.1f}–{hi:.1f}" for lo, hi in zip(s.wall_ms_min, s.wall_ms_max, strict=True)]
    return pd.concat([out, s[["tokens/s"]]], axis=1)


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

    floor_ms: float  # matmul time when memory-bound (median over batch <= 8)
    ms_per_sequence: float  # matmul time per sequence when compute-bound (largest batch)
    measured_batch: float  # the batch where the two lines cross
    datasheet_batch: float | None
    ceilings_batch: float  # measured GEMM rate / measured read (older runs: copy) rate
    flat_until: int  # largest batch whose matmul time is within 25% of the floor


def ridge(run: runs.Run) -> Ridge:
    """Fit the two lines of a roofline to the matmul times of the sweep.

    For one token per sequence each weight (2 bytes) is used for 2·batch operations, so
    the arithmetic intensity is `batch` FLOP/byte and the ridge point in FLOP/byte is a
    batch size.
    """
    s = sweep(run)
    small = s[s.batch <= 8]["matmul ms"]
    floor = float(small.median()) if len(small) else float(smallest(s)["matmul ms"])
    big = largest(s)
    per_seq = float(big["matmul ms"] / big.batch)
    sheet = hardware.datasheet_or_none(run.provenance["gpu"])
    lim = hardware.run_limits(run)
    flat = s[s["matmul ms"] <= 1.25 * floor].batch
    return Ridge(
        floor_ms=floor,
        ms_per_sequence=per_seq,
        measured_batch=floor / per_seq,
        datasheet_batch=sheet.ridge_flop_per_byte if sheet else None,
        ceilings_batch=lim.gemm_tflops / lim.read_or_copy_tbs,
        flat_until=int(flat.max()),
    )


def bound_at(run: runs.Run, batch: int) -> str:
    r = ridge(run)
    return "memory-bound" if batch < r.measured_batch else "compute-bound"


def headline(run: runs.Run) -> dict:
    c, r = ceilings(run), ridge(run)
    return {"copy TB/s": c.copy_tbs, "GEMM TFLOP/s": c.gemm_tflops, "ridge batch": r.measured_batch}


def census_step(census: runs.Run) -> tuple[float, float, str] | None:
    """The eager decode step of the chapter "The kernels in one token" (its run `census`): the
    median wall ms, the GPU-busy ms of its profiled step, and the run id; None for a run
    recorded before the harness (its wall time was not taken before any profile)."""
    if "method" not in census.results:
        return None
    k = census.table("kernels")
    busy_ms = trace.busy_ns(k.start_ns, k.end_ns) / 1e6
    return statistics.median(census.table("step_times").wall_ms), busy_ms, census.run_id


def sweep_note(run: runs.Run, census: tuple[float, float, str] | None = None) -> str:
    """How the sweep's wall times were taken (older runs timed each batch size right after
    profiling it). `census`: the same eager step's clean wall and GPU-busy ms in the chapter
    "The kernels in one token", and that run's id (census_step), to set the batch-1 step beside it."""
    if wall_times_clean(run):
        text = (
            "The sweep's wall times, like every wall time in the book, were taken before the process's first "
            "profile: for each batch size a fresh prefill, a few untimed steps, then the timed steps (the "
            "median, and the range of the repeats); the GPU times come from one step per batch size profiled "
            "afterwards, again after a fresh prefill."
        )
        s = sweep(run).set_index("batch")
        if census and 1 in s.index:
            wall, busy = float(s.loc[1, "wall_ms_median"]), float(s.loc[1, "gpu_busy_ns"]) / 1e6
            text += (
                f" Its batch-1 step took {wall:.1f} ms, against {census[0]:.1f} ms for the same eager step at "
                f"the same context in *The kernels in one token* (run `{census[2]}`), also timed before any "
                f"profile, while the GPU was busy for about the same time ({busy:.2f} ms against "
                f"{census[1]:.2f} ms). So the profiler is not the cause, and this book has not found it yet; "
                "what differs is that this sweep runs its steps back to back on one growing cache, while that "
                "chapter prefills afresh before each step. The ridge point uses GPU times only."
            )
        return text
    return (
        "In this run the wall times of each batch size were taken right after that batch size was profiled, in "
        "the same process, and a profile slows every later kernel launch (the methodology, under *Two "
        "instruments*): read its wall-time curve as an upper bound. The ridge point uses GPU times only."
    )


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
        "mm_read_ms": one["matmul read floor ms"],
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
