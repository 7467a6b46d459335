"""Run a chapter notebook's live cells in this process, as papermill would in live mode.

Unlike papermill (a kernel in another process), what a test patches here (harness.time_region,
say) is what the cells call, so a test can watch the order of the measurements or make one fail.
"""

from __future__ import annotations

import nbformat

from .conftest import REPO

LOAD = "run = ch.load(run_id)"


def parameters(**given) -> dict:
    """What papermill would put in a notebook's parameters cell for `given`: mode, run_id and the
    overrides of the chapter's Params (allow_cpu=True: the CPU, device="cpu")."""
    overrides = {k: v for k, v in given.items() if k not in ("mode", "run_id", "allow_cpu")}
    if given.get("allow_cpu"):
        overrides["device"] = "cpu"
    return {"mode": given.get("mode", "live"), "run_id": given.get("run_id"), "overrides": overrides}


def run_live_cells(notebook: str, **params) -> dict:
    """Execute the code cells of `notebook` (a path from the repository root) up to the cell
    that loads the run, with mode="live" and `params` as its overrides (parameters());
    returns the notebook's variables (`run` is the run its cells recorded)."""
    nb = nbformat.read(REPO / notebook, as_version=4)
    ns: dict = {"__name__": "__notebook__"}
    for i, cell in enumerate(c for c in nb.cells if c.cell_type == "code"):
        exec(compile(cell.source, f"{notebook}, code cell {i}", "exec"), ns)  # noqa: S102
        if "parameters" in cell.metadata.get("tags", []):
            ns.update(parameters(**params))
        if LOAD in cell.source:
            return ns
    raise AssertionError(f"{notebook}: no cell loads the run ({LOAD!r})")


def watch_harness(mp, calls: list, fail_profile=None) -> None:
    """Log every timing and profile the cells make, as ("time", what) or ("profile", region),
    and make a CPU profile count as a GPU one (CUPTI attached): a timing after it then raises
    TimingError, as it would on a GPU. `fail_profile(kwargs)` returning True makes that
    profile fail with a RuntimeError."""
    from labsupport.measure import harness

    real_time, real_profile = harness.time_region, harness.profile_region

    def time_region(fn, **kw):
        calls.append(("time", kw["what"]))
        return real_time(fn, **kw)

    def profile_region(fn, path, **kw):
        calls.append(("profile", kw["region"]))
        if fail_profile is not None and fail_profile(kw):
            raise RuntimeError("profile failed on purpose")
        k = real_profile(fn, path, **kw)
        mp.setattr(harness, "profiled", lambda: True)
        return k

    mp.setattr(harness, "time_region", time_region)
    mp.setattr(harness, "profile_region", profile_region)
