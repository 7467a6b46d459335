"""A loaded run's tables and each phase: the model's shape, each phase's kernels and the ceilings (datasheet and
measured) that every rate is set against; each phase measured and set against them (time, kernels, work, MFU and MBU;
the prefill's one timing; the kernels counted by kind); the matrix multiplies of one decoder layer in both phases, and
the prefill against prompt length (the sweep, and where its matrix multiplies turn compute-bound).
"""

from __future__ import annotations

import functools
import math
import statistics
from dataclasses import asdict, dataclass

import pandas as pd

from labsupport import runs
from labsupport.measure import hardware, harness
from labsupport.traces import kernels

from .measuring import (
    GEMM_MODULES,
    MATMUL,
    PHASES,
    TEXT_COLUMNS,
    ModelShape,
    annotated_kernels,
    forward_work,
    kernels_table_name,
    matmul_intensity,
    phase_work,
    tokens_at_intensity,
    trace_file,
)


def shape(run: runs.Run) -> ModelShape:
    return ModelShape(**run.results["shape"])


def kernel_table(run: runs.Run, phase: str) -> pd.DataFrame:
    """The kernels of one phase's profiled pass, with the column types they were written with.

    `kind` is today's classification of each recorded name (kernels.classify), so that a run
    recorded under older rules is counted by the rules the book describes."""
    k = run.table(kernels_table_name(phase), dtype={c: str for c in TEXT_COLUMNS})
    k[TEXT_COLUMNS] = k[TEXT_COLUMNS].fillna("")
    k["kind"] = k["name"].map(kernels.classify)
    return k.astype({"layer": "Int64"})


def recompute_kernels(run: runs.Run, phase: str) -> pd.DataFrame:
    """One phase's kernel table recomputed from its raw trace, with today's rules."""
    device = run.provenance.get("device", "cuda")
    return annotated_kernels(run.file(trace_file(phase)), device, phase)


# The ceilings of a run (datasheet and measured) live in hardware; the chapter's names for them:
Limits = hardware.Limits


def ceilings_run(run: runs.Run) -> runs.Run:
    """The run whose ceilings every rate of the page is set against: the shared ceilings owner's
    (why-a-gpu: labsupport.chapters.shared.limits) where that run is on this run's GPU, so that
    the page shows the book's one value of each; else (another GPU, a CPU) this run itself."""
    owner = _ceilings_owner(str(runs.runs_root()))
    return owner if owner is not None and owner.provenance.get("gpu") == run.provenance.get("gpu") else run


def limits(run: runs.Run) -> Limits:
    """The datasheet's and the measured ceilings of ceilings_run(run)."""
    return hardware.run_limits(ceilings_run(run))


@functools.lru_cache(maxsize=4)
def _ceilings_owner(root: str) -> runs.Run | None:
    """The ceilings owner's published run in the runs folder `root`, read once (None: no run)."""
    from pathlib import Path

    from labsupport.chapters import shared

    try:
        return shared.owner_run(shared.CEILINGS, root=Path(root))
    except runs.RunError:  # no published ceilings run (a scratch runs folder)
        return None


@dataclass(frozen=True)
class Bandwidth:
    """The measured bandwidth that a pass reading weights is set against: the practical ceiling
    (hardware.practical_ceiling, the best read rate of the ceilings run), never a copy's."""

    tbs: float | None
    name: str  # for prose: "measured read stream", ...
    short: str  # for labels: "measured read", "measured copy"


def bandwidth(lim: Limits) -> Bandwidth:
    if lim.ceiling_tbs:
        return Bandwidth(lim.ceiling_tbs, "practical ceiling", "practical ceiling")
    return Bandwidth(None, "no measured bandwidth", "measured bandwidth")


def measured_ridge(lim: Limits) -> float | None:
    """FLOP per byte of weights above which the measured GEMM rate, not the practical ceiling, is
    the limit: the book's one measured ridge (hardware.Limits.measured_ridge)."""
    return lim.measured_ridge


def ratio(value: float, limit: float | None) -> float | None:
    return value / limit if limit else None


