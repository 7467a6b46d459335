"""The chapter's analysis, from a recorded run: the floor, the ladder of rungs (time, kernels,
bandwidth, gap to the floor, same answers), where each rung's time goes, the kernels of each
rung by kind, the matmuls shape by shape, and the best rung's remaining time."""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

import pandas as pd

from labsupport import runs
from labsupport.chapters.closing_the_gap.params import (
    FP8_ERROR_FACTOR,
    FP8_ERROR_FACTORS,
    FP8_RUNGS,
    RUNGS,
    SHARED_CONFIG,
    SHARED_RUNGS,
    trace_file,
)
from labsupport.measure import hardware, models
from labsupport.measure.models import source
from labsupport.traces import kernels, trace


@dataclass
class Floor:
    """What a step of `decode_bytes` is set against, with one meaning on every page: the floor,
    those bytes at the datasheet's bandwidth (the physical limit: no kernel beats it), and the
    practical ceiling, those bytes at the best rate any kernel reached on this GPU (the shared
    ceiling_tbs of why-a-gpu's run: its best read rate, hardware.practical_ceiling)."""

    decode_bytes: int
    datasheet_tbs: float | None
    ceiling_tbs: float | None
    shared: bool  # from the shared quantities (the run is their configuration and GPU)

    @property
    def floor_ms(self) -> float:
        return self.decode_bytes / self.datasheet_tbs / 1e9 if self.datasheet_tbs else float("nan")

    @property
    def ceiling_ms(self) -> float:
        return self.decode_bytes / self.ceiling_tbs / 1e9 if self.ceiling_tbs else float("nan")


@functools.lru_cache(maxsize=4)
def _shared_values(root: str) -> dict:
    from pathlib import Path

    from labsupport.chapters import shared

    try:
        return shared.values(root=Path(root))
    except runs.RunError:  # no published run of an owner (a scratch runs folder)
        return {}


def short_status(status) -> str:
    """A rung's status as the page shows it: a failure's first two sentences (an out-of-memory
    error goes on with a paragraph of allocator advice; rungs.csv keeps what the run recorded)."""
    text = str(status)
    if not text.startswith("failed: "):
        return text
    return " ".join(re.split(r"(?<=\.)\s+", text)[:2]).rstrip(".")


def shared_values() -> dict:
    """The shared quantities (labsupport.chapters.shared.values) from the runs folder in use,
    read once; empty where an owner has no published run there."""
    return _shared_values(str(runs.runs_root()))


def is_shared_config(run: runs.Run, vals: dict | None = None) -> bool:
    """Whether `run` is the configuration of the shared steps (Qwen3-8B, 256-token prompt) on the
    GPU of the owners' runs: then its first rungs are the shared ones."""
    vals = shared_values() if vals is None else vals
    if "eager_wall_ms" not in vals:
        return False
    p = run.parameters
    same = all(p.get(k) == v for k, v in SHARED_CONFIG.items())
    return same and vals["eager_wall_ms"].run.provenance.get("gpu") == run.provenance.get("gpu")


def floor(run: runs.Run, vals: dict | None = None) -> Floor:
    """The floor and the practical ceiling of `run`'s step: the shared ones where the run is the
    shared configuration; else its own bytes against its GPU's datasheet (and no ceiling:
    this chapter measures none)."""
    vals = shared_values() if vals is None else vals
    if is_shared_config(run, vals) and "floor_ms" in vals:
        nbytes = round(vals["step_gb"].value * 1e9)
        return Floor(nbytes, vals["datasheet_tbs"].value, vals["ceiling_tbs"].value, True)
    lim = hardware.run_limits(run)
    return Floor(int(run.results["model"]["decode_bytes"]), lim.datasheet_tbs, None, False)


