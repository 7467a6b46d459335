"""The page of "From model code to kernels": every number and short text its prose glues, and the
tables it shows, from one run and the published decode step of "The kernels in one token"."""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

from labsupport import runs
from labsupport.glue import NOT_GLUED
from labsupport.measure import models

from . import (
    ACT,
    AS_WRITTEN,
    DECODE_CHAPTER,
    GATE,
    OURS,
    decode_kernels,
    kernels_per_layer,
    middle_layer,
    mlp_kernels,
    mlp_table,
    op_to_kernels,
    rmsnorm_kernels,
    rmsnorm_table,
)

# Each table's column formats, by the Page field that holds the table.
TABLE_FORMATS = {
    "mlp_kernel_table": {"µs": "{:.2f}"},
    "mlp_table": {"GPU µs": "{:.2f}", "MB moved": "{:.2f}", "GB/s": "{:,.0f}"},
    "rmsnorm_kernel_table": {"µs": "{:.2f}"},
    "rmsnorm_table": {
        "GPU µs (profiler)": "{:.2f}",
        "per call µs (CUDA events)": "{:.1f}",
        "median µs": "{:.1f}",
        "max |difference|": "{:.2e}",
    },
    "layer_table": {"GPU µs": "{:.2f}"},
}


@dataclass
class Page:
    """The three-line MLP and RMSNorm, profiled line by line, RMSNorm fused into one kernel, and one
    decoder layer of the recorded decode step, operator by operator."""

    run_label: str
    tokens: int
    matrices_dtype: str
    # the MLP
    mlp_kernels: int
    mlp_us: float
    gemm_us: float
    gemm_gbs: float
    gemm_mb: float
    gemm_kernels: int
    gemm_text: str
    ew_us: float
    ew_kernels: int
    ew_kb: float
    # RMSNorm
    rms_kernels: int
    rms_us: float
    rms_us_median: float
    rms_gpu_us: float
    fused_kernels: int
    fused_us: float
    fused_us_median: float
    fused_gpu_us: float
    fused_err: float
    rms_gpu_speedup: float
    # the decoder layer
    layer_kernels: float  # NaN without a recorded decode step
    decode_label: str
    # the takeaways and the exercises
    tk_gemm_share: float
    tk_gpu_saved: float
    tk_call_saved: float
    # what the tables and the figure show
    mlp_kernel_table: pd.DataFrame = field(metadata=NOT_GLUED)
    mlp_table: pd.DataFrame = field(metadata=NOT_GLUED)
    rmsnorm_kernel_table: pd.DataFrame = field(metadata=NOT_GLUED)
    rmsnorm_table: pd.DataFrame = field(metadata=NOT_GLUED)
    rmsnorm_gpu_us: pd.Series = field(metadata=NOT_GLUED)  # each variant's GPU µs, for the figure
    layer_table: pd.DataFrame | None = field(metadata=NOT_GLUED)  # None without a recorded decode step


def gemm_text(kernel_names: list[str]) -> str:
    """What the kernels of one matrix multiply are: one cuBLAS kernel, or a split-K pair."""
    if len(kernel_names) > 1:
        return (
            f"Each matrix multiply is {len(kernel_names)} kernels here (`{'`, `'.join(kernel_names)}`): cuBLAS split "
            "the long product into pieces computed in parallel and added the pieces up in a second, small kernel "
            '("split-K").'
        )
    return (
        f"Each matrix multiply is one kernel from cuBLAS (`{kernel_names[0]}`), chosen by cuBLAS for this shape; "
        'for other shapes it splits the product into pieces and adds them up in a second kernel ("split-K"), '
        "as the decoder layer below shows."
    )


def page(run: runs.Run, root=None) -> Page:
    """The page of `run`, with the decode step published under the runs folder `root` (default:
    the book's); without one, the layer's numbers are NaN and the label says why."""
    lines = mlp_table(run).set_index("line")
    variants = rmsnorm_table(run).set_index("variant")
    as_written, ours = variants.loc[AS_WRITTEN], variants.loc[OURS]
    try:
        decode_run = runs.load_run(DECODE_CHAPTER, root=root)
        decode_kernel_table = decode_kernels(decode_run)
        layer_kernels = kernels_per_layer(decode_kernel_table)
        decode_label = f"run `{decode_run.run_id}` of the chapter *The kernels in one token*"
        layer_table = op_to_kernels(decode_kernel_table, middle_layer(decode_run))
    except runs.RunError as e:
        layer_kernels, decode_label, layer_table = float("nan"), f"no recorded decode step: {e}", None
    mlp_us = lines["GPU µs"].sum()
    return Page(
        run_label=run.cited,
        tokens=run.parameters["tokens"],
        matrices_dtype=models.dtype_label(models.run_dtype(run)),  # runs before the parameter: BF16
        mlp_kernels=int(lines.kernels.sum()),
        mlp_us=float(mlp_us),
        gemm_us=float(lines.loc[GATE, "GPU µs"]),
        gemm_gbs=float(lines.loc[GATE, "GB/s"]),
        gemm_mb=float(lines.loc[GATE, "MB moved"]),
        gemm_kernels=int(lines.loc[GATE, "kernels"]),
        gemm_text=gemm_text(lines.loc[GATE, "kernel names"].split("; ")),
        ew_us=float(lines.loc[ACT, "GPU µs"]),
        ew_kernels=int(lines.loc[ACT, "kernels"]),
        ew_kb=float(lines.loc[ACT, "MB moved"]) * 1e3,
        rms_kernels=int(as_written.kernels),
        rms_us=float(as_written["per call µs (CUDA events)"]),
        rms_us_median=float(as_written["median µs"]),
        rms_gpu_us=float(as_written["GPU µs (profiler)"]),
        fused_kernels=int(ours.kernels),
        fused_us=float(ours["per call µs (CUDA events)"]),
        fused_us_median=float(ours["median µs"]),
        fused_gpu_us=float(ours["GPU µs (profiler)"]),
        fused_err=float(ours["max |difference|"]),
        rms_gpu_speedup=float(as_written["GPU µs (profiler)"] / ours["GPU µs (profiler)"]),
        layer_kernels=layer_kernels,
        decode_label=decode_label,
        tk_gemm_share=float((mlp_us - lines.loc[ACT, "GPU µs"]) / mlp_us),
        tk_gpu_saved=float(as_written["GPU µs (profiler)"] - ours["GPU µs (profiler)"]),
        tk_call_saved=float(as_written["per call µs (CUDA events)"] - ours["per call µs (CUDA events)"]),
        mlp_kernel_table=mlp_kernels(run),
        mlp_table=lines.reset_index(),
        rmsnorm_kernel_table=rmsnorm_kernels(run),
        rmsnorm_table=variants.reset_index(),
        rmsnorm_gpu_us=variants["GPU µs (profiler)"],
        layer_table=layer_table,
    )
