"""Run chapter notebooks live through papermill: each records a new run, which is
published only once its notebook has finished without error (through labsupport.runs.promotion,
together with its history rows), under the runs folder's lock.

`--smoke` runs the chapters with their smallest parameters (the Params fields' `smoke` values) into a scratch runs
folder, checks each run, and publishes nothing.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import shlex
import shutil
import sys
import time
from pathlib import Path

from labsupport import chapters, runs
from labsupport.ops import children, history, leftovers
from labsupport.runs import lock, promotion, provenance
from labsupport.runs.provenance import REPO_ROOT
from labsupport.runs.publish import commit_problem

LOG_DIR = Path(os.environ.get("LABSUPPORT_LIVE_DIR", REPO_ROOT / "build" / "live"))
SMOKE_DIR = Path(os.environ.get("LABSUPPORT_SMOKE_DIR", REPO_ROOT / "build" / "smoke"))


class LiveRunError(RuntimeError):
    """A chapter notebook failed during a live run."""


def check_gpu(allow_cpu: bool) -> None:
    """Stop before starting any notebook when there is no GPU to measure."""
    import torch

    if not torch.cuda.is_available() and not allow_cpu:
        raise SystemExit(
            "live mode needs a CUDA GPU and none is visible; the book replays the recorded runs instead (make book)"
        )


def check_environment(selected: list[chapters.Chapter], per_chapter: dict, allow_cpu: bool) -> str | None:
    """Each chapter's environment check (labsupport.measure.environment: packages, GPU, whether
    its preset fits in the GPU's memory; a model folder is checked when it is built) in a child
    process, so that this process never holds a CUDA context; its notes are printed. Returns the
    line that stops a chapter, or None."""
    import json
    import subprocess

    todo = [  # a dtype given with --param is explicit (refused on a GPU without it); else the GPU's own
        [
            ch.slug,
            None if per_chapter[ch.slug].get("model") else {**ch.defaults, **per_chapter[ch.slug]}.get("preset"),
            allow_cpu,
            per_chapter[ch.slug].get("dtype"),
        ]
        for ch in selected
    ]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH")) if p)}
    done = subprocess.run(
        [sys.executable, "-m", "labsupport.measure.environment", json.dumps(todo)],
        env=env,
        capture_output=True,
        text=True,
    )
    for line in done.stdout.splitlines():
        print(f"note: {line}", flush=True)
    if done.returncode:
        lines = done.stderr.strip().splitlines()
        return lines[-1] if lines else f"the environment check failed (exit status {done.returncode})"
    return None


def gpus_here() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def fitting(selected: list, allow_cpu: bool, who: str = "live") -> list:
    """The chapters this box has the GPUs for, with one line for each one skipped. On a CPU
    (allowed for the tests) a chapter's ranks are processes, so none is skipped there."""
    have = gpus_here()
    if allow_cpu and have == 0:
        return list(selected)
    keep = []
    for ch in selected:
        if ch.gpus > have:
            print(f"[{who}] {ch.slug}: skipped: needs {ch.gpus} GPUs, this box has {have}", flush=True)
        else:
            keep.append(ch)
    return keep


def gpu_tag() -> str:
    import torch

    return torch.cuda.get_device_name(0).replace("NVIDIA", "") if torch.cuda.is_available() else "cpu"


def fresh_run_id(log_root: Path) -> str:
    """A new run id, its log folder created (waits out the second if the folder exists)."""
    while True:
        run_id = runs.new_run_id(gpu_tag())
        try:
            (log_root / run_id).mkdir(parents=True)
            return run_id
        except FileExistsError:
            time.sleep(0.5)


def set_environment() -> None:
    """The notebook kernels import this checkout's labsupport, record the command, and compile
    with inductor's caches off: every published census is what a cold compile gives, as on a
    reader's box, never a verdict an earlier compile left in a cache (TORCHINDUCTOR_FORCE_DISABLE_CACHES).
    A LABSUPPORT_GIT_COMMIT that cannot be the checkout's commit stops here, before any chapter runs."""
    try:
        provenance.git_commit()
    except provenance.ProvenanceError as e:
        raise SystemExit(f"error: {e}") from None
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH")) if p)
    os.environ.setdefault(
        "LABSUPPORT_COMMAND", " ".join(shlex.quote(a) for a in ["python", "-m", "labsupport", *sys.argv[1:]])
    )
    os.environ["TORCHINDUCTOR_FORCE_DISABLE_CACHES"] = "1"


