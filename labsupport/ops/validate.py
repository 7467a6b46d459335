"""Sanity checks on a freshly recorded run before it may be published."""

from __future__ import annotations

import math

import pandas as pd

from labsupport import runs
from labsupport.chapters import Chapter, shared
from labsupport.measure import hardware
from labsupport.runs import provenance
from labsupport.runs.publish import commit_problem
from labsupport.traces import derived, replay

TIME_SUFFIXES = ("_ns", "_ms", "_us", " ms", " µs", "ms_median", "us_median")
RATE_WORDS = ("tbs", "tflops", "GB/s", "TB/s")


def _measured(column: str) -> bool:
    """Columns that hold measurements or counts (other columns, such as a kernel's decoder
    layer, are legitimately empty for some rows)."""
    return (
        column.endswith(TIME_SUFFIXES)
        or column in ("kernels", "dur_ns", "bytes", "copy_bytes")
        or any(w in column for w in RATE_WORDS)
    )


def check_commit(run: runs.Run) -> str | None:
    """Why the commit `run` records is not in this repository's history (where .git is here to
    ask), or None: a run is traceable to the code that made it, or it is not published."""
    return commit_problem(run)


def published_provenance(root=None) -> pd.DataFrame:
    """One row per published run: its chapter, run id, the GPU it was recorded on (chapters recorded
    on different boxes are set against their own GPU's ceilings), the commit it records, whether that
    commit is in this repository's history (check_commit; "not checked" without .git), and the digest
    of the code the box ran (provenance.tree_digest; "not recorded" for runs made before it was)."""
    rows = []
    for chapter, run_id in sorted(runs.published(root).items()):
        run = runs.open_run(chapter, run_id, root)
        problem = check_commit(run)
        in_history = "not checked (no .git)" if not provenance.has_git() else "no" if problem else "yes"
        rows.append(
            {
                "chapter": chapter,
                "run": run_id,
                "GPU": str(run.provenance.get("gpu", "")),
                # as many hex digits as `git show` needs; meta.json holds the whole of each
                "commit": str(run.provenance.get("git_commit", ""))[:12],
                "in the history": in_history,
                "code digest (SHA-256)": str(run.provenance.get("tree_digest", "not recorded"))[:16],
            }
        )
    return pd.DataFrame(rows)


def check_run(chapter: Chapter, run: runs.Run, min_kernels: int = 1) -> list[str]:
    """Problems found in `run` (an empty list means it passed).

    Every file the chapter declares is present; every table has rows; numbers are not NaN
    (rows with a status other than "ok" excepted, such as a batch that ran out of memory, and the
    columns its declaration says may lack a number: File.may_lack);
    times and counts are not negative; kernel tables hold at least `min_kernels` kernels;
    tables have the columns the chapter's declaration names; traces parse, and the tables replay reads
    beside each (labsupport.traces.replay) are what the trace gives when re-derived now; the
    provenance is complete, and its commit is one of this repository's (check_commit); no kernel
    reads faster than the practical ceiling (check_ceiling).
    """
    problems = []
    files = run.meta.get("files", {})
    for name in chapter.artifacts:
        if name not in files:
            problems.append(f"{name} is missing")
    for name in sorted(files):  # traces must parse
        if not name.endswith(".csv"):
            try:
                run.file(name)
            except runs.RunError as e:
                problems.append(str(e))
                continue
            if replay.trace_base(name) is not None:  # its stored tables re-derived and compared
                found = derived.check(run.path / name, run.provenance.get("device"))
                if found:
                    problems.append(found)
    for name in sorted(set(run.meta.get("derived", {})) - set(files)):
        problems.append(f"meta.json says {name} was derived, but does not list it with a checksum")
    prov = run.provenance
    for field in provenance.REQUIRED_FIELDS:
        if str(prov.get(field, "")).strip() in ("", "unknown"):
            problems.append(f"provenance field {field!r} is empty or unknown")
    commit = check_commit(run)
    if commit:
        problems.append(commit)
    for name in sorted(files):
        if not name.endswith(".csv"):
            continue
        try:
            df = run.table(name[:-4])  # with the columns its declaration names
        except runs.RunError as e:
            problems.append(str(e))
            continue
        if df.empty:
            problems.append(f"{name} has no rows")
            continue
        ok = df[df["status"] == "ok"] if "status" in df else df
        measured = [c for c in ok.columns if _measured(c)]
        nan_cols = [c for c in measured if ok[c].isna().any() and not chapter.lacks_allowed(name, c)]
        if nan_cols:
            problems.append(f"{name}: NaN in {', '.join(nan_cols)}")
        for c in measured:
            values = pd.to_numeric(ok[c], errors="coerce")
            if values.isna().any() and c not in nan_cols and not chapter.lacks_allowed(name, c):
                problems.append(f"{name}: non-numeric values in {c}")
            elif (values < 0).any():
                problems.append(f"{name}: negative values in {c}")
        if {"name", "dur_ns"} <= set(df.columns):
            if len(df) < min_kernels:
                problems.append(f"{name}: {len(df)} kernels, fewer than the minimum {min_kernels}")
            if (df.dur_ns <= 0).any():
                problems.append(f"{name}: kernels with zero or negative duration")
    for key, value in run.results.items():
        if isinstance(value, float) and math.isnan(value):
            problems.append(f"result {key} is NaN")
    problems += check_ceiling(run)
    return problems


