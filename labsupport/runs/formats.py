"""The format of a run folder (meta.json's `format`): what a run of each format holds, so that the
code reads only runs of its own format and `python -m labsupport derive` brings older ones to it.

A change in what a run folder holds, or in what derive writes into one, is a new format: a line
in ADDED, CURRENT raised by one, and the step that brings a run of the format before it up to it
(labsupport.ops.derive)."""

from __future__ import annotations

# What each format added to the one before it.
ADDED = {
    1: "tables, traces and meta.json (chapter, run id, parameters, provenance, results, files with their SHA-256); "
    "meta.json has no `format`: every run recorded before it",
    2: "meta.json's `format`; beside every profiler trace, the tables replay reads (labsupport.traces.replay), "
    "listed under files and derived",
}
CURRENT = max(ADDED)
FIRST = min(ADDED)  # the format of a run whose meta.json has none


def of(meta: dict) -> int | None:
    """The format a run's meta.json records (FIRST where it records none); None when it is not a
    format number (a corrupt meta.json)."""
    value = meta.get("format", FIRST)
    if isinstance(value, bool) or not isinstance(value, int) or value < FIRST:
        return None
    return value
