"""A loaded run's basic tables: the model's shape, each phase's kernels, and the ceilings
(datasheet and measured) that every rate is set against."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import pandas as pd

from labsupport import runs
from labsupport.measure import hardware
from labsupport.traces import kernels

from .measure import annotated_kernels
from .names import TEXT_COLUMNS, kernels_table_name, trace_file
from .work import ModelShape


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
        return runs.load_run(shared.CEILINGS, root=Path(root))
    except runs.RunError:  # no published ceilings run (a scratch runs folder)
        return None


@dataclass(frozen=True)
class Bandwidth:
    """The measured bandwidth that a pass reading weights is set against: the read stream
    where the run measured one, else the copy (which counts bytes read plus written, so a
    kernel that mostly reads can beat it)."""

    tbs: float | None
    name: str  # for prose: "measured read stream", ...
    short: str  # for labels: "measured read", "measured copy"


def bandwidth(lim: Limits) -> Bandwidth:
    if lim.read_tbs:
        return Bandwidth(lim.read_tbs, "measured read stream", "measured read")
    if lim.copy_tbs:
        return Bandwidth(lim.copy_tbs, "measured copy (bytes read + written)", "measured copy")
    return Bandwidth(None, "no measured bandwidth", "measured bandwidth")


def measured_ridge(lim: Limits) -> float | None:
    """FLOP per byte of weights above which the measured GEMM rate, not the measured
    bandwidth for reading weights, is the limit."""
    bw = bandwidth(lim).tbs
    return lim.gemm_tflops / bw if lim.gemm_tflops and bw else None


def ratio(value: float, limit: float | None) -> float | None:
    return value / limit if limit else None
