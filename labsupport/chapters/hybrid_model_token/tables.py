"""The run's own tables, for the page: every variant side by side, the prompt phase, the cache
as the context grows, how the wall times were taken."""

from __future__ import annotations

import pandas as pd

from labsupport import runs
from labsupport.chapters import shared
from labsupport.chapters.hybrid_model_token.keys import MODES_SHORT, wall_column
from labsupport.measure import hardware


def limits(run: runs.Run) -> hardware.Limits:
    """The ceilings the chapter compares against: the datasheet of the run's GPU and those measured in
    the run of *Why a GPU* (shared.limits), never the run's own; the datasheet alone where no run of
    *Why a GPU* is published (a test's empty runs folder) or where it was recorded on another GPU."""
    sheet = hardware.datasheet_or_none(run.provenance["gpu"])
    try:
        lim = shared.limits()
    except runs.RunError:
        lim = None
    if lim is not None and sheet is not None and lim.datasheet_name == sheet.name:
        return lim
    return hardware.Limits(
        datasheet_name=sheet.name if sheet else None,
        datasheet_tflops=sheet.bf16_tflops if sheet else None,
        datasheet_tbs=sheet.bandwidth_tbs if sheet else None,
        gemm_tflops=None,
        copy_tbs=None,
    )


def timing_note(run: runs.Run) -> str:
    """How the run's wall times were taken: all before the first profile (the harness), or, in
    runs recorded before it, in the same process as the profiles, most after one."""
    t = run.table("step_times")
    if "clean" not in t:
        return (
            "This run is older than the book's measuring harness: its wall times were taken in the same "
            "process as its profiles, most of them after one, so they carry the profiler's after-effect "
            "(CUPTI stays attached and every later launch pays for it; the methodology page measures how "
            "much). Runs recorded with the current code time every variant of every backend, and each "
            "backend's prompt, before profiling any."
        )
    p = run.table("prefill")
    clean = list(t.clean) + (list(p.clean.dropna()) if "clean" in p else [])
    if all(str(c) == "True" for c in clean):
        return (
            f"Every wall time (each backend's prompt and every variant) was taken before the first profile in "
            f"the process, {int(t.groupby(['backend', 'mode']).size().max())} repeats each"
            + (
                ", each backend's prompt and its variants timed in turn, round after round (so that a change in "
                "the host's speed touches them alike)"
                if "round" in t and t["round"].notna().any()
                else ""
            )
            + "; the tables give the least of the repeats (the book's estimator for host-timed numbers: noise "
            "only ever adds time), with the median and quartiles beside it."
        )
    return (
        "Some wall times in this run were taken after a profile in the same process (see `clean` in "
        "`step_times.csv`); they carry the profiler's after-effect."
    )


def measured_column(run: runs.Run) -> str:
    """The name of the variants table's column for the fraction of the measured ceiling."""
    return f"of measured {hardware.measured_read(limits(run))[1]}"


def variants(run: runs.Run) -> pd.DataFrame:
    """Every backend and mode side by side: status, kernels, launch calls, GPU-busy and wall
    time (the minimum of the repeats, the book's estimator; median, quartiles, slowest),
    tokens/s, and how close the wall time gets to the
    bandwidth limit (weights / bandwidth), by the datasheet and by the run's measured read
    ceiling (the copy in runs that measured no read stream). `mode` is the data key (MODES
    names each for display)."""
    v = run.table("variants")
    nbytes = run.results["model"]["decode_bytes"]
    lim = limits(run)
    out = pd.DataFrame({"backend": v.backend, "mode": v["mode"], "status": v.status})
    for col in ("kernels", "launch_calls", "gpu_busy_ns", "wall_ms_median", "compile_s"):
        if col not in v:
            v[col] = float("nan")
    t = run.table("step_times")
    wall = t.groupby(["backend", "mode"]).wall_ms
    keys = list(zip(v.backend, v["mode"], strict=True))
    out["kernels"] = v.kernels
    out["launch calls"] = v.launch_calls
    out["GPU busy ms"] = v.gpu_busy_ns / 1e6
    out["wall ms"] = v[wall_column(v)]  # the minimum: the book's estimator
    out["wall median ms"] = v.wall_ms_median
    out["wall min ms"] = [wall.min().get(k, float("nan")) for k in keys]
    out["wall q1 ms"] = [wall.quantile(0.25).get(k, float("nan")) for k in keys]
    out["wall q3 ms"] = [wall.quantile(0.75).get(k, float("nan")) for k in keys]
    out["wall max ms"] = [wall.max().get(k, float("nan")) for k in keys]
    out["tokens/s"] = 1e3 / out["wall ms"]
    out["of datasheet limit"] = hardware.of_bandwidth(nbytes, out["wall ms"], lim.datasheet_tbs)
    out[measured_column(run)] = hardware.of_bandwidth(nbytes, out["wall ms"], hardware.measured_read(lim)[0])
    out["compile s"] = v.compile_s
    return out


