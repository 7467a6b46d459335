"""Chapter "Launch overhead": the eager decode step's wall time against its GPU time,
and the fixes measured side by side on the same model and prompt: a static cache,
CUDA graphs, and torch.compile."""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import pandas as pd

from . import hardware, models, runs, trace

CHAPTER = "launch-overhead"
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


def _prepare(step) -> None:
    if hasattr(step, "prepare"):
        step.prepare()


class EagerStep:
    """The decode step as written, with transformers' dynamic cache. `prepare()` (outside
    any timing) prefills a fresh cache, so every step sees the same context."""

    def __init__(self, model, prompt):
        self.model, self.prompt, self.state = model, prompt, None

    def prepare(self):
        from . import decode

        self.state = decode.prefill(self.model, self.prompt)

    def __call__(self):
        from . import decode

        cache, tok = self.state
        return decode.decode_step(self.model, cache, tok)


class StaticStep:
    """One decode step at a fixed position of a static (fixed-address) KV cache.

    Every step writes the new token's keys and values into the same slot and attends over
    the same prompt, so repeated steps do identical work and can be captured in a CUDA graph.
    transformers (5.17) keeps each layer's write position in a device counter that every
    step advances; `prepare()` puts it back, outside any timing, before each step.
    """

    def __init__(self, model, prompt_ids):
        import torch
        from transformers import StaticCache

        n = prompt_ids.shape[1]
        self.model, self.n = model, n
        self.cache = StaticCache(config=model.config, max_cache_len=n + 16)
        with torch.no_grad():
            out = model(input_ids=prompt_ids, past_key_values=self.cache, use_cache=True,
                        cache_position=torch.arange(n, device=prompt_ids.device), logits_to_keep=1)
        self.tok = out.logits[:, -1].argmax(-1, keepdim=True)
        self.pos = torch.tensor([n], device=prompt_ids.device)

    def prepare(self):
        for layer in self.cache.layers:
            counter = getattr(layer, "cumulative_length", None)
            if hasattr(counter, "fill_"):
                counter.fill_(self.n)

    def forward(self, tok, pos):
        out = self.model(input_ids=tok, past_key_values=self.cache, use_cache=True, cache_position=pos)
        return out.logits[:, -1].argmax(-1, keepdim=True)

    def __call__(self):
        import torch

        with torch.no_grad():
            return self.forward(self.tok, self.pos)


class GraphStep:
    """The static-cache step captured once in a CUDA graph, then replayed."""

    def __init__(self, static: StaticStep):
        import torch

        self.static = static
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s), torch.no_grad():
            for _ in range(3):
                static.prepare()
                static.forward(static.tok, static.pos)
        torch.cuda.current_stream().wait_stream(s)
        static.prepare()
        torch.cuda.synchronize()
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph), torch.no_grad():
            self.out = static.forward(static.tok, static.pos)

    def prepare(self):
        self.static.prepare()

    def __call__(self):
        self.graph.replay()
        return self.out


class CompiledStep:
    """The static-cache step through torch.compile (which adds CUDA graphs in these modes)."""

    def __init__(self, static: StaticStep, mode: str, fullgraph: bool = True):
        import torch

        self.static = static
        self.fn = torch.compile(static.forward, mode=mode, fullgraph=fullgraph)
        t = time.perf_counter()
        with torch.no_grad():
            for _ in range(4):  # compile, then let CUDA graph trees record
                static.prepare()
                self.fn(static.tok, static.pos)
        torch.cuda.synchronize()
        self.compile_s = time.perf_counter() - t

    def prepare(self):
        self.static.prepare()

    def __call__(self):
        import torch

        with torch.no_grad():
            return self.fn(self.static.tok, self.static.pos)


def _profile(step, path, model=None, device: str = "cuda") -> None:
    """Trace one step; with `model` (eager variants only: hooks would break compiled and
    captured code) each kernel is labelled with the module that launched it."""
    import contextlib

    from torch.profiler import ProfilerActivity, profile, record_function

    from .decode import annotated_modules, sync

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    for _ in range(2):
        _prepare(step)
        step()
        _prepare(step)
        sync(device)
        labels = annotated_modules(model) if model is not None else contextlib.nullcontext()
        with labels, profile(activities=activities) as prof:
            with record_function("decode_step"):
                step()
                sync(device)  # the step ends when the GPU has finished it
    prof.export_chrome_trace(str(path))


def _time(step, repeats: int, device: str = "cuda") -> tuple[list[float], list[float]]:
    from .decode import sync

    wall, issue = [], []
    for _ in range(3):
        _prepare(step)
        step()
    for _ in range(repeats):
        _prepare(step)
        sync(device)
        t0 = time.perf_counter()
        step()
        t1 = time.perf_counter()
        sync(device)
        wall.append((time.perf_counter() - t0) * 1e3)
        issue.append((t1 - t0) * 1e3)
    return wall, issue


