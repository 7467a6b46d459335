"""Chapter "Prompt phase vs decode phase": record a run live, and analyse a run.

Live: on one model, one prefill of a `prompt_len`-token prompt and one decode step at the
same context are timed (no profiler, synchronised, `repeats` each) and profiled (one
trace each, every kernel labelled with the module that launched it); then a sweep of
prompt lengths times and profiles the prefill alone. The GPU's copy bandwidth and BF16
GEMM rate are measured first, so every rate can be set against a measured ceiling as
well as against the datasheet. The timings come before any profiling, so the profiler
never runs ahead of a timed pass.

Replay: every table and number of the chapter is computed here from the run's files:

    ceilings.csv            copy bandwidth and BF16 GEMM rate (CUDA runs only)
    phase_times.csv         wall time of every timed prefill and decode step
    kernels-prefill.csv     every kernel of the profiled prefill (kind, module, layer)
    kernels-decode.csv      every kernel of the profiled decode step
    census.csv              kernels and GPU time by kind, for both phases
    prompt_sweep.csv        per prompt length: status, wall times, GPU busy, GPU time by kind
    trace-prefill.json.gz   raw profiler trace of the prefill
    trace-decode.json.gz    raw profiler trace of the decode step

and, in meta.json's results, the model's shape (for FLOP and byte counts) and the weight
shapes of the decoder layer whose matrix multiplies are compared.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass, field

import pandas as pd

from . import hardware, kernels, models, runs, trace

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
    sweep_repeats: int = 5     # timed prefills at each length of the sweep (round-robin)
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

def time_prefill(model, prompt, device: str, repeats: int, warmup: int = 2) -> list[float]:
    """Wall time (ms) of `repeats` prefills of `prompt`, each with a fresh cache, synchronised."""
    from . import decode

    out = []
    for i in range(warmup + repeats):
        decode.sync(device)
        t0 = time.perf_counter()
        cache, tok = decode.prefill(model, prompt)
        decode.sync(device)
        t1 = time.perf_counter()
        del cache, tok
        if i >= warmup:
            out.append((t1 - t0) * 1e3)
    return out


def profile_prefill(model, prompt, device: str, trace_path, warmup: int = 2, label_modules: bool = True,
                    rounds: int = 2) -> None:
    """Write a Chrome trace of one prefill to `trace_path`, timed from a "prefill" annotation.

    With `label_modules` each kernel is labelled with the module that launched it. Of
    `rounds` profiled prefills the last is kept (the first warms the profiler up).
    """
    import contextlib

    from torch.profiler import ProfilerActivity, profile, record_function

    from . import decode

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    for _ in range(warmup):
        cache, _ = decode.prefill(model, prompt)
        del cache
    for _ in range(rounds):
        decode.sync(device)
        labels = decode.annotated_modules(model) if label_modules else contextlib.nullcontext()
        with labels, profile(activities=activities) as prof:
            with record_function(ORIGIN["prefill"]):
                cache, _ = decode.prefill(model, prompt)
            decode.sync(device)
        del cache
    prof.export_chrome_trace(str(trace_path))


_KEEP = ["name", "start_ns", "end_ns", "dur_ns", "stream", "grid", "block", "op", "module",
         "kind", "short_name", "layer", "part"]
_TEXT_COLUMNS = ["name", "stream", "grid", "block", "op", "module", "kind", "short_name", "part"]


def annotated_kernels(path, device: str, phase: str) -> pd.DataFrame:
    """The kernels of a phase's trace, with kind, short name, decoder layer and part."""
    from .one_token import annotate_kernels

    return annotate_kernels(trace.read_kernels(path, device=device, origin=ORIGIN[phase]))[_KEEP]


# The prompt sweep's column of GPU time for each kind of kernel.
KIND_COLUMNS = {MATMUL: "matmul_ns", "attention": "attention_ns", "elementwise": "elementwise_ns",
                "copy/convert/concat": "copy_ns", "reduction": "reduction_ns", "other": "other_ns"}


