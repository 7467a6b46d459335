"""What a chapter needs on this machine, said in one line per problem.

A reader who downloads a chapter notebook may lack a package, a CUDA GPU, or the GPU memory
the chapter's model needs. `check()` runs in each notebook's import cell (and in
`python -m labsupport live` before any notebook starts): it prints one line per problem that
still lets the chapter run (an old package, a GPU the datasheet table does not know), raises
EnvironmentProblem with one line for one that stops it (a missing package; in live mode no
CUDA GPU, or a model preset that does not fit in the GPU's memory, naming the largest one that
does), and says nothing when all is fine. Replay (the default) needs no GPU.

`LABSUPPORT_GPU_MEMORY_GB` caps the GPU memory a live run may use: the check counts only that
much as available, and caps the process's CUDA allocator to it
(torch.cuda.set_per_process_memory_fraction), so that the small-memory path can be tried on a
large GPU.

A GPU without BF16 (compute capability below 8.0: T4, V100) runs a chapter's model in float16:
the check says so in one line (`dtype_here` makes the live cells follow it); a `dtype` of
"bfloat16" asked for explicitly (`python -m labsupport live --param dtype=bfloat16`) is refused
there in one line.
"""

from __future__ import annotations

import os
import re
from importlib import metadata

from labsupport.measure import hardware, models

# The oldest versions the chapters are written for (requirements.txt pins the tested ones).
PACKAGES = {"torch": "2.5", "transformers": "5.0", "numpy": "1.26", "pandas": "2.2", "matplotlib": "3.8"}
# Needed to measure, never to replay: the wheel leaves them to its `live` extra (pyproject.toml).
LIVE_ONLY = ("torch", "transformers")
# Wanted but not needed, with what is lost without them: the pins of requirements-gpubox.txt.
OPTIONAL = {
    "ipywidgets": ("8.1.9", "the live notebook's explorers do not show; everything else runs"),
}
BY_CHAPTER = {
    "hybrid-model-token": {
        "fla-core": ("0.6.0", "only the reference Gated DeltaNet is measured, not flash-linear-attention's kernels"),
        "einops": ("0.8.2", "flash-linear-attention's kernels cannot load; only the reference Gated DeltaNet runs"),
    },
}
INSTALL = "pip install the labsupport wheel that the book serves (page 'Run a chapter yourself')"
LIVE_INSTALL = (
    "a live run needs it: pip install the labsupport wheel with its [live] extra, or requirements-gpubox.txt "
    "beside your own PyTorch and transformers (page 'Run a chapter yourself')"
)
# The oldest compute capability with BF16 tensor cores (Ampere).
BF16_CAPABILITY = (8, 0)
# A preset's GPU memory: its weights (BF16 or float16: two bytes each) plus this margin for the KV caches, activations,
# cuBLAS workspaces and the CUDA context. An estimate that errs high, not a measurement.
MARGIN_FRACTION = 0.25
MARGIN_GB = 3.0
MEMORY_VARIABLE = "LABSUPPORT_GPU_MEMORY_GB"
GB = 1e9


class EnvironmentProblem(RuntimeError):
    """Something this machine lacks that stops the chapter, said in one line."""


def version_tuple(text: str) -> tuple[int, ...]:
    """The leading numbers of a version string: "2.11.0+cu130" -> (2, 11, 0)."""
    return tuple(int(n) for n in re.findall(r"\d+", text.split("+")[0])[:3])