def run_chapter(
    chapter: chapters.Chapter, run_id: str, parameters: dict, log_dir: Path, root: Path | None = None
) -> Path:
    """Execute one chapter notebook live, recording run `run_id` (never published here);
    returns the executed notebook's path. The notebook has `chapter.timeout_s` seconds from its
    first cell: each cell may run only what is left of them, and a cell past it stops the
    notebook (its kernel shut down) with one LiveRunError line naming the chapter and the limit."""
    import papermill as pm

    log_dir.mkdir(parents=True, exist_ok=True)
    out = log_dir / Path(chapter.notebook).name
    params = {"mode": "live", "run_id": run_id, "overrides": parameters}  # the notebook's parameters cell
    limit = chapter.timeout_s
    deadline = []  # set as the first cell starts: starting the kernel has its own limit

    def seconds_left(cell) -> int:
        if not deadline:
            deadline.append(time.monotonic() + limit)
        return max(1, math.ceil(deadline[0] - time.monotonic()))

    try:
        pm.execute_notebook(
            str(chapter.path),
            str(out),
            parameters=params,
            cwd=str(chapter.path.parent),
            kernel_name="python3",
            # A kernel on a busy machine (the tests in one process per CPU, a box still compiling)
            # can take longer to start than papermill's 60 s; waiting costs nothing otherwise.
            start_timeout=300,
            progress_bar=True,
            log_output=True,
            request_save_on_cell_execute=True,
            timeout_func=seconds_left,  # nbclient's per-cell timeout, counting down the notebook's
        )
    except Exception as e:  # papermill raises PapermillExecutionError with the cell's traceback
        # A notebook that records across several cells leaves its unfinished run behind when a
        # cell fails (its kernel never reaches the cell that closes the run): remove it now.
        shutil.rmtree((root or runs.runs_root()) / chapter.slug / f".incomplete-{run_id}", ignore_errors=True)
        if isinstance(e, TimeoutError) and deadline and time.monotonic() >= deadline[0]:  # nbclient's CellTimeoutError
            raise LiveRunError(
                f"{chapter.slug}: notebook stopped: it ran past its limit of {limit} s (the chapter's timeout_s); "
                f"executed notebook kept at {out}"
            ) from None
        first = str(e).strip().splitlines()
        reason = next((ln for ln in reversed(first) if ln.strip()), type(e).__name__)
        raise LiveRunError(f"{chapter.slug}: notebook failed ({reason}); executed notebook kept at {out}") from None
    try:
        chapter.load(run_id, root)  # the notebook must have written a whole run
    except runs.RunError as e:
        raise LiveRunError(f"{chapter.slug}: {e}") from None
    return out


def run_logged(
    chapter: chapters.Chapter, run_id: str, parameters: dict, out_dir: Path, root: Path | None = None
) -> Path:
    """run_chapter, with papermill's log of the notebook in <out_dir>/<slug>.log."""
    out_dir.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(out_dir / f"{chapter.slug}.log")
    handler.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
    logger = logging.getLogger("papermill")
    level = logger.level
    logger.setLevel(logging.INFO)
    logger.addHandler(handler)
    try:
        with kernel_stderr_to(out_dir / f"{chapter.slug}.kernel.log"):
            return run_chapter(chapter, run_id, parameters, out_dir, root)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
        handler.close()


@contextlib.contextmanager
def kernel_stderr_to(path: Path):
    """Start notebook kernels with their standard error in `path`, not on the command's terminal:
    what a kernel prints when it is stopped (a ZMQ traceback after SIGTERM) or warns at start-up
    belongs to the chapter's logs, and the command's own one-line reason stays the last word.
    jupyter_client starts kernels through its local provisioner's `launch_kernel`; where that is
    not there (another jupyter_client), kernels keep the command's standard error."""
    try:
        from jupyter_client.provisioning import local_provisioner as lp
    except ImportError:
        yield
        return
    original = getattr(lp, "launch_kernel", None)
    if original is None:
        yield
        return
    with open(path, "ab") as log:

        def launch(cmd, **kw):
            kw.setdefault("stderr", log)
            return original(cmd, **kw)

        lp.launch_kernel = launch
        try:
            yield
        finally:
            lp.launch_kernel = original


