"""The tables the page of "A hybrid model's token" shows, each laid out for reading from a loaded run
(the page's numbers and texts are page.py's)."""

from __future__ import annotations

import pandas as pd

from labsupport import glue, runs
from labsupport.chapters import published

from .analysis import (
    beside_published,
    best_variant,
    census_by_group,
    census_by_kind,
    kernel_table,
    largest_kernels,
    mixer_by_module,
    mixer_kernels,
    per_layer_type,
    time_budget,
    variants,
    variants_compact,
)
from .figures import csv_link
from .idle import host_before_first_kernel, idle_places, prefill_host_device, step_gaps
from .measuring import MODES


def _flat(table: pd.DataFrame) -> pd.DataFrame:
    """A table with two levels of columns under one-line names ("reference kernels")."""
    return table.set_axis([" ".join(c) for c in table.columns], axis=1).reset_index()


def census_shown(run: runs.Run):
    """The eager steps' kernels by kind, reference code and flash-linear-attention side by side."""
    by_kind = census_by_kind(run)
    return glue.table(
        _flat(by_kind),
        formats={
            f"{backend} {column}": fmt
            for backend in by_kind.columns.levels[0]
            for column, fmt in (("kernels", "{:,.0f}"), ("GPU ms", "{:.2f}"), ("share", "{:.0%}"))
        },
    )


def groups_shown(run: runs.Run):
    """The reference step's GPU time by the part of the model that launched each kernel."""
    groups = census_by_group(kernel_table(run, "reference", "eager"))
    return glue.table(groups.reset_index(), formats={"kernels": "{:,.0f}", "GPU ms": "{:.2f}", "share": "{:.0%}"})


def layer_types_shown(run: runs.Run):
    """One layer of each type (the MLP's and the norms' kernel counts left out: the same in both)."""
    types = per_layer_type(kernel_table(run, "reference", "eager")).reset_index()
    return glue.table(
        types[["layer type", "layers", "kernels per layer", "GPU µs per layer", "mixer kernels", "mixer µs", "MLP µs"]],
        formats={"layers": "{:.0f}", "kernels per layer": "{:.0f}", "mixer kernels": "{:.0f}"}
        | {"GPU µs per layer": "{:,.1f}", "mixer µs": "{:,.1f}", "MLP µs": "{:,.1f}"},
    )


def mixer_shown(run: runs.Run):
    """One Gated DeltaNet layer's token mixer by module, for each backend."""
    mixer = mixer_by_module(run)
    return glue.table(
        _flat(mixer),
        formats={" ".join(c): ("{:,.0f}" if c[1] == "kernels" else "{:,.1f}") for c in mixer.columns},
        wrap=("module",),
    )


def mixer_kernel_links(run: runs.Run):
    """For each backend whose eager step ran, every kernel of that layer's token mixer as a CSV download."""
    from IPython.display import HTML

    ran = variants(run).query("status == 'ok' and mode == 'eager'").backend.values
    links = [
        csv_link(
            mixer_kernels(kernel_table(run, backend, "eager")),
            f"{run.run_id}-{backend}-gated-deltanet-layer-kernels.csv",
            f"Every kernel of that layer's token mixer, {backend}, in launch order",
        ).data
        for backend in ("reference", "fla")
        if backend in ran
    ]
    return HTML("".join(links))


def variants_shown(run: runs.Run):
    """Every backend and mode (launch calls, the share of the measured read and the compile time are in
    variants.csv)."""
    compact = variants_compact(run)
    shown = compact.assign(variant=compact.backend + ": " + compact["mode"])
    return glue.table(
        shown[
            ["variant", "kernels", "GPU busy ms", "wall ms", "median (quartiles) ms", "tokens/s", "of datasheet limit"]
        ],
        formats={"kernels": "{:,.0f}", "GPU busy ms": "{:.2f}", "wall ms": "{:.2f}", "tokens/s": "{:.1f}"}
        | {"of datasheet limit": "{:.0%}"},
        csv_href=glue.run_csv_href(run, "variants.csv"),
    )