def variants_compact(run: runs.Run) -> pd.DataFrame:
    """variants() narrowed for the page: short mode names, the median and quartiles of the repeats in
    one column, and the status column only when something did not run."""
    v = variants(run)
    out = pd.DataFrame({"backend": v.backend, "mode": v["mode"].map(MODES_SHORT)})
    if (v.status != "ok").any():
        out["status"] = v.status
    for c in ("kernels", "launch calls", "GPU busy ms", "wall ms"):
        out[c] = v[c]
    out["median (quartiles) ms"] = [
        f"{md:.2f} ({lo:.2f}–{hi:.2f})" if lo == lo and hi == hi else "–"
        for md, lo, hi in zip(v["wall median ms"], v["wall q1 ms"], v["wall q3 ms"], strict=True)
    ]
    for c in ("tokens/s", "of datasheet limit", measured_column(run), "compile s"):
        out[c] = v[c]
    return out


def ok_variants(run: runs.Run) -> pd.DataFrame:
    v = variants(run)
    return v[v.status == "ok"].reset_index(drop=True)


def prefill(run: runs.Run) -> pd.DataFrame:
    """The prompt phase per backend: kernels, GPU-busy and wall time, tokens per second."""
    p = run.table("prefill")
    p = p[p.status == "ok"].copy()
    p["backend"] = p.backend
    p["GPU busy ms"] = p.gpu_busy_ns / 1e6
    p["wall ms"] = p[wall_column(p)]
    p["wall median ms"] = p.wall_ms_median
    p["prompt tokens/s"] = p.tokens / (p["wall ms"] / 1e3)
    cols = ["backend", "tokens", "kernels", "GPU busy ms", "wall ms", "wall median ms", "prompt tokens/s"]
    return p[cols].reset_index(drop=True)


def cache_growth(run: runs.Run) -> pd.DataFrame:
    """Cache bytes by layer type at each context length (MB), and per token of context."""
    g = run.table("cache_growth")
    g = g[g.status == "ok"]
    t = g.pivot_table(index="context", columns="layer_type", values="bytes", aggfunc="sum")
    out = pd.DataFrame({"context": t.index})
    out["full-attention KV cache MB"] = t.get("full_attention", 0).values / 1e6
    out["linear-attention state MB"] = t.get("linear_attention", 0).values / 1e6
    out["KV bytes per token"] = t.get("full_attention", 0).values / t.index.values
    return out.reset_index(drop=True)


def headline(run: runs.Run) -> dict:
    """The numbers the nightly history follows: the eager step of the first backend that ran
    (in the run's order of backends), and the fastest variant."""
    ok = ok_variants(run)
    eager = ok[ok["mode"] == "eager"].set_index("backend")
    first = eager.loc[next(b for b in run.parameters["backends"] if b in eager.index)]
    return {
        "eager kernels": int(first.kernels),
        "eager wall ms": float(first["wall ms"]),
        "best wall ms": float(ok["wall ms"].min()),
    }


def best_variant(run: runs.Run) -> tuple[str, str]:
    """(backend, mode) of the variant with the shortest wall time."""
    v = run.table("variants")
    v = v[v.status == "ok"]
    r = v.loc[v[wall_column(v)].idxmin()]
    return r.backend, r["mode"]
