"""Profile any piece of GPU work and read back its kernels: a thin front to the harness."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from labsupport.measure import harness


def kernels_of(fn, path: Path, device: str = "cuda", warmup: int = 2, origin: str = "region") -> pd.DataFrame:
    """Profile fn() (after `warmup` traced-and-discarded runs in the same profiler session)
    inside an annotation named `origin`; write the Chrome trace to `path`; return the kernels
    launched inside the annotation."""
    return harness.profile_region(fn, path, region=origin, device=device, warmup=warmup)


def record_trace(fn, path: Path, device: str = "cuda", warmup: int = 2, origin: str = "region") -> None:
    """kernels_of(), for when only the trace file is wanted."""
    kernels_of(fn, path, device=device, warmup=warmup, origin=origin)
