"""Profile any piece of GPU work with torch.profiler and read back its kernels."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from . import trace


def record_trace(fn, path: Path, device: str = "cuda", warmup: int = 2, origin: str = "region") -> None:
    """Run fn() `warmup` times, then once under torch.profiler, inside an annotation named
    `origin`; write the Chrome trace to `path` (.json.gz is compressed).

    The profiler itself is started once untraced first, so CUPTI's start-up cost stays
    out of the recorded region.
    """
    from torch.profiler import ProfilerActivity, profile, record_function

    from .decode import sync

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    for _ in range(warmup):
        fn()
    sync(device)
    for _ in range(2):  # the first profile warms the profiler up; the second is kept
        with profile(activities=activities) as prof:
            with record_function(origin):
                fn()
            sync(device)
    prof.export_chrome_trace(str(path))


def kernels_of(fn, path: Path, device: str = "cuda", warmup: int = 2, origin: str = "region") -> pd.DataFrame:
    """record_trace(), then the kernel table of the recorded region."""
    record_trace(fn, path, device=device, warmup=warmup, origin=origin)
    return trace.read_kernels(path, device=device, origin=origin)