def publish_run(root: Path, chapter: chapters.Chapter, run: runs.Run, seconds: float) -> None:
    """Publish one live run and its history rows in one step (never a run whose commit is not
    in this repository's history: RunError)."""
    problem = commit_problem(run)
    if problem:
        raise runs.RunError(f"{problem}; not published")
    manifest = {**runs.published(root), chapter.slug: run.run_id}
    rows = history.rows_for(f"live {run.run_id}", chapter, run, seconds)
    p = promotion.stage(root, run.run_id, manifest, {"history.csv": history.with_rows(rows, root)})
    try:
        promotion.commit(p)
    except BaseException:
        if not promotion.flipped(p):
            promotion.discard(p, p.stage)
        raise


def main(names: list[str], parameters: dict, allow_cpu: bool = False, publish: bool = True) -> int:
    """Run chapters live (see the module's docstring). SIGTERM or SIGINT ends the notebook's
    kernel and its children, sets aside what the stopped chapter had written, releases the lock
    and says so in one line."""
    with children.stopped_by_signals():
        try:
            return _main(names, parameters, allow_cpu, publish)
        except children.Stopped as e:
            # the stopped notebook's pending cell dies with its kernel: asyncio would log that task's
            # DeadKernelError at exit, a second report of the stop this line already makes
            logging.getLogger("asyncio").disabled = True
            print(
                f"live: stopped by {e.name}; {e.note or 'no chapter had started, nothing was recorded'}",
                file=sys.stderr,
            )
            return 1


