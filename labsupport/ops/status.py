"""The book's status page: what is published, where it came from, and how the headline
numbers moved from run to run."""

from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.ticker import MaxNLocator

from labsupport import chapters, figures, runs
from labsupport.ops import drift, history


def published_table() -> pd.DataFrame:
    """One row per chapter: its published run and that run's provenance."""
    h = history.read()
    secs = h[h.metric == "notebook seconds"].drop_duplicates(["chapter", "run_id"], keep="last")
    secs = secs.set_index(["chapter", "run_id"]).value
    rows = []
    for ch in chapters.CHAPTERS:
        try:
            run = ch.load()
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
    """Each chapter's headline numbers across the publications, one panel per chapter: every
    number relative to its value in the newest publication (1 = today), so that a panel holds
    several numbers and a change of 10% looks like one whatever the unit."""
    h = history.read()
    h = h[h.metric != "notebook seconds"]
    order = list(dict.fromkeys(h.published_as))
    by_chapter = [(c, h[h.chapter == c]) for c in dict.fromkeys(h.chapter)]
    if not by_chapter:
        fig, ax = plt.subplots(figsize=(6, 1.2))
        ax.axis("off")
        ax.text(0.5, 0.5, "No published runs are in runs/history.csv yet.", ha="center", va="center")
        figures.describe(fig, "No published runs are in the history yet: nothing to plot.")
        return fig
    # One panel per chapter, one above the other, each with its legend under it (never over the
    # lines), and a handful of whole-number publication ticks however many publications there are.
    fig, axes = plt.subplots(len(by_chapter), 1, figsize=(figures.WIDTH, 2.4 * len(by_chapter)), squeeze=False)
    for ax, (chapter, g) in zip(axes.flat, by_chapter, strict=True):
        for metric, m in g.groupby("metric", sort=False):
            x = [order.index(p) + 1 for p in m.published_as]
            now_zero = m.value.iloc[-1] == 0
            ax.plot(x, relative(m.value), "o-", ms=3, label=f"{metric} (now 0)" if now_zero else metric)
        ax.axhline(1, color="#888", lw=0.8, zorder=0)
        ax.set_title(chapter, loc="left")
        ax.set_xlim(0.5, len(order) + 0.5)
        ax.xaxis.set_major_locator(MaxNLocator(nbins=8, integer=True))
        ax.set_ylabel("relative to newest")
        ax.legend(loc="upper left", bbox_to_anchor=(0, -0.2), ncol=3, frameon=False)
    axes.flat[-1].set_xlabel("publication (numbered as in the table below)")
    takeaway = (
        f"{len(order)} publications; each line is one headline number over its newest value, "
        "so 1 is today's and a line that stays near 1 did not move."
    )
    return figures.finish(fig, label, takeaway)


def relative(values: pd.Series) -> pd.Series:
    """`values` over the newest one (1 = today). A newest value of 0 is drawn as 0, the others over
    the newest value that is not 0 (all zeros: all drawn at 0), so that its line is never lost."""
    nonzero = values[values != 0]
    return values / (nonzero.iloc[-1] if len(nonzero) else 1.0)


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


def published_nights() -> list[str]:
    """The nightly ids that published at least one of the published runs and whose drift
    report is under runs/nightly/, oldest first. Reports of nights that never published are
    never chosen, whatever their names."""
    root = runs.runs_root()
    ids = set(runs.published(root).values())
    d = root / "nightly"
    return sorted(n for n in ids if (d / f"{n}-drift.json").is_file() and not (d / f"{n}-drift.json").is_symlink())


def published_night() -> str | None:
    """The newest of published_nights(), or None."""
    nights = published_nights()
    return nights[-1] if nights else None


def latest_drift() -> str:
    """The drift reports of the published runs (markdown, rendered from their JSON with every
    value from run data escaped): for each chapter, the report of the night that published its
    run; a chapter published by `live` is named as having none."""
    root = runs.runs_root()
    published = runs.published(root)
    parts, covered = [], set()
    for night in published_nights():
        path = root / "nightly" / f"{night}-drift.json"
        try:
            drifts, threshold = drift.from_json(path.read_text())
        except (ValueError, KeyError, TypeError) as e:
            raise runs.RunError(f"{path} is corrupt: {type(e).__name__}: {e}") from None
        mine = [d for d in drifts if published.get(d.chapter) == night]
        if not mine:
            continue
        for d in mine:
            d.gpus = d.gpus or gpus_of(d, root)
        covered |= {d.chapter for d in mine}
        text = drift.to_markdown(mine, threshold, "")
        parts.append(f"### Nightly `{night}`\n\n" + text.replace("\n## ", "\n#### ").split("\n", 2)[2].lstrip("\n"))
    missing = [c for c in published if c not in covered]
    if missing:
        parts.append(
            "No nightly drift report belongs to the published runs of "
            + ", ".join(f"*{c}*" for c in missing)
            + " (they were published by `live`, or before the nightly existed)."
        )
    return "\n\n".join(parts)


def gpus_of(d: drift.ChapterDrift, root) -> dict:
    """The GPUs of a report's two runs where they differ ({} where they do not, or where either run
    is gone), for a report written before the drift report named them (drift.compare)."""
    if d.old_run is None:
        return {}
    try:
        # provenance only: the runs' tables and traces are not read (as data_files.host_reference_ms)
        old, new = (
            runs.open_run(d.chapter, r, root, verify=False).provenance.get("gpu") for r in (d.old_run, d.new_run)
        )
    except runs.RunError:
        return {}
    return {"published": old, "new": new} if old != new else {}


def latest_drift_name() -> str:
    return ", ".join(published_nights()) or "none"