@dataclass
class Phase:
    """One phase measured: its time, its kernels, its work, and the rates it reached.

    Rates use the wall time (what a user waits for) and, marked `busy`, the time the GPU
    was busy in the profiled pass (what the kernels alone reached). MFU: FLOP/s reached
    over the peak FLOP/s; MBU: bytes per second reached over the peak bandwidth, against
    the datasheet and against the measured bandwidth() (read stream, or copy in older runs).
    """

    phase: str
    new_tokens: int
    cached_tokens: int  # tokens in the KV cache before the pass
    kernels: int
    wall_ms: float  # the book's estimator (harness.estimate) of the interleaved trials (no profiler)
    wall_min_ms: float
    wall_max_ms: float
    wall_repeats: int
    wall_median_ms: float
    wall_q1_ms: float
    wall_q3_ms: float
    gpu_busy_ms: float  # union of kernel intervals in the profiled pass
    kernel_ms: float  # sum of kernel durations
    matmul_kernels: int
    matmul_ms: float
    attention_ms: float
    matmul_flops: int
    attention_flops: int
    flops: int
    bytes: int
    flop_per_byte: float
    tflops: float  # model FLOPs / wall time
    tflops_busy: float
    tbs: float  # bytes that must move / wall time
    tbs_busy: float
    matmul_tflops: float  # matmul FLOPs / matmul kernel time
    mfu_datasheet: float | None
    mfu_gemm: float | None
    mfu_busy_datasheet: float | None
    mfu_busy_gemm: float | None
    mbu_datasheet: float | None
    mbu_measured: float | None
    mbu_busy_datasheet: float | None
    mbu_busy_measured: float | None
    ms_per_token: float  # wall time / new tokens


def phases(run: runs.Run) -> dict[str, Phase]:
    """Both phases of the run, measured and set against the limits."""
    sh, lim = shape(run), limits(run)
    bw = bandwidth(lim).tbs
    n = int(run.parameters["prompt_len"])
    times = run.table("phase_times")
    out = {}
    for ph in PHASES:
        k = kernel_table(run, ph)
        walls = times.loc[times["phase"] == ph, "wall_ms"]
        est = harness.table_estimate(times[times["phase"] == ph])  # the fast-host median (old runs: minimum)
        wall = est.value
        busy = kernels.gpu_busy_ns(k) / 1e6
        mm = k[k.kind == MATMUL]
        work = phase_work(sh, ph, n)
        tflops, tflops_busy = work.flops / wall / 1e9, work.flops / busy / 1e9  # FLOP/ms / 1e9 = TFLOP/s
        tbs, tbs_busy = work.bytes / wall / 1e9, work.bytes / busy / 1e9
        mm_ms = mm.dur_ns.sum() / 1e6
        new = n if ph == "prefill" else 1
        out[ph] = Phase(
            phase=ph,
            new_tokens=new,
            cached_tokens=0 if ph == "prefill" else n,
            kernels=len(k),
            wall_ms=wall,
            wall_min_ms=float(walls.min()),
            wall_max_ms=float(walls.max()),
            wall_repeats=len(walls),
            wall_median_ms=float(statistics.median(walls)),
            wall_q1_ms=est.q1,  # the quartiles of the trials the estimator rests on
            wall_q3_ms=est.q3,
            gpu_busy_ms=busy,
            kernel_ms=k.dur_ns.sum() / 1e6,
            matmul_kernels=len(mm),
            matmul_ms=mm_ms,
            attention_ms=k.loc[k.kind == "attention", "dur_ns"].sum() / 1e6,
            matmul_flops=work.matmul_flops,
            attention_flops=work.attention_flops,
            flops=work.flops,
            bytes=work.bytes,
            flop_per_byte=work.flop_per_byte,
            tflops=tflops,
            tflops_busy=tflops_busy,
            tbs=tbs,
            tbs_busy=tbs_busy,
            matmul_tflops=work.matmul_flops / mm_ms / 1e9 if mm_ms else float("nan"),
            mfu_datasheet=ratio(tflops, lim.datasheet_tflops),
            mfu_gemm=ratio(tflops, lim.gemm_tflops),
            mfu_busy_datasheet=ratio(tflops_busy, lim.datasheet_tflops),
            mfu_busy_gemm=ratio(tflops_busy, lim.gemm_tflops),
            mbu_datasheet=ratio(tbs, lim.datasheet_tbs),
            mbu_measured=ratio(tbs, bw),
            mbu_busy_datasheet=ratio(tbs_busy, lim.datasheet_tbs),
            mbu_busy_measured=ratio(tbs_busy, bw),
            ms_per_token=wall / new,
        )
    return out


