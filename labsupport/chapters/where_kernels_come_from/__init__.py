"""Chapter "Where kernels come from": which library each kernel of a decode step comes
from, a fusion made by torch.compile, and the attention backends side by side.

Live, the notebook times RMSNorm (transformers' Qwen3RMSNorm, one token) eager and compiled,
and one decode step's attention under each SDPA backend at each context (CUDA events and the
host clock, before anything is profiled in the process: labsupport.measure.harness), then
profiles the same calls; `attention` here builds the attention it measures. The decode step
whose kernels are sorted by source is the published run of "The kernels in one token".

Replay: the analysis below reads the run's tables:

    fusion_kernels.csv       every kernel of both RMSNorm variants
    fusion_times.csv         per variant: kernels, µs per call (CUDA events; newer runs: host
                             clock, issue time, repeats, clean; runs timed interleaved: us_min,
                             us_q1, us_q3, wall_us_min, issue_us_min)
    trace-rmsnorm-compiled.json.gz  (newer runs) the profiled compiled call, with its host events
    fused_rmsnorm_source.py  the code torch.compile generated
    attention_backends.csv   per backend and context: status, kernels, GPU time, µs per call

`page` gives every number and text the page glues, and its tables.
"""

from __future__ import annotations

import pandas as pd

from labsupport import runs
from labsupport.chapters.kernels_in_one_token.declaration import DECLARATION as DECODE_CHAPTER  # noqa: F401 (its run)
from labsupport.measure import harness, models
from labsupport.traces import kernels, trace

from .declaration import DECLARATION, Params  # noqa: F401 (Params: the package's, for its notebook)

CHAPTER, load, progress = DECLARATION.slug, DECLARATION.load, DECLARATION.progress  # its declaration's
FUSED_SOURCE = "fused_rmsnorm_source.py"
COMPILED_TRACE = "trace-rmsnorm-compiled.json.gz"  # the compiled RMSNorm's profile, kept (newer runs)
# What the live run takes from a model folder's configuration (source.chapter_config): a model without them is refused.
MODEL_NEEDS = {
    "hidden_size": "the hidden size (RMSNorm's width)",
    "rms_norm_eps": "an RMSNorm (its epsilon)",
    "num_attention_heads": "the attention heads (the attention it measures)",
}
# The host events of a compiled call in its profile: Dynamo's guard check (the cache lookup), the
# compiled region as a whole, and the launch calls.
HOST_EVENTS = {
    "guards": ("TorchDynamo Cache Lookup",),
    "compiled region": ("Torch-Compiled Region",),
    "launch calls": ("cuLaunchKernel", "cudaLaunchKernel", "cuLaunchKernelEx"),
}
BACKENDS = ("CUDNN_ATTENTION", "FLASH_ATTENTION", "EFFICIENT_ATTENTION", "MATH")
# RMSNorm's two variants: the key of the rows of fusion_times and fusion_kernels.
EAGER, COMPILED = "eager (as written)", "torch.compile"
# The recorded decode step whose kernels are sorted by source.
DECODE_TRACE = "trace.json.gz"  # of DECODE_CHAPTER's runs


def decode_kernels(decode_run: runs.Run) -> pd.DataFrame:
    """Every kernel of the recorded decode step, read from its trace (kinds by today's rules)."""
    device = decode_run.provenance.get("device", "cuda")
    return kernels.annotate(trace.read_kernels(decode_run.file(DECODE_TRACE), device=device))


def by_source(k: pd.DataFrame) -> pd.DataFrame:
    """Kernel count and GPU time by source library (a `name` and `dur_ns` table), with each
    source's example kernel: its most time-consuming one (the name whose launches add up to
    the most GPU time, kernels.top_kernels)."""
    k = k.assign(source=k["name"].map(kernels.source))
    g = k.groupby("source")["dur_ns"].agg(kernels="count", gpu_ns="sum")
    g = g.reindex([s for s in kernels.SOURCES if s in g.index])
    g["GPU ms"] = g["gpu_ns"] / 1e6
    g["share of GPU time"] = g["gpu_ns"] / g["gpu_ns"].sum()
    top = kernels.top_kernels(k, "source")
    g["example kernel"] = [kernels.short_name(top[s]) for s in g.index]
    return g.drop(columns="gpu_ns")


