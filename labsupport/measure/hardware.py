"""Datasheet figures of common GPUs, live microbenchmarks of what decoding is limited by (a large
device-to-device copy, a large read stream, a large BF16 GEMM), and the practical ceiling: the
best read rate of a run (practical_ceiling), defined here once for every page."""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass

from labsupport.measure import datasheets

# The table and its sources live in datasheets.py; these names stay here for the chapters.
Datasheet = datasheets.Datasheet
DATASHEETS = datasheets.DATASHEETS


class UnknownGPUError(LookupError):
    """Raised when no datasheet is known for a GPU name."""


def datasheet(gpu_name: str) -> Datasheet:
    """The datasheet for the GPU torch reports as `gpu_name` (its whole name: datasheets.match).
    An unknown GPU raises UnknownGPUError that lists the known ones."""
    sheet = datasheets.match(gpu_name)
    if sheet is not None:
        return sheet
    known = "; ".join(DATASHEETS)
    raise UnknownGPUError(f"no datasheet for GPU {gpu_name!r}; known: {known}")


def datasheet_or_none(gpu_name: str) -> Datasheet | None:
    """datasheet(), but None for an unknown GPU (the chapters then show measured ceilings only)."""
    try:
        return datasheet(gpu_name)
    except UnknownGPUError:
        return None


def run_datasheet(run) -> Datasheet | None:
    """The datasheet of a run's GPU at the run's dtype: the sheet itself for BF16 (every run before
    the `dtype` parameter); for a run in float16, the sheet with its FP16 dense rate in the place
    of the BF16 one (`bf16_tflops`, which the ridge arithmetic reads). None for an unknown GPU or
    one without a rate in the run's dtype (a T4 in BF16), which the chapters treat alike."""
    import dataclasses

    sheet = datasheet_or_none(run.provenance["gpu"])
    dtype = (getattr(run, "parameters", None) or {}).get("dtype", "bfloat16")
    if sheet is None or dtype == "bfloat16":
        return sheet if sheet is None or sheet.bf16_tflops else None
    rate = sheet.tensor_tflops(dtype)
    return dataclasses.replace(sheet, bf16_tflops=rate) if rate else None


@dataclass
class Ceilings:
    """Rates measured on this GPU (medians): a device-to-device copy (bytes read and written:
    what a copy reaches, never a ceiling for reading), a read stream (bytes read; one of the reads
    the practical ceiling counts) and a BF16 GEMM rate."""

    copy_bytes: int
    copy_ms_median: float
    copy_ms_min: float
    copy_ms_max: float
    gemm_n: int
    gemm_ms_median: float
    gemm_ms_min: float
    gemm_ms_max: float
    repeats: int
    # Read stream: the faster of two readers over the same bytes (absent in older runs).
    read_bytes: int | None = None
    read_ms_median: float | None = None
    read_ms_min: float | None = None
    read_ms_max: float | None = None
    read_by: str | None = None

    @property
    def copy_tbs(self) -> float:
        """Bytes read plus bytes written, per second, in TB/s."""
        return 2 * self.copy_bytes / (self.copy_ms_median * 1e-3) / 1e12

    @property
    def read_tbs(self) -> float | None:
        """Bytes read per second, in TB/s (None when the run did not measure it)."""
        if not self.read_bytes or not self.read_ms_median or self.read_ms_median != self.read_ms_median:
            return None
        return self.read_bytes / (self.read_ms_median * 1e-3) / 1e12

    @property
    def gemm_tflops(self) -> float:
        return 2 * self.gemm_n**3 / (self.gemm_ms_median * 1e-3) / 1e12

    def as_row(self) -> dict:
        return {**asdict(self), "copy_tbs": self.copy_tbs, "read_tbs": self.read_tbs, "gemm_tflops": self.gemm_tflops}

    @classmethod
    def from_row(cls, row) -> Ceilings:
        """From a row of a run's `ceilings` table (older runs lack the read stream)."""

        def plain(v):
            v = v.item() if hasattr(v, "item") else v
            return None if isinstance(v, float) and v != v else v

        return cls(**{k: plain(row[k]) for k in cls.__dataclass_fields__ if k in row.index})