def phase_table(run: runs.Run) -> pd.DataFrame:
    """Both phases side by side, one row per number (numeric; None where no limit is known)."""
    p = phases(run)
    return pd.DataFrame({ph: asdict(v) for ph, v in p.items()}).drop(index="phase")


@dataclass
class PrefillTiming:
    """The wall time of the prefill of `prompt_len` tokens (the book's estimator), as the
    phase table and the prompt-length sweep show it: one measurement (`shared`) in runs recorded
    since the chapter times each configuration once; older runs timed it twice."""

    prompt_len: int
    phase_ms: float
    phase_repeats: int
    sweep_ms: float | None  # None when the sweep has no row (that ran) for prompt_len
    sweep_repeats: int | None
    shared: bool


def prefill_timing(run: runs.Run) -> PrefillTiming:
    n = int(run.parameters["prompt_len"])
    t = run.table("phase_times")
    walls = t.loc[t["phase"] == "prefill", "wall_ms"]
    s = run.table("prompt_sweep")
    row = s[(s["prompt_len"] == n) & (s["status"] == "ok")].set_index("prompt_len")
    same = lambda a, b: math.isclose(float(a), float(b), rel_tol=1e-12)  # noqa: E731 (CSV round trip)
    est = harness.table_estimate(t[t["phase"] == "prefill"]).value
    if row.empty:
        return PrefillTiming(n, est, len(walls), None, None, False)
    r = row.loc[n]
    reps = int(r["wall_repeats"]) if "wall_repeats" in row.columns else None
    shared = (
        reps == len(walls)
        and same(r["wall_ms_median"], statistics.median(walls))
        and same(r["wall_ms_min"], walls.min())
        and same(r["wall_ms_max"], walls.max())
        and same(r[harness.estimate_column(row.columns)], est)
    )
    return PrefillTiming(n, est, len(walls), float(r[harness.estimate_column(row.columns)]), reps, shared)


# Display labels of utilisation()'s `time` keys.
TIME_LABELS = {"wall": "wall time", "busy": "GPU busy"}


def utilisation(run: runs.Run) -> pd.DataFrame:
    """MFU and MBU of both phases, on wall time and on GPU-busy time, against the datasheet
    and against the ceilings measured in the run (NaN where a limit is unknown). The last
    column is named after the measured bandwidth used ("MBU vs practical ceiling").
    `time` is "wall" or "busy" (TIME_LABELS names them for display)."""
    nan = float("nan")
    mbu_col = f"MBU vs {bandwidth(limits(run)).short}"
    rows = []
    for ph, p in phases(run).items():
        for time, mfu_sheet, mfu_gemm, mbu_sheet, mbu_measured in (
            ("wall", p.mfu_datasheet, p.mfu_gemm, p.mbu_datasheet, p.mbu_measured),
            ("busy", p.mfu_busy_datasheet, p.mfu_busy_gemm, p.mbu_busy_datasheet, p.mbu_busy_measured),
        ):
            rows.append(
                {
                    "phase": ph,
                    "time": time,
                    "MFU vs datasheet": mfu_sheet or nan,
                    "MFU vs measured GEMM": mfu_gemm or nan,
                    "MBU vs datasheet": mbu_sheet or nan,
                    mbu_col: mbu_measured or nan,
                }
            )
    return pd.DataFrame(rows)


def census(run: runs.Run) -> pd.DataFrame:
    """Kernels and GPU time by kind, prefill beside decode (the kinds by today's rules, from
    the recorded kernel tables; census.csv holds those of the rules at recording time)."""
    parts = {}
    for ph in PHASES:
        x = kernels.census(kernel_table(run, ph)).set_index("kind")
        parts[(ph, "kernels")] = x["kernels"]
        parts[(ph, "GPU ms")] = x["gpu_ns"] / 1e6
        parts[(ph, "share")] = x["share"]
    out = pd.DataFrame(parts)
    out.columns = pd.MultiIndex.from_tuples(out.columns)
    out.index.name = "kind"
    return out


