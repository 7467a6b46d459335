"""A recorded run for the page: its own tables (every variant side by side, the prompt phase, the cache as the context
grows, how the wall times were taken), its kernels (each variant's kernel table and its census by kind, by part of the
model, by layer type, inside one Gated DeltaNet layer, and the LM head), and the published vLLM profile (H100) beside
it, each side measured against its own GPU's limit.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from labsupport import runs
from labsupport.chapters import shared
from labsupport.chapters.hybrid_model_token.measuring import GROUPS, MODES_SHORT, OUTSIDE, trace_file, wall_column
from labsupport.measure import hardware, models
from labsupport.traces import kernels, trace


def limits(run: runs.Run) -> hardware.Limits:
    """The ceilings the chapter compares against (shared.limits_for): those measured in the run of
    *Why a GPU*, never the run's own; the datasheet alone where that run is of another GPU."""
    return shared.limits_for(run)


def timing_note(run: runs.Run) -> str:
    """How the run's wall times were taken: all before the first profile (the harness), or, in
    runs recorded before it, in the same process as the profiles, most after one."""
    t = run.table("step_times")
    if "clean" not in t:
        return (
            "This run is older than the book's measuring harness: its wall times were taken in the same "
            "process as its profiles, most of them after one, so they carry the profiler's after-effect "
            "(CUPTI stays attached and every later launch pays for it; the methodology page measures how "
            "much). Runs recorded with the current code time every variant of every backend, and each "
            "backend's prompt, before profiling any."
        )
    p = run.table("prefill")
    clean = list(t.clean) + (list(p.clean.dropna()) if "clean" in p else [])
    if all(str(c) == "True" for c in clean):
        return (
            f"Every wall time (each backend's prompt and every variant) was taken before the first profile in "
            f"the process, {int(t.groupby(['backend', 'mode']).size().max())} repeats each"
            + (
                ", each backend's prompt and its variants timed in turn, round after round (so that a change in "
                "the host's speed touches them alike)"
                if "round" in t and t["round"].notna().any()
                else ""
            )
            + "; the tables give the least of the repeats (the book's estimator for host-timed numbers: noise "
            "only ever adds time), with the median and quartiles beside it."
        )
    return (
        "Some wall times in this run were taken after a profile in the same process (see `clean` in "
        "`step_times.csv`); they carry the profiler's after-effect."
    )


def measured_column(run: runs.Run) -> str:
    """The name of the variants table's column for the fraction of the practical ceiling."""
    return "of practical ceiling"


def variants(run: runs.Run) -> pd.DataFrame:
    """Every backend and mode side by side: status, kernels, launch calls, GPU-busy and wall
    time (the minimum of the repeats, the book's estimator; median, quartiles, slowest),
    tokens/s, and how close the wall time gets to the
    bandwidth limit (weights / bandwidth), by the datasheet and by the practical ceiling. `mode` is the data key (MODES
    names each for display)."""
    v = run.table("variants")
    nbytes = run.results["model"]["decode_bytes"]
    lim = limits(run)
    out = pd.DataFrame({"backend": v.backend, "mode": v["mode"], "status": v.status})
    for col in ("kernels", "launch_calls", "gpu_busy_ns", "wall_ms_median", "compile_s"):
        if col not in v:
            v[col] = float("nan")
    t = run.table("step_times")
    wall = t.groupby(["backend", "mode"]).wall_ms
    keys = list(zip(v.backend, v["mode"], strict=True))
    out["kernels"] = v.kernels
    out["launch calls"] = v.launch_calls
    out["GPU busy ms"] = v.gpu_busy_ns / 1e6
    out["wall ms"] = v[wall_column(v)]  # the book's estimator (the minimum in older runs)
    out["wall median ms"] = v.wall_ms_median
    out["wall min ms"] = [wall.min().get(k, float("nan")) for k in keys]
    out["wall q1 ms"] = [wall.quantile(0.25).get(k, float("nan")) for k in keys]
    out["wall q3 ms"] = [wall.quantile(0.75).get(k, float("nan")) for k in keys]
    out["wall max ms"] = [wall.max().get(k, float("nan")) for k in keys]
    out["tokens/s"] = 1e3 / out["wall ms"]
    out["of datasheet limit"] = hardware.of_bandwidth(nbytes, out["wall ms"], lim.datasheet_tbs)
    out[measured_column(run)] = hardware.of_bandwidth(nbytes, out["wall ms"], lim.ceiling_tbs)
    out["compile s"] = v.compile_s
    return out


