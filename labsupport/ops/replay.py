"""`python -m labsupport replay CHAPTER [--runs PATH_OR_ZIP] [--out DIR]`: a chapter's published
run, replayed without a GPU, torch or transformers: its headline numbers printed, its figures
written as PNG files.

The runs come from a runs folder (the book's runs/, LABSUPPORT_RUNS, or --runs naming one) or
from the zip the book serves for a chapter (book/_ext/serve_runs.py: `runs/published.json` and
`runs/<chapter>/<run id>/<file>`). The zip is input from outside: it is read member by member,
never extracted by zipfile; every member must be a regular file named as above (checked names:
no absolute path, no '..', no link), within MAX_FILE_BYTES each, MAX_TOTAL_BYTES and MAX_MEMBERS
in all, its bytes copied out by count into a scratch folder; then every run is loaded as any run
is (runs.load_run: each file against its SHA-256 in meta.json). The figures are drawn into a
scratch folder beside --out and moved in only when all are drawn: a failure leaves --out as it
was.

Figures: a chapter's figure functions take what its notebook computes from the run. Those whose
one parameter is the run are drawn as they are, RECIPES draws others from the run alone, and
the command names the chapter's figure functions it leaves to the notebook.
"""

from __future__ import annotations

import contextlib
import inspect
import os
import shutil
import stat
import tempfile
import zipfile
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from labsupport import chapters, runs

MAX_MEMBERS = 2000
MAX_FILE_BYTES = 64 << 20  # a run's largest file (a trace) is a few MiB
MAX_TOTAL_BYTES = 1 << 30
CHUNK = 1 << 20
UNREADABLE = (zipfile.BadZipFile, zipfile.LargeZipFile, zlib.error, EOFError, OSError, NotImplementedError)


class ReplayError(RuntimeError):
    """Input the replay refuses, or a folder it cannot write (one line)."""


def _kernels_in_one_token(ch) -> dict[str, Callable]:
    from labsupport.chapters import published

    return {
        "census": lambda run: ch.census_figure(
            run.table("census"), published.QWEN3_8B_H100_CENSUS, run.label, ch.summary(run).gpu.replace("NVIDIA ", "")
        ),
        "gemv": lambda run: ch.gemv_figure(ch.gemv_by_shape(run), run),
        "layer_parts": lambda run: ch.layer_parts_figure(ch.layer_parts(run, ch.middle_layer(run)), run.label),
        "attention_share": lambda run: ch.attention_share_figure(ch.context_sweep(run), run.label),
        "kv_cache": lambda run: ch.kv_cache_figure(ch.kv_cache_traffic(run), run),
    }


# {chapter: the recipes of its figures that need more than the run itself}; a figure function of
# the chapter whose one parameter is the run is drawn without a recipe.
RECIPES: dict[str, Callable] = {"kernels-in-one-token": _kernels_in_one_token}


@dataclass
class Figures:
    """What replay draws of a chapter: {file stem: draw(run) -> Figure}, and the chapter's
    figure functions it leaves to the notebook (they take what the notebook computes)."""

    drawn: dict[str, Callable]
    left: list[str]


def figures_of(slug: str) -> Figures:
    ch = chapters.package(chapters.by_slug(slug))
    functions = {n: f for n, f in vars(ch).items() if n.endswith("_figure") and callable(f)}
    drawn = RECIPES[slug](ch) if slug in RECIPES else {}
    used = {n for n in functions if n.removesuffix("_figure") in drawn}
    for name, f in sorted(functions.items()):
        if name not in used and list(inspect.signature(f).parameters) == ["run"]:
            drawn[name.removesuffix("_figure")] = f
            used.add(name)
    return Figures(drawn, sorted(set(functions) - used))


def _member(info: zipfile.ZipInfo, where: str) -> tuple[str, ...]:
    """The checked parts of a member's name: ("published.json",) or (chapter, run id, file)."""
    name = info.filename
    mode = info.external_attr >> 16
    if stat.S_ISLNK(mode):
        raise ReplayError(f"{where}: member {name!r} is a symbolic link; only regular files are read")
    if info.is_dir():
        return ()
    parts = name.split("/")
    if name.startswith("/") or "\\" in name or ".." in parts or parts[0] != "runs":
        raise ReplayError(f"{where}: member {name!r} is not under runs/ (as the book's zips are)")
    try:
        if parts[1:] == [runs.MANIFEST]:
            return (runs.MANIFEST,)
        if len(parts) != 4 or not runs.FILE_PATTERN.fullmatch(parts[3]):
            raise runs.RunError(f"{name!r} is not runs/<chapter>/<run id>/<file>")
        runs.check_chapter(parts[1], where)
        runs.check_run_id(parts[2], where)
    except runs.RunError as e:
        raise ReplayError(f"{where}: member {e}") from None
    return tuple(parts[1:])


