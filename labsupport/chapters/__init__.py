"""The chapter notebooks, in book order: the one declaration of each chapter. Its entry names the
run folder it records into, the files its run must contain and the columns of its tables, one
line on every file (the closing list of data), the checks on its notebook parameters, its
smallest (smoke) and CPU parameters, and the other chapters' runs it reads; Chapter.load and
Chapter.progress are every chapter's load() and progress() (a chapter module takes them, and its
CHAPTER, from of_module(__name__)).

Parameter checks are declared per chapter as {parameter: rule}; labsupport.ops.params applies
them (after the type check against the notebook's own default) to every `--param` before
anything runs. A rule names a parameter the notebook's `parameters` cell defines.
"""

from __future__ import annotations

import fnmatch
import importlib
from dataclasses import dataclass, field
from pathlib import Path

from labsupport.chapters.rules import between, each_between, one_of, preset, subset_of
from labsupport.chapters.table_keys import KEYS, SHARED
from labsupport.runs import tables
from labsupport.runs.provenance import REPO_ROOT

# Columns the analysis code reads, by kind of table (more may be present).
# The one declaration of what a number in a run may be (finite always, and within these
# bounds), by column name, first match wins; a chapter's `ranges` overrides it per column.
# Times are never negative and below 1e7 ms (about three hours); start/end stamps may be any
# non-negative stamp; counts, bytes and rates are never negative.
RANGES = (
    ("start_ns", (0, 1e19)),
    ("end_ns", (0, 1e19)),
    ("*_ns", (0, 1e13)),
    ("*_ns_*", (0, 1e13)),
    ("*_us", (0, 1e10)),
    ("*_us_*", (0, 1e10)),
    ("*us_median", (0, 1e10)),
    ("* µs", (0, 1e10)),
    ("*_ms", (0, 1e7)),
    ("*_ms_*", (0, 1e7)),
    ("*ms_median", (0, 1e7)),
    ("* ms", (0, 1e7)),
    ("kernels", (0, 1e9)),
    ("*bytes", (0, 1e16)),
    ("*tbs", (0, 1e4)),
    ("*tflops", (0, 1e6)),
    ("GB/s", (0, 1e7)),
    ("TB/s", (0, 1e4)),
)

# Empty cells every chapter may have: CUDA-event times of a run on a CPU (there are no events).
MAY_LACK = ("*:gpu_ms",)

KERNELS = ("name", "start_ns", "end_ns", "dur_ns", "op", "module", "kind")
KERNELS_BY_LAYER = KERNELS + ("short_name", "layer", "part")
CEILINGS = ("copy_bytes", "copy_ms_median", "gemm_n", "gemm_ms_median", "copy_tbs", "gemm_tflops")
NOTEBOOK_TIMEOUT_S = 3600  # a chapter's default `timeout_s`: 8x the slowest in history.csv (7 min)
# The parameters most chapters share.
REPEATS = between(1, 10_000)
TOKENS = between(1, 1 << 17)  # a prompt's tokens: more than any preset's context
LENGTHS = each_between(1, 1 << 17)  # a sweep's contexts or prompt lengths, in tokens
BATCH = between(1, 1024)
# The half-precision type of a chapter's model (labsupport.measure.models.DTYPES); a run without
# the parameter ran in bfloat16.
DTYPE = one_of("bfloat16", "float16")


# The line on ceilings.csv, a file of most chapters' runs.
_CEILINGS = (
    "the GPU's measured copy (bytes read plus written), read-stream and BF16 matrix-multiply rates; the read "
    "stream counts towards the practical ceiling, the copy never"
)


