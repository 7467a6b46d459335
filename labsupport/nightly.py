"""The nightly rebuild: run every chapter live, validate, compare with the published runs,
then promote all new runs at once and rebuild the book; or, on any failure, change nothing.

Steps, each of which must pass before the next:
1. the published runs load (a corrupt one stops the night before any GPU time is spent);
2. every chapter notebook runs live through papermill, recording an unpublished run
   (a log and the executed notebook of each are kept under build/nightly/<id>/);
3. every new run passes validate.check_run;
4. a drift report (markdown and JSON) compares each new run with the published one;
5. the book is built from the new runs into a staging folder (unless --no-book);
6. runs/published.json is replaced in one rename (all chapters at once), the drift report
   and history are committed under runs/, and the staged book replaces _build/html.
On failure the new runs are moved aside to build/nightly/<id>/failed-runs/, and the
command exits 1 with a one-line reason.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from . import chapters, drift, history, live, runs, validate
from .provenance import REPO_ROOT

NIGHTLY_DIR = Path(os.environ.get("LABSUPPORT_NIGHTLY_DIR", REPO_ROOT / "build" / "nightly"))
BOOK_DIR = Path(os.environ.get("LABSUPPORT_BOOK_DIR", REPO_ROOT / "_build" / "html"))


class NightlyFailure(Exception):
    """A step of the nightly failed; the message is the one-line reason."""


def _terminate(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def _run_notebook(ch: chapters.Chapter, run_id: str, params: dict, out_dir: Path) -> float:
    """Run one chapter live with its papermill log in <out_dir>/<slug>.log; seconds taken."""
    handler = logging.FileHandler(out_dir / f"{ch.slug}.log")
    handler.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
    logger = logging.getLogger("papermill")
    level = logger.level
    logger.setLevel(logging.INFO)
    logger.addHandler(handler)
    t = time.perf_counter()
    try:
        live.run_chapter(ch, run_id, params, out_dir, publish=False)
    except live.LiveRunError as e:
        raise NightlyFailure(str(e)) from None
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
        handler.close()
    return time.perf_counter() - t


def _staging_root(out_dir: Path, new_runs: dict[str, str], new_history: list[dict]) -> Path:
    """A runs folder that looks as runs/ will after promotion (new runs published, this
    night's history and drift report added), without touching the real one."""
    root = runs.runs_root()
    stage = out_dir / "staging-runs"
    stage.mkdir()
    for d in root.iterdir():
        if d.is_dir() and not d.name.startswith(".") and d.name != "nightly":
            (stage / d.name).symlink_to(d.resolve(), target_is_directory=True)
    (stage / runs.MANIFEST).write_text(json.dumps({**runs.published(root), **new_runs}, indent=2))
    if (root / "history.csv").is_file():
        shutil.copy(root / "history.csv", stage / "history.csv")
    history.append(new_history, stage)
    (stage / "nightly").mkdir()
    for f in list((root / "nightly").glob("*")) if (root / "nightly").is_dir() else []:
        shutil.copy(f, stage / "nightly" / f.name)
    for f in ("drift.md", "drift.json"):
        shutil.copy(out_dir / f, stage / "nightly" / f"{out_dir.name}-{f}")
    return stage


def _build_book(out_dir: Path, stage: Path) -> Path:
    jb = Path(sys.executable).with_name("jupyter-book")
    cmd = [str(jb) if jb.exists() else "jupyter-book", "build", str(REPO_ROOT), "--all", "--warningiserror",
           "--keep-going", "--builder", "html", "--path-output", str(out_dir / "book")]
    env = {**os.environ, "LABSUPPORT_RUNS": str(stage)}
    with open(out_dir / "book.log", "w") as log:
        r = subprocess.run(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    if r.returncode != 0:
        raise NightlyFailure(f"the book did not build from the new runs (see {out_dir / 'book.log'})")
    return out_dir / "book" / "_build" / "html"


def _swap_book(html: Path) -> None:
    target = BOOK_DIR
    target.parent.mkdir(parents=True, exist_ok=True)
    old = target.with_name("html.old")
    shutil.rmtree(old, ignore_errors=True)
    if target.exists():
        os.rename(target, old)
    shutil.move(str(html), target)
    shutil.rmtree(old, ignore_errors=True)


def main(names: list[str], params: dict, allow_cpu: bool = False, build_book: bool = True,
         timing_threshold: float = drift.DEFAULT_TIMING_THRESHOLD, min_kernels: int = 1) -> int:
    signal.signal(signal.SIGTERM, _terminate)
    live.check_gpu(allow_cpu)
    selected = chapters.find(names)
    root = runs.runs_root()
    import torch

    tag = torch.cuda.get_device_name(0).replace("NVIDIA", "") if torch.cuda.is_available() else "cpu"
    run_id = runs.new_run_id(tag)
    out_dir = NIGHTLY_DIR / run_id
    out_dir.mkdir(parents=True)
    os.environ.setdefault("LABSUPPORT_COMMAND", "python -m labsupport " + " ".join(sys.argv[1:]))
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH")) if p)
    recorded: dict[str, str] = {}
    seconds: dict[str, float] = {}
    t_all = time.perf_counter()
    try:
        # 1. The published runs must be whole, or there is nothing sound to compare with.
        try:
            baseline = {slug: runs.load_run(slug, rid) for slug, rid in runs.published(root).items()}
        except runs.RunError as e:
            raise NightlyFailure(f"published run is damaged: {e}") from None
        # 2. Every chapter, live.
        for i, ch in enumerate(selected, 1):
            print(f"[{i}/{len(selected)}] {ch.slug}: live", flush=True)
            seconds[ch.slug] = _run_notebook(ch, run_id, params, out_dir)
            recorded[ch.slug] = run_id
            print(f"[{i}/{len(selected)}] {ch.slug}: done in {seconds[ch.slug]:.0f} s", flush=True)
        # 3. Validation.
        new = {slug: runs.load_run(slug, rid) for slug, rid in recorded.items()}
        problems = [f"{slug}: {p}" for slug, run in new.items()
                    for p in validate.check_run(chapters.by_slug(slug), run, min_kernels)]
        (out_dir / "validation.txt").write_text("\n".join(problems) + "\n" if problems else "passed\n")
        if problems:
            more = f" (and {len(problems) - 1} more, see {out_dir / 'validation.txt'})" if len(problems) > 1 else ""
            raise NightlyFailure(f"validation failed: {problems[0]}{more}")
        # 4. Drift against the published runs.
        drifts = [drift.compare(chapters.by_slug(s), new[s], baseline.get(s), timing_threshold) for s in new]
        title = f"Drift report: nightly {run_id}"
        (out_dir / "drift.md").write_text(drift.to_markdown(drifts, timing_threshold, title))
        (out_dir / "drift.json").write_text(drift.to_json(drifts, timing_threshold))
        n_struct = sum(len(d.structural) for d in drifts)
        n_moved = sum(len(d.moved) for d in drifts)
        print(f"drift: {n_struct} structural changes, {n_moved} headline numbers moved beyond "
              f"{timing_threshold:.0%} ({out_dir / 'drift.md'})", flush=True)
        new_history = [row for slug, run in new.items()
                       for row in history.rows_for(f"nightly {run_id}", chapters.by_slug(slug), run, seconds[slug])]
        # 5. The book, from the new runs, staged.
        html = None
        if build_book:
            print("building the book from the new runs", flush=True)
            html = _build_book(out_dir, _staging_root(out_dir, recorded, new_history))
        # 6. Promote everything at once, then record the night.
        nightly_dir = root / "nightly"
        nightly_dir.mkdir(exist_ok=True)
        shutil.copy(out_dir / "drift.md", nightly_dir / f"{run_id}-drift.md")
        shutil.copy(out_dir / "drift.json", nightly_dir / f"{run_id}-drift.json")
        runs.publish_many(recorded, root)
        history.append(new_history, root)
        if html is not None:
            _swap_book(html)
        # Keep the repository small: the new runs and the ones they replaced (the drift
        # report's two sides); older runs live on in git history and runs/history.csv.
        for slug in recorded:
            old = baseline.get(slug)
            runs.prune(slug, {recorded[slug]} | ({old.run_id} if old else set()), root)
    except (NightlyFailure, KeyboardInterrupt, Exception) as e:
        reason = str(e) if isinstance(e, NightlyFailure) else f"{type(e).__name__}: {e}".strip(": ")
        if isinstance(e, KeyboardInterrupt):
            reason = f"interrupted ({e})" if str(e) else "interrupted"
        _set_aside(root, selected, run_id, out_dir)
        (out_dir / "FAILED.txt").write_text(reason + "\n")
        print(f"nightly failed: {reason}; published runs and book unchanged; logs in {out_dir}", file=sys.stderr)
        return 1
    print(f"nightly {run_id} published {len(recorded)} chapters in {time.perf_counter() - t_all:.0f} s "
          f"({', '.join(f'{s} {t:.0f} s' for s, t in seconds.items())})", flush=True)
    return 0


def _set_aside(root: Path, selected, run_id: str, out_dir: Path) -> None:
    """Move this night's runs (whole or partial) out of runs/ into the night's log folder."""
    aside = out_dir / "failed-runs"
    for ch in selected:
        for d in (root / ch.slug / run_id, root / ch.slug / f".incomplete-{run_id}"):
            if d.exists():
                (aside / ch.slug).mkdir(parents=True, exist_ok=True)
                shutil.move(str(d), aside / ch.slug / d.name)