def _sweep_row(n: int, k: pd.DataFrame, walls: list[float]) -> dict:
    kind = k["name"].map(kernels.classify)
    by_kind = {col: int(k.loc[kind == name, "dur_ns"].sum()) for name, col in KIND_COLUMNS.items()}
    return {"prompt_len": n, "status": "ok", "kernels": len(k),
            "gpu_busy_ns": trace.busy_ns(k.start_ns, k.end_ns), "kernel_ns": int(k.dur_ns.sum()), **by_kind,
            "wall_ms_median": statistics.median(walls), "wall_ms_min": min(walls), "wall_ms_max": max(walls)}


def record(params: Params | None = None, run_id: str | None = None, allow_cpu: bool = False,
           progress=_progress) -> runs.Run:
    """Measure this GPU now and write a new run (not published). Returns the run."""
    import torch

    from . import decode

    params = params or Params()
    device = params.device

    def free():
        if device == "cuda":
            torch.cuda.empty_cache()

    with runs.live_writer(CHAPTER, params, run_id, allow_cpu=allow_cpu) as w:
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
        prompt = decode.Prompt.random(vocab, 1, params.prompt_len, device)

        # Timings first, with no profiler having run before them.
        progress(f"timing {params.repeats} prefills of {params.prompt_len} tokens")
        times = []
        walls = time_prefill(model, prompt, device, params.repeats)
        times += [{"phase": "prefill", "repeat": i, "wall_ms": t} for i, t in enumerate(walls)]
        progress(f"  median {statistics.median(walls):.2f} ms")
        progress(f"timing {params.repeats} decode steps after it")
        walls = decode.time_decode_steps(model, prompt, device, repeats=params.repeats).wall_ms
        times += [{"phase": "decode", "repeat": i, "wall_ms": t} for i, t in enumerate(walls)]
        progress(f"  median {statistics.median(walls):.2f} ms")
        w.write_table("phase_times", pd.DataFrame(times))
        free()

        # The sweep is timed round-robin (one prefill of each length per round), so that a
        # passing disturbance of the host touches one sample of every length, not all of one.
        sweep_walls: dict[int, list[float] | str] = {n: [] for n in params.prompt_lens}
        prompts = {n: decode.Prompt.random(vocab, 1, n, device, seed=n) for n in params.prompt_lens}
        progress(f"timing prefills of {len(prompts)} prompt lengths, {params.sweep_repeats} rounds")
        for rnd in range(1 + params.sweep_repeats):  # round 0 warms up
            for n in params.prompt_lens:
                if isinstance(sweep_walls[n], str):
                    continue
                try:
                    t = time_prefill(model, prompts[n], device, repeats=1, warmup=0)
                except torch.OutOfMemoryError:
                    sweep_walls[n] = "out of memory"
                    progress(f"prompt {n}: out of GPU memory, recorded as such")
                    free()
                    continue
                if rnd:
                    sweep_walls[n] += t
        for n in params.prompt_lens:
            if not isinstance(sweep_walls[n], str):
                progress(f"prompt {n}: prefill {statistics.median(sweep_walls[n]):.2f} ms (median)")
        free()

        # Then the profiles.
        progress(f"profiling one prefill of {params.prompt_len} tokens")
        census = []
        for phase in PHASES:
            path = w.path / trace_file(phase)
            if phase == "prefill":
                profile_prefill(model, prompt, device, path)
            else:
                progress("profiling one decode step after it")
                decode.profile_decode_step(model, prompt, device, path)
            k = annotated_kernels(path, device, phase)
            w.write_table(kernels_table_name(phase), k)
            c = kernels.census(k)
            c.insert(0, "phase", phase)
            census.append(c)
            progress(f"  {phase}: {len(k)} kernels, GPU busy {trace.busy_ns(k.start_ns, k.end_ns) / 1e6:.2f} ms")
            free()
        w.write_table("census", pd.concat(census, ignore_index=True))

        rows = []
        tmp = w.path / ".sweep-trace.json.gz"
        for n in params.prompt_lens:
            if isinstance(sweep_walls[n], str):
                rows.append({"prompt_len": n, "status": sweep_walls[n]})
                continue
            try:
                profile_prefill(model, prompts[n], device, tmp, warmup=1, label_modules=False, rounds=1)
                k = trace.read_kernels(tmp, device=device, origin=ORIGIN["prefill"])
                rows.append(_sweep_row(n, k, sweep_walls[n]))
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
    """The kernels of one phase's profiled pass, with the column types they were written with."""
    k = run.table(kernels_table_name(phase), dtype={c: str for c in _TEXT_COLUMNS})
    k[_TEXT_COLUMNS] = k[_TEXT_COLUMNS].fillna("")
    return k.astype({"layer": "Int64"})