@dataclass(frozen=True)
class Chapter:
    slug: str  # also the folder under runs/
    notebook: str  # path from the repository root
    artifacts: tuple[str, ...]  # files every run of the chapter must contain
    columns: dict = field(default_factory=dict, hash=False, compare=False)  # {csv file: columns it must have}
    checks: dict = field(default_factory=dict, hash=False, compare=False)  # {notebook parameter: Rule}
    smoke: dict = field(default_factory=dict, hash=False, compare=False)  # smallest parameters for `live --smoke`
    cpu: dict = field(default_factory=dict, hash=False, compare=False)  # what `--allow-cpu` changes (the tiny model)
    reads: tuple[str, ...] = ()  # other chapters whose published runs this chapter's notebook reads
    gpus: int = 1  # GPUs its live run needs: the nightly skips it, in one line, on a box with fewer
    timeout_s: int = NOTEBOOK_TIMEOUT_S  # the longest its notebook may run live (live.run_chapter)
    ranges: dict = field(default_factory=dict, hash=False, compare=False)  # {"file.csv:column" or column: (lo, hi)}
    # "file.csv:column" patterns whose cells may be empty in a row that has no status column or an
    # "ok" one: a number this form was not measured for (a form timed by another chapter, a
    # quartile of a single span, CUDA events on a CPU); everywhere else an empty cell is refused.
    may_lack: tuple[str, ...] = ()
    # {file: what it holds, in one line}: the chapter's closing list of data (data_files.data_list);
    # every file a run may hold has one (a test fails on a file without).
    describes: dict = field(default_factory=dict, hash=False, compare=False)

    def range_of(self, file: str, column: str) -> tuple[float, float] | None:
        """The values a numeric column may hold (None: not a checked column): this chapter's
        `ranges` entry for "file:column" or "column", else the first of RANGES matching its name."""
        for key in (f"{file}:{column}", column):
            if key in self.ranges:
                return self.ranges[key]
        return next((r for pattern, r in RANGES if fnmatch.fnmatchcase(column, pattern)), None)

    def lacks_allowed(self, file: str, column: str) -> bool:
        """Whether an empty cell in `column` of `file` means "not measured here" (may_lack)."""
        key = f"{file}:{column}"
        return any(fnmatch.fnmatchcase(key, p) for p in (*self.may_lack, *MAY_LACK))

    def key_of(self, file: str) -> tuple[str, ...] | None:
        """The columns no two rows of `file` may share (chapters.table_keys; None: no key)."""
        key = KEYS.get(self.slug, {}).get(file, SHARED.get(file))
        return None if key is None else tuple(key.split())

    @property
    def module(self) -> str:
        """The chapter's module under labsupport.chapters: named like its notebook and its run folder."""
        return Path(self.notebook).stem

    @property
    def path(self) -> Path:
        return REPO_ROOT / self.notebook

    def load(self, run_id: str | None = None):
        """The chapter's published run (or `run_id`), loaded and checked whole (labsupport.runs)."""
        from labsupport import runs

        return runs.load_run(self.slug, run_id)

    def progress(self, msg: str) -> None:
        """A line of the live recording's log, naming the chapter."""
        print(f"[{self.slug}] {msg}", flush=True)

    def headline(self, run) -> dict:
        """The few numbers of a run that the status page follows from night to night."""
        return importlib.import_module(f"labsupport.chapters.{self.module}").headline(run)


