"""Chapter "Launch overhead": the eager decode step's wall time against its GPU time,
and the fixes measured side by side on the same model and prompt: a static cache,
CUDA graphs, and torch.compile.

Live: build and time every variant, then profile each (no wall time after a profile).
Replay: the fixes table, the eager step's summary and the breakdown of each profiled step."""
from __future__ import annotations

import statistics
from dataclasses import dataclass

import pandas as pd

from labsupport.measure import hardware, models
from labsupport import runs
from labsupport.measure import recording
from labsupport.traces import kernels, trace
from labsupport.measure.steps import CompiledStep, EagerStep, GraphStep, StaticStep, graphs_compiled, setup

CHAPTER = "launch-overhead"
# The columns of the run's tables, written even when no variant ran.
VARIANT_COLUMNS = ["variant", "status", "kernels", "gpu_busy_ns", "first_kernel_ns", "last_kernel_end_ns",
                   "profiled_step_ns", "launch_calls", "wall_ms_median", "wall_ms_min", "wall_ms_max",
                   "issue_ms_median", "clean", "graphs_compiled_while_profiling", "compile_s"]
STEP_TIME_COLUMNS = ["variant", "repeat", "wall_ms", "issue_ms", "gpu_ms", "clean"]
VARIANTS = {
    "eager": "eager, dynamic cache (as written)",
    "eager-static": "eager, static cache",
    "cuda-graph": "CUDA graph of the static-cache step",
    "compile-reduce-overhead": 'torch.compile, mode "reduce-overhead"',
    "compile-max-autotune": 'torch.compile, mode "max-autotune"',
}


@dataclass
class Params:
    preset: str = "qwen3-8b"
    prompt_len: int = 256
    repeats: int = 20
    max_autotune: bool = True
    device: str = "cuda"


def _progress(msg: str) -> None:
    print(f"[{CHAPTER}] {msg}", flush=True)


def trace_file(variant: str) -> str:
    return f"trace-{variant}.json.gz"


def _first_line(e: BaseException) -> str:
    msg = next((ln for ln in str(e).splitlines() if ln.strip()), "")
    return f"{type(e).__name__}: {msg[:200]}"


