"""What the notebook's live cells call beyond the harness: the run they fill cell by cell,
the context sweep (both caches at every context, timed interleaved first, profiled later; the
kernels of every profiled step by call path) and the table of the profiler's effect on the
same step."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from labsupport.chapters.kernels_in_one_token.declaration import Params
from labsupport.chapters.kernels_in_one_token.params import CHAPTER, DECLARATION, TRACE_FILE, progress
from labsupport.measure import harness, recording
from labsupport.traces import kernels, trace


def pending_run(params: Params, run_id: str | None = None) -> recording.PendingRun:
    """The chapter's run, filled cell by cell and written by the last live cell
    (recording.PendingRun). It measures no ceilings: the page compares with those of the ceilings
    owner's run (shared.limits())."""
    return recording.PendingRun(DECLARATION, params, run_id, ceilings=False, progress=progress)


class ContextSweep:
    """The decode step at several context lengths, with transformers' dynamic cache (as written)
    and with a static cache (preallocated: the new token's keys and values are written in
    place instead of concatenated). Everything is timed first, then profiled.

    At each context the two caches are timed interleaved, in rounds (harness.interleaved: one
    step of each per round, in a rotating order, each after its own fresh prefill or cache
    reset): a change of the host's speed touches both alike. The prompt's own length gets
    `params.repeats` rounds and is the chapter's headline measurement (step_times.csv): one
    configuration, one measurement."""

    def __init__(self, model, params: Params, progress=progress):
        self.model, self.params, self.progress = model, params, progress
        self.prompts, self.dynamic, self.static, self.static_steps = {}, {}, {}, {}
        self.rows: dict[int, dict] = {}
        self.census_rows: list[dict] = []
        self.op_rows: list[dict] = []
        self.time_rows: list[dict] = []

    def _oom(self, ctx: int, what: str) -> None:
        import torch

        self.rows.setdefault(ctx, {"context": ctx})["status"] = f"out of memory ({what})"
        self.progress(f"  context {ctx}: out of GPU memory ({what}), recorded as such")
        for d in (self.prompts, self.dynamic, self.static, self.static_steps):
            d.pop(ctx, None)
        torch.cuda.empty_cache()

    def time(self, prompt) -> harness.Timing | None:
        """Time both caches at every context, interleaved; `prompt` is the prompt of the
        chapter's step (its length, params.prompt_len). Returns the dynamic cache's timing at
        that length (the headline's trials)."""
        import torch

        from labsupport.measure import decode, steps

        p, device, model = self.params, self.params.device, self.model
        for ctx in sorted({p.prompt_len, *p.contexts}):
            rounds = p.repeats if ctx == p.prompt_len else p.context_repeats
            self.progress(f"context {ctx}: timing the dynamic and the static cache, {rounds} rounds interleaved")
            try:
                if ctx == p.prompt_len:
                    self.prompts[ctx] = prompt
                else:
                    self.prompts[ctx] = decode.Prompt.random(model.config.vocab_size, p.batch, ctx, device, seed=ctx)
                pr = self.prompts[ctx]
                step = self.static_steps[ctx] = steps.StaticStep(model, pr.ids)
                t = harness.interleaved(
                    {
                        "dynamic": (
                            lambda cache, tok: decode.decode_step(model, cache, tok),
                            lambda pr=pr: decode.prefill(model, pr),
                        ),
                        "static": (step, steps.setup(step)),
                    },
                    device=device,
                    rounds=rounds,
                    warmup=1,
                    what=f"decode step, {ctx} tokens",
                    progress=self.progress,
                    min_fast=harness.MIN_FAST_TRIALS if ctx == p.prompt_len else 0,  # only the headline waits
                    # for a fast host
                )
                self.dynamic[ctx], self.static[ctx] = t["dynamic"], t["static"]
                for cache in ("dynamic", "static"):
                    self.time_rows.extend(t[cache].rows(context=ctx, cache=cache))
            except torch.OutOfMemoryError:
                self._oom(ctx, "timing")
        return self.dynamic.get(p.prompt_len)

    def profile(self, folder: Path, prompt_table: pd.DataFrame) -> None:
        """Profile both caches at every context that was timed (`prompt_table`: the kernels of
        the step at the prompt's length, profiled already)."""
        import torch

        from labsupport.measure import decode, steps

        p, device = self.params, self.params.device
        for ctx in list(self.prompts):
            self.progress(f"context {ctx}: profiling (dynamic and static cache)")
            tmp = folder / f".ctx-{ctx}.json.gz"
            try:
                if ctx == p.prompt_len:
                    dyn = prompt_table.assign(call=call_paths(prompt_table, folder / TRACE_FILE, device))
                else:
                    dyn = kernels.annotate(
                        decode.profile_decode_step(self.model, self.prompts[ctx], device, tmp, warmup=1)
                    )
                    dyn = dyn.assign(call=call_paths(dyn, tmp, device))
                step = self.static_steps.pop(ctx)
                stat = kernels.annotate(
                    harness.profile_region(
                        step, tmp, region="decode_step", device=device, setup=steps.setup(step), warmup=1
                    )
                )
                stat = stat.assign(call=call_paths(stat, tmp, device))
                tmp.unlink(missing_ok=True)
                del step
            except torch.OutOfMemoryError:
                self._oom(ctx, "profile")
                continue
            for cache, k in (("dynamic", dyn), ("static", stat)):
                for r in kernels.census(k).itertuples():
                    self.census_rows.append(
                        {"context": ctx, "cache": cache, "kind": r.kind, "kernels": r.kernels, "gpu_ns": r.gpu_ns}
                    )
                self.op_rows.extend(ops_rows(k, context=ctx, cache=cache))
            static = {
                f"static_{k}": v for k, v in context_row(stat, self.static[ctx]).items() if k != "attention_names"
            }
            self.rows[ctx] = {"context": ctx, "status": "ok", **context_row(dyn, self.dynamic[ctx]), **static}

    def table(self) -> pd.DataFrame:
        return pd.DataFrame([self.rows[c] for c in sorted(self.rows)])


