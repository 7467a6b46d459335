"""The page of "Closing the gap": every number and sentence its markdown glues (Page, one field per
glue name; the sentences come from prose.py) and the frames its figure and table cells show, from
a run and the shared quantities."""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

from labsupport import runs
from labsupport.chapters import published
from labsupport.chapters.closing_the_gap import prose
from labsupport.chapters.closing_the_gap.analysis import (
    Floor,
    best,
    best_fp8,
    census_by_rung,
    compiled_matmuls,
    fidelity_table,
    floor,
    fp8_floor,
    kernel_table,
    kv_positions,
    ladder,
    matmul_launches,
    matmuls,
    next_to_published,
    remaining,
    step_bytes,
    time_split,
    tokens_per_forward,
    tuning,
)
from labsupport.chapters.closing_the_gap.kernel_time import costlier_rungs, kernel_groups
from labsupport.chapters.closing_the_gap.params import FP8_RUNGS, RUNG_SHORT, RUNGS, SHARED_RUNGS, trace_file
from labsupport.chapters.closing_the_gap.split_k import split_k_text
from labsupport.glue import NOT_GLUED

YES_NO = {True: "yes", False: "no"}
# The formats of the tables whose columns this module names.
LADDER_FORMATS = {"ms saved": "{:.2f}", "TB/s": "{:.2f}", "× floor": "{:.2f}", "× ceiling": "{:.2f}"}
FIDELITY_FORMATS = {"max |Δ logit| vs eager": "{:.3f}", "max error vs float32": "{:.3f}", "error / eager's": "{:.2f}"}
FP8_FORMATS = dict.fromkeys(["GB read", "its floor ms", "ms", "× its floor", "TB/s"], "{:.2f}")
TOKENS_FORMATS = dict.fromkeys(["ms per forward", "median", "ms per token"], "{:.3f}")
TOKENS_FORMATS |= {"forward × floor": "{:.2f}", "token × floor": "{:.2f}", "tokens/s": "{:,.0f}", "compile s": "{:.1f}"}
MATMUL_FORMATS = {"MB": "{:,.0f}", "cuBLAS µs": "{:.1f}", "ours µs": "{:.1f}", "cuBLAS TB/s": "{:.2f}"}
MATMUL_FORMATS |= {"ours TB/s": "{:.2f}", "ours faster by": "{:.2f}×"}
LAUNCH_FORMATS = {"blocks": "{:,.0f}", "shared KB": "{:.0f}", "grid / SMs": "{:.2f}", "µs": "{:.1f}"}
GROUP_COLUMNS = ["kernel", "weight", "kernels", "µs", "exclusive µs", "µs per kernel", "share", "MB", "TB/s"]
GROUP_COLUMNS += ["TB/s exclusive"]
GROUP_FORMATS = {"µs": "{:,.1f}", "exclusive µs": "{:,.1f}", "µs per kernel": "{:.1f}", "share": "{:.1%}"}
GROUP_FORMATS |= {"MB": "{:,.0f}", "TB/s": "{:.2f}", "TB/s exclusive": "{:.2f}"}
STEP_BYTES_FORMATS = {"MB": "{:,.1f}", "ms at the datasheet": "{:.3f}", "ms at the ceiling": "{:.3f}"}


