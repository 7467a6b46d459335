"""The chapter's names (its run's tables and columns, the modes and backends measured, the parts of the model the
census groups kernels by, the trace file of each variant) and what the notebook's live cells call while they measure:
the run's parameters, the facts of the model built, and the rows of the run's tables, filled as each variant is timed
and profiled. A variant that cannot run, or fails, is recorded with the reason, never left out silently.
"""

from __future__ import annotations

import contextlib
import time

import pandas as pd

from labsupport.measure import harness
from labsupport.measure.models import gated_deltanet
from labsupport.traces import kernels

from .declaration import DECLARATION, Params

CHAPTER, load, progress = DECLARATION.slug, DECLARATION.load, DECLARATION.progress  # its declaration's
ARTIFACTS = DECLARATION.artifacts
# The columns of the run's tables, written even when nothing ran; WALL_COLUMNS, the wall times of
# a row (Timing.summary beside the estimator), stand in two.
WALL_COLUMNS = [
    "wall_ms_estimate",
    "wall_ms_fast_trials",
    "wall_ms_median",
    "wall_ms_min",
    "wall_ms_max",
    "wall_ms_q1",
    "wall_ms_q3",
]
VARIANT_COLUMNS = [
    "backend",
    "mode",
    "status",
    "kernels",
    "gpu_busy_ns",
    "kernel_ns",
    "launch_calls",
    *WALL_COLUMNS,
    "issue_ms_median",
    "clean",
    "graphs_compiled_while_profiling",
    "compile_s",
]
STEP_TIME_COLUMNS = ["backend", "mode", "repeat", "wall_ms", "issue_ms", "gpu_ms", "clean", "round", "probe_ms"]
PREFILL_COLUMNS = [
    "backend",
    "status",
    "tokens",
    "kernels",
    "gpu_busy_ns",
    *WALL_COLUMNS,
    "clean",
]
CACHE_GROWTH_COLUMNS = list(DECLARATION.columns_of("cache_growth.csv"))  # as its declaration names them
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
OUTSIDE = {
    "lm_head": "LM head",
    "norm": "final norm",
    "embed_tokens": "embedding lookup",
    "rotary_emb": "rotary position tables",
    "sample": "sampling (argmax)",
    "model": "model glue (masks, positions)",
}


def wall_column(table) -> str:  # a table, or one row of it
    """The column a wall time is read from: the book's estimator (the median of the fast-host trials,
    harness.estimate) where the run recorded it, else the minimum of the timed repeats (the estimator
    of runs without per-trial probe readings), else the median."""
    if "wall_ms_estimate" in table and pd.Series(table["wall_ms_estimate"]).notna().any():
        return "wall_ms_estimate"
    return "wall_ms_min" if "wall_ms_min" in table else "wall_ms_median"


def _estimate(t: harness.Timing) -> dict:
    """The book's estimator of a timing and the count of trials it rests on (NaN without per-trial
    probe readings)."""
    e = t.fast
    new = e.basis == harness.ESTIMATOR
    return {"wall_ms_estimate": e.value if new else float("nan"), "wall_ms_fast_trials": e.trials if new else None}


def trace_file(backend: str, mode: str) -> str:
    return f"trace-{backend}-{mode}.json.gz"


def check_backends(backends: list[str], device: str) -> None:
    """An unknown backend name stops here, before anything is measured or written."""
    for b in backends:
        gated_deltanet.unavailable_reason(b, device)


def first_line(e: BaseException) -> str:
    msg = next((ln for ln in str(e).splitlines() if ln.strip()), "")
    return f"{type(e).__name__}: {msg[:200]}"