def fp8_floor(run: runs.Run, vals: dict | None = None) -> Floor | None:
    """The FP8 rungs' own floor: the bytes their step reads (FP8 matrices, their row scales, the
    BF16 norms: run.results["fp8"], the same for every FP8 rung) at the same datasheet bandwidth
    and practical ceiling as the BF16 floor. None for a run without an FP8 rung."""
    rec = run.results.get("fp8") or {}
    if "decode_bytes" not in rec:
        return None
    f = floor(run, vals)
    return Floor(int(rec["decode_bytes"]), f.datasheet_tbs, f.ceiling_tbs, f.shared)


def kv_positions(run: runs.Run) -> int:
    """The positions whose keys and values one decode step's attention reads: the prompt's and
    the new token's (written into the cache, then read with the others)."""
    return int(run.parameters["prompt_len"]) + 1


def kv_cache_bytes(run: runs.Run) -> int:
    """The KV cache one decode step reads, from the model's configuration: layers x 2 (keys and
    values) x KV heads x head dimension x positions (kv_positions) x bytes per value (the
    model's dtype, as its weights')."""
    per_position = source.kv_bytes_per_position(source.run_shape(run), int(run.results["model"]["bytes_per_parameter"]))
    return per_position * kv_positions(run)


def step_bytes(run: runs.Run, vals: dict | None = None) -> pd.DataFrame:
    """The bytes one decode step reads, against the datasheet's bandwidth and the practical
    ceiling: the weights (the floor's bytes: the floor counts the weights only), the KV cache at
    the run's context (kv_cache_bytes), and both together."""
    f = floor(run, vals)
    kv = kv_cache_bytes(run)
    out = pd.DataFrame(
        {
            "read": ["weights (the floor's bytes)", f"KV cache, {kv_positions(run):,} positions", "the step"],
            "bytes": [f.decode_bytes, kv, f.decode_bytes + kv],
        }
    )
    out["MB"] = out.bytes / 1e6
    out["ms at the datasheet"] = out.bytes / f.datasheet_tbs / 1e9 if f.datasheet_tbs else float("nan")
    out["ms at the ceiling"] = out.bytes / f.ceiling_tbs / 1e9 if f.ceiling_tbs else float("nan")
    return out


def kernel_table(run: runs.Run, rung: str) -> pd.DataFrame:
    """Kernels of one rung's profiled step (from its raw trace), with kind and source."""
    device = run.provenance.get("device", "cuda")
    return kernels.annotate(trace.read_kernels(run.file(trace_file(rung)), device=device))


def _own_times(run: runs.Run, r: pd.DataFrame) -> pd.DataFrame:
    """Each own rung's time per token, by the book's estimator (the minimum) with the quartiles
    and the median: the CUDA events around each trial where the run has them (a graph replay is
    paced by the GPU alone), else the host's wall time (runs recorded before, or on a CPU)."""
    nan = float("nan")
    out = pd.DataFrame(index=r.index)
    for stat in ("min", "q1", "median", "q3", "max"):
        wall = r[f"wall_ms_{stat}"] if f"wall_ms_{stat}" in r else pd.Series(nan, index=r.index)
        gpu = r[f"gpu_ms_{stat}"] if f"gpu_ms_{stat}" in r else pd.Series(nan, index=r.index)
        out[stat] = gpu.where(gpu.notna(), wall)
    if "wall_ms_q1" not in r and "step_times.csv" in run.meta["files"]:  # runs recorded before: from the trials
        from labsupport.measure import harness

        t = run.table("step_times")
        for rung, g in t.groupby("rung"):
            if rung in out.index:
                w = list(g.wall_ms)
                out.loc[rung, "q1"], out.loc[rung, "q3"] = harness.quantile(w, 0.25), harness.quantile(w, 0.75)
    out["timed by"] = ["CUDA events" if g == g else "host clock" for g in (
        r["gpu_ms_min"] if "gpu_ms_min" in r else pd.Series(nan, index=r.index))]  # fmt: skip
    return out


