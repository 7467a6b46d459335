"""Run chapter notebooks live through papermill: each records a new run, which is
published only once its notebook has finished without error."""
from __future__ import annotations

import os
import shlex
import sys
import time
from pathlib import Path

from . import chapters, runs
from .provenance import REPO_ROOT

LOG_DIR = REPO_ROOT / "build" / "live"


class LiveRunError(RuntimeError):
    """A chapter notebook failed during a live run."""


def check_gpu(allow_cpu: bool) -> None:
    """Stop before starting any notebook when there is no GPU to measure."""
    import torch

    if not torch.cuda.is_available() and not allow_cpu:
        raise SystemExit("live mode needs a CUDA GPU and none is visible; the book replays the "
                         "recorded runs instead (make book)")


def run_chapter(chapter: chapters.Chapter, run_id: str, parameters: dict, log_dir: Path,
                publish: bool = True) -> Path:
    """Execute one chapter notebook live; return the executed notebook's path."""
    import papermill as pm

    log_dir.mkdir(parents=True, exist_ok=True)
    out = log_dir / Path(chapter.notebook).name
    params = {"mode": "live", "run_id": run_id, **parameters}
    try:
        pm.execute_notebook(str(chapter.path), str(out), parameters=params, cwd=str(chapter.path.parent),
                            kernel_name="python3", progress_bar=True, log_output=True,
                            request_save_on_cell_execute=True)
    except Exception as e:  # papermill raises PapermillExecutionError with the cell's traceback
        first = str(e).strip().splitlines()
        reason = next((ln for ln in reversed(first) if ln.strip()), type(e).__name__)
        raise LiveRunError(f"{chapter.slug}: notebook failed ({reason}); executed notebook kept at {out}; "
                           f"the published run is unchanged") from None
    runs.load_run(chapter.slug, run_id)  # the notebook must have written a whole run
    if publish:
        runs.publish(chapter.slug, run_id)
    return out


def main(names: list[str], parameters: dict, allow_cpu: bool = False, publish: bool = True,
         tag: str | None = None) -> int:
    check_gpu(allow_cpu)
    selected = chapters.find(names)
    if tag is None:
        import torch
        tag = torch.cuda.get_device_name(0).replace("NVIDIA", "") if torch.cuda.is_available() else "cpu"
    run_id = runs.new_run_id(tag)
    # The notebook kernels must import this checkout's labsupport, whatever the caller's path.
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH")) if p)
    os.environ.setdefault("LABSUPPORT_COMMAND", " ".join(shlex.quote(a) for a in ["python", "-m", "labsupport", *sys.argv[1:]]))
    log_dir = LOG_DIR / run_id
    total = time.perf_counter()
    for i, ch in enumerate(selected, 1):
        print(f"[{i}/{len(selected)}] {ch.slug}: running {ch.notebook} live (run {run_id})", flush=True)
        t = time.perf_counter()
        try:
            run_chapter(ch, run_id, parameters, log_dir, publish=publish)
        except LiveRunError as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
        seconds = time.perf_counter() - t
        if publish:
            from . import history
            history.append(history.rows_for(f"live {run_id}", ch, runs.load_run(ch.slug, run_id), seconds))
        verb = "published" if publish else "recorded"
        print(f"[{i}/{len(selected)}] {ch.slug}: {verb} run {run_id} in {seconds:.0f} s", flush=True)
    print(f"live run done in {time.perf_counter() - total:.0f} s; executed notebooks in {log_dir}", flush=True)
    return 0
