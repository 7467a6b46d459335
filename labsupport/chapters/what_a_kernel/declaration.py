"""What "What a kernel is" declares: its run's files and its parameters."""

from __future__ import annotations

from dataclasses import dataclass

from labsupport.chapters.declaring import CEILINGS_LINE, DEVICE, KERNELS, REPEATS, Chapter, File, Parameters, param
from labsupport.chapters.rules import between


@dataclass
class Params(Parameters):
    n: int = param(1 << 20, check=between(1, 1 << 31))  # elements of the vector add (fits in the L2 cache)
    block: int = param(1024, check=between(32, 8192))  # elements per program of our Triton kernel
    num_warps: int = param(4, check=between(1, 32))
    burst: int = param(200, check=between(1, 100_000), smoke=50)  # launches in the queue demonstration
    burst_n: int = param(1 << 26, check=between(1, 1 << 31))  # elements per add in the burst: the GPU lags
    # elements per vector of the add that does not fit in L2 (3 GiB moved)
    hbm_n: int = param(1 << 28, check=between(1, 1 << 31), smoke=1 << 26)
    repeats: int = param(100, check=REPEATS, smoke=20)  # timed calls of each add
    device: str = param("cuda", check=DEVICE)


# fmt: off
DECLARATION = Chapter(
    "what-a-kernel",
    (
        File("ceilings.csv", CEILINGS_LINE),
        File("add_kernels.csv", "the kernels of each vector-add implementation, as profiled",
             KERNELS + ("implementation",), required=True),
        File("add_times.csv", "the time of each vector-add implementation, per call and on the GPU",
             ("implementation", "ms_median", "bytes"), required=True),
        File("hbm_add.csv", "the vector add on a working set too large for the L2 cache (HBM bandwidth)"),
        File("queue.csv", "a burst of launches: when each call started and returned on the CPU, when the GPU finished",
             ("launch", "call_start_us", "call_return_us", "gpu_done_us"), required=True),
        File("sync.csv", "what waiting for the GPU costs, by kind of wait", ("what", "us_median"), required=True),
        File("burst_trace.json.gz", "the raw profiler trace of the burst of launches (opens in Perfetto)",
             required=True),
    ),
    Params,
    reads=("why-a-gpu",),
)
# fmt: on
