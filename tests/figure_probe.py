"""What tests/test_figures.py checks of a figure, and a probe that checks every figure the book
build draws, in the notebook kernels of that build (the session's one book build: conftest's
built_book), so that no test executes the chapters again to look at their figures.

`startup_folder(out)` makes an IPython folder whose startup file installs the probe; the book
build runs with IPYTHONDIR naming it. After every cell the probe looks at each open pyplot
figure (as the in-process replay did: what the cell drew and left open, before the inline
backend shows and closes it), and writes, per kernel, `<out>/<pid>.json`: the first line of
every code cell it ran, in order (to tell which notebook it was), and the problems found, each
named by the first line of the cell that drew the figure. It also notes which of the heavy
measuring libraries (HEAVY) the kernel had loaded: a replay needs none of them."""

from __future__ import annotations

import json
import os
from pathlib import Path

from labsupport import figures

REPO = Path(__file__).resolve().parent.parent
HEAVY = ("torch", "transformers", "triton")  # about 4 s of a notebook's 2-7 s replay, when imported


def problems(name: str, fig) -> list[str]:
    from matplotlib.container import BarContainer

    found = []
    for page in (390, 1280):
        px, text = figures.text_heights_px(fig, page)[0]
        if px < figures.MIN_TEXT_PX[page]:
            found.append(f"{name}: at {page} px the text {text[:40]!r} is {px:.1f} px high")
    for ax in fig.axes:
        for axis, scale in (("x", ax.get_xscale()), ("y", ax.get_yscale())):
            if scale != "log":
                continue
            labels = ax.get_xticklabels() if axis == "x" else ax.get_yticklabels()
            sci = [t.get_text() for t in labels if "$" in t.get_text() or "^" in t.get_text()]
            if sci:
                found.append(f"{name}: {axis} tick labels in scientific notation: {sci[:3]}")
            bars = [
                b
                for c in ax.containers
                if isinstance(c, BarContainer)
                for b in c
                if (b.get_width() if axis == "x" else b.get_height()) > 0
            ]
            if bars and len(ax.texts) < len(bars):
                found.append(f"{name}: {len(bars)} bars on a log {axis} axis, {len(ax.texts)} value labels")
    return found


STARTUP = """\
import sys
sys.path.insert(0, {repo!r})
from tests import figure_probe
figure_probe.install({out!r})
"""


def startup_folder(ipython_dir: Path, out: Path) -> Path:
    """An IPYTHONDIR whose default profile installs the probe, writing into `out`."""
    startup = ipython_dir / "profile_default" / "startup"
    startup.mkdir(parents=True, exist_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    (startup / "00-figure-probe.py").write_text(STARTUP.format(repo=str(REPO), out=str(out)))
    return ipython_dir


def install(out: str) -> None:
    """In a notebook kernel: check the figures left open after each cell (see the module)."""
    from IPython import get_ipython

    ip = get_ipython()
    record = {"cells": [], "figures": 0, "problems": [], "errors": [], "loaded": []}
    path = Path(out) / f"{os.getpid()}.json"
    current = {"first": ""}

    def pre_run_cell(info):
        current["first"] = (info.raw_cell or "").splitlines()[0] if (info.raw_cell or "").strip() else ""
        record["cells"].append(current["first"])

    def post_execute():
        try:
            import sys

            record["loaded"] = [m for m in HEAVY if m in sys.modules]
            if "matplotlib.pyplot" not in sys.modules:
                return
            plt = sys.modules["matplotlib.pyplot"]
            for n in plt.get_fignums():
                record["figures"] += 1
                record["problems"] += problems(current["first"], plt.figure(n))
        except Exception as e:  # reported by the test, never a failure of the book build
            record["errors"].append(f"{current['first']}: {type(e).__name__}: {e}")
        finally:
            path.write_text(json.dumps(record))

    # A figure glued for the prose (labsupport.glue.glue_figure) is closed by its own cell, before
    # post_execute: it is looked at as it is glued.
    from labsupport import glue

    glued = glue.glue_figure

    def glue_figure(name, fig):
        try:
            record["figures"] += 1
            record["problems"] += problems(current["first"], fig)
        except Exception as e:
            record["errors"].append(f"{current['first']}: {type(e).__name__}: {e}")
        return glued(name, fig)

    glue.glue_figure = glue_figure

    # Registered at start-up, before the inline backend registers its flush (which shows and
    # closes the figures) on first use of pyplot: this runs first.
    ip.events.register("pre_run_cell", pre_run_cell)
    ip.events.register("post_execute", post_execute)


def records(out: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(out.glob("*.json"))]
