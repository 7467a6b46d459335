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

import bisect
import statistics
import time
from dataclasses import dataclass, field

import pandas as pd

from labsupport.measure import gated_deltanet, hardware, steps
from labsupport import runs
from labsupport.measure import recording
from labsupport.traces import kernels, trace

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
# The same, short, for narrow tables (the prose says what each is).
MODES_SHORT = {"eager": "eager", "cuda-graph": "CUDA graph", "compile": "torch.compile"}
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
    first profile in the process; then everything is profiled (labsupport.measure.harness)."""
    import torch

    from labsupport.measure import decode, harness, models
    from labsupport.measure.steps import CompiledStep, EagerStep, GraphStep, StaticStep, graphs_compiled

    params = params or Params()
    device = params.device
    harness.for_chapter(CHAPTER)
    for b in params.backends:
        gated_deltanet.unavailable_reason(b, device)  # an unknown backend name stops here
    with recording.writer(CHAPTER, params, run_id, allow_cpu=allow_cpu) as w:
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


def variants_compact(run: runs.Run) -> pd.DataFrame:
    """variants() narrowed for the page: short mode names, the fastest and slowest repeat in one
    column, and the status column only when something did not run."""
    v = variants(run)
    out = pd.DataFrame({"backend": v.backend, "mode": run.table("variants")["mode"].map(MODES_SHORT)})
    if (v.status != "ok").any():
        out["status"] = v.status
    for c in ("kernels", "launch calls", "GPU busy ms", "wall ms"):
        out[c] = v[c]
    out["fastest–slowest ms"] = [f"{lo:.2f}–{hi:.2f}" if lo == lo and hi == hi else "–"
                                 for lo, hi in zip(v["wall min ms"], v["wall max ms"])]
    for c in ("tokens/s", "of datasheet limit", measured_column(run), "compile s"):
        out[c] = v[c]
    return out


def ok_variants(run: runs.Run) -> pd.DataFrame:
    v = variants(run)
    return v[v.status == "ok"].reset_index(drop=True)


def kernel_table(run: runs.Run, backend: str, mode: str) -> pd.DataFrame:
    """Kernels of one variant's profiled step, with kind, layer, part, layer type and group."""

    device = run.provenance.get("device", "cuda")
    k = kernels.annotate(trace.read_kernels(run.file(trace_file(backend, mode)), device=device))
    types = run.results["model"]["layer_types"]
    k["layer_type"] = k.layer.map(lambda i: types[int(i)] if pd.notna(i) else None)
    in_layer = k.layer.notna()
    k["group"] = k.part.map(OUTSIDE).fillna(k.part).where(~in_layer, k.part.map(GROUPS).fillna("norms and residual adds"))
    return k


def census_by_kind(run: runs.Run, mode: str = "eager") -> pd.DataFrame:
    """Kernels and GPU time by kind (matrix multiply, elementwise, ...) for each backend's
    step in `mode`, side by side."""
    from labsupport.traces import kernels

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
    from labsupport.traces import kernels

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
    from labsupport.traces import kernels

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


def _short(mode_label: str) -> str:
    """The short name of a mode given by its long label (MODES' values)."""
    return next((MODES_SHORT[k] for k, label in MODES.items() if label == mode_label), mode_label)


def beside_published(run: runs.Run) -> pd.DataFrame:
    """Our decode steps (this GPU, transformers) and the published vLLM ones (H100), each
    row labelled with where it comes from; nothing is computed across the two."""
    from labsupport.chapters.published import HYBRID_27B_VLLM_HEADLINE as pub

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


# Where a step's idle time sits -------------------------------------------------------------

GAP_NS = 2000  # a gap between kernels this long or longer is listed on its own (with its neighbours)


def best_variant(run: runs.Run) -> tuple[str, str]:
    """(backend, mode) of the variant with the shortest wall time."""
    v = run.table("variants")
    v = v[v.status == "ok"]
    r = v.loc[v.wall_ms_median.idxmin()]
    return r.backend, r["mode"]