def profile_step(model, prompt, device: str, path: Path) -> pd.DataFrame:
    """Profile one eager decode step of `model` after a fresh prefill of `prompt` (the trace at
    `path`): its kernels, each with its kind and the module that launched it (kernels.annotate)."""
    from labsupport.measure import decode

    return kernels.annotate(
        harness.profile_region(
            lambda cache, token: decode.decode_step(model, cache, token),
            path,
            region="decode_step",
            device=device,
            warmup=2,
            setup=lambda: decode.prefill(model, prompt),
            labels=lambda: decode.annotated_modules(model),
        )
    )


def call_paths(k: pd.DataFrame, path: Path, device: str) -> pd.Series:
    """For each kernel of `k` (profiled into the trace at `path`), the chain of PyTorch
    operators the CPU was inside when it launched it, outermost first ("reshape › clone ›
    copy_"; "aten::" left out). On a CPU the rows are operators already: the operator."""
    fallback = k.op.astype(str).str.removeprefix("aten::") if "op" in k else pd.Series("", index=k.index)
    if device != "cuda" or k.empty or "correlation" not in k:
        return fallback
    paths = trace.call_paths(trace.load_events(path), k.correlation, leave_out=("decode_step",))
    return k.correlation.map(paths).fillna(fallback)


def ops_rows(k: pd.DataFrame, **keys) -> list[dict]:
    """context_ops.csv's rows for one profiled step: kernels and GPU time by kind and call path."""
    call = k["call"] if "call" in k else k.op.astype(str).str.removeprefix("aten::")
    g = k.assign(call=call.replace("", "(none)")).groupby(["kind", "call"]).dur_ns.agg(["size", "sum"])
    return [
        {**keys, "kind": kind, "call": c, "kernels": int(n), "gpu_ns": int(ns)} for (kind, c), (n, ns) in g.iterrows()
    ]


def context_row(k: pd.DataFrame, t: harness.Timing) -> dict:
    """One cache's step at one context: kernels, GPU time by what matters for the KV cache, wall
    (the book's estimator, the fast-host median, with its minimum, quartiles and count; the median,
    quartiles and range of all the trials)."""
    attention = k.kind == "attention"
    return {
        **kernels.profile_row(k),
        "attention_ns": int(k.loc[attention, "dur_ns"].sum()),
        "attention_kernels": int(attention.sum()),
        "attention_names": ";".join(sorted(set(k.loc[attention, "short_name"]))),
        "copy_ns": int(k.loc[k.kind == "copy/convert/concat", "dur_ns"].sum()),
        "cat_ns": int(k.loc[k.op == "aten::cat", "dur_ns"].sum()),
        **t.summary(count="wall_repeats", clean="wall_clean"),  # _estimate (the estimator), _fast_*, _min, ...
    }


def profiler_effect_table(procs, clean: harness.Timing, after: harness.Timing, span_ms: float) -> pd.DataFrame:
    """The same eager step measured four ways: in fresh processes, in this process before its
    first profile, in this process after it, and as the span of the profiled step itself."""
    rows = [
        {
            "condition": "fresh process",
            "process": p.process,
            "wall_ms_median": p.wall_ms_median,
            "wall_ms_min": p.wall_ms_min,
            "wall_ms_max": p.wall_ms_max,
            "repeats": p.repeats,
        }
        for p in procs
    ]
    for cond, t in (("before profiling", clean), ("after profiling", after)):
        rows.append({"condition": cond, "process": -1, **t.summary(fast=False, count="repeats", clean=None)})
    rows.append(
        {
            "condition": "inside the profiler",
            "process": -1,
            "wall_ms_median": span_ms,
            "wall_ms_min": span_ms,
            "wall_ms_max": span_ms,
            "repeats": 1,
        }
    )
    return pd.DataFrame(rows)


def plain_eager_step(params: Params, path: Path, trials: int, tiny: bool = False) -> pd.DataFrame | None:
    """The same eager step timed by benchmarks/plain_eager_step.py, outside the harness, in a
    fresh process (before this one profiles): one row per trial, `wall_ms` and the host probe's
    reading just before it (`probe_ms`), from the CSV the script writes to `path`. None where the
    script is not there (labsupport installed from its wheel, without the repository), or for a
    model folder (the script builds the preset's model)."""
    import subprocess
    import sys

    from labsupport.runs.provenance import REPO_ROOT

    script = REPO_ROOT / "benchmarks" / "plain_eager_step.py"
    if getattr(params, "model", ""):
        progress(f"  {script.name} builds the preset's model, not a model folder: its step is not recorded")
        return None
    if not script.is_file():
        progress(f"  {script} is not here (no repository checkout): the plain script's step is not recorded")
        return None
    cmd = [sys.executable, str(script), "--trials", str(trials), "--prompt-len", str(params.prompt_len)]
    cmd += ["--device", params.device, "--csv", str(path), *(["--tiny"] if tiny else [])]
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO_ROOT)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"{CHAPTER}: benchmarks/plain_eager_step.py failed: {last}")
    df = pd.read_csv(path)
    path.unlink()
    return df
