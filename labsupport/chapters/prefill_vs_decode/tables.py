"""The tables the page of "Prompt phase vs decode phase" shows, each laid out for reading from a
loaded run (the page's numbers and texts are page.py's)."""

from __future__ import annotations

import pandas as pd

from labsupport import glue, runs

from .analysis import census, layer_gemm_kernels, layer_gemm_table, passes_table, prompt_sweep
from .ceilings import ridge_table, roofline_table
from .measuring import PHASES, SHORT


def passes_download(run: runs.Run):
    """The link to every number of the passes' table, unrounded, with the limits it is set against."""
    return glue.csv_download(
        passes_table(run),
        f"prefill-vs-decode-{run.run_id}.csv",
        "every number of this table, unrounded, with the limits it is set against",
    )


def census_shown(run: runs.Run):
    """The kernels of both passes by kind: count, GPU time and share."""
    counts = census(run)
    return glue.table(
        counts.set_axis([" ".join(c) for c in counts.columns], axis=1).reset_index(),
        formats={
            f"{phase} {column}": fmt
            for phase in PHASES
            for column, fmt in (("kernels", "{:,.0f}"), ("GPU ms", "{:.2f}"), ("share", "{:.0%}"))
        },
        csv_href=glue.run_csv_href(run, "census.csv"),
    )


def _side_by_side(table: pd.DataFrame, columns: dict) -> pd.DataFrame:
    """The (group, quantity) columns named in `columns`, under their one-line names."""
    return table[list(columns)].set_axis(list(columns.values()), axis=1).reset_index()


def layer_gemms_shown(run: runs.Run):
    """The seven matrix multiplies of the compared layer in both phases (the prefill's TB/s left out:
    the prefill is judged by its TFLOP/s); and the kernels that did them."""
    columns = {
        ("weight", "in × out"): "in × out",
        ("prefill", "µs"): "prefill µs",
        ("prefill", "TFLOP/s"): "prefill TFLOP/s",
        ("decode", "µs"): "decode µs",
        ("decode", "TFLOP/s"): "decode TFLOP/s",
        ("decode", "TB/s"): "decode TB/s",
    }
    return glue.table(
        _side_by_side(layer_gemm_table(run), columns),
        formats={"prefill µs": "{:,.1f}", "prefill TFLOP/s": "{:,.0f}", "decode µs": "{:,.1f}"}
        | {"decode TFLOP/s": "{:.2f}", "decode TB/s": "{:.2f}"},
    )


def layer_kernels_shown(run: runs.Run):
    return glue.table(layer_gemm_kernels(run), wrap=("kernels",))


def roofline_shown(run: runs.Run):
    """The numbers behind the roofline's points (the weights' shapes are in the layer's table; the
    prefill's rows are its prompt)."""
    columns = {
        ("prefill", "FLOP/byte"): "prefill FLOP/byte",
        ("prefill", "TFLOP/s"): "prefill TFLOP/s",
        ("prefill", "of roof"): "prefill of roof",
        ("decode", "FLOP/byte"): "decode FLOP/byte",
        ("decode", "TB/s"): "decode TB/s",
        ("decode", "of roof"): "decode of roof",
    }
    return glue.table(
        _side_by_side(roofline_table(run).rename(index=SHORT).rename_axis("matrix"), columns),
        formats={"prefill FLOP/byte": "{:,.1f}", "prefill TFLOP/s": "{:,.1f}", "prefill of roof": "{:.0%}"}
        | {"decode FLOP/byte": "{:.2f}", "decode TB/s": "{:.2f}", "decode of roof": "{:.0%}"},
    )


def sweep_shown(run: runs.Run):
    """The prompt sweep, one row per prompt length (the matrix multiplies' FLOP per byte, about the
    prompt length, is in the CSV)."""
    columns = {
        "prompt_len": "tokens",
        "kernels": "kernels",
        "wall ms": "wall ms",
        "GPU ms": "GPU ms",
        "matmul ms": "matmul ms",
        "matmul TFLOP/s": "matmul TFLOP/s",
        "TFLOP/s": "TFLOP/s, wall",
    }
    return glue.table(
        prompt_sweep(run)[list(columns)].rename(columns=columns),
        formats={"tokens": "{:,}", "kernels": "{:,}", "wall ms": "{:,.2f}", "GPU ms": "{:,.2f}", "matmul ms": "{:,.2f}"}
        | {"matmul TFLOP/s": "{:.1f}", "TFLOP/s, wall": "{:.1f}"},
        csv_href=glue.run_csv_href(run, "prompt_sweep.csv"),
    )


def _pair(first: float, second: float, first_format: str, second_format: str) -> str:
    return "–" if first != first else f"{first_format.format(first)} / {second_format.format(second)}"


def ridges_shown(run: runs.Run):
    """Each GPU's ridge, raw and normalised, against the prefill of this run."""
    table = ridge_table(run)
    return glue.table(
        pd.DataFrame(
            {
                "GPU, limits": table.GPU + ", " + table.limits,
                "peak TFLOP/s / TB/s": [
                    _pair(peak, tbs, "{:.0f}", "{:.2f}")
                    for peak, tbs in zip(table["peak TFLOP/s"], table["TB/s"], strict=True)
                ],
                "ridge FLOP/byte": table["ridge FLOP/byte"],
                "ridge, prompt tokens": table["ridge, prompt tokens"],
                "prefill ÷ ridge": table["prefill ÷ ridge"],
                "crossover ÷ ridge": table["crossover ÷ ridge"],
                "prefill MFU, wall / GPU busy": [
                    _pair(wall, busy, "{:.1%}", "{:.1%}")
                    for wall, busy in zip(table["prefill MFU, wall"], table["prefill MFU, GPU busy"], strict=True)
                ],
            }
        ),
        formats={
            "ridge FLOP/byte": "{:.0f}",
            "ridge, prompt tokens": "{:.0f}",
            "prefill ÷ ridge": "{:.2f}×",
            "crossover ÷ ridge": "{:.2f}×",
        },
        wrap=("GPU, limits",),
    )
