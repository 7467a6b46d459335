"""A compact history of published runs: one row per headline number, kept in the repo
(runs/history.csv), read by the book's status page."""
from __future__ import annotations

import os
from pathlib import Path

import pandas as pd

from . import runs

COLUMNS = ["published_as", "chapter", "run_id", "utc_time", "gpu", "metric", "value"]


def path(root: Path | None = None) -> Path:
    return (root or runs.runs_root()) / "history.csv"


def read(root: Path | None = None) -> pd.DataFrame:
    p = path(root)
    return pd.read_csv(p) if p.is_file() else pd.DataFrame(columns=COLUMNS)


def rows_for(published_as: str, chapter, run: runs.Run, notebook_s: float | None) -> list[dict]:
    values = dict(chapter.headline(run))
    if notebook_s is not None:
        values["notebook seconds"] = notebook_s
    return [{"published_as": published_as, "chapter": chapter.slug, "run_id": run.run_id,
             "utc_time": run.provenance["utc_time"], "gpu": run.provenance["gpu"],
             "metric": k, "value": float(v)} for k, v in values.items()]


def append(rows: list[dict], root: Path | None = None) -> None:
    """Append rows, rewriting the file atomically."""
    p = path(root)
    df = pd.concat([read(root), pd.DataFrame(rows, columns=COLUMNS)], ignore_index=True)
    tmp = p.with_name(".history.csv.tmp")
    df.to_csv(tmp, index=False)
    os.replace(tmp, p)
