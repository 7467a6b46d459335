"""Chapter "Prompt phase vs decode phase": record a run live, and analyse a run.

Live, in this order (labsupport.harness: every wall time before the first profile):

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

Replay: every table and number of the chapter is computed here from the run's files:

    ceilings.csv            copy (and, in newer runs, read) bandwidth and BF16 GEMM rate (CUDA runs only)
    phase_times.csv         every timed prefill of `prompt_len` tokens and every timed decode step
                            (newer runs: CPU issue time, CUDA-event time on a GPU, and `clean`)
    kernels-prefill.csv     every kernel of the profiled prefill (kind, module, layer)
    kernels-decode.csv      every kernel of the profiled decode step
    census.csv              kernels and GPU time by kind, for both phases
    prompt_sweep.csv        per prompt length: status, wall times, GPU busy, GPU time by kind
    trace-prefill.json.gz   raw profiler trace of the prefill
    trace-decode.json.gz    raw profiler trace of the decode step

and, in meta.json's results, the model's shape (for FLOP and byte counts), the weight
shapes of the decoder layer whose matrix multiplies are compared, and how each kind of
number was taken (`method`; newer runs).
"""
from __future__ import annotations

import math
import re
import statistics
from dataclasses import asdict, dataclass, field

import pandas as pd

from . import hardware, harness, kernels, models, runs, trace

CHAPTER = "prefill-vs-decode"
# Files every run of the chapter contains (ceilings.csv too, on a GPU).
ARTIFACTS = ("phase_times.csv", "kernels-prefill.csv", "kernels-decode.csv", "census.csv",
             "prompt_sweep.csv", "trace-prefill.json.gz", "trace-decode.json.gz")
PHASES = ("prefill", "decode")
# The profiler annotation that each phase's trace is timed from.
ORIGIN = {"prefill": "prefill", "decode": "decode_step"}
# The matrix multiplies of one decoder layer, in the order they run.
GEMM_MODULES = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")
MATMUL = "matrix multiply"


@dataclass
class Params:
    """What one run of the chapter measures."""

    preset: str = "qwen3-8b"
    prompt_len: int = 512
    prompt_lens: list[int] = field(default_factory=lambda: [1, 8, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192])
    repeats: int = 20          # timed prefills and timed decode steps at prompt_len
    sweep_repeats: int = 5     # timed prefills at each other length of the sweep (round-robin)
    device: str = "cuda"


def _progress(msg: str) -> None:
    print(f"[{CHAPTER}] {msg}", flush=True)


def trace_file(phase: str) -> str:
    return f"trace-{phase}.json.gz"


def kernels_table_name(phase: str) -> str:
    return f"kernels-{phase}"


# --- FLOPs and bytes ----------------------------------------------------------------------

@dataclass(frozen=True)
class ModelShape:
    """What the FLOP and byte counts need to know of a model (batch 1, BF16)."""

    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    matmul_parameters: int     # every nn.Linear weight, the LM head included
    lm_head_parameters: int
    weight_bytes: int          # every weight outside the embedding table (models.ModelCounts.decode_bytes)
    bytes_per_value: int = 2

    @property
    def layer_matmul_parameters(self) -> int:
        """Weights of the decoder layers' matrix multiplies (all layers together)."""
        return self.matmul_parameters - self.lm_head_parameters

    @property
    def matmul_bytes(self) -> int:
        return self.matmul_parameters * self.bytes_per_value

    @property
    def kv_bytes_per_token(self) -> int:
        """Bytes of one token's keys and values, over all layers."""
        return 2 * self.layers * self.kv_heads * self.head_dim * self.bytes_per_value


def model_shape(model) -> ModelShape:
    """The shape of a built model (works on the `meta` device, too)."""
    counts = models.count_model(model)
    cfg = model.config
    return ModelShape(layers=cfg.num_hidden_layers, heads=cfg.num_attention_heads,
                      kv_heads=cfg.num_key_value_heads, head_dim=cfg.head_dim,
                      matmul_parameters=counts.matmul_weight_parameters,
                      lm_head_parameters=model.get_output_embeddings().weight.numel(),
                      weight_bytes=counts.decode_bytes, bytes_per_value=counts.bytes_per_parameter)


def preset_shape(name: str) -> ModelShape:
    """The shape of preset `name` in BF16, from a model on the meta device (no memory used)."""
    return model_shape(models.build_model(name, device="meta"))


@dataclass(frozen=True)
class Work:
    """The arithmetic and the memory traffic a forward pass cannot do without."""

    matmul_flops: int
    attention_flops: int
    bytes: int

    @property
    def flops(self) -> int:
        return self.matmul_flops + self.attention_flops

    @property
    def flop_per_byte(self) -> float:
        return self.flops / self.bytes


