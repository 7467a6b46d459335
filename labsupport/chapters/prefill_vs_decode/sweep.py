"""The matrix multiplies of one decoder layer in both phases, and the prefill against prompt
length: the sweep, where its matrix multiplies turn compute-bound, and the roofline they are
set under."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from labsupport import runs

from .names import GEMM_MODULES, MATMUL, PHASES
from .tables import bandwidth, kernel_table, limits, measured_ridge, shape
from .work import forward_work, matmul_intensity, tokens_at_intensity


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
    first = g[g.phase == PHASES[0]].set_index("module")
    t = pd.DataFrame(out)
    t.columns = pd.MultiIndex.from_tuples(t.columns)
    t.insert(0, ("weight", "in × out"), [f"{a:,} × {b:,}" for a, b in zip(first["in"], first["out"], strict=True)])
    t.index.name = "matrix"
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
    ok["wall ms"] = ok.wall_ms_min  # the book's estimator: the minimum of the trials
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
