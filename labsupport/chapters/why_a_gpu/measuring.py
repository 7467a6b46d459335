"""The measuring helpers the chapter's live cells call: the decode step at one batch size
(timed, or profiled), one weight matrix times one vector on the GPU and the CPU, and the
rows they write into the run.

Live, every time is taken before the first profile of the process (labsupport.measure.harness):
the ceilings and the read kernels (read_kernels), the sweep's wall times at every batch size
(interleaved in rounds, each step on a copy of its batch's one prefill), the GPU's matrix-vector
product per call and the CPU's; then the profiles that
give the GPU times (one decode step per batch size, the matrix-vector product alone). The
notebook's cells keep that order."""

from __future__ import annotations

import pandas as pd

from labsupport.measure import harness
from labsupport.measure.models import source
from labsupport.traces import kernels

from .declaration import DECLARATION

CHAPTER, load, progress = DECLARATION.slug, DECLARATION.load, DECLARATION.progress  # its declaration's
DECODE_WARMUP = 2  # untimed (or traced-and-discarded) steps per batch size, each after a fresh prefill

# What each time in the matvec table is.
KERNEL_TIME = "kernel time (profiler)"
PER_CALL = "per call (CUDA events)"
HOST_CLOCK = "host clock"


def kv_bytes_per_token(cfg) -> int:
    """The KV cache's bytes per token of context: keys and values, every layer, two bytes a value
    (BF16 or float16); `cfg` a model's configuration (its key/value heads and head size as
    source.shape reads them)."""
    return source.kv_bytes_per_position(source.shape(cfg), 2)


def free(device: str) -> None:
    """Give the memory of a finished batch size back (outside any `except` block: a caught
    exception's traceback still holds the batch's cache)."""
    import gc

    gc.collect()
    if device == "cuda":
        import torch

        torch.cuda.empty_cache()


# The matrix-vector product ----------------------------------------------------------------


def _matvec_row(device: str, dtype: str, timing: str, ms: list[float], nbytes: int) -> dict:
    s = pd.Series(ms, dtype=float)
    return {
        "device": device,
        "dtype": dtype,
        "timing": timing,
        "ms_median": float(s.median()),
        "ms_min": float(s.min()),
        "ms_max": float(s.max()),
        "repeats": len(s),
        "bytes": nbytes,
    }


def matvec_table(rows: list[dict], out_features: int, in_features: int) -> pd.DataFrame:
    """The rows of the product's timings as the run's `matvec` table, with the rate."""
    df = pd.DataFrame(rows)
    df["GB/s"] = df["bytes"] / (df["ms_median"] * 1e-3) / 1e9
    df["shape"] = f"{out_features} x {in_features}"
    return df


def time_matvec_cpu(out_features: int, in_features: int, repeats: int, dtype: str = "bfloat16") -> list[dict]:
    """One weight matrix times one vector on the CPU, in float32 and BF16 (host clock; in
    float16 instead of BF16 for a run in float16).

    Many CPUs have no fast BF16 path for this product (PyTorch converts as it goes), so
    float32 is the fair CPU number; both are recorded."""
    import torch

    w = torch.randn(out_features, in_features, dtype=getattr(torch, dtype))
    x = torch.randn(in_features, dtype=getattr(torch, dtype))
    name = f"CPU ({torch.get_num_threads()} threads)"
    rows = []
    for kind, (wd, xd) in (("float32", (w.float(), x.float())), (dtype, (w, x))):
        t = harness.time_region(
            lambda wd=wd, xd=xd: torch.mv(wd, xd),
            what=f"CPU matrix-vector product, {kind}",
            device="cpu",
            repeats=repeats,
            warmup=3,
        )
        rows.append(_matvec_row(name, kind, HOST_CLOCK, t.wall_ms, wd.numel() * wd.element_size()))
    return rows


def gpu_matvec_operands(out_features: int, in_features: int, device: str, dtype: str = "bfloat16"):
    """A BF16 (or `dtype`) weight matrix and vector on `device` (seeded, made on the CPU)."""
    import torch

    g = torch.Generator(device="cpu").manual_seed(0)
    w = torch.randn(out_features, in_features, dtype=getattr(torch, dtype), generator=g).to(device)
    x = torch.randn(in_features, dtype=getattr(torch, dtype), generator=g).to(device)
    return w, x


def _dtype_name(t) -> str:
    """ "bfloat16" or "float16": the name of a tensor's dtype, as matvec.csv records it."""
    return str(t.dtype).removeprefix("torch.")


def _device_name(device: str) -> str:
    import torch

    return torch.cuda.get_device_name(0) if device == "cuda" else device