def forward_work(shape: ModelShape, new_tokens: int, past_tokens: int = 0, logits_tokens: int = 1) -> Work:
    """Model FLOPs and bytes of one forward pass of `new_tokens` tokens (batch 1) on top of
    `past_tokens` tokens already in the KV cache: a prefill is (prompt, 0), a decode step
    (1, prompt).

        matmul FLOPs    = 2 × new_tokens × (weights of the decoder layers' matrix multiplies)
                        + 2 × logits_tokens × (weights of the LM head)
        attention FLOPs = 4 × layers × heads × head_dim × (query-key pairs)
        query-key pairs = new_tokens × past_tokens + new_tokens × (new_tokens + 1) / 2
        bytes           = every weight outside the embedding table, once
                        + (past_tokens + new_tokens) × (bytes of one token's keys and values)

    Each weight is used for one multiply and one add per token. The LM head runs for
    `logits_tokens` tokens only (a prefill asks for the logits of its last token,
    `logits_to_keep=1`). Attention is causal: a new token is scored against every token
    before it and itself, 2 × head_dim operations for the score (Q times K) and 2 × head_dim
    for the weighted sum of values (P times V), in every query head of every layer. The
    bytes are the least that must move: the weights read once, and the keys and values of
    the context read (the cache) or written (the new tokens) once. Not counted: norms,
    rotary embeddings, softmax and activation functions (elementwise, few FLOPs), and the
    activations' own memory traffic.
    """
    pairs = new_tokens * past_tokens + new_tokens * (new_tokens + 1) // 2
    return Work(
        matmul_flops=2 * new_tokens * shape.layer_matmul_parameters + 2 * logits_tokens * shape.lm_head_parameters,
        attention_flops=4 * shape.layers * shape.heads * shape.head_dim * pairs,
        bytes=shape.weight_bytes + (past_tokens + new_tokens) * shape.kv_bytes_per_token,
    )


def phase_work(shape: ModelShape, phase: str, prompt_len: int) -> Work:
    """The work of the prefill of `prompt_len` tokens, or of the decode step right after it."""
    if phase == "prefill":
        return forward_work(shape, prompt_len, 0)
    if phase == "decode":
        return forward_work(shape, 1, prompt_len)
    raise ValueError(f"unknown phase {phase!r}; phases: {', '.join(PHASES)}")


def matmul_intensity(shape: ModelShape, tokens: int) -> float:
    """FLOP per byte of weights of a prefill's matrix multiplies: about `tokens`, since each
    weight (2 bytes) does 2 operations per token (the LM head, run once, pulls it down a little)."""
    return forward_work(shape, tokens).matmul_flops / shape.matmul_bytes


def tokens_at_intensity(shape: ModelShape, flop_per_byte: float) -> float:
    """The prompt length whose matrix multiplies reach `flop_per_byte` (matmul_intensity inverted)."""
    p = shape.bytes_per_value
    return (flop_per_byte * p * shape.matmul_parameters - 2 * shape.lm_head_parameters) / (2 * shape.layer_matmul_parameters)


# --- measuring ----------------------------------------------------------------------------

def _merge(what: str, timings: list[harness.Timing]) -> harness.Timing:
    """Several timings of one region, as one (their repeats in order)."""
    return harness.Timing(what=what, wall_ms=[x for t in timings for x in t.wall_ms],
                          issue_ms=[x for t in timings for x in t.issue_ms],
                          gpu_ms=[x for t in timings for x in t.gpu_ms], clean=all(t.clean for t in timings))


def time_prefills(model, prompts: dict, repeats: dict[int, int], device: str, warmup: int = 2,
                  progress=print) -> dict[int, harness.Timing | str]:
    """Wall time of `repeats[n]` prefills of each prompt `prompts[n]`, each into a fresh cache.

    Round-robin: each round times one prefill of every length that still needs one, so that
    a passing disturbance of the host touches one sample of many lengths, not all of one. The
    first round warms each length up (`warmup` untimed prefills). A length that runs out of
    GPU memory is given the status "out of memory" instead of a timing."""
    import torch

    from . import decode

    samples: dict[int, list | str] = {n: [] for n in prompts}
    for rnd in range(max(repeats.values(), default=0)):
        for n, p in prompts.items():
            if isinstance(samples[n], str) or rnd >= repeats[n]:
                continue
            try:
                samples[n].append(harness.time_region(
                    lambda: decode.prefill(model, p), what=f"prefill, {n} tokens", device=device,
                    repeats=1, warmup=warmup if rnd == 0 else 0))
            except torch.OutOfMemoryError:
                samples[n] = "out of memory"
                progress(f"prompt {n}: out of GPU memory, recorded as such")
                if device == "cuda":
                    torch.cuda.empty_cache()
    return {n: s if isinstance(s, str) else _merge(f"prefill, {n} tokens", s) for n, s in samples.items()}


def profile_prefill(model, prompt, device: str, trace_path, warmup: int = 2, label_modules: bool = True) -> pd.DataFrame:
    """Profile one prefill (after `warmup` profiled-and-discarded ones in the same session),
    timed from a "prefill" annotation; write its trace to `trace_path`; return its kernels.
    With `label_modules` each kernel is labelled with the module that launched it."""
    from . import decode

    return harness.profile_region(lambda: decode.prefill(model, prompt), trace_path, region=ORIGIN["prefill"],
                                  device=device, warmup=warmup,
                                  labels=(lambda: decode.annotated_modules(model)) if label_modules else None)