def recompute_kernels(run: runs.Run, phase: str) -> pd.DataFrame:
    """One phase's kernel table recomputed from its raw trace, with today's rules."""
    device = run.provenance.get("device", "cuda")
    return annotated_kernels(run.file(trace_file(phase)), device, phase)


# The ceilings of a run (datasheet and measured) live in hardware; the chapter's names for them:
Limits = hardware.Limits
limits = hardware.run_limits


def _ratio(value: float, limit: float | None) -> float | None:
    return value / limit if limit else None


@dataclass
class Phase:
    """One phase measured: its time, its kernels, its work, and the rates it reached.

    Rates use the wall time (what a user waits for) and, marked `busy`, the time the GPU
    was busy in the profiled pass (what the kernels alone reached). MFU: FLOP/s reached
    over the peak FLOP/s; MBU: bytes per second reached over the peak bandwidth.
    """

    phase: str
    new_tokens: int
    cached_tokens: int        # tokens in the KV cache before the pass
    kernels: int
    wall_ms: float            # median of the timed passes (no profiler)
    wall_min_ms: float
    wall_max_ms: float
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
    mbu_copy: float | None
    mbu_busy_datasheet: float | None
    mbu_busy_copy: float | None
    ms_per_token: float       # wall time / new tokens


def phases(run: runs.Run) -> dict[str, Phase]:
    """Both phases of the run, measured and set against the limits."""
    sh, lim = shape(run), limits(run)
    n = int(run.parameters["prompt_len"])
    times = run.table("phase_times")
    out = {}
    for ph in PHASES:
        k = kernel_table(run, ph)
        walls = times.loc[times.phase == ph, "wall_ms"]
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
            gpu_busy_ms=busy, kernel_ms=k.dur_ns.sum() / 1e6, matmul_kernels=len(mm), matmul_ms=mm_ms,
            attention_ms=k.loc[k.kind == "attention", "dur_ns"].sum() / 1e6,
            matmul_flops=work.matmul_flops, attention_flops=work.attention_flops, flops=work.flops,
            bytes=work.bytes, flop_per_byte=work.flop_per_byte,
            tflops=tflops, tflops_busy=tflops_busy, tbs=tbs, tbs_busy=tbs_busy,
            matmul_tflops=work.matmul_flops / mm_ms / 1e9 if mm_ms else float("nan"),
            mfu_datasheet=_ratio(tflops, lim.datasheet_tflops), mfu_gemm=_ratio(tflops, lim.gemm_tflops),
            mfu_busy_datasheet=_ratio(tflops_busy, lim.datasheet_tflops),
            mfu_busy_gemm=_ratio(tflops_busy, lim.gemm_tflops),
            mbu_datasheet=_ratio(tbs, lim.datasheet_tbs), mbu_copy=_ratio(tbs, lim.copy_tbs),
            mbu_busy_datasheet=_ratio(tbs_busy, lim.datasheet_tbs), mbu_busy_copy=_ratio(tbs_busy, lim.copy_tbs),
            ms_per_token=wall / new,
        )
    return out


