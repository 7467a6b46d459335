"""The page of "One token on two GPUs": every number and short text its prose glues, computed from a loaded
run (page()); the tables its cells show are tables.py's. The sentences stay in the notebook's markdown; only
conditional fragments are made here."""

from __future__ import annotations

import dataclasses
from dataclasses import asdict, dataclass, field

from labsupport import glue, runs
from labsupport.glue import NOT_GLUED

from .analysis import (
    SHARED_ONE_GPU,
    Answer,
    agreement_text,
    allreduce_curve,
    answer,
    at_bytes,
    best,
    collectives,
    main_form,
    published_allreduce_us,
    split_degree,
    steps,
    time_split,
)
from .params import SHORT, VARIANTS
from .topology import recorded_interconnect

NAN = float("nan")
CHAPTER_TITLES = {"kernels-in-one-token": "The kernels in one token", "launch-overhead": "Launch overhead"}


@dataclass
class Page:
    """What the page says: the step on one GPU and split, form by form (a_ the main form, e_ eager, k_
    compiled; _1 one GPU, _n the split degree), where the main form's GPU time goes (mm_, rest_), the
    all-reduces of one step and their curve (ar_), and what a faster all-reduce would save (fast_). The one-GPU
    wall times are the book's shared ones (`one_gpu_ms`, from `one_gpu_from`), the split ones this run's."""

    run_label: str
    tp: int
    layers: int
    prompt_len: int
    batch: int
    form_name: str
    form_short: str
    failed_text: str
    agreement_text: str
    dtensor_text: str
    # the step, form by form
    a_wall_ms_n: float
    a_speedup: float
    a_ideal_ms: float
    a_busy_ms_1: float
    a_busy_ms_n: float
    a_kernels_1: int
    a_kernels_n: int
    e_wall_ms_n: float
    e_speedup: float
    e_idle_n: float
    e_comm_min: float
    e_comm_max: float
    k_wall_ms_n: float
    k_speedup: float
    k_issue_1: float
    k_issue_n: float
    k_idle_n: float
    best_1_form: str
    best_n_form: str
    best_n_ms: float
    best_speedup: float
    # where the main form's GPU time goes
    mm_1: float
    mm_n: float
    mm_saved: float
    mm_ideal: float
    mm_share_1: float
    rest_1: float
    rest_n: float
    comm_added: float
    # the all-reduces
    ar_per_step: int
    ar_per_layer: float
    ar_bytes: int
    ar_step_bytes: int
    ar_comm_us_each: float
    ar_comm_total_ms: float
    ar_step_us: float
    ar_eager_us: float
    ar_meet_mb: float
    ar_largest_busbw: float
    ar_largest_bytes_mb: float
    ar_largest_ideal_us: float
    ar_16x_bytes: int
    ar_16x_us: float
    interconnect_text: str
    fast_name: str
    fast_us: float
    fast_saving_ms: float
    # the one-GPU walls the steps' table shows: the book's shared values, and where each comes from
    one_gpu_ms: dict = field(metadata=NOT_GLUED)
    one_gpu_from: dict = field(metadata=NOT_GLUED)


def page(run: runs.Run, shared_values: dict | None = None) -> Page:
    """The page of `run`. `shared_values`: the book's shared quantities (shared.glue_values(), which glues
    them too); read from the published runs when not given."""
    from labsupport.chapters import shared

    values = shared_values or shared.values()
    one_gpu_ms = {form: values[name].value for form, name in SHARED_ONE_GPU.items()}
    one_gpu_from = {
        form: f"{CHAPTER_TITLES.get(values[name].quantity.owner, values[name].quantity.owner)}, "
        f"run {values[name].run.run_id}"
        for form, name in SHARED_ONE_GPU.items()
    }
    numbers = {
        "run_label": run.cited,
        "tp": split_degree(run),
        "layers": run.results["model"]["layers"],
        "prompt_len": run.parameters["prompt_len"],
        "batch": run.parameters["batch"],
        "form_name": VARIANTS[main_form(run)],
        "form_short": SHORT[main_form(run)],
        "agreement_text": agreement_text(run),
        **_forms(run, one_gpu_ms),
        **_time_split(run),
        **_allreduces(run),
        **_texts(run),
    }
    glued = [f.name for f in dataclasses.fields(Page) if f.metadata.get("glue", True)]
    return Page(**{name: numbers[name] for name in glued}, one_gpu_ms=one_gpu_ms, one_gpu_from=one_gpu_from)


def _forms(run: runs.Run, one_gpu_ms: dict) -> dict:
    """The step compared form by form: a_ (the main form), e_ (eager), k_ (compiled), NaN where one did not
    run; the compiled step's issue time, every form's idle, and the best one-GPU form against the best split."""
    tp, numbers = split_degree(run), {}
    for prefix, variant in (("a", main_form(run)), ("e", "eager"), ("k", "compile")):
        compared = answer(run, variant)
        fields = asdict(compared) if compared else {name: NAN for name in Answer.__dataclass_fields__}
        numbers |= {f"{prefix}_{name}": value for name, value in fields.items()}
        numbers[f"{prefix}_ideal_ms"] = one_gpu_ms[variant] / tp  # half of the shared one-GPU step
    recorded = run.table("variants").set_index(["tp", "rank", "variant"])
    issue = {
        (degree, form): float(recorded.loc[(degree, slice(None), form), "issue_ms_median"].max())
        for degree, _, form in recorded.index
    }
    every = steps(run)
    idle = every[every.status == "ok"].groupby(["tp", "variant"])["GPU idle ms"].max()
    eager_comm = every[(every.variant == "eager") & (every.tp == tp)]["communication ms"]
    fastest = best(run).set_index("tp")
    return numbers | {
        "k_issue_1": issue.get((1, "compile"), NAN),
        "k_issue_n": issue.get((tp, "compile"), NAN),
        "e_idle_n": idle.get((tp, "eager"), NAN),
        "k_idle_n": idle.get((tp, "compile"), NAN),
        "e_comm_min": float(eager_comm.min()),
        "e_comm_max": float(eager_comm.max()),
        "best_1_form": VARIANTS[fastest.loc[1, "variant"]],
        "best_n_form": VARIANTS[fastest.loc[tp, "variant"]],
        "best_n_ms": fastest.loc[tp, "wall ms"],
        "best_speedup": fastest.loc[tp].iloc[-1],
    }