def _gpu_side_events(events: list[dict], t0: int) -> list[tuple[int, int, str]]:
    """Memsets and memcpys on the GPU (not kernels, so not in the kernel table): (start, end, name),
    times relative to t0."""
    out = []
    for e in events:
        if e.get("ph") == "X" and e.get("cat") in ("gpu_memset", "gpu_memcpy") and "dur" in e:
            s = trace._ns(e["ts"]) - t0
            out.append((s, s + trace._ns(e["dur"]), e["name"].split(" (")[0]))
    return sorted(out)


def step_gaps(run: runs.Run, backend: str, mode: str) -> pd.DataFrame:
    """Every stretch of the profiled step in which no kernel ran: from the step's start to the
    first kernel, between kernels (after the latest end so far), and from the last kernel's end to
    the step's end (the `decode_step` annotation, which ends once the GPU has finished).

    Columns: place ("before the first kernel", "inside one graph" when both neighbours came from
    the same graph launch, "between two launches", "after the last kernel"), start_ns, dur_ns,
    before and after (short names of the neighbouring kernels), after_source (the library of the
    kernel after), other_gpu_work (memsets and memcpys that ran in the gap)."""
    from labsupport.traces import kernels

    events = trace.load_events(run.file(trace_file(backend, mode)))
    span = trace.origin_span_ns(events)
    t0 = next(trace._ns(e["ts"]) for e in events if e.get("ph") == "X" and e.get("cat") == "user_annotation"
              and e.get("name") == "decode_step")
    k = kernel_table(run, backend, mode).sort_values(["start_ns", "end_ns"]).reset_index(drop=True)
    if k.empty:
        return pd.DataFrame(columns=["place", "start_ns", "dur_ns", "before", "after", "before_source",
                                     "after_source", "other_gpu_work"])
    graph = k.launch_api.eq("cudaGraphLaunch")
    ends = k.end_ns.cummax()
    rows = [{"place": "before the first kernel", "start_ns": 0, "dur_ns": int(k.start_ns.iloc[0]),
             "before": "", "after": k.short_name.iloc[0], "before_source": "",
             "after_source": kernels.source(k.name.iloc[0])}]
    prev_end = ends.shift().iloc[1:]
    gap = k.start_ns.iloc[1:] - prev_end
    same_graph = graph.iloc[1:].values & graph.shift().fillna(False).iloc[1:].values & (
        k.correlation.iloc[1:].values == k.correlation.shift().iloc[1:].values)
    for i, g, same in zip(gap.index, gap.values, same_graph):
        if g <= 0:
            continue
        rows.append({"place": "inside one graph" if same else "between two launches", "start_ns": int(prev_end[i]),
                     "dur_ns": int(g), "before": k.short_name[i - 1], "after": k.short_name[i],
                     "before_source": kernels.source(k.name[i - 1]), "after_source": kernels.source(k.name[i])})
    last = int(k.end_ns.max())
    rows.append({"place": "after the last kernel", "start_ns": last, "dur_ns": max(span - last, 0),
                 "before": k.short_name.iloc[-1], "after": "", "before_source": kernels.source(k.name.iloc[-1]),
                 "after_source": ""})
    out = pd.DataFrame(rows)
    other = _gpu_side_events(events, t0)
    starts = [s for s, _, _ in other]
    import bisect

    def work_in(s, d):
        lo, hi = bisect.bisect_left(starts, s), bisect.bisect_right(starts, s + d)
        names = [n for _, _, n in other[lo:hi]]
        return ", ".join(f"{names.count(n)} {n.lower()}" for n in dict.fromkeys(names))

    out["other_gpu_work"] = [work_in(s, d) for s, d in zip(out.start_ns, out.dur_ns)]
    return out


