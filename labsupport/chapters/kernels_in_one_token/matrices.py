"""The weight matrices of the step by shape (how close each one's kernels come to the memory
ceiling), and what the KV cache costs at longer contexts (dynamic against static cache)."""

from __future__ import annotations

import pandas as pd

from labsupport import runs
from labsupport.chapters.kernels_in_one_token.analysis import kernel_table
from labsupport.measure import hardware
from labsupport.traces import kernels

# The weight matrices of a decoder layer and the LM head, by the name of their module.
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "lm_head")


def projection_shapes(preset: str) -> dict[str, tuple[int, int]]:
    """(rows, columns) of each weight matrix of a Qwen3-style model, from its configuration: the
    preset's shapes (models.weight_shapes), k/v and gate/up each under its own module's name."""
    from labsupport.measure import models

    s = models.weight_shapes(models.preset_config(preset))
    kv, gate_up = s["k_proj / v_proj"], s["gate_proj / up_proj"]
    return {
        "q_proj": s["q_proj"],
        "k_proj": kv,
        "v_proj": kv,
        "o_proj": s["o_proj"],
        "gate_proj": gate_up,
        "up_proj": gate_up,
        "down_proj": s["down_proj"],
        "lm_head": s["lm_head"],
    }


def run_shapes(run: runs.Run) -> tuple[dict[str, tuple[int, int]], int]:
    """The weight matrices of the run's model by projection, and the bytes of one weight: its
    preset's (two), or, for a model folder profiled (labsupport.ops.profile), what it recorded of
    the model itself (results.model_source)."""
    src = run.results.get("model_source")
    if src is None:
        return projection_shapes(run.parameters["preset"]), 2
    return {name: (int(n), int(k)) for name, (n, k) in src["matrices"].items()}, int(src["bytes_per_parameter"])


GEMV_COLUMNS = (
    "projection", "shape", "bytes", "calls", "us_per_call", "tbs", "kernel", "split_k", "of_datasheet", "of_measured"
)  # fmt: skip


def gemv_by_shape(run: runs.Run) -> pd.DataFrame:
    """Every weight matrix of the step by shape: bytes it holds, its kernels' time per call
    (the matrix-vector kernel plus cuBLAS's split-K reduction where there is one), the read
    bandwidth that makes, and which kernel cuBLAS chose."""
    k = kernel_table(run)
    mm = k[k.kind == "matrix multiply"].copy()
    mm["projection"] = mm.module.str.extract(r"(?:^|\.)(\w+)$")[0]
    shapes, per_weight = run_shapes(run)
    mm = mm[mm.projection.isin([p for p in PROJECTIONS if p in shapes])]
    mm["call"] = mm.layer.astype("string").fillna("") + ":" + mm.projection
    lim = hardware.run_limits(run)
    rows = []
    for proj, g in mm.groupby("projection", sort=False):
        per_call = g.groupby("call").dur_ns.sum()
        main = g[~g.name.str.contains("splitKreduce")]
        rows_, cols = shapes[proj]
        nbytes = rows_ * cols * per_weight
        us = float(per_call.median()) / 1e3
        rows.append(
            {
                "projection": proj,
                "shape": f"{rows_:,} x {cols:,}",
                "bytes": nbytes,
                "calls": len(per_call),
                "us_per_call": us,
                "tbs": nbytes / (us * 1e-6) / 1e12,
                "kernel": kernels.short_name(min(main.name.mode()), width=48),  # the most common kernel
                "split_k": bool(g.name.str.contains("splitKreduce").any()),
                "of_datasheet": hardware.of_bandwidth(nbytes, us / 1e3, lim.datasheet_tbs),
                "of_measured": hardware.of_bandwidth(nbytes, us / 1e3, lim.ceiling_tbs),
            }
        )
    order = {p: i for i, p in enumerate(PROJECTIONS)}
    if not rows:  # a model whose matrices have other names (GPT-2's fused c_attn)
        return pd.DataFrame(columns=list(GEMV_COLUMNS))
    return pd.DataFrame(rows).sort_values("projection", key=lambda s: s.map(order)).reset_index(drop=True)


def kv_bytes_per_token(run: runs.Run) -> int:
    """Bytes of keys and values one token adds to the cache, over all layers: the run's model's
    (source.run_shape: its preset's, or its model folder's), in its bytes a value (run_shapes)."""
    from labsupport.measure.models import source

    return source.kv_bytes_per_position(source.run_shape(run), run_shapes(run)[1])


def kv_cache_traffic(run: runs.Run) -> pd.DataFrame:
    """Per context: the KV cache's size; what transformers' dynamic cache does with it every
    step (concatenate the new token: read the whole cache and write it again, 2x its bytes)
    and what attention does (read it once); the time and bandwidth of each; and, where the run
    measured it, the same step with a static cache, which writes the new token in place.

    `cat ms` is every concatenation in the step (aten::cat); at long contexts they are almost
    all the cache's (the rotary embedding's small ones stay constant)."""
    s = run.table("context_sweep")
    s = s[s.status == "ok"].copy()
    per_token = kv_bytes_per_token(run) * int(run.parameters.get("batch", 1))
    out = pd.DataFrame({"context": s.context})
    out["cache GB"] = s.context * per_token / 1e9
    out["concat GB moved"] = 2 * out["cache GB"]
    out["copy ms"] = s.copy_ns / 1e6 if "copy_ns" in s else census_copy_ms(run, s.context)
    out["cat ms"] = s.cat_ns / 1e6 if "cat_ns" in s else float("nan")
    out["concat TB/s"] = out["concat GB moved"] / out["cat ms"]
    out["attention ms"] = s.attention_ns / 1e6
    out["attention TB/s"] = out["cache GB"] / out["attention ms"]
    out["GPU ms, dynamic"] = s.kernel_ns / 1e6
    has_static = "static_kernel_ns" in s
    out["GPU ms, static"] = s.static_kernel_ns / 1e6 if has_static else float("nan")
    out["cat ms, static"] = s.static_cat_ns / 1e6 if has_static else float("nan")
    out["copy ms, static"] = s.static_copy_ns / 1e6 if has_static else float("nan")
    out["attention ms, static"] = s.static_attention_ns / 1e6 if has_static else float("nan")
    out["wall ms, dynamic"] = s.wall_ms_min  # the minimum of the trials, the book's estimator
    out["wall ms, static"] = s.static_wall_ms_min if has_static else float("nan")
    return out.reset_index(drop=True)


def census_copy_ms(run: runs.Run, contexts) -> list[float]:
    """Copy/convert/concat time per context from the context census (runs before `copy_ns`)."""
    c = run.table("context_census")
    c = c[c.kind == "copy/convert/concat"].set_index("context")
    return [float(c.gpu_ns.get(x, float("nan"))) / 1e6 for x in contexts]