def ladder(run: runs.Run, vals: dict | None = None) -> pd.DataFrame:
    """One row per rung of RUNGS, by key: where its numbers come from, whether it gives eager's
    answers, kernels, GPU busy (profiled), its time per token by the minimum (with quartiles,
    median and slowest where known), idle (time - busy), the weight bandwidth it reaches
    (bytes / time), its time over the floor and over the practical ceiling's time, and the ms
    it saves against the rung before it (the waterfall).

    The rungs of transformers' step (SHARED_RUNGS) are shared quantities: their kernels, busy
    and wall time are those of the owner's run (shared.values), never this run's own; in a run
    of another configuration (the tests' tiny model) they have none. This run's own rows give
    only whether they gave eager's answers. Our rungs are this run's, timed interleaved."""
    nan = float("nan")
    vals = shared_values() if vals is None else vals
    use_shared = is_shared_config(run, vals)
    r = run.table("rungs").set_index("rung")
    f = floor(run, vals)
    own = _own_times(run, r)
    rows = []
    for rung in RUNGS:
        here = r.loc[rung] if rung in r.index else None
        checked = here is not None and here.status == "ok"
        row = {"rung": rung, "same answers": bool(checked and str(here.passed) == "True") if checked else None}
        if rung in SHARED_RUNGS:
            p = SHARED_RUNGS[rung]
            v = vals.get(f"{p}_wall_ms") if use_shared else None
            if v is not None and v.value == v.value:
                owner = v.quantity.owner
                row |= {"status": "ok", "from": f"{owner} run {v.run.run_id}", "kernels": vals[f"{p}_kernels"].value,
                        "GPU busy ms": vals[f"{p}_gpu_busy_ms"].value, "ms": v.value}  # fmt: skip
                for stat in ("q1", "median", "q3"):
                    q = vals.get(f"{p}_wall_{stat}_ms")
                    row[stat] = q.value if q is not None else nan
                row["timed by"] = "host clock"
            else:
                row |= {"status": "shared: not in this configuration", "from": "–"}
        elif checked:
            row |= {"status": "ok", "from": f"this run {run.run_id}", "kernels": here.kernels,
                    "GPU busy ms": here.gpu_busy_ns / 1e6, "ms": own.loc[rung, "min"]}  # fmt: skip
            row |= {stat: own.loc[rung, stat] for stat in ("q1", "median", "q3", "max")}
            row["timed by"] = own.loc[rung, "timed by"]
            row["compile s"] = here.get("compile_s", nan)
        else:
            gone = "not in this run (recorded before this rung existed)"
            row |= {"status": short_status(here.status) if here is not None else gone, "from": "–"}
        rows.append(row)
    cols = ["rung", "status", "from", "same answers", "kernels", "GPU busy ms", "ms", "q1", "median", "q3", "max",
            "timed by", "compile s"]  # fmt: skip
    out = pd.DataFrame(rows).reindex(columns=cols)
    for c in ("kernels", "GPU busy ms", "ms", "q1", "median", "q3", "max", "compile s"):
        out[c] = pd.to_numeric(out[c], errors="coerce")
    out["wall ms"] = out["ms"]  # the step's time per token (the name the figures and older code read)
    out["idle ms"] = out["ms"] - out["GPU busy ms"]
    # Each rung against its own floor: the BF16 floor, or (FP8_RUNGS) the FP8 step's own bytes.
    f8 = fp8_floor(run, vals)
    own_floor = out.rung.isin(FP8_RUNGS) & (f8 is not None)
    nbytes = pd.Series(float(f.decode_bytes), index=out.index).where(~own_floor, f8.decode_bytes if f8 else 0)
    half = "fp16" if (run.parameters or {}).get("dtype") == "float16" else "bf16"  # the model's own weights
    out["weights"] = ["fp8" if r in FP8_RUNGS else half for r in out.rung]
    out["floor ms"] = pd.Series(f.floor_ms, index=out.index).where(~own_floor, f8.floor_ms if f8 else 0)
    ceiling_ms = pd.Series(f.ceiling_ms, index=out.index).where(~own_floor, f8.ceiling_ms if f8 else 0)
    out["TB/s"] = nbytes / 1e9 / out["ms"]
    out["x floor"] = out["ms"] / out["floor ms"]
    out["x ceiling"] = out["ms"] / ceiling_ms
    # The waterfall: what each rung saves against the last rung before it that ran.
    out["ms saved"] = out["ms"].ffill().shift(1) - out["ms"]
    return out.reset_index(drop=True)