_KEEP = ["name", "start_ns", "end_ns", "dur_ns", "stream", "grid", "block", "op", "module",
         "kind", "short_name", "layer", "part"]
_TEXT_COLUMNS = ["name", "stream", "grid", "block", "op", "module", "kind", "short_name", "part"]


def _annotate(k: pd.DataFrame) -> pd.DataFrame:
    from .one_token import annotate_kernels

    return annotate_kernels(k)[_KEEP]


def annotated_kernels(path, device: str, phase: str) -> pd.DataFrame:
    """The kernels of a phase's trace, with kind, short name, decoder layer and part."""
    return _annotate(trace.read_kernels(path, device=device, origin=ORIGIN[phase]))


def kind_column(kind: str) -> str:
    """The prompt sweep's column of GPU time for kernels of `kind` (e.g. "attention_ns")."""
    legacy = {MATMUL: "matmul_ns", "copy/convert/concat": "copy_ns"}
    return legacy.get(kind) or re.sub(r"\W+", "_", kind).strip("_") + "_ns"


# The prompt sweep's column of GPU time for each kind of kernel (kernels.KINDS decides the kinds).
KIND_COLUMNS = {kind: kind_column(kind) for kind in kernels.KINDS}


def _sweep_row(n: int, k: pd.DataFrame, t: harness.Timing) -> dict:
    kind = k["name"].map(kernels.classify)
    by_kind = {col: int(k.loc[kind == name, "dur_ns"].sum()) for name, col in KIND_COLUMNS.items()}
    return {"prompt_len": n, "status": "ok", "kernels": len(k),
            "gpu_busy_ns": trace.busy_ns(k.start_ns, k.end_ns), "kernel_ns": int(k.dur_ns.sum()), **by_kind,
            "wall_ms_median": t.median, "wall_ms_min": t.low, "wall_ms_max": t.high,
            "wall_repeats": len(t.wall_ms), "issue_ms_median": statistics.median(t.issue_ms),
            "wall_clean": t.clean}


def record(params: Params | None = None, run_id: str | None = None, allow_cpu: bool = False,
           progress=_progress) -> runs.Run:
    """Measure this GPU now and write a new run (not published). Returns the run.

    Every wall time is taken before the first profile in the process (see the module's
    docstring for the order); the prefill of `prompt_len` tokens is timed and profiled once,
    and both the phase table and the sweep's row for that length use that measurement."""
    import torch

    from . import decode

    params = params or Params()
    device = params.device
    harness.for_chapter(CHAPTER)

    def free():
        if device == "cuda":
            torch.cuda.empty_cache()

    with runs.live_writer(CHAPTER, params, run_id, allow_cpu=allow_cpu) as w:
        w.extra["method"] = harness.method()
        if device == "cuda":
            hardware.record_ceilings(w, progress)
        progress(f"building {params.preset} with random BF16 weights on {device}")
        model = models.build_model(params.preset, device=device)
        counts = models.count_model(model, params.preset)
        sh = model_shape(model)
        w.extra["model"] = counts.as_record()
        w.extra["shape"] = asdict(sh)
        layer = sh.layers // 2
        block = getattr(model, model.base_model_prefix).layers[layer]
        w.extra["gemm_layer"] = layer
        w.extra["gemm_shapes"] = {name: [m.in_features, m.out_features] for name, m in block.named_modules()
                                  if isinstance(m, torch.nn.Linear)}
        vocab = model.config.vocab_size
        n0 = params.prompt_len
        lengths = list(dict.fromkeys([n0, *params.prompt_lens]))
        prompts = {n: decode.Prompt.random(vocab, 1, n, device, seed=n) for n in lengths}
        prompt = prompts[n0]

        # 1. Every timing, before the first profile in this process.
        progress(f"timing {params.repeats} decode steps after a {n0}-token prefill (nothing profiled yet)")
        step = decode.time_decode_steps(model, prompt, device, repeats=params.repeats)
        progress(f"  median {step.median:.2f} ms")
        free()
        want = {n: params.repeats if n == n0 else params.sweep_repeats for n in lengths}
        progress(f"timing prefills of {len(lengths)} prompt lengths, round-robin "
                 f"({params.repeats} of {n0} tokens, {params.sweep_repeats} of each other length)")
        pre = time_prefills(model, prompts, want, device, progress=progress)
        for n, t in pre.items():
            if not isinstance(t, str):
                progress(f"  prompt {n}: prefill {t.median:.2f} ms (median of {len(t.wall_ms)})")
        if isinstance(pre[n0], str):
            raise RuntimeError(f"{CHAPTER}: the prefill of {n0} tokens ran {pre[n0]}; try a shorter prompt_len")
        times = pd.DataFrame(pre[n0].rows(phase="prefill") + step.rows(phase="decode"))
        w.write_table("phase_times", times.dropna(axis=1, how="all"))  # no CUDA-event times on a CPU
        free()

        # 2. Then the profiles.
        progress(f"profiling one prefill of {n0} tokens")
        k = {"prefill": _annotate(profile_prefill(model, prompt, device, w.path / trace_file("prefill")))}
        free()
        progress("profiling one decode step after it")
        k["decode"] = _annotate(decode.profile_decode_step(model, prompt, device, w.path / trace_file("decode")))
        census = []
        for phase in PHASES:
            w.write_table(kernels_table_name(phase), k[phase])
            c = kernels.census(k[phase])
            c.insert(0, "phase", phase)
            census.append(c)
            progress(f"  {phase}: {len(k[phase])} kernels, "
                     f"GPU busy {trace.busy_ns(k[phase].start_ns, k[phase].end_ns) / 1e6:.2f} ms")
        w.write_table("census", pd.concat(census, ignore_index=True))
        free()

        rows = []
        tmp = w.path / ".sweep-trace.json.gz"
        for n in params.prompt_lens:
            if isinstance(pre[n], str):
                rows.append({"prompt_len": n, "status": pre[n]})
                continue
            if n == n0:  # one measurement per configuration: the phase's own profile
                rows.append(_sweep_row(n, k["prefill"], pre[n]))
                continue
            try:
                rows.append(_sweep_row(n, profile_prefill(model, prompts[n], device, tmp, warmup=1,
                                                          label_modules=False), pre[n]))
                r = rows[-1]
                progress(f"prompt {n}: GPU busy {r['gpu_busy_ns'] / 1e6:.2f} ms, "
                         f"matrix multiplies {r['matmul_ns'] / 1e6:.2f} ms")
            except torch.OutOfMemoryError:
                rows.append({"prompt_len": n, "status": "out of memory"})
                progress(f"prompt {n}: out of GPU memory while profiling, recorded as such")
            finally:
                tmp.unlink(missing_ok=True)
                free()
        w.write_table("prompt_sweep", pd.DataFrame(rows))
        del model, block, prompt, prompts
        free()
    return runs.load_run(CHAPTER, w.run_id)


