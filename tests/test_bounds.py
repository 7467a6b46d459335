"""Nothing runs unbounded: a chapter notebook has `timeout_s` seconds from its first cell, and a
notebook past it fails its live run and its night in one line naming the chapter and the limit."""

import time

import nbformat
import pytest

from labsupport import chapters
from labsupport.ops import live, nightly

from .conftest import ToyParams

pytestmark = pytest.mark.live


def sleepy_chapter(tmp_path, *sleeps, timeout_s=2):
    """A chapter whose notebook sleeps `sleeps` seconds, one cell each, then writes `done`."""
    cells = [
        nbformat.v4.new_code_cell("mode = 'replay'\nrun_id = None\noverrides = {}", metadata={"tags": ["parameters"]})
    ]
    cells += [nbformat.v4.new_code_cell(f"import time\ntime.sleep({s})") for s in sleeps]
    cells.append(nbformat.v4.new_code_cell(f"open({str(tmp_path / 'done')!r}, 'w').close()"))
    path = tmp_path / "sleepy.ipynb"
    kernel = {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}}
    nbformat.write(nbformat.v4.new_notebook(cells=cells, metadata=kernel), path)
    return chapters.Chapter("sleepy", (), ToyParams, timeout_s=timeout_s, notebook=str(path))


def test_a_notebook_past_its_limit_fails_in_one_line_naming_the_chapter_and_the_limit(tmp_path):
    """Two cells of 1.5 s each under a limit of 2 s: the second is stopped (the limit is the
    notebook's, not each cell's), the last never runs, and live and the nightly each say one line."""
    ch = sleepy_chapter(tmp_path, 1.5, 1.5)
    t = time.monotonic()
    with pytest.raises(live.LiveRunError) as e:
        live.run_chapter(ch, "20260101T000000Z-cpu", {}, tmp_path / "log", tmp_path / "runs")
    msg = str(e.value)
    assert msg.startswith("sleepy: notebook stopped: it ran past its limit of 2 s") and "\n" not in msg, msg
    assert not (tmp_path / "done").exists() and time.monotonic() - t < 120
    with pytest.raises(nightly.NightlyFailure) as e:
        nightly.run_chapters([ch], "20260101T000001Z-cpu", {"sleepy": {}}, tmp_path / "night")
    assert str(e.value).startswith("sleepy: notebook stopped: it ran past its limit of 2 s"), str(e.value)


def test_a_notebook_within_its_limit_runs_to_its_end(tmp_path):
    ch = sleepy_chapter(tmp_path, 0.5, 0.5, timeout_s=30)
    with pytest.raises(live.LiveRunError, match="sleepy: run '20260101T000000Z-cpu' of chapter 'sleepy' not found"):
        live.run_chapter(ch, "20260101T000000Z-cpu", {}, tmp_path / "log", tmp_path / "runs")
    assert (tmp_path / "done").exists()


@pytest.mark.unit
def test_every_chapter_declares_a_finite_limit():
    for ch in chapters.CHAPTERS:
        assert isinstance(ch.timeout_s, int) and 60 <= ch.timeout_s <= 6 * 3600, ch.slug