CHAPTERS = [
    Chapter(
        "why-a-gpu",
        "notebooks/why_a_gpu.ipynb",
        # ceilings.csv and read_kernels.csv: recorded on every GPU (runs before read_kernels lack it), checked
        # when present; none on a CPU
        ("matvec.csv", "batch_sweep.csv"),
        columns={
            "ceilings.csv": CEILINGS,
            "read_kernels.csv": ("kernel", "matrix", "n", "k", "config", "bytes", "ms", "tbs"),
            "matvec.csv": ("device", "dtype", "ms_median", "bytes", "GB/s", "shape"),
            "batch_sweep.csv": (
                "batch",
                "status",
                "kernels",
                "gpu_busy_ns",
                "kernel_ns",
                "matmul_ns",
                "wall_ms_median",
                "wall_ms_min",
            ),
        },
        checks={
            "preset": preset(),
            "batches": each_between(1, 4096),
            "rounds": REPEATS,
            "matvec_repeats": REPEATS,
            "prompt_len": TOKENS,
            "device": one_of("cuda", "cpu"),
            "dtype": DTYPE,
        },
        smoke={"batches": [1, 16], "rounds": 3, "matvec_repeats": 5},
        cpu={
            "preset": "tiny",
            "prompt_len": 16,
            "batches": [1, 2, 4],
            "rounds": 2,
            "matvec_repeats": 2,
            "device": "cpu",
        },
        reads=("kernels-in-one-token", "launch-overhead", "prefill-vs-decode"),
        describes={
            "ceilings.csv": _CEILINGS,
            "read_kernels.csv": (
                "cuBLAS and the book's Triton GEMV (each configuration its tuner tries) at every weight shape of the "
                "decode step, the LM head included: per-call time and read rate; with the read stream, the "
                "practical ceiling"
            ),
            "matvec.csv": "the decode-sized matrix-vector product timed on the CPU (FP32, BF16) and on the GPU",
            "batch_sweep.csv": (
                "one decode step per batch size: kernels, GPU-busy and matmul time, "
                "wall time (minimum, quartiles, median)"
            ),
            "batch_times.csv": (
                "every timed step of the batch sweep, per batch size (and round, where "
                "the sizes were timed interleaved)"
            ),
            "batch_matmuls.csv": (
                "the matrix multiplies of each batch size's step, by shape, with the kernel cuBLAS chose"
            ),
        },
    ),
    Chapter(
        "what-a-kernel",
        "notebooks/what_a_kernel.ipynb",
        ("add_kernels.csv", "add_times.csv", "queue.csv", "sync.csv", "burst_trace.json.gz"),
        columns={
            "add_kernels.csv": KERNELS + ("implementation",),
            "add_times.csv": ("implementation", "ms_median", "bytes"),
            "queue.csv": ("launch", "call_start_us", "call_return_us", "gpu_done_us"),
            "sync.csv": ("what", "us_median"),
        },
        checks={"repeats": REPEATS, "burst": between(1, 100_000), "hbm_n": between(1, 1 << 31)},
        smoke={"repeats": 20, "burst": 50, "hbm_n": 1 << 26},
        reads=("why-a-gpu",),
        describes={
            "ceilings.csv": _CEILINGS,
            "add_kernels.csv": "the kernels of each vector-add implementation, as profiled",
            "add_times.csv": "the time of each vector-add implementation, per call and on the GPU",
            "hbm_add.csv": "the vector add on a working set too large for the L2 cache (HBM bandwidth)",
            "queue.csv": "a burst of launches: when each call started and returned on the CPU, when the GPU finished",
            "sync.csv": "what waiting for the GPU costs, by kind of wait",
            "burst_trace.json.gz": "the raw profiler trace of the burst of launches (opens in Perfetto)",
        },
    ),
    Chapter(
        "model-code-to-kernels",
        "notebooks/model_code_to_kernels.ipynb",
        ("mlp_kernels.csv", "rmsnorm_kernels.csv", "rmsnorm_times.csv"),
        columns={
            "mlp_kernels.csv": KERNELS,
            "rmsnorm_kernels.csv": KERNELS + ("variant",),
            "rmsnorm_times.csv": ("variant", "kernels", "us_median"),
        },
        checks={"preset": preset(), "repeats": REPEATS, "dtype": DTYPE},
        smoke={"repeats": 10},
        # shared.glue_values() reads every owner's run (the eager step's kernels are shown)
        reads=("kernels-in-one-token", "why-a-gpu", "launch-overhead"),
        describes={
            "mlp_kernels.csv": "every kernel of one decoder layer's MLP, with the operator and module that launched it",
            "rmsnorm_kernels.csv": "the kernels of RMSNorm as written, compiled and as one Triton kernel",
            "rmsnorm_times.csv": "the time of each RMSNorm variant",
        },
    ),
    Chapter(
        "where-kernels-come-from",
        "notebooks/where_kernels_come_from.ipynb",
        ("fusion_kernels.csv", "fusion_times.csv", "fused_rmsnorm_source.py", "attention_backends.csv"),
        columns={
            "fusion_kernels.csv": KERNELS + ("variant",),
            "fusion_times.csv": ("variant", "kernels", "us_median"),
            "attention_backends.csv": ("backend", "context", "status", "kernels", "gpu_ns", "us_median"),
        },
        checks={"preset": preset(), "contexts": LENGTHS, "repeats": REPEATS, "dtype": DTYPE},
        smoke={"contexts": [256], "repeats": 10},
        reads=("kernels-in-one-token",),
        describes={
            "fusion_kernels.csv": "the kernels of RMSNorm eager and compiled, with their sources",
            "fusion_times.csv": "the time of each of them",
            "fused_rmsnorm_source.py": "the Triton source torch.compile generated for the fused RMSNorm",
            "attention_backends.csv": "each attention backend at each context length: kernels, GPU time, time per call",
            "trace-rmsnorm-compiled.json.gz": (
                "the raw profiler trace of one compiled RMSNorm call, with its host events "
                "(Dynamo's guard check, the compiled region, the launch)"
            ),
        },
    ),
    Chapter(
        "kernels-in-one-token",
        "notebooks/kernels_in_one_token.ipynb",
        ("kernels.csv", "census.csv", "step_times.csv", "context_sweep.csv", "trace.json.gz"),
        columns={
            "kernels.csv": KERNELS_BY_LAYER,
            "census.csv": ("kind", "kernels", "gpu_ms", "share"),
            "step_times.csv": ("repeat", "wall_ms"),
            "context_sweep.csv": ("context", "status", "kernels"),
            "ceilings.csv": CEILINGS,
            "plain_eager_step.csv": ("trial", "wall_ms", "probe_ms"),
        },
        checks={
            "preset": preset(),
            "batch": BATCH,
            "prompt_len": TOKENS,
            "contexts": LENGTHS,
            "repeats": REPEATS,
            "fresh_processes": between(0, 32),
            "dtype": DTYPE,
        },
        smoke={"contexts": [256, 4096], "repeats": 5, "fresh_processes": 1},
        cpu={"preset": "tiny", "prompt_len": 16, "contexts": [8, 32], "repeats": 2, "fresh_processes": 1},
        reads=("why-a-gpu", "launch-overhead"),  # the ceilings; the page glues every shared quantity
        may_lack=("profiler_effect.csv:wall_ms_q*",),  # the profiled span: one value, no quartiles
        describes={
            "ceilings.csv": _CEILINGS,
            "kernels.csv": "every kernel of the profiled decode step: name, kind, times, launch, operator, layer",
            "census.csv": "the step's kernels and GPU time by kind",
            "step_times.csv": (
                "every clean (unprofiled) trial of the eager step in the recording process, with its round "
                "and the host probe's reading of that round"
            ),
            "plain_eager_step.csv": (
                "every trial of the same step timed by benchmarks/plain_eager_step.py in a fresh process, "
                "with the host probe's reading just before it"
            ),
            "fresh_processes.csv": "the eager step timed in fresh processes that never profiled, with their CPU load",
            "profiler_effect.csv": "the same step timed clean, after a profile, and as its span inside a profile",
            "context_sweep.csv": "the step at each context length, dynamic and static cache: kernels, time, KV bytes",
            "context_census.csv": "the census by kind at each context length",
            "context_times.csv": "every trial at each context length, both caches, interleaved in rounds",
            "context_ops.csv": "each profiled step of the sweep by kind and call path: kernels, GPU time",
            "trace.json.gz": "the raw profiler trace of the decode step (opens in Perfetto)",
        },
    ),
    Chapter(
        "launch-overhead",
        "notebooks/launch_overhead.ipynb",
        ("variants.csv", "step_times.csv", "trace-eager.json.gz"),  # ceilings.csv: runs before shared.limits()
        columns={
            "ceilings.csv": CEILINGS,
            "step_times.csv": ("variant", "repeat", "wall_ms"),
            "variants.csv": ("variant", "status", "kernels", "gpu_busy_ns", "launch_calls", "wall_ms_median"),
        },
        checks={"preset": preset(), "prompt_len": TOKENS, "repeats": REPEATS, "dtype": DTYPE},
        smoke={"preset": "tiny", "prompt_len": 64, "repeats": 3, "max_autotune": True},
        cpu={"preset": "tiny", "prompt_len": 16, "repeats": 2},
        reads=("kernels-in-one-token", "why-a-gpu"),  # the eager steps' numbers; the ceilings
        may_lack=("variants.csv:wall_ms_*", "variants.csv:issue_ms_*"),  # eager forms: timed by the census chapter
        describes={
            "ceilings.csv": _CEILINGS,
            "variants.csv": (
                "each form of the step (eager, static cache, CUDA graph, compiled): kernels, busy, wall time"
            ),
            "step_times.csv": (
                "every clean trial of each form this chapter times (CUDA graph, compiled), with its round"
            ),
            "trace-eager.json.gz": "the raw trace of the eager step",
            "trace-eager-static.json.gz": "the raw trace of the eager step with a static cache",
            "trace-cuda-graph.json.gz": "the raw trace of the CUDA-graph replay",
            "trace-compile-reduce-overhead.json.gz": "the raw trace of the step compiled with mode reduce-overhead",
            "trace-compile-max-autotune.json.gz": "the raw trace of the step compiled with mode max-autotune",
        },
    ),
    Chapter(
        "closing-the-gap",
        "notebooks/closing_the_gap.ipynb",
        ("rungs.csv", "step_times.csv", "trace-eager.json.gz"),  # ceilings.csv in runs recorded before
        columns={
            "ceilings.csv": CEILINGS,
            "rungs.csv": (
                "rung",
                "status",
                "kernels",
                "gpu_busy_ns",
                "wall_ms_median",
                "max_abs_diff",
                "same_token",
                "passed",
            ),
            "step_times.csv": ("rung", "repeat", "wall_ms"),
            "matmuls.csv": ("matrix", "n", "k", "bytes", "cublas_us", "triton_us"),
            "gemv_tuning.csv": ("n", "k", "block_n", "block_k", "num_warps", "num_stages", "us", "chosen"),
            "tokens_per_forward.csv": ("tokens", "path", "status", "ms_min"),  # runs since issue 25
        },
        checks={"preset": preset("qwen3-8b", "tiny"), "prompt_len": TOKENS, "repeats": REPEATS, "dtype": DTYPE},
        smoke={"preset": "tiny", "prompt_len": 64, "repeats": 3},
        cpu={"preset": "tiny", "prompt_len": 16, "repeats": 2},
        reads=("why-a-gpu", "kernels-in-one-token", "launch-overhead"),
        may_lack=("rungs.csv:wall_ms_*", "rungs.csv:issue_ms_*", "rungs.csv:gpu_ms_*"),  # rungs timed elsewhere
        describes={
            "ceilings.csv": _CEILINGS,
            "rungs.csv": (
                "each rung of the ladder: kernels, GPU-busy, wall and compile time, its logits against eager's"
            ),
            "step_times.csv": "every timed trial of our rungs, in interleaved rounds: wall and CUDA-event ms",
            "matmuls.csv": "each weight shape's matmul for one token: cuBLAS against our Triton GEMV, in µs and TB/s",
            "gemv_tuning.csv": "every configuration of our GEMV tried on every weight shape (BF16 and FP8 weights, "
            "split-K), and the ones kept",
            "tokens_per_forward.csv": "the best BF16 rung's decoder on 1 to 16 tokens at once: ms per forward, "
            "in interleaved rounds",
            "trace-eager.json.gz": "the raw trace of the eager step",
            "trace-cuda-graph.json.gz": "the raw trace of transformers' static-cache step replayed as a CUDA graph",
            "trace-compile.json.gz": "the raw trace of transformers' step compiled (reduce-overhead)",
            "trace-own-compiled.json.gz": "the raw trace of our decode step, compiled, in one CUDA graph",
            "trace-fused-projections.json.gz": "the raw trace of our step with fused Q/K/V and gate/up",
            "trace-triton-gemv.json.gz": "the raw trace of our step with our Triton GEMV",
            "trace-fused-gemv.json.gz": "the raw trace of our step with norms, SiLU and residual adds inside the GEMVs",
            "trace-fused-attention.json.gz": "the raw trace of our step with our attention kernels",
            "trace-split-k.json.gz": "the raw trace of our step with split-K GEMVs where the tuner chose them",
            "trace-pdl.json.gz": "the raw trace of our step with our GEMVs launched with programmatic dependent launch",
            "trace-fp8-weights.json.gz": "the raw trace of our step reading FP8 weights",
        },
    ),
    Chapter(
        "prefill-vs-decode",
        "notebooks/prefill_vs_decode.ipynb",
        (
            "phase_times.csv",
            "kernels-prefill.csv",
            "kernels-decode.csv",
            "census.csv",
            "prompt_sweep.csv",
            "trace-prefill.json.gz",
            "trace-decode.json.gz",
        ),
        columns={
            "kernels-prefill.csv": KERNELS_BY_LAYER,
            "kernels-decode.csv": KERNELS_BY_LAYER,
            "census.csv": ("phase", "kind", "kernels", "gpu_ms", "share"),
            "phase_times.csv": ("phase", "repeat", "wall_ms"),
            "prompt_sweep.csv": ("prompt_len", "status", "kernels", "gpu_busy_ns", "wall_ms_median"),
            "ceilings.csv": CEILINGS,
        },
        checks={
            "preset": preset(),
            "prompt_len": TOKENS,
            "prompt_lens": LENGTHS,
            "repeats": REPEATS,
            "dtype": DTYPE,
        },
        smoke={"prompt_lens": [1, 64, 512], "repeats": 3},
        cpu={"preset": "tiny", "prompt_len": 16, "prompt_lens": [1, 8, 16], "repeats": 2},
        reads=("why-a-gpu", "kernels-in-one-token", "launch-overhead"),
        describes={
            "ceilings.csv": _CEILINGS,
            "phase_times.csv": "every timed trial of the prompt phase and of one decode step, in interleaved rounds",
            "kernels-prefill.csv": "every kernel of the profiled prompt phase",
            "kernels-decode.csv": "every kernel of the profiled decode step",
            "census.csv": "both phases' kernels and GPU time by kind",
            "prompt_sweep.csv": (
                "the prompt phase at each prompt length: kernels, GPU busy, wall time (minimum, quartiles)"
            ),
            "trace-prefill.json.gz": "the raw trace of the prompt phase",
            "trace-decode.json.gz": "the raw trace of the decode step",
        },
    ),
    Chapter(
        "hybrid-model-token",
        "notebooks/hybrid_model_token.ipynb",
        ("variants.csv", "step_times.csv", "prefill.csv", "cache_growth.csv", "trace-reference-eager.json.gz"),
        columns={
            "variants.csv": ("backend", "mode", "status", "kernels", "gpu_busy_ns", "wall_ms_median"),
            "step_times.csv": ("backend", "mode", "repeat", "wall_ms"),
            "prefill.csv": ("backend", "status", "tokens", "kernels", "wall_ms_median"),
            "cache_growth.csv": ("context", "status", "layer_type", "layers", "bytes"),
            "ceilings.csv": CEILINGS,
        },
        checks={
            "preset": preset(),
            "prompt_len": TOKENS,
            "repeats": REPEATS,
            "backends": subset_of("reference", "fla"),
            "compile_backends": subset_of("reference", "fla"),
            "contexts": LENGTHS,
            "dtype": DTYPE,
        },
        smoke={"repeats": 3, "compile_backends": [], "contexts": [512, 4096]},
        cpu={
            "preset": "tiny-hybrid",
            "prompt_len": 16,
            "repeats": 2,
            "backends": ["reference"],
            "compile_backends": [],
            "contexts": [8, 64],
        },
        reads=("why-a-gpu",),  # its ceilings (shared.limits); the hybrid's own step walls are its own
        describes={
            "ceilings.csv": _CEILINGS,
            "variants.csv": "each backend and mode of the decode step: kernels, GPU-busy and wall time, status",
            "step_times.csv": "every clean timing of each backend and mode",
            "prefill.csv": "the prompt phase of each backend: kernels, GPU-busy and wall time",
            "cache_growth.csv": "the cache after prompts of each length (attention's KV cache, Gated DeltaNet's state)",
            "trace-reference-eager.json.gz": "the raw trace of the eager step, transformers' PyTorch Gated DeltaNet",
            "trace-reference-cuda-graph.json.gz": "the raw trace of its CUDA-graph replay",
            "trace-reference-compile.json.gz": "the raw trace of it compiled",
            "trace-fla-eager.json.gz": "the raw trace of the eager step with flash-linear-attention's kernels",
            "trace-fla-cuda-graph.json.gz": "the raw trace of its CUDA-graph replay",
            "trace-fla-compile.json.gz": "the raw trace of it compiled",
        },
    ),
]


