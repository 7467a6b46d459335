"""The roofline of every matrix multiply of both passes: one point per weight matrix and
phase (its kernels summed over the decoder layers), each whole pass as one point, the roofs
they sit under, and each phase's cluster of points summarised for the prose."""

from __future__ import annotations

import re
from dataclasses import dataclass

import pandas as pd

from labsupport import runs

from .names import GEMM_MODULES, LM_HEAD, MATMUL, PHASES, ROOFLINE_MODULES, SHORT
from .phases import phases
from .tables import bandwidth, kernel_table, limits, measured_ridge, shape


def attainable(flop_per_byte, tflops: float | None, tbs: float | None):
    """The most TFLOP/s work at `flop_per_byte` can reach under a roof of `tflops` (math) and
    `tbs` (memory): min(tflops, tbs × FLOP per byte). NaN where either limit is unknown."""
    import numpy as np

    x = np.asarray(flop_per_byte, dtype=float)
    return np.minimum(tflops, tbs * x) if tflops and tbs else np.full_like(x, float("nan"))


def _hidden(run: runs.Run) -> int:
    shapes = run.results["gemm_shapes"]
    return int(shapes["mlp.down_proj"][1] if "mlp.down_proj" in shapes else shapes["self_attn.o_proj"][1])


def gemm_points(run: runs.Run) -> pd.DataFrame:
    """The points of the roofline: one row per weight matrix (the seven of a decoder layer,
    and the LM head) and phase, its kernels summed over every decoder layer.

    rows      = tokens that go through the matrix: the prompt for a decoder layer's matrix in
                prefill, 1 in decode, and 1 for the LM head in both phases (a prefill asks for
                the logits of its last token only);
    instances = decoder layers whose kernels for that matrix the profile holds (1 for the LM head);
    FLOPs     = instances × 2 × rows × in × out;
    bytes     = instances × bytes per value × (in × out + rows × in + rows × out): the weight,
                the input and the output, each moved once (the least traffic; a split-K
                kernel's partial sums add to it, unseen here);
    time      = the matrix-multiply kernels launched by that matrix (a split-K reduction included).

    `roof_*` is the most TFLOP/s at that FLOP per byte (attainable()) under the datasheet's
    ceilings and under those measured in the run (GEMM rate, bandwidth()); `of_*_roof` the
    share of it reached. Below the ridge the roof is the bandwidth slope, so that share is the
    share of the bandwidth reached; above it, the share of the peak FLOP/s."""
    shapes = run.results["gemm_shapes"]
    sh, lim = shape(run), limits(run)
    p = sh.bytes_per_value
    hidden = _hidden(run)
    n = int(run.parameters["prompt_len"])
    rows = []
    for ph in PHASES:
        k = kernel_table(run, ph)
        k = k[k.kind == MATMUL]
        for mod in ROOFLINE_MODULES:
            if mod == LM_HEAD:
                fin, fout, m_rows = hidden, sh.lm_head_parameters // hidden, 1
                g = k[k.module == LM_HEAD]
                instances = 1 if len(g) else 0
            elif mod in shapes:
                (fin, fout), m_rows = shapes[mod], (n if ph == "prefill" else 1)
                g = k[k.module.str.fullmatch(rf"layers\.\d+\.{re.escape(mod)}")]
                instances = int(g.layer.nunique())
            else:
                continue
            ns = int(g.dur_ns.sum())
            flops = instances * 2 * m_rows * fin * fout
            nbytes = instances * p * (fin * fout + m_rows * (fin + fout))
            names = g.groupby("short_name").dur_ns.sum().sort_values(ascending=False)
            rows.append(
                {
                    "phase": ph,
                    "module": mod,
                    "rows": m_rows,
                    "in": fin,
                    "out": fout,
                    "instances": instances,
                    "kernels": len(g),
                    "kernel": names.index[0] if len(names) else "",
                    "split_k": bool(g.short_name.str.contains("splitK", case=False).any()),
                    "dur_ns": ns,
                    "flops": flops,
                    "bytes": nbytes,
                    "flop_per_byte": flops / nbytes if nbytes else float("nan"),
                    "tflops": flops / ns / 1e3 if ns else float("nan"),
                    "tbs": nbytes / ns / 1e3 if ns else float("nan"),
                }
            )
    out = pd.DataFrame(rows)
    out["roof_datasheet"] = attainable(out.flop_per_byte, lim.datasheet_tflops, lim.datasheet_tbs)
    out["roof_measured"] = attainable(out.flop_per_byte, lim.gemm_tflops, bandwidth(lim).tbs)
    out["of_datasheet_roof"] = out.tflops / out.roof_datasheet
    out["of_measured_roof"] = out.tflops / out.roof_measured
    return out