def best(run: runs.Run) -> str:
    """The fastest rung that gives eager's answers (a rung that fails the check is not a result)."""
    d = ladder(run)
    good = d[(d.status == "ok") & d["same answers"].eq(True) & d["ms"].notna() & ~d.rung.isin(FP8_RUNGS)]
    return str(good.loc[good["ms"].idxmin(), "rung"])


def best_fp8(steps: pd.DataFrame) -> str | None:
    """The FP8 rung the page speaks of, from the ladder (`steps`): the fastest FP8 rung with numbers
    that gives eager's answers, else the fastest with numbers (its sentence says it fails); None
    where no FP8 rung has numbers (a run recorded before them, or every one failed to run)."""
    d = steps[steps.rung.isin(FP8_RUNGS) & (steps.status == "ok") & steps["ms"].notna()]
    passing = d[d["same answers"].eq(True)]
    d = passing if len(passing) else d
    return None if d.empty else str(d.loc[d["ms"].idxmin(), "rung"])


def time_split(run: runs.Run) -> pd.DataFrame:
    """Where each rung's time goes, in three parts that add up to it: the floor (the weights
    read once at the datasheet's bandwidth), kernel time above the floor (GPU-busy - floor), and
    the GPU idle (time - GPU-busy, from the unprofiled time and the profiled busy time)."""
    d = ladder(run)
    d = d[(d.status == "ok") & d["ms"].notna()]
    f = floor(run)
    # each rung's own floor (FP8's is its own bytes); a GPU without a known datasheet (a CPU) has none
    fl = d["floor ms"] if f.datasheet_tbs else 0.0
    return pd.DataFrame(
        {
            "rung": d.rung,
            "floor ms": fl,
            "kernels above floor ms": d["GPU busy ms"] - fl,
            "GPU idle ms": d["idle ms"],
            "wall ms": d["wall ms"],
        }
    ).reset_index(drop=True)


def census(run: runs.Run) -> pd.DataFrame:
    """Kernels and GPU ms by kind, one column pair (rung, "kernels" / "gpu_ms") per rung that
    ran (index: kind, total last)."""
    r = run.table("rungs")
    parts = []
    for rung in r.rung[(r.status == "ok") & r.rung.map(lambda x: trace_file(x) in run.meta["files"])]:
        c = kernels.census(kernel_table(run, rung)).set_index("kind")
        parts.append(c[["kernels", "gpu_ms"]].rename(columns=lambda col, rung=rung: (rung, col)))
    out = pd.concat(parts, axis=1)
    out.columns = pd.MultiIndex.from_tuples(out.columns)
    return out


def fidelity_table(run: runs.Run) -> pd.DataFrame:
    """Same answers, per rung: the largest logit difference from eager's, the largest error
    against the float32 step, that error over eager's own (a rung passes at ERROR_FACTOR or
    less, with eager's greedy token, on every call), cosine similarity with eager's logits, same
    token; and, in runs that called our rungs again after the check, how many of those calls gave
    logits other than the first's."""
    r = run.table("rungs")
    r = r[r.status == "ok"]
    table = pd.DataFrame(
        {
            "rung": r.rung,
            "max |Δ logit| vs eager": r.max_abs_diff,
            "max error vs float32": r.max_abs_err,
            "error / eager's": r.max_abs_err / r.eager_abs_err,
            "cosine": r.cosine,
            "same token": r.same_token.astype(str).eq("True"),
            "passed": r.passed.astype(str).eq("True"),
        }
    )
    if "replays" in r:  # recorded since our rungs are called again after the check (repeated_fidelity)
        table["calls differing"] = r.replays_differing.where(r.replays > 0)
        table["calls"] = r.replays.where(r.replays > 0)
    return table.reset_index(drop=True)


