"""`python -m labsupport pack <chapter> [run id]`: one run, checked, as one archive to share.

The run is loaded checked (checksums, provenance), then validated as a run to publish is
(ops.validate.check_run: the chapter's files and columns, value ranges, traces that parse,
kernel tables with kernels, complete provenance), and each file and the whole are held to the
gallery's size limits. The archive holds one folder, <run id>/, with the run's files, its
meta.json and pack.json (what was packed: every file with its size and SHA-256, and what the
provenance says of the GPU's clocks and power limit). Nothing in it is rewritten: the files
are the run's, byte for byte, so `gallery add` checks them against the run's own meta.json.
"""

from __future__ import annotations

import io
import json
import re
import tarfile
from pathlib import Path, PurePath

from labsupport import chapters, runs
from labsupport.ops import validate
from labsupport.runs import provenance
from labsupport.runs.writer import sha256

FORMAT = "labsupport-pack/1"
PACK_JSON = "pack.json"
MAX_FILE_BYTES = 32 << 20  # a run's largest file (a kernel table) is under 2 MiB
MAX_TOTAL_BYTES = 128 << 20
MAX_FILES = 64
OUT_DIR = provenance.REPO_ROOT / "build" / "packs"
CLOCK_FIELDS = provenance.GPU_FIELDS


class PackError(RuntimeError):
    """A run that cannot be packed (one line naming the run and the first problem)."""


def gpu_slug(gpu) -> str:
    """A folder-safe name of a GPU ("NVIDIA H200" -> "nvidia-h200"), at most 40 characters."""
    slug = re.sub(r"[^a-z0-9]+", "-", str(gpu).lower()).strip("-")[:40].strip("-")
    return slug or "unknown-gpu"


def form(run: runs.Run) -> dict:
    """What the run is a measurement of: its GPU, dtype and model preset, or, for a model folder (a
    chapter's `model` parameter, which the preset's default stands beside unused, or a folder profiled
    by `python -m labsupport profile`), that folder's name."""
    p = run.parameters
    return {
        "gpu": str(run.provenance.get("gpu", "")),
        "dtype": str(p.get("dtype", "bfloat16")),  # runs before the dtype parameter ran in bfloat16
        "preset": f"model folder {PurePath(p['model']).name}" if p.get("model") else str(p.get("preset") or ""),
    }


def clocks(prov: dict) -> dict:
    """The clock and power-limit fields the provenance records (absent ones left out)."""
    return {k: prov[k] for k in CLOCK_FIELDS if k in prov}


def check(run: runs.Run) -> list[str]:
    """Problems that stop `run` from being packed (empty: it may be packed)."""
    ch = chapters.by_slug(run.chapter)
    problems = validate.check_run(ch, run)
    names = sorted(run.meta["files"])
    if len(names) + 2 > MAX_FILES:
        problems.append(f"{len(names)} files, more than the {MAX_FILES - 2} a pack may hold")
    total = 0
    for name in names:
        size = (run.path / name).stat().st_size
        total += size
        if size > MAX_FILE_BYTES:
            problems.append(f"{name} is {size >> 20} MiB, more than the {MAX_FILE_BYTES >> 20} MiB a file may be")
    if total > MAX_TOTAL_BYTES:
        problems.append(f"the run holds {total >> 20} MiB, more than the {MAX_TOTAL_BYTES >> 20} MiB a pack may")
    for k, v in clocks(run.provenance).items():
        if not isinstance(v, str) or not v.strip():
            problems.append(f"provenance field {k!r} is empty")
    return problems


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = len(data), 0o644, 0
    tar.addfile(info, io.BytesIO(data))


def pack(
    chapter: str,
    run_id: str | None = None,
    root: Path | None = None,
    out_dir: Path | None = None,
    label: str = "a reader's run",
) -> tuple:
    """Check the run (the published one by default) and write its archive; returns (path,
    one-line summary); `label` says what the run is on the gallery page. A run that fails a
    check is a PackError and no archive is written."""
    run = runs.load_run(chapters.by_slug(chapter), run_id, root)
    problems = check(run)
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise PackError(f"run {run.run_id} of {chapter} cannot be packed: {problems[0]}{more}")
    f = form(run)
    files = {}
    for name in sorted(run.meta["files"]) + ["meta.json"]:
        path = run.path / name
        files[name] = {"sha256": sha256(path), "bytes": path.stat().st_size}
    manifest = {
        "format": FORMAT,
        "chapter": chapter,
        "run_id": run.run_id,
        **f,
        "clocks": clocks(run.provenance),
        "label": str(label)[:200],  # what the run is, as the gallery page shows it
        "packed_by": provenance.git_commit(),
        "packed_at": provenance.utc_now(),
        "files": files,
    }
    out_dir = out_dir or OUT_DIR
    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / f"{chapter}-{run.run_id}-{gpu_slug(f['gpu'])}.tar.gz"
    tmp = out.with_name(f".{out.name}.tmp")
    with tarfile.open(tmp, "w:gz", format=tarfile.PAX_FORMAT) as tar:
        _add(tar, f"{run.run_id}/{PACK_JSON}", json.dumps(manifest, indent=1, sort_keys=True).encode())
        for name in files:
            _add(tar, f"{run.run_id}/{name}", (run.path / name).read_bytes())
    tmp.replace(out)
    total = sum(v["bytes"] for v in files.values())
    clk = "clocks and power limit recorded" if manifest["clocks"] else "no clocks or power limit in its provenance"
    summary = (
        f"packed {chapter} run {run.run_id} ({f['gpu']}, {f['dtype']}, {f['preset'] or 'no preset'}): "
        f"{len(files)} files, {total / 1e6:.1f} MB ({out.stat().st_size / 1e6:.1f} MB packed), {clk} -> {out}"
    )
    return out, summary