def load(run_id: str | None = None) -> runs.Run:
    """The published run (or `run_id`) of this chapter."""
    return runs.load_run(CHAPTER, run_id)


# --- analysis -----------------------------------------------------------------------------

def shape(run: runs.Run) -> ModelShape:
    return ModelShape(**run.results["shape"])


def kernel_table(run: runs.Run, phase: str) -> pd.DataFrame:
    """The kernels of one phase's profiled pass, with the column types they were written with.

    `kind` is today's classification of each recorded name (kernels.classify), so that a run
    recorded under older rules is counted by the rules the book describes."""
    k = run.table(kernels_table_name(phase), dtype={c: str for c in _TEXT_COLUMNS})
    k[_TEXT_COLUMNS] = k[_TEXT_COLUMNS].fillna("")
    k["kind"] = k["name"].map(kernels.classify)
    return k.astype({"layer": "Int64"})


def recompute_kernels(run: runs.Run, phase: str) -> pd.DataFrame:
    """One phase's kernel table recomputed from its raw trace, with today's rules."""
    device = run.provenance.get("device", "cuda")
    return annotated_kernels(run.file(trace_file(phase)), device, phase)


# The ceilings of a run (datasheet and measured) live in hardware; the chapter's names for them:
Limits = hardware.Limits
limits = hardware.run_limits


@dataclass(frozen=True)
class Bandwidth:
    """The measured bandwidth that a pass reading weights is set against: the read stream
    where the run measured one, else the copy (which counts bytes read plus written, so a
    kernel that mostly reads can beat it)."""

    tbs: float | None
    name: str     # for prose: "measured read stream", ...
    short: str    # for labels: "measured read", "measured copy"


def bandwidth(lim: Limits) -> Bandwidth:
    if lim.read_tbs:
        return Bandwidth(lim.read_tbs, "measured read stream", "measured read")
    if lim.copy_tbs:
        return Bandwidth(lim.copy_tbs, "measured copy (bytes read + written)", "measured copy")
    return Bandwidth(None, "no measured bandwidth", "measured bandwidth")


def measured_ridge(lim: Limits) -> float | None:
    """FLOP per byte of weights above which the measured GEMM rate, not the measured
    bandwidth for reading weights, is the limit."""
    bw = bandwidth(lim).tbs
    return lim.gemm_tflops / bw if lim.gemm_tflops and bw else None


def _ratio(value: float, limit: float | None) -> float | None:
    return value / limit if limit else None


@dataclass
class Phase:
    """One phase measured: its time, its kernels, its work, and the rates it reached.

    Rates use the wall time (what a user waits for) and, marked `busy`, the time the GPU
    was busy in the profiled pass (what the kernels alone reached). MFU: FLOP/s reached
    over the peak FLOP/s; MBU: bytes per second reached over the peak bandwidth, against
    the datasheet and against the measured bandwidth() (read stream, or copy in older runs).
    """

    phase: str
    new_tokens: int
    cached_tokens: int        # tokens in the KV cache before the pass
    kernels: int
    wall_ms: float            # median of the timed passes (no profiler)
    wall_min_ms: float
    wall_max_ms: float
    wall_repeats: int
    gpu_busy_ms: float        # union of kernel intervals in the profiled pass
    kernel_ms: float          # sum of kernel durations
    matmul_kernels: int
    matmul_ms: float
    attention_ms: float
    matmul_flops: int
    attention_flops: int
    flops: int
    bytes: int
    flop_per_byte: float
    tflops: float             # model FLOPs / wall time
    tflops_busy: float
    tbs: float                # bytes that must move / wall time
    tbs_busy: float
    matmul_tflops: float      # matmul FLOPs / matmul kernel time
    mfu_datasheet: float | None
    mfu_gemm: float | None
    mfu_busy_datasheet: float | None
    mfu_busy_gemm: float | None
    mbu_datasheet: float | None
    mbu_measured: float | None
    mbu_busy_datasheet: float | None
    mbu_busy_measured: float | None
    ms_per_token: float       # wall time / new tokens