def matmuls(run: runs.Run) -> pd.DataFrame:
    """Each weight shape's matmul for one token: cuBLAS against our Triton GEMV, µs and TB/s,
    and each as a fraction of the datasheet's bandwidth (the limit) and of the practical ceiling."""
    m = run.table("matmuls")
    f = floor(run)
    out = m[["matrix", "n", "k", "bytes", "cublas_us", "triton_us", "cublas_tbs", "triton_tbs"]].copy()
    out["MB"] = out.bytes / 1e6
    for lib in ("cublas", "triton"):
        out[f"{lib} of datasheet"] = out[f"{lib}_tbs"] / f.datasheet_tbs if f.datasheet_tbs else float("nan")
        out[f"{lib} of ceiling"] = out[f"{lib}_tbs"] / f.ceiling_tbs if f.ceiling_tbs else float("nan")
    out["speed-up"] = out.cublas_us / out.triton_us
    return out


def remaining(run: runs.Run, rung: str) -> pd.DataFrame:
    """What the kernels of `rung`'s profiled step spent their time on, from its first kernel's
    start to its last kernel's end, by exclusive time (kernels.exclusive_times: a kernel launched
    with programmatic dependent launch starts early and its trace duration counts its wait, so
    each kernel is charged only the time no kernel before it was running): matmul kernels (beside
    what their weights take at the floor), every other kind of kernel, and the gaps between
    kernels. The rows add up to that span exactly. (The time before the first kernel and after the
    last is the profiler's and the replay call's; the clean wall time, measured without the
    profiler, is in `ladder`.)"""
    k = kernel_table(run, rung)
    k = k.join(kernels.exclusive_times(k))
    f = floor(run)
    by_kind = k.groupby("kind")["exclusive_ns"].sum()
    fl = f.floor_ms * 1e6 if f.datasheet_tbs else 0.0
    rows = [("matrix multiply kernels", int(by_kind.get("matrix multiply", 0)), fl)]
    rows += [(f"{kind} kernels", int(by_kind.get(kind, 0)), 0.0) for kind in kernels.KINDS if kind != "matrix multiply"]
    rows += [(f"{kind} kernels", int(ns), 0.0) for kind, ns in by_kind.items() if kind not in kernels.KINDS]
    rows.append(("gaps between kernels", int(k.gap_before_ns.sum()), 0.0))
    out = pd.DataFrame(rows, columns=["part", "ns", "floor_ns"])
    out = out[out.ns != 0]
    out["ms"] = out.ns / 1e6
    out["floor ms"] = out.floor_ns / 1e6
    out["above floor ms"] = out.ms - out["floor ms"]
    return out[["part", "ms", "floor ms", "above floor ms"]].reset_index(drop=True)


def census_by_rung(run: runs.Run, column: str = "kernels") -> pd.DataFrame:
    """census() turned for the page: one row per rung (key), one column per kind that has any
    kernel in some rung, and the total; `column` is "kernels" or "gpu_ms"."""
    c = census(run)
    counts = c.xs("kernels", axis=1, level=1)
    kinds = [k for k in c.index if k == "total" or (counts.loc[k] > 0).any()]
    return c.xs(column, axis=1, level=1).loc[kinds].T.rename_axis("rung").reset_index()


