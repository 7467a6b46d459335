"""What the notebook's live cells call to measure: the parameters of a run, the model's
description for meta.json, the interleaved timing of the decode step and the prefills, the profile of one prefill,
the kernel tables, and the prompt sweep's rows.

The order of the measurements is the notebook's (every wall time before the first profile
in the process: labsupport.measure.harness refuses otherwise)."""

from __future__ import annotations

import re
import statistics
from dataclasses import asdict, dataclass, field

import pandas as pd

from labsupport.measure import decode, harness, models
from labsupport.traces import kernels, trace

from .names import KERNEL_COLUMNS, MATMUL, ORIGIN, PHASES, progress
from .work import model_shape


@dataclass
class Params:
    """What one run of the chapter measures."""

    preset: str = "qwen3-8b"
    prompt_len: int = 512
    prompt_lens: list[int] = field(default_factory=lambda: [1, 8, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192])
    repeats: int = 20  # rounds of interleaved trials: one decode step and one prefill of each length per round
    device: str = "cuda"


def free(device: str) -> None:
    """Give the memory of finished work back to the GPU (nothing to do on a CPU)."""
    if device == "cuda":
        import torch

        torch.cuda.empty_cache()


def model_record(model, preset: str) -> dict:
    """What meta.json's results say of the model: its counts, its shape (for the FLOP and byte
    counts), and the weight shapes of the decoder layer whose matrix multiplies are compared."""
    import torch

    counts = models.count_model(model, preset)
    sh = model_shape(model)
    layer = sh.layers // 2
    block = getattr(model, model.base_model_prefix).layers[layer]
    return {
        "model": counts.as_record(),
        "shape": asdict(sh),
        "gemm_layer": layer,
        "gemm_shapes": {
            name: [m.in_features, m.out_features] for name, m in block.named_modules() if isinstance(m, torch.nn.Linear)
        },
    }


def merge(what: str, timings: list[harness.Timing]) -> harness.Timing:
    """Several timings of one region, as one (their repeats in order)."""
    return harness.Timing(
        what=what,
        wall_ms=[x for t in timings for x in t.wall_ms],
        issue_ms=[x for t in timings for x in t.issue_ms],
        gpu_ms=[x for t in timings for x in t.gpu_ms],
        clean=all(t.clean for t in timings),
    )


def time_passes(
    model, prompts: dict, prompt_len: int, rounds: int, device: str, warmup: int = 2, progress=print
) -> tuple[harness.Timing, dict[int, harness.Timing | str]]:
    """Wall time of one decode step after a prefill of `prompts[prompt_len]` and of the prefill
    of every prompt `prompts[n]`, each into a fresh cache, timed interleaved (harness.interleaved):
    every round times the decode step and one prefill of each length once, in an order that
    rotates from round to round, so a change of the host's speed touches every length and both
    phases alike. The decode step's prefill is its `setup`, outside the timed span. Each length
    is first run once untimed: one that runs out of GPU memory is given the status "out of
    memory" instead of a timing. Returns the decode step's timing and {n: timing or status}."""
    import torch

    fits = {}
    for n, p in prompts.items():
        try:
            decode.prefill(model, p)
            harness.sync(device)
            fits[n] = True
        except torch.OutOfMemoryError:
            fits[n] = False
            progress(f"prompt {n}: out of GPU memory, recorded as such")
            free(device)
    context = prompts[prompt_len]
    variants = {
        "decode": (lambda cache, tok: decode.decode_step(model, cache, tok), lambda: decode.prefill(model, context))
    }
    variants |= {f"prefill {n}": (lambda p=p: decode.prefill(model, p)) for n, p in prompts.items() if fits[n]}
    t = harness.interleaved(
        variants, device=device, rounds=rounds, warmup=warmup, what="decode step and prefills", progress=progress
    )
    return t["decode"], {n: t[f"prefill {n}"] if fits[n] else "out of memory" for n in prompts}