def phases(run: runs.Run) -> dict[str, Phase]:
    """Both phases of the run, measured and set against the limits."""
    sh, lim = shape(run), limits(run)
    bw = bandwidth(lim).tbs
    n = int(run.parameters["prompt_len"])
    times = run.table("phase_times")
    out = {}
    for ph in PHASES:
        k = kernel_table(run, ph)
        walls = times.loc[times["phase"] == ph, "wall_ms"]
        wall = float(statistics.median(walls))
        busy = trace.busy_ns(k.start_ns, k.end_ns) / 1e6
        mm = k[k.kind == MATMUL]
        work = phase_work(sh, ph, n)
        tflops, tflops_busy = work.flops / wall / 1e9, work.flops / busy / 1e9  # FLOP/ms / 1e9 = TFLOP/s
        tbs, tbs_busy = work.bytes / wall / 1e9, work.bytes / busy / 1e9
        mm_ms = mm.dur_ns.sum() / 1e6
        new = n if ph == "prefill" else 1
        out[ph] = Phase(
            phase=ph, new_tokens=new, cached_tokens=0 if ph == "prefill" else n,
            kernels=len(k), wall_ms=wall, wall_min_ms=float(walls.min()), wall_max_ms=float(walls.max()),
            wall_repeats=len(walls),
            gpu_busy_ms=busy, kernel_ms=k.dur_ns.sum() / 1e6, matmul_kernels=len(mm), matmul_ms=mm_ms,
            attention_ms=k.loc[k.kind == "attention", "dur_ns"].sum() / 1e6,
            matmul_flops=work.matmul_flops, attention_flops=work.attention_flops, flops=work.flops,
            bytes=work.bytes, flop_per_byte=work.flop_per_byte,
            tflops=tflops, tflops_busy=tflops_busy, tbs=tbs, tbs_busy=tbs_busy,
            matmul_tflops=work.matmul_flops / mm_ms / 1e9 if mm_ms else float("nan"),
            mfu_datasheet=_ratio(tflops, lim.datasheet_tflops), mfu_gemm=_ratio(tflops, lim.gemm_tflops),
            mfu_busy_datasheet=_ratio(tflops_busy, lim.datasheet_tflops),
            mfu_busy_gemm=_ratio(tflops_busy, lim.gemm_tflops),
            mbu_datasheet=_ratio(tbs, lim.datasheet_tbs), mbu_measured=_ratio(tbs, bw),
            mbu_busy_datasheet=_ratio(tbs_busy, lim.datasheet_tbs), mbu_busy_measured=_ratio(tbs_busy, bw),
            ms_per_token=wall / new,
        )
    return out


def phase_table(run: runs.Run) -> pd.DataFrame:
    """Both phases side by side, one row per number (numeric; None where no limit is known)."""
    p = phases(run)
    return pd.DataFrame({ph: asdict(v) for ph, v in p.items()}).drop(index="phase")


@dataclass
class PrefillTiming:
    """The wall time of the prefill of `prompt_len` tokens, as the phase table and the
    prompt-length sweep show it: one measurement (`shared`) in runs recorded since the
    chapter times each configuration once; older runs timed it twice."""

    prompt_len: int
    phase_ms: float
    phase_repeats: int
    sweep_ms: float | None    # None when the sweep has no row (that ran) for prompt_len
    sweep_repeats: int | None
    shared: bool


def prefill_timing(run: runs.Run) -> PrefillTiming:
    n = int(run.parameters["prompt_len"])
    t = run.table("phase_times")
    walls = t.loc[t["phase"] == "prefill", "wall_ms"]
    s = run.table("prompt_sweep")
    row = s[(s["prompt_len"] == n) & (s["status"] == "ok")]
    same = lambda a, b: math.isclose(float(a), float(b), rel_tol=1e-12)  # noqa: E731 (CSV round trip)
    if row.empty:
        return PrefillTiming(n, float(statistics.median(walls)), len(walls), None, None, False)
    r = row.iloc[0]
    reps = int(r["wall_repeats"]) if "wall_repeats" in row.columns else None
    shared = (reps == len(walls) and same(r["wall_ms_median"], statistics.median(walls))
              and same(r["wall_ms_min"], walls.min()) and same(r["wall_ms_max"], walls.max()))
    return PrefillTiming(n, float(statistics.median(walls)), len(walls), float(r["wall_ms_median"]), reps, shared)


