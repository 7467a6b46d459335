"""One line on each file a chapter's run holds, for the list of data at the end of each chapter
(glue.data_files). A file of a run that has no line here is listed as undescribed, and a test
fails on it."""

from __future__ import annotations

from labsupport.traces.replay import is_derived

_CEILINGS = "the GPU's measured copy, read and BF16 matrix-multiply rates (the ceilings the chapter compares with)"

DESCRIPTIONS: dict[str, dict[str, str]] = {
    "why-a-gpu": {
        "ceilings.csv": _CEILINGS,
        "matvec.csv": "the decode-sized matrix-vector product timed on the CPU (FP32, BF16) and on the GPU",
        "batch_sweep.csv": (
            "one decode step per batch size: kernels, GPU-busy and matmul time, wall time (minimum, quartiles, median)"
        ),
        "batch_times.csv": (
            "every timed step of the batch sweep, per batch size (and round, where the sizes were timed interleaved)"
        ),
        "batch_matmuls.csv": "the matrix multiplies of each batch size's step, by shape, with the kernel cuBLAS chose",
    },
    "what-a-kernel": {
        "ceilings.csv": _CEILINGS,
        "add_kernels.csv": "the kernels of each vector-add implementation, as profiled",
        "add_times.csv": "the time of each vector-add implementation, per call and on the GPU",
        "hbm_add.csv": "the vector add on a working set too large for the L2 cache (HBM bandwidth)",
        "queue.csv": "a burst of launches: when each call started and returned on the CPU, when the GPU finished",
        "sync.csv": "what waiting for the GPU costs, by kind of wait",
        "burst_trace.json.gz": "the raw profiler trace of the burst of launches (opens in Perfetto)",
    },
    "model-code-to-kernels": {
        "mlp_kernels.csv": "every kernel of one decoder layer's MLP, with the operator and module that launched it",
        "rmsnorm_kernels.csv": "the kernels of RMSNorm as written, compiled and as one Triton kernel",
        "rmsnorm_times.csv": "the time of each RMSNorm variant",
    },
    "where-kernels-come-from": {
        "fusion_kernels.csv": "the kernels of RMSNorm eager and compiled, with their sources",
        "fusion_times.csv": "the time of each of them",
        "fused_rmsnorm_source.py": "the Triton source torch.compile generated for the fused RMSNorm",
        "attention_backends.csv": "each attention backend at each context length: kernels, GPU time, time per call",
        "trace-rmsnorm-compiled.json.gz": "the raw profiler trace of one compiled RMSNorm call, with its host events "
        "(Dynamo's guard check, the compiled region, the launch)",
    },
    "kernels-in-one-token": {
        "ceilings.csv": _CEILINGS,
        "kernels.csv": "every kernel of the profiled decode step: name, kind, times, launch, operator, layer",
        "census.csv": "the step's kernels and GPU time by kind",
        "step_times.csv": "every clean (unprofiled) trial of the eager step in the recording process, with its round",
        "fresh_processes.csv": "the eager step timed in fresh processes that never profiled, with their CPU load",
        "profiler_effect.csv": "the same step timed clean, after a profile, and as its span inside a profile",
        "context_sweep.csv": "the step at each context length, dynamic and static cache: kernels, time, KV bytes",
        "context_census.csv": "the census by kind at each context length",
        "context_times.csv": "every trial at each context length, both caches, interleaved in rounds",
        "context_ops.csv": "each profiled step of the sweep by kind and call path: kernels, GPU time",
        "trace.json.gz": "the raw profiler trace of the decode step (opens in Perfetto)",
    },
    "launch-overhead": {
        "ceilings.csv": _CEILINGS,
        "variants.csv": "each form of the step (eager, static cache, CUDA graph, compiled): kernels, busy, wall time",
        "step_times.csv": "every clean trial of each form this chapter times (CUDA graph, compiled), with its round",
        "trace-eager.json.gz": "the raw trace of the eager step",
        "trace-eager-static.json.gz": "the raw trace of the eager step with a static cache",
        "trace-cuda-graph.json.gz": "the raw trace of the CUDA-graph replay",
        "trace-compile-reduce-overhead.json.gz": "the raw trace of the step compiled with mode reduce-overhead",
        "trace-compile-max-autotune.json.gz": "the raw trace of the step compiled with mode max-autotune",
    },
    "closing-the-gap": {
        "ceilings.csv": _CEILINGS,
        "rungs.csv": "each rung of the ladder: kernels, GPU-busy, wall and compile time, its logits against eager's",
        "step_times.csv": "every timed trial of our rungs, in interleaved rounds: wall and CUDA-event ms",
        "matmuls.csv": "each weight shape's matmul for one token: cuBLAS against our Triton GEMV, in µs and TB/s",
        "gemv_tuning.csv": "every configuration of our GEMV tried on every weight shape (BF16 and FP8 weights, "
        "split-K), and the ones kept",
        "tokens_per_forward.csv": "the best BF16 rung's decoder on 1 to 16 tokens at once: ms per forward, "
        "in interleaved rounds",
        "trace-eager.json.gz": "the raw trace of the eager step",
        "trace-cuda-graph.json.gz": "the raw trace of transformers' static-cache step replayed as a CUDA graph",
        "trace-compile.json.gz": "the raw trace of transformers' step compiled (reduce-overhead)",
        "trace-own-compiled.json.gz": "the raw trace of our decode step, compiled, in one CUDA graph",
        "trace-fused-projections.json.gz": "the raw trace of our step with fused Q/K/V and gate/up",
        "trace-triton-gemv.json.gz": "the raw trace of our step with our Triton GEMV",
        "trace-fused-gemv.json.gz": "the raw trace of our step with norms, SiLU and residual adds inside the GEMVs",
        "trace-fused-attention.json.gz": "the raw trace of our step with our attention kernels",
        "trace-split-k.json.gz": "the raw trace of our step with split-K GEMVs where the tuner chose them",
        "trace-pdl.json.gz": "the raw trace of our step with our GEMVs launched with programmatic dependent launch",
        "trace-fp8-weights.json.gz": "the raw trace of our step reading FP8 weights",
    },
    "prefill-vs-decode": {
        "ceilings.csv": _CEILINGS,
        "phase_times.csv": "every timed trial of the prompt phase and of one decode step, in interleaved rounds",
        "kernels-prefill.csv": "every kernel of the profiled prompt phase",
        "kernels-decode.csv": "every kernel of the profiled decode step",
        "census.csv": "both phases' kernels and GPU time by kind",
        "prompt_sweep.csv": "the prompt phase at each prompt length: kernels, GPU busy, wall time (minimum, quartiles)",
        "trace-prefill.json.gz": "the raw trace of the prompt phase",
        "trace-decode.json.gz": "the raw trace of the decode step",
    },
    "hybrid-model-token": {
        "ceilings.csv": _CEILINGS,
        "variants.csv": "each backend and mode of the decode step: kernels, GPU-busy and wall time, status",
        "step_times.csv": "every clean timing of each backend and mode",
        "prefill.csv": "the prompt phase of each backend: kernels, GPU-busy and wall time",
        "cache_growth.csv": "the cache after prompts of each length (attention's KV cache, Gated DeltaNet's state)",
        "trace-reference-eager.json.gz": "the raw trace of the eager step, transformers' PyTorch Gated DeltaNet",
        "trace-reference-cuda-graph.json.gz": "the raw trace of its CUDA-graph replay",
        "trace-reference-compile.json.gz": "the raw trace of it compiled",
        "trace-fla-eager.json.gz": "the raw trace of the eager step with flash-linear-attention's kernels",
        "trace-fla-cuda-graph.json.gz": "the raw trace of its CUDA-graph replay",
        "trace-fla-compile.json.gz": "the raw trace of it compiled",
    },
    "one-token-two-gpus": {
        "ceilings.csv": _CEILINGS + ", on GPU 0",
        "variants.csv": "each form of the step at TP=1 and split, per rank: kernels, communication, busy and wall time",
        "step_times.csv": "every clean timing of each form of the step, per degree and rank",
        "collectives.csv": "every collective one eager step issued, per degree and rank: operation, bytes, dtype",
        "allreduce.csv": "the all-reduce sweep, per rank, launched one by one and replayed from a CUDA graph: "
        "message size, latency, algorithm and bus bandwidth",
        "topology.txt": "nvidia-smi topo -m: how the GPUs are connected (NVLink or PCIe)",
        **{
            f"trace-tp{tp}-rank{rank}-{form}.json.gz": f"the raw trace of rank {rank}'s {what} at TP={tp}"
            for tp in range(1, 9)
            for rank in range(tp)
            for form, what in (
                ("eager", "eager step"),
                ("cuda-graph", "CUDA-graph replay"),
                ("compile", "compiled step"),
            )
        },
    },
}