def profile_prefill(
    model, prompt, device: str, trace_path, warmup: int = 2, label_modules: bool = True
) -> pd.DataFrame:
    """Profile one prefill (after `warmup` profiled-and-discarded ones in the same session),
    timed from a "prefill" annotation; write its trace to `trace_path`; return its kernels.
    With `label_modules` each kernel is labelled with the module that launched it."""
    return harness.profile_region(
        lambda: decode.prefill(model, prompt),
        trace_path,
        region=ORIGIN["prefill"],
        device=device,
        warmup=warmup,
        labels=(lambda: decode.annotated_modules(model)) if label_modules else None,
    )


def annotate(k: pd.DataFrame) -> pd.DataFrame:
    """A profile's kernels with kind, short name, decoder layer and part: the kernel table's columns."""
    return kernels.annotate(k)[KERNEL_COLUMNS]


def annotated_kernels(path, device: str, phase: str) -> pd.DataFrame:
    """The kernels of a phase's trace, with kind, short name, decoder layer and part."""
    return annotate(trace.read_kernels(path, device=device, origin=ORIGIN[phase]))


def census_table(k: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """census.csv: kernels and GPU time by kind, for each phase's kernel table in `k`."""
    parts = []
    for phase in PHASES:
        c = kernels.census(k[phase])
        c.insert(0, "phase", phase)
        parts.append(c)
    return pd.concat(parts, ignore_index=True)


def kind_column(kind: str) -> str:
    """The prompt sweep's column of GPU time for kernels of `kind` (e.g. "attention_ns")."""
    legacy = {MATMUL: "matmul_ns", "copy/convert/concat": "copy_ns"}
    return legacy.get(kind) or re.sub(r"\W+", "_", kind).strip("_") + "_ns"


# The prompt sweep's column of GPU time for each kind of kernel (kernels.KINDS decides the kinds).
KIND_COLUMNS = {kind: kind_column(kind) for kind in kernels.KINDS}


def sweep_row(n: int, k: pd.DataFrame, t: harness.Timing) -> dict:
    """The prompt sweep's row for a prompt of `n` tokens: its profiled kernels `k` and its timing `t`."""
    kind = k["name"].map(kernels.classify)
    by_kind = {col: int(k.loc[kind == name, "dur_ns"].sum()) for name, col in KIND_COLUMNS.items()}
    return {
        "prompt_len": n,
        "status": "ok",
        "kernels": len(k),
        "gpu_busy_ns": trace.busy_ns(k.start_ns, k.end_ns),
        "kernel_ns": int(k.dur_ns.sum()),
        **by_kind,
        "wall_ms_median": t.median,
        "wall_ms_min": t.low,
        "wall_ms_max": t.high,
        "wall_ms_q1": t.q1,
        "wall_ms_q3": t.q3,
        "wall_repeats": len(t.wall_ms),
        "issue_ms_median": statistics.median(t.issue_ms),
        "wall_clean": t.clean,
    }


def profile_sweep(
    model,
    prompts: dict,
    timings: dict,
    prompt_lens: list[int],
    prompt_len: int,
    prefill_kernels: pd.DataFrame,
    device: str,
    scratch,
) -> pd.DataFrame:
    """prompt_sweep.csv: one row per prompt length, each other length's prefill profiled once
    (its trace written to `scratch`, then deleted). The row of `prompt_len` is the phase's own
    profile (`prefill_kernels`): one measurement per configuration. A length that ran out of
    memory keeps that status."""
    import torch

    rows = []
    for n in prompt_lens:
        if isinstance(timings[n], str):
            rows.append({"prompt_len": n, "status": timings[n]})
            continue
        if n == prompt_len:
            rows.append(sweep_row(n, prefill_kernels, timings[n]))
            continue
        try:
            k = profile_prefill(model, prompts[n], device, scratch, warmup=1, label_modules=False)
            rows.append(sweep_row(n, k, timings[n]))
            r = rows[-1]
            progress(
                f"prompt {n}: GPU busy {r['gpu_busy_ns'] / 1e6:.2f} ms, matrix multiplies {r['matmul_ns'] / 1e6:.2f} ms"
            )
        except torch.OutOfMemoryError:
            rows.append({"prompt_len": n, "status": "out of memory"})
            progress(f"prompt {n}: out of GPU memory while profiling, recorded as such")
        finally:
            scratch.unlink(missing_ok=True)
            free(device)
    return pd.DataFrame(rows)
