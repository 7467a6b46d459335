"""The kernels of a recorded run: each variant's kernel table, and its census by kind, by part
of the model, by layer type, inside one Gated DeltaNet layer, and the LM head."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from labsupport import runs
from labsupport.chapters.hybrid_model_token.keys import GROUPS, OUTSIDE, trace_file, wall_column
from labsupport.chapters.hybrid_model_token.tables import limits
from labsupport.traces import kernels, trace


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