META = "provenance (GPU, driver, CUDA, library versions, commit, time, command), parameters, results, checksums"

DERIVED = {
    "events": "derived from the trace of the same name: its events in a table, which replay reads instead of the trace",
    "kernels": "derived from the trace of the same name: its kernels with their launching call, operator, module",
    "regions": "derived from the trace of the same name: its annotated regions (start, length in ns)",
}


def describe(chapter: str, name: str) -> str | None:
    """The line on file `name` of a run of `chapter` (meta.json's for any chapter), or None."""
    if name == "meta.json":
        return META
    if is_derived(name):  # the replay tables beside each trace (labsupport.traces.replay)
        return DERIVED[name.rsplit(".", 3)[1]]
    return DESCRIPTIONS.get(chapter, {}).get(name)


def data_list(run):
    """The chapter's closing list of data: every file of its run, linked for download, with its
    size and one line on what it holds, and how to record a run of one's own (HTML, for the last
    cell of a chapter)."""
    import html

    from IPython.display import HTML

    names = ["meta.json", *sorted(run.meta["files"])]
    rows = []
    for name in names:
        path = run.path / name
        size = path.stat().st_size
        size = f"{size / 1e6:.1f} MB" if size >= 1e5 else f"{size / 1e3:.0f} kB"
        href = html.escape(f"../runs/{run.chapter}/{run.run_id}/{name}")
        what = describe(run.chapter, name) or "(not described)"
        rows.append(
            f'<tr><td><a href="{href}" download><code>{html.escape(name)}</code></a></td>'
            f"<td>{size}</td><td>{html.escape(what)}</td></tr>"
        )
    return HTML(
        f"<p>Run <code>{html.escape(run.run_id)}</code> of <code>{html.escape(run.chapter)}</code>; "
        "CSV tables open in any spreadsheet, traces in <a href='https://ui.perfetto.dev'>Perfetto</a>.</p>"
        '<table class="data-files"><thead><tr><th>file</th><th>size</th><th>what it holds</th></tr></thead>'
        f"<tbody>{''.join(rows)}</tbody></table>"
        f"<p>{html.escape(host_text(run))}</p>"
        "<p>To record a run of your own, on your GPU: download this page's notebook (the download button at "
        "the top of the page), install what <a href='../book/run_it_yourself.html'>Run a chapter yourself</a> "
        'lists, and run the notebook with <code>mode = "live"</code>.</p>'
    )