def installed(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def package_lines(chapter: str, live: bool = True) -> tuple[list[str], list[str]]:
    """(lines that stop the chapter, lines that do not) about the installed packages; the
    optional ones only for a live run (a replay uses neither the kernels nor the widgets)."""
    stop, note = [], []
    for dist, oldest in PACKAGES.items():
        have = installed(dist)
        if have is None and dist in LIVE_ONLY and not live:
            continue
        if have is None:
            how = LIVE_INSTALL if dist in LIVE_ONLY else INSTALL
            stop.append(f"{dist} is not installed (the chapters need {dist} >= {oldest}): {how}")
        elif version_tuple(have) < version_tuple(oldest):
            note.append(
                f"{dist} {have} is older than the {oldest} the chapters are written for: upgrade if a cell fails"
            )
    for dist, (oldest, loss) in ({**OPTIONAL, **BY_CHAPTER.get(chapter, {})} if live else {}).items():
        have = installed(dist)
        if have is None:
            note.append(f"{dist} is not installed: {loss} (pip install '{dist}>={oldest}')")
        elif version_tuple(have) < version_tuple(oldest):
            note.append(f"{dist} {have} is older than the {oldest} of requirements-gpubox.txt")
    return stop, note


def memory_cap_gb() -> float | None:
    """The cap set by LABSUPPORT_GPU_MEMORY_GB, in GB (None when unset)."""
    raw = os.environ.get(MEMORY_VARIABLE, "").strip()
    if not raw:
        return None
    try:
        cap = float(raw)
    except ValueError:
        raise EnvironmentProblem(f"{MEMORY_VARIABLE}={raw!r} is not a number of GB") from None
    if cap <= 0:
        raise EnvironmentProblem(f"{MEMORY_VARIABLE}={raw!r} must be a positive number of GB")
    return cap


def available_gb(torch) -> tuple[float, str]:
    """GPU memory this process may use, in GB, and where the number comes from; applies the
    LABSUPPORT_GPU_MEMORY_GB cap to the CUDA allocator."""
    free, total = torch.cuda.mem_get_info()
    cap = memory_cap_gb()
    if cap is None:
        return free / GB, f"{free / GB:.1f} GB free of {total / GB:.1f} GB"
    torch.cuda.set_per_process_memory_fraction(min(1.0, cap * GB / total))
    usable = min(free / GB, cap)
    return usable, f"{usable:.1f} GB usable ({MEMORY_VARIABLE}={cap:g}; {free / GB:.1f} GB free of {total / GB:.1f} GB)"


def weight_gb(preset: str, dtype: str | None = None) -> float:
    """The preset's weights in `dtype` (None: BF16), counted from the model built on the meta
    device (bfloat16 and float16 both take two bytes a weight)."""
    c = models.preset_counts(preset, dtype)
    return c.parameters * c.bytes_per_parameter / GB


def needed_gb(preset: str, dtype: str | None = None) -> float:
    """GPU memory the preset needs, by the stated estimate: weights plus MARGIN_FRACTION of
    them plus MARGIN_GB."""
    w = weight_gb(preset, dtype)
    return w * (1 + MARGIN_FRACTION) + MARGIN_GB


def largest_fitting(available: float, family_of: str) -> str | None:
    """The largest real (not tiny) preset of the same kind of model as `family_of` that fits."""
    kind = models.PRESETS[family_of]["model_type"]
    fits = [
        (needed_gb(name), name)
        for name, cfg in models.PRESETS.items()
        if not name.startswith("tiny") and cfg["model_type"] == kind and needed_gb(name) <= available
    ]
    return max(fits)[1] if fits else None


def has_bf16(capability: tuple[int, int]) -> bool:
    """Whether a GPU of this compute capability has BF16 tensor cores (8.0 and later)."""
    return tuple(capability) >= BF16_CAPABILITY


def dtype_lines(name: str, capability: tuple[int, int], dtype: str | None) -> tuple[list[str], list[str]]:
    """(lines that stop a live run, lines that do not) about the half-precision type on this GPU:
    `dtype` None is the notebook's default (bfloat16, float16 where the GPU has no BF16); an
    explicit "bfloat16" on a GPU without it is refused."""
    if dtype not in (None, *models.DTYPES):
        return [f"dtype must be one of {', '.join(models.DTYPES)}, not {dtype!r}"], []
    if has_bf16(capability) or dtype == "float16":
        return [], []
    cc = ".".join(map(str, capability))
    if dtype == "bfloat16":
        return [
            f"the GPU {name!r} (compute capability {cc}) has no BF16, which dtype='bfloat16' asks for: "
            "leave dtype at its default or set dtype='float16'"
        ], []
    return [], [f"the GPU {name!r} (compute capability {cc}) has no BF16: the model runs in float16"]


def dtype_here(dtype: str = models.DEFAULT_DTYPE, device: str = "cuda") -> str:
    """The dtype a live run uses: `dtype`, except float16 in place of the default bfloat16 on a
    CUDA GPU without BF16 (the environment check has said so in one line)."""
    if dtype not in models.DTYPES:
        raise EnvironmentProblem(f"dtype must be one of {', '.join(models.DTYPES)}, not {dtype!r}")
    if dtype != "bfloat16" or device != "cuda":
        return dtype
    import torch

    if torch.cuda.is_available() and not has_bf16(torch.cuda.get_device_capability(0)):
        return "float16"
    return dtype


def gpu_lines(preset: str | None, dtype: str | None = None) -> tuple[list[str], list[str]]:
    """(lines that stop a live run, lines that do not) about the GPU, its half-precision types
    and its memory."""
    import torch

    if not torch.cuda.is_available():
        return ["live mode needs a CUDA GPU and none is visible (mode='replay' shows the recorded run)"], []
    name = torch.cuda.get_device_name(0)
    stop, note = dtype_lines(name, torch.cuda.get_device_capability(0), dtype)
    if stop:
        return stop, note
    if hardware.datasheet_or_none(name) is None:
        note.append(
            f"the GPU {name!r} is not in the book's datasheet table (labsupport.measure.hardware.DATASHEETS): "
            "the chapter compares with the ceilings it measures on it only"
        )
    if not preset or preset not in models.PRESETS:
        return [], note
    have, where = available_gb(torch)
    need = needed_gb(preset, dtype)
    if need <= have:
        return [], note
    best = largest_fitting(have, preset)
    offer = (
        f"the largest preset that fits is {best!r} (overrides = {{'preset': {best!r}}})"
        if best
        else "no preset of it fits"
    )
    return [
        f"preset {preset!r} needs about {need:.1f} GB of GPU memory ({weight_gb(preset, dtype):.1f} GB of "
        f"weights, two bytes each in BF16 or FP16, "
        f"+ {MARGIN_FRACTION:.0%} + {MARGIN_GB:g} GB for caches and workspace); this GPU has {where}: {offer}"
    ], note


def check(
    chapter: str, mode: str = "replay", preset: str | None = None, allow_cpu: bool = False, dtype: str | None = None
) -> list[str]:
    """Check this machine for chapter `chapter` (its slug) run in `mode` with model `preset`:
    print one line per problem the chapter survives, raise EnvironmentProblem (one line) for
    one that stops it, and return every line (none when all is fine). `dtype` is one asked for
    explicitly (None: the notebook's default, which follows the GPU)."""
    if mode not in ("live", "replay"):
        raise EnvironmentProblem(f"mode must be 'live' or 'replay', not {mode!r}")
    stop, note = package_lines(chapter, live=mode == "live")
    if not stop and mode == "live" and not allow_cpu:
        gpu_stop, gpu_note = gpu_lines(preset, dtype)
        stop, note = stop + gpu_stop, note + gpu_note
    for line in note:
        print(line)
    if stop:
        raise EnvironmentProblem("; ".join(stop))
    return note


def main(argv: list[str]) -> int:
    """`python -m labsupport.measure.environment '[["slug", "preset or null", allow_cpu, "dtype or null"], ...]'`:
    check() in live mode for each chapter; the lines it prints, and the first line that stops
    a chapter on stderr with exit status 1. `labsupport live` runs it in a child process, so
    that the process driving the notebooks never holds a CUDA context."""
    import json
    import sys

    for slug, preset, allow_cpu, *rest in json.loads(argv[0]):
        try:
            check(slug, "live", preset, bool(allow_cpu), rest[0] if rest else None)
        except EnvironmentProblem as e:
            print(f"{slug}: {e}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    import sys

    raise SystemExit(main(sys.argv[1:]))
