"""What the notebook's live cells call beyond the harness and the steps: the run they fill cell
by cell, the status a variant that fails gets, and the row of each profiled variant."""

from __future__ import annotations

import statistics

import pandas as pd

from labsupport.chapters.launch_overhead.params import CHAPTER, VARIANT_COLUMNS, VARIANTS, Params, progress
from labsupport.measure import harness, recording
from labsupport.measure.steps import CompiledStep
from labsupport.traces import trace


def pending_run(params: Params, run_id: str | None = None, allow_cpu: bool = False) -> recording.PendingRun:
    """The chapter's run, filled cell by cell and written by the last live cell
    (recording.PendingRun). It measures no ceilings: the page compares with those of the ceilings
    owner's run (shared.limits())."""
    return recording.PendingRun(CHAPTER, params, run_id, allow_cpu=allow_cpu, ceilings=False, progress=progress)


def first_line(e: BaseException) -> str:
    msg = next((ln for ln in str(e).splitlines() if ln.strip()), "")
    return f"{type(e).__name__}: {msg[:200]}"


def failure(when: str, e: Exception) -> str:
    """The status of a variant that failed `when` ("failed", or "failed while profiling (after it
    was timed)"): a variant that cannot run here is recorded, not hidden. The harness's own
    errors (a timing after a profile, a profile without GPU kernels) are raised again: they stop
    the recording. Out of GPU memory, the cache is emptied for the next variant."""
    import torch

    if isinstance(e, (harness.TimingError, harness.ProfileError)):
        raise e
    if isinstance(e, torch.OutOfMemoryError):
        torch.cuda.empty_cache()
    return f"{when}: {first_line(e)}"


def variant_row(
    variant: str, k: pd.DataFrame, t: harness.Timing | None, span_ns: int, compiled: int, step, device: str
) -> dict:
    """The row of variants.csv of a variant profiled (kernels `k`, the profiled step's span,
    graphs Dynamo compiled while profiling) and, for the forms this chapter times, timed (`t`;
    None for the eager steps, whose wall times are "The kernels in one token"'s)."""
    nan = float("nan")
    launches = int((k.launch_api != "").groupby(k.correlation).ngroups) if device == "cuda" else len(k)
    row = {
        "variant": variant,
        "status": "ok",
        "kernels": len(k),
        "gpu_busy_ns": trace.busy_ns(k.start_ns, k.end_ns),
        "first_kernel_ns": int(k.start_ns.min()),
        "last_kernel_end_ns": int(k.end_ns.max()),
        "profiled_step_ns": span_ns,
        "launch_calls": launches,
        "wall_ms_median": t.median if t else nan,
        "wall_ms_min": t.low if t else nan,
        "wall_ms_q1": t.q1 if t else nan,
        "wall_ms_q3": t.q3 if t else nan,
        "wall_ms_max": t.high if t else nan,
        "issue_ms_median": statistics.median(t.issue_ms) if t else nan,
        "clean": t.clean if t else "",
        "graphs_compiled_while_profiling": compiled,
    }
    if isinstance(step, CompiledStep):
        row["compile_s"] = step.compile_s
    return row


def variants_table(rows: dict[str, dict], status: dict[str, str]) -> pd.DataFrame:
    """variants.csv: one row per variant in the order of VARIANTS, the profiled ones (`rows`)
    complete, the others with the reason they have no numbers (`status`)."""
    out = [rows[v] if v in rows else {"variant": v, "status": status[v]} for v in VARIANTS if v in rows or v in status]
    return pd.DataFrame(out, columns=VARIANT_COLUMNS)
