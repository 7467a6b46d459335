"""The paragraphs of "A hybrid model's token" that exist only for some runs, or that name what this run
holds: flash-linear-attention's eager step and prompt, the fastest variant's graph and idle time, and this
run beside the published vLLM profile. page() glues them."""

from __future__ import annotations

import pandas as pd

from labsupport import runs
from labsupport.chapters import published
from labsupport.measure import hardware

from .analysis import BESIDE_KEYS, beside_published, kernel_table, ok_variants, per_layer_type, variants
from .idle import (
    IdleSummary,
    host_before_first_kernel,
    host_call,
    idle_places,
    memsets_by_module,
    prefill_host_device,
    step_gaps,
)


def fla_section(run: runs.Run, linear: pd.Series) -> str:
    """What flash-linear-attention's kernels changed in the eager step, and why its wall time does not
    follow; or why they were not measured. `linear`: the reference step's linear-attention layer."""
    ran = ok_variants(run).set_index(["backend", "mode"])
    if ("fla", "eager") not in ran.index:
        why = variants(run).set_index(["backend", "mode"]).status.get(("fla", "eager"), "not in this run's parameters")
        return f"flash-linear-attention's kernels were **not measured** in this run: {why}."
    fla, ref = ran.loc[("fla", "eager")], ran.loc[("reference", "eager")]
    fla_layer = per_layer_type(kernel_table(run, "fla", "eager")).set_index("layer type").loc["linear attention"]
    recurrence = host_call(run, "fla", "FusedRecurrentFunction")
    mm_fla, mm_ref = host_call(run, "fla", "aten::mm"), host_call(run, "reference", "aten::mm")
    rest = recurrence.total_us - recurrence.launch_us - recurrence.operators_us
    slower_all = (
        f" (in the reference step's profile it took {mm_ref.total_us:.0f} µs: every call ran slower on the "
        "CPU in this profile, not only flash-linear-attention's)"
        if mm_fla.total_us > 1.2 * mm_ref.total_us
        else ""
    )
    return (
        f"flash-linear-attention (fla-core {run.results['backend_versions'].get('fla')}) ran with this GPU box's "
        f"torch {run.provenance.get('torch', '?')}. Its `fused_recurrent_gated_delta_rule` does the whole recurrence "
        f"of one layer, for one token, in one Triton kernel: the layer's token mixer is "
        f"{fla_layer['mixer kernels']:.0f} kernels ({fla_layer['mixer µs']:.0f} µs of GPU time) instead of "
        f"{linear['mixer kernels']:.0f} ({linear['mixer µs']:.0f} µs), and the whole eager step {fla.kernels:,.0f} "
        f"kernels instead of {ref.kernels:,.0f}. What is left around the recurrence kernel is the input projections, "
        "the short convolution (PyTorch's own: the fused one, from the causal-conv1d package, needs a CUDA build that "
        "is not installed here), the gates, the gated norm and the output projection.\n\n"
        f"The wall time does not follow ({fla['wall ms']:.1f} ms against {ref['wall ms']:.1f} ms). In eager mode the "
        "CPU sets the pace, and one Triton kernel is not one PyTorch kernel's worth of CPU work: in the profiled step "
        f"the CPU spent a median {recurrence.total_us:.0f} µs in each of the {recurrence.calls} calls that launch it "
        f"(`FusedRecurrentFunction`), of which {recurrence.launch_us:.0f} µs in the CUDA launch call itself and "
        f"{recurrence.operators_us:.0f} µs in PyTorch operators (allocating its outputs); the other {rest:.0f} µs "
        "fall outside anything the profiler names, that is, in Python: flash-linear-attention's own code and "
        "Triton's launcher. A matrix multiply's call (`aten::mm`) "
        f"took {mm_fla.total_us:.0f} µs in the same profile{slower_all}. The kernels are faster; the step is only "
        "faster once the CPU is out of the way (next section)."
    )


def _plural(count: int, word: str, ending: str = "s") -> str:
    return f"{count} {word}{ending if count != 1 else ''}"


def graph_text(idle: IdleSummary) -> str:
    """How the step was launched: kernel by kernel, or as graph launches (and whether
    flash-linear-attention's kernels broke the graph)."""
    if idle.mode == "eager":
        return "This step has no graph: every kernel is its own launch."
    launched = (
        f"The whole step ran as {_plural(idle.graph_launches, 'graph launch', 'es')} "
        f"from {_plural(idle.compiled_regions, 'compiled region')}"
    )
    if not idle.fla_kernels:
        return launched + "."
    return (
        f"{launched}: flash-linear-attention's {idle.fla_kernels} kernels "
        + (
            "were captured inside the graph; they did not break it. "
            if idle.graph_launches == 1 and idle.compiled_regions == 1
            else "ran among them. "
        )
        + f"The gaps before and after them (median {idle.fla_gap_before_us:.2f} and {idle.fla_gap_after_us:.2f} µs) "
        f"are the graph's ordinary spacing ({idle.graph_gap_us:.2f} µs, the median of every gap inside it)."
    )


