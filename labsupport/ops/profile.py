"""`python -m labsupport profile MODEL_DIR [--allow-cpu] [--out DIR] [--dtype ...]`: your own model
through the census of *The kernels in one token*, in one command.

The folder is a model source (labsupport.measure.models.source: its safetensors weights, or its
configuration with random weights). The measurement is the chapter's, in its order: the eager
step timed interleaved with the static cache before anything is profiled, on a GPU also the step
captured in a CUDA graph and compiled (what *Launch overhead* times), then one step profiled (its
kernels, the census) and the static cache profiled beside it. It writes one run of the chapter
into a runs folder of its own (`--out`, default build/profile/), with the model source in its
results (`model_source`) and the folder's name as its `model` parameter (the form `pack` and the
gallery show): `pack` and `gallery add` take it as they take any run of the chapter. Then it prints
a short report read back from the run written.

Bad input is one line, before anything is measured or written: a folder that is not a model, a
configuration transformers cannot build, weights that do not match it, a model too large for the
device's memory, no GPU without --allow-cpu.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from labsupport import runs
from labsupport.chapters import kernels_in_one_token as ch
from labsupport.chapters.launch_overhead.measuring import failure, first_line
from labsupport.measure import decode, hardware, harness, models, recording
from labsupport.measure.models import source
from labsupport.runs import provenance
from labsupport.traces import kernels

PROMPT_LEN = 256
# The forms *Launch overhead* times against the eager step (GPU only): the static-cache step
# captured in a CUDA graph, and compiled in the mode that adds CUDA graphs itself.
FORMS = ("cuda-graph", "compile-reduce-overhead")


class ProfileError(RuntimeError):
    """A model that cannot be profiled here (one line; nothing was written)."""


@dataclass
class ProfileParams(ch.Params):
    """The chapter's parameters for a model folder: no preset, the folder's name as `model`, the
    prompt's length as the one context, no fresh processes (they rebuild a preset)."""

    preset: str = ""
    contexts: list[int] = field(default_factory=lambda: [PROMPT_LEN])
    fresh_processes: int = 0


def default_out() -> Path:
    """Where a run goes without --out: build/profile/ of the book's checkout, or of the working
    folder where labsupport is installed from its wheel (never the book's runs/)."""
    checkout = (provenance.REPO_ROOT / "_toc.yml").is_file()
    return (provenance.REPO_ROOT if checkout else Path.cwd()) / "build" / "profile"


def device_here(allow_cpu: bool) -> str:
    """The device to measure: the GPU where one is visible, the CPU with --allow-cpu, else a
    ProfileError."""
    import torch

    if torch.cuda.is_available():
        return "cuda"
    if allow_cpu:
        return "cpu"
    raise ProfileError("no CUDA GPU is visible; --allow-cpu profiles on the CPU (its operators, not GPU kernels)")


def step_forms(model, prompt, params: ProfileParams, progress) -> dict:
    """The eager step, its CUDA graph and its compiled form, timed interleaved in rounds before any
    profile (what *Launch overhead* measures): {form: the book's estimator, its basis and trials}
    with the compile time, or the form's status where it could not run here."""
    from labsupport.measure import steps

    built, out = {}, {}
    for form in FORMS:
        progress(f"{'capturing a CUDA graph of' if form == 'cuda-graph' else 'compiling'} the static-cache step")
        try:
            static = steps.StaticStep(model, prompt.ids)
            built[form] = (
                steps.GraphStep(static) if form == "cuda-graph" else steps.CompiledStep(static, "reduce-overhead")
            )
        except Exception as e:  # noqa: BLE001 (a form this model cannot take is recorded, not hidden)
            out[form] = {"status": failure("failed", e)}
    eager = steps.EagerStep(model, prompt)
    variants = {"eager": (eager, steps.setup(eager)), **{f: (s, steps.setup(s)) for f, s in built.items()}}
    progress(f"timing the eager step beside {', '.join(built) or 'nothing'}, {params.repeats} rounds interleaved")
    timed = harness.interleaved(
        variants, device=params.device, rounds=params.repeats, what="step forms", progress=progress
    )
    for form, t in timed.items():
        est = t.fast
        out[form] = {"status": "ok", "wall_ms": est.value, "basis": est.basis, "trials": est.trials, "of": est.of}
        if hasattr(built.get(form), "compile_s"):
            out[form]["compile_s"] = built[form].compile_s
    return out


