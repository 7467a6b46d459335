"""Replay reads the tables stored beside each trace (labsupport.traces.replay) instead of parsing
the trace: they equal what the exact parser gives on the committed traces, a tampered, stale or
unlisted table is refused in one line, and so is a trace of a run without them; validation re-derives
them, `derive` writes them for runs recorded before them, and replay with them does not call the
parser."""

import gzip
import hashlib
import json
import shutil

import pandas as pd
import pytest

from labsupport import __main__ as cli
from labsupport import chapters, runs
from labsupport.ops import validate
from labsupport.runs.provenance import REPO_ROOT
from labsupport.traces import derived, replay, trace

pytestmark = pytest.mark.unit

RUNS = REPO_ROOT / "runs"
FIXTURES = REPO_ROOT / "tests" / "fixtures" / "runs"
PUBLISHED = json.loads((RUNS / "published.json").read_text())


def _traces(root, chapter, run_id):
    return sorted((root / chapter / run_id).glob("*.json.gz"), key=lambda p: p.stat().st_size)


# The smallest trace of every published run (the parser takes seconds on the largest ones), and the
# decode step the census is read from.
CASES = [ts[0] for ch, rid in sorted(PUBLISHED.items()) if (ts := _traces(RUNS, ch, rid))]
CASES.append(RUNS / "kernels-in-one-token" / PUBLISHED["kernels-in-one-token"] / "trace.json.gz")


def _parsed_kernels(path, origin):
    events = trace.parse_events(path)
    k = trace.kernel_table(events, origin=origin)
    spans = [e for e in trace.complete_events(events, {"user_annotation"}) if e["name"] == origin]
    return trace.inside_region(k, trace.ns(spans[0]["dur"])) if spans else k


@pytest.mark.parametrize("path", CASES, ids=lambda p: f"{p.parent.parent.name}/{p.name}")
def test_the_stored_tables_equal_the_parsed_trace(path):
    tables = replay.stored(path)
    assert tables is not None, f"{path} has no stored tables: run python -m labsupport derive"
    origins = ["decode_step", *sorted(set(replay.regions(tables)["name"]) - {"decode_step"})[:2]]
    for origin in origins:
        pd.testing.assert_frame_equal(trace.read_kernels(path, origin=origin), _parsed_kernels(path, origin))
    parsed = [e for e in trace.parse_events(path) if e.get("ph") == "X" and "dur" in e]
    stored = trace.load_events(path)
    assert len(stored) == len(parsed)
    keys = ("cat", "name", "pid", "tid", "ts", "dur")
    assert [tuple(e[k] for k in keys) for e in stored] == [tuple(e[k] for k in keys) for e in parsed]
    assert [e.get("args", {}).get("correlation") for e in stored] == [
        e.get("args", {}).get("correlation") for e in parsed
    ]
    assert derived.check(path) is None


def test_every_committed_trace_has_its_tables_listed():
    """Every run committed (published or not, the gallery's, the fixtures) is of the current
    format, whose traces all have their tables (`python -m labsupport derive` wrote the missing ones)."""
    metas = sorted(RUNS.rglob("meta.json")) + sorted((REPO_ROOT / "tests" / "fixtures").rglob("meta.json"))
    assert len(metas) > 30
    missing = []
    for meta_path in metas:
        meta = json.loads(meta_path.read_text())
        for name in meta["files"]:
            for table in replay.table_names(name).values():
                if table not in meta["files"] or table not in meta.get("derived", {}):
                    missing.append(f"{meta_path.parent.relative_to(REPO_ROOT)}/{table}")
    assert not missing, f"{len(missing)} tables missing, e.g. {missing[:3]}: run python -m labsupport derive"


@pytest.fixture
def small_run(tmp_path, monkeypatch):
    """A copy of the published What a kernel is run (a small trace, with its tables)."""
    chapter = "what-a-kernel"
    run_id = PUBLISHED[chapter]
    shutil.copytree(RUNS / chapter / run_id, tmp_path / chapter / run_id)
    (tmp_path / "published.json").write_text(json.dumps({chapter: run_id}))
    monkeypatch.setenv("LABSUPPORT_RUNS", str(tmp_path))
    return tmp_path / chapter / run_id


def _rewrite_kernels(folder, change):
    path = folder / "burst_trace.kernels.csv.gz"
    df = pd.read_csv(path, keep_default_na=False)
    change(df)
    path.write_bytes(gzip.compress(df.to_csv(index=False).encode()))
    return path


def test_a_tampered_table_is_refused_in_one_line(small_run):
    trace_path = small_run / "burst_trace.json.gz"
    _rewrite_kernels(small_run, lambda df: df.__setitem__("dur_ns", df["dur_ns"] * 2))
    with pytest.raises(trace.TraceError) as e:
        trace.read_kernels(trace_path, origin="burst")
    assert "does not match its checksum in meta.json" in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(trace.TraceError):
        trace.load_events(trace_path)