def record(params: Params | None = None, run_id: str | None = None, allow_cpu: bool = False,
           progress=_progress) -> runs.Run:
    """Measure this GPU now and write a new run (not published). Returns the run.

    Every variant is built and timed first; only then is each one profiled, because after the
    first profile in a process CUPTI stays attached and slows every launch (labsupport.measure.harness).
    On a CPU (tests, tiny preset) only the two eager variants run; the others are recorded as
    not run."""
    import torch

    from labsupport.measure import decode, harness

    params = params or Params()
    device = params.device
    harness.for_chapter(CHAPTER)
    with recording.writer(CHAPTER, params, run_id, allow_cpu=allow_cpu) as w:
        w.extra["method"] = harness.method()
        if device == "cuda":
            hardware.record_ceilings(w, progress)
        model = models.build_model(params.preset, device=device)
        counts = models.count_model(model, params.preset)
        w.extra["model"] = counts.as_record()
        prompt = decode.Prompt.random(model.config.vocab_size, 1, params.prompt_len, device)
        rows: dict[str, dict] = {}      # variant -> its row of variants.csv, written once complete
        timed: dict[str, tuple] = {}    # variant -> (step, Timing, extra columns), in VARIANTS order

        def failed(variant, why):
            rows[variant] = {"variant": variant, "status": why}
            progress(f"  {VARIANTS[variant]}: {why}")

        def build_and_time(variant, make, extra=lambda s: None):
            progress(f"{VARIANTS[variant]}: build and time")
            try:
                step = make()
                t = harness.time_region(step, what=VARIANTS[variant], device=device, repeats=params.repeats,
                                        setup=setup(step))
            except harness.TimingError:
                raise
            except Exception as e:  # a variant that cannot run here is recorded, not hidden
                if isinstance(e, torch.OutOfMemoryError):
                    torch.cuda.empty_cache()
                return failed(variant, f"failed: {_first_line(e)}")
            timed[variant] = (step, t, extra(step) or {})
            progress(f"  wall {t.median:.2f} ms (median of {len(t.wall_ms)}, {t.low:.2f} to {t.high:.2f})")
            return step

        # 1. Build and time every variant; nothing in this process has been profiled yet.
        #    torch.compile's two modes compile separate StaticStep instances, and there is no
        #    torch._dynamo.reset() between them: Dynamo tags each compiled entry with the backend
        #    that made it (its BACKEND_MATCH check), so the max-autotune compile adds its own
        #    entry beside the reduce-overhead one, and calling the reduce-overhead step again (to
        #    profile it, below) finds its own entry instead of recompiling. A reset would throw
        #    that entry away and the profile would trace a fresh compile. The profile records how
        #    many graphs Dynamo compiled while it ran (graphs_compiled_while_profiling: 0 expected).
        build_and_time("eager", lambda: EagerStep(model, prompt))
        static = build_and_time("eager-static", lambda: StaticStep(model, prompt.ids))
        if device != "cuda":
            for variant in ("cuda-graph", "compile-reduce-overhead", "compile-max-autotune"):
                failed(variant, "not run: needs a CUDA GPU")
        else:
            build_and_time("cuda-graph", lambda: GraphStep(static or StaticStep(model, prompt.ids)))
            compile_s = lambda s: {"compile_s": s.compile_s}  # noqa: E731
            build_and_time("compile-reduce-overhead",
                           lambda: CompiledStep(StaticStep(model, prompt.ids), "reduce-overhead"), compile_s)
            if params.max_autotune:
                build_and_time("compile-max-autotune",
                               lambda: CompiledStep(StaticStep(model, prompt.ids), "max-autotune"), compile_s)
            else:
                failed("compile-max-autotune", "not run: switched off in this run's parameters")

        # 2. Profile each timed variant. A variant that fails here loses its timing too, so
        #    that every row of variants.csv is complete and step_times.csv holds only its ok rows.
        times = []
        for variant, (step, t, extra) in timed.items():
            progress(f"{VARIANTS[variant]}: profile")
            path = w.path / trace_file(variant)
            # Module labels (forward hooks) only for eager code: they would break captured and compiled code.
            labels = (lambda: decode.annotated_modules(model)) if variant.startswith("eager") else None
            before = graphs_compiled()
            try:
                k = harness.profile_region(step, path, region="decode_step", device=device, setup=setup(step),
                                           labels=labels)
                span_ns = trace.origin_span_ns(trace.load_events(path))
            except harness.ProfileError:
                raise
            except Exception as e:
                if isinstance(e, torch.OutOfMemoryError):
                    torch.cuda.empty_cache()
                path.unlink(missing_ok=True)
                failed(variant, f"failed while profiling (after it was timed): {_first_line(e)}")
                continue
            launches = (int((k.launch_api != "").groupby(k.correlation).ngroups) if device == "cuda"
                        else len(k))
            rows[variant] = {"variant": variant, "status": "ok", "kernels": len(k),
                             "gpu_busy_ns": trace.busy_ns(k.start_ns, k.end_ns),
                             "first_kernel_ns": int(k.start_ns.min()), "last_kernel_end_ns": int(k.end_ns.max()),
                             "profiled_step_ns": span_ns, "launch_calls": launches,
                             "wall_ms_median": t.median, "wall_ms_min": t.low, "wall_ms_max": t.high,
                             "issue_ms_median": statistics.median(t.issue_ms), "clean": t.clean,
                             "graphs_compiled_while_profiling": graphs_compiled() - before, **extra}
            times.extend(t.rows(variant=variant))
            progress(f"  {len(k)} kernels")
        w.write_table("variants", pd.DataFrame([rows[v] for v in VARIANTS if v in rows], columns=VARIANT_COLUMNS))
        w.write_table("step_times", pd.DataFrame(times, columns=STEP_TIME_COLUMNS))
        del model, static, timed
        if device == "cuda":
            torch.cuda.empty_cache()
    return runs.load_run(CHAPTER, w.run_id)


def load(run_id: str | None = None) -> runs.Run:
    return runs.load_run(CHAPTER, run_id)


def kernel_table(run: runs.Run, variant: str) -> pd.DataFrame:
    """Kernels of one variant's profiled step (from its raw trace), with kind and layer."""

    device = run.provenance.get("device", "cuda")
    return kernels.annotate(trace.read_kernels(run.file(trace_file(variant)), device=device))


def one_layer(k: pd.DataFrame, layers: int) -> tuple[pd.DataFrame, str]:
    """The kernels of the middle decoder layer, and a title for them. Runs recorded without
    module labels get the same number of consecutive kernels from the middle of the step."""
    if k.layer.notna().any():
        layer = int(k.layer.max()) // 2
        return k[k.layer == layer], f"decoder layer {layer}"
    n = len(k) // layers
    start = (len(k) - n) // 2
    return k.iloc[start:start + n], f"{n} consecutive kernels from the middle of the step (one layer's worth)"


