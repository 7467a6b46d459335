"""Chapter "One token on two GPUs": Qwen3-8B's decode step split across GPUs (tensor
parallelism with DTensor, NCCL all-reduces), at TP=1 and TP=N, per rank, and the all-reduce
curve of the box.

Live (the notebook's visible cells): start torchrun twice (TP=1, then TP=N with the all-reduce
sweep), each rank running labsupport.measure.distributed.tensor_parallel, and collect every rank's results
into one run. Replay: the step table per rank, the collectives of one step, the census with its
communication kind, the curve, and the answer, all computed from the run here.

    params     Params, CHAPTER, VARIANTS, the tables' columns, trace_file, load
    measuring  require_gpus, pending_run, torchrun_command, launch, collect, record_topology
    topology   link_between, interconnect, recorded_interconnect (nvidia-smi topo -m)
    analysis   steps, main_form, census, collectives, allreduce_curve, answer, best, time_split,
               references, headline
    figures    allreduce_figure, ranks_timeline (and of a run: allreduce_curves_figure, layer_lanes_figure)
    page       Page, page: every number and short text the page glues
    tables     the tables the page shows
    split      the hand-split step (measure.tp_split): split_command, split_options, collect_split,
               record_split, split_summary, same_answer (recorded live; not on the page yet)
"""

# ruff: noqa: F401, I001 (these imports are the package's public names, wrapped to read as a list)
from __future__ import annotations

# fmt: off
from .analysis import (
    agreement, agreement_text, allreduce_curve, answer, Answer, at_bytes, best, census, Collectives, collectives,
    degrees, headline, kernel_table, layer_kernels, main_form, published_allreduce_us, references, SHARED_ONE_GPU,
    split_degree, steps, steps_shown, time_split,
)
from .figures import (
    allreduce_curves_figure, allreduce_figure, COLORS, layer_lanes_figure, ranks_timeline,
)
from .measuring import (
    collect, gpus_here, launch, pending_run, record_topology, relaunch_eager, require_gpus, TooFewGPUs,
    torchrun_command,
)
from .params import (
    ALLREDUCE_COLUMNS, CHAPTER, COLLECTIVE_COLUMNS, load, progress, SHORT, STEP_TIME_COLUMNS, trace_file,
    VARIANT_COLUMNS, VARIANTS,
)
from .split import (
    collect_split, first_line, record_split, same_answer, split_command, split_options, split_summary,
)
from .topology import (
    interconnect, link_between, recorded_interconnect,
)
from .page import Page, page
from .tables import allreduce_shown, census_shown, references_shown, steps_table, time_split_shown
from .declaration import (
    DECLARATION, Params,
)
# fmt: on