def passes_table(run: runs.Run) -> pd.DataFrame:
    """Every number of the page's table "One prefill against one decode step", unrounded, one
    row per quantity (the page shows them rounded, two to a row where they pair): the full
    table its CSV link downloads."""
    p = phases(run)
    lim, bw = limits(run), bandwidth(limits(run))
    rows = [
        ("new tokens", "tokens", "new_tokens"),
        ("tokens in the cache before the pass", "tokens", "cached_tokens"),
        ("wall time, the minimum of the timed passes", "ms", "wall_ms"),
        ("wall time, first quartile", "ms", "wall_q1_ms"),
        ("wall time, median", "ms", "wall_median_ms"),
        ("wall time, third quartile", "ms", "wall_q3_ms"),
        ("wall time, slowest timed pass", "ms", "wall_max_ms"),
        ("timed passes", "passes", "wall_repeats"),
        ("time the GPU was busy (profiled)", "ms", "gpu_busy_ms"),
        ("kernels", "kernels", "kernels"),
        ("model FLOPs", "FLOP", "flops"),
        ("bytes that must move", "bytes", "bytes"),
        ("FLOP per byte", "FLOP/byte", "flop_per_byte"),
    ]
    # The rates reached, on each time basis: the wall time, then the GPU's busy time (fields with "_busy").
    rates = (
        ("TFLOP/s reached", "TFLOP/s", "tflops{}"),
        ("MFU against the datasheet", "fraction", "mfu{}_datasheet"),
        ("MFU against the measured GEMM rate", "fraction", "mfu{}_gemm"),
        ("TB/s reached", "TB/s", "tbs{}"),
        ("MBU against the datasheet", "fraction", "mbu{}_datasheet"),
        (f"MBU against the {bw.short}", "fraction", "mbu{}_measured"),
    )
    for basis, busy in (("wall time", ""), ("GPU-busy time", "_busy")):
        rows += [(f"{name}, on {basis}", unit, field.format(busy)) for name, unit, field in rates]
    out = pd.DataFrame(
        [
            {"quantity": name, "unit": unit, **{ph: getattr(p[ph], field) for ph in PHASES}, "field": field}
            for name, unit, field in rows
        ]
    )
    limits_rows = pd.DataFrame(
        [
            {"quantity": f"limit: {name}", "unit": unit, **dict.fromkeys(PHASES, value), "field": field}
            for name, unit, value, field in (
                ("datasheet peak", "TFLOP/s", lim.datasheet_tflops, "datasheet_tflops"),
                ("measured GEMM rate", "TFLOP/s", lim.gemm_tflops, "gemm_tflops"),
                ("datasheet bandwidth", "TB/s", lim.datasheet_tbs, "datasheet_tbs"),
                (f"measured {bw.name}", "TB/s", bw.tbs, "measured_tbs"),
            )
        ]
    )
    return pd.concat([out, limits_rows], ignore_index=True)