def measured_column(run: runs.Run) -> str:
    """The name of the fixes table's column for the fraction of the measured ceiling."""
    return f"of measured {hardware.measured_read(hardware.run_limits(run))[1]}"


def timing_note(run: runs.Run) -> str:
    """How the run's wall times were taken: before any profile (the harness), or, in runs
    recorded before it, each right after its own profile, with CUPTI attached."""
    t = run.table("step_times")
    if "clean" not in t:
        return ("This run is older than the book's measuring harness: each variant was timed right after its "
                "own profile, in the same process, so its wall times carry the profiler's after-effect (CUPTI "
                "stays attached and every later launch pays for it; the methodology page measures how much). "
                "Runs recorded with the current code time every variant before profiling any.")
    if t.clean.astype(str).eq("True").all():
        return (f"Every wall time was taken before the first profile in the process, {int(t.groupby('variant').size().max())} "
                "repeats per variant; the table gives the median with the fastest and slowest repeat.")
    return ("Some wall times in this run were taken after a profile in the same process (see `clean` in "
            "`step_times.csv`); they carry the profiler's after-effect.")


def variants(run: runs.Run) -> pd.DataFrame:
    """The fixes side by side: kernels, launch calls, GPU-busy, wall (median, fastest, slowest
    repeat), tokens/s, and the fraction of the memory-bandwidth limit each reaches (weights
    read / wall time) by the datasheet and by the run's measured read ceiling."""
    v = run.table("variants")
    lim = hardware.run_limits(run)
    tbs, _ = hardware.measured_read(lim)
    nbytes = run.results["model"]["decode_bytes"]
    ok = v.status == "ok"
    wall = run.table("step_times").groupby("variant").wall_ms
    out = pd.DataFrame({"variant": v.variant.map(VARIANTS), "status": v.status})
    out["kernels"] = v.get("kernels")
    out["launch calls"] = v.get("launch_calls")
    out["GPU busy ms"] = v.get("gpu_busy_ns") / 1e6
    out["wall ms"] = v.get("wall_ms_median")
    out["wall min ms"] = v.variant.map(wall.min())
    out["wall max ms"] = v.variant.map(wall.max())
    out["tokens/s"] = 1e3 / out["wall ms"]
    out["of datasheet limit"] = hardware.of_bandwidth(nbytes, out["wall ms"], lim.datasheet_tbs)
    out[measured_column(run)] = hardware.of_bandwidth(nbytes, out["wall ms"], tbs)
    out["compile s"] = v.get("compile_s") if "compile_s" in v else float("nan")
    out.loc[~ok, ["kernels", "launch calls", "GPU busy ms", "wall ms", "wall min ms", "wall max ms",
                  "tokens/s"]] = float("nan")
    return out


def breakdown(run: runs.Run) -> pd.DataFrame:
    """Where each profiled step's time went: before the first kernel started, kernels
    running (busy), gaps between kernels, and after the last kernel ended."""
    v = run.table("variants")
    v = v[v.status == "ok"]
    span = v.last_kernel_end_ns - v.first_kernel_ns
    # The step is over when the CPU has returned and the GPU has finished, whichever is later.
    step_ns = v[["profiled_step_ns", "last_kernel_end_ns"]].max(axis=1)
    return pd.DataFrame({
        "variant": v.variant.map(VARIANTS),
        "before first kernel ms": v.first_kernel_ns / 1e6,
        "kernels running ms": v.gpu_busy_ns / 1e6,
        "gaps between kernels ms": (span - v.gpu_busy_ns) / 1e6,
        "after last kernel ms": (step_ns - v.last_kernel_end_ns) / 1e6,
        "profiled step ms": step_ns / 1e6,
    }).reset_index(drop=True)


@dataclass
class EagerSummary:
    kernels: int
    gpu_busy_ms: float
    wall_ms: float
    idle_ms: float
    issue_ms: float
    kernel_interval_us: float  # mean gap between kernel starts in the profiled step
    wall_per_kernel_us: float  # unprofiled wall time / kernels
    kernel_mean_us: float
    launch_call_us: float      # median duration of one CUDA launch call (runtime API)
    cpu_per_kernel_us: float   # the CPU's whole time per kernel: Python, dispatcher, launch


