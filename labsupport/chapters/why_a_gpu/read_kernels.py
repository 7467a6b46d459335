"""The kernels that read the decode step's weights, timed at every weight matrix the step reads (the
LM head included): the book's own Triton GEMV (labsupport.measure.kernels.gemv) with each configuration its
tuner chooses from (gemv.CANDIDATES, as *Closing the gap* tunes it), and cuBLAS as F.linear calls it
(torch.mm). On Hopper and later the GEMV is timed a second way, as the last rungs of *Closing the gap*
launch it: with programmatic dependent launch and its first weights loaded before its wait, so that each
call's first loads overlap the call before it. (Timed plainly only, the ceiling was one that the GEMV beat
in *Closing the gap*'s tuning on an H200: 4.56 TB/s launched so, against 4.36.) Each is timed as *Closing
the gap* times them, per call inside a CUDA graph, each call on another copy of the weight so that none is
read from L2 (gemv.time_per_call_us: CUDA events around the graph's replays, hardware.time_cuda_ms). Their
best read rate, with the read stream's, is the practical ceiling (hardware.practical_ceiling); the table is
the run's `read_kernels.csv`."""

from __future__ import annotations

import pandas as pd

from labsupport.measure import hardware, models

from .declaration import DECLARATION

TRITON, CUBLAS = "Triton GEMV", "cuBLAS (torch.mm)"
TRITON_EARLY = "Triton GEMV, dependent launch + weights first"  # fused_call's `early`
COLUMNS = DECLARATION.columns_of(f"{hardware.READ_KERNELS}.csv")  # as its declaration names them


# What the read kernels take from a model folder's configuration (source.chapter_config).
MODEL_NEEDS = {
    "hidden_size": "the hidden size (the weight matrices' shapes)",
    "intermediate_size": "the MLP's intermediate size (the weight matrices' shapes)",
    "num_attention_heads": "the attention heads (the weight matrices' shapes)",
    "vocab_size": "the vocabulary (the LM head's shape)",
}


def step_matrices(config: dict | str) -> dict[str, tuple[int, int]]:
    """The distinct weight shapes (rows N, columns K) one token's matmuls read in a decode step of
    the model of `config` (a preset's name, or a configuration: a model folder's from
    source.chapter_config), separate and fused as the book's own step runs them, and the LM head;
    matrices of one shape share a row, named together."""
    named = models.weight_shapes(models.preset_config(config) if isinstance(config, str) else config)
    by_shape: dict[tuple[int, int], list[str]] = {}
    for name, shape in named.items():
        by_shape.setdefault(shape, []).append(name)
    return {", ".join(names): shape for shape, names in by_shape.items()}


def config_text(c) -> str:
    """A GEMV configuration as the table names it."""
    split = f", split-K {c.split_k}" if c.split_k > 1 else ""
    return f"{c.block_n} rows x {c.block_k}, {c.num_warps} warps, {c.num_stages} stages{split}"


def row(kernel: str, matrix: str, n: int, k: int, config: str, us: float, element_bytes: int = 2) -> dict:
    """One timed kernel at one shape: its bytes read (the weight's) and its rate."""
    nbytes = n * k * element_bytes
    return {"kernel": kernel, "matrix": matrix, "n": n, "k": k, "config": config, "bytes": nbytes,
            "ms": us / 1e3, "tbs": nbytes / us / 1e6}  # fmt: skip


def table(rows: list[dict]) -> pd.DataFrame:
    """The run's read_kernels table."""
    return pd.DataFrame(rows, columns=list(COLUMNS))


def cublas_call():
    """A call(x, w) for gemv.time_per_call_us: one token's product as F.linear runs it (cuBLAS), into
    an output made on the first (warm-up) call, outside the CUDA graph's capture."""
    import torch

    out = []

    def call(x, w):
        if not out:
            out.append(torch.empty(x.shape[0], w.shape[0], device=x.device, dtype=x.dtype))
        torch.mm(x, w.t(), out=out[0])

    return call


def time_read_kernels(config: dict | str, dtype: str = "bfloat16", repeats: int = 20, progress=print) -> pd.DataFrame:
    """Time cuBLAS and the Triton GEMV (every candidate configuration, and on Hopper each again with
    dependent launch and weights first) on each weight shape of the step (step_matrices), on the
    current CUDA device; the read_kernels table."""
    import torch

    from labsupport.measure.kernels import gemv

    half = getattr(torch, dtype)
    rows = []
    for name, (n, k) in step_matrices(config).items():
        us = gemv.time_per_call_us(n, k, cublas_call(), repeats=repeats, dtype=half)
        rows.append(row(CUBLAS, name, n, k, "", us))
        first = len(rows)
        for kernel, early in ((TRITON, False), (TRITON_EARLY, True))[: 1 + hardware.dependent_launch()]:
            for c in gemv.CANDIDATES:
                call = gemv.fused_call(n, k, gemv.PLAIN, c, dtype=half, early=early)
                us = gemv.time_per_call_us(n, k, call, repeats, dtype=half)
                rows.append(row(kernel, name, n, k, config_text(c), us))
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        mine = table(rows[first - 1 :])
        best = mine.loc[mine.tbs.idxmax()]
        progress(f"  {name} {n}x{k}: best read {best.tbs:.2f} TB/s, {best.kernel} {best.config}")
    return table(rows)


def record_read_kernels(w, config: dict | str, dtype: str = "bfloat16", progress=print) -> pd.DataFrame:
    """Time the read kernels and write them as the run's read_kernels table (returned)."""
    progress("timing the GEMVs of the decode step's weight matrices (cuBLAS, and our Triton GEMV's configurations)")
    t = time_read_kernels(config, dtype, progress=progress)
    w.write_table(hardware.READ_KERNELS, t)
    top = t.loc[t.tbs.idxmax()]
    progress(f"  fastest read: {top.tbs:.2f} TB/s ({top.kernel} {top.config}, {top.matrix})")
    return t