def test_a_tampered_table_with_a_matching_checksum_fails_validation(small_run):
    from labsupport import chapters

    path = _rewrite_kernels(small_run, lambda df: df.__setitem__("dur_ns", df["dur_ns"] + 1))
    meta = json.loads((small_run / "meta.json").read_text())
    meta["files"][path.name] = hashlib.sha256(path.read_bytes()).hexdigest()
    (small_run / "meta.json").write_text(json.dumps(meta))
    run = runs.load_run(chapters.by_slug("what-a-kernel"), small_run.name, small_run.parent.parent)
    problems = validate.check_run(chapters.by_slug("what-a-kernel"), run)
    assert [p for p in problems if "burst_trace.kernels.csv.gz differs from the table its trace" in p], problems
    assert all("\n" not in p for p in problems)


def test_an_unlisted_or_stale_table_is_refused(small_run):
    trace_path = small_run / "burst_trace.json.gz"
    meta = json.loads((small_run / "meta.json").read_text())
    stale = json.loads(json.dumps(meta))
    stale["derived"]["burst_trace.kernels.csv.gz"]["trace_sha256"] = "0" * 64
    (small_run / "meta.json").write_text(json.dumps(stale))
    with pytest.raises(trace.TraceError, match="was not derived from burst_trace.json.gz as it is now"):
        trace.read_kernels(trace_path, origin="burst")
    unlisted = json.loads(json.dumps(meta))
    del unlisted["files"]["burst_trace.events.csv.gz"]
    (small_run / "meta.json").write_text(json.dumps(unlisted))
    with pytest.raises(trace.TraceError, match="not listed in meta.json"):
        trace.load_events(trace_path)


def test_replay_with_stored_tables_does_not_parse_the_trace(small_run, monkeypatch):
    trace_path = small_run / "burst_trace.json.gz"
    expected = trace.read_kernels(trace_path, origin="burst")

    def no_parsing(path):
        raise AssertionError(f"parsed {path}")

    monkeypatch.setattr(trace, "parse_events", no_parsing)
    pd.testing.assert_frame_equal(trace.read_kernels(trace_path, origin="burst"), expected)
    assert trace.load_events(trace_path)
    scratch = small_run.parent / "scratch"  # a trace being measured, outside any run: parsed
    scratch.mkdir()
    shutil.copyfile(trace_path, scratch / trace_path.name)
    with pytest.raises(AssertionError, match="parsed"):
        trace.read_kernels(scratch / trace_path.name, origin="burst")


def test_a_trace_of_a_run_without_its_tables_is_refused_not_parsed(small_run, monkeypatch):
    """Every trace of a run of the current format has its tables: one without them is a damaged
    run, never a silent fall-back to parsing the trace."""
    monkeypatch.setattr(trace, "parse_events", lambda path: pytest.fail(f"parsed {path}"))
    for name in json.loads((small_run / "meta.json").read_text())["derived"]:
        (small_run / name).unlink()
    with pytest.raises(trace.TraceError, match="has no replay tables beside it") as e:
        trace.read_kernels(small_run / "burst_trace.json.gz", origin="burst")
    assert "\n" not in str(e.value)


def test_derive_writes_the_tables_of_a_run_recorded_before_them(small_run, capsys):
    meta_path = small_run / "meta.json"
    meta = json.loads(meta_path.read_text())
    committed = {n: (small_run / n).read_bytes() for n in meta["derived"]}
    for name in committed:
        (small_run / name).unlink()
        del meta["files"][name]
    for key in ("derived", "format", "migrated"):  # a run of format 1, recorded before the tables
        meta.pop(key, None)  # "migrated" only in a run brought up to the format after it was recorded
    meta_path.write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
    assert replay.stored(small_run / "burst_trace.json.gz") is None
    assert cli.main(["derive", "what-a-kernel"]) == 0
    assert "what-a-kernel/" in capsys.readouterr().out
    assert {n: (small_run / n).read_bytes() for n in committed} == committed
    run = runs.load_run(chapters.by_slug("what-a-kernel"), small_run.name, small_run.parent.parent)
    assert set(committed) <= set(run.meta["files"]) and set(run.meta["derived"]) == set(committed)
    assert derived.check(small_run / "burst_trace.json.gz") is None


def test_a_new_run_stores_the_tables_of_its_traces(tmp_path):
    src = RUNS / "what-a-kernel" / PUBLISHED["what-a-kernel"] / "burst_trace.json.gz"
    w = runs.RunWriter(chapters.by_slug("what-a-kernel"), {}, "20990101T000000Z-test", root=tmp_path)
    w.derive = lambda folder: derived.derive_folder(folder, "cuda")
    with w:
        shutil.copyfile(src, w.path / src.name)
    meta = json.loads((w.final / "meta.json").read_text())
    assert set(replay.table_names(src.name).values()) <= set(meta["files"])
    assert derived.check(w.final / src.name) is None
    pd.testing.assert_frame_equal(trace.read_kernels(w.final / src.name, origin="burst"), _parsed_kernels(src, "burst"))