def idle_places(gaps: pd.DataFrame, min_gap_ns: int = GAP_NS, groups: int = 3, width: int | None = None) -> pd.DataFrame:
    """Where the profiled step's idle time sits, at most `groups` + 5 rows: before the first
    kernel; between launches; the largest kinds of gap inside a graph (at least `min_gap_ns`,
    grouped by the kernels before and after them, `groups` of them); every other gap inside a
    graph; after the last kernel; and a total. Kernel names are cut to `width` characters if given."""
    def cut(name):
        return name if width is None or len(name) <= width else name[:width - 1] + "…"

    def row(where, g, before="", after=""):
        return {"where": where, "gaps": len(g), "idle ms": g.dur_ns.sum() / 1e6,
                "median µs": g.dur_ns.median() / 1e3 if len(g) else float("nan"),
                "kernel before": cut(before), "kernel after": cut(after),
                "also in the gaps": ", ".join(dict.fromkeys(w for w in g.other_gpu_work if w)) or "–"}

    rows = []
    first = gaps[gaps.place == "before the first kernel"]
    rows.append(row("before the first kernel", first, "", first.after.iloc[0] if len(first) else ""))
    between = gaps[gaps.place == "between two launches"]
    if len(between) == 1:
        rows.append(row("between two launches", between, between.before.iloc[0], between.after.iloc[0]))
    elif len(between):
        rows.append(row("between two launches", between, "(various)", "(various)"))
    inside = gaps[gaps.place == "inside one graph"]
    big = inside[inside.dur_ns >= min_gap_ns]
    shown = []
    if len(big):
        by = big.groupby(["before", "after"]).dur_ns.sum().sort_values(ascending=False)
        for (before, after) in by.index:
            g = big[(big.before == before) & (big.after == after)]
            if len(g) < 2 or len(shown) == groups:
                continue
            shown.append(g.index)
            rows.append(row(f"in the graph, ≥ {min_gap_ns / 1e3:.0f} µs", g, before, after))
    rest = inside.drop([i for idx in shown for i in idx])
    if len(rest):
        longer = int((rest.dur_ns >= min_gap_ns).sum())
        where = "in the graph, the others" + (f" ({longer} ≥ {min_gap_ns / 1e3:.0f} µs)" if longer else "")
        rows.append(row(where, rest, "(various)", "(various)"))
    last = gaps[gaps.place == "after the last kernel"]
    rows.append(row("after the last kernel", last, last.before.iloc[0] if len(last) else "", ""))
    total = row("total", gaps)
    total["median µs"] = float("nan")
    total["also in the gaps"] = ""
    rows.append(total)
    return pd.DataFrame(rows)


def host_before_first_kernel(run: runs.Run, backend: str, mode: str, limit: int = 12) -> pd.DataFrame:
    """What the CPU was doing in the profiled step before the GPU started on it: the CPU-side
    events (operators, compiled regions, CUDA calls, the profiler's own) that began before the
    first kernel of a graph (before the first kernel, in a step without graphs), in order, with
    their nesting depth; at most `limit` rows, the deepest dropped first when there are more."""
    events = trace.load_events(run.file(trace_file(backend, mode)))
    step = next(e for e in events if e.get("ph") == "X" and e.get("cat") == "user_annotation"
                and e.get("name") == "decode_step")
    t0, tid = trace._ns(step["ts"]), step["tid"]
    k = kernel_table(run, backend, mode)
    graph = k[k.launch_api == "cudaGraphLaunch"]
    first = (int(graph.start_ns.min()) if len(graph) else int(k.start_ns.min()) if len(k)
             else trace.origin_span_ns(events))
    cats = ("cpu_op", "cuda_runtime", "cuda_driver", "user_annotation", "python_function")
    spans = sorted((trace._ns(e["ts"]) - t0, trace._ns(e["dur"]), e["name"], e.get("cat")) for e in events
                   if e.get("ph") == "X" and "dur" in e and e is not step
                   and ((e.get("cat") in cats and e.get("tid") == tid) or e.get("cat") == "overhead")
                   and 0 <= trace._ns(e["ts"]) - t0 < first)
    rows, open_ends = [], []
    for s, d, name, cat in spans:
        while open_ends and open_ends[-1] <= s:
            open_ends.pop()
        name = name if len(name) <= 44 else name[:43] + "…"
        rows.append({"event": name, "kind": cat, "depth": len(open_ends), "starts at ms": s / 1e6, "lasts ms": d / 1e6})
        open_ends.append(s + d)
    out = pd.DataFrame(rows, columns=["event", "kind", "depth", "starts at ms", "lasts ms"])
    while len(out) > limit:
        out = out[out.depth < out.depth.max()]
    return out.reset_index(drop=True)