def variants_compact(run: runs.Run) -> pd.DataFrame:
    """variants() narrowed for the page: short mode names, the median and quartiles of the repeats in
    one column, and the status column only when something did not run."""
    v = variants(run)
    out = pd.DataFrame({"backend": v.backend, "mode": v["mode"].map(MODES_SHORT)})
    if (v.status != "ok").any():
        out["status"] = v.status
    for c in ("kernels", "launch calls", "GPU busy ms", "wall ms"):
        out[c] = v[c]
    out["median (quartiles) ms"] = [
        f"{md:.2f} ({lo:.2f}–{hi:.2f})" if lo == lo and hi == hi else "–"
        for md, lo, hi in zip(v["wall median ms"], v["wall q1 ms"], v["wall q3 ms"], strict=True)
    ]
    for c in ("tokens/s", "of datasheet limit", measured_column(run), "compile s"):
        if c != measured_column(run) or v[c].notna().any():  # no practical ceiling on this GPU: no column
            out[c] = v[c]
    return out


def ok_variants(run: runs.Run) -> pd.DataFrame:
    v = variants(run)
    return v[v.status == "ok"].reset_index(drop=True)


def prefill(run: runs.Run) -> pd.DataFrame:
    """The prompt phase per backend: kernels, GPU-busy and wall time, tokens per second."""
    p = run.table("prefill")
    p = p[p.status == "ok"].copy()
    p["backend"] = p.backend
    p["GPU busy ms"] = p.gpu_busy_ns / 1e6
    p["wall ms"] = p[wall_column(p)]
    p["wall median ms"] = p.wall_ms_median
    p["prompt tokens/s"] = p.tokens / (p["wall ms"] / 1e3)
    cols = ["backend", "tokens", "kernels", "GPU busy ms", "wall ms", "wall median ms", "prompt tokens/s"]
    return p[cols].reset_index(drop=True)


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


def headline(run: runs.Run) -> dict:
    """The numbers the nightly history follows: the eager step of the first backend that ran
    (in the run's order of backends), and the fastest variant."""
    ok = ok_variants(run)
    eager = ok[ok["mode"] == "eager"].set_index("backend")
    first = eager.loc[next(b for b in run.parameters["backends"] if b in eager.index)]
    return {
        "eager kernels": int(first.kernels),
        "eager wall ms": float(first["wall ms"]),
        "best wall ms": float(ok["wall ms"].min()),
    }


def best_variant(run: runs.Run) -> tuple[str, str]:
    """(backend, mode) of the variant with the shortest wall time."""
    v = run.table("variants")
    v = v[v.status == "ok"]
    r = v.loc[v[wall_column(v)].idxmin()]
    return r.backend, r["mode"]


def kernel_table(run: runs.Run, backend: str, mode: str) -> pd.DataFrame:
    """Kernels of one variant's profiled step, with kind, layer, part, layer type and group."""
    device = run.provenance.get("device", "cuda")
    k = kernels.annotate(trace.read_kernels(run.file(trace_file(backend, mode)), device=device))
    types = run.results["model"]["layer_types"]
    k["layer_type"] = k.layer.map(lambda i: types[int(i)] if pd.notna(i) else None)
    in_layer = k.layer.notna()
    k["group"] = (
        k.part.map(OUTSIDE).fillna(k.part).where(~in_layer, k.part.map(GROUPS).fillna("norms and residual adds"))
    )
    return k


def census_by_kind(run: runs.Run, mode: str = "eager") -> pd.DataFrame:
    """Kernels and GPU time by kind (matrix multiply, elementwise, ...) for each backend's
    step in `mode`, side by side."""
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
        rows.append(
            {
                "layer type": kind.replace("_", " "),
                "layers": n,
                "kernels per layer": len(sel) / n,
                "GPU µs per layer": sel.dur_ns.sum() / n / 1e3,
                "mixer kernels": len(mixer) / n,
                "mixer µs": mixer.dur_ns.sum() / n / 1e3,
                "MLP kernels": len(mlp) / n,
                "MLP µs": mlp.dur_ns.sum() / n / 1e3,
                "norms and residual kernels": len(rest) / n,
                "norms and residual µs": rest.dur_ns.sum() / n / 1e3,
            }
        )
    return pd.DataFrame(rows)


