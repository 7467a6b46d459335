"""The status page's data: one row per chapter for its published run, the drift reports of
the nights that published them, and the history figure (one panel per chapter)."""

from labsupport import chapters, runs
from labsupport.ops import status


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
