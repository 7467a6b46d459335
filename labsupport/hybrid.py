"""Chapter "A hybrid model's token": one decode step of the 27B Gated DeltaNet hybrid
(48 linear-attention layers, 16 full-attention layers).

Live: build the model from its configuration with random BF16 weights; for each Gated
DeltaNet backend (transformers' reference PyTorch code, flash-linear-attention's Triton
kernels) time the 512-token prompt and one decode step in eager mode, as a CUDA graph, and
through torch.compile; only when everything is timed, profile each of them; then measure how
the cache grows with the context.
A variant that cannot run is recorded with the reason, never left out silently.
Replay: every table of the chapter is computed from the run here.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field

import pandas as pd

from . import gated_deltanet, hardware, runs, steps, trace

CHAPTER = "hybrid-model-token"
ARTIFACTS = ("variants.csv", "step_times.csv", "prefill.csv", "cache_growth.csv", "trace-reference-eager.json.gz")
# The columns of the run's tables, written even when nothing ran.
VARIANT_COLUMNS = ["backend", "mode", "status", "kernels", "gpu_busy_ns", "kernel_ns", "launch_calls",
                   "wall_ms_median", "wall_ms_min", "wall_ms_max", "issue_ms_median", "clean",
                   "graphs_compiled_while_profiling", "compile_s"]
STEP_TIME_COLUMNS = ["backend", "mode", "repeat", "wall_ms", "issue_ms", "gpu_ms", "clean"]
PREFILL_COLUMNS = ["backend", "status", "tokens", "kernels", "gpu_busy_ns", "wall_ms_median", "wall_ms_min",
                   "wall_ms_max", "clean"]
CACHE_GROWTH_COLUMNS = ["context", "status", "layer_type", "layers", "bytes"]
MODES = {
    "eager": "eager, dynamic cache (as written)",
    "cuda-graph": "CUDA graph (static cache)",
    "compile": 'torch.compile "reduce-overhead" (static cache)',
}
# What each part of a decoder layer is, for the census by layer type.
GROUPS = {"linear_attn": "linear attention (Gated DeltaNet)", "self_attn": "full attention", "mlp": "MLP"}
# ... and the kernels outside the decoder layers.
OUTSIDE = {"lm_head": "LM head", "norm": "final norm", "embed_tokens": "embedding lookup",
           "rotary_emb": "rotary position tables", "sample": "sampling (argmax)",
           "model": "model glue (masks, positions)"}


@dataclass
class Params:
    """What one run of the chapter measures."""

    preset: str = "qwen3.5-27b"
    prompt_len: int = 512
    repeats: int = 10
    backends: list[str] = field(default_factory=lambda: ["reference", "fla"])
    cuda_graphs: bool = True
    compile_backends: list[str] = field(default_factory=lambda: ["reference", "fla"])
    contexts: list[int] = field(default_factory=lambda: [512, 4096, 32768])
    device: str = "cuda"


def _progress(msg: str) -> None:
    print(f"[{CHAPTER}] {msg}", flush=True)


def trace_file(backend: str, mode: str) -> str:
    return f"trace-{backend}-{mode}.json.gz"


def _first_line(e: BaseException) -> str:
    msg = next((ln for ln in str(e).splitlines() if ln.strip()), "")
    return f"{type(e).__name__}: {msg[:200]}"


def cache_bytes(cache, layer_types: list[str]) -> dict[str, int]:
    """Bytes the cache holds, by layer type: keys and values of the full-attention layers,
    convolution and recurrent states of the linear-attention layers."""
    import torch

    out = dict.fromkeys(sorted(set(layer_types)), 0)
    for layer, kind in zip(cache.layers, layer_types):
        tensors = [getattr(layer, "keys", None), getattr(layer, "values", None)]
        for states in ("conv_states", "recurrent_states"):
            tensors += list(getattr(layer, states, {}).values())
        out[kind] += sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor))
    return out


def record(params: Params | None = None, run_id: str | None = None, allow_cpu: bool = False,
           progress=_progress) -> runs.Run:
    """Measure this GPU now and write a new run (not published). Returns the run.

    Every wall time (the prompt and every decode variant, of every backend) is taken before the
    first profile in the process; then everything is profiled (labsupport.harness)."""
    import torch

    from . import decode, harness, models
    from .steps import CompiledStep, EagerStep, GraphStep, StaticStep, graphs_compiled

    params = params or Params()
    device = params.device
    harness.for_chapter(CHAPTER)
    for b in params.backends:
        gated_deltanet.unavailable_reason(b, device)  # an unknown backend name stops here
    with runs.live_writer(CHAPTER, params, run_id, allow_cpu=allow_cpu) as w:
        w.extra["method"] = harness.method()
        if device == "cuda":
            hardware.record_ceilings(w, progress)
        progress(f"building {params.preset} with random BF16 weights on {device}")
        t0 = time.perf_counter()
        model = models.build_model(params.preset, device=device)
        counts = models.count_model(model, params.preset)
        lm_head = model.get_output_embeddings().weight
        layer_types = list(model.config.layer_types)
        w.extra["model"] = {**counts.as_record(), "layer_types": layer_types,
                            "lm_head_rows": int(lm_head.shape[0]),
                            "lm_head_bytes": lm_head.numel() * lm_head.element_size(),
                            "build_s": round(time.perf_counter() - t0, 1)}
        w.extra["backend_versions"] = {b: gated_deltanet.version(b) for b in params.backends}
        progress(f"  {counts.parameters / 1e9:.2f} B parameters, {layer_types.count('linear_attention')} "
                 f"linear-attention and {layer_types.count('full_attention')} full-attention layers")
        prompt = decode.Prompt.random(model.config.vocab_size, 1, params.prompt_len, device)
        rows: dict[tuple, dict] = {}      # (backend, mode) -> its row of variants.csv, once complete
        prefills: dict[str, dict] = {}    # backend -> its row of prefill.csv, once complete
        timed: dict[tuple, tuple] = {}    # (backend, mode) -> (step, Timing, extra columns)
        prefill_timed: dict[str, object] = {}  # backend -> Timing of the prompt

        def failed(backend, mode, why):
            rows[(backend, mode)] = {"backend": backend, "mode": mode, "status": why}
            progress(f"  {backend} / {MODES[mode]}: {why}")

        def oom(e):
            if isinstance(e, torch.OutOfMemoryError):
                torch.cuda.empty_cache()

        def build_and_time(backend, mode, make, extra=lambda s: None):
            progress(f"{backend}: {MODES[mode]}: build and time")
            try:
                step = make()
                t = harness.time_region(step, what=f"{backend}, {MODES[mode]}", device=device,
                                        repeats=params.repeats, setup=steps.setup(step))
            except harness.TimingError:
                raise
            except Exception as e:  # recorded, not hidden: the chapter shows why
                oom(e)
                return failed(backend, mode, f"failed: {_first_line(e)}")
            timed[(backend, mode)] = (step, t, extra(step) or {})
            progress(f"  wall {t.median:.2f} ms (median of {len(t.wall_ms)}, {t.low:.2f} to {t.high:.2f})")

        usable = []
        for backend in params.backends:
            reason = gated_deltanet.unavailable_reason(backend, device)
            if reason:
                prefills[backend] = {"backend": backend, "status": f"not run: {reason}"}
                for mode in MODES:
                    failed(backend, mode, f"not run: {reason}")
            else:
                usable.append(backend)

        # 1. Time everything, backend by backend; nothing in this process has been profiled yet.
        #    Every step stays alive for its profile below (the model is shared; each static-cache
        #    step holds only its own small cache). There is no torch._dynamo.reset() between the
        #    two backends' compiles (a reset would make the first backend's step recompile inside
        #    its profile). The backend switch replaces module-level functions that the compiled
        #    graph inlines, and Dynamo guards on those functions, so the second backend's compile
        #    adds its own entry and each entry is valid only while its backend is in place. That
        #    is why each profile below re-enters its backend (so do the eager steps, which look the
        #    functions up as they run): the compiled step then finds its own entry instead of
        #    recompiling; the profile records graphs_compiled_while_profiling (0 expected;
        #    tests/test_hybrid.py checks the guards on a CPU). CUDA graphs replay what they
        #    captured, whichever backend is in place.
        for backend in usable:
            with gated_deltanet.use(backend, device):
                progress(f"{backend}: the {params.prompt_len}-token prompt (prefill): time")
                try:
                    # warm-up includes flash-linear-attention's Triton autotuning
                    prefill_timed[backend] = harness.time_region(
                        lambda: decode.prefill(model, prompt), what=f"{backend}, prefill", device=device,
                        repeats=params.repeats, warmup=2)
                except harness.TimingError:
                    raise
                except Exception as e:
                    oom(e)
                    prefills[backend] = {"backend": backend, "status": f"failed: {_first_line(e)}"}
                    progress(f"  failed: {_first_line(e)}")
                build_and_time(backend, "eager", lambda: EagerStep(model, prompt))
                if device != "cuda":
                    failed(backend, "cuda-graph", "not run: needs a CUDA GPU")
                    failed(backend, "compile", "not run: needs a CUDA GPU")
                    continue
                if params.cuda_graphs:
                    build_and_time(backend, "cuda-graph", lambda: GraphStep(StaticStep(model, prompt.ids)))
                else:
                    failed(backend, "cuda-graph", "not run: switched off in this run's parameters")
                if backend in params.compile_backends:
                    # flash-linear-attention's kernels may break the graph; the rest still compiles.
                    build_and_time(backend, "compile",
                                   lambda: CompiledStep(StaticStep(model, prompt.ids), "reduce-overhead",
                                                        fullgraph=backend == "reference"),
                                   extra=lambda s: {"compile_s": s.compile_s})
                else:
                    failed(backend, "compile", "not run: switched off in this run's parameters")

        # 2. Profile everything, each under its own backend. A variant that fails here loses its
        #    timing too: every row written is complete, and step_times.csv holds only ok variants.
        times = []
        for backend in usable:
            with gated_deltanet.use(backend, device):
                if backend in prefill_timed:
                    progress(f"{backend}: the prompt: profile")
                    t = prefill_timed[backend]
                    path = w.path / f".prefill-{backend}.json.gz"
                    try:
                        k = harness.profile_region(lambda: decode.prefill(model, prompt), path, region="prefill",
                                                   device=device)
                    except harness.ProfileError:
                        raise
                    except Exception as e:
                        oom(e)
                        prefills[backend] = {"backend": backend,
                                             "status": f"failed while profiling (after it was timed): {_first_line(e)}"}
                    else:
                        prefills[backend] = {"backend": backend, "status": "ok", "tokens": params.prompt_len,
                                             "kernels": len(k), "gpu_busy_ns": trace.busy_ns(k.start_ns, k.end_ns),
                                             "wall_ms_median": t.median, "wall_ms_min": t.low, "wall_ms_max": t.high,
                                             "clean": t.clean}
                        progress(f"  {len(k)} kernels")
                    finally:
                        path.unlink(missing_ok=True)
                for mode in MODES:
                    if (backend, mode) not in timed:
                        continue
                    step, t, extra = timed.pop((backend, mode))
                    progress(f"{backend}: {MODES[mode]}: profile")
                    path = w.path / trace_file(backend, mode)
                    # Module labels (forward hooks) only for eager code: they would break captured and compiled code.
                    labels = (lambda: decode.annotated_modules(model)) if mode == "eager" else None
                    before = graphs_compiled()
                    try:
                        k = harness.profile_region(step, path, region="decode_step", device=device,
                                                   setup=steps.setup(step), labels=labels)
                    except harness.ProfileError:
                        raise
                    except Exception as e:
                        oom(e)
                        path.unlink(missing_ok=True)
                        failed(backend, mode, f"failed while profiling (after it was timed): {_first_line(e)}")
                        continue
                    launches = (int((k.launch_api != "").groupby(k.correlation).ngroups) if device == "cuda"
                                else len(k))
                    rows[(backend, mode)] = {
                        "backend": backend, "mode": mode, "status": "ok", "kernels": len(k),
                        "gpu_busy_ns": trace.busy_ns(k.start_ns, k.end_ns), "kernel_ns": int(k.dur_ns.sum()),
                        "launch_calls": launches, "wall_ms_median": t.median, "wall_ms_min": t.low,
                        "wall_ms_max": t.high, "issue_ms_median": statistics.median(t.issue_ms), "clean": t.clean,
                        "graphs_compiled_while_profiling": graphs_compiled() - before, **extra}
                    times.extend(t.rows(backend=backend, mode=mode))
                    progress(f"  {len(k)} kernels")
        timed.clear()
        if device == "cuda":
            torch.cuda.empty_cache()

        progress("cache size after prompts of " + ", ".join(map(str, params.contexts)) + " tokens")
        growth = []
        with gated_deltanet.use(usable[-1] if usable else "reference", device):  # sizes do not depend on the backend
            for ctx in params.contexts:
                try:
                    cache, _ = decode.prefill(model, decode.Prompt.random(model.config.vocab_size, 1, ctx, device))
                except torch.OutOfMemoryError:
                    torch.cuda.empty_cache()
                    growth.append({"context": ctx, "status": "out of memory"})
                    continue
                for kind, nbytes in cache_bytes(cache, layer_types).items():
                    growth.append({"context": ctx, "status": "ok", "layer_type": kind,
                                   "layers": layer_types.count(kind), "bytes": nbytes})
                del cache
        order = [(b, m) for b in params.backends for m in MODES]
        w.write_table("variants", pd.DataFrame([rows[key] for key in order if key in rows], columns=VARIANT_COLUMNS))
        w.write_table("step_times", pd.DataFrame(times, columns=STEP_TIME_COLUMNS))
        w.write_table("prefill", pd.DataFrame([prefills[b] for b in params.backends if b in prefills],
                                              columns=PREFILL_COLUMNS))
        w.write_table("cache_growth", pd.DataFrame(growth, columns=CACHE_GROWTH_COLUMNS))
        del model
        if device == "cuda":
            torch.cuda.empty_cache()
    return runs.load_run(CHAPTER, w.run_id)


def load(run_id: str | None = None) -> runs.Run:
    """The published run (or `run_id`) of this chapter."""
    return runs.load_run(CHAPTER, run_id)


# Replay --------------------------------------------------------------------------------

def _label(backend: str, mode: str) -> str:
    return f"{gated_deltanet.BACKENDS[backend]}; {MODES[mode]}"


def timing_note(run: runs.Run) -> str:
    """How the run's wall times were taken: all before the first profile (the harness), or, in
    runs recorded before it, in the same process as the profiles, most after one."""
    t = run.table("step_times")
    if "clean" not in t:
        return ("This run is older than the book's measuring harness: its wall times were taken in the same "
                "process as its profiles, most of them after one, so they carry the profiler's after-effect "
                "(CUPTI stays attached and every later launch pays for it; the methodology page measures how "
                "much). Runs recorded with the current code time every variant of every backend, and each "
                "backend's prompt, before profiling any.")
    p = run.table("prefill")
    clean = list(t.clean) + (list(p.clean.dropna()) if "clean" in p else [])
    if all(str(c) == "True" for c in clean):
        return (f"Every wall time (each backend's prompt and every variant) was taken before the first profile in "
                f"the process, {int(t.groupby(['backend', 'mode']).size().max())} repeats each; the table gives "
                "the median with the fastest and slowest repeat.")
    return ("Some wall times in this run were taken after a profile in the same process (see `clean` in "
            "`step_times.csv`); they carry the profiler's after-effect.")


def measured_column(run: runs.Run) -> str:
    """The name of the variants table's column for the fraction of the measured ceiling."""
    return f"of measured {hardware.measured_read(hardware.run_limits(run))[1]}"


