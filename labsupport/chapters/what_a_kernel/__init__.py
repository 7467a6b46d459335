"""Chapter "What a kernel is": one vector add as one kernel (torch's and our Triton one),
its launch configuration, the same add on vectors too large for the L2 cache, and the
asynchronous queue between the CPU and the GPU.

The notebook measures (live) with the harness and the helpers of `measuring`, writes the run,
then reads it back with `analysis`, draws with `figures`, and `page` gives every number and text
the page glues, and its tables."""

# ruff: noqa: F401, I001 (these imports are the package's public names, wrapped to read as a list)
from __future__ import annotations

# fmt: off
from .analysis import (
    add_kernels, add_table, burst_kernels, cache, Cache, hbm_add, hbm_text, headline, l2_text, launch_config,
    launches, per_call_us, queue_summary, sync_costs, sync_table,
)
from .figures import (
    queue,
)
from .measuring import (
    BURST_TRACE, CHAPTER, l2_cache_bytes, load, OUR_ADD, per_call_row, PROFILE_REGION, progress, SYNC_IDLE,
    SYNC_ITEM, SYNC_TINY, TORCH_ADD, wait_row,
)
from .page import (
    hbm_display, Page, page, TABLE_FORMATS, triton_add_source,
)
from .declaration import (
    DECLARATION, Params,
)
# fmt: on