def measure(
    model, about: dict, src: source.ModelSource, params: ProfileParams, root: Path, progress=ch.progress
) -> str:
    """The chapter's census of `model` (from `src`; `about`, what the run records of it: source.load),
    written as one run under `root`; its id."""
    w = recording.PendingRun(ch.DECLARATION, params, ceilings=False, progress=progress, root=root)
    if params.device == "cuda":  # the read stream and the GEMM in half precision (two bytes a value)
        hardware.record_ceilings(w, progress, params.dtype if params.dtype in models.DTYPES else models.DEFAULT_DTYPE)
    w.extra.update(about)
    prompt = decode.Prompt.random(model.config.vocab_size, params.batch, params.prompt_len, params.device)
    sweep = ch.ContextSweep(model, params, progress)
    times = sweep.time(prompt)
    if times is None:
        raise ProfileError(f"{src.folder}: the step ran out of memory at a {params.prompt_len}-token prompt")
    w.write_table("step_times", pd.DataFrame(times.rows()))
    w.write_table("context_times", pd.DataFrame(sweep.time_rows))
    if params.device == "cuda":
        w.extra["step_forms"] = step_forms(model, prompt, params, progress)
    progress(f"profiling one decode step (batch {params.batch}, prompt {params.prompt_len})")
    table = ch.profile_step(model, prompt, params.device, w.path / ch.TRACE_FILE)
    w.write_table("kernels", table)
    w.write_table("census", kernels.census(table))
    progress(f"  {len(table)} kernels")
    sweep.profile(w.path, table)
    w.write_table("context_sweep", sweep.table())
    w.write_table("context_census", pd.DataFrame(sweep.census_rows))
    w.write_table("context_ops", pd.DataFrame(sweep.op_rows))
    return w.write()


def profile(folder, *, allow_cpu: bool = False, out=None, dtype: str = "bfloat16", progress=ch.progress) -> runs.Run:
    """Check `folder`, measure its model and write the run under `out` (a runs folder; None:
    default_out()); returns the run, loaded back checked. Bad input is a SourceError or a
    ProfileError raised before anything is measured; a model the chapter's step cannot run (its
    cache, its forward) or that runs out of memory is a ProfileError too, and no run is written
    either way."""
    src = source.open_folder(folder)
    source.torch_dtype(dtype)
    device = device_here(allow_cpu)
    try:
        provenance.git_commit()  # a LABSUPPORT_GIT_COMMIT that cannot be this checkout's stops here
    except provenance.ProvenanceError as e:
        raise ProfileError(str(e)) from None
    model, about = source.load(src, device, dtype, progress)
    params = ProfileParams(model=src.folder.name, dtype=dtype, device=device)
    root = Path(out).expanduser() if out else default_out()
    try:
        run_id = measure(model, about, src, params, root, progress)
    except (
        ProfileError,
        provenance.ProvenanceError,
        runs.RunError,
        OSError,
        harness.TimingError,
        harness.ProfileError,
    ):
        raise  # ours, the disk's or the harness's (said by the command as they are), not the model's
    except Exception as e:  # noqa: BLE001 (a model the chapter's step cannot run: said in one line, naming it)
        raise ProfileError(
            f"{src.folder}: {type(model).__name__} cannot run the census's decode step ({first_line(e)})"
        ) from None
    return runs.load_run(ch.DECLARATION, run_id, root)


def _ms(v) -> str:
    return f"{v:.3f} ms" if v < 1 else f"{v:.2f} ms"


def _bytes(n) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e9 else f"{n / 1e6:.3g} MB"


