"""Chapter "One token on two GPUs": Qwen3-8B's decode step split across GPUs (tensor
parallelism with DTensor, NCCL all-reduces), at TP=1 and TP=N, per rank, and the all-reduce
curve of the box.

Live (the notebook's visible cells): start torchrun twice (TP=1, then TP=N with the all-reduce
sweep), each rank running labsupport.measure.tensor_parallel, and collect every rank's results
into one run. Replay: the step table per rank, the collectives of one step, the census with its
communication kind, the curve, and the answer, all computed from the run here.

    params     Params, CHAPTER, VARIANTS, the tables' columns, trace_file, load
    measuring  require_gpus, pending_run, torchrun_command, launch, collect, record_topology
    topology   link_between, interconnect, recorded_interconnect (nvidia-smi topo -m)
    analysis   steps, main_form, census, collectives, allreduce_curve, answer, best, time_split,
               references, headline
    figures    allreduce_figure, ranks_timeline
"""

from labsupport.chapters.one_token_two_gpus.analysis import (
    SHARED_ONE_GPU,
    Answer,
    Collectives,
    agreement,
    agreement_text,
    allreduce_curve,
    answer,
    at_bytes,
    best,
    census,
    collectives,
    degrees,
    headline,
    kernel_table,
    layer_kernels,
    main_form,
    published_allreduce_us,
    references,
    split_degree,
    steps,
    steps_shown,
    time_split,
)
from labsupport.chapters.one_token_two_gpus.figures import COLORS, allreduce_figure, ranks_timeline
from labsupport.chapters.one_token_two_gpus.measuring import (
    TooFewGPUs,
    collect,
    gpus_here,
    launch,
    pending_run,
    record_topology,
    relaunch_eager,
    require_gpus,
    torchrun_command,
)
from labsupport.chapters.one_token_two_gpus.params import (
    ALLREDUCE_COLUMNS,
    CHAPTER,
    COLLECTIVE_COLUMNS,
    SHORT,
    STEP_TIME_COLUMNS,
    VARIANT_COLUMNS,
    VARIANTS,
    Params,
    load,
    progress,
    trace_file,
)
from labsupport.chapters.one_token_two_gpus.topology import interconnect, link_between, recorded_interconnect

__all__ = [
    "CHAPTER", "VARIANTS", "SHORT", "VARIANT_COLUMNS", "STEP_TIME_COLUMNS", "COLLECTIVE_COLUMNS", "ALLREDUCE_COLUMNS",
    "Params", "load", "progress", "trace_file",
    "TooFewGPUs", "gpus_here", "require_gpus", "pending_run", "torchrun_command", "launch", "relaunch_eager", "collect",
    "link_between", "interconnect", "record_topology", "recorded_interconnect",
    "degrees", "split_degree", "steps", "kernel_table", "layer_kernels", "census", "Collectives", "collectives",
    "allreduce_curve",
    "at_bytes", "agreement", "agreement_text", "Answer", "answer", "references", "published_allreduce_us", "headline",
    "main_form", "best", "time_split", "SHARED_ONE_GPU", "steps_shown",
    "COLORS", "allreduce_figure", "ranks_timeline",
]  # fmt: skip
