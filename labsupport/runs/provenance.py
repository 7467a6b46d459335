"""Where a run came from: GPU, driver, CUDA, library versions, git commit, the digest of the
code the box ran, time, command."""

from __future__ import annotations

import hashlib
import os
import platform
import re
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


COMMIT_PATTERN = re.compile(r"^[0-9a-f]{40}$")
# What a run's code is: the package, the notebooks and the GPU box's extra requirements.
DIGESTED = ("labsupport", "notebooks", "requirements-gpubox.txt")
NOT_DIGESTED = {"__pycache__", ".ipynb_checkpoints"}  # what Python and Jupyter write beside them


class ProvenanceError(RuntimeError):
    """A commit that cannot be the one the run was made at (the message is one line)."""


def has_git(root: Path = REPO_ROOT) -> bool:
    """Whether this checkout has its git history here to look commits up in."""
    return (root / ".git").exists()


def _git(*args: str, root: Path = REPO_ROOT) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True)


def git_commit(root: Path = REPO_ROOT) -> str:
    """The commit of this checkout (with '-dirty' if tracked files differ from it).

    A GPU box that receives a copy of the tree without .git passes the commit in
    LABSUPPORT_GIT_COMMIT instead: 40 hex digits, never a short or typed-over hash. Where .git is
    there, it is the checkout's HEAD that is recorded, and a given value that differs from it is
    refused (ProvenanceError)."""
    given = os.environ.get("LABSUPPORT_GIT_COMMIT")
    if given and not COMMIT_PATTERN.match(given):
        raise ProvenanceError(
            f"LABSUPPORT_GIT_COMMIT={given!r} is not a full commit hash (40 lower-case hex digits, "
            "as `git rev-parse HEAD` prints it); nothing was recorded"
        )
    if not has_git(root):
        return given or "unknown"
    try:
        head, dirty = (
            _git("rev-parse", "HEAD", root=root),
            _git("status", "--porcelain", "--untracked-files=no", root=root),
        )
    except OSError:
        return given or "unknown"
    if head.returncode or dirty.returncode:
        return given or "unknown"
    head_hash = head.stdout.strip()
    if given and given != head_hash:
        raise ProvenanceError(
            f"LABSUPPORT_GIT_COMMIT={given} differs from this checkout's HEAD {head_hash}; "
            "unset it (the checkout's commit is recorded) or check out that commit; nothing was recorded"
        )
    return head_hash + ("-dirty" if dirty.stdout.strip() else "")


def commit_problem(commit: str, root: Path = REPO_ROOT) -> str | None:
    """Why `commit` (a run's git_commit, '-dirty' allowed) is not a commit in the history of this
    checkout's HEAD, or None when it is, or when there is no .git here to ask."""
    if not has_git(root):
        return None
    base = str(commit).removesuffix("-dirty")
    if not COMMIT_PATTERN.match(base):
        return f"git_commit {str(commit)[:60]!r} is not a full commit hash (40 hex digits)"
    try:
        known = _git("cat-file", "-e", f"{base}^{{commit}}", root=root)
        ancestor = _git("merge-base", "--is-ancestor", base, "HEAD", root=root) if not known.returncode else known
    except OSError as e:
        return f"git_commit {base} cannot be checked: git does not run here ({e.strerror})"
    if known.returncode:
        shallow = _git("rev-parse", "--is-shallow-repository", root=root).stdout.strip() == "true"
        hint = " (this clone is shallow: git fetch --unshallow)" if shallow else ""
        return f"git_commit {base} is not a commit of this repository{hint}"
    if ancestor.returncode:
        return f"git_commit {base} is not in the history of HEAD"
    return None


def tree_digest(root: Path = REPO_ROOT) -> str:
    """SHA-256 of the code a run ran, as this box sees it: every file under DIGESTED, in sorted
    order of its path relative to `root`, each as its path, its length and its bytes (what Python
    and Jupyter write beside the sources left out). The same tree gives the same digest on any box,
    with or without .git; a copied tree that differs from its commit shows it."""
    files = []
    for name in DIGESTED:
        top = root / name
        if top.is_file():
            files.append(top)
        elif top.is_dir():
            files += [
                p for p in top.rglob("*") if p.is_file() and not NOT_DIGESTED.intersection(p.relative_to(root).parts)
            ]
    h = hashlib.sha256()
    for p in sorted(files, key=lambda p: p.relative_to(root).as_posix()):
        data = p.read_bytes()
        h.update(f"{p.relative_to(root).as_posix()}\0{len(data)}\0".encode())
        h.update(data)
    return h.hexdigest()


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
        "tree_digest": tree_digest(),
        "utc_time": utc_now(),
        "command": command or os.environ.get("LABSUPPORT_COMMAND") or " ".join(sys.argv),
        "device": "cuda" if on_gpu else "cpu",
        "teardown_cupti": os.environ.get("TEARDOWN_CUPTI", "unset"),
        **(nvidia_smi_gpu() if on_gpu else dict.fromkeys(GPU_FIELDS, "not available")),
    }
