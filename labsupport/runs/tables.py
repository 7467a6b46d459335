"""A run's tables, checked against what their chapter declares: the columns a table must have, the
columns that name a row (its key, never repeated) and the range of every number. runs/ imports no
chapter code: whoever writes or loads a run hands in the chapter's declaration (a
labsupport.chapters.Chapter: its `slug`, `columns_of(file)`, `range_of(file, column)` ((lo, hi) or
None), `lacks_allowed(file, column)` and `key_of(file)`, the columns that name a row or None)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from labsupport.runs.paths import RunError


def check_table(df: pd.DataFrame, path: Path, declaration) -> None:
    """A table of a run as its chapter declares it: its numbers (check_values) and its key (check_key)."""
    check_values(df, path, declaration)
    check_key(df, path, declaration)


def check_key(df: pd.DataFrame, path: Path, declaration) -> None:
    """No two rows share the columns the chapter declares as the table's key (a repeated row
    would be counted twice, or make one number two); else one RunError naming the file, the
    repeated key and its rows. A key column the table lacks (a run recorded before the column
    existed) is left out, which only makes the rest stricter; an empty key is a table of one row."""
    key = declaration.key_of(path.name)
    if key is None or len(df) < 2:
        return
    cols = [c for c in key if c in df.columns]
    if not cols:
        raise RunError(f"{path}: {len(df)} rows, where the table holds one")
    repeats = df.duplicated(cols).to_numpy()  # from the second row of each key on
    if repeats.any():
        j = int(repeats.argmax())
        before, row = df[cols].iloc[:j], df[cols].iloc[j]
        i = int((before.eq(row) | (before.isna() & row.isna())).all(axis=1).to_numpy().argmax())
        shown = ", ".join(f"{c}={str(row[c])[:40]!r}" for c in cols)
        raise RunError(f"{path}: rows {i + 1} and {j + 1} repeat the key {shown}; each row needs its own")


def check_values(df: pd.DataFrame, path: Path, declaration) -> None:
    """Every number in a column the chapter's declaration gives a range (chapters.RANGES, a
    File's `ranges`) is a finite number within it; a missing value only where the row's
    status is not "ok" (a batch that ran out of memory, say) or the declaration says the column
    may lack it (File.may_lack). Else one RunError naming the
    file, the column and the (1-based data) row."""
    if df.empty:
        return
    may_lack = (df["status"].astype(str) != "ok").to_numpy() if "status" in df.columns else None
    for col in df.columns:
        bounds = declaration.range_of(path.name, str(col))
        if bounds is None:
            continue
        raw = df[col]
        if raw.dtype == bool:
            raise RunError(f"{path}: column {col}, row 1: {raw.iloc[0]!r} is not a number")
        values = pd.to_numeric(raw, errors="coerce").astype(float).to_numpy()
        lo, hi = bounds
        for i, v in enumerate(values):
            if v == v and lo <= v <= hi:
                continue
            if v != v and raw.iloc[i] is not None and raw.iloc[i] == raw.iloc[i]:  # text, not a number
                raise RunError(f"{path}: column {col}, row {i + 1}: {str(raw.iloc[i])[:40]!r} is not a number")
            if v != v and ((may_lack is not None and may_lack[i]) or declaration.lacks_allowed(path.name, str(col))):
                continue
            what = "missing (NaN)" if v != v else f"{float(v)!r} is outside [{lo:g}, {hi:g}]"
            raise RunError(f"{path}: column {col}, row {i + 1}: {what}")


def read_table(path: Path, required=(), **read_csv_args) -> pd.DataFrame:
    """Read a CSV file of a run: empty, unparsable or lacking a `required` column is one
    RunError naming the file."""
    try:
        df = pd.read_csv(path, **read_csv_args)
    except pd.errors.EmptyDataError:
        raise RunError(f"{path} is empty") from None
    except (pd.errors.ParserError, UnicodeDecodeError, ValueError) as e:
        raise RunError(f"{path} is not a readable table: {first_line(e)}") from None
    missing = [c for c in required if c not in df.columns]
    if missing:
        raise RunError(
            f"{path} lacks column{'s' if len(missing) > 1 else ''} {', '.join(missing)} "
            f"(it has {', '.join(map(str, df.columns))})"
        )
    return df


def first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0] if text else type(e).__name__