@dataclass
class IdleSummary:
    backend: str
    mode: str
    wall_ms: float
    busy_ms: float
    idle_ms: float                  # timed step: wall - GPU busy
    profiled_ms: float              # the profiled step, start to GPU finished
    profiled_idle_ms: float
    before_first_ms: float
    between_launches_ms: float
    inside_graph_ms: float          # gaps whose both neighbours came from one graph launch
    after_last_ms: float
    host_estimate_ms: float         # idle_ms - inside_graph_ms: what the timed step's idle leaves to the host
    graph_launches: int
    compiled_regions: int
    fla_kernels: int                # flash-linear-attention kernels in the step
    fla_gap_before_us: float        # median gap before / after them
    fla_gap_after_us: float
    graph_gap_us: float             # median of every gap inside a graph


def idle_summary(run: runs.Run, backend: str, mode: str) -> IdleSummary:
    """The idle time of one variant: from its timed steps (wall - busy) and, placed, from its
    profiled step (step_gaps)."""
    v = run.table("variants").set_index(["backend", "mode"]).loc[(backend, mode)]
    gaps = step_gaps(run, backend, mode)
    k = kernel_table(run, backend, mode)
    events = trace.load_events(run.file(trace_file(backend, mode)))
    span = trace.origin_span_ns(events)
    busy = float(v.gpu_busy_ns) / 1e6
    part = gaps.groupby("place").dur_ns.sum() / 1e6
    inside = gaps[gaps.place == "inside one graph"]
    fla = "flash-linear-attention (Triton)"
    near = lambda col: gaps.loc[gaps[col] == fla, "dur_ns"].median() / 1e3 if (gaps[col] == fla).any() else float("nan")  # noqa: E731
    return IdleSummary(
        backend=backend, mode=mode, wall_ms=float(v.wall_ms_median), busy_ms=busy,
        idle_ms=float(v.wall_ms_median) - busy, profiled_ms=span / 1e6, profiled_idle_ms=span / 1e6 - busy,
        before_first_ms=float(part.get("before the first kernel", 0.0)),
        between_launches_ms=float(part.get("between two launches", 0.0)),
        inside_graph_ms=float(part.get("inside one graph", 0.0)),
        after_last_ms=float(part.get("after the last kernel", 0.0)),
        host_estimate_ms=float(v.wall_ms_median) - busy - float(part.get("inside one graph", 0.0)),
        graph_launches=int(k.loc[k.launch_api == "cudaGraphLaunch", "correlation"].nunique()),
        compiled_regions=sum(1 for e in events if e.get("ph") == "X" and e.get("cat") == "cpu_op"
                             and str(e.get("name", "")).startswith("Torch-Compiled Region")),
        fla_kernels=int(k.name.map(_source).eq(fla).sum()),
        fla_gap_before_us=near("after_source"), fla_gap_after_us=near("before_source"),
        graph_gap_us=inside.dur_ns.median() / 1e3 if len(inside) else float("nan"))


def _source(name: str) -> str:
    from labsupport.traces import kernels

    return kernels.source(name)


