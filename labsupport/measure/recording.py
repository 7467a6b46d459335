"""Open a new run of a chapter, the one way every chapter notebook does: the checks every live
chapter makes before it measures, then a run that is written only when the measuring is done.

    w = recording.PendingRun(ch.DECLARATION, params, run_id, ceilings=False)  # the chapter's declaration
    ...                           # measure, in one cell or several: w.write_table("variants", df),
                                  # w.extra["key"] = value, traces under w.path
    run_id = w.write()            # here runs/launch-overhead/<run id>/ exists, whole
"""

from __future__ import annotations

import functools
import shutil
import tempfile
from dataclasses import asdict
from pathlib import Path

import pandas as pd

from labsupport import runs
from labsupport.measure import compiling, decode, environment, hardware, harness, hostprobe, models
from labsupport.runs import provenance
from labsupport.traces import derived


def writer(declaration, params, run_id: str | None = None, root: Path | None = None) -> runs.RunWriter:
    """The writer of a new live run of the chapter `declaration` declares (into the runs folder `root`;
    None: runs_root(); its tables are checked against the declaration when written), after the checks
    every chapter makes first: a known model preset (if the parameters name one), a GPU to measure (a
    CPU only for the tests' tiny model, or a model folder: parameters with a `model`, which `profile`
    runs on a CPU only with --allow-cpu) with the memory for the model (a model folder's is checked
    when it is built: models.source.for_params), provenance collected now, and a run id naming the
    GPU."""
    if getattr(params, "preset", None):
        models.preset_config(params.preset)
    small = getattr(params, "preset", "").startswith("tiny") or bool(getattr(params, "model", ""))
    decode.require_device(params.device, allow_cpu=small)
    if params.device == "cuda" and getattr(params, "preset", None):
        # The model fits in the GPU's memory (LABSUPPORT_GPU_MEMORY_GB caps the allocator here): the
        # notebook's first check knew only the preset its overrides name, not the default. A model
        # folder is checked from its own byte count when it is built (models.source.for_params).
        preset = None if getattr(params, "model", "") else params.preset
        stop, _ = environment.gpu_lines(preset, getattr(params, "dtype", None))
        if stop:
            raise environment.EnvironmentProblem("; ".join(stop))
    prov = provenance.collect()
    run_id = run_id or runs.new_run_id(prov["gpu"].replace("NVIDIA", ""))
    w = runs.RunWriter(declaration, asdict(params), run_id, root=root, meta={"provenance": prov})
    # Beside each profiler trace, the tables replay reads instead of parsing it.
    w.derive = functools.partial(derived.derive_folder, device=prov["device"])
    return w


class PendingRun:
    """A run measured across several notebook cells and written by the last one, whole.

    Created first: the checks every live run makes (a known preset, a GPU), the provenance and
    the run id (writer), how the numbers are taken (harness.method) and, on a GPU, the ceilings
    (hardware.record_ceilings). Then each cell adds tables (`write_table`), results (`extra`)
    and traces (under `path`, a scratch folder); `write()` puts them all into the run at once.
    A cell that fails leaves no run behind. The host probe's readings (labsupport.measure.hostprobe),
    from the run's opening to its writing, go into the run's results as `host_probe`, the
    measurements that ended on a slow host (harness.interleaved) as `host_slow`, and what inductor
    did in the process (labsupport.measure.compiling.record) as `compile`."""

    def __init__(
        self,
        declaration,
        params,
        run_id: str | None = None,
        *,
        ceilings: bool = True,
        progress=print,
        root: Path | None = None,
    ):
        chapter = declaration.slug
        harness.for_chapter(chapter)
        hostprobe.reset()
        hostprobe.read("run opened")
        self.chapter = chapter
        self.writer = writer(declaration, params, run_id, root=root)
        self.tables: dict[str, pd.DataFrame] = {}
        self.extra: dict = {"method": harness.method()}
        self._scratch = tempfile.TemporaryDirectory(prefix=f"{chapter}-")
        self.path = Path(self._scratch.name)
        if ceilings and getattr(params, "device", "cuda") == "cuda":
            # the read and the GEMM in the model's dtype (chapters without the parameter: BF16)
            hardware.record_ceilings(self, progress, getattr(params, "dtype", "bfloat16"))

    def write_table(self, name: str, df: pd.DataFrame) -> None:
        self.tables[name] = df

    def write(self) -> str:
        """Write the run (tables, traces, results); returns its id."""
        with self.writer as w:
            for name, df in self.tables.items():
                w.write_table(name, df)
            for p in sorted(self.path.iterdir()):
                if p.is_file() and not p.name.startswith("."):
                    shutil.copyfile(p, w.path / p.name)
            w.extra.update(self.extra)
            w.extra["compile"] = compiling.record()
            hostprobe.read("run written")
            w.extra["host_probe"] = hostprobe.readings()
            w.extra["host_slow"] = hostprobe.slow_notes()  # measurements with too few fast-host trials
        self._scratch.cleanup()
        return w.run_id
