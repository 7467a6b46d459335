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
from its declaration, and ceilings.csv on a GPU) and meta.json's results: the model's shape
(for FLOP and byte counts), the weight shapes of the decoder layer whose matrix multiplies
are compared, and how each kind of number was taken (`method`; newer runs).

The modules, one concern each: measuring (the chapter's names, the FLOP and byte model, what the
live cells call), analysis (a loaded run's tables, each phase, the layer's matrix multiplies and
the prompt sweep), ceilings (every rate against the ceilings: roofline, ridges, headline) and
figures, page (what the page glues) and tables (the tables it shows). Their public names are the package's.
"""

# ruff: noqa: F401, I001 (these imports are the package's public names, wrapped to read as a list)
from __future__ import annotations

# fmt: off
from .analysis import (
    Bandwidth, bandwidth, census, crossover, Crossover, kernel_table, layer_gemm_kernels, layer_gemm_table,
    layer_gemms, Limits, limits, measured_ridge, passes_table, Phase, phase_table, phases, prefill_timing,
    PrefillTiming, prompt_sweep, recompute_kernels, roofline, shape, TIME_LABELS, utilisation,
)
from .ceilings import (
    achieved_rates, attainable, ceiling_notes, ceilings_row, gemm_points, headline, none_as_nan, pass_points, Ridge,
    RIDGE_GPUS, ridge_table, ridge_text, ridges, roofline_clusters, roofline_table, RooflineCluster,
)
from .figures import (
    gemm_rates, layer_gemm_figure, phase_census_bars, prompt_sweep_figure, roofline_figure, sweep_figure,
    utilisation_bars,
)
from .measuring import (
    annotate, annotated_kernels, ARTIFACTS, census_table, CHAPTER, forward_work, free, GEMM_MODULES,
    kernels_table_name, kind_column, KIND_COLUMNS, LM_HEAD, load, MATMUL, matmul_intensity, model_record,
    model_shape, ModelShape, ORIGIN, phase_work, PHASES, preset_shape, profile_prefill, profile_sweep,
    progress, ROOFLINE_MODULES, SHORT, sweep_row, time_passes, tokens_at_intensity, trace_file, Work,
)
from .page import Page, page, prefill_timing_note, wall_host_text
from .tables import (
    census_shown, layer_gemms_shown, layer_kernels_shown, passes_download, ridges_shown, roofline_shown, sweep_shown,
)
from .declaration import (
    DECLARATION, Params,
)
# fmt: on