def variants(run: runs.Run) -> pd.DataFrame:
    """Every backend and mode side by side: status, kernels, launch calls, GPU-busy and wall
    time (median, fastest and slowest repeat), tokens/s, and how close the wall time gets to the
    bandwidth limit (weights / bandwidth), by the datasheet and by the run's measured read
    ceiling (the copy in runs that measured no read stream)."""
    v = run.table("variants")
    nbytes = run.results["model"]["decode_bytes"]
    lim = hardware.run_limits(run)
    out = pd.DataFrame({"backend": v.backend, "mode": v["mode"].map(MODES), "status": v.status})
    for col in ("kernels", "launch_calls", "gpu_busy_ns", "wall_ms_median", "compile_s"):
        if col not in v:
            v[col] = float("nan")
    t = run.table("step_times")
    wall = t.groupby(["backend", "mode"]).wall_ms
    keys = list(zip(v.backend, v["mode"]))
    out["kernels"] = v.kernels
    out["launch calls"] = v.launch_calls
    out["GPU busy ms"] = v.gpu_busy_ns / 1e6
    out["wall ms"] = v.wall_ms_median
    out["wall min ms"] = [wall.min().get(k, float("nan")) for k in keys]
    out["wall max ms"] = [wall.max().get(k, float("nan")) for k in keys]
    out["tokens/s"] = 1e3 / out["wall ms"]
    out["of datasheet limit"] = hardware.of_bandwidth(nbytes, out["wall ms"], lim.datasheet_tbs)
    out[measured_column(run)] = hardware.of_bandwidth(nbytes, out["wall ms"], hardware.measured_read(lim)[0])
    out["compile s"] = v.compile_s
    return out