def inside_graph_text(run: runs.Run, backend: str, idle: IdleSummary) -> str:
    """The gaps inside the graph: the many short ones, each long one with its neighbours, and who asks for
    the memsets found in them."""
    places = idle_places(step_gaps(run, backend, idle.mode))
    long_gaps = places[places.group == "graph-long"]
    parts = []
    if (places.group == "graph-others").any():
        short = places.set_index("group").loc["graph-others"]
        parts.append(
            f"{short.gaps:,d} short gaps between consecutive kernels (median {short['median µs']:.2f} µs), "
            f"{short['idle ms']:.2f} ms in all"
        )
    for _, gap in long_gaps.iterrows():
        work = (
            ""
            if gap["also in the gaps"] == "–"
            else f", each holding a {gap['also in the gaps'].split(', ')[0].split(' ', 1)[1]}"
        )
        parts.append(
            f"{gap.gaps:,d} gaps of about {gap['median µs']:.1f} µs ({gap['idle ms']:.2f} ms) between "
            f"`{gap['kernel before']}` and `{gap['kernel after']}`{work}"
        )
    if not parts:
        return ""
    text = f"Inside the graph the GPU is idle for {idle.inside_graph_ms:.2f} ms: " + "; and ".join(parts) + "."
    recorded = set(zip(run.table("variants").backend, run.table("variants")["mode"], strict=True))
    if (backend, "eager") not in recorded or not any(long_gaps["also in the gaps"].str.contains("memset")):
        return text
    memsets = memsets_by_module(run, backend, "eager")
    if not len(memsets):
        return text
    top = memsets.loc[memsets.memsets.idxmax()]  # the most frequent
    return text + (
        f" The eager step's trace, which labels modules, shows who asks for such memsets: {top.memsets} "
        f"of {top.bytes} bytes each, issued by `{top.operator}` in `{top.module}`, the matrix multiply "
        "that follows. The memset itself is tiny; why the gap around it is longer than the others, the "
        "trace cannot say."
    )


PROFILERS_OWN = ", the profiler's own"  # a host call of the profiler's, not the step's


def host_text(run: runs.Run, backend: str, mode: str) -> str:
    """The longest of the host's calls that finished before the step's (or its graph's) first kernel."""
    host = host_before_first_kernel(run, backend, mode)
    step_kernels = kernel_table(run, backend, mode)
    in_graph = step_kernels[step_kernels.launch_api == "cudaGraphLaunch"]
    first_ms = (in_graph if len(in_graph) else step_kernels).start_ns.min() / 1e6  # the graph's first kernel
    done = host[(host["starts at ms"] + host["lasts ms"] <= first_ms) & (host["lasts ms"] >= 0.2)]
    done = done.sort_values("lasts ms", ascending=False)
    if done.empty:
        return ""
    return (
        "The longest of the host's calls that finished before "
        + ("the graph's first kernel: " if len(in_graph) else "it: ")
        + ", ".join(
            f"`{row.event}` ({row['lasts ms']:.2f} ms{PROFILERS_OWN if row.kind == 'overhead' else ''})"
            for _, row in done.head(5).iterrows()
        )
        + ". All of them, in order, an event inside another indented:"
    )


def prefill_text(run: runs.Run) -> str:
    """flash-linear-attention's prompt phase against the reference code's ("" when one did not run)."""
    host_device = prefill_host_device(run).set_index("backend")
    if not {"fla", "reference"} <= set(host_device.index):
        return ""
    ref, fla = host_device.loc["reference"], host_device.loc["fla"]
    if fla["wall ms"] > ref["wall ms"] and fla["GPU busy ms"] < ref["GPU busy ms"]:
        text = (
            f"With flash-linear-attention's chunked kernels the prompt launched {fla.kernels:,.0f} kernels instead of "
            f"{ref.kernels:,.0f} and kept the GPU busy for {fla['GPU busy ms']:.0f} ms instead of "
            f"{ref['GPU busy ms']:.0f}, "
            f"yet took {fla['wall ms']:.0f} ms instead of {ref['wall ms']:.0f}: the GPU sat idle for "
            f"{fla['GPU idle ms']:.0f} ms, {fla['idle µs per kernel']:.0f} µs per kernel launched against "
            f"{ref['idle µs per kernel']:.0f} µs with the reference code. The time is lost on the host's side, and "
            "not to the number of launches, which fell."
        )
    else:
        text = (
            f"With flash-linear-attention's chunked kernels the prompt launched {fla.kernels:,.0f} kernels "
            f"({ref.kernels:,.0f} with the reference code), kept the GPU busy for {fla['GPU busy ms']:.0f} ms "
            f"({ref['GPU busy ms']:.0f}) and took {fla['wall ms']:.0f} ms ({ref['wall ms']:.0f})."
        )
    if fla["wall min ms"] == fla["wall min ms"]:
        text += (
            f" Its repeats spread widely, from {fla['wall min ms']:.0f} to {fla['wall max ms']:.0f} ms "
            f"(the reference code's from {ref['wall min ms']:.0f} to {ref['wall max ms']:.0f})."
        )
    return text + (
        " What the host did in that time, this run cannot tell: it kept no trace of the prompt phase, only its "
        "wall time and one profiled prompt's GPU-busy time. Whether the time goes to Triton's launcher, to "
        "flash-linear-attention's Python around it, or to the host waiting for the GPU in between is not in the "
        "data; a profile of the prompt phase would say."
    )