def time_matvec_gpu(w, x, repeats: int, device: str) -> dict:
    """The GPU's product per call from Python: CUDA events just before and after each call
    (the launch included)."""
    import torch

    t = harness.time_region(
        lambda: torch.mv(w, x),
        what="GPU matrix-vector product, per call",
        device=device,
        repeats=max(repeats, 50),
        warmup=10,
    )
    return _matvec_row(
        _device_name(device), _dtype_name(w), PER_CALL, t.gpu_ms or t.wall_ms, w.numel() * w.element_size()
    )


def profile_matvec_gpu(w, x, device: str, trace_path) -> tuple[dict, list[str]]:
    """The GPU's product as its kernels alone (one profiled call, after warm-up calls in the
    same profiler session): their summed duration, and their short names."""
    import torch

    k = harness.profile_region(lambda: torch.mv(w, x), trace_path, region="matvec", device=device, warmup=3)
    ms = float(k.dur_ns.sum()) / 1e6
    return (
        _matvec_row(_device_name(device), _dtype_name(w), KERNEL_TIME, [ms], w.numel() * w.element_size()),
        [kernels.short_name(n) for n in k.name],
    )


# The decode step at one batch size ----------------------------------------------------------

# How the sweep's wall times are taken (run.results["sweep_method"]; older runs have none: each
# batch size's steps one after another on one growing cache, batch after batch, median of a few).
SWEEP_METHOD = "interleaved"


def batch_prompt(model, batch: int, prompt_len: int, device: str):
    """The `batch` random prompts of one batch size (seeded by the batch size)."""
    from labsupport.measure import decode

    return decode.Prompt.random(model.config.vocab_size, batch, prompt_len, device, seed=batch)


def fresh_step(model, prompt, holder: dict | None = None):
    """One decode step after a fresh prefill, as (fn, setup) for the harness: `setup()` prefills
    `prompt` (a new cache, outside the timed span), `fn(cache, tok)` runs the next step on it, so
    every step sees the same context (the method of the eager step of *The kernels in one
    token*). `holder["cache"]` keeps the last cache, to read its length afterwards."""
    from labsupport.measure import decode

    def setup():
        cache, tok = decode.prefill(model, prompt)
        if holder is not None:
            holder["cache"] = cache
        return cache, tok

    return (lambda cache, tok: decode.decode_step(model, cache, tok)), setup


# What each timed or profiled step runs on (run.results["sweep_setup"]; older runs have none: a
# fresh prefill before every step). A copy of the cache one prefill left is the same tensors in the
# same layout as a fresh prefill gives, without its matmuls: 20 rounds of the 12 batch sizes
# prefilled anew cost about 4 minutes on an H200, copied about 10 seconds. Where the caches of
# every batch size do not fit together (an 80 GB card), one prefill of the largest batch is kept
# and each batch size steps on a copy of its first rows: a prefill of those sequences alone lays
# its cache out the same way.
SETUP_COPY, SETUP_PREFILL = "a copy of one prefill", "a fresh prefill"
SETUP_ROWS = "a copy of the first rows of one prefill of the largest batch"
KEEP_SHARE = 0.6  # the prefilled caches of every batch size may hold this share of the free memory


def keeps_prefills(model, batches: list[int], prompt_len: int, device: str) -> bool:
    """Whether one prefilled cache of every batch size can stay in memory through the sweep: their
    KV bytes together within KEEP_SHARE of the GPU's free memory (the rest for the step's copy and
    activations). Where they cannot (a smaller GPU), only the largest batch's is kept (SETUP_ROWS)."""
    if device != "cuda":
        return True
    import torch

    need = kv_bytes_per_token(model.config) * prompt_len * sum(batches)
    return need <= KEEP_SHARE * torch.cuda.mem_get_info()[0]


def copy_of(state, batch: int | None = None):
    """A fresh copy of a prefilled (cache, next tokens): every tensor copied with its layout. With
    `batch`, of its first `batch` sequences only: each of the cache's per-sequence tensors keeps its
    first rows, copied into storage of its own, as a prefill of those sequences alone lays them out."""
    import copy

    import torch

    cache, tok = state
    with torch.inference_mode():
        if batch is None or batch == tok.shape[0]:
            return copy.deepcopy(cache), tok
        rows = {id(t): t[:batch].clone() for t in per_sequence_tensors(cache, tok.shape[0])}
        return copy.deepcopy(cache, rows), tok[:batch].clone()


def per_sequence_tensors(cache, batch: int) -> list:
    """The tensors of a transformers cache's layers whose first dimension is the batch's sequences
    (keys and values)."""
    import torch

    return [
        t
        for layer in cache.layers
        for t in vars(layer).values()
        if torch.is_tensor(t) and t.dim() > 0 and t.shape[0] == batch
    ]