def _time_split(run: runs.Run) -> dict:
    """The main form's GPU time by kind, one GPU against the busier rank of the split step."""
    tp, by_kind = split_degree(run), time_split(run, main_form(run))
    matmul = by_kind.loc["matrix multiply"]
    comm = by_kind.loc["communication"] if "communication" in by_kind.index else None
    rest = by_kind.drop(index=[k for k in ("matrix multiply", "communication", "total") if k in by_kind.index])
    return {
        "mm_1": matmul["TP=1 ms"],
        "mm_n": matmul[f"TP={tp} ms"],
        "mm_saved": -matmul["change ms"],
        "mm_ideal": matmul["split perfectly ms"],
        "mm_share_1": matmul["TP=1 ms"] / by_kind.loc["total", "TP=1 ms"],
        "comm_added": comm["change ms"] if comm is not None else 0.0,
        "rest_1": rest["TP=1 ms"].sum(),
        "rest_n": rest[f"TP={tp} ms"].sum(),
    }


def _allreduces(run: runs.Run) -> dict:
    """The all-reduces of one step (the main form's profile), their curve one by one and from a CUDA graph
    (none on a CPU: then the eager curve stands for the step's), and a custom all-reduce's saving."""
    comm = collectives(run, variant=main_form(run))
    eager = allreduce_curve(run)  # launched one by one, as the eager step does
    graph = allreduce_curve(run, "CUDA graph")  # replayed from a CUDA graph
    step_curve = graph if len(graph) else eager
    step_us = float(step_curve.loc[step_curve["decode step"], "latency_us"].iloc[0])
    both = eager.set_index("bytes").latency_us.to_frame("eager").join(graph.set_index("bytes").latency_us)
    apart = both[(both.eager / both.latency_us - 1).abs() > 0.10].index  # sizes where the two ways differ
    meet_mb = float(both.index[both.index > apart.max()].min() / 2**20) if len(apart) and len(graph) else NAN
    largest_busbw = float(step_curve.busbw_gbs.max())
    fast_name, fast_us = min(published_allreduce_us().items(), key=lambda kv: kv[1])  # H100, 32 KB
    return {
        "ar_per_step": comm.per_step,
        "ar_per_layer": comm.per_layer,
        "ar_bytes": comm.message_bytes,
        "ar_step_bytes": comm.step_bytes,
        "ar_comm_us_each": comm.comm_us_each,
        "ar_comm_total_ms": comm.comm_ms,
        "ar_step_us": step_us,
        "ar_eager_us": float(eager.loc[eager["decode step"], "latency_us"].iloc[0]),
        "ar_meet_mb": meet_mb,
        "ar_largest_busbw": largest_busbw,
        "ar_largest_bytes_mb": float(step_curve.bytes.max() / 2**20),
        "ar_largest_ideal_us": comm.step_bytes / (largest_busbw * 1e3),
        "ar_16x_bytes": 16 * comm.message_bytes,
        "ar_16x_us": at_bytes(step_curve, 16 * comm.message_bytes),
        "fast_name": fast_name,
        "fast_us": fast_us,
        "fast_saving_ms": comm.per_step * (comm.comm_us_each - fast_us) / 1e3,
    }


def _texts(run: runs.Run) -> dict:
    """What did not run, the link between the GPUs, and DTensor's slow path under inference_mode."""
    every = steps(run)
    failed = every[every.status != "ok"].drop_duplicates(["variant", "status"])
    link = recorded_interconnect(run)
    tp = split_degree(run)
    slow = next((r.get("dtensor_slow_path_per_step") for r in run.results["ranks"] if r["tp"] == tp), None) or {}
    return {
        "failed_text": glue.failures_text(
            [f"*{VARIANTS.get(r.variant, r.variant)}* at TP={r.tp}: {r.status}" for r in failed.itertuples()],
            "Every form of the step ran at every degree.",
            "Not every form ran",
        ),
        "interconnect_text": f"`nvidia-smi topo -m` lists `{link['gpu0_gpu1']}` between GPU 0 and GPU 1: "
        f"{link['means']}."
        if link.get("gpu0_gpu1")
        else "This run has no `nvidia-smi` topology (it was not recorded on NVIDIA GPUs).",
        "dtensor_text": "The eager step runs under `torch.no_grad`, not under `torch.inference_mode` as in the other "
        f"chapters: under inference_mode each rank's DTensor worked out the sharding of {slow['inference_mode']} "
        "operators per step afresh, outside its caches (`aten.linear` reaches it whole there, and it decomposes it "
        f"on fake tensors at every call), under no_grad {slow['no_grad']}."
        if slow.get("inference_mode") is not None and slow.get("no_grad") is not None
        else "The eager step runs under `torch.no_grad`, not under `torch.inference_mode` as in the other chapters "
        "(under inference_mode a DTensor-split model works out operators' sharding afresh at every call).",
    }