def beside_published_texts(run: runs.Run, best_backend: str) -> dict:
    """How our best step (of `best_backend`) and our prompt compare with the published ones, each against its
    own GPU's limit (bp_text, bp_intro), and how the two GPUs differ (bp_gpus_text)."""
    rows = beside_published(run).set_index(BESIDE_KEYS)  # rows by side, step and backend
    theirs_decode, theirs_prompt = rows.loc[("published", "decode", "vllm")], rows.loc[("published", "prompt", "vllm")]
    ours_decode = rows.loc[("ours", "decode", best_backend)] if ("ours", "decode", best_backend) in rows.index else None
    ours_prompt = rows.loc[("ours", "prompt", "reference")] if ("ours", "prompt", "reference") in rows.index else None
    share = "of its GPU's limit"
    if ours_decode is not None and ours_prompt is not None and theirs_decode[share] == theirs_decode[share]:
        closer = "vLLM's" if theirs_decode[share] > ours_decode[share] else "ours"
        text = (
            f"The published step reaches {theirs_decode[share]:.0%} of the H100's bandwidth floor "
            f"({theirs_decode['limit ms']:.2f} ms), our best {ours_decode[share]:.0%} of the {ours_decode.GPU}'s "
            f"({ours_decode['limit ms']:.2f} ms): {closer} is closer to its GPU's limit, although the two wall times "
            f"are {theirs_decode.ms:.2f} and {ours_decode.ms:.2f} ms. For the prompt, the published "
            f"{theirs_prompt.rate} are {theirs_prompt[share]:.0%} of the dense BF16 rate (MFU), our eager "
            f"reference's {ours_prompt.rate} {ours_prompt[share]:.0%}."
        )
    else:
        text = (
            "This run's model is not the published profile's configuration, so its rows are not measured "
            "against the same bytes and operations; only the published figures are shown as published."
        )
    published_ms = published.HYBRID_27B_VLLM_HEADLINE["decode_ms"]
    near = ours_decode is not None and abs(ours_decode.ms - published_ms) <= 0.25 * published_ms
    intro = (
        f"Next to our best step ({ours_decode.ms:.2f} ms) that reads like parity. It is not: the two GPUs have "
        "different limits."
        if near
        else (f"Our best step took {ours_decode.ms:.2f} ms. " if ours_decode is not None else "")
        + "Wall times on two GPUs do not compare directly: each has its own limits."
    )
    return {"bp_text": text, "bp_intro": intro, "bp_gpus_text": gpus_text(run)}


def gpus_text(run: runs.Run) -> str:
    """How this run's GPU and the published profile's H100 differ, by their datasheets."""
    h100, ours = hardware.datasheet("NVIDIA H100 80GB HBM3"), hardware.datasheet_or_none(run.provenance["gpu"])
    if ours is None:
        return f"No datasheet is known for this run's GPU ({run.provenance['gpu']}), so its limits are not shown."
    faster = ours.name if ours.bandwidth_tbs > h100.bandwidth_tbs else h100.name
    return (
        f"The GPUs differ in bandwidth ({ours.name} {ours.bandwidth_tbs:g} TB/s against {h100.name} "
        f"{h100.bandwidth_tbs:g} TB/s, so the same weight reads take less time on the {faster})"
        + (
            " and not in BF16 rate"
            if ours.bf16_tflops == h100.bf16_tflops
            else f" and in BF16 rate ({ours.bf16_tflops:g} and {h100.bf16_tflops:g} TFLOP/s)"
        )
        + f"; our CPU was an {run.provenance.get('cpu', 'unrecorded CPU')}, the published post names none."
    )