def model_facts(model, preset: str, started: float) -> dict:
    """What the run records of the model built (from time.perf_counter() `started`): its counts,
    layer types and LM head, and how long building it took."""
    from labsupport.measure import models

    counts = models.count_model(model, preset)
    lm_head = model.get_output_embeddings().weight
    layer_types = list(model.config.layer_types)
    facts = {
        **counts.as_record(),
        "layer_types": layer_types,
        "lm_head_rows": int(lm_head.shape[0]),
        "lm_head_bytes": lm_head.numel() * lm_head.element_size(),
        "build_s": round(time.perf_counter() - started, 1),
    }
    progress(
        f"  {counts.parameters / 1e9:.2f} B parameters, {layer_types.count('linear_attention')} "
        f"linear-attention and {layer_types.count('full_attention')} full-attention layers"
    )
    return facts


def cache_rows(context: int, cache, layer_types: list[str]) -> list[dict]:
    """The rows of cache_growth.csv for a cache after a prompt of `context` tokens: bytes by
    layer type, keys and values of the full-attention layers, convolution and recurrent states
    of the linear-attention layers."""
    import torch

    out = dict.fromkeys(sorted(set(layer_types)), 0)
    for layer, kind in zip(cache.layers, layer_types, strict=False):
        tensors = [getattr(layer, "keys", None), getattr(layer, "values", None)]
        for states in ("conv_states", "recurrent_states"):
            tensors += list(getattr(layer, states, {}).values())
        out[kind] += sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor))
    return [
        {"context": context, "status": "ok", "layer_type": kind, "layers": layer_types.count(kind), "bytes": n}
        for kind, n in out.items()
    ]