# Recorded on two GPUs (labsupport.measure.distributed.tensor_parallel under torchrun); the nightly skips it on a
# box with fewer (chapters' `gpus`).
ONE_TOKEN_TWO_GPUS = Chapter(
    "one-token-two-gpus",
    "notebooks/one_token_two_gpus.ipynb",
    ("variants.csv", "step_times.csv", "collectives.csv", "allreduce.csv", "trace-tp1-rank0-eager.json.gz"),
    columns={
        "variants.csv": ("tp", "rank", "variant", "status", "kernels", "comm_kernels", "allreduce_calls"),
        "step_times.csv": ("tp", "rank", "variant", "repeat", "wall_ms"),
        "collectives.csv": ("tp", "rank", "seq", "op", "bytes", "dtype"),
        "allreduce.csv": ("rank", "world", "bytes", "latency_us_median", "busbw_gbs"),
        "ceilings.csv": CEILINGS,
        # the hand-split step (one_token_two_gpus.split), optional: the page does not read it yet
        "split_variants.csv": ("tp", "rank", "variant", "status"),
        "split_step_times.csv": ("tp", "rank", "variant", "repeat", "wall_ms"),
        "split_collectives.csv": ("tp", "rank", "variant", "seq", "op", "bytes"),
        "split_answer.csv": ("tp", "choice", "max_abs_diff", "same_token"),
    },
    checks={
        "preset": preset(),
        "prompt_len": TOKENS,
        "batch": BATCH,
        "repeats": REPEATS,
        "gpus": between(2, 8),
        "variants": subset_of("eager", "cuda-graph", "compile"),
        "sweep_max": between(8192, 1 << 32),
        "dtype": DTYPE,
    },
    smoke={"repeats": 3, "variants": ["eager", "cuda-graph"], "sweep_max": 1 << 20},
    cpu={"preset": "tiny", "prompt_len": 16, "repeats": 2, "variants": ["eager"], "sweep_max": 16384},
    # the one-GPU steps it shows are the shared ones (shared.glue_values reads every owner's run)
    reads=("kernels-in-one-token", "launch-overhead", "why-a-gpu"),
    gpus=2,
    describes={
        "ceilings.csv": _CEILINGS + ", on GPU 0",
        "variants.csv": "each form of the step at TP=1 and split, per rank: kernels, communication, busy and wall time",
        "step_times.csv": "every clean timing of each form of the step, per degree and rank",
        "collectives.csv": "every collective one eager step issued, per degree and rank: operation, bytes, dtype",
        "allreduce.csv": "the all-reduce sweep, per rank, launched one by one and replayed from a CUDA graph: "
        "message size, latency, algorithm and bus bandwidth",
        "topology.txt": "nvidia-smi topo -m: how the GPUs are connected (NVLink or PCIe)",
        "split_variants.csv": "our decode step split by hand, per degree, all-reduce choice and rank: kernels, "
        "communication, busy and wall time, compile time, weight bytes per GPU (or why the choice did not run)",
        "split_step_times.csv": "every clean timing of the hand-split step, per degree, all-reduce choice and rank",
        "split_collectives.csv": "every collective one eager hand-split step issued, per degree, choice and rank",
        "split_answer.csv": "the hand-split step's first logits (rank 0) against the whole model's in float32: "
        "the largest move of a logit, the largest logit, whether the greedy token is the same",
        **{
            f"trace-split-tp{tp}-rank{rank}-{choice}.json.gz": f"the raw trace of rank {rank}'s hand-split step "
            f"at TP={tp}, all-reduce {choice}"
            for tp in range(1, 9)
            for rank in range(tp)
            for choice in ("process-group", "symm-mem")
        },
        **{
            f"trace-tp{tp}-rank{rank}-{form}.json.gz": f"the raw trace of rank {rank}'s {what} at TP={tp}"
            for tp in range(1, 9)
            for rank in range(tp)
            for form, what in (
                ("eager", "eager step"),
                ("cuda-graph", "CUDA-graph replay"),
                ("compile", "compiled step"),
            )
        },
    },
)