def prefill_once(model, batch: int, prompt_len: int, device: str):
    """One prefill of a batch size's prompts and one untimed step on a copy of its cache: raises
    torch.OutOfMemoryError where the batch does not fit (before any batch size is timed). Returns
    the prefill's (cache, next tokens). The step on a copy needs what a timed step needs beside a
    kept cache, so a batch that passes here can be timed on copies of it, or of its first rows."""
    from labsupport.measure import decode

    state = decode.prefill(model, batch_prompt(model, batch, prompt_len, device))
    decode.decode_step(model, *copy_of(state))
    harness.sync(device)
    return state


def copied_step(model, state, holder: dict | None = None, batch: int | None = None):
    """One decode step on a copy of the cache of one prefill (`state`, prefill_once), or of its first
    `batch` sequences, as (fn, setup) for the harness: every step sees the same context, as after a
    fresh prefill (fresh_step). `holder["cache"]` keeps the last copy, to read its length afterwards."""
    from labsupport.measure import decode

    def setup():
        cache, tok = copy_of(state, batch)
        if holder is not None:
            holder["cache"] = cache
        return cache, tok

    return (lambda cache, tok: decode.decode_step(model, cache, tok)), setup


def step_for(model, batch: int, prompt_len: int, device: str, state=None, holder: dict | None = None):
    """The (fn, setup) of one batch size's step: on a copy of `state` (the batch's own prefill, or the
    first `batch` rows of a larger one's) where one is kept, else after a fresh prefill."""
    if state is not None:
        return copied_step(model, state, holder, batch)
    return fresh_step(model, batch_prompt(model, batch, prompt_len, device), holder)


def time_batches(
    model, batches: list[int], prompt_len: int, rounds: int, device: str, progress=None, states: dict | None = None
) -> dict:
    """Wall times of the decode step at every batch size, interleaved (harness.interleaved): in
    each of `rounds` rounds one step per batch size, in an order that rotates from round to
    round, each on a copy of its batch's prefilled cache (`states`, {batch: prefill_once()}; the
    largest batch's, whose first rows it copies, under SETUP_ROWS) or after a fresh prefill
    (outside the timed span); DECODE_WARMUP untimed trials per batch size first. Returns {batch: harness.Timing}."""
    states = states or {}
    variants = {f"batch {b}": step_for(model, b, prompt_len, device, states.get(b)) for b in batches}
    t = harness.interleaved(
        variants, device=device, rounds=rounds, warmup=DECODE_WARMUP, what="decode step", progress=progress
    )
    return {b: t[f"batch {b}"] for b in batches}


def profile_batch(model, batch: int, prompt_len: int, device: str, trace_path, state=None) -> tuple[pd.DataFrame, int]:
    """The kernels of one decode step at one batch size, as it was timed: DECODE_WARMUP steps
    traced and discarded in the same profiler session, then the kept step, each on a copy of
    `state` or after a fresh prefill (outside the profiled region). Returns the kernel table and
    the context length after the kept step."""
    holder: dict = {}
    fn, setup = step_for(model, batch, prompt_len, device, state, holder)
    k = harness.profile_region(fn, trace_path, region="decode_step", device=device, warmup=DECODE_WARMUP, setup=setup)
    k["kind"] = k["name"].map(kernels.classify)
    context = holder["cache"].get_seq_length()
    holder.clear()
    return k, context


def batch_matmuls(batch: int, k: pd.DataFrame) -> pd.DataFrame:
    """The matrix-multiply kernels of one batch size's profiled step, grouped by kernel name and
    launch grid (which cuBLAS kernel ran, how it tiled the work, split-K or not)."""
    mm = k[k["name"].map(kernels.classify) == "matrix multiply"]
    g = mm.groupby(["name", "grid", "block"], sort=False).dur_ns.agg(kernels="count", gpu_ns="sum").reset_index()
    g.insert(0, "batch", batch)
    g["short_name"] = g["name"].map(kernels.short_name)
    return g


def sweep_row(batch: int, timing: harness.Timing, k: pd.DataFrame, context_profiled: int) -> dict:
    """One batch size of the sweep: GPU times from its profiled step, wall times from its
    timed steps (the minimum, the book's estimator, with the quartiles, median and range)."""
    return {
        "batch": batch,
        "status": "ok",
        **kernels.profile_row(k),
        "matmul_ns": int(k.loc[k.kind == "matrix multiply", "dur_ns"].sum()),
        "attention_ns": int(k.loc[k.kind == "attention", "dur_ns"].sum()),
        **timing.summary(fast=False, issue=True, count="wall_repeats", clean="wall_clean"),
        "context_end": context_profiled,  # the same under its older name (older runs have only this one)
        "context_profiled": context_profiled,
    }
