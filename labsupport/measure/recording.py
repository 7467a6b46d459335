"""Open a new run of a chapter: the checks every live chapter makes before it measures, then
the writer that leaves nothing behind unless the whole block succeeds.

    with recording.recording("launch-overhead", params) as run:
        ...                       # measure; run.write_table("variants", df)
    # here runs/launch-overhead/<run id>/ exists, whole (labsupport.runs.RunWriter)
"""

from __future__ import annotations

import contextlib
from dataclasses import asdict

from labsupport import runs
from labsupport.measure import decode, hardware, harness, models
from labsupport.runs import provenance


def writer(chapter: str, params, run_id: str | None = None, allow_cpu: bool = False) -> runs.RunWriter:
    """The writer of a new live run of `chapter`, after the checks every chapter makes first:
    a known model preset (if the parameters name one), a GPU to measure (a CPU only for the
    tests' tiny model), provenance collected now, and a run id naming the GPU."""
    if getattr(params, "preset", None):
        models.preset_config(params.preset)
    decode.require_device(params.device, allow_cpu=allow_cpu and getattr(params, "preset", "").startswith("tiny"))
    prov = provenance.collect()
    run_id = run_id or runs.new_run_id(prov["gpu"].replace("NVIDIA", ""))
    return runs.RunWriter(chapter, asdict(params), run_id, meta={"provenance": prov})


@contextlib.contextmanager
def recording(
    chapter: str, params, run_id: str | None = None, *, allow_cpu: bool = False, ceilings: bool = False, progress=print
):
    """A new run of `chapter`, open for writing: errors name the chapter, meta.json records how
    each kind of number was taken (harness.method) and, with `ceilings` on a GPU, the run
    starts with the measured copy, read and GEMM ceilings (ceilings.csv)."""
    harness.for_chapter(chapter)
    with writer(chapter, params, run_id, allow_cpu=allow_cpu) as w:
        w.extra["method"] = harness.method()
        if ceilings and getattr(params, "device", "cuda") == "cuda":
            hardware.record_ceilings(w, progress)
        yield w
