"""The eager step against the host's speed: every timed eager step of the kept runs beside the
host probe's reading nearest to it, for the methodology page's figure (a host-bound step follows
the CPU).

A run whose trials carry their round's probe reading (`probe_ms`) gives it per trial; an older run
gives, for each trial, the full reading taken nearest to its round (readings were taken before the
first round, every few rounds and after the last, and each says where: "decode step, 256 tokens,
after round 30"); a run with neither gives nothing.
"""

from __future__ import annotations

import re

import matplotlib.pyplot as plt
import pandas as pd

from labsupport import figures, runs
from labsupport.chapters.kernels_in_one_token.analysis import clean_times
from labsupport.chapters.kernels_in_one_token.params import CHAPTER, load

PER_TRIAL, NEAREST_ROUND = "its own round's reading", "the nearest reading by round"
COLUMNS = ["run", "gpu", "wall_ms", "probe_ms", "reading"]


def _round_readings(readings: list[dict], what: str, last_round: int) -> list[tuple[float, float]]:
    """(position in rounds, ms) of the readings taken around the trials of measurement `what`:
    before the first round (-0.5), after round N (N - 0.5), after the last (last_round + 0.5)."""
    out = []
    after_round = re.compile(rf"^{re.escape(what)}, after round (\d+)$")
    for r in readings:
        at, ms = str(r.get("at", "")), r.get("ms")
        if ms is None:
            continue
        if at == f"before {what}":
            out.append((-0.5, float(ms)))
        elif at == f"after {what}":
            out.append((last_round + 0.5, float(ms)))
        elif m := after_round.match(at):
            out.append((int(m.group(1)) - 0.5, float(ms)))
    return out


def step_trials(run: runs.Run) -> pd.DataFrame:
    """The run's clean eager trials at the prompt's length, each with its probe reading (COLUMNS);
    empty when neither the trials nor the readings around them say it."""
    t = clean_times(run)
    gpu = run.provenance.get("gpu", "")
    if "probe_ms" in t and t.probe_ms.notna().all():
        return pd.DataFrame(
            {"run": run.run_id, "gpu": gpu, "wall_ms": t.wall_ms, "probe_ms": t.probe_ms, "reading": PER_TRIAL}
        )[COLUMNS]
    if "round" not in t or t["round"].isna().any():
        return pd.DataFrame(columns=COLUMNS)
    what = f"decode step, {int(run.parameters['prompt_len'])} tokens"
    marks = _round_readings(run.results.get("host_probe", []), what, int(t["round"].max()))
    if not marks:
        return pd.DataFrame(columns=COLUMNS)
    nearest = [min(marks, key=lambda m, r=r: abs(m[0] - r))[1] for r in t["round"]]
    return pd.DataFrame(
        {"run": run.run_id, "gpu": gpu, "wall_ms": t.wall_ms, "probe_ms": nearest, "reading": NEAREST_ROUND}
    )[COLUMNS]


def kept_trials(root=None) -> pd.DataFrame:
    """step_trials() of every kept run of the chapter (runs/kernels-in-one-token/), oldest first."""
    parts = [step_trials(load(rid, root)) for rid in runs.list_runs(CHAPTER, root)]
    parts = [p for p in parts if not p.empty]
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=COLUMNS)


def probe_figure(trials: pd.DataFrame, label: str):
    """Every eager-step trial against its probe reading, one colour per run; a figure that says it
    has no trials yet when `trials` is empty."""
    fig, ax = plt.subplots(figsize=(figures.WIDTH, 4.2))
    if trials.empty:
        ax.text(0.5, 0.5, "no kept run has eager-step trials with host-probe readings yet", ha="center", va="center")
        ax.set_axis_off()
        return figures.finish(fig, label)
    for (rid, reading), g in trials.groupby(["run", "reading"], sort=False):
        marker = "o" if reading == PER_TRIAL else "x"
        ax.scatter(g.probe_ms, g.wall_ms, s=14, marker=marker, alpha=0.7, label=f"run {rid} ({reading})")
    ax.set_xlabel("host probe reading nearest to the trial (ms; a fixed CPU workload)")
    ax.set_ylabel("eager decode step, wall ms")
    ax.set_title("A host-bound step follows the CPU")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=1, fontsize=10, frameon=False)
    takeaway = (
        f"{len(trials)} trials of {trials.run.nunique()} runs: eager steps from {trials.wall_ms.min():.1f} "
        f"to {trials.wall_ms.max():.1f} ms, probe readings from {trials.probe_ms.min():.2f} "
        f"to {trials.probe_ms.max():.2f} ms."
    )
    return figures.finish(fig, label, takeaway)
