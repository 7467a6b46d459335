"""Recording runs atomically, publishing them, and clear errors for bad runs."""

import dataclasses
import hashlib
import json
import os
import shutil

import pandas as pd
import pytest

from labsupport import chapters, runs
from labsupport.chapters import table_keys
from labsupport.runs import provenance

from .conftest import FIXTURES, REPO, TOY, tree_bytes

pytestmark = pytest.mark.unit

PROV = {**{k: "x" for k in provenance.REQUIRED_FIELDS}, "git_commit": provenance.git_commit()}  # publishable


def write_run(root, run_id="20260101T000000Z-test", chapter=TOY):
    with runs.RunWriter(chapter, {"a": 1}, run_id, root=root, meta={"provenance": PROV}) as w:
        w.write_table("t", pd.DataFrame({"x": [1, 2]}))
        w.extra["answer"] = 42
    return run_id


def test_a_written_run_loads_back(tmp_path):
    rid = write_run(tmp_path)
    run = runs.load_run(TOY, rid, root=tmp_path)
    assert run.table("t")["x"].tolist() == [1, 2]
    assert run.parameters == {"a": 1} and run.results == {"answer": 42}
    assert set(run.meta["files"]) == {"t.csv"}
    assert runs.list_runs("ch", root=tmp_path) == [rid]


def test_a_table_is_read_only_against_its_chapters_declaration(tmp_path):
    """Nothing is declared to the runs layer at import: its tables are checked against the
    declaration the loader is handed (a column it names is required); a run opened without one
    (runs.open_run, for publishing and copying) refuses to read a table rather than read it unchecked."""
    rid = write_run(tmp_path)
    wants_y = dataclasses.replace(TOY, files=(chapters.File("t.csv", "a toy table", ("x", "y")),))
    with pytest.raises(runs.RunError, match="t.csv lacks column y"):
        runs.load_run(wants_y, rid, root=tmp_path).table("t")
    opened = runs.open_run("ch", rid, root=tmp_path)
    assert opened.results == {"answer": 42}
    with pytest.raises(runs.RunError, match="opened without its chapter's declaration"):
        opened.table("t")
    runs.publish("ch", rid, root=tmp_path)
    with pytest.raises(runs.RunError, match="publishes chapter 'ch', which no chapter declares"):
        runs.check_published(chapters.CHAPTERS, tmp_path)
    assert set(runs.check_published([TOY], tmp_path)) == {"ch"}


def test_a_failed_run_leaves_nothing_and_the_published_one_untouched(tmp_path):
    rid = write_run(tmp_path)
    runs.publish("ch", rid, root=tmp_path)
    before = tree_bytes(tmp_path)
    with (
        pytest.raises(KeyboardInterrupt),
        runs.RunWriter(TOY, {}, "20260102T000000Z-x", root=tmp_path, meta={"provenance": PROV}) as w,
    ):
        w.write_table("t", pd.DataFrame({"x": [3]}))
        raise KeyboardInterrupt
    assert tree_bytes(tmp_path) == before
    assert runs.published_run_id("ch", root=tmp_path) == rid


def test_missing_run_and_missing_pointer(tmp_path):
    with pytest.raises(runs.RunError, match="no published run for chapter 'ch'"):
        runs.load_run(TOY, root=tmp_path)
    write_run(tmp_path)
    with pytest.raises(runs.RunError, match="not found"):
        runs.load_run(TOY, "20990101T000000Z", root=tmp_path)


def test_corrupt_runs_are_refused(tmp_path):
    rid = write_run(tmp_path)
    d = tmp_path / "ch" / rid
    (d / "t.csv").write_text("x\n1\n999\n")
    with pytest.raises(runs.RunError, match="t.csv does not match its checksum"):
        runs.load_run(TOY, rid, root=tmp_path)
    (d / "t.csv").unlink()
    with pytest.raises(runs.RunError, match="t.csv is missing"):
        runs.load_run(TOY, rid, root=tmp_path)
    (d / "meta.json").write_text("{not json")
    with pytest.raises(runs.RunError, match="meta.json"):
        runs.load_run(TOY, rid, root=tmp_path)
    (d / "meta.json").unlink()
    with pytest.raises(runs.RunError, match="incomplete: no meta.json"):
        runs.load_run(TOY, rid, root=tmp_path)


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
        runs.RunWriter(TOY, {}, "../escape")


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
    with runs.RunWriter(TOY, {}, "20260101T000000Z-a", root=tmp_path, meta={"provenance": PROV}) as w:
        w.write_table("t", pd.DataFrame({"x": [1]}))
        (w.path / ".scratch.json.gz").write_text("half a trace")  # left behind by a recorder
    assert set(runs.load_run(TOY, "20260101T000000Z-a", root=tmp_path).meta["files"]) == {"t.csv"}
    assert not (tmp_path / "ch" / "20260101T000000Z-a" / ".scratch.json.gz").exists()
    with (
        pytest.raises(runs.RunError, match="'sub' is not a plain file name"),
        runs.RunWriter(TOY, {}, "20260101T000000Z-b", root=tmp_path, meta={"provenance": PROV}) as w,
    ):
        (w.path / "sub").mkdir()
    assert runs.list_runs("ch", root=tmp_path) == ["20260101T000000Z-a"]
    with pytest.raises(runs.RunError, match="not a chapter name"):
        runs.RunWriter(dataclasses.replace(TOY, slug="../ch"), {}, "20260101T000000Z-c", root=tmp_path)


