"""The nightly rebuild: run every chapter live, validate, compare with the published runs,
build the book, and publish everything in one step; or, on any failure, change nothing.

Steps, each of which must pass before the next (all under the runs folder's lock):
0. leftovers of a killed command are finished or set aside (labsupport.ops.leftovers);
1. the inputs are whole: published.json, every published run, history.csv (a corrupt one
   stops the night before any GPU time is spent);
2. every chapter notebook runs live through papermill, recording an unpublished run
   (a log and the executed notebook of each are kept under build/nightly/<id>/);
3. every new run passes validate.check_run;
4. a drift report (markdown and JSON) compares each new run with the published one;
5. the book is built from the new state (published.json, history, reports, and the gallery as
   it stands) in a staging folder (unless --no-book);
6. the publication is staged (labsupport.runs.promotion) and committed by one rename of
   runs/published.json; the staged history, report and book are then put in place.
Before step 6's rename nothing published has changed: on failure the night's runs are set
aside to build/nightly/<id>/failed-runs/ and it exits 1 with a one-line reason. After it the
night is published whatever happens; pruning old runs and removing the replaced book come
last and only warn when they fail.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

from labsupport import chapters, runs
from labsupport.ops import bookbuild, children, drift, gallery, history, leftovers, live, validate
from labsupport.ops.leftovers import BOOK_DIR, NIGHTLY_DIR
from labsupport.runs import lock, promotion


class NightlyFailure(Exception):
    """A step of the nightly failed; the message is the one-line reason."""


def check_inputs(root: Path) -> dict[str, runs.Run]:
    """Step 1: the published runs and the history must be whole."""
    try:
        baseline = runs.check_published(chapters.CHAPTERS, root)
        history.read(root)
    except runs.RunError as e:
        raise NightlyFailure(f"published state is damaged: {e}") from None
    return baseline


def run_chapters(selected, run_id: str, params: dict[str, dict], out_dir: Path) -> dict[str, float]:
    """Step 2: every chapter live; seconds per chapter."""
    seconds = {}
    for i, ch in enumerate(selected, 1):
        print(f"[{i}/{len(selected)}] {ch.slug}: live", flush=True)
        t = time.perf_counter()
        try:
            live.run_logged(ch, run_id, params[ch.slug], out_dir)
        except live.LiveRunError as e:
            raise NightlyFailure(str(e)) from None
        seconds[ch.slug] = time.perf_counter() - t
        print(f"[{i}/{len(selected)}] {ch.slug}: done in {seconds[ch.slug]:.0f} s", flush=True)
    return seconds


def validate_runs(root: Path, selected, run_id: str, out_dir: Path, min_kernels: int) -> dict[str, runs.Run]:
    """Step 3: the new runs load whole and pass validate.check_run."""
    try:
        new = {ch.slug: ch.load(run_id, root) for ch in selected}
        problems = [
            f"{slug}: {p}"
            for slug, run in new.items()
            for p in validate.check_run(chapters.by_slug(slug), run, min_kernels)
        ]
    except runs.RunError as e:
        problems = [str(e)]
    (out_dir / "validation.txt").write_text("\n".join(problems) + "\n" if problems else "passed\n")
    if problems:
        more = f" (and {len(problems) - 1} more, see {out_dir / 'validation.txt'})" if len(problems) > 1 else ""
        raise NightlyFailure(f"validation failed: {problems[0]}{more}")
    return new


def write_drift(run_id: str, new: dict, baseline: dict, threshold: float, out_dir: Path) -> dict[str, bytes]:
    """Step 4: the drift report, as files to publish under runs/nightly/."""
    drifts = [drift.compare(chapters.by_slug(s), new[s], baseline.get(s), threshold) for s in new]
    md = drift.to_markdown(drifts, threshold, f"Drift report: nightly {run_id}").encode()
    js = drift.to_json(drifts, threshold).encode()
    (out_dir / "drift.md").write_bytes(md)
    (out_dir / "drift.json").write_bytes(js)
    for d in drifts:  # flagged, not failed: a slow host moves host-timed numbers, not the kernels
        if d.slow_host:
            print(f"validation: {d.chapter}: host slower than usual during the run: {d.host['why']}", flush=True)
    print(f"{drift.summary_line(drifts, threshold)} ({out_dir / 'drift.md'})", flush=True)
    return {f"nightly/{run_id}-drift.md": md, f"nightly/{run_id}-drift.json": js}


def build_book(root: Path, manifest: dict, files: dict[str, bytes], out_dir: Path) -> Path:
    """Step 5: the book, built from a runs folder that holds exactly what will be published."""
    print("building the book from the new runs", flush=True)
    stage = out_dir / "book-runs"
    runs.copy_published(stage, root, manifest)
    for rel in [
        *(["history.csv"] if (root / "history.csv").is_file() else []),
        *(f"nightly/{p.name}" for p in sorted((root / "nightly").glob("*-drift.*"))),
    ]:
        src = root / rel
        if src.is_file() and not src.is_symlink():
            (stage / rel).parent.mkdir(parents=True, exist_ok=True)
            (stage / rel).write_bytes(src.read_bytes())
    for rel, data in files.items():
        (stage / rel).parent.mkdir(parents=True, exist_ok=True)
        (stage / rel).write_bytes(data)
    try:
        gallery.copy_to(stage, root)  # the gallery page shows the gallery as it stands
    except runs.RunError as e:
        raise NightlyFailure(f"the gallery is damaged: {e}") from None
    try:
        return bookbuild.build(runs_root=stage, out=out_dir / "book", log=out_dir / "book.log", echo=False)
    except bookbuild.BuildError as e:
        raise NightlyFailure(f"the book did not build from the new runs: {e}") from None


def publish(root: Path, run_id: str, manifest: dict, files: dict[str, bytes], html: Path | None) -> promotion.Promotion:
    """Step 6: stage everything, then the one rename that publishes it."""
    p = promotion.stage(root, run_id, manifest, files, html, BOOK_DIR if html is not None else None)
    promotion.commit(p)
    return p


def prune(root: Path, new: dict[str, runs.Run], baseline: dict[str, runs.Run]) -> None:
    """After publication: keep only the new runs and the ones they replaced (the drift
    report's two sides); older runs live on in git history and runs/history.csv."""
    for slug, run in new.items():
        old = baseline.get(slug)
        runs.prune(slug, {run.run_id} | ({old.run_id} if old else set()), root)


def main(
    names: list[str],
    params: dict,
    allow_cpu: bool = False,
    build_book: bool = True,
    timing_threshold: float | str = drift.DEFAULT_TIMING_THRESHOLD,  # a command-line string is parsed here
    min_kernels: int | str = 1,
    accept_slow_host: bool = False,
) -> int:
    import labsupport.ops.params  # its module name, not `params`, the night's notebook parameters

    timing_threshold = labsupport.ops.params.timing_threshold(timing_threshold)  # ParamError: nothing has run
    min_kernels = labsupport.ops.params.min_kernels(min_kernels)
    signal.signal(signal.SIGTERM, children.stop)  # SIGTERM raises, so the night cleans up
    live.check_gpu(allow_cpu)
    selected = live.fitting(chapters.find(names), allow_cpu, "nightly")  # one line per chapter skipped
    if not selected:
        return 0
    per_chapter = labsupport.ops.params.resolve(selected, params)  # ParamError: nothing has run
    root = runs.runs_root()
    try:
        leftovers.check_runs_folder(root)  # before the lock: a folder that is not one gets no .lock either
        lk = lock.acquire(root, "nightly")
    except (lock.LockError, runs.RunError) as e:
        print(f"nightly not started: {e}", file=sys.stderr)
        return 1
    try:
        check_folders(root)
    except runs.RunError as e:
        lock.release(lk)
        print(f"nightly failed: {e}; nothing was changed", file=sys.stderr)
        return 1
    try:
        with children.no_orphans(NIGHTLY_DIR / f"{children.SCRATCH}{os.getpid()}"):
            return _night(lk, root, selected, per_chapter, build_book, timing_threshold, min_kernels, accept_slow_host)
    finally:
        lock.release(lk)


def check_folders(root: Path) -> None:
    """No folder the nightly writes to may be a symbolic link (it would write where it points)."""
    for d in (root / "nightly", NIGHTLY_DIR, live.LOG_DIR):
        runs.check_real_dir(d, "the nightly writes there")


def kept_published(new: dict, baseline: dict, accept_slow_host: bool) -> set[str]:
    """The chapters whose published run, taken on a fast host, a new run taken on a slow host does
    not replace (none with `accept_slow_host`); one line each says why."""
    from labsupport.measure import hostprobe

    kept = set()
    for slug, run in new.items():
        old = baseline.get(slug)
        if accept_slow_host or old is None or not hostprobe.slow_host(run.results):
            continue
        if hostprobe.slow_host(old.results) is False:
            kept.add(slug)
            print(
                f"{slug}: kept the published run {old.run_id}: it was taken on a fast host and the new run "
                f"{run.run_id} on a slow one ({len(run.results['host_slow'])} measurements with too few "
                "fast-host trials); --accept-slow-host publishes it anyway",
                flush=True,
            )
    return kept


def _night(lk, root, selected, per_chapter, with_book, timing_threshold, min_kernels, accept_slow_host) -> int:
    try:
        for line in leftovers.recover(root, lk.stale, BOOK_DIR, NIGHTLY_DIR, live.LOG_DIR):
            print(f"before the night: {line}", flush=True)
    except BaseException as e:
        print(
            f"nightly failed: finishing what an earlier command left behind failed: {_reason(e)}; "
            f"nothing was published by this night; `python -m labsupport recover` tries again",
            file=sys.stderr,
        )
        return 1
    try:
        run_id = live.fresh_run_id(NIGHTLY_DIR)
        out_dir = NIGHTLY_DIR / run_id
        lk.note(run_id=run_id)
    except OSError as e:
        print(f"nightly failed: cannot start the night: {_reason(e)}; nothing was changed", file=sys.stderr)
        return 1
    live.set_environment()
    t_all = time.perf_counter()
    manifest = None
    try:
        baseline = check_inputs(root)
        seconds = run_chapters(selected, run_id, per_chapter, out_dir)
        new = validate_runs(root, selected, run_id, out_dir, min_kernels)
        files = write_drift(run_id, new, baseline, timing_threshold, out_dir)
        kept = kept_published(new, baseline, accept_slow_host)
        rows = [
            row
            for slug, run in new.items()
            if slug not in kept
            for row in history.rows_for(f"nightly {run_id}", chapters.by_slug(slug), run, seconds[slug])
        ]
        files["history.csv"] = history.with_rows(rows, root)
        manifest = {**runs.published(root), **{slug: run_id for slug in new if slug not in kept}}
        html = build_book(root, manifest, files, out_dir) if with_book else None
        p = publish(root, run_id, manifest, files, html)
    except BaseException as e:  # SIGTERM arrives as KeyboardInterrupt
        reason = _reason(e)
        stage = root / f"{promotion.PREFIX}{run_id}"
        try:
            staged = promotion.load(stage, BOOK_DIR) if stage.is_dir() else None
        except runs.RunError:
            staged = None
        if manifest is not None and _is_published(root, manifest):
            return _flipped_but(staged, run_id, reason, out_dir)
        return _failed(root, run_id, reason, staged, stage, out_dir)
    print(
        f"nightly {run_id} published {len(new)} chapters in {time.perf_counter() - t_all:.0f} s "
        f"({', '.join(f'{s} {t:.0f} s' for s, t in seconds.items())})",
        flush=True,
    )
    _after(root, p, new, baseline)
    return 0


def _failed(root: Path, run_id: str, reason: str, staged, stage: Path, out_dir: Path) -> int:
    """A failure before the flip: drop the staged publication, set the night's runs aside."""
    try:
        with promotion.signals_held():
            promotion.discard(staged, stage)
            leftovers.set_aside(root, run_id, out_dir / "failed-runs")
        left = ""
    except Exception as e:
        left = f" (setting its runs aside failed too, {_reason(e)}: the next nightly or `make recover` does it)"
    try:
        (out_dir / "FAILED.txt").write_text(reason + "\n")
    except OSError as e:
        left += f" (the note {out_dir / 'FAILED.txt'} could not be written: {_reason(e)})"
    print(
        f"nightly failed: {reason}; nothing was published: the published runs, history, reports "
        f"and book are unchanged{left}; logs in {out_dir}",
        file=sys.stderr,
    )
    return 1


def _reason(e: BaseException) -> str:
    if isinstance(e, NightlyFailure):
        return str(e)
    if isinstance(e, KeyboardInterrupt):
        return f"interrupted ({e})" if str(e) else "interrupted"
    return f"{type(e).__name__}: {e}".strip(": ")


def _is_published(root: Path, manifest: dict) -> bool:
    """Whether runs/published.json is this night's manifest (the flip happened)."""
    path = root / runs.MANIFEST
    return path.is_file() and path.read_bytes() == runs.manifest_bytes(manifest)


def _flipped_but(p: promotion.Promotion | None, run_id: str, reason: str, out_dir: Path) -> int:
    """A failure after the flip: the night is published; finish it now if it is not yet
    complete (`p` is None when completion had already finished)."""
    try:
        if p is not None:
            with promotion.signals_held():
                promotion.complete(p)
            promotion.cleanup(p)
    except Exception as e:
        (out_dir / "INCOMPLETE.txt").write_text(f"{reason}; then {_reason(e)}\n")
        print(
            f"nightly {run_id} is published (runs/published.json names its runs) but not complete: "
            f"{reason}; the next nightly or live command, or `python -m labsupport recover`, "
            f"finishes it",
            file=sys.stderr,
        )
        return 1
    print(f"nightly {run_id} published; {reason} after publishing, so old runs were not pruned", file=sys.stderr)
    return 0


def _after(root: Path, p: promotion.Promotion, new: dict, baseline: dict) -> None:
    """Clean-up once published: failures here only warn (the night stands)."""
    try:
        promotion.cleanup(p)
        prune(root, new, baseline)
    except BaseException as e:
        print(
            f"warning: nightly published, but cleaning up failed: {_reason(e)} "
            f"(old runs or the replaced book may remain; the next nightly removes them)",
            file=sys.stderr,
        )
