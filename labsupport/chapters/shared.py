"""The quantities more than one chapter shows, each measured by one chapter (its owner) and read
from the owner's run by every other page that shows it: one quantity, one measurement, one
glue name, the same digits on every page.

    shared.glue_values()                     # in a notebook: glue every shared quantity
    {glue:text}`eager_wall_ms` ms            # in its prose: the same text on every page

The owner computes its quantities from its own run (its chapter module's `shared(run)`, keyed
by the names below); this module loads the owner's published run (or the run a notebook hands
it: the one it has just recorded) and formats each value once, with the format declared here.
Chapters never re-measure a shared quantity, and never glue one under another name.
"""

# ruff: noqa: E501  (the table of quantities reads best one quantity per line)
from __future__ import annotations

import math
from dataclasses import dataclass

from labsupport import runs
from labsupport.chapters import kernels_in_one_token, launch_overhead, why_a_gpu
from labsupport.measure import hardware


@dataclass(frozen=True)
class Quantity:
    name: str  # the glue name, on every page
    owner: str  # the chapter whose run measures it
    what: str  # one line: what it is and how it was taken
    unit: str
    fmt: str  # how every page shows it


def _q(name, owner, what, unit, fmt) -> Quantity:
    return Quantity(name, owner, what, unit, fmt)


CEILINGS, EAGER, FORMS = "why-a-gpu", "kernels-in-one-token", "launch-overhead"
QUANTITIES = {
    q.name: q
    for q in (
        _q("datasheet_tbs", CEILINGS, "the GPU's memory bandwidth on its datasheet", "TB/s", "{:.2f}"),
        _q("datasheet_tflops", CEILINGS, "the GPU's dense BF16 math rate on its datasheet", "TFLOP/s", "{:,.0f}"),
        _q("copy_tbs", CEILINGS, "a large device-to-device copy, bytes read plus written: what a copy reaches, not a ceiling", "TB/s", "{:.2f}"),
        _q("read_tbs", CEILINGS, "a large read stream, bytes read (the better of a sum and a matrix-vector product)", "TB/s", "{:.2f}"),
        _q("gemm_tflops", CEILINGS, "a large BF16 matrix multiply", "TFLOP/s", "{:,.0f}"),
        _q("step_gb", CEILINGS, "the bytes one decode step must read: every weight outside the embedding table, once", "GB", "{:.2f}"),
        _q("floor_ms", CEILINGS, "the floor: the step's bytes over the datasheet bandwidth (no kernel can beat it)", "ms", "{:.2f}"),
        _q("ceiling_tbs", CEILINGS, "the practical ceiling: the best read rate any kernel reached in the run (the read stream, cuBLAS and the book's Triton GEMV at every weight shape of the step, on Hopper also as the last rungs launch it), never a copy's (hardware.practical_ceiling; a kernel the book shows may pass it by hardware.CEILING_TOLERANCE at most)", "TB/s", "{:.2f}"),
        _q("ceiling_ms", CEILINGS, "the step's bytes at the practical ceiling", "ms", "{:.2f}"),
        _q("measured_ridge", CEILINGS, "the measured ridge: the measured GEMM rate over the practical ceiling (hardware.Limits.measured_ridge)", "FLOP/byte", "{:.0f}"),
        _q("eager_wall_ms", EAGER, "the eager decode step's wall time: the median of the interleaved trials taken on a fast host (host probe within 15% of its best reading; the minimum in runs without per-trial probe readings)", "ms", "{:.1f}"),
        _q("eager_wall_median_ms", EAGER, "the eager step's wall time: the median of all the trials, slow-host ones included", "ms", "{:.1f}"),
        _q("eager_wall_q1_ms", EAGER, "the eager step's wall time: first quartile of the fast-host trials", "ms", "{:.1f}"),
        _q("eager_wall_q3_ms", EAGER, "the eager step's wall time: third quartile of the fast-host trials", "ms", "{:.1f}"),
        _q("eager_wall_min_ms", EAGER, "the eager step's wall time: the minimum of the fast-host trials", "ms", "{:.1f}"),
        _q("eager_trials", EAGER, "the number of timed eager steps", "", "{:,d}"),
        _q("eager_fast_trials", EAGER, "the number of timed eager steps taken on a fast host (those eager_wall_ms is the median of)", "", "{:,d}"),
        _q("eager_issue_ms", EAGER, "the eager step's issue time: until the CPU had queued its last kernel (the same estimator, the same trials)", "ms", "{:.1f}"),
        _q("eager_gpu_busy_ms", EAGER, "the GPU's busy time in the profiled eager step", "ms", "{:.2f}"),
        _q("eager_kernels", EAGER, "kernels in the eager step", "", "{:,d}"),
        _q("eager_matmul_tbs", EAGER, "the read rate of the eager step's matrix multiplies (bytes over their GPU time)", "TB/s", "{:.2f}"),
        _q("eager_kernel_mean_us", EAGER, "the eager step's mean kernel duration", "µs", "{:.1f}"),
        _q("eager_arrival_us", EAGER, "the eager step's wall time per kernel: a kernel arrived this often", "µs", "{:.1f}"),
        _q("static_wall_ms", EAGER, "the eager step with a static cache, same prompt: wall time (fast-host median of trials interleaved with the dynamic cache's)", "ms", "{:.1f}"),
        _q("static_gpu_busy_ms", EAGER, "the static-cache step's GPU busy time (profiled)", "ms", "{:.2f}"),
        _q("static_kernels", EAGER, "kernels in the static-cache step", "", "{:,d}"),
        _q("graph_wall_ms", FORMS, "the static-cache step replayed from a CUDA graph: wall time (fast-host median of interleaved trials)", "ms", "{:.2f}"),
        _q("graph_gpu_busy_ms", FORMS, "the CUDA-graph step's GPU busy time", "ms", "{:.2f}"),
        _q("graph_kernels", FORMS, "kernels in the CUDA-graph step", "", "{:,d}"),
        _q("compiled_wall_ms", FORMS, 'torch.compile (mode "reduce-overhead"): wall time (fast-host median of interleaved trials)', "ms", "{:.2f}"),
        _q("compiled_gpu_busy_ms", FORMS, "the compiled step's GPU busy time", "ms", "{:.2f}"),
        _q("compiled_kernels", FORMS, "kernels in the compiled step", "", "{:,d}"),
        _q("autotune_wall_ms", FORMS, 'torch.compile (mode "max-autotune"): wall time (fast-host median of interleaved trials)', "ms", "{:.2f}"),
        _q("autotune_gpu_busy_ms", FORMS, "the max-autotune step's GPU busy time", "ms", "{:.2f}"),
        _q("autotune_kernels", FORMS, "kernels in the max-autotune step", "", "{:,d}"),
    )
}  # fmt: skip
OWNERS = tuple(dict.fromkeys(q.owner for q in QUANTITIES.values()))
# The owners' packages: each one's DECLARATION (to load its run) and shared(run) (its quantities).
PACKAGES = {p.DECLARATION.slug: p for p in (why_a_gpu, kernels_in_one_token, launch_overhead)}


