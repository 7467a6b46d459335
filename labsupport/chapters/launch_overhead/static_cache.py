"""What the static cache adds to the eager step: its kernels matched to the chain of PyTorch
operators that launched them, compared with the dynamic cache's path by path."""

from __future__ import annotations

import re
from dataclasses import dataclass

import pandas as pd

from labsupport import runs
from labsupport.chapters.launch_overhead.analysis import kernel_table
from labsupport.chapters.launch_overhead.params import trace_file
from labsupport.traces import kernels, trace


def call_paths(run: runs.Run, variant: str) -> pd.DataFrame:
    """kernel_table() with a column `call`: the chain of PyTorch operators the CPU was inside
    when it launched each kernel, outermost first ("reshape › clone › copy_"; "aten::" left
    out). On a CPU run the rows are operators already, and `call` is the operator."""
    k = kernel_table(run, variant)
    if run.provenance.get("device", "cuda") == "cpu" or k.empty:
        return k.assign(call=k.op.str.removeprefix("aten::"))
    paths = trace.call_paths(trace.load_events(run.file(trace_file(variant))), k.correlation)
    return k.assign(call=k.correlation.map(paths).fillna(k.op.str.removeprefix("aten::")))


# What an operator the static cache adds or removes is there for, by its call path (transformers
# 5.17's StaticLayer.update and sdpa_attention_forward); a path not listed gets no explanation.
STATIC_CACHE_CALLS = [
    (
        r"(^|› )reshape › clone › copy_$",
        "K and V copied out to every query head (transformers' repeat_kv, taken when attention has a mask)",
    ),
    (r"^index_copy_$", "the new token's K and V written into the cache"),
    (r"^scaled_dot_product_attention › .*(where|fill_)$", "the mask made additive (0 / -inf) inside SDPA"),
    (r"attention_forward$", "attention over every slot of the cache, masked"),
    (r"^cat$", "K and V appended by concatenation (the rest: rotary embedding)"),
    (r"^add_$", "each layer's write counter advanced"),
    (r"^(arange|arange › arange|add)$", "positions: the write index and the mask's"),
    (r"^le$", "the mask: positions compared"),
]


def what_call(call: str) -> str:
    """What the operator at the end of a call path is there for (STATIC_CACHE_CALLS), or ""."""
    return next((text for pattern, text in STATIC_CACHE_CALLS if re.search(pattern, call)), "")


def static_cache_diff(run: runs.Run, min_us: float = 20.0) -> pd.DataFrame:
    """The eager step with transformers' dynamic cache against the same step with a static
    cache, from their profiled traces: kernels and GPU time by call path (call_paths), only the
    paths whose kernel count differs or whose GPU time differs by `min_us` or more; then one row
    for every other path together (timing noise between two profiles) and a total. Column
    `row` says which a row is: "differs", "rest" or "total"."""

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
    out = pd.DataFrame(
        {
            "row": "differs",
            "call path": rows.index,
            "what it is": [what_call(c) for c in rows.index],
            "eager kernels": rows["kernels eager"].values,
            "static kernels": rows["kernels static"].values,
            "Δ kernels": rows.d_kernels.values,
            "eager µs": rows["ns eager"].values / 1e3,
            "static µs": rows["ns static"].values / 1e3,
            "Δ µs": rows.d_ns.values / 1e3,
        }
    )
    tail = pd.DataFrame(
        [
            {
                "row": "rest",
                "call path": f"every other path ({int((~shown).sum())})",
                "what it is": "the same kernels in both steps",
                "eager kernels": rest["kernels eager"],
                "static kernels": rest["kernels static"],
                "Δ kernels": rest.d_kernels,
                "eager µs": rest["ns eager"] / 1e3,
                "static µs": rest["ns static"] / 1e3,
                "Δ µs": rest.d_ns / 1e3,
            },
            {
                "row": "total",
                "call path": "total",
                "what it is": "",
                "eager kernels": d["kernels eager"].sum(),
                "static kernels": d["kernels static"].sum(),
                "Δ kernels": d.d_kernels.sum(),
                "eager µs": d["ns eager"].sum() / 1e3,
                "static µs": d["ns static"].sum() / 1e3,
                "Δ µs": d.d_ns.sum() / 1e3,
            },
        ]
    )
    out = pd.concat([out, tail], ignore_index=True)
    for c in ("eager kernels", "static kernels", "Δ kernels"):
        out[c] = out[c].astype(int)
    return out


@dataclass
class StaticCacheSummary:
    eager_kernels: int
    static_kernels: int
    eager_busy_ms: float  # union of kernel intervals, as in variants.csv
    static_busy_ms: float
    graph_busy_ms: float | None  # the CUDA graph of the static step (same kernels), if it ran
    layers: int
    eager_layer_kernels: int  # kernels of the middle decoder layer
    static_layer_kernels: int
    eager_attn_kernels: int  # of which in self-attention
    static_attn_kernels: int
    eager_outside_kernels: int  # kernels outside the decoder layers
    static_outside_kernels: int


def static_cache_summary(run: runs.Run) -> StaticCacheSummary:
    """Kernel counts of the two eager steps, whole, per decoder layer (the middle one) and in
    its self-attention, and outside the layers; GPU-busy of each (and of the CUDA graph)."""
    v = run.table("variants").set_index("variant")
    a, b = kernel_table(run, "eager"), kernel_table(run, "eager-static")
    layers = run.results["model"]["layers"]

    def layer(k):
        if not k.layer.notna().any():
            return k.head(0)
        return k[k.layer == int(k.layer.max()) // 2]

    la, lb = layer(a), layer(b)
    graph = v.loc["cuda-graph"] if "cuda-graph" in v.index else None
    graph_ok = graph is not None and graph.status == "ok"
    return StaticCacheSummary(
        eager_kernels=len(a),
        static_kernels=len(b),
        eager_busy_ms=kernels.gpu_busy_ns(a) / 1e6,
        static_busy_ms=kernels.gpu_busy_ns(b) / 1e6,
        graph_busy_ms=float(graph.gpu_busy_ns) / 1e6 if graph_ok else None,
        layers=layers,
        eager_layer_kernels=len(la),
        static_layer_kernels=len(lb),
        eager_attn_kernels=int((la.part == "self_attn").sum()),
        static_attn_kernels=int((lb.part == "self_attn").sum()),
        eager_outside_kernels=int(a.layer.isna().sum()),
        static_outside_kernels=int(b.layer.isna().sum()),
    )