def eager_summary(run: runs.Run) -> EagerSummary:
    k = kernel_table(run, "eager")
    t = run.table("step_times")
    t = t[t.variant == "eager"]
    busy = trace.busy_ns(k.start_ns, k.end_ns) / 1e6
    wall = float(t.wall_ms.median())
    issue = float(t.issue_ms.median())
    starts = k.start_ns.sort_values()
    return EagerSummary(
        kernels=len(k), gpu_busy_ms=busy, wall_ms=wall, idle_ms=wall - busy, issue_ms=issue,
        kernel_interval_us=float(starts.diff().dropna().mean() / 1e3),
        wall_per_kernel_us=wall * 1e3 / len(k),
        kernel_mean_us=float(k.dur_ns.mean() / 1e3),
        launch_call_us=float(k.launch_dur_ns.median() / 1e3),
        cpu_per_kernel_us=issue * 1e3 / len(k),
    )


def headline(run: runs.Run) -> dict:
    v = variants(run)
    ok = v[v.status == "ok"]
    out = {"eager wall ms": float(ok["wall ms"].iloc[0]), "best wall ms": float(ok["wall ms"].min())}
    graph = v[v.variant == VARIANTS["cuda-graph"]]
    if len(graph) and graph.status.iloc[0] == "ok":
        out["CUDA graph wall ms"] = float(graph["wall ms"].iloc[0])
    return out


# What the static cache adds ------------------------------------------------------------------

def call_paths(run: runs.Run, variant: str) -> pd.DataFrame:
    """kernel_table() with a column `call`: the chain of PyTorch operators the CPU was inside
    when it launched each kernel, outermost first ("reshape › clone › copy_"; "aten::" left
    out). On a CPU run the rows are operators already, and `call` is the operator."""
    k = kernel_table(run, variant)
    if run.provenance.get("device", "cuda") == "cpu" or k.empty:
        return k.assign(call=k.op.str.removeprefix("aten::"))
    events = trace.load_events(run.file(trace_file(variant)))
    launches = {e["args"]["correlation"]: e for e in events
                if e.get("ph") == "X" and e.get("cat") in ("cuda_runtime", "cuda_driver")
                and isinstance(e.get("args"), dict) and "correlation" in e["args"]}
    ops: dict = {}
    for e in events:
        if e.get("ph") == "X" and e.get("cat") == "cpu_op" and "dur" in e:
            s = trace._ns(e["ts"])
            ops.setdefault((e["pid"], e["tid"]), []).append((s, s + trace._ns(e["dur"]), e["name"]))
    queries: dict = {}
    for c in dict.fromkeys(k.correlation):
        launch = launches.get(c)
        if launch is not None:
            queries.setdefault((launch["pid"], launch["tid"]), []).append((c, trace._ns(launch["ts"])))
    paths = {}
    for key, items in queries.items():
        for (c, _), stack in zip(items, trace.enclosing(ops.get(key, []), [t for _, t in items])):
            paths[c] = " › ".join(n.removeprefix("aten::") for n in stack)
    return k.assign(call=k.correlation.map(paths).fillna(k.op.str.removeprefix("aten::")))


# What an operator the static cache adds or removes is there for, by its call path (transformers
# 5.17's StaticLayer.update and sdpa_attention_forward); a path not listed gets no explanation.
STATIC_CACHE_CALLS = [
    (r"(^|› )reshape › clone › copy_$", "K and V copied out to every query head (transformers' repeat_kv, "
                                        "taken when attention has a mask)"),
    (r"^index_copy_$", "the new token's K and V written into the cache"),
    (r"^scaled_dot_product_attention › .*(where|fill_)$", "the mask made additive (0 / -inf) inside SDPA"),
    (r"attention_forward$", "attention over every slot of the cache, masked"),
    (r"^cat$", "K and V appended by concatenation (the rest: rotary embedding)"),
    (r"^add_$", "each layer's write counter advanced"),
    (r"^(arange|arange › arange|add)$", "positions: the write index and the mask's"),
    (r"^le$", "the mask: positions compared"),
]


def _what_call(call: str) -> str:
    import re

    return next((text for pattern, text in STATIC_CACHE_CALLS if re.search(pattern, call)), "")