# The prompt phase: host and device --------------------------------------------------------

def prefill_host_device(run: runs.Run) -> pd.DataFrame:
    """The prompt phase of each backend, host against device: kernels, GPU busy (the profiled
    prompt), wall time (median, fastest, slowest repeat, no profiler), the GPU idle that leaves
    (wall - busy), and both per kernel launched."""
    p = run.table("prefill")
    p = p[p.status == "ok"]
    out = pd.DataFrame({"backend": p.backend, "kernels": p.kernels, "GPU busy ms": p.gpu_busy_ns / 1e6,
                        "wall ms": p.wall_ms_median})
    out["wall min ms"] = p.wall_ms_min if "wall_ms_min" in p else float("nan")
    out["wall max ms"] = p.wall_ms_max if "wall_ms_max" in p else float("nan")
    out["GPU idle ms"] = out["wall ms"] - out["GPU busy ms"]
    out["wall µs per kernel"] = out["wall ms"] * 1e3 / out.kernels
    out["idle µs per kernel"] = out["GPU idle ms"] * 1e3 / out.kernels
    return out.reset_index(drop=True)


@dataclass
class HostCall:
    """How long the CPU spent in one kind of call in a profiled step (medians over its calls)."""

    name: str
    calls: int
    total_us: float        # the call, everything inside it included
    launch_us: float       # of which in CUDA launch calls (runtime or driver)
    operators_us: float    # of which in PyTorch operators called from it (allocations, ...)


def host_call(run: runs.Run, backend: str, name: str, mode: str = "eager") -> HostCall:
    """The CPU time of the calls named `name` (a CPU operator or an autograd function such as
    flash-linear-attention's FusedRecurrentFunction) in a profiled step, and how much of each
    went to CUDA launch calls and to PyTorch operators inside it; the rest is Python and
    whatever else the call does that the profiler does not name."""
    events = trace.load_events(run.file(trace_file(backend, mode)))
    cpu = [e for e in events if e.get("ph") == "X" and "dur" in e
           and e.get("cat") in ("cpu_op", "cuda_runtime", "cuda_driver")]
    # Only the calls made inside the profiled step (the `decode_step` annotation): the trace also
    # holds what ran around it (the profiler's warm-up steps leave CPU events behind).
    region = next(e for e in events if e.get("ph") == "X" and e.get("cat") == "user_annotation"
                  and e.get("name") == "decode_step")
    r0 = trace._ns(region["ts"])
    r1 = r0 + trace._ns(region["dur"])
    calls = [e for e in cpu if e.get("cat") == "cpu_op" and e.get("name") == name
             and r0 <= trace._ns(e["ts"]) <= r1]
    by_thread: dict = {}
    for e in cpu:
        s = trace._ns(e["ts"])
        by_thread.setdefault(e["tid"], []).append((s, s + trace._ns(e["dur"]), e))
    # Sorted by start, so each call looks only at the events that start inside it (bisect),
    # not at every event of its thread: a 27B eager step has tens of thousands.
    starts = {}
    for tid, xs in by_thread.items():
        xs.sort(key=lambda x: x[0])
        starts[tid] = [x[0] for x in xs]
    totals, launches, ops = [], [], []
    for c in calls:
        s, end = trace._ns(c["ts"]), trace._ns(c["ts"]) + trace._ns(c["dur"])
        xs, st = by_thread[c["tid"]], starts[c["tid"]]
        window = xs[bisect.bisect_left(st, s):bisect.bisect_right(st, end)]
        inner = [(a, b, e) for a, b, e in window if b <= end and e is not c]
        launch = sum(b - a for a, b, e in inner if e["cat"] != "cpu_op" and "Launch" in e["name"])
        # operators directly inside: not nested in another operator inside the call
        top, last_end = 0, -1
        for a, b, e in sorted((x for x in inner if x[2]["cat"] == "cpu_op"), key=lambda x: (x[0], -x[1])):
            if a >= last_end:
                top += b - a
                last_end = b
        totals.append(end - s)
        launches.append(launch)
        ops.append(top)
    med = (lambda xs: statistics.median(xs) / 1e3 if xs else float("nan"))  # noqa: E731
    return HostCall(name=name, calls=len(calls), total_us=med(totals), launch_us=med(launches), operators_us=med(ops))