def utilisation(run: runs.Run) -> pd.DataFrame:
    """MFU and MBU of both phases, on wall time and on GPU-busy time, against the datasheet
    and against the ceilings measured in the run (NaN where a limit is unknown). The last
    column is named after the measured bandwidth used ("MBU vs measured read", or copy)."""
    nan = float("nan")
    mbu_col = f"MBU vs {bandwidth(limits(run)).short}"
    rows = []
    for ph, p in phases(run).items():
        for time_name, sfx in (("wall time", ""), ("GPU busy", "_busy")):
            rows.append({"phase": ph, "time": time_name,
                         "MFU vs datasheet": getattr(p, f"mfu{sfx}_datasheet") or nan,
                         "MFU vs measured GEMM": getattr(p, f"mfu{sfx}_gemm") or nan,
                         "MBU vs datasheet": getattr(p, f"mbu{sfx}_datasheet") or nan,
                         mbu_col: getattr(p, f"mbu{sfx}_measured") or nan})
    return pd.DataFrame(rows)


def census(run: runs.Run) -> pd.DataFrame:
    """Kernels and GPU time by kind, prefill beside decode (the kinds by today's rules, from
    the recorded kernel tables; census.csv holds those of the rules at recording time)."""
    parts = {}
    for ph in PHASES:
        x = kernels.census(kernel_table(run, ph)).set_index("kind")
        parts[(ph, "kernels")] = x["kernels"]
        parts[(ph, "GPU ms")] = x["gpu_ns"] / 1e6
        parts[(ph, "share")] = x["share"]
    out = pd.DataFrame(parts)
    out.columns = pd.MultiIndex.from_tuples(out.columns)
    out.index.name = "kind"
    return out


def layer_gemms(run: runs.Run) -> pd.DataFrame:
    """The matrix multiplies of one decoder layer in both phases: one row per weight matrix
    and phase, with its kernels (the longest, and the names of any helpers such as a split-K
    reduction), their time together, and the rates reached.

    rows = tokens that go through the matrix (the prompt in prefill, 1 in decode);
    FLOPs = 2 × rows × in × out; bytes = the weight, the input and the output, once each.
    """
    layer = int(run.results["gemm_layer"])
    shapes = run.results["gemm_shapes"]
    p = int(run.results["shape"]["bytes_per_value"])
    rows = []
    for ph in PHASES:
        k = kernel_table(run, ph)
        k = k[(k.kind == MATMUL) & (k.layer == layer)]
        m_rows = int(run.parameters["prompt_len"]) if ph == "prefill" else 1
        for mod in (m for m in GEMM_MODULES if m in shapes):
            fin, fout = shapes[mod]
            g = k[k.module == f"layers.{layer}.{mod}"]
            ns = int(g.dur_ns.sum())
            flops = 2 * m_rows * fin * fout
            nbytes = p * (fin * fout + m_rows * fin + m_rows * fout)
            main = g.loc[g.dur_ns.idxmax()] if len(g) else None
            helpers = g.drop(index=main.name).short_name if main is not None else []
            rows.append({"module": mod, "phase": ph, "rows": m_rows, "in": fin, "out": fout,
                         "kernels": len(g), "kernel": main.short_name if main is not None else "",
                         "helpers": "; ".join(dict.fromkeys(helpers)),
                         "grid": main.grid if main is not None else "", "dur_ns": ns,
                         "flops": flops, "bytes": nbytes, "flop_per_byte": flops / nbytes,
                         "tflops": flops / ns / 1e3 if ns else float("nan"),
                         "tbs": nbytes / ns / 1e3 if ns else float("nan")})
    return pd.DataFrame(rows)


def layer_gemm_table(run: runs.Run) -> pd.DataFrame:
    """layer_gemms() laid out for reading: one row per weight matrix, the phases side by side
    (time, TFLOP/s and TB/s; the kernels' names are in layer_gemm_kernels())."""
    g = layer_gemms(run)
    out = {}
    for ph in PHASES:
        x = g[g.phase == ph].set_index("module")
        out[(ph, "µs")] = x["dur_ns"] / 1e3
        out[(ph, "TFLOP/s")] = x["tflops"]
        out[(ph, "TB/s")] = x["tbs"]
    first = g[g.phase == PHASES[0]].set_index("module")
    t = pd.DataFrame(out)
    t.columns = pd.MultiIndex.from_tuples(t.columns)
    t.insert(0, ("weight", "in × out"), [f"{a:,} × {b:,}" for a, b in zip(first["in"], first["out"])])
    t.index.name = "matrix"
    return t


def layer_gemm_kernels(run: runs.Run) -> pd.DataFrame:
    """Which kernels did each of those matrix multiplies, in each phase: the one that did the
    work, then (after a +) any helper that ran with it."""
    g = layer_gemms(run)
    return pd.DataFrame({"matrix": g.module, "phase": g.phase,
                         "kernels": g.kernel + g.helpers.map(lambda h: f" + {h}" if h else "")})