def tuning(run: runs.Run) -> pd.DataFrame:
    """Every GEMV config tried on every weight shape (in each way of launching it), and which won."""
    t = run.table("gemv_tuning")
    t["chosen"] = t.chosen.astype(str).eq("True")
    # runs recorded before split-K and FP8: BF16 weights, one kernel per GEMV
    t["chosen_split"] = t.chosen_split.astype(str).eq("True") if "chosen_split" in t else t.chosen
    t["weights"] = t.get("weights", "bf16")
    t["split_k"] = t.get("split_k", 1)
    # the persistent rung's trials (gemv.Config.ctas_per_sm > 0), tuned apart: runs before it have none
    t["persistent"] = t.get("ctas_per_sm", pd.Series(0, index=t.index)).fillna(0).astype(int) > 0
    # trials timed with PDL and the first weights before the wait, and the config kept for the rungs launched
    # so (gemv.CHOSEN_EARLY): runs before gemv.tune timed both ways have one table, which every rung ran
    t["early"] = t.early.astype(str).eq("True") if "early" in t else False
    t["chosen_early"] = t.chosen_early.astype(str).eq("True") if "chosen_early" in t else t.chosen
    # the configs the folded-norms step runs, where that step was timed whole with others (gemv.CHOSEN_FOLDED):
    # runs before it ran CHOSEN_EARLY's
    folded = t.chosen_folded.astype(str).eq("True") if "chosen_folded" in t else None
    t["chosen_folded"] = folded if folded is not None and folded.any() else t.chosen_early
    return t


def headline(run: runs.Run) -> dict:
    d = ladder(run).set_index("rung")
    b = best(run)
    f = floor(run)
    return {
        "best wall ms": float(d.loc[b, "ms"]),
        "best x floor": float(d.loc[b, "x floor"]),
        "best x ceiling": float(d.loc[b, "x ceiling"]),
        "floor ms": f.floor_ms,
    }


def fp8_error_factor(run: runs.Run | None = None) -> float:
    """The FP8 rung's allowed error over eager's in `run`'s dtype (a run without one: BF16)."""
    dtype = (run.parameters or {}).get("dtype", "bfloat16") if run is not None else "bfloat16"
    return FP8_ERROR_FACTOR if dtype == "bfloat16" else FP8_ERROR_FACTORS[dtype]


def next_to_published(run: runs.Run, published: pd.DataFrame) -> pd.DataFrame:
    """The best rung's time per token and its multiple of its floor (the datasheet's) and of the
    practical ceiling (where known), computed from the run, above the published references
    (`published`, quoted as published, in its columns: "x floor" and the time as text)."""
    b, f = best(run), floor(run)
    d = ladder(run).set_index("rung")
    rows = []
    model = f"Qwen3-8B {models.dtype_label(models.run_dtype(run))}"
    base = {"system": f"this book: {RUNGS[b]}", "model": model, "GPU": run.provenance["gpu"], "batch": "1",
            "time per token": f"{d.loc[b, 'ms']:.2f} ms", "source": f"run {run.run_id}"}  # fmt: skip
    if f.datasheet_tbs:
        rows.append(
            {**base, "x floor": f"{d.loc[b, 'x floor']:.2f}×", "floor from": f"datasheet ({f.datasheet_tbs:.1f} TB/s)"}
        )
    if f.ceiling_tbs:
        rows.append(
            {**base, "x floor": f"{d.loc[b, 'x ceiling']:.2f}×",
             "floor from": f"practical ceiling: best rate measured ({f.ceiling_tbs:.2f} TB/s)"}
        )  # fmt: skip
    return pd.concat([pd.DataFrame(rows, columns=published.columns), published], ignore_index=True)


