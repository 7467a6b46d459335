"""The status page's data: one row per chapter for its published run, the drift reports of
the nights that published them, and the history figure (one panel per chapter)."""

import pandas as pd
import pytest

from labsupport import chapters, runs
from labsupport.ops import drift, history, status

pytestmark = pytest.mark.unit


def test_status_page_data():
    t = status.published_table()
    # A run whose notebook was interrupted after it recorded has no notebook time: shown empty.
    assert len(t) == len(chapters.CHAPTERS) and (t["notebook s"].dropna() > 0).all()
    assert (t.run == [runs.published_run_id(c) for c in t.chapter]).all()
    report = status.latest_drift()
    for night in status.published_nights():
        assert f"Nightly `{night}`" in report
    fig = status.history_figure("test")
    shown = [a for a in fig.axes if a.get_visible()]
    assert len(shown) == len(set(status.history.read().chapter)), "one panel per chapter"


def test_the_historys_newest_rows_of_each_chapter_are_its_published_runs():
    """The history figure calls each chapter's newest publication "today": it must be the run the
    book shows (a run published and then set back is published again, with rows of its own)."""
    h = history.read()
    for chapter, run_id in runs.published().items():
        mine = h[h.chapter == chapter]
        assert len(mine) and mine.run_id.iloc[-1] == run_id, chapter
        newest = mine[mine.published_as == mine.published_as.iloc[-1]]
        assert set(newest.run_id) == {run_id}


def test_a_newest_value_of_zero_is_drawn_as_zero_not_dropped(runs_root):
    """A headline number that is 0 today keeps its line: drawn at 0 (marked), its earlier values
    relative to its newest value that was not 0; a number that is not 0 today is 1 today."""
    rows = [
        dict(zip(history.COLUMNS, [f"live {i}", "why-a-gpu", f"r{i}", "t", "g", metric, value], strict=True))
        for i, values in enumerate([(2.0, 4.0), (4.0, 5.0), (0.0, 10.0)])
        for metric, value in zip(("busy share", "copy TB/s"), values, strict=True)
    ]
    history.append(rows)
    fig = status.history_figure("test")
    (ax,) = [a for a in fig.axes if a.get_visible()]
    lines = {ln.get_label(): list(ln.get_ydata()) for ln in ax.get_lines() if not ln.get_label().startswith("_")}
    assert lines == {"busy share (now 0)": [0.5, 1.0, 0.0], "copy TB/s": [0.4, 0.5, 1.0]}
    assert list(status.relative(pd.Series([0.0, 0.0]))) == [0.0, 0.0]


def test_a_report_written_before_reports_named_the_gpus_is_shown_with_them():
    """The drift of the published H100 runs against the H200 runs they replaced, written before the
    report named both GPUs: the status page reads them from the two runs and says so."""
    published = runs.published()
    night = status.published_night()
    d = next(x for x in drift.from_json((runs.runs_root() / "nightly" / f"{night}-drift.json").read_text())[0]
             if published.get(x.chapter) == night)  # fmt: skip
    gpus = status.gpus_of(d, runs.runs_root())
    old, new = (runs.open_run(d.chapter, r).provenance["gpu"] for r in (d.old_run, d.new_run))
    assert gpus == ({"published": old, "new": new} if old != new else {})
    assert ("**Another GPU**" in status.latest_drift()) == any(
        status.gpus_of(x, runs.runs_root())
        for n in status.published_nights()
        for x in drift.from_json((runs.runs_root() / "nightly" / f"{n}-drift.json").read_text())[0]
        if published.get(x.chapter) == n
    )
    gone = drift.ChapterDrift(d.chapter, "20000101T000000Z-gone", d.new_run)
    assert status.gpus_of(gone, runs.runs_root()) == {}
