"""A compact history of published runs: one row per headline number, kept in the repo
(runs/history.csv), read by the book's status page.

Rows are only ever appended: the file's existing bytes are kept as they are and the new rows
added after them, in one atomic replacement (labsupport.runs.promotion does it together with the
publication itself)."""

from __future__ import annotations

import io
import math
from pathlib import Path

import numpy as np
import pandas as pd

from labsupport import chapters, runs

COLUMNS = ["published_as", "chapter", "run_id", "utc_time", "gpu", "metric", "value"]


def path(root: Path | None = None) -> Path:
    return (root or runs.runs_root()) / "history.csv"


def read(root: Path | None = None) -> pd.DataFrame:
    """The history (empty if there is none yet); a file that cannot be read as the history
    is one RunError naming it."""
    p = path(root)
    if not p.exists():
        return pd.DataFrame(columns=COLUMNS)
    try:
        df = pd.read_csv(p)
    except pd.errors.EmptyDataError:
        raise runs.RunError(f"{p} is corrupt: it is empty (not even a header)") from None
    except (OSError, UnicodeDecodeError, pd.errors.ParserError, ValueError) as e:
        raise runs.RunError(f"{p} is corrupt: {str(e).strip().splitlines()[0]}") from None
    if list(df.columns) != COLUMNS:
        raise runs.RunError(
            f"{p} is corrupt: its columns are {', '.join(map(str, df.columns))}, expected {', '.join(COLUMNS)}"
        )
    values = pd.to_numeric(df.value, errors="coerce")
    if not values.notna().all():
        raise runs.RunError(f"{p} is corrupt: column 'value' holds something that is not a number")
    infinite = values[~np.isfinite(values.to_numpy(dtype=float))]
    if len(infinite):
        row = int(infinite.index[0]) + 1
        raise runs.RunError(f"{p} is corrupt: column 'value', row {row}: {infinite.iloc[0]!r} is not a finite number")
    return df


def rows_for(published_as: str, chapter, run: runs.Run, notebook_s: float | None) -> list[dict]:
    values = dict(chapters.headline(chapter, run))
    if notebook_s is not None:
        values["notebook seconds"] = notebook_s
    return [
        {
            "published_as": published_as,
            "chapter": chapter.slug,
            "run_id": run.run_id,
            "utc_time": run.provenance["utc_time"],
            "gpu": run.provenance["gpu"],
            "metric": k,
            "value": float(v),
        }
        for k, v in values.items()
        if v is not None and math.isfinite(float(v))  # a number the run does not have (a CPU run's copy TB/s)
    ]


def with_rows(rows: list[dict], root: Path | None = None) -> bytes:
    """The bytes of the history with `rows` appended (the existing file checked first); a row
    whose value is not a finite number is one RunError, and nothing is appended."""
    read(root)
    for row in rows:
        value = row.get("value")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise runs.RunError(
                f"{path(root)}: {row.get('chapter')} {row.get('metric')}: {value!r} is not a finite number; "
                f"nothing was appended"
            )
    p = path(root)
    old = p.read_bytes() if p.exists() else b""
    buf = io.StringIO()
    pd.DataFrame(rows, columns=COLUMNS).to_csv(buf, index=False, header=not old, lineterminator="\n")
    if old and not old.endswith(b"\n"):
        old += b"\n"
    return old + buf.getvalue().encode()


def append(rows: list[dict], root: Path | None = None) -> None:
    """Append rows, rewriting the file atomically."""
    runs.write_atomic(path(root), with_rows(rows, root))