def attention(
    heads: int, kv_heads: int, head_dim: int, ctx: int, dtype: str = "bfloat16", device: str = "cuda"
) -> dict[str, tuple]:
    """One decode step's attention (one query token, in `dtype`, on `device`) under each SDPA backend:
    for each, (callable, largest difference from an FP32 reference), or (None, why it is not available)."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    half = models.torch_dtype(dtype)
    q = torch.randn(1, heads, 1, head_dim, device=device, dtype=half)
    # transformers repeats the KV heads to match the query heads before calling SDPA.
    k = torch.randn(1, kv_heads, ctx, head_dim, device=device, dtype=half)
    v = torch.randn_like(k)
    k = k.repeat_interleave(heads // kv_heads, dim=1)
    v = v.repeat_interleave(heads // kv_heads, dim=1)
    ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float())
    out = {}
    for backend in BACKENDS:

        def fn(backend=backend):
            with sdpa_kernel(getattr(SDPBackend, backend)):
                return F.scaled_dot_product_attention(q, k, v)

        try:
            diff = (fn().float() - ref).abs().max().item()
        except RuntimeError as e:
            msg = next((ln for ln in str(e).splitlines() if ln.strip()), type(e).__name__)
            out[backend] = (None, f"not available: {msg[:160]}")
            continue
        out[backend] = (fn, diff)
    return out


def timing_row(t: harness.Timing) -> dict:
    """One variant's per-call times in µs, from an interleaved timing: CUDA events around each call
    (the host clock on a CPU) by their minimum (the book's estimator), quartiles and median; the host
    clock (synchronised) and the time until the call returned (issue), minimum and median."""
    gpu = [g * 1e3 for g in (t.gpu_ms or t.wall_ms)]
    issue = [i * 1e3 for i in t.issue_ms]
    return {
        "us_median": harness.quantile(gpu, 0.5),
        "us_min": min(gpu),
        "us_q1": harness.quantile(gpu, 0.25),
        "us_q3": harness.quantile(gpu, 0.75),
        "wall_us_median": t.median * 1e3,
        "wall_us_min": t.low * 1e3,
        "issue_us_median": harness.quantile(issue, 0.5),
        "issue_us_min": min(issue),
        "repeats": len(gpu),
        "clean": t.clean,
    }


def per_call_column(t: pd.DataFrame) -> str:
    """The column a table's per-call time is read from: the minimum where the run has it (runs timed
    interleaved), the median in older runs."""
    return "us_min" if "us_min" in t.columns else "us_median"


def compiled_host_us(run: runs.Run) -> dict | None:
    """The compiled call's host time by part, in µs, from its kept profile (HOST_EVENTS: Dynamo's
    guard check, the compiled region, the launch calls); None for runs that did not keep it. Times
    from a profile, where every call costs more than unprofiled."""
    if COMPILED_TRACE not in run.meta["files"]:
        return None
    events = trace.load_events(run.file(COMPILED_TRACE))
    x = [
        e
        for e in events
        if e.get("ph") == "X"
        and "dur" in e
        and e.get("cat") in ("cpu_op", "user_annotation", "cuda_runtime", "cuda_driver")
    ]
    out = {}
    for part, prefixes in HOST_EVENTS.items():
        durs = [float(e["dur"]) for e in x if str(e.get("name", "")).startswith(prefixes)]
        out[part] = sum(durs) if durs else None
    return out


def fused_kernel_excerpt(run: runs.Run, lines: int = 40) -> str:
    """The generated Triton kernel (the @triton.jit function) from the recorded source."""
    src = run.file(FUSED_SOURCE).read_text().splitlines()
    start = next((i for i, ln in enumerate(src) if ln.startswith("@triton.jit")), None)
    if start is None:
        start = next((i for i, ln in enumerate(src) if "def triton_" in ln), 0)
    out = []
    for ln in src[start:]:
        if out and ln and not ln[0].isspace() and not ln.startswith(("@", "def ")):
            break
        out.append(ln)
        if len(out) >= lines:
            break
    return "\n".join(out).rstrip()


def fusion_kernels(run: runs.Run) -> pd.DataFrame:
    """The kernels of RMSNorm, eager and compiled: short name, source and kind (today's rules)."""
    k = run.table("fusion_kernels")
    return pd.DataFrame(
        {
            "variant": k["variant"],
            "kernel": k["name"].map(lambda n: kernels.short_name(n, 46)),
            "source": k["name"].map(kernels.source),
            "kind": k["name"].map(kernels.classify),
            "µs": (k["dur_ns"] / 1e3).round(2),
        }
    )


def fused_backends(run: runs.Run) -> pd.DataFrame:
    """The fused backends (every one but MATH) that ran: the fewest and the most kernels each launched
    over the contexts, and the kernels' short names."""
    a = run.table("attention_backends")
    a = a[(a.status == "ok") & (a.backend != "MATH")]
    rows = []
    for b, sub in a.groupby("backend", sort=False):
        names = dict.fromkeys(kernels.short_name(n, 40) for s in sub.kernel_names.fillna("") for n in s.split(";") if n)
        rows.append(
            {"backend": b, "fewest": int(sub.kernels.min()), "most": int(sub.kernels.max()), "names": list(names)}
        )
    return pd.DataFrame(rows, columns=["backend", "fewest", "most", "names"])


def fused_backends_text(run: runs.Run) -> str:
    """How many kernels each fused backend launched, said from the run (not "one each": FlashAttention's
    split-KV kernel is followed by a kernel that combines the pieces, cuDNN adds a reduction at long
    contexts)."""
    f = fused_backends(run)
    if f.empty:
        return "no fused backend ran here"
    parts = []
    for r in f.itertuples():
        n = f"{r.fewest}" if r.fewest == r.most else f"{r.fewest} to {r.most} (by context)"
        parts.append(f"*{r.backend}* {n} kernel{'s' if r.most > 1 else ''}")
    lo, hi = int(f.fewest.min()), int(f.most.max())
    each = f"{lo} kernel each" if lo == hi == 1 else f"{lo} to {hi} kernels each"
    text = f"the fused ones {each}: " + ", ".join(parts)
    if (f.most > 1).any():
        text += (
            ". Where a fused backend runs two, the second combines the pieces of a context split across the GPU "
            "(FlashAttention's `splitkv_combine`, cuDNN's reduction): the attention itself is still one kernel"
        )
    return text


def compiled_call_text(run: runs.Run) -> str:
    """Where the compiled RMSNorm's time per call goes: its kernel against the host's time to issue the
    call (Dynamo's guard check, the compiled wrapper's Python, Triton's launcher), split where the run
    kept the compiled call's profile."""
    t = run.table("fusion_times").set_index("variant")
    k = run.table("fusion_kernels")
    col = per_call_column(t.reset_index())
    per_call = float(t.loc[COMPILED, col])
    kernel_us = float(k.loc[k.variant == COMPILED, "dur_ns"].sum() / 1e3)
    stat = "least" if col == "us_min" else "median"
    n = int(t.loc[COMPILED, "kernels"])
    its = "its one kernel" if n == 1 else f"its {n} kernels"
    text = (
        f"Of the compiled call's {per_call:.0f} µs ({stat} of its calls), {its} ran {kernel_us:.1f} µs: "
        "the rest is the host's, not the GPU's."
    )
    if "issue_us_median" in t.columns:
        icol = "issue_us_min" if "issue_us_min" in t.columns else "issue_us_median"
        text += (
            f" The Python call took {float(t.loc[COMPILED, icol]):.0f} µs to return "
            f"({float(t.loc[EAGER, icol]):.0f} µs for eager's {int(t.loc[EAGER, 'kernels'])} launches): in it, "
            "Dynamo checks its guards (that the input still has the shape, dtype and device it was compiled for), "
            "the compiled wrapper's Python runs, and Triton's launcher launches the kernel."
        )
    host = compiled_host_us(run)
    if host and host.get("guards") is not None:
        parts = ", ".join(f"{name} {us:.0f} µs" for name, us in host.items() if us is not None)
        text += f" In the profiled call (the profiler slows every call): {parts}."
    else:
        text += (
            " This run timed the call as a whole, so it cannot say how much of it each part took; the compiled "
            "call's profile with its host events (Dynamo's guard check is the `TorchDynamo Cache Lookup` event), "
            "which newer runs keep, splits it."
        )
    return text


def timing_note(run: runs.Run) -> str:
    """How the run's per-call times were taken, in a sentence for the chapter."""
    t = run.table("fusion_times")
    if "clean" not in t.columns:
        return (
            "This run was recorded before the chapter timed everything ahead of its profiles: each "
            "per-call time was taken right after that call had been profiled, in a process where the "
            "profiler stays attached, so it includes the profiler's cost on every launch (the methodology "
            "page says more)."
        )
    a = run.table("attention_backends")
    ok = a[a["status"] == "ok"]
    clean = bool(t["clean"].all() and ok["clean"].all())
    n = sorted({int(r) for r in pd.concat([t["repeats"], ok["repeats"]])})
    calls = " or ".join(f"{r:,}" for r in n)
    if "us_min" in t.columns:
        return (
            f"Every per-call time is the least of {calls} timed calls (the book's estimator for host-bound times), "
            "with CUDA events around each, the variants compared timed in turn, round after round, "
        ) + (
            "all taken before anything was profiled in the process."
            if clean
            else "but some were taken after a profile in the same process, with the profiler attached."
        )
    return f"Every per-call time is the median of {calls} timed calls, with CUDA events around each, " + (
        "taken before anything was profiled in the process."
        if clean
        else "but some were taken after a profile in the same process, with the profiler attached."
    )


def attention_backends(run: runs.Run) -> pd.DataFrame:
    a = run.table("attention_backends")

    def names(s):
        found = [kernels.short_name(n, 40) for n in s.split(";") if n]
        return "; ".join(found) if len(found) <= 2 else f"{found[0]}; {found[1]}; … ({len(found)} distinct)"

    a["kernel"] = a.kernel_names.fillna("").map(names)
    a["source"] = a.kernel_names.fillna("").map(
        lambda s: "; ".join(dict.fromkeys(kernels.source(n) for n in s.split(";") if n))
    )
    return a


def headline(run: runs.Run) -> dict:
    t = run.table("fusion_times")
    a = run.table("attention_backends")
    n = t.set_index("variant").kernels
    return {
        "RMSNorm kernels eager": int(n[EAGER]),
        "RMSNorm kernels compiled": int(n[COMPILED]),
        "attention backends available": int(a.loc[a.status == "ok", "backend"].nunique()),
    }


def math_kernels(run: runs.Run) -> int:
    """The kernels of the MATH backend (plain PyTorch) at the shortest context it ran at; 0
    where it did not run."""
    a = run.table("attention_backends")
    m = a[(a.status == "ok") & (a.backend == "MATH")]
    return int(m.set_index("context").kernels[m.context.min()]) if len(m) else 0


def fusion_table(run: runs.Run) -> pd.DataFrame:
    """RMSNorm eager vs compiled: kernels, GPU time (profiler) and time per call."""
    t = run.table("fusion_times")
    return kernels.variant_times(run.table("fusion_kernels"), t, per_call_column(t))


from .page import TABLE_FORMATS, Page, attention_display, fastest_text, page  # noqa: E402, F401 (public names; page.py reads those above)