# The practical ceiling (hardware.practical_ceiling) is the best read rate measured in the ceilings
# owner's run; a kernel the book shows that reads faster (beyond hardware.CEILING_TOLERANCE) makes
# the ceiling wrong. The rates each chapter's run records, by chapter: (what, TB/s) per kernel shown.
def _read_rates(run: runs.Run) -> list[tuple[str, float]]:
    files, out = run.meta.get("files", {}), []

    def table(name):
        return run.table(name) if f"{name}.csv" in files else None

    if (t := table("gemv_tuning")) is not None:  # closing-the-gap's tuner: every GEMV config timed
        for r in t.itertuples():
            config = (
                f"{getattr(r, 'weights', 'bf16')}, {r.block_n} rows x {r.block_k}, split-K {getattr(r, 'split_k', 1)}"
            )
            out.append((f"Triton GEMV {r.n} x {r.k} {r.fusion} ({config})", float(r.tbs)))
    if (t := table("matmuls")) is not None:  # closing-the-gap: cuBLAS and our GEMV per weight shape
        for r in t.itertuples():
            out += [(f"cuBLAS at {r.matrix}", float(r.cublas_tbs)), (f"Triton GEMV at {r.matrix}", float(r.triton_tbs))]
    if (t := table("hbm_add")) is not None:  # what-a-kernel: adds larger than L2 (bytes read and written)
        for r in t.itertuples():
            out.append((f"the add {r.implementation} (bytes moved)", r.bytes / (r.ms_median * 1e-3) / 1e12))
    if run.chapter == "kernels-in-one-token" and "kernels.csv" in files:  # the eager step's matmuls, by shape
        from labsupport.chapters import kernels_in_one_token

        g = kernels_in_one_token.gemv_by_shape(run)
        out += [(f"the eager step's {p} ({k})", t) for p, k, t in zip(g.projection, g.kernel, g.tbs, strict=True)]
    if (t := table("matvec")) is not None:  # why-a-gpu: the matrix-vector product on the GPU (GB/s)
        gpu = t[~t.device.astype(str).str.startswith("CPU")]
        timing = gpu["timing"] if "timing" in gpu else ["per call"] * len(gpu)
        out += [(f"the matrix-vector product ({w})", g / 1e3) for w, g in zip(timing, gpu["GB/s"], strict=True)]
    return out


def _ceiling_run(run: runs.Run) -> runs.Run | None:
    """The ceilings owner's run the book shows beside `run`: `run` itself (a why-a-gpu run), else the
    one recorded with it (same run id, same runs folder: a nightly's), else the published one."""
    if run.chapter == shared.CEILINGS:
        return run
    root = run.path.parent.parent
    for run_id in (run.run_id, None):
        try:
            return shared.owner_run(shared.CEILINGS, run_id, root=root)
        except runs.RunError:
            continue
    return None


def check_ceiling(run: runs.Run) -> list[str]:
    """One problem line per kernel of `run` that reads faster than the practical ceiling by more
    than hardware.CEILING_TOLERANCE, naming the kernel, its rate and the ceiling.

    Applies only where the ceiling's run has its read-kernels table (hardware.READ_KERNELS): runs
    recorded before it timed no GEMV at the LM head's shape, so the book's own GEMV reads faster than
    their read stream by design, and refusing on it would refuse every run until the ceilings owner
    is recorded again with that table."""
    owner = _ceiling_run(run)
    if owner is None or f"{hardware.READ_KERNELS}.csv" not in owner.meta["files"]:
        return []
    if owner.provenance.get("gpu") != run.provenance.get("gpu"):
        return []  # another GPU: its own ceilings, not this one's
    lim = hardware.run_limits(owner)
    if not lim.ceiling_tbs:
        return []
    top = lim.ceiling_tbs * (1 + hardware.CEILING_TOLERANCE)
    return [
        f"{what} reads {tbs:.3f} TB/s, above the practical ceiling {lim.ceiling_tbs:.3f} TB/s (run "
        f"{owner.run_id}: {lim.ceiling_by}) by more than {hardware.CEILING_TOLERANCE:.0%}"
        for what, tbs in _read_rates(run)
        if tbs == tbs and tbs > top
    ]