@dataclass
class Page:
    """The ladder from eager to near the floor (the best rung that gives eager's answers, against
    the floor and the practical ceiling), same answers, the FP8 rungs against their own floor, several
    tokens per forward, the matmuls shape by shape, fewer kernels and where the remaining time goes."""

    run_label: str
    prompt_len: int
    failed_text: str
    # the best rung that gives eager's answers
    best: str
    best_wall: float
    best_median: float
    best_x: float
    best_x_ceiling: float
    best_tbs: float
    best_kernels: int
    best_busy: float
    best_idle: float
    speedup: float
    split_k_text: str
    costlier_text: str
    # same answers
    tolerance_text: str
    fp8_tolerance_text: str
    eager_err: float
    max_logit: float
    token_note: str
    check_note: str
    repeat_note: str
    fp8_rounding_text: str
    # FP8 weights, tokens per forward, the matmuls, compile
    fp8_text: str
    fp8_launch_text: str
    tokens_text: str
    matmul_text: str
    launch_text: str
    compile_matmul_text: str
    # where the remaining time goes (by exclusive time), and the step's bytes with its KV cache
    rem_span: float
    kv_positions: int
    kv_mb: float
    step_read_gb: float
    step_floor_ms: float
    step_ceiling_ms: float
    best_x_step: float
    overlap_text: str
    compile_text: str
    takeaway_gap_ms: float
    takeaway_mm_above: float
    # the answers of "Try this"
    try_eager_idle_share: float
    try_best_per_kernel_us: float
    try_floor_tokens: float
    try_ceiling_tokens: float
    try_best_tokens: float
    # what the display cells show
    floor: Floor = field(metadata=NOT_GLUED)
    ladder_table: pd.DataFrame = field(metadata=NOT_GLUED)  # the ladder as shown (shared rungs in their own texts)
    time_split: pd.DataFrame = field(metadata=NOT_GLUED)
    passed: dict = field(metadata=NOT_GLUED)  # rung -> same answers
    wall_texts: dict = field(metadata=NOT_GLUED)  # shared rung -> its wall time as every page shows it
    fidelity: pd.DataFrame = field(metadata=NOT_GLUED)
    fp8_table: pd.DataFrame | None = field(metadata=NOT_GLUED)  # None: no FP8 rung has numbers in this run
    tokens_table: pd.DataFrame | None = field(metadata=NOT_GLUED)
    matmuls: pd.DataFrame | None = field(metadata=NOT_GLUED)  # None: no matmuls timed shape by shape
    matmul_table: pd.DataFrame | None = field(metadata=NOT_GLUED)
    launches: pd.DataFrame | None = field(metadata=NOT_GLUED)
    census_kernels: pd.DataFrame = field(metadata=NOT_GLUED)
    census_ms: pd.DataFrame = field(metadata=NOT_GLUED)
    remaining: pd.DataFrame = field(metadata=NOT_GLUED)
    step_bytes: pd.DataFrame = field(metadata=NOT_GLUED)
    kernel_groups: pd.DataFrame = field(metadata=NOT_GLUED)
    timeline_kernels: pd.DataFrame = field(metadata=NOT_GLUED)
    timeline_title: str = field(metadata=NOT_GLUED)
    best_trace: str = field(metadata=NOT_GLUED)
    next_to_published: pd.DataFrame = field(metadata=NOT_GLUED)