def layer_gemms(run: runs.Run) -> pd.DataFrame:
    """The matrix multiplies of one decoder layer in both phases: one row per weight matrix
    and phase, with its kernels (the longest, and the names of any helpers such as a split-K
    reduction), their time together, and the rates reached.

    rows = tokens that go through the matrix (the prompt in prefill, 1 in decode);
    FLOPs = 2 × rows × in × out; bytes = the weight, the input and the output, once each.
    """
    layer = int(run.results["gemm_layer"])
    shapes = run.results["gemm_shapes"]
    p = int(run.results["shape"]["bytes_per_value"])
    rows = []
    for ph in PHASES:
        k = kernel_table(run, ph)
        k = k[(k.kind == MATMUL) & (k.layer == layer)]
        m_rows = int(run.parameters["prompt_len"]) if ph == "prefill" else 1
        for mod in (m for m in GEMM_MODULES if m in shapes):
            fin, fout = shapes[mod]
            g = k[k.module == f"layers.{layer}.{mod}"]
            ns = int(g.dur_ns.sum())
            flops = 2 * m_rows * fin * fout
            nbytes = p * (fin * fout + m_rows * fin + m_rows * fout)
            main = g.loc[g.dur_ns.idxmax()] if len(g) else None
            helpers = g.drop(index=main.name).short_name if main is not None else []
            rows.append(
                {
                    "module": mod,
                    "phase": ph,
                    "rows": m_rows,
                    "in": fin,
                    "out": fout,
                    "kernels": len(g),
                    "kernel": main.short_name if main is not None else "",
                    "helpers": "; ".join(dict.fromkeys(helpers)),
                    "grid": main.grid if main is not None else "",
                    "dur_ns": ns,
                    "flops": flops,
                    "bytes": nbytes,
                    "flop_per_byte": flops / nbytes,
                    "tflops": flops / ns / 1e3 if ns else float("nan"),
                    "tbs": nbytes / ns / 1e3 if ns else float("nan"),
                }
            )
    return pd.DataFrame(rows)


def layer_gemm_table(run: runs.Run) -> pd.DataFrame:
    """layer_gemms() laid out for reading: one row per weight matrix, the phases side by side
    (time, TFLOP/s and TB/s; the kernels' names are in layer_gemm_kernels())."""
    g = layer_gemms(run)
    out = {}
    for ph in PHASES:
        x = g[g.phase == ph].set_index("module")
        out[(ph, "µs")] = x["dur_ns"] / 1e3
        out[(ph, "TFLOP/s")] = x["tflops"]
        out[(ph, "TB/s")] = x["tbs"]
    return side_by_side(out, g, "matrix")


def side_by_side(columns: dict, rows: pd.DataFrame, index: str) -> pd.DataFrame:
    """Columns keyed (phase, heading) as one table under a two-level header, with each weight's
    shape (in × out, from the first phase's `rows`) in front; the rows' index is named `index`."""
    first = rows[rows.phase == PHASES[0]].set_index("module")
    t = pd.DataFrame(columns)
    t.columns = pd.MultiIndex.from_tuples(t.columns)
    t.insert(0, ("weight", "in × out"), [f"{a:,} × {b:,}" for a, b in zip(first["in"], first["out"], strict=True)])
    t.index.name = index
    return t


def layer_gemm_kernels(run: runs.Run) -> pd.DataFrame:
    """Which kernels did each of those matrix multiplies, in each phase: the one that did the
    work, then (after a +) any helper that ran with it."""
    g = layer_gemms(run)
    return pd.DataFrame(
        {"matrix": g.module, "phase": g.phase, "kernels": g.kernel + g.helpers.map(lambda h: f" + {h}" if h else "")}
    )


def prompt_sweep(run: runs.Run) -> pd.DataFrame:
    """The sweep of prompt lengths (rows that ran), with model FLOPs and the rates reached
    (on the minimum of each length's wall times). "FLOP/byte" is the matrix multiplies' FLOPs
    per byte of weights (work.matmul_intensity), the roofline's x axis; the whole pass's, with
    attention and the KV cache, is Phase.flop_per_byte."""
    sh = shape(run)
    s = run.table("prompt_sweep")
    ok = s[s.status == "ok"].copy()
    n = ok.prompt_len.astype(int)
    work = [forward_work(sh, int(t)) for t in n]
    ok["wall ms"] = ok[harness.estimate_column(ok.columns)]  # the book's estimator
    ok["wall median ms"] = ok.wall_ms_median
    for q in ("q1", "q3"):  # runs recorded before the interleaved timing have no quartiles
        ok[f"wall {q} ms"] = ok[f"wall_ms_{q}"] if f"wall_ms_{q}" in ok else float("nan")
    ok["GPU ms"] = ok.gpu_busy_ns / 1e6
    ok["matmul ms"] = ok.matmul_ns / 1e6
    ok["ms per token"] = ok["wall ms"] / n
    ok["GPU ms per token"] = ok["GPU ms"] / n
    ok["matmul ms per token"] = ok["matmul ms"] / n
    ok["flops"] = [w.flops for w in work]
    ok["matmul flops"] = [w.matmul_flops for w in work]
    ok["FLOP/byte"] = [matmul_intensity(sh, int(t)) for t in n]
    ok["TFLOP/s"] = ok["flops"] / ok["wall ms"] / 1e9
    ok["GPU TFLOP/s"] = ok["flops"] / ok["GPU ms"] / 1e9
    ok["matmul TFLOP/s"] = ok["matmul flops"] / ok["matmul ms"] / 1e9
    ok["tokens/s"] = n / (ok["wall ms"] / 1e3)
    return ok.reset_index(drop=True)