def dependent_launch() -> bool:
    """Whether the current GPU launches kernels with programmatic dependent launch (Hopper, compute
    capability 9.0, and later): the launch the last rungs of *Closing the gap* use, asked in one place
    by every kernel and timing that launches so."""
    import torch

    return torch.cuda.is_available() and torch.cuda.get_device_capability()[0] >= 9


# Not triton.testing.do_bench, on purpose: it would change what the published ceilings measure.
# do_bench (triton 3.x) zeroes a 256 MB buffer before every timed call to empty the L2, so each
# copy or read starts with L2 full of dirty lines it must write back first; ours times each call
# after the previous one finished, with whatever it left in L2 (nothing the next call reuses: the
# copy and read working sets are >= 2 GiB, and gemv's graph cycles through weight copies four times
# the L2), and its events enclose the call alone. do_bench also warms up and repeats for a fixed time (25, 100 ms)
# rather than a fixed count (3 and `repeats`), queues every timed call without waiting for the one
# before, and returns their mean where the callers here keep every time (the ceilings their median and minimum).
def time_cuda_ms(fn, repeats: int = 20, warmup: int = 3) -> list[float]:
    """Run fn() `warmup` times, then time `repeats` runs with CUDA events (ms each)."""
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return times


def graph_us_per_call(run, calls: int, repeats: int = 20, side_stream: bool = False) -> float:
    """Microseconds per call of a kernel as it runs inside a decode step's CUDA graph: `run()` makes
    `calls` calls; it is run once outside any capture (Triton compiles there; on a side stream with
    `side_stream`, as a step's warm-up runs), captured in one graph, and the graph's replays timed
    by CUDA events (time_cuda_ms): their median over `calls`."""
    import torch

    if side_stream:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            run()
        torch.cuda.current_stream().wait_stream(side)
    else:
        run()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()
    ms = sorted(time_cuda_ms(graph.replay, repeats=repeats))
    del graph
    return ms[len(ms) // 2] * 1e3 / calls


def measure_ceilings(
    copy_gib: float = 2.0, read_gib: float = 4.0, gemm_n: int = 8192, repeats: int = 20, dtype: str = "bfloat16"
) -> Ceilings:
    """Measure copy bandwidth, read bandwidth and BF16 GEMM rate on the current CUDA device
    (the read and the GEMM in `dtype`: "bfloat16", or "float16" for a run in float16).

    Every working set is far larger than the 50-60 MB L2 of current GPUs, so these measure
    DRAM. The read stream is timed with two readers of the same BF16 bytes, a sum and a
    matrix-vector product (what a decode step's weight reads are), and the faster counts.
    The GEMM runs on random data (zeros run faster and would flatter the rate).
    """
    import torch

    half = getattr(torch, dtype)  # two bytes either way

    # Each working set lives only inside its own function, so it is freed before the next one.
    def copy_ms(n_bytes):
        src = torch.empty(n_bytes, dtype=torch.uint8, device="cuda").random_(0, 255)
        dst = torch.empty_like(src)
        return time_cuda_ms(lambda: dst.copy_(src), repeats)

    def read_ms(rows, cols):
        w = torch.randn(rows, cols, device="cuda", dtype=half)
        x = torch.randn(cols, device="cuda", dtype=half)
        return {
            "sum": time_cuda_ms(lambda: w.sum(dtype=torch.float32), repeats),
            "matrix-vector product": time_cuda_ms(lambda: torch.mv(w, x), repeats),
        }

    def gemm_ms(n):
        a = torch.randn(n, n, device="cuda", dtype=half)
        b = torch.randn(n, n, device="cuda", dtype=half)
        return time_cuda_ms(lambda: a @ b, repeats)

    n_bytes = int(copy_gib * 2**30)
    copy_times = copy_ms(n_bytes)
    cols = 8192
    rows_ = int(read_gib * 2**30) // (2 * cols)
    readers = read_ms(rows_, cols)
    read_by = min(readers, key=lambda r: statistics.median(readers[r]))
    read_times = readers[read_by]
    read_bytes = rows_ * cols * 2  # BF16 or float16
    gemm_times = gemm_ms(gemm_n)
    torch.cuda.empty_cache()
    return Ceilings(
        copy_bytes=n_bytes,
        copy_ms_median=statistics.median(copy_times),
        copy_ms_min=min(copy_times),
        copy_ms_max=max(copy_times),
        gemm_n=gemm_n,
        gemm_ms_median=statistics.median(gemm_times),
        gemm_ms_min=min(gemm_times),
        gemm_ms_max=max(gemm_times),
        repeats=repeats,
        read_bytes=read_bytes,
        read_ms_median=statistics.median(read_times),
        read_ms_min=min(read_times),
        read_ms_max=max(read_times),
        read_by=read_by,
    )


def record_ceilings(w, progress=print, dtype: str = "bfloat16") -> Ceilings:
    """Measure the ceilings on this GPU and write them as the run's `ceilings` table (the read
    and GEMM in the run's `dtype`)."""
    import pandas as pd

    progress(f"measuring copy and read bandwidth and {'BF16' if dtype == 'bfloat16' else dtype} GEMM rate")
    ceil = measure_ceilings(dtype=dtype)
    w.write_table("ceilings", pd.DataFrame([ceil.as_row()]))
    progress(
        f"  copy {ceil.copy_tbs:.2f} TB/s, read {ceil.read_tbs:.2f} TB/s ({ceil.read_by}), "
        f"GEMM {ceil.gemm_tflops:.0f} TFLOP/s"
    )
    return ceil


# The practical ceiling: the best rate at which any kernel of the ceilings owner's run (why-a-gpu)
# read memory. Reading only, never a copy's bytes read plus written: a copy switches the memory
# between reading and writing and moves less than a kernel that only reads, so a GEMV beats it.
# Counted: the read stream (ceilings.csv) and every kernel of its `read_kernels` table (the book's
# own Triton GEMV and cuBLAS at each weight matrix of the decode step, the LM head included).
# A kernel the book shows may read faster than the published ceiling by at most CEILING_TOLERANCE,
# the run-to-run noise of one kernel timed on two nights (ops.validate refuses a run beyond it).
READ_KERNELS = "read_kernels"
CEILING_TOLERANCE = 0.01


@dataclass(frozen=True)
class ReadRate:
    """One kernel's read rate in a run: what it is, the shape it read, TB/s of bytes read."""

    kernel: str
    shape: str
    tbs: float


def read_rates(run) -> list[ReadRate]:
    """Every read rate the run recorded that counts towards the practical ceiling: the read stream
    (ceilings.csv) and each row of its read-kernels table (older runs have none of it: their best
    read is the read stream). Empty for a run without either (a CPU)."""
    files = run.meta["files"]
    out = []
    if "ceilings.csv" in files:
        c = Ceilings.from_row(run.table("ceilings").iloc[0])
        if c.read_tbs:
            out.append(ReadRate(f"read stream ({c.read_by})", f"{c.read_bytes / 2**30:.0f} GiB", c.read_tbs))
    if f"{READ_KERNELS}.csv" in files:
        for r in run.table(READ_KERNELS).itertuples():
            kernel = f"{r.kernel} ({r.config})" if isinstance(r.config, str) and r.config else str(r.kernel)
            out.append(ReadRate(kernel, f"{r.matrix}, {r.n:,} x {r.k:,}", float(r.tbs)))
    return out


def practical_ceiling(run) -> ReadRate | None:
    """The practical ceiling of a run: its fastest read (read_rates), or None where it read nothing."""
    rates = [r for r in read_rates(run) if r.tbs == r.tbs]
    return max(rates, key=lambda r: r.tbs) if rates else None


@dataclass
class Limits:
    """The ceilings a run is compared against: the datasheet's and those measured in the run."""

    datasheet_name: str | None
    datasheet_tflops: float | None
    datasheet_tbs: float | None
    gemm_tflops: float | None  # measured: a large GEMM in the run's dtype (BF16 unless it says float16)
    copy_tbs: float | None  # measured: a large device-to-device copy (bytes read + written); shown, never a ceiling
    read_tbs: float | None = None  # measured: a large read stream (bytes read); older runs lack it
    ceiling_tbs: float | None = None  # the practical ceiling (practical_ceiling): the best read rate measured
    ceiling_by: str | None = None  # the kernel that reached it, and its shape

    @property
    def datasheet_ridge(self) -> float | None:
        """FLOP per byte above which the datasheet's math, not its bandwidth, is the limit."""
        return self.datasheet_tflops / self.datasheet_tbs if self.datasheet_tflops else None

    @property
    def measured_ridge(self) -> float | None:
        """The book's one measured ridge: the measured GEMM rate over the practical ceiling."""
        return self.gemm_tflops / self.ceiling_tbs if self.gemm_tflops and self.ceiling_tbs else None


def run_limits(run) -> Limits:
    """The ceilings of a recorded run: its GPU's datasheet (if known), its `ceilings` table (if it
    measured one) and its practical ceiling (practical_ceiling)."""
    sheet = datasheet_or_none(run.provenance["gpu"])
    dtype = (getattr(run, "parameters", None) or {}).get("dtype", "bfloat16")  # runs before the parameter: BF16
    has_ceil = "ceilings.csv" in run.meta["files"]
    ceil = Ceilings.from_row(run.table("ceilings").iloc[0]) if has_ceil else None
    best = practical_ceiling(run)
    return Limits(
        datasheet_name=sheet.name if sheet else None,
        datasheet_tflops=sheet.tensor_tflops(dtype) if sheet else None,
        datasheet_tbs=sheet.bandwidth_tbs if sheet else None,
        gemm_tflops=ceil.gemm_tflops if has_ceil else None,
        copy_tbs=ceil.copy_tbs if has_ceil else None,
        read_tbs=ceil.read_tbs if has_ceil else None,
        ceiling_tbs=best.tbs if best else None,
        ceiling_by=f"{best.kernel}, {best.shape}" if best else None,
    )


def of_bandwidth(nbytes: float, ms, tbs: float | None):
    """The fraction of bandwidth `tbs` that moving `nbytes` in `ms` milliseconds reaches
    (NaN when the bandwidth is unknown)."""
    return nbytes / (ms / 1e3) / (tbs * 1e12) if tbs else float("nan")


def above_ceiling_note(what: str, tbs: float, lim: Limits) -> str:
    """The sentences a read rate `tbs` (TB/s) needs when it is above the practical ceiling or the
    datasheet's bandwidth; empty when it is below them both. `what` names it ("The LM head")."""
    sheet = lim.datasheet_tbs
    if tbs != tbs:
        return ""
    if sheet and tbs > sheet:
        return (
            f"{what} is above even the datasheet's {sheet:.1f} TB/s, which reading from memory cannot "
            "exceed: part of what it read came from the L2 cache, or the measurement is wrong; this run "
            "cannot tell which."
        )
    if lim.ceiling_tbs and tbs > lim.ceiling_tbs:
        below_sheet = (
            f" The hardware's limit is the datasheet's {sheet:.1f} TB/s, and {what[0].lower() + what[1:]} "
            f"stays below it ({tbs / sheet:.0%})."
            if sheet
            else ""
        )
        return (
            f"{what} is faster than the practical ceiling, {lim.ceiling_tbs:.2f} TB/s ({lim.ceiling_by}): the "
            "best read rate measured in the run that sets it, not a limit of the hardware, and that run timed "
            "no kernel at this one's rate." + below_sheet
        )
    return ""