# Beside the published vLLM profile, each on its own GPU's limit ---------------------------------

PUBLISHED_PRESET = "qwen3.5-27b"  # the configuration of the model class the published profile ran
OURS = "this run (transformers)"

def prefill_flop(run: runs.Run, tokens: int) -> float:
    """Operations of the matrix multiplies with the weights for a prompt of `tokens` tokens: a
    multiply and an add per weight per token in the decoder layers, and the LM head for the one
    token whose next token is sampled (transformers' and vLLM's prompt phase compute no other
    logits). Attention's own products (QK^T, PV) are left out: at 512 tokens they are well
    under 1% of these."""
    m = run.results["model"]
    head = m["lm_head_bytes"] // m["bytes_per_parameter"]
    return 2.0 * (m["matmul_weight_parameters"] - head) * tokens + 2.0 * head


def _short(mode_label: str) -> str:
    """The short name of a mode given by its long label (MODES' values)."""
    return next((MODES_SHORT[k] for k, label in MODES.items() if label == mode_label), mode_label)


def beside_published(run: runs.Run) -> pd.DataFrame:
    """The published vLLM profile (H100) and this run, each measured against its OWN GPU's
    datasheet limit: a decode step against the time to read the weights once at the GPU's
    bandwidth (the floor), a prompt against its operations at the GPU's dense BF16 rate (MFU).
    Both sides use the bytes and operations of the configuration built here (the published
    model is of the same class); the published times are as published."""
    from labsupport.chapters.published import HYBRID_27B_VLLM_HEADLINE as pub

    m = run.results["model"]
    nbytes = m["decode_bytes"]
    h100 = hardware.datasheet("NVIDIA H100 80GB HBM3")
    ours = hardware.datasheet_or_none(run.provenance["gpu"])
    gpu = ours.name if ours else run.provenance["gpu"].replace("NVIDIA ", "")
    ok = ok_variants(run)
    rows = []

    def decode(source, gpu_name, sheet, what, kernels, ms):
        floor = nbytes / 1e9 / sheet.bandwidth_tbs if sheet else float("nan")
        rows.append({"source": source, "GPU": gpu_name, "what": what, "kernels": kernels, "ms": ms,
                     "limit at": f"{sheet.bandwidth_tbs:g} TB/s" if sheet else "–",
                     "limit ms": floor, "of its GPU's limit": floor / ms,
                     "rate": f"{nbytes / 1e9 / ms:.2f} TB/s" if sheet or source == OURS else "–"})

    def prompt(source, gpu_name, sheet, what, kernels, ms, tokens):
        flop = prefill_flop(run, tokens)
        limit = flop / (sheet.bf16_tflops * 1e12) * 1e3 if sheet else float("nan")
        rows.append({"source": source, "GPU": gpu_name, "what": what, "kernels": kernels, "ms": ms,
                     "limit at": f"{sheet.bf16_tflops:g} TFLOP/s" if sheet else "–",
                     "limit ms": limit, "of its GPU's limit": limit / ms,
                     "rate": f"{flop / 1e12 / (ms / 1e3):.0f} TFLOP/s" if sheet or source == OURS else "–"})

    # The published profile is of the 27B configuration: its bytes and operations are this run's
    # only when this run built the same one.
    pub_sheet = h100 if run.parameters.get("preset") == PUBLISHED_PRESET else None
    decode("published (vLLM 0.31)", h100.name, pub_sheet, "decode, CUDA graphs", pub["decode_kernels"],
           pub["decode_ms"])
    if len(ok):
        best = ok.loc[ok["wall ms"].idxmin()]
        decode(OURS, gpu, ours, f"decode, best: {best.backend}, {_short(best['mode'])}",
               best.kernels, best["wall ms"])
    prompt("published (vLLM 0.31)", h100.name, pub_sheet, f"{pub['prefill_tokens']}-token prompt", float("nan"),
           pub["prefill_ms"], pub["prefill_tokens"])
    for _, r in prefill(run).iterrows():
        prompt(OURS, gpu, ours, f"{r.tokens:.0f}-token prompt, {r.backend}", r.kernels,
               r["wall ms"], int(r.tokens))
    return pd.DataFrame(rows)