class Shown:
    """A value glued as its one text: `{glue:text}` and `{glue:md}` show `text` (no quotes, no
    tuple), on every page alike."""

    def __init__(self, text: str):
        self.text = text

    def __repr__(self) -> str:
        # quoted: myst-nb's {glue:text} evaluates text/plain as a Python literal before it shows it,
        # and "2,218" unquoted is the tuple (2, 218)
        return repr(self.text)

    def __str__(self) -> str:
        return self.text

    def _repr_markdown_(self) -> str:  # `{glue:md}` shows the same text
        import html

        return html.escape(self.text, quote=False)


@dataclass(frozen=True)
class Value:
    quantity: Quantity
    value: float
    run: runs.Run  # the owner's run it was computed from

    @property
    def text(self) -> str:
        v = self.value
        if v is None or (isinstance(v, float) and not math.isfinite(v)):
            return "–"
        return self.quantity.fmt.format(int(v) if "d}" in self.quantity.fmt else v)


def owner_values(owner: str, run: runs.Run) -> dict[str, float]:
    """The owner chapter's shared quantities from its run, checked against the declaration."""
    got = PACKAGES[owner].shared(run)
    want = {n for n, q in QUANTITIES.items() if q.owner == owner}
    if set(got) != want:
        raise runs.RunError(f"{owner}: shared() gives {sorted(set(got) ^ want)} against the declaration")
    return got


def values(given: dict[str, runs.Run] | None = None, root=None) -> dict[str, Value]:
    """Every shared quantity, from each owner's published run (or the run `given` for it)."""
    given = given or {}
    out = {}
    for owner in OWNERS:
        run = given.get(owner) or owner_run(owner, root=root)
        for name, v in owner_values(owner, run).items():
            out[name] = Value(QUANTITIES[name], v, run)
    return out


def glue_values(given: dict[str, runs.Run] | None = None) -> dict[str, Value]:
    """Glue every shared quantity under its name, formatted once (Shown); returns them, so the
    page's own numbers can be computed against the same values."""
    from labsupport import glue

    vals = values(given)
    for name, v in vals.items():
        glue.glue(name, Shown(v.text))
    for owner in OWNERS:
        run = next(v.run for v in vals.values() if v.quantity.owner == owner)
        glue.glue(f"shared_run_{owner.replace('-', '_')}", Shown(run.run_id))
    return vals


def limits(given: dict[str, runs.Run] | None = None, root=None) -> hardware.Limits:
    """The ceilings every chapter compares against: those measured in the ceilings owner's run, its
    practical ceiling (`ceiling_tbs`, the shared quantity of that name) and its measured ridge."""
    run = (given or {}).get(CEILINGS) or owner_run(CEILINGS, root=root)
    return hardware.run_limits(run)


def limits_for(run: runs.Run) -> hardware.Limits:
    """The ceilings a chapter's `run` is set against: the ceilings owner's (limits()) where that run
    was recorded on the same GPU; else `run`'s own GPU's datasheet alone, since a ceiling measured on
    another GPU says nothing of this one (and where no owner's run is published: a scratch folder)."""
    from labsupport.measure import models

    sheet = hardware.datasheet_or_none(run.provenance["gpu"])
    try:
        lim = limits()
    except runs.RunError:
        lim = None
    if lim is not None and sheet is not None and lim.datasheet_name == sheet.name:
        return lim
    return hardware.Limits(
        datasheet_name=sheet.name if sheet else None,
        datasheet_tflops=sheet.tensor_tflops(models.run_dtype(run)) if sheet else None,
        datasheet_tbs=sheet.bandwidth_tbs if sheet else None,
        gemm_tflops=None,
        copy_tbs=None,
    )


def owner_run(owner: str, run_id: str | None = None, root=None) -> runs.Run:
    """The owner chapter's published run (or `run_id`), loaded with its declaration."""
    return runs.load_run(PACKAGES[owner].DECLARATION, run_id, root)
