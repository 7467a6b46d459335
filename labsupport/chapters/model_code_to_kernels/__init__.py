"""Chapter "From model code to kernels": the three-line MLP and RMSNorm at Qwen3-8B
shapes, profiled line by line, RMSNorm as one fused kernel, and a whole decoder layer of the
recorded decode step (the run of "The kernels in one token"), operator by operator.

The notebook measures (live) with the harness and the helpers here: every time is taken
before the first profile of the process, then the profiles. The rest reads a run back, and
`page` gives every number and text the page glues, and its tables."""

from __future__ import annotations

import pandas as pd

from labsupport import runs
from labsupport.chapters.kernels_in_one_token.declaration import DECLARATION as DECODE_CHAPTER  # noqa: F401 (its run)
from labsupport.measure import harness
from labsupport.traces import kernels, trace

from .declaration import DECLARATION, Params  # noqa: F401 (Params: the package's, for its notebook)

CHAPTER, load, progress = DECLARATION.slug, DECLARATION.load, DECLARATION.progress  # its declaration's
# The MLP's three lines: each is the profiler annotation around it and the key of its rows.
MLP_LINES = GATE, UP, ACT = ("gate = x @ W_gate", "up = x @ W_up", "h = silu(gate) * up")
# The three RMSNorms: the key of the rows of rmsnorm_times and rmsnorm_kernels.
AS_WRITTEN, F_RMS_NORM, OURS = "transformers (as written)", "torch.nn.functional.rms_norm", "ours (one Triton kernel)"
# The recorded decode step this chapter reads a decoder layer from.
DECODE_TRACE = "trace.json.gz"  # of DECODE_CHAPTER's runs
# What the live run takes from a model folder's configuration (source.chapter_config): a model without them is refused.
MODEL_NEEDS = {
    "hidden_size": "the hidden size (the MLP's input, RMSNorm's width)",
    "intermediate_size": "the MLP's intermediate size (its gate and up projections)",
    "rms_norm_eps": "an RMSNorm (its epsilon)",
}


def mlp_bytes(hidden: int, inter: int, tokens: int, elem: int = 2) -> dict:
    """Bytes each line must move at least (inputs read once, outputs written once)."""
    return {
        GATE: (inter * hidden + tokens * hidden + tokens * inter) * elem,
        UP: (inter * hidden + tokens * hidden + tokens * inter) * elem,
        ACT: 3 * tokens * inter * elem,
    }


def per_call(t: harness.Timing) -> pd.Series:
    """Times per call in ms: CUDA events around each call (the host clock on a CPU)."""
    return pd.Series(t.gpu_ms or t.wall_ms, dtype=float)


def spread(ms: pd.Series, prefix: str, scale: float = 1.0) -> dict:
    """The minimum (the book's estimator), the quartiles, the median and the maximum of per-call
    times, scaled (1e3: ms to µs), under `prefix` (us_min, us_q1, ...)."""
    v = ms * scale
    return {
        f"{prefix}_median": float(v.median()),
        f"{prefix}_min": float(v.min()),
        f"{prefix}_q1": float(v.quantile(0.25)),
        f"{prefix}_q3": float(v.quantile(0.75)),
        f"{prefix}_max": float(v.max()),
    }


def mlp_table(run: runs.Run) -> pd.DataFrame:
    """Each line of the MLP: its kernels, their time, and the bytes the line must move."""
    k = _kernels(run, "mlp_kernels")
    nbytes = run.results["mlp"]["bytes"]
    rows = []
    for line in MLP_LINES:
        sub = k[k.module == line]
        us = sub.dur_ns.sum() / 1e3
        rows.append(
            {
                "line": line,
                "kernels": len(sub),
                "kernel names": "; ".join(sub.name.map(kernels.short_name)),
                "GPU µs": us,
                "MB moved": nbytes[line] / 1e6,
                "GB/s": nbytes[line] / (us * 1e-6) / 1e9 if us else float("nan"),
            }
        )
    return pd.DataFrame(rows)


def _kernels(run: runs.Run, table: str) -> pd.DataFrame:
    """A kernel table of the run, kinds by today's rules."""
    k = run.table(table)
    k["kind"] = k.name.map(kernels.classify)
    return k


