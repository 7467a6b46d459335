"""The tables the page of "One token on two GPUs" shows, each laid out for reading from a loaded run (the
page's numbers and texts are page.py's)."""

from __future__ import annotations

import pandas as pd

from labsupport import glue, runs

from .analysis import allreduce_curve, census, main_form, references, steps_shown, time_split
from .params import VARIANTS


def steps_table(run: runs.Run, one_gpu_ms: dict[str, float], one_gpu_from: dict[str, str]):
    """Every rank's step per form and degree; the one-GPU walls are the book's shared ones (Page.one_gpu_ms,
    from the runs Page.one_gpu_from names)."""
    shown = steps_shown(run, one_gpu_ms, one_gpu_from).assign(variant=lambda d: d.variant.map(VARIANTS))
    return glue.table(
        shown.drop(columns=["wall min ms", "wall max ms", "wall median ms"]),
        formats={
            "GPU busy ms": "{:.2f}",
            "GPU idle ms": "{:.2f}",
            "communication ms": "{:.3f}",
            "wall ms": "{:.2f}",
            "tokens/s": "{:.1f}",
            "speed-up over TP=1": "{:.2f}×",
        },
        csv_href=glue.run_csv_href(run, "variants.csv"),
    )


def time_split_shown(run: runs.Run):
    """The main form's GPU time by kind, one GPU against the busier split rank and a perfect split."""
    by_kind = time_split(run, main_form(run))
    return glue.table(by_kind.reset_index(), formats={column: "{:.2f}" for column in by_kind.columns})


def census_shown(run: runs.Run):
    """Each rank's kernels by kind, one profiled main form per degree and rank (GPU time in ms)."""
    per_rank = census(run, main_form(run))
    return glue.table(
        per_rank.reset_index(), formats={column: "{:.3f}" for column in per_rank.columns if column[1] == "gpu_ms"}
    )


def allreduce_shown(run: runs.Run):
    """The all-reduce curve, launched one by one and from a CUDA graph."""
    curves = {"one by one": allreduce_curve(run), "CUDA graph": allreduce_curve(run, "CUDA graph")}
    return glue.table(
        pd.concat(curves, names=["launch"]).reset_index(0),
        formats={
            "latency_us": "{:.1f}",
            "latency_us_slowest_rank": "{:.1f}",
            "algbw_gbs": "{:.2f}",
            "busbw_gbs": "{:.2f}",
        },
        max_rows=20,
        csv_href=glue.run_csv_href(run, "allreduce.csv"),
    )


def references_shown(run: runs.Run):
    """This run's main form and NCCL at 32 KB against the published numbers."""
    return glue.table(
        references(run, main_form(run)), formats={"this run": "{:.2f}", "published": "{:.2f}"}, wrap=("source",)
    )