def prompt_sweep(run: runs.Run) -> pd.DataFrame:
    """The sweep of prompt lengths (rows that ran), with model FLOPs and the rates reached."""
    sh = shape(run)
    s = run.table("prompt_sweep")
    ok = s[s.status == "ok"].copy()
    n = ok.prompt_len.astype(int)
    work = [forward_work(sh, int(t)) for t in n]
    ok["wall ms"] = ok.wall_ms_median
    ok["GPU ms"] = ok.gpu_busy_ns / 1e6
    ok["matmul ms"] = ok.matmul_ns / 1e6
    ok["ms per token"] = ok["wall ms"] / n
    ok["GPU ms per token"] = ok["GPU ms"] / n
    ok["matmul ms per token"] = ok["matmul ms"] / n
    ok["flops"] = [w.flops for w in work]
    ok["matmul flops"] = [w.matmul_flops for w in work]
    ok["FLOP/byte"] = [matmul_intensity(sh, int(t)) for t in n]
    ok["TFLOP/s"] = ok["flops"] / ok["wall ms"] / 1e9
    ok["GPU TFLOP/s"] = ok["flops"] / ok["GPU ms"] / 1e9
    ok["matmul TFLOP/s"] = ok["matmul flops"] / ok["matmul ms"] / 1e9
    ok["tokens/s"] = n / (ok["wall ms"] / 1e3)
    return ok.reset_index(drop=True)


@dataclass
class Crossover:
    """Where a prefill's matrix multiplies turn from memory-bound to compute-bound.

    While memory-bound, their time is that of reading every weight once, whatever the
    prompt (the floor); when compute-bound it grows in proportion to the prompt. The two
    lines cross at `measured_tokens`. The ridge points say where the limits predict it:
    the prompt whose matrix multiplies do as many FLOP per byte of weights as the peak
    FLOP/s over the peak bandwidth.
    """

    floor_ms: float               # matmul time of the shortest prompts (median over <= 8 tokens)
    ms_per_token: float           # matmul time per token at the longest prompt
    measured_tokens: float        # floor_ms / ms_per_token
    flat_until: int               # longest prompt whose matmul time is within 25% of the floor
    best_matmul_tflops: float
    saturates_at: int             # shortest prompt whose matmul FLOP/s reach 90% of the best
    datasheet_ridge: float | None     # FLOP/byte
    measured_ridge: float | None      # measured GEMM rate over measured bandwidth() for reading weights
    datasheet_tokens: float | None    # the prompt length at the datasheet ridge
    measured_ridge_tokens: float | None


def crossover(run: runs.Run) -> Crossover:
    s = prompt_sweep(run)
    sh, lim = shape(run), limits(run)
    small = s[s.prompt_len <= 8]["matmul ms"]
    floor = float(small.median()) if len(small) else float(s["matmul ms"].iloc[0])
    big = s.iloc[-1]
    per_token = float(big["matmul ms"] / big.prompt_len)
    best = float(s["matmul TFLOP/s"].max())
    ridge = measured_ridge(lim)
    return Crossover(
        floor_ms=floor, ms_per_token=per_token, measured_tokens=floor / per_token,
        flat_until=int(s.loc[s["matmul ms"] <= 1.25 * floor, "prompt_len"].max()),
        best_matmul_tflops=best,
        saturates_at=int(s.loc[s["matmul TFLOP/s"] >= 0.9 * best, "prompt_len"].min()),
        datasheet_ridge=lim.datasheet_ridge, measured_ridge=ridge,
        datasheet_tokens=tokens_at_intensity(sh, lim.datasheet_ridge) if lim.datasheet_ridge else None,
        measured_ridge_tokens=tokens_at_intensity(sh, ridge) if ridge else None,
    )


def roofline(run: runs.Run, points: int = 200) -> pd.DataFrame:
    """The most TFLOP/s a prefill's matrix multiplies could reach at each prompt length, by
    the datasheet and by the measured ceilings (GEMM rate, and bandwidth() for reading the
    weights): the lesser of the peak FLOP/s and the bandwidth times the FLOP per byte (NaN
    where a limit is unknown)."""
    import numpy as np

    sh, lim = shape(run), limits(run)
    lens = run.table("prompt_sweep").prompt_len
    grid = np.unique(np.geomspace(max(int(lens.min()), 1), int(lens.max()), points).round().astype(int))
    out = pd.DataFrame({"prompt_len": grid, "FLOP/byte": [matmul_intensity(sh, int(t)) for t in grid]})
    nan = float("nan")
    for col, tflops, tbs in (("datasheet TFLOP/s", lim.datasheet_tflops, lim.datasheet_tbs),
                             ("measured TFLOP/s", lim.gemm_tflops, bandwidth(lim).tbs)):
        out[col] = np.minimum(tflops, tbs * out["FLOP/byte"]) if tflops and tbs else nan
    return out


def _ceilings_row(run: runs.Run):
    return run.table("ceilings").iloc[0] if "ceilings.csv" in run.meta["files"] else None


