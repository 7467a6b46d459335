"""Recorded runs: write one atomically, publish it, and load it back for replay.

Layout: runs/<chapter>/<run_id>/ holds CSV tables, a compressed raw profiler
trace and meta.json (provenance, parameters, and a SHA-256 of every file);
runs/published.json maps each chapter to the run the book replays.

A run is first written to a hidden `.incomplete-<run_id>` folder and renamed into
place only when it is whole; published.json is replaced atomically (one rename),
so several chapters are promoted together or not at all. A failed or interrupted
run never changes what the book shows.

Everything read from runs/ is checked at this boundary: chapter names and run ids match
their patterns and stay inside the runs folder, the files a meta.json lists are plain names
of regular files (no links), provenance is complete, and a table or trace that cannot be
read is one RunError naming the file.
"""

from labsupport.runs.load import Run, check_published, load_run, open_run, published, published_run_id, read_table
from labsupport.runs.paths import (
    CHAPTER_PATTERN,
    FILE_PATTERN,
    MANIFEST,
    RUN_ID_PATTERN,
    RunError,
    check_chapter,
    check_real_dir,
    check_run_id,
    inside,
    new_run_id,
    run_dir,
    runs_root,
)
from labsupport.runs.publish import copy_published, list_runs, manifest_bytes, prune, publish, publish_many
from labsupport.runs.writer import RunWriter, write_atomic

__all__ = [
    "CHAPTER_PATTERN",
    "FILE_PATTERN",
    "MANIFEST",
    "RUN_ID_PATTERN",
    "Run",
    "RunError",
    "RunWriter",
    "check_chapter",
    "check_published",
    "check_real_dir",
    "check_run_id",
    "copy_published",
    "inside",
    "list_runs",
    "load_run",
    "open_run",
    "manifest_bytes",
    "new_run_id",
    "prune",
    "publish",
    "publish_many",
    "published",
    "published_run_id",
    "read_table",
    "run_dir",
    "runs_root",
    "write_atomic",
]
