"""Recording runs atomically, publishing them, and clear errors for bad runs."""

import json
import os

import pandas as pd
import pytest

from labsupport import runs
from labsupport.runs import provenance

from .conftest import tree_bytes

PROV = {**{k: "x" for k in provenance.REQUIRED_FIELDS}, "git_commit": provenance.git_commit()}  # publishable


def write_run(root, run_id="20260101T000000Z-test", chapter="ch"):
    with runs.RunWriter(chapter, {"a": 1}, run_id, root=root, meta={"provenance": PROV}) as w:
        w.write_table("t", pd.DataFrame({"x": [1, 2]}))
        w.extra["answer"] = 42
    return run_id


def test_a_written_run_loads_back(tmp_path):
    rid = write_run(tmp_path)
    run = runs.load_run("ch", rid, root=tmp_path)
    assert run.table("t")["x"].tolist() == [1, 2]
    assert run.parameters == {"a": 1} and run.results == {"answer": 42}
    assert set(run.meta["files"]) == {"t.csv"}
    assert runs.list_runs("ch", root=tmp_path) == [rid]


def test_a_failed_run_leaves_nothing_and_the_published_one_untouched(tmp_path):
    rid = write_run(tmp_path)
    runs.publish("ch", rid, root=tmp_path)
    before = tree_bytes(tmp_path)
    with (
        pytest.raises(KeyboardInterrupt),
        runs.RunWriter("ch", {}, "20260102T000000Z-x", root=tmp_path, meta={"provenance": PROV}) as w,
    ):
        w.write_table("t", pd.DataFrame({"x": [3]}))
        raise KeyboardInterrupt
    assert tree_bytes(tmp_path) == before
    assert runs.published_run_id("ch", root=tmp_path) == rid


def test_missing_run_and_missing_pointer(tmp_path):
    with pytest.raises(runs.RunError, match="no published run for chapter 'ch'"):
        runs.load_run("ch", root=tmp_path)
    write_run(tmp_path)
    with pytest.raises(runs.RunError, match="not found"):
        runs.load_run("ch", "20990101T000000Z", root=tmp_path)


def test_corrupt_runs_are_refused(tmp_path):
    rid = write_run(tmp_path)
    d = tmp_path / "ch" / rid
    (d / "t.csv").write_text("x\n1\n999\n")
    with pytest.raises(runs.RunError, match="t.csv does not match its checksum"):
        runs.load_run("ch", rid, root=tmp_path)
    (d / "t.csv").unlink()
    with pytest.raises(runs.RunError, match="t.csv is missing"):
        runs.load_run("ch", rid, root=tmp_path)
    (d / "meta.json").write_text("{not json")
    with pytest.raises(runs.RunError, match="meta.json"):
        runs.load_run("ch", rid, root=tmp_path)
    (d / "meta.json").unlink()
    with pytest.raises(runs.RunError, match="incomplete: no meta.json"):
        runs.load_run("ch", rid, root=tmp_path)


def test_publishing_a_bad_run_keeps_the_pointer(tmp_path):
    good = write_run(tmp_path)
    runs.publish("ch", good, root=tmp_path)
    bad = write_run(tmp_path, "20260103T000000Z-bad")
    (tmp_path / "ch" / bad / "t.csv").write_text("changed\n")
    with pytest.raises(runs.RunError):
        runs.publish("ch", bad, root=tmp_path)
    assert runs.published_run_id("ch", root=tmp_path) == good


def test_existing_run_is_never_overwritten(tmp_path):
    rid = write_run(tmp_path)
    with pytest.raises(runs.RunError, match="already exists"):
        write_run(tmp_path, rid)


def test_run_ids_are_checked():
    assert runs.RUN_ID_PATTERN.match(runs.new_run_id(" H200 SXM "))
    assert runs.new_run_id("H200").endswith("-h200")
    with pytest.raises(runs.RunError, match="bad run id"):
        runs.RunWriter("ch", {}, "../escape")


def test_published_run_has_complete_provenance(published):
    prov = published.provenance
    for field in provenance.REQUIRED_FIELDS:
        assert prov.get(field) not in (None, "", "unknown"), field
    assert prov["device"] == "cuda" and "H200" in prov["gpu"]
    assert len(prov["git_commit"]) >= 40
    assert prov["utc_time"].endswith("Z")
    meta = json.loads((published.path / "meta.json").read_text())
    assert meta["parameters"]["preset"] == "qwen3-8b"


def test_published_run_is_small(published):
    size = sum(p.stat().st_size for p in published.path.iterdir())
    assert size < 5 * 2**20


def test_profiler_teardown_setting_is_set_kept_and_recorded(monkeypatch):
    """labsupport sets Kineto's TEARDOWN_CUPTI (to "0": with the lent box's torch, tearing CUPTI
    down makes later profiles in the process empty; see labsupport/__init__.py), leaves a
    user's own setting alone, and records the value."""
    import subprocess
    import sys

    code = "import os, labsupport; print(os.environ['TEARDOWN_CUPTI'])"
    env = {k: v for k, v in os.environ.items() if k != "TEARDOWN_CUPTI"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "0"
    out = subprocess.run(
        [sys.executable, "-c", code], env={**env, "TEARDOWN_CUPTI": "1"}, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "1"
    monkeypatch.setenv("TEARDOWN_CUPTI", "1")
    assert provenance.collect()["teardown_cupti"] == "1"


def test_a_run_holds_plain_files_only(tmp_path):
    with runs.RunWriter("ch", {}, "20260101T000000Z-a", root=tmp_path, meta={"provenance": PROV}) as w:
        w.write_table("t", pd.DataFrame({"x": [1]}))
        (w.path / ".scratch.json.gz").write_text("half a trace")  # left behind by a recorder
    assert set(runs.load_run("ch", "20260101T000000Z-a", root=tmp_path).meta["files"]) == {"t.csv"}
    assert not (tmp_path / "ch" / "20260101T000000Z-a" / ".scratch.json.gz").exists()
    with (
        pytest.raises(runs.RunError, match="'sub' is not a plain file name"),
        runs.RunWriter("ch", {}, "20260101T000000Z-b", root=tmp_path, meta={"provenance": PROV}) as w,
    ):
        (w.path / "sub").mkdir()
    assert runs.list_runs("ch", root=tmp_path) == ["20260101T000000Z-a"]
    with pytest.raises(runs.RunError, match="not a chapter name"):
        runs.RunWriter("../ch", {}, "20260101T000000Z-c", root=tmp_path)


def test_history_rows_are_appended_to_the_bytes_as_they_were(tmp_path):
    from labsupport.ops import history

    (tmp_path / "history.csv").write_text(",".join(history.COLUMNS) + "\nlive 1,ch,r,t,g,m,0.1000000000000000055511\n")
    old = (tmp_path / "history.csv").read_bytes()
    row = dict(zip(history.COLUMNS, ["live 2", "ch", "r2", "t", "g", "m", 2.5], strict=False))
    new = history.with_rows([row], tmp_path)
    assert new.startswith(old) and new[len(old) :] == b"live 2,ch,r2,t,g,m,2.5\n"
    assert (tmp_path / "history.csv").read_bytes() == old, "with_rows only computes the bytes"