def _main(names: list[str], parameters: dict, allow_cpu: bool, publish: bool) -> int:
    check_gpu(allow_cpu)
    selected = fitting(chapters.find(names), allow_cpu)
    if not selected:
        return 0
    from labsupport.ops import params

    per_chapter = params.resolve(selected, parameters)  # ParamError before anything runs
    problem = check_environment(selected, per_chapter, allow_cpu)  # before any model is built
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 1
    root = runs.runs_root()
    try:
        leftovers.check_runs_folder(root)  # before the lock: a folder that is not one gets no .lock either
        lk = lock.acquire(root, "live" if publish else "live --no-publish")
    except (lock.LockError, runs.RunError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    try:
        if LOG_DIR.is_symlink():
            print(f"error: {LOG_DIR} is a symbolic link; refusing to write through it", file=sys.stderr)
            return 1
        with children.no_orphans(LOG_DIR / f"{children.SCRATCH}{os.getpid()}"):
            return _live(lk, root, selected, per_chapter, publish)
    finally:
        lock.release(lk)


def _live(lk, root: Path, selected, per_chapter: dict, publish: bool) -> int:
    try:
        for d in (root / "nightly", LOG_DIR):
            runs.check_real_dir(d, "live writes there")
        for line in leftovers.recover(root, lk.stale, leftovers.BOOK_DIR, leftovers.NIGHTLY_DIR, LOG_DIR):
            print(f"before running: {line}", flush=True)
        runs.published(root)  # a damaged manifest or history stops here, before any chapter runs
        history.read(root)
        run_id = fresh_run_id(LOG_DIR)
        log_dir = LOG_DIR / run_id
        # A killed `live` leaves runs its next holder sets aside (in LOG_DIR/<id>/failed-runs);
        # `--no-publish` runs are kept.
        lk.note(run_id=run_id, keep_runs=not publish)
    except (runs.RunError, OSError) as e:
        why = str(e) if isinstance(e, runs.RunError) else f"{type(e).__name__}: {e}"
        print(f"error: {why}; nothing was run and the published runs are unchanged", file=sys.stderr)
        return 1
    set_environment()
    total = time.perf_counter()
    ch = selected[0]  # the chapter a signal stops: the one running, else the last one done
    try:
        for i, ch in enumerate(selected, 1):
            print(f"[{i}/{len(selected)}] {ch.slug}: running {ch.notebook} live (run {run_id})", flush=True)
            t = time.perf_counter()
            try:
                run_logged(ch, run_id, per_chapter[ch.slug], log_dir, root)  # the kernel's stderr in its log
                seconds = time.perf_counter() - t
                if publish:
                    publish_run(root, ch, ch.load(run_id, root), seconds)
            except (LiveRunError, runs.RunError) as e:
                print(f"error: {e}; the published runs are unchanged", file=sys.stderr)
                return 1
            except promotion.PromotionError as e:
                print(
                    f"error: {ch.slug}: run {run_id} {e}; `python -m labsupport recover` finishes it", file=sys.stderr
                )
                return 1
            except Exception as e:
                print(
                    f"error: {ch.slug}: publishing run {run_id} failed ({type(e).__name__}: {e}); "
                    f"the published runs are unchanged",
                    file=sys.stderr,
                )
                return 1
            verb = "published" if publish else "recorded"
            print(f"[{i}/{len(selected)}] {ch.slug}: {verb} run {run_id} in {seconds:.0f} s", flush=True)
    except children.Stopped as e:  # during a chapter, or after the last one published
        e.note = _stopped(root, ch, run_id, publish)
        raise
    print(f"live run done in {time.perf_counter() - total:.0f} s; executed notebooks in {log_dir}", flush=True)
    return 0


def _stopped(root: Path, chapter: chapters.Chapter, run_id: str, publish: bool) -> str:
    """After a signal during `chapter`: its kernel (and the kernel's children) ended first, so that
    nothing writes a run any more, then the chapter's unpublished run set aside (a partial one
    always, a whole one unless `--no-publish` keeps it); returns what to say of it."""
    children.end_descendants()
    if publish and runs.published(root).get(chapter.slug) == run_id:
        return f"{chapter.slug}'s run {run_id} was published before it, the lock released"
    aside = LOG_DIR / run_id / "failed-runs"
    moved = leftovers.set_aside(root, run_id, aside, complete=publish)
    if run_id in runs.list_runs(chapter.slug, root):  # --no-publish keeps a whole run
        return f"{chapter.slug}'s run {run_id} was recorded (not published) before it, the lock released"
    kept = f" (what it had written is in {aside})" if moved else ""
    return f"{chapter.slug}'s run not recorded{kept}, the lock released"


def smoke(names: list[str], parameters: dict, allow_cpu: bool = False) -> int:
    """Every (or each named) chapter live with its smallest parameters, into a scratch runs
    folder beside copies of the published runs; each run checked; nothing published."""
    import torch

    from labsupport.ops import params, validate

    check_gpu(allow_cpu)
    selected = chapters.find(names)
    on_cpu = allow_cpu and not torch.cuda.is_available()
    plans, skipped = {}, {}
    have = gpus_here()
    for ch in selected:
        if on_cpu and not ch.cpu:
            skipped[ch.slug] = "no CPU path (its Params have no CPU values)"
            continue
        if not on_cpu and ch.gpus > have:
            skipped[ch.slug] = f"needs {ch.gpus} GPUs, this box has {have}"
            continue
        given = {**ch.smoke, **(ch.cpu if on_cpu else {})}
        plans[ch.slug] = params.for_chapter(ch, given)
    user = params.resolve(selected, parameters) if parameters else {}
    for slug in plans:
        plans[slug].update(user.get(slug, {}))
    run_id = fresh_run_id(SMOKE_DIR)
    root = SMOKE_DIR / run_id / "runs"
    runs.copy_published(root)  # chapters may read other chapters' published runs
    os.environ["LABSUPPORT_RUNS"] = str(root)
    set_environment()
    results = []
    for i, ch in enumerate(selected, 1):
        if ch.slug in skipped:
            results.append((ch.slug, "skip", 0.0, skipped[ch.slug]))
            print(f"[{i}/{len(selected)}] {ch.slug}: skipped: {skipped[ch.slug]}", flush=True)
            continue
        print(f"[{i}/{len(selected)}] {ch.slug}: smoke run with {plans[ch.slug]}", flush=True)
        t = time.perf_counter()
        try:
            run_logged(ch, run_id, plans[ch.slug], SMOKE_DIR / run_id, root)
            problems = validate.check_run(ch, ch.load(run_id, root))
            status, note = ("pass", "") if not problems else ("fail", f"validation: {problems[0]}")
        except (LiveRunError, runs.RunError) as e:
            status, note = "fail", str(e)
        seconds = time.perf_counter() - t
        results.append((ch.slug, status, seconds, note))
        print(f"[{i}/{len(selected)}] {ch.slug}: {status} in {seconds:.0f} s{': ' + note if note else ''}", flush=True)
    width = max(len(r[0]) for r in results)
    print(f"\nsmoke {run_id} (runs in {root}; nothing published)")
    for slug, status, seconds, note in results:
        print(f"  {slug:<{width}}  {status:<4}  {seconds:6.0f} s  {note}")
    failed = [r[0] for r in results if r[1] == "fail"]
    print(f"smoke: {len(results) - len(failed) - len(skipped)} passed, {len(failed)} failed, {len(skipped)} skipped")
    return 1 if failed else 0