def ok_variants(run: runs.Run) -> pd.DataFrame:
    v = variants(run)
    return v[v.status == "ok"].reset_index(drop=True)


def kernel_table(run: runs.Run, backend: str, mode: str) -> pd.DataFrame:
    """Kernels of one variant's profiled step, with kind, layer, part, layer type and group."""
    from .one_token import annotate_kernels

    device = run.provenance.get("device", "cuda")
    k = annotate_kernels(trace.read_kernels(run.file(trace_file(backend, mode)), device=device))
    types = run.results["model"]["layer_types"]
    k["layer_type"] = k.layer.map(lambda i: types[int(i)] if pd.notna(i) else None)
    in_layer = k.layer.notna()
    k["group"] = k.part.map(OUTSIDE).fillna(k.part).where(~in_layer, k.part.map(GROUPS).fillna("norms and residual adds"))
    return k


def census_by_kind(run: runs.Run, mode: str = "eager") -> pd.DataFrame:
    """Kernels and GPU time by kind (matrix multiply, elementwise, ...) for each backend's
    step in `mode`, side by side."""
    from . import kernels

    v = run.table("variants")
    out = {}
    for backend in v[(v["mode"] == mode) & (v.status == "ok")].backend:
        c = kernels.census(kernel_table(run, backend, mode)).set_index("kind")
        out[(backend, "kernels")] = c.kernels
        out[(backend, "GPU ms")] = c.gpu_ns / 1e6
        out[(backend, "share")] = c.share
    df = pd.DataFrame(out)
    df.columns = pd.MultiIndex.from_tuples(df.columns)
    return df