def report(run: runs.Run) -> list[str]:
    """The short report of a profile run: its model, kernels by kind and by source (the ones no
    rule knows by name), busy time against the step's wall time, the floor and the practical
    ceiling, and what a CUDA graph and torch.compile buy; every number read from the run."""
    s, k = ch.summary(run), ch.kernel_table(run)
    m, src = run.results["model"], run.results["model_source"]
    on_gpu = run.provenance.get("device") == "cuda"
    unit = "kernels" if on_gpu else "operators (on a CPU the profiler sees ATen operators, not GPU kernels)"
    weights = (
        f"weights loaded from {', '.join(src['weight_files'])}" if src["weights"] == "loaded" else "random weights"
    )
    lines = [
        f"model: {src['architecture']} from {src['folder']}/ ({weights}; "
        f"config.json sha256 {src['config_sha256'][:12]}…)",
        f"  {m['parameters']:,} parameters; a decode step reads {_bytes(m['decode_bytes'])} "
        f"({models.run_dtype(run)}, batch {run.parameters['batch']}, {run.parameters['prompt_len']}-token prompt)",
        f"device: {run.provenance['gpu']}",
        f"{unit} per token: {s.kernels:,}"
        + (f", {s.kernels_per_layer} in each of {s.layers} layers" if s.kernels_per_layer else ""),
        "  by kind:",
    ]
    census = run.table("census")
    for r in census[(census.kind != "total") & (census.kernels > 0)].itertuples():
        lines.append(f"    {r.kind:<22} {r.kernels:>6,}  {r.gpu_ms:9.3f} ms  {r.share:6.1%}")
    lines.append("  by source:")
    for r in kernels.source_census(k).itertuples():
        lines.append(f"    {r.source:<32} {r.kernels:>6,}  {r.gpu_ns / 1e6:9.3f} ms")
    odd = kernels.unrecognised(k)
    if len(odd):
        named = ", ".join(f"{name} x{n}" for name, n in odd.head(5).items())
        more = f" and {len(odd) - 5} more names" if len(odd) > 5 else ""
        lines.append(f"  counted under other, by name: {named}{more}")
    busy = "GPU busy" if on_gpu else "operators busy"
    lines.append(
        f"{busy}: {_ms(s.gpu_busy_ms)} of a {_ms(s.wall_ms)} step ({s.busy_fraction:.0%}; step by the "
        f"{ch.estimator_text(s.estimator, s.fast_trials, s.trials)})"
    )
    if s.best_case_ms is not None:
        lines.append(
            f"floor: {_ms(s.best_case_ms)}, the step's bytes at the datasheet's {s.datasheet_tbs:.2f} TB/s "
            f"({s.datasheet_name}); the step took {s.wall_ms / s.best_case_ms:.1f} times that"
        )
    elif on_gpu:
        lines.append(f"floor: {run.provenance['gpu']} is not in the datasheet table, so no datasheet floor")
    lim = hardware.run_limits(run)
    if lim.ceiling_tbs:
        lines.append(
            f"practical ceiling: {lim.ceiling_tbs:.2f} TB/s measured in this run ({lim.ceiling_by}): "
            f"the step's bytes in {_ms(m['decode_bytes'] / 1e9 / lim.ceiling_tbs)}"
        )
    if not on_gpu:
        lines.append("floor and practical ceiling: none on a CPU (they are a GPU's memory bandwidth)")
    forms = run.results.get("step_forms")
    if forms:
        eager = forms["eager"]["wall_ms"]
        for form in FORMS:
            f = forms.get(form, {})
            if f.get("status") != "ok":
                lines.append(f"{form}: not measured here ({f.get('status', 'not run')})")
                continue
            took = f" (compiling took {f['compile_s']:.0f} s)" if "compile_s" in f else ""
            lines.append(
                f"{form}: {_ms(f['wall_ms'])} against the eager {_ms(eager)} timed beside it: "
                f"{eager / f['wall_ms']:.2f} times as fast{took}"
            )
        lines += _two_eager_steps(forms, s.wall_ms)
    else:
        lines.append("CUDA graph and torch.compile: GPU only, not measured on a CPU")
    return lines


def example(gallery_runs) -> runs.Run | None:
    """The newest run of `profile` among `gallery_runs` (runs.Run), the report *Run a chapter yourself*
    shows: a census of a model folder measured on a GPU with its step forms (None where there is none)."""
    made = [
        r for r in gallery_runs if r.chapter == ch.CHAPTER and "model_source" in r.results and "step_forms" in r.results
    ]
    return max(made, key=lambda r: r.run_id, default=None)


EAGER_AGREEMENT = 0.10  # the two eager timings of one run, beyond which the report sets the forms against both


def _two_eager_steps(forms: dict, step_ms: float) -> list[str]:
    """Where the eager step timed beside the CUDA graph and the compiled step is more than
    EAGER_AGREEMENT from the step of the wall-time line (timed before either was built), the line
    that says so and sets each form against that step too: the reader sees both, in one place."""
    eager = forms["eager"]["wall_ms"]
    if math.isnan(step_ms) or abs(eager / step_ms - 1) <= EAGER_AGREEMENT:
        return []
    ran = {f: forms[f]["wall_ms"] for f in FORMS if forms.get(f, {}).get("status") == "ok"}
    against = ", ".join(f"{form} {step_ms / ms:.2f} times as fast" for form, ms in ran.items())
    return [
        f"  the eager step beside them took {eager / step_ms - 1:+.0%} against the {_ms(step_ms)} step above, "
        f"timed before they were built" + (f"; against that step: {against}" if against else "")
    ]


def main(folder, *, allow_cpu: bool = False, out=None, dtype: str = "bfloat16") -> int:
    """The command: the run and its report (exit 0), or one line saying why not (exit 1)."""
    import sys

    os.environ["TORCHINDUCTOR_FORCE_DISABLE_CACHES"] = "1"  # a cold compile, as the chapters' (ops.live)
    try:
        run = profile(folder, allow_cpu=allow_cpu, out=out, dtype=dtype)
    except (ProfileError, source.SourceError) as e:
        print(f"profile refused: {e}; nothing was written", file=sys.stderr)
        return 1
    root = run.path.parent.parent
    print("\n".join(report(run)))
    print(f"run: {run.path}")
    print(f"share it: LABSUPPORT_RUNS={root} python -m labsupport pack {ch.CHAPTER} {run.run_id}")
    return 0
