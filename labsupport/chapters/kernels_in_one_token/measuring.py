"""What the notebook's live cells call beyond the harness: the run they fill cell by cell,
the context sweep (both caches at every context, timed first, profiled later) and the table of
the profiler's effect on the same step."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from labsupport.chapters.kernels_in_one_token.params import CHAPTER, Params, progress
from labsupport.measure import harness, recording
from labsupport.traces import kernels, trace


def pending_run(params: Params, run_id: str | None = None, allow_cpu: bool = False) -> recording.PendingRun:
    """The chapter's run, filled cell by cell and written by the last live cell
    (recording.PendingRun)."""
    return recording.PendingRun(CHAPTER, params, run_id, allow_cpu=allow_cpu, progress=progress)


class ContextSweep:
    """The decode step at several context lengths, with transformers' dynamic cache (as written)
    and with a static cache (preallocated: the new token's keys and values are written in
    place instead of concatenated). Everything is timed first, then profiled."""

    def __init__(self, model, params: Params, progress=progress):
        self.model, self.params, self.progress = model, params, progress
        self.prompts, self.dynamic, self.static, self.static_steps = {}, {}, {}, {}
        self.rows: dict[int, dict] = {}
        self.census_rows: list[dict] = []

    def _oom(self, ctx: int, what: str) -> None:
        import torch

        self.rows.setdefault(ctx, {"context": ctx})["status"] = f"out of memory ({what})"
        self.progress(f"  context {ctx}: out of GPU memory ({what}), recorded as such")
        for d in (self.prompts, self.dynamic, self.static, self.static_steps):
            d.pop(ctx, None)
        torch.cuda.empty_cache()

    def time(self, prompt, prompt_times) -> None:
        """Time both caches at every context; the prompt's own dynamic step was timed already."""
        import torch

        from labsupport.measure import decode, steps

        p, device = self.params, self.params.device
        for ctx in p.contexts:
            self.progress(f"context {ctx}: timing (dynamic and static cache)")
            try:
                if ctx == p.prompt_len:  # the step measured above: one configuration, one measurement
                    self.prompts[ctx], self.dynamic[ctx] = prompt, prompt_times
                else:
                    self.prompts[ctx] = decode.Prompt.random(
                        self.model.config.vocab_size, p.batch, ctx, device, seed=ctx
                    )
                    self.dynamic[ctx] = decode.time_decode_steps(
                        self.model, self.prompts[ctx], device, repeats=p.context_repeats, warmup=1
                    )
                step = self.static_steps[ctx] = steps.StaticStep(self.model, self.prompts[ctx].ids)
                self.static[ctx] = harness.time_region(
                    step,
                    setup=steps.setup(step),
                    device=device,
                    what=f"static-cache step, {ctx} tokens",
                    repeats=p.context_repeats,
                    warmup=1,
                )
            except torch.OutOfMemoryError:
                self._oom(ctx, "timing")

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
                    dyn = prompt_table  # the step profiled above
                else:
                    dyn = kernels.annotate(
                        decode.profile_decode_step(self.model, self.prompts[ctx], device, tmp, warmup=1)
                    )
                step = self.static_steps.pop(ctx)
                stat = kernels.annotate(
                    harness.profile_region(
                        step, tmp, region="decode_step", device=device, setup=steps.setup(step), warmup=1
                    )
                )
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
            static = {
                f"static_{k}": v for k, v in context_row(stat, self.static[ctx]).items() if k != "attention_names"
            }
            self.rows[ctx] = {"context": ctx, "status": "ok", **context_row(dyn, self.dynamic[ctx]), **static}

    def table(self) -> pd.DataFrame:
        return pd.DataFrame([self.rows[c] for c in self.params.contexts if c in self.rows])


def context_row(k: pd.DataFrame, t: harness.Timing) -> dict:
    """One cache's step at one context: kernels, GPU time by what matters for the KV cache, wall."""
    attention = k.kind == "attention"
    return {
        "kernels": len(k),
        "gpu_busy_ns": trace.busy_ns(k.start_ns, k.end_ns),
        "kernel_ns": int(k.dur_ns.sum()),
        "attention_ns": int(k.loc[attention, "dur_ns"].sum()),
        "attention_kernels": int(attention.sum()),
        "attention_names": ";".join(sorted(set(k.loc[attention, "short_name"]))),
        "copy_ns": int(k.loc[k.kind == "copy/convert/concat", "dur_ns"].sum()),
        "cat_ns": int(k.loc[k.op == "aten::cat", "dur_ns"].sum()),
        "wall_ms_median": t.median,
        "wall_ms_min": t.low,
        "wall_ms_max": t.high,
        "wall_clean": t.clean,
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
        rows.append(
            {
                "condition": cond,
                "process": -1,
                "wall_ms_median": t.median,
                "wall_ms_min": t.low,
                "wall_ms_max": t.high,
                "repeats": len(t.wall_ms),
            }
        )
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