def achieved_rates(run: runs.Run) -> pd.DataFrame:
    """Every rate the chapter shows, next to the ceilings it is compared with: one row per
    figure (the fastest, where a table shows several), `value` in `unit` (TFLOP/s or TB/s),
    `measured` (the measured GEMM rate, or bandwidth()) and `datasheet`, and whether the
    value is above each (False where the ceiling is unknown)."""
    lim = limits(run)
    bw = bandwidth(lim).tbs
    layer = int(run.results["gemm_layer"])
    g, s = layer_gemms(run), prompt_sweep(run)
    rows = []

    def add(figure: str, unit: str, value: float) -> None:
        measured, sheet = (lim.gemm_tflops, lim.datasheet_tflops) if unit == "TFLOP/s" else (bw, lim.datasheet_tbs)
        rows.append({"figure": figure, "unit": unit, "value": float(value), "measured": measured,
                     "datasheet": sheet, "above measured": bool(measured) and value > measured,
                     "above datasheet": bool(sheet) and value > sheet})

    for ph, x in phases(run).items():
        add(f"the whole {ph} on GPU-busy time", "TFLOP/s", x.tflops_busy)
        add(f"the whole {ph} on GPU-busy time", "TB/s", x.tbs_busy)
        add(f"the matrix multiplies of the {ph}", "TFLOP/s", x.matmul_tflops)
        gp = g[(g.phase == ph) & g.dur_ns.gt(0)]
        for unit, col in (("TFLOP/s", "tflops"), ("TB/s", "tbs")):
            if len(gp):
                best = gp.loc[gp[col].idxmax()]
                add(f"the {best.module} matrix multiply of layer {layer} in {ph}", unit, best[col])
    if len(s):
        best = s.loc[s["matmul TFLOP/s"].idxmax()]
        add(f"the matrix multiplies of the {int(best.prompt_len):,}-token prefill", "TFLOP/s", best["matmul TFLOP/s"])
    return pd.DataFrame(rows)


def ceiling_notes(run: runs.Run) -> dict[str, str]:
    """For each measured ceiling (`gemm`, `bandwidth`), the sentence the chapter shows: why a
    figure above it can be there, or that none is."""
    lim, bw = limits(run), bandwidth(limits(run))
    a, ceil = achieved_rates(run), _ceilings_row(run)
    notes = {}
    t = a[a.unit == "TFLOP/s"]
    top = t.loc[t.value.idxmax()]
    if not lim.gemm_tflops or ceil is None:
        notes["gemm"] = "This run measured no GEMM rate."
    elif top["above measured"]:
        n = int(ceil["gemm_n"])
        notes["gemm"] = (
            f"Some matrix multiplies here ran faster than the measured GEMM rate: {top.figure} reached "
            f"{top.value:.0f} TFLOP/s, against {lim.gemm_tflops:.0f}. That rate is one shape, the product of two "
            f"{n:,} × {n:,} matrices of random numbers timed in this run: a reference point, not a limit of the "
            "hardware. The "
            "library picks a kernel for each shape, and some shapes run a little faster.")
        if lim.datasheet_tflops:
            notes["gemm"] += (f" The hardware's limit is the datasheet's {lim.datasheet_tflops:.0f} TFLOP/s, "
                              + ("which none of them reaches." if not top["above datasheet"] else
                                 f"and {top.value:.0f} TFLOP/s is above even that: a measurement to distrust."))
    else:
        notes["gemm"] = (f"No matrix multiply here ran faster than the measured GEMM rate "
                         f"({lim.gemm_tflops:.0f} TFLOP/s).")
    b = a[a.unit == "TB/s"]
    top = b.loc[b.value.idxmax()]
    if not bw.tbs:
        notes["bandwidth"] = "This run measured no bandwidth."
    elif top["above measured"]:
        if lim.read_tbs:
            why = (f"The read stream is one measurement, {ceil['read_by']} over "
                   f"{int(ceil['read_bytes']) / 2**30:.0f} GiB timed in this run, not a limit of the hardware.")
        else:
            why = ("A copy's rate counts the bytes it reads plus those it writes, over one memory bus; a kernel "
                   "that only reads its weights can go faster. This run measured no read stream, the ceiling "
                   "that applies to reading weights.")
        notes["bandwidth"] = (f"{top.figure[0].upper()}{top.figure[1:]} moved {top.value:.2f} TB/s, more than the "
                              f"{bw.name}, {bw.tbs:.2f} TB/s. {why}")
        if lim.datasheet_tbs:
            notes["bandwidth"] += (f" The hardware's limit is the datasheet's {lim.datasheet_tbs:.2f} TB/s"
                                   + ("." if not top["above datasheet"] else
                                      f", and {top.value:.2f} TB/s is above even that: a measurement to distrust."))
    else:
        notes["bandwidth"] = f"No figure here is above the {bw.name}, {bw.tbs:.2f} TB/s."
    return notes


def headline(run: runs.Run) -> dict:
    """Wall times (which, in eager mode, move with the host CPU) and the GPU-side numbers
    (which hold steady from run to run)."""
    p = phases(run)
    return {"prefill ms": p["prefill"].wall_ms, "decode ms": p["decode"].wall_ms,
            "prefill GPU ms": p["prefill"].gpu_busy_ms, "decode GPU ms": p["decode"].gpu_busy_ms,
            "prefill TFLOP/s (GPU busy)": p["prefill"].tflops_busy,
            "crossover tokens": crossover(run).measured_tokens}