def mlp_kernels(run: runs.Run) -> pd.DataFrame:
    k = _kernels(run, "mlp_kernels")
    return pd.DataFrame(
        {
            "line": k.module,
            "operator": k.op,
            "kernel": k.name.map(kernels.short_name),
            "kind": k.kind,
            "µs": k.dur_ns / 1e3,
        }
    )


def rmsnorm_kernels(run: runs.Run, variant: str = AS_WRITTEN) -> pd.DataFrame:
    """The kernels of one RMSNorm variant, in order, with the step of the math each does."""
    k = _kernels(run, "rmsnorm_kernels")
    k = k[k.variant == variant]
    out = pd.DataFrame(
        {
            "operator": k.op,
            "kernel": k.name.map(lambda n: kernels.short_name(n, 46)),
            "kind": k.kind,
            "µs": (k.dur_ns / 1e3).round(2),
        }
    ).reset_index(drop=True)
    if list(out.operator) == [op for op, _ in RMSNORM_AS_WRITTEN]:
        out["step"] = [step for _, step in RMSNORM_AS_WRITTEN]
    return out


# transformers' Qwen3RMSNorm.forward, operator by operator, and what each step computes.
RMSNORM_AS_WRITTEN = [
    ("aten::copy_", "convert BF16 → float32"),
    ("aten::pow", "square"),
    ("aten::mean", "mean"),
    ("aten::add", "add epsilon"),
    ("aten::rsqrt", "reciprocal square root"),
    ("aten::mul", "multiply by it"),
    ("aten::copy_", "convert float32 → BF16"),
    ("aten::mul", "multiply by the weight"),
]


def decode_kernels(decode_run: runs.Run) -> pd.DataFrame:
    """Every kernel of the recorded decode step, read from its trace, with the decoder layer
    and the module that launched each."""
    device = decode_run.provenance.get("device", "cuda")
    return kernels.annotate(trace.read_kernels(decode_run.file(DECODE_TRACE), device=device))


def kernels_per_layer(k: pd.DataFrame) -> int:
    """The number of kernels most decoder layers launch (a kernel table with `layer`)."""
    return int(k.dropna(subset=["layer"]).groupby("layer").size().value_counts().idxmax())


def middle_layer(decode_run: runs.Run) -> int:
    return int(decode_run.results["model"]["layers"]) // 2


def op_to_kernels(k: pd.DataFrame, layer: int) -> pd.DataFrame:
    """For each module of one decoder layer, each operator and the kernels it became (a
    kernel table of a decode step, decode_kernels)."""
    k = k[k.layer == layer]
    k = k.assign(module=k.module.str.replace(rf"^layers\.{layer}\.?", "", regex=True).replace("", "(layer)"))
    g = (
        k.groupby(["module", "op"], sort=False)
        .agg(
            kernels=("name", "size"),
            names=("short_name", lambda s: "; ".join(dict.fromkeys(s))),
            us=("dur_ns", lambda s: s.sum() / 1e3),
        )
        .reset_index()
    )
    return g.rename(columns={"op": "operator", "names": "kernel(s)", "us": "GPU µs"})


def headline(run: runs.Run) -> dict:
    t = run.table("rmsnorm_times").set_index("variant")
    mlp = mlp_table(run)
    return {
        "MLP kernels": int(mlp.kernels.sum()),
        "RMSNorm kernels": int(t.loc[AS_WRITTEN, "kernels"]),
        "RMSNorm µs": float(t.loc[AS_WRITTEN, "us_min"]),
        "fused RMSNorm µs": float(t.loc[OURS, "us_min"]),
    }


def rmsnorm_table(run: runs.Run) -> pd.DataFrame:
    """Each RMSNorm variant: kernels, their GPU time (profiler), time per call from Python
    (CUDA events around the call, the variants timed interleaved: the least of the calls, the
    book's estimator; the median beside it), and its largest difference from transformers' output."""
    t = run.table("rmsnorm_times")
    return kernels.variant_times(run.table("rmsnorm_kernels"), t, "us_min").assign(
        **{"median µs": t.us_median, "max |difference|": t.max_abs_diff_vs_transformers}
    )


from .page import TABLE_FORMATS, Page, gemm_text, page  # noqa: E402, F401 (public names; page.py reads those above)
