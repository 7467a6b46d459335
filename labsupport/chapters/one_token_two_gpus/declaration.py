"""What "One token on two GPUs" declares: its run's files and its parameters. Recorded on two GPUs
(labsupport.measure.distributed.tensor_parallel under torchrun); the nightly skips it on a box
with fewer (`gpus`)."""

from __future__ import annotations

from dataclasses import dataclass

# fmt: off
# isort: off
from labsupport.chapters.declaring import (  # the names, wrapped to read as a list
    BATCH, CEILINGS, CEILINGS_LINE, DEVICE, DTYPE, REPEATS, TOKENS, Chapter, File, Parameters, param,
)
# isort: on
# fmt: on
from labsupport.chapters.rules import between, preset, subset_of
from labsupport.measure.distributed import allreduce

_STEP = ("tp", "rank", "variant", "repeat", "wall_ms")


@dataclass
class Params(Parameters):
    preset: str = param("qwen3-8b", check=preset(), cpu="tiny")
    prompt_len: int = param(256, check=TOKENS, cpu=16)
    dtype: str = param("bfloat16", check=DTYPE)  # or "float16"; a GPU without BF16 (T4, V100) runs float16
    batch: int = param(1, check=BATCH)
    repeats: int = param(20, check=REPEATS, smoke=3, cpu=2)
    # the tensor-parallel degree of the split run (the run at TP=1 comes first); the box must have this many GPUs
    gpus: int = param(2, check=between(2, 8))
    variants: list = param(
        ["eager", "cuda-graph", "compile"],
        check=subset_of("eager", "cuda-graph", "compile"),
        smoke=["eager", "cuda-graph"],
        cpu=["eager"],
    )
    # the all-reduce sweep's largest message (bytes), from 8 KB
    sweep_max: int = param(allreduce.SWEEP_MAX, check=between(8192, 1 << 32), smoke=1 << 20, cpu=16384)
    sweep_iters: int = param(20, check=REPEATS)
    device: str = param("cuda", check=DEVICE, cpu="cpu")  # on a CPU: ranks as processes talking over gloo


# fmt: off
DECLARATION = Chapter(
    "one-token-two-gpus",
    (
        File("ceilings.csv", CEILINGS_LINE + ", on GPU 0", CEILINGS),
        File("variants.csv",
             "each form of the step at TP=1 and split, per rank: kernels, communication, busy and wall time",
             ("tp", "rank", "variant", "status", "kernels", "comm_kernels", "allreduce_calls"), required=True),
        File("step_times.csv", "every clean timing of each form of the step, per degree and rank", _STEP,
             required=True),
        File("collectives.csv", "every collective one eager step issued, per degree and rank: operation, bytes, dtype",
             ("tp", "rank", "seq", "op", "bytes", "dtype"), required=True),
        File("allreduce.csv",
             "the all-reduce sweep, per rank, launched one by one and replayed from a CUDA graph: message size, "
             "latency, algorithm and bus bandwidth", ("rank", "world", "bytes", "latency_us_median", "busbw_gbs"),
             required=True),
        File("topology.txt", "nvidia-smi topo -m: how the GPUs are connected (NVLink or PCIe)"),
        # the hand-split step (one_token_two_gpus.split), optional: the page does not read it yet
        File("split_variants.csv",
             "our decode step split by hand, per degree, all-reduce choice and rank: kernels, communication, busy and "
             "wall time, compile time, weight bytes per GPU (or why the choice did not run)",
             ("tp", "rank", "variant", "status")),
        File("split_step_times.csv",
             "every clean timing of the hand-split step, per degree, all-reduce choice and rank", _STEP),
        File("split_collectives.csv", "every collective one eager hand-split step issued, per degree, choice and rank",
             ("tp", "rank", "variant", "seq", "op", "bytes")),
        File("split_answer.csv",
             "the hand-split step's first logits (rank 0) against the whole model's in float32: the largest move of a "
             "logit, the largest logit, whether the greedy token is the same",
             ("tp", "choice", "max_abs_diff", "same_token")),
        File("trace-split-tp{tp}-rank{rank}-{choice}.json.gz",
             "the raw trace of rank {rank}'s hand-split step at TP={tp}, all-reduce {choice}"),
        File("trace-tp1-rank0-eager.json.gz", "the raw trace of rank 0's eager step at TP=1", required=True),
        File("trace-tp{tp}-rank{rank}-eager.json.gz", "the raw trace of rank {rank}'s eager step at TP={tp}"),
        File("trace-tp{tp}-rank{rank}-cuda-graph.json.gz",
             "the raw trace of rank {rank}'s CUDA-graph replay at TP={tp}"),
        File("trace-tp{tp}-rank{rank}-compile.json.gz", "the raw trace of rank {rank}'s compiled step at TP={tp}"),
    ),
    Params,
    # the one-GPU steps it shows are the shared ones (shared.glue_values reads every owner's run)
    reads=("kernels-in-one-token", "launch-overhead", "why-a-gpu"),
    gpus=2,
)
# fmt: on