def mixer_kernels(k: pd.DataFrame, part: str = "linear_attn") -> pd.DataFrame:
    """The kernels of one layer's token mixer in launch order (the middle layer of its type)."""
    sel = k[k.part == part]
    if sel.empty:
        return pd.DataFrame(columns=["module", "operator", "kernel", "kind", "µs"])
    layers = sorted(sel.layer.dropna().unique())
    layer = layers[len(layers) // 2]
    sel = sel[sel.layer == layer]
    return pd.DataFrame(
        {
            "module": sel.module.str.replace(rf"^layers\.{layer}\.{part}\.?", "", regex=True).replace("", f"({part})"),
            "operator": sel.op,
            "kernel": sel.name.map(lambda n: kernels.short_name(n, width=48)),
            "kind": sel.kind,
            "µs": sel.dur_ns / 1e3,
        }
    ).reset_index(drop=True)


def largest_kernels(k: pd.DataFrame, n: int = 5) -> pd.DataFrame:
    """The longest single kernels of the step, with the module that launched them."""
    top = k.nlargest(n, "dur_ns")
    return pd.DataFrame(
        {
            "kernel": top.name.map(lambda s: kernels.short_name(s, width=48)),
            "module": top.module.replace("", "(unlabelled)"),
            "kind": top.kind,
            "µs": top.dur_ns / 1e3,
        }
    ).reset_index(drop=True)


@dataclass
class LMHead:
    rows: int
    gb: float
    ms: float  # the LM head's kernel, measured (eager, module-labelled)
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
    sheet_tbs = limits(run).datasheet_tbs
    gb = m["lm_head_bytes"] / 1e9
    return LMHead(
        rows=m["lm_head_rows"],
        gb=gb,
        ms=ms,
        tbs=gb / ms if ms else float("nan"),
        floor_ms_datasheet=gb / sheet_tbs if sheet_tbs else None,
        is_largest=bool(len(head)) and k.dur_ns.idxmax() in set(head.index),
    )


def time_budget(run: runs.Run) -> pd.DataFrame:
    """Each variant's wall time split three ways: matrix multiplies running, every other
    kernel running, and the GPU idle (waiting for the CPU or between kernels); with the
    bandwidth the matrix multiplies reached reading the weights. Keyed by backend and mode (the
    data keys: MODES names each mode for display)."""
    rows = []
    mm_bytes = run.results["model"]["matmul_bytes"]
    for _, v in run.table("variants").query("status == 'ok'").iterrows():
        k = kernel_table(run, v.backend, v["mode"])
        mm = k[k.kind == "matrix multiply"]
        mm_ms = mm.dur_ns.sum() / 1e6
        name = mm.name.str.contains("splitKreduce", case=False)
        rows.append(
            {
                "backend": v.backend,
                "mode": v["mode"],
                "matrix multiplies ms": mm_ms,
                "other kernels ms": (k.dur_ns.sum() - mm.dur_ns.sum()) / 1e6,
                "GPU idle ms": max(v[wall_column(v)] - v.gpu_busy_ns / 1e6, 0.0),
                "wall ms": v[wall_column(v)],
                "GEMM kernels": int((~name).sum()),
                "split-K reduce kernels": int(name.sum()),
                "matmul TB/s": mm_bytes / 1e12 / (mm_ms / 1e3) if mm_ms else float("nan"),
            }
        )
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


PUBLISHED_PRESET = "qwen3.5-27b"  # the configuration of the model class the published profile ran
OURS = "this run (transformers)"
PUBLISHED = "published (vLLM 0.31)"
# The table's keys, dropped for display: side ("published", "ours"), step ("decode", "prompt"),
# backend ("vllm", or this run's Gated DeltaNet backend).
BESIDE_KEYS = ["side", "step", "backend"]


def prefill_flop(run: runs.Run, tokens: int) -> float:
    """Operations of the matrix multiplies with the weights for a prompt of `tokens` tokens: a
    multiply and an add per weight per token in the decoder layers, and the LM head for the one
    token whose next token is sampled (transformers' and vLLM's prompt phase compute no other
    logits). Attention's own products (QK^T, PV) are left out: at 512 tokens they are well
    under 1% of these."""
    m = run.results["model"]
    head = m["lm_head_bytes"] // m["bytes_per_parameter"]
    return 2.0 * (m["matmul_weight_parameters"] - head) * tokens + 2.0 * head


def beside_published(run: runs.Run) -> pd.DataFrame:
    """The published vLLM profile (H100) and this run, each measured against its OWN GPU's
    datasheet limit: a decode step against the time to read the weights once at the GPU's
    bandwidth (the floor), a prompt against its operations at the GPU's dense BF16 rate (MFU).
    Both sides use the bytes and operations of the configuration built here (the published
    model is of the same class); the published times are as published. Each row carries its
    keys (BESIDE_KEYS: one decode row and one prompt row per side and backend); the other columns
    are for display."""
    from labsupport.chapters import published

    theirs = published.HYBRID_27B_VLLM_HEADLINE  # the published profile's numbers

    m = run.results["model"]
    nbytes = m["decode_bytes"]
    h100 = hardware.datasheet("NVIDIA H100 80GB HBM3")
    ours = hardware.datasheet_or_none(run.provenance["gpu"])
    gpu = ours.name if ours else run.provenance["gpu"].replace("NVIDIA ", "")
    ok = ok_variants(run)
    rows = []

    def add(step, source, backend, gpu_name, what, kernels, ms, limit_at, limit, rate):
        rows.append(
            {
                "side": "ours" if source == OURS else "published",
                "step": step,
                "backend": backend,
                "source": source,
                "GPU": gpu_name,
                "what": what,
                "kernels": kernels,
                "ms": ms,
                "limit at": limit_at,
                "limit ms": limit,
                "of its GPU's limit": limit / ms,
                "rate": rate,
            }
        )

    def decode(source, backend, gpu_name, sheet, what, kernels, ms):
        floor = nbytes / 1e9 / sheet.bandwidth_tbs if sheet else float("nan")
        limit_at = f"{sheet.bandwidth_tbs:g} TB/s" if sheet else "–"
        rate = f"{nbytes / 1e9 / ms:.2f} TB/s" if sheet or source == OURS else "–"
        add("decode", source, backend, gpu_name, what, kernels, ms, limit_at, floor, rate)

    def prompt(source, backend, gpu_name, sheet, what, kernels, ms, tokens):
        flop = prefill_flop(run, tokens)
        # our run at its own dtype's rate; the published ones ran in BF16
        rate = sheet.tensor_tflops(models.run_dtype(run) if source == OURS else "bfloat16") if sheet else None
        limit = flop / (rate * 1e12) * 1e3 if rate else float("nan")
        achieved = f"{flop / 1e12 / (ms / 1e3):.0f} TFLOP/s" if sheet or source == OURS else "–"
        add(
            "prompt",
            source,
            backend,
            gpu_name,
            what,
            kernels,
            ms,
            f"{rate:g} TFLOP/s" if rate else "–",
            limit,
            achieved,
        )

    # The published profile is of the 27B configuration: its bytes and operations are this run's
    # only when this run built the same one.
    pub_sheet = h100 if run.parameters.get("preset") == PUBLISHED_PRESET else None
    decode(
        PUBLISHED, "vllm", h100.name, pub_sheet, "decode, CUDA graphs", theirs["decode_kernels"], theirs["decode_ms"]
    )
    if len(ok):
        best = ok.loc[ok["wall ms"].idxmin()]
        decode(
            OURS,
            best.backend,
            gpu,
            ours,
            f"decode, best: {best.backend}, {MODES_SHORT[best['mode']]}",
            best.kernels,
            best["wall ms"],
        )
    prompt(
        PUBLISHED,
        "vllm",
        h100.name,
        pub_sheet,
        f"{theirs['prefill_tokens']}-token prompt",
        float("nan"),
        theirs["prefill_ms"],
        theirs["prefill_tokens"],
    )
    for _, r in prefill(run).iterrows():
        prompt(
            OURS,
            r.backend,
            gpu,
            ours,
            f"{r.tokens:.0f}-token prompt, {r.backend}",
            r.kernels,
            r["wall ms"],
            int(r.tokens),
        )
    return pd.DataFrame(rows)
