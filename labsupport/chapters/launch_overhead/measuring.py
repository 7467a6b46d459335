"""What the notebook's live cells call beyond the harness and the steps: the run they fill cell
by cell, the status a variant that fails gets, and the row of each profiled variant."""

from __future__ import annotations

import shutil
import statistics
import tempfile
from pathlib import Path

import pandas as pd

from labsupport.chapters.launch_overhead.params import CHAPTER, VARIANT_COLUMNS, VARIANTS, Params, progress
from labsupport.measure import hardware, harness, recording
from labsupport.measure.steps import CompiledStep
from labsupport.traces import trace


class PendingRun:
    """A run measured across several notebook cells and written by the last one, whole.

    Created first: the checks every live run makes (a known preset, a GPU), the provenance and
    the run id (recording.writer), how the numbers are taken (harness.method) and, on a GPU,
    the ceilings (hardware.record_ceilings). Then each cell adds tables (`write_table`),
    results (`extra`) and traces (under `path`, a scratch folder); `write()` puts them all into
    the run at once. A cell that fails leaves no run behind."""

    def __init__(self, params: Params, run_id: str | None = None, allow_cpu: bool = False):
        harness.for_chapter(CHAPTER)
        self.writer = recording.writer(CHAPTER, params, run_id, allow_cpu=allow_cpu)
        self.tables: dict[str, pd.DataFrame] = {}
        self.extra: dict = {"method": harness.method()}
        self._scratch = tempfile.TemporaryDirectory(prefix=f"{CHAPTER}-")
        self.path = Path(self._scratch.name)
        if params.device == "cuda":
            hardware.record_ceilings(self, progress)

    def write_table(self, name: str, df: pd.DataFrame) -> None:
        self.tables[name] = df

    def write(self) -> str:
        """Write the run (tables, traces, results); returns its id."""
        with self.writer as w:
            for name, df in self.tables.items():
                w.write_table(name, df)
            for p in sorted(self.path.iterdir()):
                if p.is_file() and not p.name.startswith("."):
                    shutil.copyfile(p, w.path / p.name)
            w.extra.update(self.extra)
        self._scratch.cleanup()
        return w.run_id


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
    variant: str, k: pd.DataFrame, t: harness.Timing, span_ns: int, compiled: int, step, device: str
) -> dict:
    """The row of variants.csv of a variant timed (`t`) and profiled (kernels `k`, the profiled
    step's span, graphs Dynamo compiled while profiling)."""
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
        "wall_ms_median": t.median,
        "wall_ms_min": t.low,
        "wall_ms_max": t.high,
        "issue_ms_median": statistics.median(t.issue_ms),
        "clean": t.clean,
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