def page(run: runs.Run, vals: dict) -> Page:
    """The page of `run`, with `vals` the shared quantities (shared.glue_values)."""
    nan = float("nan")
    steps = ladder(run, vals)
    fastest = best(run)  # the fastest rung that gives eager's answers
    timed = steps[(steps.status == "ok") & steps["ms"].notna()].set_index("rung")
    chosen = timed.loc[fastest]
    eager_ms = timed.loc["eager", "ms"] if "eager" in timed.index else nan
    rungs = run.table("rungs").set_index("rung")
    limit = floor(run, vals)
    split = time_split(run)
    rem = remaining(run, fastest)
    parts = rem.set_index("part")
    read = step_bytes(run, vals)
    step = read.iloc[-1]  # the weights and the KV cache together
    shapes = matmuls(run) if "matmuls.csv" in run.meta["files"] else None
    tokens = tokens_per_forward(run)
    tokens_ran = None if tokens is None or not (tokens.status == "ok").any() else tokens[tokens.status == "ok"]
    theirs, ours = _launches(run, steps)
    lo_run = vals["compiled_wall_ms"].run  # the launch-overhead run the shared compiled steps come from
    fp8_text, fp8_launch_text, fp8_rows = _fp8(run, vals, steps, fastest, limit)
    layer = _middle_layer(run, fastest)
    by_rung = split.set_index("rung")
    return Page(
        run_label=run.cited,
        prompt_len=run.parameters["prompt_len"],
        failed_text=prose.failed_text(steps),
        best=RUNGS[fastest],
        best_wall=chosen["ms"],
        best_median=chosen["median"],
        best_x=chosen["x floor"],
        best_x_ceiling=chosen["x ceiling"],
        best_tbs=chosen["TB/s"],
        best_kernels=int(chosen["kernels"]),
        best_busy=chosen["GPU busy ms"],
        best_idle=chosen["idle ms"],
        speedup=eager_ms / chosen["ms"],
        split_k_text=split_k_text(run),
        costlier_text=prose.costlier_text(costlier_rungs(run, steps), timed=steps.rung[steps.status == "ok"]),
        tolerance_text=prose.tolerance_text(),
        fp8_tolerance_text=prose.fp8_tolerance_text(run),
        eager_err=rungs.loc["eager", "eager_abs_err"],
        max_logit=rungs.loc["eager", "max_abs_logit"],
        token_note=prose.token_note(run),
        check_note=prose.check_note(run),
        repeat_note=prose.repeat_note(run),
        fp8_rounding_text=prose.fp8_rounding_text(run),
        fp8_text=fp8_text,
        fp8_launch_text=fp8_launch_text,
        tokens_text=prose.tokens_text(tokens_ran),
        matmul_text=prose.matmul_text(shapes, tuning(run) if shapes is not None else None, limit),
        launch_text=prose.launch_text(run, theirs, ours),
        compile_matmul_text=prose.compile_matmul_text(
            lo_run, *(compiled_matmuls(lo_run, v) for v in ("compile-reduce-overhead", "compile-max-autotune"))
        ),
        rem_span=rem.ms.sum(),
        kv_positions=kv_positions(run),
        kv_mb=read.MB.iloc[1],
        step_read_gb=step.bytes / 1e9,
        step_floor_ms=step["ms at the datasheet"],
        step_ceiling_ms=step["ms at the ceiling"],
        best_x_step=chosen["ms"] / step["ms at the datasheet"],
        overlap_text=_overlap_text(run, steps, timed),
        compile_text=prose.compile_text(run, steps),
        takeaway_gap_ms=parts.loc["gaps between kernels", "ms"] if "gaps between kernels" in parts.index else 0.0,
        takeaway_mm_above=parts.loc["matrix multiply kernels", "above floor ms"]
        if "matrix multiply kernels" in parts.index
        else nan,
        try_eager_idle_share=by_rung.loc["eager", "GPU idle ms"] / by_rung.loc["eager", "wall ms"]
        if "eager" in by_rung.index
        else nan,
        try_best_per_kernel_us=chosen["GPU busy ms"] * 1e3 / chosen["kernels"],
        try_floor_tokens=1e3 / limit.floor_ms,
        try_ceiling_tokens=1e3 / limit.ceiling_ms,
        try_best_tokens=1e3 / chosen["ms"],
        floor=limit,
        ladder_table=ladder_table(steps, vals),
        time_split=split,
        passed=dict(zip(steps.rung, steps["same answers"], strict=True)),
        wall_texts={rung: vals[f"{p}_wall_ms"].text for rung, p in SHARED_RUNGS.items() if rung in timed.index},
        fidelity=fidelity_shown(run),
        fp8_table=fp8_rows,
        tokens_table=None if tokens_ran is None else tokens_table(tokens),
        matmuls=shapes,
        matmul_table=None if shapes is None else matmul_table(shapes),
        launches=None
        if theirs is None
        else pd.concat(
            [theirs.assign(rung=RUNG_SHORT["fused-projections"]), ours.assign(rung=RUNG_SHORT["triton-gemv"])],
            ignore_index=True,
        )[["rung", "kernel", "blocks", "threads", "shared KB", "grid / SMs", "kernels", "µs"]],
        census_kernels=_labelled(census_by_rung(run, "kernels")),
        census_ms=_labelled(census_by_rung(run, "gpu_ms")),
        remaining=rem,
        step_bytes=read.drop(columns="bytes"),
        kernel_groups=kernel_groups(run, fastest)[GROUP_COLUMNS],
        timeline_kernels=layer,
        timeline_title=f"Rung {RUNG_SHORT[fastest]}: {len(layer)} kernels, mid-step",
        best_trace=trace_file(fastest),
        next_to_published=next_to_published(run, published.NEAR_FLOOR_REFERENCES),
    )


