"""Where a run came from: GPU, driver, CUDA, library versions, git commit, time, command."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]

REQUIRED_FIELDS = (
    "gpu",
    "driver",
    "cuda",
    "torch",
    "transformers",
    "python",
    "git_commit",
    "utc_time",
    "command",
    "device",
)


def utc_now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def git_commit() -> str:
    """The commit of this checkout (with '-dirty' if files differ from it).

    A GPU box that receives a copy of the tree without .git can pass the commit in
    LABSUPPORT_GIT_COMMIT instead.
    """
    if os.environ.get("LABSUPPORT_GIT_COMMIT"):
        return os.environ["LABSUPPORT_GIT_COMMIT"]
    try:
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        return head + ("-dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def nvidia_driver() -> str:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            check=True,
            timeout=30,
        ).stdout
        return out.strip().splitlines()[0]
    except (OSError, subprocess.SubprocessError, IndexError):
        return "unknown"


# What nvidia-smi says of the GPU's clocks and power: a run's times depend on them.
GPU_QUERY = ("clocks.max.sm", "clocks.max.memory", "clocks.sm", "power.limit", "power.max_limit")
GPU_FIELDS = tuple(f"nvidia_smi_{k.replace('.', '_')}" for k in GPU_QUERY)  # their provenance fields


def nvidia_smi_gpu() -> dict:
    """The GPU's clocks (MHz) and power limits (W) as nvidia-smi reports them for GPU 0, by
    field name; "not available" for each where nvidia-smi is missing or cannot answer."""
    try:
        out = subprocess.run(
            ["nvidia-smi", f"--query-gpu={','.join(GPU_QUERY)}", "--format=csv,noheader,nounits", "-i", "0"],
            capture_output=True,
            text=True,
            check=True,
            timeout=30,
        ).stdout
        values = [v.strip() for v in out.strip().splitlines()[0].split(",")]
        if len(values) != len(GPU_QUERY):
            raise ValueError(out)
    except (OSError, subprocess.SubprocessError, IndexError, ValueError):
        values = ["not available"] * len(GPU_QUERY)
    return {f: v[:40] for f, v in zip(GPU_FIELDS, values, strict=True)}


def cpu_model() -> str:
    """The host CPU's model name and logical core count (the CPU launches every kernel)."""
    name = platform.processor() or "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{name} ({os.cpu_count()} logical cores)"


def collect(command: str | None = None) -> dict:
    """Provenance of a run made now, on this machine."""
    import torch
    import transformers

    on_gpu = torch.cuda.is_available()
    if on_gpu:
        props = torch.cuda.get_device_properties(0)
        gpu, sms = props.name, props.multi_processor_count
    else:
        gpu, sms = "none (CPU)", 0
    return {
        "gpu": gpu,
        "gpu_sms": sms,
        "driver": nvidia_driver() if on_gpu else "none",
        "cuda": torch.version.cuda or "none",
        "cudnn": str(torch.backends.cudnn.version()) if on_gpu else "none",
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu": cpu_model(),
        "git_commit": git_commit(),
        "utc_time": utc_now(),
        "command": command or os.environ.get("LABSUPPORT_COMMAND") or " ".join(sys.argv),
        "device": "cuda" if on_gpu else "cpu",
        "teardown_cupti": os.environ.get("TEARDOWN_CUPTI", "unset"),
        **(nvidia_smi_gpu() if on_gpu else dict.fromkeys(GPU_FIELDS, "not available")),
    }
