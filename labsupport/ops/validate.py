"""Sanity checks on a freshly recorded run before it may be published."""

from __future__ import annotations

import math

import pandas as pd

from labsupport import runs
from labsupport.chapters import Chapter
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
    """One row per published run: its chapter, run id, the commit it records, whether that commit
    is in this repository's history (check_commit; "not checked" without .git), and the digest of
    the code the box ran (provenance.tree_digest; "not recorded" for runs made before it was)."""
    rows = []
    for chapter, run_id in sorted(runs.published(root).items()):
        run = runs.load_run(chapter, run_id, root)
        problem = check_commit(run)
        in_history = "not checked (no .git)" if not provenance.has_git() else "no" if problem else "yes"
        rows.append(
            {
                "chapter": chapter,
                "run": run_id,
                "commit": run.provenance.get("git_commit", ""),
                "in the history": in_history,
                "code digest (SHA-256)": run.provenance.get("tree_digest", "not recorded"),
            }
        )
    return pd.DataFrame(rows)


def check_run(chapter: Chapter, run: runs.Run, min_kernels: int = 1) -> list[str]:
    """Problems found in `run` (an empty list means it passed).

    Every file the chapter declares is present; every table has rows; numbers are not NaN
    (rows with a status other than "ok" excepted, such as a batch that ran out of memory, and the
    columns the registry says may lack a number: Chapter.may_lack);
    times and counts are not negative; kernel tables hold at least `min_kernels` kernels;
    tables have the columns chapters.py declares; traces parse, and the tables replay reads
    beside each (labsupport.traces.replay) are what the trace gives when re-derived now; the
    provenance is complete, and its commit is one of this repository's (check_commit).
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
            df = run.table(name[:-4])  # with the columns chapters.py declares
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
    return problems