def pass_points(run: runs.Run) -> pd.DataFrame:
    """Each whole pass as one point of the roofline: model FLOPs over FLOP per byte (phases()),
    at the rate reached on GPU-busy time (every kernel, not only the matrix multiplies)."""
    lim = limits(run)
    out = pd.DataFrame(
        [{"phase": ph, "flop_per_byte": x.flop_per_byte, "tflops": x.tflops_busy} for ph, x in phases(run).items()]
    )
    out["roof_datasheet"] = attainable(out.flop_per_byte, lim.datasheet_tflops, lim.datasheet_tbs)
    out["roof_measured"] = attainable(out.flop_per_byte, lim.gemm_tflops, bandwidth(lim).tbs)
    return out


@dataclass
class RooflineCluster:
    """The points of one phase's matrix multiplies on the roofline, summarised for the prose
    (the prefill's LM head, one row like decode's, is left out of the prefill's cluster)."""

    phase: str
    points: int
    fpb_min: float
    fpb_max: float
    tflops_min: float
    tflops_max: float
    tbs_min: float
    tbs_max: float
    of_datasheet_min: float
    of_datasheet_max: float
    of_measured_min: float
    of_measured_max: float
    matmul_share: float  # share of the phase's matrix-multiply kernel time in its points (all)
    bound: str  # "memory" or "compute": every point below / above the datasheet ridge
    slowest: str  # the matrix furthest below its roof (datasheet)
    fastest: str
    others: str  # modules of the phase's other matrix-multiply kernels ("" if none)


def roofline_clusters(run: runs.Run) -> dict[str, RooflineCluster]:
    pts, lim = gemm_points(run), limits(run)
    ridge = lim.datasheet_ridge or measured_ridge(lim)
    out = {}
    for ph in PHASES:
        allp = pts[pts.phase == ph]
        x = allp[~((allp.module == LM_HEAD) & (allp.rows < allp.rows.max()))]
        mm = kernel_table(run, ph)
        mm = mm[mm.kind == MATMUL]
        mm_ns = mm.dur_ns.sum()
        covered = mm.module.str.fullmatch(rf"layers\.\d+\.({'|'.join(map(re.escape, GEMM_MODULES))})") | (
            mm.module == LM_HEAD
        )
        rest = mm[~covered]
        key = "of_datasheet_roof" if x.of_datasheet_roof.notna().any() else "of_measured_roof"
        below = bool(ridge) and (x.flop_per_byte < ridge).all()
        above = bool(ridge) and (x.flop_per_byte > ridge).all()
        out[ph] = RooflineCluster(
            phase=ph,
            points=len(x),
            fpb_min=x.flop_per_byte.min(),
            fpb_max=x.flop_per_byte.max(),
            tflops_min=x.tflops.min(),
            tflops_max=x.tflops.max(),
            tbs_min=x.tbs.min(),
            tbs_max=x.tbs.max(),
            of_datasheet_min=x.of_datasheet_roof.min(),
            of_datasheet_max=x.of_datasheet_roof.max(),
            of_measured_min=x.of_measured_roof.min(),
            of_measured_max=x.of_measured_roof.max(),
            matmul_share=allp.dur_ns.sum() / mm_ns if mm_ns else float("nan"),
            bound="memory" if below else "compute" if above else "mixed",
            slowest=SHORT[x.loc[x[key].idxmin(), "module"]] if x[key].notna().any() else "",
            fastest=SHORT[x.loc[x[key].idxmax(), "module"]] if x[key].notna().any() else "",
            others="; ".join(
                f"`{m or 'no module'}` ({len(g)} kernel{'s' if len(g) > 1 else ''}, {g.dur_ns.sum() / 1e3:,.1f} µs)"
                for m, g in rest.groupby("module", sort=False)
            ),
        )
    return out


def roofline_table(run: runs.Run) -> pd.DataFrame:
    """gemm_points() laid out for reading: one row per matrix, the phases side by side: rows
    (the prefill's; decode's are 1), FLOP per byte, the rate that matters for the phase
    (TFLOP/s in the prefill, TB/s in decode, where one FLOP per byte makes the two the same
    number) and its share of the datasheet's roof at that intensity. Indexed by module (SHORT
    names them for display)."""
    pts = gemm_points(run)
    out = {}
    for ph in PHASES:
        x = pts[pts.phase == ph].set_index("module")
        if ph == "prefill":
            out[(ph, "rows")] = x["rows"]
        out[(ph, "FLOP/byte")] = x["flop_per_byte"]
        if ph == "prefill":
            out[(ph, "TFLOP/s")] = x["tflops"]
        else:
            out[(ph, "TB/s")] = x["tbs"]
        out[(ph, "of roof")] = x["of_datasheet_roof"]
    first = pts[pts.phase == PHASES[0]].set_index("module")
    t = pd.DataFrame(out)
    t.columns = pd.MultiIndex.from_tuples(t.columns)
    t.insert(0, ("weight", "in × out"), [f"{a:,} × {b:,}" for a, b in zip(first["in"], first["out"], strict=True)])
    t.index.name = "module"
    return t
