"""Chapter "What a kernel is": one vector add as one kernel (torch's and our Triton one),
its launch configuration, the same add on vectors too large for the L2 cache, and the
asynchronous queue between the CPU and the GPU.

The notebook measures (live) with the harness and the helpers of `measure`, writes the run,
then reads it back with `analysis` and draws with `figures`."""

from .analysis import (
    Cache,
    add_kernels,
    add_table,
    burst_kernels,
    cache,
    hbm_add,
    hbm_text,
    headline,
    l2_text,
    launch_config,
    launches,
    load,
    queue_summary,
    sync_costs,
)
from .figures import queue
from .measure import (
    BURST_TRACE,
    CHAPTER,
    OUR_ADD,
    PROFILE_REGION,
    SYNC_IDLE,
    SYNC_ITEM,
    SYNC_TINY,
    TORCH_ADD,
    Params,
    l2_cache_bytes,
    per_call_row,
    progress,
)

__all__ = [
    "BURST_TRACE",
    "CHAPTER",
    "OUR_ADD",
    "PROFILE_REGION",
    "SYNC_IDLE",
    "SYNC_ITEM",
    "SYNC_TINY",
    "TORCH_ADD",
    "Cache",
    "Params",
    "add_kernels",
    "add_table",
    "burst_kernels",
    "cache",
    "hbm_add",
    "hbm_text",
    "headline",
    "l2_cache_bytes",
    "l2_text",
    "launch_config",
    "launches",
    "load",
    "per_call_row",
    "progress",
    "queue",
    "queue_summary",
    "sync_costs",
]