CHAPTERS.append(ONE_TOKEN_TWO_GPUS)
# A run's tables are checked against these declarations when loaded or written (runs/ imports no chapter code).
tables.declare(CHAPTERS)


def find(names: list[str] | None) -> list[Chapter]:
    """Chapters by slug (all when `names` is empty); an unknown name is a clear error."""
    if not names:
        return list(CHAPTERS)
    by_slug = {c.slug: c for c in CHAPTERS}
    unknown = [n for n in names if n not in by_slug]
    if unknown:
        raise SystemExit(f"unknown chapter(s) {', '.join(unknown)}; known: {', '.join(by_slug)}")
    return [by_slug[n] for n in names]


def by_slug(slug: str) -> Chapter:
    return find([slug])[0]


def of_module(name: str) -> Chapter:
    """The entry of the chapter whose module or package holds the module `name` (a module passes its
    own __name__): a chapter module takes its CHAPTER, load() and progress() from here, so that the
    registry is the one place that declares them."""
    parts = name.split(".")
    by_module = {c.module: c for c in CHAPTERS}
    if parts[:2] != ["labsupport", "chapters"] or len(parts) < 3 or parts[2] not in by_module:
        raise LookupError(f"{name} is not the module of a chapter in the registry")
    return by_module[parts[2]]