class Recorder:
    """The rows of variants.csv, step_times.csv and prefill.csv, keyed by (backend, mode) and
    backend, filled as the notebook times and profiles; `timed` holds what has been timed and
    not yet profiled: (backend, mode) -> (step, Timing), (backend, "prefill") -> (None, Timing)."""

    def __init__(self, params: Params, say=progress):
        self.params, self.progress = params, say
        self.rows: dict[tuple, dict] = {}
        self.prefills: dict[str, dict] = {}
        self.timed: dict[tuple, tuple] = {}
        self.times: list[dict] = []
        self.usable: list[str] = []  # the backends that can run here
        for backend in params.backends:
            reason = gated_deltanet.unavailable_reason(backend, params.device)
            if reason:
                self.prefills[backend] = {"backend": backend, "status": f"not run: {reason}"}
                for mode in MODES:
                    self.failed(backend, mode, f"not run: {reason}")
            else:
                self.usable.append(backend)

    def failed(self, backend: str, mode: str, why: str) -> None:
        """Record why a variant (or, with mode "prefill", a backend's prompt) has no numbers."""
        if mode == "prefill":
            self.prefills[backend] = {"backend": backend, "status": why}
            self.progress(f"  {backend} / prompt: {why}")
        else:
            self.rows[(backend, mode)] = {"backend": backend, "mode": mode, "status": why}
            self.progress(f"  {backend} / {MODES[mode]}: {why}")

    def modes(self, backend: str) -> list[str]:
        """The modes this backend runs in this run, in order; each of the others is recorded now
        with the reason it does not run (no CUDA GPU, or switched off in the parameters)."""
        p, out = self.params, ["eager"]
        if p.device != "cuda":
            self.failed(backend, "cuda-graph", "not run: needs a CUDA GPU")
            self.failed(backend, "compile", "not run: needs a CUDA GPU")
            return out
        if p.cuda_graphs:
            out.append("cuda-graph")
        else:
            self.failed(backend, "cuda-graph", "not run: switched off in this run's parameters")
        if backend in p.compile_backends:
            out.append("compile")
        else:
            self.failed(backend, "compile", "not run: switched off in this run's parameters")
        return out

    @contextlib.contextmanager
    def attempt(self, backend: str, mode: str, profiling: bool = False, trace_path=None):
        """Run the block; if it fails (other than the harness refusing), record the first line
        of the error as the variant's status, drop its half-written trace, and go on. A variant
        that fails while profiling loses its timing too: every row written is complete."""
        try:
            yield
        except (harness.TimingError, harness.ProfileError):
            raise
        except Exception as e:  # recorded, not hidden: the chapter shows why
            import torch

            if isinstance(e, torch.OutOfMemoryError):
                torch.cuda.empty_cache()
            if trace_path is not None:
                trace_path.unlink(missing_ok=True)
            when = "failed while profiling (after it was timed): " if profiling else "failed: "
            self.failed(backend, mode, when + first_line(e))

    def time_all(self, backend: str, calls: dict, repeats: int, device: str, warmup: int = 2) -> None:
        """Time one backend's variants in turn, round after round (harness.interleaved), so that a
        change in the host's speed touches all of them alike. `calls` maps a mode ("prefill" or a
        step's mode) to (step or None, fn, setup or None); each Timing is kept in `timed` for its
        profile. If the interleaved timing fails, each variant is timed alone, and one that still
        fails is recorded with the reason."""
        if not calls:
            return
        what = f"{backend}: " + ", ".join(calls)
        try:
            timed = harness.interleaved(
                {m: (fn, setup) for m, (_, fn, setup) in calls.items()},
                device=device,
                rounds=repeats,
                warmup=warmup,
                what=what,
                progress=self.progress,
                min_fast=harness.MIN_FAST_TRIALS,  # the chapter's headline: waits for a fast host
            )
        except (harness.TimingError, harness.ProfileError):
            raise
        except Exception as e:  # one variant broke the rounds: time each alone, record the one that fails
            self.progress(f"  interleaved timing failed ({first_line(e)}); timing each variant alone")
            timed = {}
            for m, (_, fn, setup) in calls.items():
                with self.attempt(backend, m):
                    timed[m] = harness.time_region(
                        fn, what=f"{backend}, {m}", device=device, repeats=repeats, warmup=warmup, setup=setup
                    )
        for m, t in timed.items():
            self.timed[(backend, m)] = (calls[m][0], t)
            e = t.fast  # the book's estimator: the median of the fast-host trials
            self.progress(
                f"  {m}: wall {e.value:.2f} ms ({e.trials} fast-host trials of {e.of}; least {t.low:.2f}, "
                f"median of all {t.median:.2f})"
            )

    def prefill_profiled(self, backend: str, t: harness.Timing, k: pd.DataFrame) -> None:
        """The prompt's row: its wall times (timed) and the kernels of its profile."""
        self.prefills[backend] = {
            "backend": backend,
            "status": "ok",
            "tokens": self.params.prompt_len,
            **kernels.profile_row(k, total=False),
            **_estimate(t),
            **t.summary(fast=False, count=None),
        }
        self.progress(f"  {len(k)} kernels")

    def step_profiled(self, backend: str, mode: str, step, t: harness.Timing, k: pd.DataFrame, recompiled: int) -> None:
        """A decode step's row (its wall times, the kernels and launch calls of its profile, the
        graphs compiled while profiling) and its repeats in step_times.csv."""
        launches = int((k.launch_api != "").groupby(k.correlation).ngroups) if self.params.device == "cuda" else len(k)
        self.rows[(backend, mode)] = {
            "backend": backend,
            "mode": mode,
            "status": "ok",
            **kernels.profile_row(k),
            "launch_calls": launches,
            **_estimate(t),
            **t.summary(fast=False, issue=True, count=None),
            "graphs_compiled_while_profiling": recompiled,
            **({"compile_s": step.compile_s} if mode == "compile" else {}),
        }
        self.times.extend(t.rows(backend=backend, mode=mode))
        self.progress(f"  {len(k)} kernels")

    def variants(self) -> pd.DataFrame:
        order = [(b, m) for b in self.params.backends for m in MODES]
        return pd.DataFrame([self.rows[key] for key in order if key in self.rows], columns=VARIANT_COLUMNS)

    def step_times(self) -> pd.DataFrame:
        return pd.DataFrame(self.times, columns=STEP_TIME_COLUMNS)

    def prefill(self) -> pd.DataFrame:
        return pd.DataFrame(
            [self.prefills[b] for b in self.params.backends if b in self.prefills], columns=PREFILL_COLUMNS
        )