def compiled_matmuls(lo_run: runs.Run, variant: str = "compile-max-autotune") -> dict | None:
    """What torch.compile did to the matrix multiplies in one of launch-overhead's profiled
    steps (its trace, `trace-<variant>.json.gz`): matmul kernels, how many of them are Triton
    kernels that Inductor generated (their names start with "triton"), how many of those also
    carry other work fused in (a mean: a norm; silu; an add), and how many are library calls
    (cuBLAS, CUTLASS). None where the run has no such trace."""
    name = f"trace-{variant}.json.gz"
    if name not in lo_run.meta["files"]:
        return None
    device = lo_run.provenance.get("device", "cuda")
    k = kernels.annotate(trace.read_kernels(lo_run.file(name), device=device))
    mm = k[k.kind == "matrix multiply"]
    gen = mm[mm.name.str.startswith("triton")]
    fused = gen[gen.name.str.contains("mean|silu|add", regex=True)]
    return {
        "kernels": len(mm),
        "generated": len(gen),
        "fused": len(fused),
        "library": len(mm) - len(gen),
        "gpu_ms": mm.dur_ns.sum() / 1e6,
    }


def matmul_launches(run: runs.Run, rung: str) -> pd.DataFrame:
    """How a rung's matrix-multiply kernels were launched, from its trace: one row per kernel
    name (shortened: kernels.short_name) and launch shape, with thread blocks (the grid),
    threads per block, shared memory per block, the grid over the GPU's SM count (its SMs from
    provenance: how many blocks each SM would take on if all ran at once, not how many fit on one),
    kernels per step and mean µs, slowest first. Empty for a run without launch
    shapes (a CPU)."""
    import math

    k = kernel_table(run, rung)
    mm = k[(k.kind == "matrix multiply") & k.grid.astype(str).str.contains(",")]
    if mm.empty:
        return pd.DataFrame(columns=["kernel", "blocks", "threads", "shared KB", "grid / SMs", "kernels", "µs"])
    g = mm.groupby(["name", "grid", "block", "shared_mem"], as_index=False).agg(
        kernels=("dur_ns", "size"), ns=("dur_ns", "mean")
    )
    dims = lambda s: math.prod(int(x) for x in str(s).split(","))  # noqa: E731
    sms = int(run.provenance.get("gpu_sms") or 0)
    out = pd.DataFrame(
        {
            "kernel": g.name.map(kernels.short_name),
            "blocks": g.grid.map(dims),
            "threads": g.block.map(dims),
            "shared KB": g.shared_mem / 1024,
            "kernels": g.kernels,
            "µs": g.ns / 1e3,
        }
    )
    out.insert(4, "grid / SMs", out.blocks / sms if sms else float("nan"))
    return out.sort_values("µs", ascending=False).reset_index(drop=True)


def overlaps(k: pd.DataFrame) -> dict:
    """How many of a profiled step's kernels (k: kernel_table) start before the kernel before them
    (in start order) has ended, and the time so shared: what programmatic dependent launch shows
    in a trace (on one stream, kernels launched without it never overlap)."""
    k = k.sort_values("start_ns")
    prev_end = k.end_ns.cummax().shift(1)
    over = (prev_end - k.start_ns).clip(lower=0).fillna(0)
    return {"kernels": len(k), "overlapping": int((over > 0).sum()), "overlap_us": float(over.sum() / 1e3)}


def shape_names(run: runs.Run) -> dict:
    """Weight names by (N, K), from matmuls.csv (where the run has it)."""
    if "matmuls.csv" not in run.meta["files"]:
        return {}
    m = run.table("matmuls")
    return {r.matrix: (int(r.n), int(r.k)) for r in m.itertuples()}


def tokens_per_forward(run: runs.Run) -> pd.DataFrame | None:
    """tokens_per_forward.csv with each width's time per token and both against the BF16 floor
    (one forward reads the weights once, whatever the tokens); None for a run without it."""
    if "tokens_per_forward.csv" not in run.meta["files"]:
        return None
    t = run.table("tokens_per_forward")
    f = floor(run)
    t["ms per token"] = t.ms_min / t.tokens
    t["forward x floor"] = t.ms_min / f.floor_ms
    t["token x floor"] = t["ms per token"] / f.floor_ms
    t["tokens/s"] = 1e3 / t["ms per token"]
    return t