def ladder_table(steps: pd.DataFrame, vals: dict) -> pd.DataFrame:
    """The ladder (ladder()) as the page shows it: the shared rungs in the shared quantities' own
    texts, ours to two decimals, a dash where a rung has no numbers."""

    def shown(row, name: str, own) -> str:
        """A number of a rung that ran: a shared rung's in the shared quantity's text, ours as `own(row)`."""
        if row.status != "ok":
            return "–"
        return vals[f"{SHARED_RUNGS[row.rung]}_{name}"].text if row.rung in SHARED_RUNGS else own(row)

    def spread(row) -> str:
        if row.rung in SHARED_RUNGS:  # the shared quantities' own texts, where the owner gives them
            prefix = SHARED_RUNGS[row.rung]
            quartiles = [vals.get(f"{prefix}_wall_{q}_ms") for q in ("median", "q1", "q3")]
            if row.status != "ok" or None in quartiles:
                return "–"
            return f"{quartiles[0].text} ({quartiles[1].text}–{quartiles[2].text})"
        median, q1, q3 = row["median"], row["q1"], row["q3"]
        return "–" if q1 != q1 else f"{median:.2f} ({q1:.2f}–{q3:.2f})"

    rows = [row for _, row in steps.iterrows()]
    return pd.DataFrame(
        {
            "rung": steps.rung.map(RUNG_SHORT),  # each explained in the rung list
            "measured in": [
                "–" if r.status != "ok" else ("this run" if r.rung not in SHARED_RUNGS else r["from"].split(" run ")[0])
                for r in rows
            ],
            "same answers": steps["same answers"].map(YES_NO).fillna("–"),
            "ms (minimum)": [shown(r, "wall_ms", lambda r: f"{r['ms']:.2f}") for r in rows],
            "median (quartiles)": [spread(r) for r in rows],
            "ms saved": steps["ms saved"],
            "GPU busy ms": [shown(r, "gpu_busy_ms", lambda r: f"{r['GPU busy ms']:.2f}") for r in rows],
            "kernels": [shown(r, "kernels", lambda r: f"{int(r['kernels']):,d}") for r in rows],
            "TB/s": steps["TB/s"],
            "× floor": steps["x floor"],  # each against its own floor: FP8's is its own bytes
            "× ceiling": steps["x ceiling"],
        }
    )


def fidelity_shown(run: runs.Run) -> pd.DataFrame:
    """fidelity_table() as the page shows it: rungs by label, yes/no, the later calls that differed as
    "k of n", the cosine left to rungs.csv."""
    table = fidelity_table(run)
    shown = table.drop(columns="cosine").assign(
        rung=table.rung.map(RUNGS), **{c: table[c].map(YES_NO) for c in ("same token", "passed")}
    )
    if "calls" in table:  # "2 of 30": later calls whose logits differ from the first's ("—": not called again)
        pairs = zip(table["calls differing"], table.calls, strict=True)
        differing = [f"{d:.0f} of {n:.0f}" if pd.notna(n) else "—" for d, n in pairs]
        shown = shown.drop(columns="calls").assign(**{"calls differing": differing})
    return shown


def tokens_table(tokens: pd.DataFrame) -> pd.DataFrame:
    """tokens_per_forward() as the page shows it."""
    columns = {"tokens": "tokens", "path": "path", "status": "status", "ms_min": "ms per forward"}
    columns |= {"ms_median": "median", "ms per token": "ms per token", "forward x floor": "forward × floor"}
    columns |= {"token x floor": "token × floor", "tokens/s": "tokens/s", "compile_s": "compile s"}
    return tokens[list(columns)].rename(columns=columns)


def matmul_table(shapes: pd.DataFrame) -> pd.DataFrame:
    """matmuls() as the page shows it: cuBLAS beside ours."""
    columns = {"matrix": "matrix", "MB": "MB", "cublas_us": "cuBLAS µs", "triton_us": "ours µs"}
    columns |= {"cublas_tbs": "cuBLAS TB/s", "triton_tbs": "ours TB/s", "speed-up": "ours faster by"}
    return shapes[list(columns)].rename(columns=columns)


