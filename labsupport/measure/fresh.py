"""Time the eager decode step in fresh processes that never profile.

The same step, on the same GPU, runs at different speeds in different processes (on the lent
box some processes are about 1.5x slower from their start). One process's median is therefore
not the step's time: the chapters start several fresh processes, each builds the model, times
the step and reports its median with the CPU it ran on, and the book shows every process.

    python -m labsupport.measure.fresh --preset qwen3-8b --prompt-len 256 --repeats 20

prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from dataclasses import asdict, dataclass

from labsupport.runs.provenance import REPO_ROOT


@dataclass
class ProcessTiming:
    """One fresh process's timing of the eager decode step (ms)."""

    process: int
    pid: int
    wall_ms_median: float
    wall_ms_min: float
    wall_ms_max: float
    issue_ms_median: float
    repeats: int
    cpu_model: str
    loadavg_1m_before: float
    loadavg_1m_after: float


def _measure(
    preset: str, batch: int, prompt_len: int, repeats: int, device: str, process: int, dtype: str = "bfloat16"
) -> ProcessTiming:
    import statistics

    from labsupport.measure import decode, harness, models

    before = harness.host()
    model = models.build_model(preset, device=device, dtype=dtype)
    prompt = decode.Prompt.random(model.config.vocab_size, batch, prompt_len, device)
    t = decode.time_decode_steps(model, prompt, device, repeats=repeats)
    after = harness.host()
    return ProcessTiming(
        process=process,
        pid=os.getpid(),
        wall_ms_median=t.median,
        wall_ms_min=t.low,
        wall_ms_max=t.high,
        issue_ms_median=statistics.median(t.issue_ms),
        repeats=repeats,
        cpu_model=before["cpu_model"],
        loadavg_1m_before=before["loadavg_1m"],
        loadavg_1m_after=after["loadavg_1m"],
    )


def in_fresh_processes(
    n: int,
    preset: str,
    prompt_len: int,
    repeats: int,
    batch: int = 1,
    device: str = "cuda",
    progress=print,
    dtype: str = "bfloat16",
) -> list[ProcessTiming]:
    """Start `n` processes one after another, each timing the step once; their results."""
    out = []
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH")) if p)}
    for i in range(n):
        cmd = [
            sys.executable,
            "-m",
            "labsupport.measure.fresh",
            "--preset",
            preset,
            "--prompt-len",
            str(prompt_len),
            "--batch",
            str(batch),
            "--repeats",
            str(repeats),
            "--device",
            device,
            "--process",
            str(i),
            "--dtype",
            dtype,
        ]
        done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO_ROOT)
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["no output"])[-1]
            raise RuntimeError(f"fresh process {i} timing the decode step failed: {last}")
        out.append(ProcessTiming(**json.loads(done.stdout.strip().splitlines()[-1])))
        progress(f"  fresh process {i}: median {out[-1].wall_ms_median:.2f} ms")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", required=True)
    ap.add_argument("--prompt-len", type=int, required=True)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--process", type=int, default=0)
    ap.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16"))
    a = ap.parse_args(argv)
    r = _measure(a.preset, a.batch, a.prompt_len, a.repeats, a.device, a.process, a.dtype)
    print(json.dumps(asdict(r)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