def host_reference_ms(run) -> float | None:
    """The host's best speed seen on this GPU: the quickest host-probe reading of any published
    run recorded on the same GPU (None when none has a probe). A run whose typical reading is
    well above it was recorded while the host was slower than it can be."""
    from labsupport import runs
    from labsupport.measure import hostprobe

    best = []
    try:
        published = runs.published()
    except runs.RunError:
        published = {}
    for slug, rid in {**published, run.chapter: run.run_id}.items():
        try:
            other = run if (slug, rid) == (run.chapter, run.run_id) else runs.load_run(slug, rid, verify=False)
        except runs.RunError:
            continue
        if other.provenance.get("gpu") != run.provenance.get("gpu"):
            continue
        h = hostprobe.assess(other.results.get("host_probe", []))
        if h is not None:
            best.append(h.best_ms)
    return min(best) if best else None


def _host_speed(run):
    from labsupport.measure import hostprobe

    return hostprobe.assess(
        run.results.get("host_probe", []),
        reference_ms=host_reference_ms(run),
        reference_what="the host's best reading on this GPU",
    )


def host_text(run) -> str:
    """One sentence on the host's speed while the run was recorded, from its host probe
    (labsupport.measure.hostprobe), against the best speed the probe saw in any published run on
    this GPU: the readings' range, and whether the host was slow."""
    h = _host_speed(run)
    if h is None:
        return "This run was recorded before the host probe existed: the host's speed at the time is not known."
    text = (
        f"Host probe (a fixed CPU workload, {h.readings} readings while the run was recorded): "
        f"{h.best_ms:.2f} to {h.worst_ms:.2f} ms, typically {h.median_ms:.2f} ms"
        + (f", against {h.reference_ms:.2f} ms at the host's best on this GPU." if h.reference_ms else ".")
    )
    if h.slow:
        return text + f" The host was slower than usual during this run: {h.why}."
    return text + " The host held its speed through the run."


def host_banner(run):
    """A warning for the top of a chapter whose run was recorded on a slow host (nothing when the
    host held its speed): its host-timed numbers are then higher than the host's best."""
    import html

    from IPython.display import HTML

    h = _host_speed(run)
    if h is None or not h.slow:
        return HTML("")
    return HTML(
        '<div class="admonition warning"><p class="admonition-title">A slow host</p><p>'
        + html.escape(
            f"While this run was recorded the host was slower than usual ({h.why}). Host-timed numbers on "
            "this page (wall times of eager steps, launch calls) are reported by their minimum, which a slow "
            "phase raises least, but may still be higher than on a quiet host; GPU times are not affected."
        )
        + "</p></div>"
    )