def census_by_group(k: pd.DataFrame) -> pd.DataFrame:
    """Kernels and GPU time of the step by what they belong to (linear attention, full
    attention, MLP, norms, LM head, ...), largest first."""
    g = k.groupby("group").agg(kernels=("dur_ns", "size"), gpu_ns=("dur_ns", "sum"))
    g = g.sort_values("gpu_ns", ascending=False)
    g["GPU ms"] = g.gpu_ns / 1e6
    g["share"] = g.gpu_ns / g.gpu_ns.sum()
    return g.drop(columns="gpu_ns")


def per_layer_type(k: pd.DataFrame) -> pd.DataFrame:
    """One layer of each type: how many there are, kernels per layer and GPU µs per layer,
    split into the token mixer (linear or full attention), the MLP, and norms/residuals."""
    k = k.dropna(subset=["layer"])
    rows = []
    for kind, part in (("linear_attention", "linear_attn"), ("full_attention", "self_attn")):
        sel = k[k.layer_type == kind]
        n = sel.layer.nunique()
        if not n:
            continue
        mixer, mlp = sel[sel.part == part], sel[sel.part == "mlp"]
        rest = sel[(sel.part != part) & (sel.part != "mlp")]
        rows.append({"layer type": kind.replace("_", " "), "layers": n,
                     "kernels per layer": len(sel) / n, "GPU µs per layer": sel.dur_ns.sum() / n / 1e3,
                     "mixer kernels": len(mixer) / n, "mixer µs": mixer.dur_ns.sum() / n / 1e3,
                     "MLP kernels": len(mlp) / n, "MLP µs": mlp.dur_ns.sum() / n / 1e3,
                     "norms and residual kernels": len(rest) / n, "norms and residual µs": rest.dur_ns.sum() / n / 1e3})
    return pd.DataFrame(rows)