def _labelled(table: pd.DataFrame) -> pd.DataFrame:
    return table.assign(rung=table.rung.map(RUNGS))


def _launches(run: runs.Run, steps: pd.DataFrame) -> tuple[pd.DataFrame | None, pd.DataFrame | None]:
    """The matmul launches of the last cuBLAS rung and of the first with ours (None where the run
    lacks either rung or the GPU's SM count)."""
    ran = set(steps.rung[steps.status == "ok"])
    if not ({"fused-projections", "triton-gemv"} <= ran and run.provenance.get("gpu_sms")):
        return None, None
    return matmul_launches(run, "fused-projections"), matmul_launches(run, "triton-gemv")


def _out_of_memory(run: runs.Run, why: dict) -> str:
    """Why the FP8 rungs are the ones that ran out of memory, with what the GPU held where the run
    recorded it (results["memory_gb"], after each rung's build)."""
    text = (
        " Every rung is built and kept alive until all are timed in turn, and the FP8 copies of the weights, "
        "made after the BF16 rungs', did not fit in what this GPU had left."
    )
    held = run.results.get("memory_gb", {}).get(next(iter(why)))
    if held:
        text += (
            f" After the first FP8 rung failed, the process held {held['allocated']:.1f} GB in tensors "
            f"({held['reserved']:.1f} GB reserved by PyTorch's allocator) of the GPU's {held['total']:.1f} GB."
        )
    return text


def _fp8(run: runs.Run, vals: dict, steps: pd.DataFrame, fastest: str, limit: Floor):
    """The sentence of the best FP8 rung (best_fp8), the sentence of what the FP8 rung on rung 13's
    options changed, and the table of every FP8 rung with numbers against its own floor beside the
    best BF16 rung against the BF16 floor (None where no FP8 rung has numbers)."""
    own_floor = fp8_floor(run, vals)
    by_rung = steps.set_index("rung")
    chosen = best_fp8(steps)
    if own_floor is None or chosen is None:
        why = {r: by_rung.status[r] for r in FP8_RUNGS}  # the ladder has a row for every rung, with its reason
        reasons = set(why.values())
        status = reasons.pop() if len(reasons) == 1 else "; ".join(f"*{RUNG_SHORT[r]}*: {w}" for r, w in why.items())
        memory = _out_of_memory(run, why) if "OutOfMemoryError" in status else ""
        return f"this run has no FP8 numbers: {status}.{memory}", "", None
    ran = [r for r in FP8_RUNGS if by_rung.status.get(r) == "ok" and by_rung.ms.get(r) == by_rung.ms.get(r)]
    bf16 = by_rung.loc[fastest]

    def row(rung: str, weights: str, f: Floor) -> dict:
        r = by_rung.loc[rung]
        return {"rung": RUNGS[rung], "weights": weights, "GB read": f.decode_bytes / 1e9, "its floor ms": f.floor_ms,
                "ms": r.ms, "× its floor": r["x floor"], "TB/s": r["TB/s"],
                "same answers": YES_NO[r["same answers"]]}  # fmt: skip

    table = pd.DataFrame([row(fastest, "BF16", limit)] + [row(r, "FP8 E4M3 + row scales", own_floor) for r in ran])
    text = prose.fp8_text(run, chosen, by_rung.loc[chosen], own_floor, bf16)
    return text, prose.fp8_launch_text(steps), table


def _overlap_text(run: runs.Run, steps: pd.DataFrame, timed: pd.DataFrame) -> str:
    if "pdl" in timed.index and trace_file("pdl") in run.meta["files"]:
        return prose.overlap_text(run)
    why = steps.set_index("rung").status.get("pdl", "not in this run")
    return f"(Programmatic dependent launch, rung 11, has no trace here: {why}.)"


def _middle_layer(run: runs.Run, rung: str) -> pd.DataFrame:
    """One layer's worth of `rung`'s kernels from the middle of its step."""
    kernels = kernel_table(run, rung)
    per_layer = len(kernels) // run.results["model"]["layers"]
    start = (len(kernels) - per_layer) // 2
    return kernels.iloc[start : start + per_layer]