def unpack(archive: Path, dest: Path) -> Path:
    """The runs of a served chapter zip, copied checked into `dest` (an empty folder); returns the
    runs folder made there."""
    where = str(archive)
    if archive.is_symlink() or not archive.is_file():
        raise ReplayError(f"{where} is not a zip file of a chapter's runs (no such file)")
    root = dest / "runs"
    root.mkdir()
    total, seen = 0, set()
    try:
        with zipfile.ZipFile(archive) as z:
            members = z.infolist()
            if len(members) > MAX_MEMBERS:
                raise ReplayError(f"{where} holds more than {MAX_MEMBERS} members")
            for info in members:
                parts = _member(info, where)
                if not parts:
                    continue
                if parts in seen:
                    raise ReplayError(f"{where}: {info.filename!r} appears twice")
                seen.add(parts)
                if info.file_size > MAX_FILE_BYTES:
                    raise ReplayError(f"{where}: {info.filename!r} is more than {MAX_FILE_BYTES >> 20} MiB")
                total += info.file_size
                if total > MAX_TOTAL_BYTES:
                    raise ReplayError(f"{where}: its files exceed {MAX_TOTAL_BYTES >> 20} MiB in all")
                path = root.joinpath(*parts)
                path.parent.mkdir(parents=True, exist_ok=True)
                with z.open(info) as src, open(path, "xb") as out:
                    left = info.file_size
                    while left > 0:  # by count: a header that lies about a size cannot write more
                        chunk = src.read(min(CHUNK, left))
                        if not chunk:
                            raise ReplayError(f"{where}: {info.filename!r} is truncated")
                        out.write(chunk)
                        left -= len(chunk)
    except UNREADABLE as e:
        raise ReplayError(f"{where} is not a readable zip of a chapter's runs ({type(e).__name__}: {e})") from None
    if (runs.MANIFEST,) not in seen:
        raise ReplayError(f"{where} holds no runs/{runs.MANIFEST}: not a zip the book serves for a chapter")
    return root


@contextlib.contextmanager
def runs_folder(given: str | None):
    """The runs folder to replay from, as LABSUPPORT_RUNS for the duration (every load, the
    chapter's own and those of the runs it reads, goes through runs.runs_root)."""
    before = os.environ.get("LABSUPPORT_RUNS")
    with tempfile.TemporaryDirectory(prefix="labsupport-replay-") as scratch:
        if given is None:
            root = runs.runs_root()
        elif Path(given).suffix == ".zip" or Path(given).is_file():
            root = unpack(Path(given).expanduser(), Path(scratch))
        else:
            root = Path(given).expanduser()
            if not root.is_dir():
                raise ReplayError(f"{given} is neither a runs folder nor a chapter's zip")
        os.environ["LABSUPPORT_RUNS"] = str(root)
        try:
            yield root
        finally:
            if before is None:
                os.environ.pop("LABSUPPORT_RUNS", None)
            else:
                os.environ["LABSUPPORT_RUNS"] = before


def _scratch_beside(out: Path) -> Path:
    """A new hidden folder beside `out` (same filesystem, so that a rename moves it in whole)."""
    parent = out.parent
    if not parent.is_dir():
        raise ReplayError(f"cannot write figures to {out}: {parent} is not a folder")
    if out.exists() and not out.is_dir():
        raise ReplayError(f"--out {out} is a file, not a folder")
    try:
        return Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=parent))
    except OSError as e:
        raise ReplayError(f"cannot write figures to {out}: {e.strerror or e}") from None


def _move_in(scratch: Path, out: Path) -> None:
    try:
        if not any(scratch.iterdir()):
            return
        if not out.exists():
            scratch.rename(out)
            return
        for f in sorted(scratch.iterdir()):
            os.replace(f, out / f.name)
        scratch.rmdir()
    except OSError as e:
        raise ReplayError(f"cannot write figures to {out}: {e.strerror or e}") from None


def replay(slug: str, runs_given: str | None, out: Path) -> list[str]:
    """Load the chapter's published run, return the lines to print (the headline, the figures
    written, those left to the notebook) after writing its figures into `out`."""
    known = [c.slug for c in chapters.CHAPTERS]
    if slug not in known:
        raise ReplayError(f"unknown chapter {slug!r}; known: {', '.join(known)}")
    entry = chapters.by_slug(slug)
    scratch = _scratch_beside(out)
    try:
        with runs_folder(runs_given) as root:
            manifest = runs.published(root)
            if slug not in manifest:
                holds = ", ".join(sorted(manifest)) or "none"
                raise ReplayError(f"{runs_given or root} holds no published run of {slug} (it holds: {holds})")
            run = entry.load()
            lines = [f"{slug}: run {run.run_id} ({run.provenance['gpu']}, {run.provenance['utc_time'][:10]})"]
            lines += [f"  {name}: {_number(value)}" for name, value in chapters.headline(entry, run).items()]
            lines += _draw(figures_of(slug), run, scratch, out)
        _move_in(scratch, out)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return lines


def _draw(figs: Figures, run: runs.Run, scratch: Path, out: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")  # files only: no display is needed or opened
    import matplotlib.pyplot as plt

    written = []
    for name, draw in figs.drawn.items():
        fig = draw(run)
        try:
            fig.savefig(scratch / f"{name}.png", dpi=150, bbox_inches="tight")
        except OSError as e:
            raise ReplayError(f"cannot write figures to {out}: {e.strerror or e}") from None
        finally:
            plt.close(fig)
        written.append(f"{name}.png")
    if not written and not figs.left:
        return ["figures: none here; the chapter's figures are drawn by its notebook's cells, from what they compute"]
    lines = [f"figures in {out}: {', '.join(written) or 'none'}"]
    if figs.left:
        lines.append(f"left to the notebook (they take what its cells compute): {', '.join(figs.left)}")
    return lines


def _number(value) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)