def time_budget_shown(run: runs.Run):
    """Each variant's wall time in three parts, with its GEMM and split-K kernels and its matrix multiplies' rate."""
    budget = time_budget(run)
    shown = budget.assign(
        variant=[f"{b}: {MODES[m]}" for b, m in zip(budget.backend, budget["mode"], strict=True)],
        **{
            "GEMM + split-K kernels": [
                f"{g:,.0f} + {s:,.0f}"
                for g, s in zip(budget["GEMM kernels"], budget["split-K reduce kernels"], strict=True)
            ]
        },
    )
    times = ["matrix multiplies ms", "other kernels ms", "GPU idle ms", "wall ms"]
    return glue.table(
        shown[["variant", *times, "GEMM + split-K kernels", "matmul TB/s"]],
        formats={column: "{:.2f}" for column in (*times, "matmul TB/s")},
    )


def idle_places_shown(run: runs.Run):
    """Every stretch of the fastest variant's profiled step without a kernel, by where it falls, with the
    kernel each waits for (the kernels before the largest gaps are named in the text)."""
    backend, mode = best_variant(run)
    return glue.table(
        idle_places(step_gaps(run, backend, mode), width=30).drop(columns=["group", "kernel before"]),
        formats={"gaps": "{:,d}", "idle ms": "{:.2f}", "median µs": "{:,.2f}"},
        wrap=("kernel after", "also in the gaps"),
    )


def host_events_shown(run: runs.Run):
    """The host's calls before the fastest variant's first kernel, in order, an event inside another indented."""
    host = host_before_first_kernel(run, *best_variant(run))
    return glue.table(
        host.assign(event=["\u2003" * d + e for d, e in zip(host.depth, host.event, strict=True)]).drop(
            columns="depth"
        ),
        formats={"starts at ms": "{:.2f}", "lasts ms": "{:.2f}"},
        wrap=("event",),
    )


def largest_kernels_shown(run: runs.Run):
    """The longest kernels of the eager reference step."""
    return glue.table(
        largest_kernels(kernel_table(run, "reference", "eager")), formats={"µs": "{:,.1f}"}, wrap=("kernel", "module")
    )


def prefill_shown(run: runs.Run):
    """The prompt phase, host against device, for each backend (the wall time per kernel left out)."""
    by_backend = prefill_host_device(run)
    shown = by_backend.assign(**{"median ms": [f"{a:.1f}" if a == a else "–" for a in by_backend["wall median ms"]]})
    return glue.table(
        shown[["backend", "kernels", "GPU busy ms", "wall ms", "median ms", "GPU idle ms", "idle µs per kernel"]],
        formats={"kernels": "{:,.0f}", "GPU busy ms": "{:.1f}", "wall ms": "{:.1f}", "GPU idle ms": "{:.1f}"}
        | {"idle µs per kernel": "{:.1f}"},
        csv_href=glue.run_csv_href(run, "prefill.csv"),
    )


def beside_published_shown(run: runs.Run):
    """This run's steps beside the published vLLM profile's, each against its own GPU's limit."""
    rows = beside_published(run)
    shown = rows.assign(
        source=rows.source + ", " + rows.GPU,
        limit=[
            f"{ms:.2f} ms at {at}" if ms == ms else "–"
            for ms, at in zip(rows["limit ms"], rows["limit at"], strict=True)
        ],
    )
    return glue.table(
        shown[["source", "what", "kernels", "ms", "limit", "of its GPU's limit", "rate"]],
        formats={"kernels": "{:,.0f}", "ms": "{:.2f}", "of its GPU's limit": "{:.0%}"},
        wrap=("source", "what"),
    )


def published_shown():
    """The published step, by what its kernels do."""
    return glue.table(published.HYBRID_27B_VLLM_DECODE, formats={"kernels": "{:,.0f}"}, wrap=("kernels doing", "note"))