def test_history_rows_are_appended_to_the_bytes_as_they_were(tmp_path):
    from labsupport.ops import history

    (tmp_path / "history.csv").write_text(",".join(history.COLUMNS) + "\nlive 1,ch,r,t,g,m,0.1000000000000000055511\n")
    old = (tmp_path / "history.csv").read_bytes()
    row = dict(zip(history.COLUMNS, ["live 2", "ch", "r2", "t", "g", "m", 2.5], strict=False))
    new = history.with_rows([row], tmp_path)
    assert new.startswith(old) and new[len(old) :] == b"live 2,ch,r2,t,g,m,2.5\n"
    assert (tmp_path / "history.csv").read_bytes() == old, "with_rows only computes the bytes"


def committed_runs():
    """Every run committed under runs/ (the gallery's too) and tests/fixtures/: (root, chapter, run id)."""
    found = []
    for top in (REPO / "runs", REPO / "tests" / "fixtures"):
        for meta in sorted(top.rglob("meta.json")):
            run_dir = meta.parent
            found.append((run_dir.parent.parent, run_dir.parent.name, run_dir.name))
    return found


@pytest.mark.parametrize("root,chapter,run_id", committed_runs(), ids=lambda v: getattr(v, "name", v))
def test_every_committed_table_keeps_its_declared_key(root, chapter, run_id):
    """The keys (chapters.table_keys) are right for every run recorded so far: a committed table
    that repeats a key means the declared key is wrong, never the data."""
    run = runs.load_run(chapters.by_slug(chapter), run_id, root)
    for name in run.meta["files"]:
        if name.endswith(".csv"):
            run.table(name[:-4])


def test_every_table_has_a_key_unless_it_lists_events():
    events = []
    for ch in chapters.CHAPTERS:
        for f in ch.files:
            if f.name.endswith(".csv") and ch.key_of(f.name) is None:
                assert set(chapters.KERNELS) <= set(f.columns), f"{ch.slug} {f.name} has no key"
                events.append(f"{ch.slug}:{f.name}")
        declared = set(table_keys.KEYS.get(ch.slug, {}))
        holds = {f.name for f in ch.files}
        assert declared <= holds, f"{ch.slug}: keys of files it never holds: {declared - holds}"
    assert "launch-overhead:variants.csv" not in events and "kernels-in-one-token:kernels.csv" in events


def fixture_copy(tmp_path, chapter):
    """A runs folder holding the committed fixture run of `chapter`, published."""
    src = next((FIXTURES / chapter).iterdir())
    shutil.copytree(src, tmp_path / chapter / src.name)
    (tmp_path / "published.json").write_text(json.dumps({chapter: src.name}))
    return tmp_path / chapter / src.name


def reseal(run_dir, name):
    meta = json.loads((run_dir / "meta.json").read_text())
    meta["files"][name] = hashlib.sha256((run_dir / name).read_bytes()).hexdigest()
    (run_dir / "meta.json").write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")


def test_a_repeated_key_is_refused_in_one_line_wherever_tables_are_checked(tmp_path):
    """Duplicated rows of launch-overhead's variants.csv, resealed: refused by the run's loader
    (Run.table), so by the validation (nightly, gallery add) and the book's check_runs, in one
    line naming the file and the key; never a traceback from a chapter's analysis."""
    from labsupport.ops import bookbuild, validate

    run_dir = fixture_copy(tmp_path, "launch-overhead")
    path = run_dir / "variants.csv"
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines + lines[1:2]))
    reseal(run_dir, "variants.csv")
    run = runs.load_run(chapters.by_slug("launch-overhead"), root=tmp_path)
    with pytest.raises(runs.RunError) as e:
        run.table("variants")
    variant = pd.read_csv(path).variant.iloc[0]
    expected = f"{path}: rows 1 and {len(lines)} repeat the key variant={variant!r}; each row needs its own"
    assert str(e.value) == expected
    assert expected in validate.check_run(chapters.by_slug("launch-overhead"), run)
    with pytest.raises(bookbuild.BuildError, match="repeat the key variant="):
        bookbuild.check_runs(tmp_path)


def test_a_table_of_one_row_and_a_key_over_several_columns(tmp_path):
    run_dir = fixture_copy(tmp_path, "launch-overhead")
    path = run_dir / "step_times.csv"
    df = pd.read_csv(path)
    df.loc[len(df) - 1, ["variant", "repeat"]] = df.loc[0, ["variant", "repeat"]].to_numpy()
    df.to_csv(path, index=False)
    reseal(run_dir, "step_times.csv")
    with pytest.raises(
        runs.RunError, match=rf"step_times.csv: rows 1 and {len(df)} repeat the key variant=.*, repeat="
    ):
        runs.load_run(chapters.by_slug("launch-overhead"), root=tmp_path).table("step_times")
    with (
        pytest.raises(runs.RunError, match="ceilings.csv: 2 rows, where the table holds one"),
        runs.RunWriter(
            chapters.by_slug("why-a-gpu"), {}, "20260101T000000Z-a", root=tmp_path, meta={"provenance": PROV}
        ) as w,
    ):
        w.write_table("ceilings", pd.concat([pd.read_csv(run_dir / "ceilings.csv")] * 2))


def test_a_run_is_cited_in_prose_by_its_gpu_id_and_day():
    from .conftest import fixture_run

    run = fixture_run("what-a-kernel")
    gpu, day = run.provenance["gpu"], run.provenance["utc_time"][:10]
    assert run.cited == f"{gpu}, run `{run.run_id}`, {day}"
