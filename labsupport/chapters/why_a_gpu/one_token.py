"""One token's arithmetic against the GPU's two limits, and one weight matrix times one vector
on the CPU and the GPU: the run's tables, the numbers the chapter quotes, its sentences."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from labsupport import runs
from labsupport.measure import hardware, models

from .measuring import HOST_CLOCK, KERNEL_TIME, PER_CALL
from .read_kernels import TRITON_EARLY

# The rows of the arithmetic table (data keys; labels come from ceilings_label at display time).
DATASHEET, MEASURED = "datasheet", "measured"


def only(values: pd.Series):
    """The one value a column holds in every row (the table's constant)."""
    u = values.unique()
    if len(u) != 1:
        raise ValueError(f"expected one value of {values.name!r}, found {list(u)}")
    return u[0]


def ceilings(run: runs.Run) -> hardware.Ceilings:
    """The ceilings measured in the run (its one-row ceilings table)."""
    c = run.table("ceilings")
    return hardware.Ceilings.from_row(c.squeeze(axis=0))


def counts(run: runs.Run) -> models.ModelCounts:
    m = run.results["model"]
    return models.ModelCounts(**{k: m[k] for k in models.ModelCounts.__dataclass_fields__})


def per_token_arithmetic(
    counts: models.ModelCounts,
    sheet: hardware.Datasheet | None,
    memory_tbs: float | None = None,
    gemm_tflops: float | None = None,
    dtype: str = "bfloat16",
) -> pd.DataFrame:
    """Time for one token's weights at peak math and at peak memory bandwidth (the
    datasheet's at `dtype`'s tensor rate, and the ceilings measured in the run: `memory_tbs` is
    the read stream where the run measured one, else the copy). Rows keyed by `ceilings`:
    DATASHEET, MEASURED."""
    rows = []
    limits = []
    if sheet and sheet.tensor_tflops(dtype):
        limits.append((DATASHEET, sheet.tensor_tflops(dtype), sheet.bandwidth_tbs))
    if memory_tbs and gemm_tflops:
        limits.append((MEASURED, gemm_tflops, memory_tbs))
    for key, tflops, tbs in limits:
        math_ms = counts.decode_flops / (tflops * 1e12) * 1e3
        mem_ms = counts.decode_bytes / (tbs * 1e12) * 1e3
        rows.append(
            {
                "ceilings": key,
                "TFLOP/s": tflops,
                "TB/s": tbs,
                "math ms": math_ms,
                "memory ms": mem_ms,
                "memory / math": mem_ms / math_ms,
                "ridge FLOP/byte": tflops / tbs,
            }
        )
    columns = ["ceilings", "TFLOP/s", "TB/s", "math ms", "memory ms", "memory / math", "ridge FLOP/byte"]
    return pd.DataFrame(rows, columns=columns)  # no rows for a GPU without a datasheet or ceilings (a CPU)


def practical_ceiling_tbs(run: runs.Run) -> float | None:
    """The practical ceiling: the best rate at which any kernel of the run read memory
    (hardware.practical_ceiling: the read stream and the read kernels, never a copy)."""
    return hardware.run_limits(run).ceiling_tbs


def arithmetic(run: runs.Run) -> pd.DataFrame:
    """The per-token arithmetic at the datasheet's rates and at the run's: the practical ceiling
    (practical_ceiling_tbs) and the measured GEMM rate."""
    lim = hardware.run_limits(run)
    return per_token_arithmetic(
        counts(run),
        hardware.datasheet_or_none(run.provenance["gpu"]),
        practical_ceiling_tbs(run),
        lim.gemm_tflops,
        models.run_dtype(run),
    )


def ceilings_label(run: runs.Run, key: str) -> str:
    """How the chapter names a row of the arithmetic table."""
    if key == DATASHEET:
        return f"{hardware.run_limits(run).datasheet_name} datasheet"
    return "measured on this GPU"


def arithmetic_rows(run: runs.Run) -> tuple[pd.Series, pd.Series]:
    """The arithmetic table's datasheet row and measured row; a row of NaN where the run has no
    datasheet or no ceilings (a CPU run)."""
    ar = arithmetic(run).set_index("ceilings")
    nan_row = pd.Series(float("nan"), index=ar.columns)
    return tuple(ar.loc[key] if key in ar.index else nan_row for key in (DATASHEET, MEASURED))


def arithmetic_display(run: runs.Run) -> pd.DataFrame:
    """The arithmetic table as the chapter shows it: rows named by their labels."""
    ar = arithmetic(run)
    return ar.assign(ceilings=[ceilings_label(run, k) for k in ar.ceilings]).set_index("ceilings")


def matvec(run: runs.Run) -> pd.DataFrame:
    """The matrix-vector product's table, with what each time is (`timing`). Older runs
    timed the CPU with the host clock and the GPU per call with CUDA events, and did not
    profile the GPU's kernel."""
    mv = run.table("matvec")
    if "timing" not in mv:
        mv["timing"] = [HOST_CLOCK if d.startswith("CPU") else PER_CALL for d in mv.device]
    return mv


@dataclass
class Matvec:
    """The product's headline numbers (ms); `gpu_kernel_ms` is None for runs that did not
    profile it."""

    shape: str
    mb: float  # the BF16 weight matrix
    cpu_threads: str
    cpu32_ms: float
    cpu32_gbs: float
    cpu16_ms: float
    gpu_call_ms: float
    gpu_call_gbs: float
    gpu_kernel_ms: float | None
    gpu_kernel_gbs: float | None
    kernels: list[str]

    @property
    def cpu_fair_ms(self) -> float:
        """The CPU's faster product (float32 on CPUs without a fast BF16 path)."""
        return min(self.cpu32_ms, self.cpu16_ms)

    @property
    def gpu_ms(self) -> float:
        """The GPU's kernel time where the run profiled it, else its time per call."""
        return self.gpu_kernel_ms if self.gpu_kernel_ms is not None else self.gpu_call_ms

    @property
    def speedup(self) -> float:
        return self.cpu_fair_ms / self.gpu_ms


def matvec_summary(run: runs.Run) -> Matvec:
    mv = matvec(run)
    on_cpu = mv.device.str.startswith("CPU")
    cpu = mv[on_cpu].set_index("dtype")
    gpu = mv[~on_cpu].set_index("timing")
    call = gpu.loc[PER_CALL]
    kernel = gpu.loc[KERNEL_TIME] if KERNEL_TIME in gpu.index else None
    half = models.run_dtype(run)  # the model's half-precision type: BF16 unless the run says float16
    bf16 = only(mv.loc[mv.dtype == half, "bytes"])
    return Matvec(
        shape=only(mv["shape"]),
        mb=float(bf16) / 1e6,
        cpu_threads=only(cpu.device).split("(")[-1].rstrip(")"),
        cpu32_ms=float(cpu.loc["float32", "ms_median"]),
        cpu32_gbs=float(cpu.loc["float32", "GB/s"]),
        cpu16_ms=float(cpu.loc[half, "ms_median"]),
        gpu_call_ms=float(call.ms_median),
        gpu_call_gbs=float(call["GB/s"]),
        gpu_kernel_ms=float(kernel.ms_median) if kernel is not None else None,
        gpu_kernel_gbs=float(kernel["GB/s"]) if kernel is not None else None,
        kernels=list(run.results.get("matvec_kernels", [])),
    )


def memory_ceiling_text(run: runs.Run) -> str:
    """The practical ceiling and what reached it; the copy beside it, as what a copy reaches."""
    lim = hardware.run_limits(run)
    gemv = (matvec_summary(run).gpu_kernel_gbs or matvec_summary(run).gpu_call_gbs) / 1e3
    if not lim.ceiling_tbs:  # a run without ceilings (a CPU): the product alone
        return f"the matrix-vector product below read its matrix at {gemv:.2f} TB/s"
    parts = []
    if lim.read_tbs:
        parts.append(
            f"a large read stream (the faster of a sum and a matrix-vector product over the same bytes: "
            f"the {ceilings(run).read_by}) read {lim.read_tbs:.2f} TB/s"
        )
    if "read_kernels.csv" in run.meta["files"]:
        rk = run.table("read_kernels")
        both = " (alone, and with dependent launch and weights first)" if rk.kernel.eq(TRITON_EARLY).any() else ""
        parts.append(
            f"cuBLAS and the book's own Triton GEMV{both}, timed at each of the {rk.matrix.nunique()} weight shapes "
            f"a decode step reads, reached {rk.tbs.max():.2f} TB/s at best (`read_kernels.csv`)"
        )
    best = "The best of these" if len(parts) > 1 else "That"
    text = "; ".join(parts) + (
        f". {best}, {lim.ceiling_tbs:.2f} TB/s ({lim.ceiling_by}), is the practical ceiling: the fastest any "
        "kernel read this GPU's memory in this run"
    )
    if lim.copy_tbs:
        text += (
            f". A large device-to-device copy moved {lim.copy_tbs:.2f} TB/s counting the bytes it read and those "
            f"it wrote, so it read at {lim.copy_tbs / 2:.2f} TB/s: a copy's figure is not a read rate, and no page "
            "uses it as a ceiling"
        )
    return text


def matvec_text(run: runs.Run) -> str:
    """The product on both sides: the GPU's kernel time and time per call, the CPU in
    float32 and BF16 (runs from before had no kernel time)."""
    m, lim = matvec_summary(run), hardware.run_limits(run)
    if m.gpu_kernel_ms is not None:
        n = len(m.kernels)
        names = f" (`{'`, `'.join(m.kernels)}`)" if n else ""
        count = "one kernel" if n == 1 else f"{n} kernels" if n else "its kernels"
        vs = []
        if lim.datasheet_tbs:
            vs.append(
                f"{m.gpu_kernel_gbs / (lim.datasheet_tbs * 1e3):.0%} of the {lim.datasheet_name} datasheet's "
                f"{lim.datasheet_tbs:.1f} TB/s"
            )
        if lim.ceiling_tbs:
            vs.append(f"{m.gpu_kernel_gbs / (lim.ceiling_tbs * 1e3):.0%} of the practical ceiling")
        of_read = f" ({'; '.join(vs)})" if vs else ""
        gpu = (
            f"On the GPU the product ran as {count}{names} for {m.gpu_kernel_ms * 1e3:.1f} µs, reading the "
            f"matrix at {m.gpu_kernel_gbs:,.0f} GB/s{of_read}. One call from Python, timed with CUDA events just "
            f"before and after it, took {m.gpu_call_ms * 1e3:.1f} µs: the difference is the CPU getting the "
            "launch out (the chapter *What a kernel is*)."
        )
        gpu_what = "the GPU's kernel time"
    else:
        gpu = (
            f"On the GPU one call from Python, timed with CUDA events just before and after it, took "
            f"{m.gpu_call_ms * 1e3:.1f} µs ({m.gpu_call_gbs:,.0f} GB/s over the whole call); this run did not "
            "profile the kernel alone, so that time includes getting the launch out."
        )
        gpu_what = "the GPU's time per call"
    who = f"{run.provenance.get('cpu', 'the host CPU')}, {m.cpu_threads}"
    if m.cpu16_ms > m.cpu32_ms:
        cpu = (
            f"The CPU ({who}) needs {m.cpu32_ms:.2f} ms in float32, reading {m.cpu32_gbs:,.0f} GB/s: "
            f"**{m.speedup:,.0f} times** {gpu_what}. In BF16 it took {m.cpu16_ms:.2f} ms, longer although it "
            "reads half the bytes: on a CPU, PyTorch's BF16 matrix-vector product is a slow path, so float32 "
            "is the fair CPU number."
        )
    else:
        cpu = (
            f"The CPU ({who}) needs {m.cpu16_ms:.2f} ms in BF16 ({m.cpu32_ms:.2f} ms in float32, "
            f"{m.cpu32_gbs:,.0f} GB/s): **{m.speedup:,.0f} times** {gpu_what}."
        )
    return gpu + " " + cpu


def shared(run: runs.Run) -> dict:
    """The quantities this chapter measures for the whole book (labsupport.chapters.shared): the
    datasheet, the measured ceilings, the floor (the step's bytes over the datasheet bandwidth)
    the practical ceiling (practical_ceiling_tbs) and the one measured ridge (the GEMM rate over it)."""
    sheet = hardware.datasheet_or_none(run.provenance["gpu"])
    c = hardware.run_limits(run)  # a run without ceilings (on a CPU): NaN
    step_bytes = counts(run).decode_bytes
    ceiling = c.ceiling_tbs
    nan = float("nan")
    return {
        "datasheet_tbs": sheet.bandwidth_tbs if sheet else nan,
        "datasheet_tflops": (sheet.tensor_tflops(models.run_dtype(run)) or nan) if sheet else nan,
        "copy_tbs": c.copy_tbs or nan,
        "read_tbs": c.read_tbs if c.read_tbs else nan,
        "gemm_tflops": c.gemm_tflops or nan,
        "step_gb": step_bytes / 1e9,
        "floor_ms": step_bytes / 1e9 / sheet.bandwidth_tbs if sheet else nan,
        "ceiling_tbs": ceiling if ceiling else nan,
        "ceiling_ms": step_bytes / 1e9 / ceiling if ceiling else nan,
        "measured_ridge": c.measured_ridge or nan,
    }