def record(params: Params | None = None, run_id: str | None = None, progress=_progress) -> runs.Run:
    import torch

    from . import decode

    params = params or Params()
    with runs.live_writer(CHAPTER, params, run_id) as w:
        hardware.record_ceilings(w, progress)
        model = models.build_model(params.preset, device="cuda")
        counts = models.count_model(model, params.preset)
        w.extra["model"] = counts.as_record()
        prompt = decode.Prompt.random(model.config.vocab_size, 1, params.prompt_len, "cuda")
        rows, times = [], []

        def measure(variant, step, extra=None):
            _profile(step, w.path / trace_file(variant), model if variant.startswith("eager") else None)
            k = trace.read_kernels(w.path / trace_file(variant))
            wall, issue = _time(step, params.repeats)
            for i, (a, b) in enumerate(zip(wall, issue)):
                times.append({"variant": variant, "repeat": i, "wall_ms": a, "issue_ms": b})
            rows.append({"variant": variant, "status": "ok", "kernels": len(k),
                         "gpu_busy_ns": trace.busy_ns(k.start_ns, k.end_ns),
                         "first_kernel_ns": int(k.start_ns.min()), "last_kernel_end_ns": int(k.end_ns.max()),
                         "profiled_step_ns": trace.origin_span_ns(trace.load_events(w.path / trace_file(variant))),
                         "launch_calls": int((k.launch_api != "").groupby(k.correlation).ngroups),
                         "wall_ms_median": statistics.median(wall), "issue_ms_median": statistics.median(issue),
                         **(extra or {})})
            progress(f"  {VARIANTS[variant]}: {len(k)} kernels, wall {statistics.median(wall):.2f} ms")

        def attempt(variant, make, extra=lambda s: None):
            progress(VARIANTS[variant])
            try:
                step = make()
                measure(variant, step, extra(step))
            except Exception as e:  # a variant that cannot run here is recorded, not hidden
                if isinstance(e, torch.OutOfMemoryError):
                    torch.cuda.empty_cache()
                msg = next((ln for ln in str(e).splitlines() if ln.strip()), type(e).__name__)
                rows.append({"variant": variant, "status": f"failed: {type(e).__name__}: {msg[:200]}"})
                progress(f"  failed: {msg[:200]}")

        attempt("eager", lambda: EagerStep(model, prompt))
        static = StaticStep(model, prompt.ids)
        attempt("eager-static", lambda: static)
        attempt("cuda-graph", lambda: GraphStep(static))
        attempt("compile-reduce-overhead", lambda: CompiledStep(StaticStep(model, prompt.ids), "reduce-overhead"),
                lambda s: {"compile_s": s.compile_s})
        if params.max_autotune:
            torch._dynamo.reset()
            attempt("compile-max-autotune", lambda: CompiledStep(StaticStep(model, prompt.ids), "max-autotune"),
                    lambda s: {"compile_s": s.compile_s})
        w.write_table("variants", pd.DataFrame(rows))
        w.write_table("step_times", pd.DataFrame(times))
        del model, static
        torch.cuda.empty_cache()
    return runs.load_run(CHAPTER, w.run_id)


def load(run_id: str | None = None) -> runs.Run:
    return runs.load_run(CHAPTER, run_id)


def kernel_table(run: runs.Run, variant: str) -> pd.DataFrame:
    """Kernels of one variant's profiled step (from its raw trace), with kind and layer."""
    from .one_token import annotate_kernels

    return annotate_kernels(trace.read_kernels(run.file(trace_file(variant))))


def one_layer(k: pd.DataFrame, layers: int) -> tuple[pd.DataFrame, str]:
    """The kernels of the middle decoder layer, and a title for them. Runs recorded without
    module labels get the same number of consecutive kernels from the middle of the step."""
    if k.layer.notna().any():
        layer = int(k.layer.max()) // 2
        return k[k.layer == layer], f"decoder layer {layer}"
    n = len(k) // layers
    start = (len(k) - n) // 2
    return k.iloc[start:start + n], f"{n} consecutive kernels from the middle of the step (one layer's worth)"


def variants(run: runs.Run) -> pd.DataFrame:
    """The fixes side by side: kernels, launch calls, GPU-busy, wall, tokens/s, and the
    fraction of the memory-bandwidth limit each reaches (weights read / wall time)."""
    v = run.table("variants")
    lim = hardware.run_limits(run)
    nbytes = run.results["model"]["decode_bytes"]
    ok = v.status == "ok"
    out = pd.DataFrame({"variant": v.variant.map(VARIANTS), "status": v.status})
    out["kernels"] = v.get("kernels")
    out["launch calls"] = v.get("launch_calls")
    out["GPU busy ms"] = v.get("gpu_busy_ns") / 1e6
    out["wall ms"] = v.get("wall_ms_median")
    out["tokens/s"] = 1e3 / out["wall ms"]
    out["of datasheet limit"] = hardware.of_bandwidth(nbytes, out["wall ms"], lim.datasheet_tbs)
    out["of measured copy"] = hardware.of_bandwidth(nbytes, out["wall ms"], lim.copy_tbs)
    out["compile s"] = v.get("compile_s") if "compile_s" in v else float("nan")
    out.loc[~ok, ["kernels", "launch calls", "GPU busy ms", "wall ms", "tokens/s"]] = float("nan")
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