@dataclass
class Crossover:
    """Where a prefill's matrix multiplies turn from memory-bound to compute-bound.

    While memory-bound, their time is that of reading every weight once, whatever the
    prompt (the floor); when compute-bound it grows in proportion to the prompt. The two
    lines cross at `measured_tokens`. The ridge points say where the limits predict it:
    the prompt whose matrix multiplies do as many FLOP per byte of weights as the peak
    FLOP/s over the peak bandwidth.
    """

    floor_ms: float  # matmul time of the shortest prompts (median over <= 8 tokens)
    ms_per_token: float  # matmul time per token at the longest prompt
    measured_tokens: float  # floor_ms / ms_per_token
    flat_until: int  # longest prompt whose matmul time is within 25% of the floor
    best_matmul_tflops: float
    saturates_at: int  # shortest prompt whose matmul FLOP/s reach 90% of the best
    datasheet_ridge: float | None  # FLOP/byte
    measured_ridge: float | None  # measured GEMM rate over measured bandwidth() for reading weights
    datasheet_tokens: float | None  # the prompt length at the datasheet ridge
    measured_ridge_tokens: float | None


def crossover(run: runs.Run) -> Crossover:
    s = prompt_sweep(run)
    sh, lim = shape(run), limits(run)
    small = s[s.prompt_len <= 8]["matmul ms"]
    floor = float(small.median()) if len(small) else float(s.loc[s.prompt_len.idxmin(), "matmul ms"])
    big = s.loc[s.prompt_len.idxmax()]  # the longest prompt that ran
    per_token = float(big["matmul ms"] / big.prompt_len)
    best = float(s["matmul TFLOP/s"].max())
    ridge = measured_ridge(lim)
    return Crossover(
        floor_ms=floor,
        ms_per_token=per_token,
        measured_tokens=floor / per_token,
        flat_until=int(s.loc[s["matmul ms"] <= 1.25 * floor, "prompt_len"].max()),
        best_matmul_tflops=best,
        saturates_at=int(s.loc[s["matmul TFLOP/s"] >= 0.9 * best, "prompt_len"].min()),
        datasheet_ridge=lim.datasheet_ridge,
        measured_ridge=ridge,
        datasheet_tokens=tokens_at_intensity(sh, lim.datasheet_ridge) if lim.datasheet_ridge else None,
        measured_ridge_tokens=tokens_at_intensity(sh, ridge) if ridge else None,
    )


def roofline(run: runs.Run, points: int = 200) -> pd.DataFrame:
    """The most TFLOP/s a prefill's matrix multiplies could reach at each prompt length, by
    the datasheet and by the measured ceilings (GEMM rate, and bandwidth() for reading the
    weights): the lesser of the peak FLOP/s and the bandwidth times the FLOP per byte (NaN
    where a limit is unknown)."""
    import numpy as np

    sh, lim = shape(run), limits(run)
    lens = run.table("prompt_sweep").prompt_len
    grid = np.unique(np.geomspace(max(int(lens.min()), 1), int(lens.max()), points).round().astype(int))
    out = pd.DataFrame({"prompt_len": grid, "FLOP/byte": [matmul_intensity(sh, int(t)) for t in grid]})
    nan = float("nan")
    for col, tflops, tbs in (
        ("datasheet TFLOP/s", lim.datasheet_tflops, lim.datasheet_tbs),
        ("measured TFLOP/s", lim.gemm_tflops, bandwidth(lim).tbs),
    ):
        out[col] = np.minimum(tflops, tbs * out["FLOP/byte"]) if tflops and tbs else nan
    return out