# Inside one Gated DeltaNet layer, both backends -----------------------------------------------

def mixer_by_module(run: runs.Run) -> pd.DataFrame:
    """One Gated DeltaNet layer's token mixer (the middle layer of that type), kernels and GPU µs
    by the module that launched them, for each backend's eager step side by side; a total row."""
    v = run.table("variants")
    cols = {}
    for backend in v[(v["mode"] == "eager") & (v.status == "ok")].backend:
        mix = mixer_kernels(kernel_table(run, backend, "eager"))
        g = mix.groupby("module", sort=False).agg(kernels=("µs", "size"), us=("µs", "sum"))
        cols[(backend, "kernels")] = g.kernels
        cols[(backend, "µs")] = g.us
    if not cols:
        return pd.DataFrame()
    df = pd.DataFrame(cols)
    df.loc["total"] = df.sum()
    df.columns = pd.MultiIndex.from_tuples(df.columns)
    return df.fillna(0).rename_axis("module")


def csv_link(df: pd.DataFrame, filename: str, text: str):
    """A link that downloads `df` as a CSV file, the data carried in the link itself (nothing is
    written next to the book)."""
    import base64
    import html as _html

    from IPython.display import HTML

    data = base64.b64encode(df.to_csv(index=False).encode()).decode()
    return HTML(f'<p><a href="data:text/csv;base64,{data}" download="{_html.escape(filename)}">'
                f'{_html.escape(text)}</a> ({len(df)} rows, CSV)</p>')


def memsets_by_module(run: runs.Run, backend: str, mode: str = "eager") -> pd.DataFrame:
    """The memsets of a profiled step (GPU work that is not a kernel), by the module and the
    operator whose call issued them (layer numbers dropped: `mlp.down_proj`), with their size.
    Only an eager step's trace labels modules."""
    import re

    events = trace.load_events(run.file(trace_file(backend, mode)))
    launches = {e["args"]["correlation"]: e for e in events
                if e.get("ph") == "X" and e.get("cat") in ("cuda_runtime", "cuda_driver")
                and isinstance(e.get("args"), dict) and "correlation" in e["args"]}
    sets = [e for e in events if e.get("ph") == "X" and e.get("cat") == "gpu_memset"]
    found = [(m, launches.get(m.get("args", {}).get("correlation"))) for m in sets]
    queries = [(ln["pid"], ln["tid"], trace._ns(ln["ts"])) for _, ln in found if ln is not None]
    ops = iter(trace._lookup(trace._complete(events, {"cpu_op"}), queries))
    modules = iter(trace._lookup(trace._complete(events, {"user_annotation"}), queries))
    rows = []
    for m, ln in found:
        op, module = (next(ops), next(modules)) if ln is not None else ("", "")
        rows.append({"module": re.sub(r"^layers\.\d+\.", "", module) or "(unlabelled)", "operator": op or "–",
                     "bytes": int(m.get("args", {}).get("bytes", 0))})
    df = pd.DataFrame(rows, columns=["module", "operator", "bytes"])
    return (df.groupby(["module", "operator", "bytes"]).size().rename("memsets").reset_index()
            .sort_values("memsets", ascending=False).reset_index(drop=True))
