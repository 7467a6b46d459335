"""Open a new run of a chapter: the checks every live chapter makes before it measures, then
the writer that leaves nothing behind unless the whole block succeeds.

    with recording.recording("launch-overhead", params) as run:
        ...                       # measure; run.write_table("variants", df)
    # here runs/launch-overhead/<run id>/ exists, whole (labsupport.runs.RunWriter)
"""

from __future__ import annotations

import contextlib
import functools
import shutil
import tempfile
from dataclasses import asdict
from pathlib import Path

import pandas as pd

from labsupport import runs
from labsupport.measure import decode, hardware, harness, hostprobe, models
from labsupport.runs import provenance
from labsupport.traces import replay


def writer(chapter: str, params, run_id: str | None = None, allow_cpu: bool = False) -> runs.RunWriter:
    """The writer of a new live run of `chapter`, after the checks every chapter makes first:
    a known model preset (if the parameters name one), a GPU to measure (a CPU only for the
    tests' tiny model), provenance collected now, and a run id naming the GPU."""
    if getattr(params, "preset", None):
        models.preset_config(params.preset)
    decode.require_device(params.device, allow_cpu=allow_cpu and getattr(params, "preset", "").startswith("tiny"))
    prov = provenance.collect()
    run_id = run_id or runs.new_run_id(prov["gpu"].replace("NVIDIA", ""))
    w = runs.RunWriter(chapter, asdict(params), run_id, meta={"provenance": prov})
    # Beside each profiler trace, the tables replay reads instead of parsing it.
    w.derive = functools.partial(replay.derive_folder, device=prov["device"])
    return w


@contextlib.contextmanager
def recording(
    chapter: str, params, run_id: str | None = None, *, allow_cpu: bool = False, ceilings: bool = False, progress=print
):
    """A new run of `chapter`, open for writing: errors name the chapter, meta.json records how
    each kind of number was taken (harness.method) and, with `ceilings` on a GPU, the run
    starts with the measured copy, read and GEMM ceilings (ceilings.csv)."""
    harness.for_chapter(chapter)
    hostprobe.reset()
    hostprobe.read("run opened")
    with writer(chapter, params, run_id, allow_cpu=allow_cpu) as w:
        w.extra["method"] = harness.method()
        if ceilings and getattr(params, "device", "cuda") == "cuda":
            hardware.record_ceilings(w, progress)
        yield w
        hostprobe.read("run written")
        w.extra["host_probe"] = hostprobe.readings()


class PendingRun:
    """A run measured across several notebook cells and written by the last one, whole.

    Created first: the checks every live run makes (a known preset, a GPU), the provenance and
    the run id (writer), how the numbers are taken (harness.method) and, on a GPU, the ceilings
    (hardware.record_ceilings). Then each cell adds tables (`write_table`), results (`extra`)
    and traces (under `path`, a scratch folder); `write()` puts them all into the run at once.
    A cell that fails leaves no run behind. The host probe's readings (labsupport.measure.hostprobe),
    from the run's opening to its writing, go into the run's results as `host_probe`."""

    def __init__(
        self,
        chapter: str,
        params,
        run_id: str | None = None,
        *,
        allow_cpu: bool = False,
        ceilings: bool = True,
        progress=print,
    ):
        harness.for_chapter(chapter)
        hostprobe.reset()
        hostprobe.read("run opened")
        self.chapter = chapter
        self.writer = writer(chapter, params, run_id, allow_cpu=allow_cpu)
        self.tables: dict[str, pd.DataFrame] = {}
        self.extra: dict = {"method": harness.method()}
        self._scratch = tempfile.TemporaryDirectory(prefix=f"{chapter}-")
        self.path = Path(self._scratch.name)
        if ceilings and getattr(params, "device", "cuda") == "cuda":
            hardware.record_ceilings(self, progress)

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
            hostprobe.read("run written")
            w.extra["host_probe"] = hostprobe.readings()
        self._scratch.cleanup()
        return w.run_id