def static_cache_diff(run: runs.Run, min_us: float = 20.0) -> pd.DataFrame:
    """The eager step with transformers' dynamic cache against the same step with a static
    cache, from their profiled traces: kernels and GPU time by call path (call_paths), only the
    paths whose kernel count differs or whose GPU time differs by `min_us` or more; then one row
    for every other path together (timing noise between two profiles) and a total."""
    def by_call(variant):
        k = call_paths(run, variant)
        return k.groupby("call").agg(kernels=("dur_ns", "size"), ns=("dur_ns", "sum"))

    d = by_call("eager").add_suffix(" eager").join(by_call("eager-static").add_suffix(" static"), how="outer")
    d = d.fillna(0)
    d["d_kernels"] = d["kernels static"] - d["kernels eager"]
    d["d_ns"] = d["ns static"] - d["ns eager"]
    shown = (d.d_kernels != 0) | (d.d_ns.abs() >= min_us * 1e3)
    rows = d[shown].sort_values("d_ns", ascending=False)
    rest = d[~shown].sum()
    out = pd.DataFrame({
        "call path": rows.index, "what it is": [_what_call(c) for c in rows.index],
        "eager kernels": rows["kernels eager"].values, "static kernels": rows["kernels static"].values,
        "Δ kernels": rows.d_kernels.values, "eager µs": rows["ns eager"].values / 1e3,
        "static µs": rows["ns static"].values / 1e3, "Δ µs": rows.d_ns.values / 1e3})
    tail = pd.DataFrame([
        {"call path": f"every other path ({int((~shown).sum())})", "what it is": "the same kernels in both steps",
         "eager kernels": rest["kernels eager"], "static kernels": rest["kernels static"],
         "Δ kernels": rest.d_kernels, "eager µs": rest["ns eager"] / 1e3, "static µs": rest["ns static"] / 1e3,
         "Δ µs": rest.d_ns / 1e3},
        {"call path": "total", "what it is": "", "eager kernels": d["kernels eager"].sum(),
         "static kernels": d["kernels static"].sum(), "Δ kernels": d.d_kernels.sum(),
         "eager µs": d["ns eager"].sum() / 1e3, "static µs": d["ns static"].sum() / 1e3, "Δ µs": d.d_ns.sum() / 1e3}])
    out = pd.concat([out, tail], ignore_index=True)
    for c in ("eager kernels", "static kernels", "Δ kernels"):
        out[c] = out[c].astype(int)
    return out


@dataclass
class StaticCacheSummary:
    eager_kernels: int
    static_kernels: int
    eager_busy_ms: float           # union of kernel intervals, as in variants.csv
    static_busy_ms: float
    graph_busy_ms: float | None    # the CUDA graph of the static step (same kernels), if it ran
    layers: int
    eager_layer_kernels: int       # kernels of the middle decoder layer
    static_layer_kernels: int
    eager_attn_kernels: int        # of which in self-attention
    static_attn_kernels: int
    eager_outside_kernels: int     # kernels outside the decoder layers
    static_outside_kernels: int


def static_cache_summary(run: runs.Run) -> StaticCacheSummary:
    """Kernel counts of the two eager steps, whole, per decoder layer (the middle one) and in
    its self-attention, and outside the layers; GPU-busy of each (and of the CUDA graph)."""
    v = run.table("variants").set_index("variant")
    a, b = kernel_table(run, "eager"), kernel_table(run, "eager-static")
    layers = run.results["model"]["layers"]

    def layer(k):
        if not k.layer.notna().any():
            return k.iloc[0:0]
        return k[k.layer == int(k.layer.max()) // 2]

    la, lb = layer(a), layer(b)
    graph = v.loc["cuda-graph"] if "cuda-graph" in v.index else None
    graph_ok = graph is not None and graph.status == "ok"
    return StaticCacheSummary(
        eager_kernels=len(a), static_kernels=len(b),
        eager_busy_ms=trace.busy_ns(a.start_ns, a.end_ns) / 1e6, static_busy_ms=trace.busy_ns(b.start_ns, b.end_ns) / 1e6,
        graph_busy_ms=float(graph.gpu_busy_ns) / 1e6 if graph_ok else None, layers=layers,
        eager_layer_kernels=len(la), static_layer_kernels=len(lb),
        eager_attn_kernels=int((la.part == "self_attn").sum()), static_attn_kernels=int((lb.part == "self_attn").sum()),
        eager_outside_kernels=int(a.layer.isna().sum()), static_outside_kernels=int(b.layer.isna().sum()))
