"""Chapter "Prompt phase vs decode phase": what its notebook calls to measure, and the
analysis of a recorded run.

The notebook's live cells measure, in this order (labsupport.measure.harness: every wall
time before the first profile):

1. the GPU's ceilings (copy and read bandwidth, BF16 GEMM rate), so that every rate can be
   set against a measured ceiling as well as against the datasheet;
2. timings, no profiler yet: `repeats` decode steps at `prompt_len` tokens of context (each
   after a fresh prefill, outside the timed span), then the prefill of every prompt length
   of the sweep and of `prompt_len`, round-robin (one prefill of each length per round);
3. profiles: one prefill of `prompt_len` tokens and one decode step after it (every kernel
   labelled with the module that launched it), then one prefill of each other length of
   the sweep.

One number per configuration: the prefill of `prompt_len` tokens is timed and profiled
once; the phase table and the sweep's row for that length are the same measurement.

Replay: every table and number of the chapter is computed from the run's files (ARTIFACTS,
from the registry, and ceilings.csv on a GPU) and meta.json's results: the model's shape
(for FLOP and byte counts), the weight shapes of the decoder layer whose matrix multiplies
are compared, and how each kind of number was taken (`method`; newer runs).

The modules: names (files, phases, keys), work (the FLOP and byte model), measure (what the
live cells call), tables, phases, sweep, roofline, ridges, ceilings (the analysis of a loaded
run), figures and roofline_figure.
"""

from __future__ import annotations

from .ceilings import achieved_rates, ceiling_notes, ceilings_row, headline
from .figures import gemm_rates, phase_census_bars, prompt_sweep_figure, utilisation_bars
from .measure import (
    KIND_COLUMNS,
    Params,
    annotate,
    annotated_kernels,
    census_table,
    free,
    kind_column,
    model_record,
    profile_prefill,
    profile_sweep,
    sweep_row,
    time_passes,
)
from .names import (
    ARTIFACTS,
    CHAPTER,
    COLUMNS,
    GEMM_MODULES,
    LM_HEAD,
    MATMUL,
    ORIGIN,
    PHASES,
    ROOFLINE_MODULES,
    SHORT,
    kernels_table_name,
    load,
    progress,
    trace_file,
)
from .phases import (
    TIME_LABELS,
    Phase,
    PrefillTiming,
    census,
    passes_table,
    phase_table,
    phases,
    prefill_timing,
    utilisation,
)
from .ridges import RIDGE_GPUS, Ridge, none_as_nan, ridge_table, ridge_text, ridges
from .roofline import (
    RooflineCluster,
    attainable,
    gemm_points,
    pass_points,
    roofline_clusters,
    roofline_table,
)
from .roofline_figure import roofline_figure
from .sweep import Crossover, crossover, layer_gemm_kernels, layer_gemm_table, layer_gemms, prompt_sweep, roofline
from .tables import Bandwidth, Limits, bandwidth, kernel_table, limits, measured_ridge, recompute_kernels, shape
from .work import (
    ModelShape,
    Work,
    forward_work,
    matmul_intensity,
    model_shape,
    phase_work,
    preset_shape,
    tokens_at_intensity,
)

__all__ = [
    "achieved_rates",
    "annotate",
    "annotated_kernels",
    "ARTIFACTS",
    "attainable",
    "Bandwidth",
    "bandwidth",
    "ceiling_notes",
    "ceilings_row",
    "census",
    "census_table",
    "CHAPTER",
    "COLUMNS",
    "Crossover",
    "crossover",
    "forward_work",
    "free",
    "GEMM_MODULES",
    "gemm_points",
    "gemm_rates",
    "headline",
    "kernel_table",
    "kernels_table_name",
    "kind_column",
    "KIND_COLUMNS",
    "layer_gemm_kernels",
    "layer_gemm_table",
    "layer_gemms",
    "Limits",
    "limits",
    "LM_HEAD",
    "load",
    "MATMUL",
    "matmul_intensity",
    "measured_ridge",
    "model_record",
    "model_shape",
    "ModelShape",
    "none_as_nan",
    "ORIGIN",
    "Params",
    "pass_points",
    "Phase",
    "phase_census_bars",
    "phase_table",
    "phase_work",
    "PHASES",
    "passes_table",
    "phases",
    "prefill_timing",
    "PrefillTiming",
    "preset_shape",
    "profile_prefill",
    "profile_sweep",
    "progress",
    "prompt_sweep",
    "prompt_sweep_figure",
    "recompute_kernels",
    "Ridge",
    "RIDGE_GPUS",
    "ridge_table",
    "ridge_text",
    "ridges",
    "roofline",
    "roofline_clusters",
    "roofline_figure",
    "ROOFLINE_MODULES",
    "roofline_table",
    "RooflineCluster",
    "shape",
    "SHORT",
    "sweep_row",
    "time_passes",
    "TIME_LABELS",
    "tokens_at_intensity",
    "trace_file",
    "utilisation",
    "utilisation_bars",
    "Work",
]
