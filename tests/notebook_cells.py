"""Run a chapter notebook's measuring cells in this process (live mode), as papermill would,
to test on a CPU the order in which they measure: every code cell up to the one that loads
the run, with the notebook's parameters replaced by the test's."""

import nbformat

from .conftest import REPO
from .live_cells import parameters


def code_cells(notebook: str) -> list:
    nb = nbformat.read(REPO / "notebooks" / notebook, as_version=4)
    return [c for c in nb.cells if c.cell_type == "code"]


def run_live(notebook: str, **params):
    """Execute the notebook's cells in live mode, on the CPU, until the run is loaded; return that run.
    As papermill does, the parameters cell runs and then takes the test's parameters as its overrides
    (live_cells.parameters; a parameter the test does not give keeps its Params default)."""
    given = parameters(**{"allow_cpu": True, **params})
    ns = dict(given)
    for cell in code_cells(notebook):
        exec(compile(cell.source, notebook, "exec"), ns)
        if "parameters" in cell.metadata.get("tags", []):
            ns.update(given)
        if "run" in ns:
            return ns["run"]
    raise AssertionError(f"{notebook}: no cell loads the run")


def definitions(notebook: str, **params) -> dict:
    """The names the notebook's code cells define before its measuring cell (the first that
    starts `if mode == "live":`), executed in replay mode with `params` as its overrides."""
    given = parameters(mode="replay", **params)
    ns = dict(given)
    for cell in code_cells(notebook):
        if cell.source.startswith('if mode == "live":'):
            return ns
        exec(compile(cell.source, notebook, "exec"), ns)
        if "parameters" in cell.metadata.get("tags", []):
            ns.update(given)
    raise AssertionError(f"{notebook}: no measuring cell")


def assert_times_before_profiles(order):
    kinds = [k for k, _ in order]
    assert "time" in kinds and "profile" in kinds
    first_profile = kinds.index("profile")
    assert "time" not in kinds[first_profile:], f"a time after a profile: {order[first_profile:]}"
