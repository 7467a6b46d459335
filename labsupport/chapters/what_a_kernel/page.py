"""The page of "What a kernel is": every number and short text its prose glues, and the tables and
kernels it shows, from one run."""

from __future__ import annotations

import inspect
import textwrap
from dataclasses import dataclass, field

import pandas as pd

from labsupport import runs
from labsupport.glue import NOT_GLUED
from labsupport.measure.kernels import triton_kernels

from .analysis import (
    add_kernels,
    add_table,
    burst_kernels,
    hbm_add,
    hbm_text,
    l2_text,
    launches,
    per_call_us,
    queue_summary,
    sync_costs,
    sync_table,
)
from .measuring import OUR_ADD, SYNC_IDLE, SYNC_ITEM, SYNC_TINY, TORCH_ADD

# Each table's column formats, by the Page field that holds the table (the waits' table: every µs column).
TABLE_FORMATS = {
    "launch_table": {"threads": "{:,d}", "µs": "{:.2f}"},
    "add_times_table": {
        "kernel µs (profiler)": "{:.2f}",
        "per call µs (CUDA events)": "{:.1f}",
        "GB/s during the kernel": "{:,.0f}",
    },
    "hbm_table": {
        "elements per vector": "{:,d}",
        "GiB moved": "{:.1f}",
        "ms per call (median)": "{:.3f}",
        "GB/s": "{:,.0f}",
        "of datasheet": "{:.0%}",
        "of measured copy": "{:.0%}",
    },
}


@dataclass
class Page:
    """One vector add as one kernel (torch's and our Triton one): its launch, its two clocks, the
    same add out of the cache, the queue between the CPU and the GPU, and what waiting costs."""

    run_label: str
    n: int
    kernels_torch: int
    torch_kernel: str
    ours_kernel: str
    match: str
    # the launches
    torch_blocks: int
    torch_tpb: int
    torch_threads: int
    per_thread: float
    ours_blocks: int
    ours_tpb: int
    block: int
    num_warps: int
    gpu_sms: int
    # the two clocks
    torch_us: float
    ours_us: float
    torch_us_median: float
    ours_us_median: float
    torch_kernel_us: float
    ours_kernel_us: float
    kernel_gbs: float
    mb: float
    repeats_timed: int
    l2_text: str
    hbm_text: str
    # the queue (queue_summary, prefixed q_)
    burst: int
    burst_m: float
    q_launch_call_us: float
    q_launch_call_us_q1: float
    q_launch_call_us_median: float
    q_launch_call_us_q3: float
    q_host_issue_all_ms: float
    q_gpu_done_all_ms: float
    q_host_sync_returned_ms: float
    q_gpu_per_add_us: float
    q_queue_depth_at_last_launch: int
    q_add_tbs: float
    q_add_mb: float
    # waiting
    sync_us: float
    item_us: float
    tiny_us: float
    tk_kernel_share: float  # the share of one call of torch's add the GPU ran the kernel
    # what the tables and the figures show
    launch_table: pd.DataFrame = field(metadata=NOT_GLUED)
    add_times_table: pd.DataFrame = field(metadata=NOT_GLUED)
    hbm_table: pd.DataFrame | None = field(metadata=NOT_GLUED)  # None: the run timed no add out of the cache
    sync_table: pd.DataFrame = field(metadata=NOT_GLUED)
    sync_formats: dict = field(metadata=NOT_GLUED)  # the waits' table: every µs column to one decimal
    burst_kernels: pd.DataFrame = field(metadata=NOT_GLUED)  # the profiled burst's kernels, for the timeline


def triton_add_source() -> str:
    """The source of our Triton kernels, as the page prints it."""
    return textwrap.dedent(inspect.getsource(triton_kernels).split("@triton.jit")[1]).strip()


def hbm_display(run: runs.Run) -> pd.DataFrame | None:
    """The adds out of the cache as the page shows them (None: the run did not time them)."""
    hbm = hbm_add(run)
    if hbm is None:
        return None
    return hbm.assign(GiB=hbm.bytes / 2**30)[
        ["implementation", "n", "GiB", "ms_median", "GB/s", "of datasheet", "of measured copy"]
    ].rename(columns={"n": "elements per vector", "GiB": "GiB moved", "ms_median": "ms per call (median)"})


def page(run: runs.Run) -> Page:
    """The page of `run`."""
    parameters = run.parameters
    config = launches(run)
    times = run.table("add_times").set_index("implementation")
    clocks = add_table(run)
    waits = sync_costs(run)
    torch_launch, our_launch = config.loc[TORCH_ADD], config.loc[OUR_ADD]
    waits_table = sync_table(run)
    return Page(
        run_label=run.cited,
        n=parameters["n"],
        kernels_torch=int((add_kernels(run).implementation == TORCH_ADD).sum()),
        torch_kernel=f"`{torch_launch.kernel}`",
        ours_kernel=f"`{our_launch.kernel}`",
        match="exactly the same numbers as" if run.results["triton_matches_torch"] else "NOT the same numbers as",
        torch_blocks=int(torch_launch.blocks),
        torch_tpb=int(torch_launch["threads per block"]),
        torch_threads=int(torch_launch.threads),
        per_thread=parameters["n"] / torch_launch.threads,
        ours_blocks=int(our_launch.blocks),
        ours_tpb=int(our_launch["threads per block"]),
        block=parameters["block"],
        num_warps=parameters["num_warps"],
        gpu_sms=run.provenance.get("gpu_sms", float("nan")),
        torch_us=per_call_us(run, TORCH_ADD),
        ours_us=per_call_us(run, OUR_ADD),
        torch_us_median=times.loc[TORCH_ADD, "ms_median"] * 1e3,
        ours_us_median=times.loc[OUR_ADD, "ms_median"] * 1e3,
        torch_kernel_us=float(clocks.loc[TORCH_ADD, "kernel µs (profiler)"]),
        ours_kernel_us=float(clocks.loc[OUR_ADD, "kernel µs (profiler)"]),
        kernel_gbs=float(clocks.loc[TORCH_ADD, "GB/s during the kernel"]),
        mb=times.loc[TORCH_ADD, "bytes"] / 1e6,
        repeats_timed=int(times.loc[TORCH_ADD, "repeats"]),
        l2_text=l2_text(run),
        hbm_text=hbm_text(run),
        burst=parameters["burst"],
        burst_m=parameters["burst_n"] / 1e6,
        **{f"q_{name}": value for name, value in queue_summary(run).items()},
        sync_us=waits[SYNC_IDLE],
        item_us=waits[SYNC_ITEM],
        tiny_us=waits[SYNC_TINY],
        tk_kernel_share=float(clocks.loc[TORCH_ADD, "kernel µs (profiler)"] / per_call_us(run, TORCH_ADD)),
        launch_table=config.reset_index()[
            ["implementation", "kernel", "grid (blocks)", "block (threads)", "threads", "registers/thread", "µs"]
        ],
        add_times_table=clocks.reset_index(),
        hbm_table=hbm_display(run),
        sync_table=waits_table,
        sync_formats={column: "{:.1f}" for column in waits_table.columns if column != "what"},
        burst_kernels=burst_kernels(run),
    )