def phase_table(run: runs.Run) -> pd.DataFrame:
    """Both phases side by side, one row per number (numeric; None where no limit is known)."""
    p = phases(run)
    return pd.DataFrame({ph: asdict(v) for ph, v in p.items()}).drop(index="phase")


def utilisation(run: runs.Run) -> pd.DataFrame:
    """MFU and MBU of both phases, on wall time and on GPU-busy time, against the datasheet
    and against the ceilings measured in the run (NaN where a limit is unknown)."""
    nan = float("nan")
    rows = []
    for ph, p in phases(run).items():
        for time_name, sfx in (("wall time", ""), ("GPU busy", "_busy")):
            rows.append({"phase": ph, "time": time_name,
                         "MFU vs datasheet": getattr(p, f"mfu{sfx}_datasheet") or nan,
                         "MFU vs measured GEMM": getattr(p, f"mfu{sfx}_gemm") or nan,
                         "MBU vs datasheet": getattr(p, f"mbu{sfx}_datasheet") or nan,
                         "MBU vs measured copy": getattr(p, f"mbu{sfx}_copy") or nan})
    return pd.DataFrame(rows)


def census(run: runs.Run) -> pd.DataFrame:
    """Kernels and GPU time by kind, prefill beside decode (from census.csv)."""
    c = run.table("census")
    parts = {}
    for ph in PHASES:
        x = c[c.phase == ph].set_index("kind")
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
    measured_ridge: float | None
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
    return Crossover(
        floor_ms=floor, ms_per_token=per_token, measured_tokens=floor / per_token,
        flat_until=int(s.loc[s["matmul ms"] <= 1.25 * floor, "prompt_len"].max()),
        best_matmul_tflops=best,
        saturates_at=int(s.loc[s["matmul TFLOP/s"] >= 0.9 * best, "prompt_len"].min()),
        datasheet_ridge=lim.datasheet_ridge, measured_ridge=lim.measured_ridge,
        datasheet_tokens=tokens_at_intensity(sh, lim.datasheet_ridge) if lim.datasheet_ridge else None,
        measured_ridge_tokens=tokens_at_intensity(sh, lim.measured_ridge) if lim.measured_ridge else None,
    )


def roofline(run: runs.Run, points: int = 200) -> pd.DataFrame:
    """The most TFLOP/s a prefill's matrix multiplies could reach at each prompt length, by
    the datasheet and by the measured ceilings: the lesser of the peak FLOP/s and the
    bandwidth times the FLOP per byte (NaN where a limit is unknown)."""
    import numpy as np

    sh, lim = shape(run), limits(run)
    lens = run.table("prompt_sweep").prompt_len
    grid = np.unique(np.geomspace(max(int(lens.min()), 1), int(lens.max()), points).round().astype(int))
    out = pd.DataFrame({"prompt_len": grid, "FLOP/byte": [matmul_intensity(sh, int(t)) for t in grid]})
    nan = float("nan")
    for col, tflops, tbs in (("datasheet TFLOP/s", lim.datasheet_tflops, lim.datasheet_tbs),
                             ("measured TFLOP/s", lim.gemm_tflops, lim.copy_tbs)):
        out[col] = np.minimum(tflops, tbs * out["FLOP/byte"]) if tflops and tbs else nan
    return out


def headline(run: runs.Run) -> dict:
    """Wall times (which, in eager mode, move with the host CPU) and the GPU-side numbers
    (which hold steady from run to run)."""
    p = phases(run)
    return {"prefill ms": p["prefill"].wall_ms, "decode ms": p["decode"].wall_ms,
            "prefill GPU ms": p["prefill"].gpu_busy_ms, "decode GPU ms": p["decode"].gpu_busy_ms,
            "prefill TFLOP/s (GPU busy)": p["prefill"].tflops_busy,
            "crossover tokens": crossover(run).measured_tokens}
