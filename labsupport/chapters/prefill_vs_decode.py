"""Chapter "Prompt phase vs decode phase": record a run live, and analyse a run.

Live, in this order (labsupport.measure.harness: every wall time before the first profile):

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

from labsupport.measure import hardware, harness, models
from labsupport.traces import kernels, trace
from labsupport import runs
from labsupport.measure import recording

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

    from labsupport.measure import decode

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
    from labsupport.measure import decode

    return harness.profile_region(lambda: decode.prefill(model, prompt), trace_path, region=ORIGIN["prefill"],
                                  device=device, warmup=warmup,
                                  labels=(lambda: decode.annotated_modules(model)) if label_modules else None)


_KEEP = ["name", "start_ns", "end_ns", "dur_ns", "stream", "grid", "block", "op", "module",
         "kind", "short_name", "layer", "part"]
_TEXT_COLUMNS = ["name", "stream", "grid", "block", "op", "module", "kind", "short_name", "part"]


def _annotate(k: pd.DataFrame) -> pd.DataFrame:

    return kernels.annotate(k)[_KEEP]


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

    from labsupport.measure import decode

    params = params or Params()
    device = params.device
    harness.for_chapter(CHAPTER)

    def free():
        if device == "cuda":
            torch.cuda.empty_cache()

    with recording.writer(CHAPTER, params, run_id, allow_cpu=allow_cpu) as w:
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


# --- the roofline: every matrix multiply of both passes ------------------------------------

LM_HEAD = "lm_head"
# The points of the roofline figure: each weight matrix of a decoder layer, then the LM head.
ROOFLINE_MODULES = (*GEMM_MODULES, LM_HEAD)
SHORT = {"self_attn.q_proj": "q", "self_attn.k_proj": "k", "self_attn.v_proj": "v", "self_attn.o_proj": "o",
         "mlp.gate_proj": "gate", "mlp.up_proj": "up", "mlp.down_proj": "down", LM_HEAD: "LM head"}


def attainable(flop_per_byte, tflops: float | None, tbs: float | None):
    """The most TFLOP/s work at `flop_per_byte` can reach under a roof of `tflops` (math) and
    `tbs` (memory): min(tflops, tbs × FLOP per byte). NaN where either limit is unknown."""
    import numpy as np

    x = np.asarray(flop_per_byte, dtype=float)
    return np.minimum(tflops, tbs * x) if tflops and tbs else np.full_like(x, float("nan"))


def _hidden(run: runs.Run) -> int:
    shapes = run.results["gemm_shapes"]
    return int(shapes["mlp.down_proj"][1] if "mlp.down_proj" in shapes else shapes["self_attn.o_proj"][1])


def gemm_points(run: runs.Run) -> pd.DataFrame:
    """The points of the roofline: one row per weight matrix (the seven of a decoder layer,
    and the LM head) and phase, its kernels summed over every decoder layer.

    rows      = tokens that go through the matrix: the prompt for a decoder layer's matrix in
                prefill, 1 in decode, and 1 for the LM head in both phases (a prefill asks for
                the logits of its last token only);
    instances = decoder layers whose kernels for that matrix the profile holds (1 for the LM head);
    FLOPs     = instances × 2 × rows × in × out;
    bytes     = instances × bytes per value × (in × out + rows × in + rows × out): the weight,
                the input and the output, each moved once (the least traffic; a split-K
                kernel's partial sums add to it, unseen here);
    time      = the matrix-multiply kernels launched by that matrix (a split-K reduction included).

    `roof_*` is the most TFLOP/s at that FLOP per byte (attainable()) under the datasheet's
    ceilings and under those measured in the run (GEMM rate, bandwidth()); `of_*_roof` the
    share of it reached. Below the ridge the roof is the bandwidth slope, so that share is the
    share of the bandwidth reached; above it, the share of the peak FLOP/s."""
    shapes = run.results["gemm_shapes"]
    sh, lim = shape(run), limits(run)
    p = sh.bytes_per_value
    hidden = _hidden(run)
    n = int(run.parameters["prompt_len"])
    rows = []
    for ph in PHASES:
        k = kernel_table(run, ph)
        k = k[k.kind == MATMUL]
        for mod in ROOFLINE_MODULES:
            if mod == LM_HEAD:
                fin, fout, m_rows = hidden, sh.lm_head_parameters // hidden, 1
                g = k[k.module == LM_HEAD]
                instances = 1 if len(g) else 0
            elif mod in shapes:
                (fin, fout), m_rows = shapes[mod], (n if ph == "prefill" else 1)
                g = k[k.module.str.fullmatch(rf"layers\.\d+\.{re.escape(mod)}")]
                instances = int(g.layer.nunique())
            else:
                continue
            ns = int(g.dur_ns.sum())
            flops = instances * 2 * m_rows * fin * fout
            nbytes = instances * p * (fin * fout + m_rows * (fin + fout))
            names = g.groupby("short_name").dur_ns.sum().sort_values(ascending=False)
            rows.append({"phase": ph, "module": mod, "matrix": SHORT[mod], "rows": m_rows, "in": fin, "out": fout,
                         "instances": instances, "kernels": len(g),
                         "kernel": names.index[0] if len(names) else "",
                         "split_k": bool(g.short_name.str.contains("splitK", case=False).any()),
                         "dur_ns": ns, "flops": flops, "bytes": nbytes,
                         "flop_per_byte": flops / nbytes if nbytes else float("nan"),
                         "tflops": flops / ns / 1e3 if ns else float("nan"),
                         "tbs": nbytes / ns / 1e3 if ns else float("nan")})
    out = pd.DataFrame(rows)
    out["roof_datasheet"] = attainable(out.flop_per_byte, lim.datasheet_tflops, lim.datasheet_tbs)
    out["roof_measured"] = attainable(out.flop_per_byte, lim.gemm_tflops, bandwidth(lim).tbs)
    out["of_datasheet_roof"] = out.tflops / out.roof_datasheet
    out["of_measured_roof"] = out.tflops / out.roof_measured
    return out


def pass_points(run: runs.Run) -> pd.DataFrame:
    """Each whole pass as one point of the roofline: model FLOPs over FLOP per byte (phases()),
    at the rate reached on GPU-busy time (every kernel, not only the matrix multiplies)."""
    lim = limits(run)
    out = pd.DataFrame([{"phase": ph, "flop_per_byte": x.flop_per_byte, "tflops": x.tflops_busy}
                        for ph, x in phases(run).items()])
    out["roof_datasheet"] = attainable(out.flop_per_byte, lim.datasheet_tflops, lim.datasheet_tbs)
    out["roof_measured"] = attainable(out.flop_per_byte, lim.gemm_tflops, bandwidth(lim).tbs)
    return out


@dataclass
class RooflineCluster:
    """The points of one phase's matrix multiplies on the roofline, summarised for the prose
    (the prefill's LM head, one row like decode's, is left out of the prefill's cluster)."""

    phase: str
    points: int
    fpb_min: float
    fpb_max: float
    tflops_min: float
    tflops_max: float
    tbs_min: float
    tbs_max: float
    of_datasheet_min: float
    of_datasheet_max: float
    of_measured_min: float
    of_measured_max: float
    matmul_share: float          # share of the phase's matrix-multiply kernel time in its points (all)
    bound: str                   # "memory" or "compute": every point below / above the datasheet ridge
    slowest: str                 # the matrix furthest below its roof (datasheet)
    fastest: str
    others: str                  # modules of the phase's other matrix-multiply kernels ("" if none)


def roofline_clusters(run: runs.Run) -> dict[str, RooflineCluster]:
    pts, lim = gemm_points(run), limits(run)
    ridge = lim.datasheet_ridge or measured_ridge(lim)
    out = {}
    for ph in PHASES:
        allp = pts[pts.phase == ph]
        x = allp[~((allp.module == LM_HEAD) & (allp.rows < allp.rows.max()))]
        mm = kernel_table(run, ph)
        mm = mm[mm.kind == MATMUL]
        mm_ns = mm.dur_ns.sum()
        covered = mm.module.str.fullmatch(rf"layers\.\d+\.({'|'.join(map(re.escape, GEMM_MODULES))})") | (mm.module == LM_HEAD)
        rest = mm[~covered]
        key = "of_datasheet_roof" if x.of_datasheet_roof.notna().any() else "of_measured_roof"
        below = bool(ridge) and (x.flop_per_byte < ridge).all()
        above = bool(ridge) and (x.flop_per_byte > ridge).all()
        out[ph] = RooflineCluster(
            phase=ph, points=len(x), fpb_min=x.flop_per_byte.min(), fpb_max=x.flop_per_byte.max(),
            tflops_min=x.tflops.min(), tflops_max=x.tflops.max(), tbs_min=x.tbs.min(), tbs_max=x.tbs.max(),
            of_datasheet_min=x.of_datasheet_roof.min(), of_datasheet_max=x.of_datasheet_roof.max(),
            of_measured_min=x.of_measured_roof.min(), of_measured_max=x.of_measured_roof.max(),
            matmul_share=allp.dur_ns.sum() / mm_ns if mm_ns else float("nan"),
            bound="memory" if below else "compute" if above else "mixed",
            slowest=SHORT[x.loc[x[key].idxmin(), "module"]] if x[key].notna().any() else "",
            fastest=SHORT[x.loc[x[key].idxmax(), "module"]] if x[key].notna().any() else "",
            others="; ".join(f"`{m or 'no module'}` ({len(g)} kernel{'s' if len(g) > 1 else ''}, "
                             f"{g.dur_ns.sum() / 1e3:,.1f} µs)" for m, g in rest.groupby("module", sort=False)))
    return out


def roofline_table(run: runs.Run) -> pd.DataFrame:
    """gemm_points() laid out for reading: one row per matrix, the phases side by side: rows
    (the prefill's; decode's are 1), FLOP per byte, the rate that matters for the phase
    (TFLOP/s in the prefill, TB/s in decode, where one FLOP per byte makes the two the same
    number) and its share of the datasheet's roof at that intensity."""
    pts = gemm_points(run)
    out = {}
    for ph in PHASES:
        x = pts[pts.phase == ph].set_index("matrix")
        if ph == "prefill":
            out[(ph, "rows")] = x["rows"]
        out[(ph, "FLOP/byte")] = x["flop_per_byte"]
        if ph == "prefill":
            out[(ph, "TFLOP/s")] = x["tflops"]
        else:
            out[(ph, "TB/s")] = x["tbs"]
        out[(ph, "of roof")] = x["of_datasheet_roof"]
    first = pts[pts.phase == PHASES[0]].set_index("matrix")
    t = pd.DataFrame(out)
    t.columns = pd.MultiIndex.from_tuples(t.columns)
    t.insert(0, ("weight", "in × out"), [f"{a:,} × {b:,}" for a, b in zip(first["in"], first["out"])])
    t.index.name = "matrix"
    return t


def _spread(ys: list[float], ratio: float) -> list[float]:
    """Label heights (log scale) near `ys`, at least `ratio` apart, in the same order."""
    import math as m

    logs = [m.log(y) for y in ys]
    gap = m.log(ratio)
    order = sorted(range(len(ys)), key=lambda i: logs[i])
    out = [logs[i] for i in order]
    for _ in range(50):
        moved = False
        for j in range(1, len(out)):
            if out[j] - out[j - 1] < gap - 1e-9:
                push = (gap - (out[j] - out[j - 1])) / 2
                out[j - 1] -= push
                out[j] += push
                moved = True
        if not moved:
            break
    res = [0.0] * len(ys)
    for k, i in enumerate(order):
        res[i] = m.exp(out[k])
    return res


def roofline_figure(run: runs.Run):
    """The roofline: FLOP per byte (log) against TFLOP/s reached (log), every matrix multiply
    of both passes as a point (gemm_points()), each whole pass as a hollow point
    (pass_points()), under the datasheet's roof and the roof of the ceilings measured in the
    run, each labelled with its numbers."""
    import matplotlib.pyplot as plt
    import numpy as np

    from labsupport.figures import OURS, PHASE_COLORS, finish

    pts, whole, lim = gemm_points(run), pass_points(run), limits(run)
    bw = bandwidth(lim)
    n = int(run.parameters["prompt_len"])
    fig, ax = plt.subplots(figsize=(10.5, 6.4))
    ok = pts[pts.tflops.notna() & (pts.tflops > 0)]
    lo_x = min(ok.flop_per_byte.min(), whole.flop_per_byte.min()) / 4
    hi_x = max(ok.flop_per_byte.max(), whole.flop_per_byte.max(), lim.datasheet_ridge or 0) * 8
    x = np.geomspace(lo_x, hi_x, 400)
    sheet = f"datasheet ({lim.datasheet_name})" if lim.datasheet_name else "datasheet"
    sheet_text = f"{sheet}: {lim.datasheet_tflops or 0:.0f} TFLOP/s, {lim.datasheet_tbs or 0:.2f} TB/s"
    measured_text = (f"measured in this run: GEMM {lim.gemm_tflops or 0:.0f} TFLOP/s, {bw.short} {bw.tbs or 0:.2f} TB/s"
                     + ("" if lim.read_tbs else " (bytes read + written; this run measured no read stream)"))
    for tflops, tbs, color, ls, text in ((lim.datasheet_tflops, lim.datasheet_tbs, "#888", "-", sheet_text),
                                         (lim.gemm_tflops, bw.tbs, OURS, "--", measured_text)):
        if tflops and tbs:
            ax.plot(x, attainable(x, tflops, tbs), color=color, ls=ls, lw=1.4,
                    label=f"roof, {text}; ridge {tflops / tbs:.0f} FLOP/byte")
            ax.plot([tflops / tbs], [tflops], marker="o", ms=4, color=color)
    # Points: prefill squares under decode circles (the LM head runs for one row in both).
    for ph, marker, size in (("prefill", "s", 64), ("decode", "o", 30)):
        p = ok[ok.phase == ph]
        rows = f"{n:,} rows, 1 for the LM head" if ph == "prefill" else "1 row"
        ax.scatter(p.flop_per_byte, p.tflops, s=size, marker=marker, color=PHASE_COLORS[ph], zorder=3,
                   label=f"{ph}: one weight matrix, its kernels summed over the layers ({rows})")
    for r in whole.itertuples():
        ax.scatter([r.flop_per_byte], [r.tflops], s=80, marker="D", facecolors="none",
                   edgecolors=PHASE_COLORS[r.phase], linewidths=1.3, zorder=3,
                   label=f"whole {r.phase} pass: model FLOPs over GPU-busy time")
    # Labels, one per shape, in a column beside each cluster (one row: decode's; more: prefill's).
    for one_row, color, fx_of in ((True, PHASE_COLORS["decode"], lambda f: f * 2.2),
                                  (False, PHASE_COLORS["prefill"], lambda f: f * 2.0)):
        p = ok[(ok.rows == 1) == one_row]
        if p.empty:
            continue
        groups = []
        for (_, _, _), g in p.groupby(["rows", "in", "out"], sort=False):
            names = list(dict.fromkeys(g.matrix))
            text = ", ".join(names)
            if one_row and set(g.phase) == set(PHASES):
                text += " (both passes)"
            groups.append((text, float(np.exp(np.log(g.flop_per_byte).mean())), float(np.exp(np.log(g.tflops).mean()))))
        ys = _spread([g[2] for g in groups], 1.4)
        roof = min(v for v in (lim.gemm_tflops, lim.datasheet_tflops, float("inf")) if v)
        if not one_row and max(ys) > 0.8 * roof:  # keep the labels under the roof lines
            ys = [y * 0.8 * roof / max(ys) for y in ys]
        lx = fx_of(max(g[1] for g in groups))
        for (text, fx, fy), ly in zip(groups, ys):
            ax.annotate(text, (fx, fy), xytext=(lx, ly), textcoords="data", fontsize=7.5, va="center",
                        color=color, arrowprops={"arrowstyle": "-", "color": color, "lw": 0.5, "alpha": 0.6})
    clusters = roofline_clusters(run)
    for ph in PHASES:
        c = clusters[ph]
        if not c.points or c.tflops_max != c.tflops_max:
            continue
        where = {"memory": "on the bandwidth slope", "compute": "under the math roof"}.get(c.bound, "")
        fpb = (f"{c.fpb_min:,.0f}–{c.fpb_max:,.0f}" if c.fpb_max - c.fpb_min >= 1 else f"{c.fpb_max:.1f}")
        title = f"{ph.upper()} ({n:,} tokens)" if ph == "prefill" else f"{ph.upper()} (1 token)"
        if ph == "decode":
            xy, ha = (c.fpb_max * 0.8, c.tflops_min / 1.8), "left"
        else:
            xy, ha = ((c.fpb_min * c.fpb_max) ** 0.5, c.tflops_min / 3.5), "center"
        ax.text(*xy, f"{title}\n{fpb} FLOP/byte" + (f", {where}" if where else ""), ha=ha, va="top", fontsize=9, fontweight="bold",
                color=PHASE_COLORS[ph])
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo_x, hi_x)
    top = max(lim.datasheet_tflops or 0, lim.gemm_tflops or 0, ok.tflops.max())
    ax.set_ylim(min(ok.tflops.min(), whole.tflops.min()) / 8, top * 3)
    ax.set_xlabel("arithmetic intensity (FLOP per byte moved, log scale)")
    ax.set_ylabel("rate reached (TFLOP/s on kernel time, log scale)")
    ax.set_title("Roofline: every matrix multiply of the prefill and of the decode step")
    ax.legend(fontsize=7.5, frameon=False, loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=1)
    return finish(fig, run.label)


# --- the ridge of each GPU --------------------------------------------------------------------

# The GPUs whose ridge the chapter shows beside the run's own: the H100 SXM (the GPU of the
# published profiles the book quotes) and the H200 SXM (the GPU the book's runs were measured on).
RIDGE_GPUS = ("NVIDIA H100 80GB HBM3", "NVIDIA H200")


@dataclass
class Ridge:
    """One GPU's ridge point, and where this run's prefill of `prompt_len` tokens sits
    against it. `this_gpu`: the ridge is that of the GPU the run measured (its datasheet or
    its measured ceilings); only then are `crossover_over_ridge` and the MFU filled: a
    measurement on one GPU is never set against another GPU's limit."""

    gpu: str
    source: str                 # "datasheet" or "measured in this run"
    this_gpu: bool
    peak_tflops: float | None
    bandwidth_tbs: float | None
    ridge: float | None         # FLOP per byte
    ridge_tokens: float | None  # the prompt whose matrix multiplies reach it (tokens_at_intensity)
    prefill_over_ridge: float | None    # the prefill's FLOP per byte of weights over the ridge
    crossover_over_ridge: float | None  # the crossover measured in this run over ridge_tokens
    mfu: float | None           # the prefill's model FLOPs over wall time, over peak_tflops
    mfu_busy: float | None      # over GPU-busy time
    matmul_mfu: float | None    # its matrix multiplies' FLOPs over their kernel time


def ridges(run: runs.Run) -> list[Ridge]:
    """The ridge of each GPU the chapter compares: the run's GPU by its datasheet, the H100
    SXM and H200 SXM datasheets (where the run's GPU is another), and the run's measured
    ceilings (GEMM rate over bandwidth()). FLOP per byte counts the weights only, as the
    ridge's prompt length does (matmul_intensity)."""
    sh, lim, cr = shape(run), limits(run), crossover(run)
    n = int(run.parameters["prompt_len"])
    pre = phases(run)["prefill"]
    fpb = matmul_intensity(sh, n)
    own = hardware.datasheet_or_none(run.provenance.get("gpu", ""))
    sheets = ([own] if own else []) + [hardware.DATASHEETS[k] for k in RIDGE_GPUS
                                       if not own or hardware.DATASHEETS[k].name != own.name]

    def ridge(name, source, this, tflops, tbs):
        r = tflops / tbs if tflops and tbs else None
        tokens = tokens_at_intensity(sh, r) if r else None
        return Ridge(gpu=name, source=source, this_gpu=this, peak_tflops=tflops, bandwidth_tbs=tbs, ridge=r,
                     ridge_tokens=tokens, prefill_over_ridge=fpb / r if r else None,
                     crossover_over_ridge=cr.measured_tokens / tokens if this and tokens else None,
                     mfu=_ratio(pre.tflops, tflops) if this else None,
                     mfu_busy=_ratio(pre.tflops_busy, tflops) if this else None,
                     matmul_mfu=_ratio(pre.matmul_tflops, tflops) if this else None)

    out = [ridge(s.name, "datasheet", s is own, s.bf16_tflops, s.bandwidth_tbs) for s in sheets]
    if lim.gemm_tflops and bandwidth(lim).tbs:
        out.append(ridge(own.name if own else run.provenance.get("gpu", "this GPU"),
                         f"measured in this run (GEMM rate, {bandwidth(lim).short})", True, lim.gemm_tflops,
                         bandwidth(lim).tbs))
    return out


def ridge_text(run: runs.Run) -> str:
    """What the ridge table shows, raw and normalised, and what differs between the GPUs."""
    rs, cr = ridges(run), crossover(run)
    n = int(run.parameters["prompt_len"])
    fpb = matmul_intensity(shape(run), n)
    sheets = [r for r in rs if r.source == "datasheet"]
    own = next((r for r in sheets if r.this_gpu), None)
    others = [r for r in sheets if not r.this_gpu]
    meas = next((r for r in rs if r.source != "datasheet"), None)
    gpu = run.provenance.get("gpu", "this GPU")
    raw = "; ".join(f"{r.ridge:.0f} FLOP per byte on {'this' if r.this_gpu else 'an'} {r.gpu} ({r.peak_tflops:.0f} "
                    f"TFLOP/s over {r.bandwidth_tbs:.2f} TB/s), reached by a prompt of about {r.ridge_tokens:.0f} tokens"
                    for r in sheets)
    text = [f"Raw, the ridge belongs to the GPU: {raw}."]
    over = " and ".join(f"{r.prefill_over_ridge:.2f} times the ridge of {'this' if r.this_gpu else 'an'} {r.gpu}"
                        for r in sheets)
    bound = ("so by the datasheets it is compute-bound on each"
             if all(r.prefill_over_ridge > 1 for r in sheets) else "so the datasheets do not agree on its side")
    text.append(f"The {n:,}-token prefill's matrix multiplies do {fpb:,.0f} FLOP per byte of weights, whatever the "
                f"GPU: {over}, {bound}.")
    ref = own or meas
    if ref and ref.mfu is not None:
        text.append(f"Its MFU is set against its own GPU's peak only: {ref.mfu:.1%} of {ref.peak_tflops:.0f} TFLOP/s "
                    f"on wall time, {ref.mfu_busy:.1%} on GPU-busy time, {ref.matmul_mfu:.1%} for its matrix "
                    "multiplies on their own kernel time.")
    crossed = [f"{r.crossover_over_ridge:.2f} times the ridge of {'the ceilings measured in this run' if r is meas else 'this GPU' + chr(39) + 's datasheet'} "
               f"({r.ridge_tokens:.0f} tokens)" for r in (own, meas) if r and r.crossover_over_ridge]
    if crossed:
        text.append(f"The crossover measured in this run, {cr.measured_tokens:.0f} tokens, is " + " and ".join(crossed)
                    + "; it is a measurement of this GPU alone.")
    if own:
        for o in others:
            same_peak = math.isclose(o.peak_tflops, own.peak_tflops)
            peak = (f"the same {own.peak_tflops:.0f} TFLOP/s" if same_peak else
                    f"{own.peak_tflops:.0f} against {o.peak_tflops:.0f} TFLOP/s")
            lo, hi = sorted((own.ridge_tokens, o.ridge_tokens))
            text.append(f"Between this {own.gpu} and an {o.gpu}: {peak} of BF16 math, but {own.bandwidth_tbs:.2f} "
                        f"against {o.bandwidth_tbs:.2f} TB/s of memory bandwidth, so the ridge of the {o.gpu} is "
                        f"{o.ridge / own.ridge:.2f} times this GPU's, and a prompt of {lo:.0f} to {hi:.0f} tokens "
                        f"is compute-bound on the {own.gpu if own.ridge < o.ridge else o.gpu} but still "
                        f"memory-bound on the {o.gpu if own.ridge < o.ridge else own.gpu}. No {o.gpu} was measured "
                        f"here: its row is the datasheet's arithmetic, and its crossover and MFU are not known.")
    else:
        text.append(f"No datasheet is known for the {gpu}: the datasheet rows are other GPUs', shown for scale, "
                    "not set against this run's measurements.")
    return " ".join(text)


def ridge_table(run: runs.Run) -> pd.DataFrame:
    """ridges() for reading: one row per GPU and source (NaN: not measured on that GPU)."""
    nan = float("nan")
    return pd.DataFrame([{
        "GPU": r.gpu + (" (this run)" if r.this_gpu else ""), "limits": r.source,
        "peak TFLOP/s": _n(r.peak_tflops), "TB/s": _n(r.bandwidth_tbs), "ridge FLOP/byte": _n(r.ridge),
        "ridge, prompt tokens": _n(r.ridge_tokens), "prefill ÷ ridge": _n(r.prefill_over_ridge),
        "crossover ÷ ridge": _n(r.crossover_over_ridge), "prefill MFU, wall": _n(r.mfu),
        "prefill MFU, GPU busy": _n(r.mfu_busy)} for r in ridges(run)]).fillna(nan)


def _n(v):
    return float("nan") if v is None else v

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
    g, s, roof = layer_gemms(run), prompt_sweep(run), gemm_points(run)
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
        pts = roof[(roof.phase == ph) & roof.dur_ns.gt(0)]
        for unit, col in (("TFLOP/s", "tflops"), ("TB/s", "tbs")):
            if len(pts):
                best = pts.loc[pts[col].idxmax()]
                what = ("the LM head's matrix multiply" if best.module == LM_HEAD else
                        f"the {best.module} matrix multiplies of every layer")
                add(f"{what} in {ph}", unit, best[col])
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
