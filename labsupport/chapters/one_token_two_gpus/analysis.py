"""The chapter's analysis, from a recorded run: the step at TP=1 and TP=N per rank, the
all-reduces of one step, the all-reduce curve, the census of each rank's kernels, and the
answer (how much faster, where the time goes), beside the published references."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from labsupport import runs
from labsupport.chapters import published
from labsupport.chapters.one_token_two_gpus.params import VARIANTS, trace_file
from labsupport.measure.distributed import allreduce
from labsupport.traces import kernels, trace


def degrees(run: runs.Run) -> list[int]:
    """The tensor-parallel degrees measured, smallest first (1 and the split run's)."""
    return sorted(int(x) for x in run.table("variants").tp.unique())


def split_degree(run: runs.Run) -> int:
    return degrees(run)[-1]


def steps(run: runs.Run) -> pd.DataFrame:
    """One row per degree, rank and form of the step: status, kernels (of them communication),
    all-reduce calls, GPU busy, communication and wall time (the least of the rank's clean
    repeats, the book's estimator; median, fastest, slowest), the GPU's idle time in a step (wall less busy), tokens/s
    (batch x 1000 / wall ms) and the speed-up over the same form at TP=1 on rank 0."""
    v = run.table("variants")
    batch = run.parameters.get("batch", 1)
    out = pd.DataFrame({"tp": v.tp, "rank": v["rank"], "variant": v.variant, "status": v.status})
    out["kernels"] = v.get("kernels")
    out["communication kernels"] = v.get("comm_kernels")
    out["all-reduce calls"] = v.get("allreduce_calls")
    out["GPU busy ms"] = v.get("gpu_busy_ns") / 1e6
    out["communication ms"] = v.get("comm_ns") / 1e6
    # the least of the rank's repeats: the book's estimator for host-timed numbers (every run has it)
    out["wall ms"] = v.get("wall_ms_min") if "wall_ms_min" in v else v.get("wall_ms_median")
    out["wall median ms"] = v.get("wall_ms_median")
    out["wall min ms"] = v.get("wall_ms_min")
    out["wall max ms"] = v.get("wall_ms_max")
    out["GPU idle ms"] = out["wall ms"] - out["GPU busy ms"]  # unprofiled wall less profiled busy
    out["tokens/s"] = batch * 1e3 / out["wall ms"]
    base = out[(out.tp == 1) & (out["rank"] == 0)].set_index("variant")["wall ms"]
    out["speed-up over TP=1"] = out.variant.map(base) / out["wall ms"]
    order = out.variant.map({v: i for i, v in enumerate(VARIANTS)})
    return out.assign(order=order).sort_values(["order", "tp", "rank"]).drop(columns="order").reset_index(drop=True)


# The shared quantity (labsupport.chapters.shared) that is each form's one-GPU step, as the book
# shows it: measured in the owner's run, not in this chapter's.
SHARED_ONE_GPU = {"eager": "eager_wall_ms", "cuda-graph": "graph_wall_ms", "compile": "compiled_wall_ms"}


def steps_shown(run: runs.Run, shared_ms: dict[str, float], source: dict[str, str]) -> pd.DataFrame:
    """steps() for the page: each one-GPU (TP=1) row's wall time is the book's shared value of that
    step (`shared_ms`: {variant: ms}, from the run named in `source`: {variant: text}), not this run's
    own; split rows stay this run's. The GPU's idle time of a TP=1 row (shared wall less this run's busy
    time) is left out, and the speed-up stays this run's own, both degrees recorded on one box."""
    s = steps(run)
    one = s.tp == 1
    s["wall from"] = "this run"
    for v, ms in shared_ms.items():
        rows = one & (s.variant == v) & (s.status == "ok")
        s.loc[rows, "wall ms"] = ms
        s.loc[rows, "wall from"] = source.get(v, "shared")
        s.loc[rows, "GPU idle ms"] = float("nan")
    s["tokens/s"] = run.parameters.get("batch", 1) * 1e3 / s["wall ms"]
    return s


def kernel_table(run: runs.Run, tp: int, rank: int, variant: str) -> pd.DataFrame:
    """Kernels of one rank's profiled step (from its raw trace), with kind, layer and part."""
    device = run.provenance.get("device", "cuda")
    return kernels.annotate(trace.read_kernels(run.file(trace_file(tp, rank, variant)), device=device))


def layer_kernels(run: runs.Run, tp: int, rank: int, variant: str, layer: int) -> pd.DataFrame:
    """The kernels of decoder `layer` in one rank's profiled step, in start order. A split step's
    layer ends with its second all-reduce, so the layer runs from the end of the previous layer's
    second all-reduce to the end of its own (this finds layers in a CUDA graph's replay too,
    whose kernels carry no module names); else the kernels labelled with the layer."""
    k = kernel_table(run, tp, rank, variant).sort_values("start_ns")
    comm = k[k.kind == "communication"]
    if len(comm) >= 2 * (layer + 1):
        start = comm.end_ns.iloc[2 * layer - 1] if layer else k.start_ns.min()
        end = comm.end_ns.iloc[2 * layer + 1]
        return k[(k.start_ns >= start) & (k.end_ns <= end)]
    return k[k.layer == layer]


def census(run: runs.Run, variant: str = "eager") -> pd.DataFrame:
    """Kernels and GPU time by kind, one column pair per degree and rank (TP=1 rank 0 first)."""
    parts = {}
    ok = run.table("variants")
    ok = ok[(ok.variant == variant) & (ok.status == "ok")]
    for r in ok.sort_values(["tp", "rank"]).itertuples():
        c = kernels.census(kernel_table(run, int(r.tp), int(r.rank), variant)).set_index("kind")
        parts[f"TP={r.tp} rank {r.rank}"] = c[["kernels", "gpu_ms"]]
    return pd.concat(parts, axis=1)


def main_form(run: runs.Run) -> str:
    """The form of the step the chapter compares degrees with: the CUDA graph where it ran at
    every degree and rank (on GPUs: the host's cost out of the way, as in a serving engine),
    else eager (a CPU run)."""
    v = run.table("variants")
    g = v[(v.variant == "cuda-graph") & (v.status == "ok")]
    return "cuda-graph" if len(g) == len(v[v.variant == "eager"]) and len(g) else "eager"


@dataclass
class Collectives:
    """What one step at the split degree all-reduces, per rank (they agree), and how long its
    communication kernels ran in the profiled step of one form."""

    tp: int
    per_step: int  # all-reduces issued by one step
    per_layer: float
    message_bytes: int  # bytes of each (the hidden state of every sequence, BF16)
    step_bytes: int  # bytes all-reduced by one step
    comm_ms: float  # GPU time of the step's communication kernels (0 on a CPU)
    comm_us_each: float  # per all-reduce, from the profiled step


def collectives(run: runs.Run, rank: int = 0, variant: str | None = None) -> Collectives:
    """`variant`: the form whose profiled step gives the kernel times (main_form by default)."""
    c = run.table("collectives")
    tp = split_degree(run)
    c = c[(c.tp == tp) & (c["rank"] == rank) & (c.op == "all_reduce")]
    v = run.table("variants").set_index(["tp", "rank", "variant"]).loc[(tp, rank, variant or main_form(run))]
    layers = run.results["model"]["layers"]
    sizes = c.bytes.unique()
    comm_ms = float(v.comm_ns) / 1e6
    n = len(c)
    return Collectives(
        tp=tp,
        per_step=n,
        per_layer=n / layers,
        message_bytes=int(sizes[0]) if len(sizes) == 1 else -1,
        step_bytes=int(c.bytes.sum()),
        comm_ms=comm_ms,
        comm_us_each=comm_ms * 1e3 / v.comm_kernels if v.comm_kernels else float("nan"),
    )


def allreduce_curve(run: runs.Run, launch: str = allreduce.EAGER) -> pd.DataFrame:
    """The all-reduce sweep launched one way (allreduce.EAGER or GRAPH; empty where the run has
    none), one row per message size: latency (median over ranks of each rank's median),
    algorithm and bus bandwidth, and whether it is the decode step's size."""
    a = run.table("allreduce")
    a = a[a.get("launch", pd.Series(allreduce.EAGER, index=a.index)) == launch]
    g = a.groupby("bytes").agg(
        latency_us=("latency_us_median", "median"),
        latency_us_slowest_rank=("latency_us_median", "max"),
        algbw_gbs=("algbw_gbs", "median"),
        busbw_gbs=("busbw_gbs", "median"),
        world=("world", "first"),
    )
    g = g.reset_index()
    g["decode step"] = g.bytes == collectives(run).message_bytes
    return g


def at_bytes(curve: pd.DataFrame, nbytes: int) -> float:
    """The sweep's latency (us) at `nbytes`, interpolated on a log scale between its sizes."""
    import numpy as np

    return float(np.exp(np.interp(np.log(nbytes), np.log(curve.bytes), np.log(curve.latency_us))))


@dataclass
class Answer:
    variant: str
    tp: int
    wall_ms_1: float
    wall_ms_n: float  # the slower rank's median
    speedup: float
    ideal_ms: float  # TP=1's wall time / tp: every cost split perfectly
    busy_ms_1: float
    busy_ms_n: float
    comm_ms_n: float
    comm_share_n: float  # of the split step's GPU-busy time
    kernels_1: int
    kernels_n: int


def answer(run: runs.Run, variant: str = "eager") -> Answer | None:
    """TP=1 against the split degree for one form of the step (None if either did not run)."""
    s = steps(run)
    s = s[(s.variant == variant) & (s.status == "ok")]
    tp = split_degree(run)
    one, many = s[s.tp == 1], s[s.tp == tp]
    if one.empty or len(many) != tp:
        return None
    slow = many.loc[many["wall ms"].idxmax()]
    w1 = float(one["wall ms"].iloc[0])
    return Answer(
        variant=variant,
        tp=tp,
        wall_ms_1=w1,
        wall_ms_n=float(slow["wall ms"]),
        speedup=w1 / float(slow["wall ms"]),
        ideal_ms=w1 / tp,
        busy_ms_1=float(one["GPU busy ms"].iloc[0]),
        busy_ms_n=float(many["GPU busy ms"].max()),
        comm_ms_n=float(many["communication ms"].max()),
        comm_share_n=float((many["communication ms"] / many["GPU busy ms"]).max()),
        kernels_1=int(one.kernels.iloc[0]),
        kernels_n=int(many.kernels.max()),
    )


def best(run: runs.Run) -> pd.DataFrame:
    """The fastest form that ran at each degree (its slower rank's median wall ms), and the
    speed-up of the split degree's best over TP=1's best."""
    s = steps(run)
    s = s[s.status == "ok"].groupby(["tp", "variant"], as_index=False)["wall ms"].max()
    out = s.loc[s.groupby("tp")["wall ms"].idxmin()].reset_index(drop=True)
    return out.assign(**{"speed-up over TP=1's best": out["wall ms"].iloc[0] / out["wall ms"]})


def time_split(run: runs.Run, variant: str | None = None) -> pd.DataFrame:
    """GPU ms by kind at TP=1 and at the split degree (its busier rank) in one form's profiled
    step, the change, and what a perfect split would leave (half at TP=2; communication new)."""
    variant = variant or main_form(run)
    c = census(run, variant).xs("gpu_ms", axis=1, level=1)
    tp = split_degree(run)
    one = c["TP=1 rank 0"]
    many = c[[col for col in c.columns if col.startswith(f"TP={tp} ")]].max(axis=1)
    out = pd.DataFrame({"TP=1 ms": one, f"TP={tp} ms": many, "change ms": many - one, "split perfectly ms": one / tp})
    return out[(out["TP=1 ms"] > 0) | (out[f"TP={tp} ms"] > 0)]


def references(run: runs.Run, variant: str | None = None) -> pd.DataFrame:
    """Ours beside the published references, as ratios and per-message latencies (the sweep
    replayed from a CUDA graph where the run has it: what a graphed decode step pays)."""
    variant = variant or main_form(run)
    a, curve = answer(run, variant), allreduce_curve(run, allreduce.GRAPH)
    curve = curve if len(curve) else allreduce_curve(run)
    g = published.TP_GPT_FAST_TOKENS_PER_S
    label = f"speed-up, TP=1 to TP=2 ({VARIANTS.get(variant, variant)})"
    rows = [(label, a.speedup if a else float("nan"), g[2] / g[1], published.TP_GPT_FAST_SOURCE)]
    ours_32k = at_bytes(curve, 32 << 10)
    for name, us in published.TP_ALLREDUCE_32KB_US.items():
        rows.append((f"all-reduce of 32 KB (µs), ours NCCL vs {name}", ours_32k, us, published.TP_ALLREDUCE_SOURCE))
    return pd.DataFrame(rows, columns=["what", "this run", "published", "source"])


def agreement(run: runs.Run) -> pd.DataFrame:
    """What the first decode step computed on each degree and rank, against TP=1: its next
    tokens, and the largest difference of its five top logits from TP=1's (BF16 sums in
    another order differ in the last bits; a wrong split would change the tokens)."""
    ranks = run.results["ranks"]
    ref = next(r["first_step"] for r in ranks if r["tp"] == 1)
    rows = []
    for r in ranks:
        f = r["first_step"]
        diff = max(
            abs(a - b) for xs, ys in zip(f["top5"], ref["top5"], strict=True) for a, b in zip(xs, ys, strict=True)
        )
        rows.append(
            {
                "tp": r["tp"],
                "rank": r["rank"],
                "next tokens": " ".join(map(str, f["next_token"])),
                "same tokens as TP=1": f["next_token"] == ref["next_token"],
                "largest top-5 logit difference": diff,
                "top logit": max(max(xs) for xs in f["top5"]),
            }
        )
    return pd.DataFrame(rows)


def agreement_text(run: runs.Run) -> str:
    """One paragraph, from agreement(): whether the split step picked the one-GPU step's next
    token, and how far apart its top logits were (a split that mixes up heads or columns
    changes them far more than BF16 rounding; random weights make the top logits close, so
    rounding alone can swap the top token, which the page says rather than hides)."""
    g = agreement(run)
    tp = split_degree(run)
    many = g[g.tp == tp]
    ref = next(r["first_step"]["top5"] for r in run.results["ranks"] if r["tp"] == 1)
    spread = max(max(xs) - min(xs) for xs in ref)
    diff, top = many["largest top-5 logit difference"].max(), many["top logit"].max()  # top: same-token case
    ranks_agree = many["next tokens"].nunique() == 1
    if many["same tokens as TP=1"].all():
        return (
            f"Every rank at TP={tp} computed the same next token as the model on one GPU, from the same prompt and "
            f"weights; their five top logits differ from TP=1's by at most {diff:.3g} (the top logit is {top:.3g})."
        )
    return (
        f"At TP={tp} the step picked token {many['next tokens'].iloc[0]} where the model on one GPU picked "
        f"{g[g.tp == 1]['next tokens'].iloc[0]}"
        + (" (every rank picked the same)" if ranks_agree else " (and the ranks disagree with each other)")
        + f", from the same prompt and weights. Their top logits differ by up to {diff:.3g}, while with random "
        f"weights the one-GPU step's five best logits lie within {spread:.3g} of each other, so a difference that "
        "size reorders them. BF16 partial sums added in another order (the split adds each row-parallel product "
        "in two halves, then across GPUs) change this model's logits by a comparable amount (the chapter *Closing "
        "the gap* measures a BF16 step against a float32 one), but this run cannot tell rounding from a small "
        "fault: the package's tests run the same split on the CPU and check that it gives the one-GPU token."
    )


def published_allreduce_us() -> dict[str, float]:
    """The published custom all-reduce latencies (µs per 32 KB at TP=2, H100s), by engine."""
    return dict(published.TP_ALLREDUCE_32KB_US)


def headline(run: runs.Run) -> dict:
    out = {}
    for variant in VARIANTS:
        a = answer(run, variant)
        if a is not None:
            out |= {f"TP=1 {variant} wall ms": a.wall_ms_1, f"TP={a.tp} {variant} wall ms": a.wall_ms_n}
    for launch, suffix in ((allreduce.EAGER, ""), (allreduce.GRAPH, ", CUDA graph")):
        curve = allreduce_curve(run, launch)
        if curve["decode step"].any():
            out[f"all-reduce us at the step's size{suffix}"] = float(
                curve.loc[curve["decode step"], "latency_us"].iloc[0]
            )
    return out
