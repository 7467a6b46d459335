"""What the notebook's live cells call: the check that the box has the GPUs, the torchrun
command that measures every rank (labsupport.measure.distributed.tensor_parallel), and the collection of
every rank's results into the one run the cells fill."""

from __future__ import annotations

import collections
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
from dataclasses import replace
from pathlib import Path

import pandas as pd

from labsupport.chapters.one_token_two_gpus.declaration import Params
from labsupport.chapters.one_token_two_gpus.params import CHAPTER, DECLARATION, progress, trace_file
from labsupport.chapters.one_token_two_gpus.topology import interconnect, link_between
from labsupport.measure import decode, recording
from labsupport.runs.provenance import REPO_ROOT

WORKER = "labsupport.measure.distributed.tensor_parallel"
EXIT_GRACE_S = 30.0  # a launch whose ranks are all done and that has not exited by then is stopped


class TooFewGPUs(decode.NoGPUError):
    """Live mode was asked for more GPUs than the box has."""


def gpus_here() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def require_gpus(params: Params) -> None:
    """Stop, in one line, before anything is measured when the box has fewer GPUs than the run
    asks for (on a CPU, the tests' tiny model, the ranks are processes)."""
    if params.gpus < 2:
        raise ValueError(f"{CHAPTER}: gpus must be at least 2 (the TP=1 run comes with it), not {params.gpus}")
    if params.device == "cpu" and params.preset.startswith("tiny"):
        return
    have = gpus_here()
    if have < params.gpus:
        raise TooFewGPUs(
            f"{CHAPTER} needs {params.gpus} GPUs and this box has {have}; use mode='replay' to read the recorded run"
        )


def pending_run(params: Params, run_id: str | None = None) -> recording.PendingRun:
    """The chapter's run, filled cell by cell and written by the last live cell
    (recording.PendingRun), after the check that the box has the GPUs."""
    require_gpus(params)
    return recording.PendingRun(DECLARATION, params, run_id, progress=progress)


def torchrun_command(params: Params, tp: int, out: Path, sweep: bool) -> list[str]:
    """The command that measures the step on `tp` ranks (one per GPU) into `out`."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1"]
    cmd += ["--nproc-per-node", str(tp), "-m", WORKER, "--out", str(out), "--device", params.device]
    cmd += ["--preset", params.preset, "--prompt-len", str(params.prompt_len), "--batch", str(params.batch)]
    cmd += ["--dtype", params.dtype]
    cmd += ["--repeats", str(params.repeats), "--variants", *params.variants]
    if sweep:
        cmd += ["--sweep", "--sweep-max", str(params.sweep_max), "--sweep-iters", str(params.sweep_iters)]
    return cmd


def launch(cmd: list[str], log_lines: int = 30, exit_grace_s: float = EXIT_GRACE_S) -> None:
    """Run a torchrun command, echoing the ranks' progress lines; a failure raises with the end
    of its log. Once every rank has said it is done (its results written, the others met), a
    launch still running `exit_grace_s` later is stopped, and counts as finished."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
    ranks = int(cmd[cmd.index("--nproc-per-node") + 1])
    tail, done, stopped, timer = collections.deque(maxlen=log_lines), 0, threading.Event(), None

    def stop(p):
        if p.poll() is None:
            stopped.set()
            os.killpg(p.pid, signal.SIGKILL)

    with subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True
    ) as p:
        try:
            for line in p.stdout:
                tail.append(line.rstrip())
                if line.startswith("[TP="):
                    progress(line.rstrip())
                if re.match(r"\[TP=\d+ rank \d+\] done$", line.rstrip()):
                    done += 1
                    if done == ranks:
                        timer = threading.Timer(exit_grace_s, stop, (p,))
                        timer.start()
        except BaseException:  # interrupted: no rank outlives the notebook (they are in their own session)
            stop(p)
            raise
    if timer is not None:
        timer.cancel()
    if stopped.is_set():
        progress(f"every rank was done but the launch had not exited {exit_grace_s:.0f} s later; stopped it")
    elif p.returncode:
        raise RuntimeError(f"{CHAPTER}: torchrun exited with {p.returncode}; its last lines:\n" + "\n".join(tail))


def relaunch_eager(params: Params, tp: int, out: Path, why: BaseException, sweep: bool) -> Path:
    """After a launch died (a crash in a CUDA-graph capture or a compile takes every rank with
    it): launch again with the eager step alone into `out`, and record each other form asked
    for as failed, with the last line of the first launch's log. Returns `out`."""
    lines = [ln for ln in str(why).splitlines() if ln.strip()]
    reason = f"failed: the ranks died ({lines[-1][:160] if lines else type(why).__name__})"
    progress(f"TP={tp}: the launch died; again with the eager step alone")
    launch(torchrun_command(replace(params, variants=["eager"]), tp, out, sweep=sweep))
    for folder in Path(out).glob("rank*"):
        v = pd.read_csv(folder / "variants.csv")
        rank = int(folder.name[4:])
        lost = [{"variant": x, "status": reason, "tp": tp, "rank": rank} for x in params.variants if x != "eager"]
        pd.concat([v, pd.DataFrame(lost)], ignore_index=True).to_csv(folder / "variants.csv", index=False)
    return out


def collect(w: recording.PendingRun, out: Path, tp: int) -> None:
    """Add every rank's tables, traces and facts under `out` (one folder per rank) to `w`, the run being written."""
    ranks = sorted((p for p in Path(out).glob("rank*") if p.is_dir()), key=lambda p: int(p.name[4:]))
    if len(ranks) != tp:
        raise RuntimeError(f"{CHAPTER}: TP={tp} wrote {len(ranks)} rank folders under {out}")
    for folder in ranks:
        rank = int(folder.name[4:])
        for name in ("variants", "step_times", "collectives", "allreduce"):
            if (folder / f"{name}.csv").is_file():
                df = pd.read_csv(folder / f"{name}.csv")
                old = w.tables.get(name)
                w.tables[name] = df if old is None else pd.concat([old, df], ignore_index=True)
        for trace in folder.glob("trace-*.json.gz"):
            variant = trace.name.removeprefix("trace-").removesuffix(".json.gz")
            shutil.copyfile(trace, w.path / trace_file(tp, rank, variant))
        info = json.loads((folder / "info.json").read_text())
        w.extra.setdefault("ranks", []).append({"tp": tp, **{k: v for k, v in info.items() if k != "method"}})
        w.extra.setdefault("model", info["model"])
        w.extra.setdefault("worker_method", info["method"])


def record_topology(w: recording.PendingRun) -> None:
    """`nvidia-smi topo -m` into the run (topology.txt) and the link between GPU 0 and 1 into its
    results; nothing on a box without nvidia-smi (a CPU)."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        text = subprocess.run([exe, "topo", "-m"], capture_output=True, text=True, timeout=60, check=True).stdout
        (w.path / "topology.txt").write_text(text)
        link = link_between(text)
        w.extra["interconnect"] = {"gpu0_gpu1": link, "means": interconnect(link)}