def mixer_kernels(k: pd.DataFrame, part: str = "linear_attn") -> pd.DataFrame:
    """The kernels of one layer's token mixer in launch order (the middle layer of its type)."""
    from . import kernels

    sel = k[k.part == part]
    if sel.empty:
        return pd.DataFrame(columns=["module", "operator", "kernel", "kind", "µs"])
    layers = sorted(sel.layer.dropna().unique())
    layer = layers[len(layers) // 2]
    sel = sel[sel.layer == layer]
    return pd.DataFrame({
        "module": sel.module.str.replace(rf"^layers\.{layer}\.{part}\.?", "", regex=True).replace("", f"({part})"),
        "operator": sel.op,
        "kernel": sel.name.map(lambda n: kernels.short_name(n, width=48)),
        "kind": sel.kind,
        "µs": sel.dur_ns / 1e3,
    }).reset_index(drop=True)


def op_cpu_us(run: runs.Run, backend: str, op: str, mode: str = "eager") -> float:
    """Median CPU time (µs) of operator `op` in a variant's profiled step: how long the CPU
    spent in that call, launches included (the profiler itself adds to it)."""
    events = trace.load_events(run.file(trace_file(backend, mode)))
    durs = [float(e["dur"]) for e in events if e.get("ph") == "X" and e.get("cat") == "cpu_op" and e.get("name") == op]
    return statistics.median(durs) if durs else float("nan")


def largest_kernels(k: pd.DataFrame, n: int = 5) -> pd.DataFrame:
    """The longest single kernels of the step, with the module that launched them."""
    from . import kernels

    top = k.nlargest(n, "dur_ns")
    return pd.DataFrame({"kernel": top.name.map(lambda s: kernels.short_name(s, width=48)),
                         "module": top.module.replace("", "(unlabelled)"), "kind": top.kind,
                         "µs": top.dur_ns / 1e3}).reset_index(drop=True)


@dataclass
class LMHead:
    rows: int
    gb: float
    ms: float                       # the LM head's kernel, measured (eager, module-labelled)
    tbs: float
    floor_ms_datasheet: float | None  # its bytes at the datasheet bandwidth
    is_largest: bool


def lm_head(run: runs.Run, backend: str = "reference") -> LMHead:
    """The LM head's one matrix-vector product: its bytes, its measured time, and whether it
    is the longest kernel of the step."""
    k = kernel_table(run, backend, "eager")
    head = k[k.part == "lm_head"]
    head = head[head.kind == "matrix multiply"]
    m = run.results["model"]
    ms = head.dur_ns.sum() / 1e6
    sheet_tbs = hardware.run_limits(run).datasheet_tbs
    gb = m["lm_head_bytes"] / 1e9
    return LMHead(rows=m["lm_head_rows"], gb=gb, ms=ms, tbs=gb / ms if ms else float("nan"),
                  floor_ms_datasheet=gb / sheet_tbs if sheet_tbs else None,
                  is_largest=bool(len(head)) and k.dur_ns.idxmax() in set(head.index))


def time_budget(run: runs.Run) -> pd.DataFrame:
    """Each variant's wall time split three ways: matrix multiplies running, every other
    kernel running, and the GPU idle (waiting for the CPU or between kernels); with the
    bandwidth the matrix multiplies reached reading the weights."""
    rows = []
    mm_bytes = run.results["model"]["matmul_bytes"]
    for _, v in run.table("variants").query("status == 'ok'").iterrows():
        k = kernel_table(run, v.backend, v["mode"])
        mm = k[k.kind == "matrix multiply"]
        mm_ms = mm.dur_ns.sum() / 1e6
        name = mm.name.str.contains("splitKreduce", case=False)
        rows.append({"backend": v.backend, "mode": MODES[v["mode"]],
                     "matrix multiplies ms": mm_ms, "other kernels ms": (k.dur_ns.sum() - mm.dur_ns.sum()) / 1e6,
                     "GPU idle ms": max(v.wall_ms_median - v.gpu_busy_ns / 1e6, 0.0), "wall ms": v.wall_ms_median,
                     "GEMM kernels": int((~name).sum()), "split-K reduce kernels": int(name.sum()),
                     "matmul TB/s": mm_bytes / 1e12 / (mm_ms / 1e3) if mm_ms else float("nan")})
    return pd.DataFrame(rows)


def prefill(run: runs.Run) -> pd.DataFrame:
    """The prompt phase per backend: kernels, GPU-busy and wall time, tokens per second."""
    p = run.table("prefill")
    p = p[p.status == "ok"].copy()
    p["backend"] = p.backend
    p["GPU busy ms"] = p.gpu_busy_ns / 1e6
    p["wall ms"] = p.wall_ms_median
    p["prompt tokens/s"] = p.tokens / (p.wall_ms_median / 1e3)
    return p[["backend", "tokens", "kernels", "GPU busy ms", "wall ms", "prompt tokens/s"]].reset_index(drop=True)


def cache_growth(run: runs.Run) -> pd.DataFrame:
    """Cache bytes by layer type at each context length (MB), and per token of context."""
    g = run.table("cache_growth")
    g = g[g.status == "ok"]
    t = g.pivot_table(index="context", columns="layer_type", values="bytes", aggfunc="sum")
    out = pd.DataFrame({"context": t.index})
    out["full-attention KV cache MB"] = t.get("full_attention", 0).values / 1e6
    out["linear-attention state MB"] = t.get("linear_attention", 0).values / 1e6
    out["KV bytes per token"] = t.get("full_attention", 0).values / t.index.values
    return out.reset_index(drop=True)


def beside_published(run: runs.Run) -> pd.DataFrame:
    """Our decode steps (this GPU, transformers) and the published vLLM ones (H100), each
    row labelled with where it comes from; nothing is computed across the two."""
    from .published import HYBRID_27B_VLLM_HEADLINE as pub

    gpu = run.provenance["gpu"].replace("NVIDIA ", "")
    ours = ok_variants(run)
    rows = [{"source": f"{gpu}, this run", "backend and mode": f"{r['backend']}; {r['mode']}", "kernels": r.kernels,
             "launch calls": r["launch calls"], "ms per token": r["wall ms"],
             "tokens/s": r["tokens/s"]} for _, r in ours.iterrows()]
    rows.append({"source": "H100, published (vLLM)", "backend and mode": "vLLM defaults, eager",
                 "kernels": pub["eager_kernels"], "launch calls": float("nan"), "ms per token": float("nan"),
                 "tokens/s": float("nan")})
    rows.append({"source": "H100, published (vLLM)", "backend and mode": "vLLM defaults (CUDA graphs)",
                 "kernels": pub["decode_kernels"], "launch calls": pub["launch_calls_with_graphs"],
                 "ms per token": pub["decode_ms"], "tokens/s": pub["tokens_per_s"]})
    return pd.DataFrame(rows)


def headline(run: runs.Run) -> dict:
    ok = ok_variants(run)
    first = ok.iloc[0]
    return {"eager kernels": int(first.kernels), "eager wall ms": float(first["wall ms"]),
            "best wall ms": float(ok["wall ms"].min())}
