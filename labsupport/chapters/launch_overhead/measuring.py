"""What the notebook's live cells call beyond the harness and the steps: the run they fill cell
by cell, the status a variant that fails gets, and the row of each profiled variant."""

from __future__ import annotations

import pandas as pd

from labsupport.chapters.launch_overhead.declaration import Params
from labsupport.chapters.launch_overhead.params import DECLARATION, VARIANT_COLUMNS, VARIANTS, progress
from labsupport.measure import harness, recording
from labsupport.measure.steps import CompiledStep
from labsupport.traces import kernels


def pending_run(params: Params, run_id: str | None = None) -> recording.PendingRun:
    """The chapter's run, filled cell by cell and written by the last live cell
    (recording.PendingRun). It measures no ceilings: the page compares with those of the ceilings
    owner's run (shared.limits())."""
    return recording.PendingRun(DECLARATION, params, run_id, ceilings=False, progress=progress)


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


# The timing columns of a variant this chapter profiles but does not time.
UNTIMED = {
    **dict.fromkeys(
        ("wall_ms_median", "wall_ms_min", "wall_ms_q1", "wall_ms_q3", "wall_ms_max", "issue_ms_median"), float("nan")
    ),
    "clean": "",
}


def variant_row(
    variant: str, k: pd.DataFrame, t: harness.Timing | None, span_ns: int, compiled: int, step, device: str
) -> dict:
    """The row of variants.csv of a variant profiled (kernels `k`, the profiled step's span,
    graphs Dynamo compiled while profiling) and, for the forms this chapter times, timed (`t`;
    None for the eager steps, whose wall times are "The kernels in one token"'s)."""
    launches = int((k.launch_api != "").groupby(k.correlation).ngroups) if device == "cuda" else len(k)
    row = {
        "variant": variant,
        "status": "ok",
        **kernels.profile_row(k, total=False, bounds=True),
        "profiled_step_ns": span_ns,
        "launch_calls": launches,
        **(t.summary(fast=False, issue=True, count=None) if t else UNTIMED),
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
