"""The book's status page: what is published, where it came from, and how the headline
numbers moved from run to run."""

from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd

from labsupport import chapters, runs
from labsupport import figures as plots
from labsupport.ops import drift, history


def published_table() -> pd.DataFrame:
    """One row per chapter: its published run and that run's provenance."""
    h = history.read()
    secs = h[h.metric == "notebook seconds"].drop_duplicates(["chapter", "run_id"], keep="last")
    secs = secs.set_index(["chapter", "run_id"]).value
    rows = []
    for ch in chapters.CHAPTERS:
        try:
            run = runs.load_run(ch.slug)
        except runs.RunError as e:
            rows.append({"chapter": ch.slug, "run": f"none ({e})"})
            continue
        p = run.provenance
        rows.append(
            {
                "chapter": ch.slug,
                "run": run.run_id,
                "GPU": p["gpu"].replace("NVIDIA ", ""),
                "software": f"torch {p['torch']}, transformers {p['transformers']}, CUDA {p['cuda']}, "
                f"driver {p['driver']}",
                "commit": p["git_commit"][:10],
                "notebook s": secs.get((ch.slug, run.run_id), float("nan")),
            }
        )
    return pd.DataFrame(rows)


def history_figure(label: str):
    """Each chapter's headline numbers across the published runs (one panel per number)."""
    h = history.read()
    h = h[h.metric != "notebook seconds"]
    order = list(dict.fromkeys(h.published_as))
    series = list(h.groupby(["chapter", "metric"], sort=False))
    if not series:
        fig, ax = plt.subplots(figsize=(6, 1.2))
        ax.axis("off")
        ax.text(0.5, 0.5, "No published runs are in runs/history.csv yet.", ha="center", va="center")
        return fig
    cols = 4
    rows = -(-len(series) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(12, 2.2 * rows), squeeze=False)
    for ax, ((chapter, metric), g) in zip(axes.flat, series, strict=False):
        x = [order.index(p) for p in g.published_as]
        ax.plot(x, g.value, "o-", color=plots.OURS, ms=4)
        ax.set_title(f"{chapter}\n{metric}", fontsize=8.5)
        ax.set_xticks(range(len(order)), [str(i + 1) for i in range(len(order))], fontsize=7)
        ax.tick_params(axis="y", labelsize=7)
        lo, hi = g.value.min(), g.value.max()
        pad = max((hi - lo) * 0.5, abs(hi) * 0.15) or 1  # noise should look like noise
        ax.set_ylim(lo - pad, hi + pad)
    for ax in list(axes.flat)[len(series) :]:
        ax.set_visible(False)
    fig.supxlabel("publication (1 = oldest in runs/history.csv)", fontsize=8)
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    plots.footer(fig, label)
    return fig


def publications() -> pd.DataFrame:
    """The publications the history holds, numbered as on the figure's axis."""
    h = history.read()
    first = h.drop_duplicates("published_as")
    return pd.DataFrame(
        {
            "#": range(1, len(first) + 1),
            "published as": first.published_as.values,
            "GPU": first.gpu.values,
            "chapters": h.groupby("published_as", sort=False).chapter.nunique().values,
        }
    )


def published_night() -> str | None:
    """The id of the newest nightly whose runs are (at least partly) the published ones and
    whose drift report is under runs/nightly/; None if there is none. Reports of nights that
    never published are never chosen, whatever their names."""
    root = runs.runs_root()
    ids = set(runs.published(root).values())
    d = root / "nightly"
    nights = sorted(n for n in ids if (d / f"{n}-drift.json").is_file() and not (d / f"{n}-drift.json").is_symlink())
    return nights[-1] if nights else None


def latest_drift() -> str:
    """The drift report of the published runs (markdown, rendered from its JSON with every
    value from run data escaped), or a sentence saying there is none."""
    night = published_night()
    if night is None:
        return (
            "No nightly drift report belongs to the published runs "
            "(they were published by `live`, or before the nightly existed)."
        )
    path = runs.runs_root() / "nightly" / f"{night}-drift.json"
    try:
        drifts, threshold = drift.from_json(path.read_text())
    except (ValueError, KeyError, TypeError) as e:
        raise runs.RunError(f"{path} is corrupt: {type(e).__name__}: {e}") from None
    text = drift.to_markdown(drifts, threshold, "")
    return text.replace("\n## ", "\n#### ").split("\n", 2)[2].lstrip("\n")


def latest_drift_name() -> str:
    return published_night() or "none"
