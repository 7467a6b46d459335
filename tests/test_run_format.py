"""Runs carry a format (meta.json's `format`, labsupport.runs.formats): a run of another format is
refused in one line naming the fix, and `python -m labsupport derive` is the migration that brings
an older run to the current format, in place, changing no measured value, idempotent, and leaving a
damaged run as it was."""

import json
import shutil

import pandas as pd
import pytest

from labsupport import __main__ as cli
from labsupport import runs
from labsupport.ops import derive, gallery, pack
from labsupport.runs import formats, lock, provenance
from labsupport.runs.load import OlderFormat
from labsupport.traces import derived, replay

from .conftest import FIXTURES, REPO, TOY, tree_bytes

pytestmark = pytest.mark.unit

CHAPTER = "what-a-kernel"  # a small run with a trace and its replay tables
SOURCE = sorted((FIXTURES / CHAPTER).iterdir())[-1]
GALLERY_RUN = REPO / "runs" / "gallery" / "nvidia-h200" / "launch-overhead" / "20261202T020336Z-h200"
TABLES = {n for n in json.loads((SOURCE / "meta.json").read_text())["derived"]}
ADDED_KEYS = {"format", "migrated", "files", "derived"}  # all that derive may change in meta.json


def _write_meta(folder, meta):
    (folder / "meta.json").write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")


def as_format_1(folder):
    """Make the run in `folder` what it was before formats: no `format`, no replay tables."""
    meta = json.loads((folder / "meta.json").read_text())
    for name in meta.pop("derived", {}):
        (folder / name).unlink()
        del meta["files"][name]
    meta.pop("format")
    meta.pop("migrated", None)
    _write_meta(folder, meta)
    return meta


@pytest.fixture
def root(tmp_path):
    shutil.copytree(SOURCE, tmp_path / CHAPTER / SOURCE.name)
    return tmp_path


@pytest.fixture
def old_run(root):
    """A copy of the fixture run, as a run of format 1 recorded before the replay tables."""
    as_format_1(root / CHAPTER / SOURCE.name)
    return root / CHAPTER / SOURCE.name


def _one_line(e) -> str:
    text = str(e.value)
    assert "\n" not in text
    return text


def test_a_new_run_records_the_current_format(tmp_path):
    prov = {k: "x" for k in provenance.REQUIRED_FIELDS}
    with runs.RunWriter(TOY, {}, "20260101T000000Z-test", root=tmp_path, meta={"provenance": prov}) as w:
        w.write_table("t", pd.DataFrame({"x": [1]}))
    assert json.loads((w.final / "meta.json").read_text())["format"] == formats.CURRENT
    assert runs.open_run("ch", "20260101T000000Z-test", tmp_path).meta["format"] == formats.CURRENT


def test_a_run_without_a_format_is_refused_naming_derive(root):
    meta = json.loads((root / CHAPTER / SOURCE.name / "meta.json").read_text())
    del meta["format"]
    _write_meta(root / CHAPTER / SOURCE.name, meta)
    with pytest.raises(OlderFormat) as e:
        runs.open_run(CHAPTER, SOURCE.name, root)
    assert _one_line(e).endswith(
        f"older than this code's {formats.CURRENT}: bring it up to date with `python -m labsupport derive {CHAPTER}`"
    )
    assert "format 1" in str(e.value)


def test_a_run_of_an_older_format_is_refused(root):
    meta = json.loads((root / CHAPTER / SOURCE.name / "meta.json").read_text())
    _write_meta(root / CHAPTER / SOURCE.name, {**meta, "format": formats.CURRENT - 1})
    with pytest.raises(OlderFormat, match=f"python -m labsupport derive {CHAPTER}"):
        runs.open_run(CHAPTER, SOURCE.name, root)


def test_a_run_of_a_newer_format_is_refused(root):
    meta = json.loads((root / CHAPTER / SOURCE.name / "meta.json").read_text())
    _write_meta(root / CHAPTER / SOURCE.name, {**meta, "format": formats.CURRENT + 1})
    with pytest.raises(runs.RunError) as e:
        runs.open_run(CHAPTER, SOURCE.name, root)
    assert not isinstance(e.value, OlderFormat)
    assert f"newer than this code's {formats.CURRENT}" in _one_line(e)


@pytest.mark.parametrize("bad", ["2", True, 2.0, None, [2], 0])
def test_a_format_that_is_not_a_format_number_is_refused(root, bad):
    meta = json.loads((root / CHAPTER / SOURCE.name / "meta.json").read_text())
    _write_meta(root / CHAPTER / SOURCE.name, {**meta, "format": bad})
    with pytest.raises(runs.RunError, match="is not a format number") as e:
        runs.open_run(CHAPTER, SOURCE.name, root)
    _one_line(e)


def test_every_committed_run_is_of_the_current_format():
    """The book's runs (published or not), the gallery's and the fixtures': all migrated, and each
    loads checked (the gallery's GPU folders and the fixture folders are runs folders too)."""
    folders = [REPO / "runs", *(REPO / "runs" / "gallery").iterdir(), FIXTURES, FIXTURES.parent / "small-runs"]
    loaded = [
        runs.open_run(ch.name, run_id, folder)
        for folder in folders
        for ch in sorted(folder.iterdir())
        if ch.is_dir() and ch.name not in ("gallery", "nightly")
        for run_id in runs.list_runs(ch.name, folder)
    ]
    assert len(loaded) == len(list((REPO / "runs").rglob("meta.json")) + list(FIXTURES.parent.rglob("meta.json")))
    assert {r.meta["format"] for r in loaded} == {formats.CURRENT}


def test_derive_brings_an_older_run_to_the_current_format(old_run, capsys):
    before = tree_bytes(old_run)
    old_meta = json.loads((old_run / "meta.json").read_text())
    assert derive.main([CHAPTER], old_run.parent.parent) == 0
    assert capsys.readouterr().out == (
        f"{CHAPTER}/{SOURCE.name}: format 1 -> {formats.CURRENT}: 3 replay tables written "
        f"({sum((old_run / n).stat().st_size for n in TABLES) / 1e6:.2f} MB)\n"
    )
    run = runs.open_run(CHAPTER, SOURCE.name, old_run.parent.parent)
    after = tree_bytes(old_run)
    # every file it had, measured tables and traces, byte for byte; only meta.json and the new tables differ
    assert {n: b for n, b in after.items() if n in before and n != "meta.json"} == {
        n: b for n, b in before.items() if n != "meta.json"
    }
    assert set(after) - set(before) == TABLES
    # meta.json: parameters, provenance, results and every digest as they were; the new files listed
    assert {k: v for k, v in run.meta.items() if k not in ADDED_KEYS} == {
        k: v for k, v in old_meta.items() if k not in ADDED_KEYS
    }
    assert {n: run.meta["files"][n] for n in old_meta["files"]} == old_meta["files"]
    assert set(run.meta["files"]) - set(old_meta["files"]) == set(run.meta["derived"]) == TABLES
    [step] = run.meta["migrated"]
    assert (step["from"], step["to"]) == (1, formats.CURRENT) and step["utc_time"].endswith("Z")
    # the tables are what the trace gives, as the committed ones are
    assert derived.check(old_run / "burst_trace.json.gz") is None
    assert {n: (old_run / n).read_bytes() for n in TABLES} == {n: (SOURCE / n).read_bytes() for n in TABLES}


def test_derive_is_idempotent(old_run, capsys, monkeypatch):
    monkeypatch.setenv("LABSUPPORT_RUNS", str(old_run.parent.parent))
    assert cli.main(["derive"]) == 0
    once = tree_bytes(old_run.parent.parent)
    capsys.readouterr()
    assert cli.main(["derive", CHAPTER]) == 0
    assert capsys.readouterr().out.endswith(f"{CHAPTER}/{SOURCE.name}: format {formats.CURRENT}, up to date\n")
    assert tree_bytes(old_run.parent.parent) == once


def test_derive_leaves_a_damaged_run_as_it_was(old_run, capsys):
    table = old_run / "add_times.csv"
    table.write_bytes(table.read_bytes().replace(b"1", b"2", 1))  # a measured number changed by hand
    before = tree_bytes(old_run.parent.parent)
    assert derive.main([CHAPTER], old_run.parent.parent) == 1
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {CHAPTER}/{SOURCE.name}: refused, left as it was: ")
    assert "add_times.csv does not match its checksum" in err[0]
    assert tree_bytes(old_run.parent.parent) == before


def test_derive_refuses_a_run_of_a_newer_format(root, capsys):
    folder = root / CHAPTER / SOURCE.name
    _write_meta(folder, {**json.loads((folder / "meta.json").read_text()), "format": formats.CURRENT + 1})
    before = tree_bytes(root)
    assert derive.main([], root) == 1
    assert "newer than this code's" in capsys.readouterr().err
    assert tree_bytes(root) == before


def test_an_interrupted_derive_leaves_the_old_run_and_a_second_finishes_it(old_run, monkeypatch, capsys):
    """Until meta.json is replaced (one rename) the run is the old one; derive again completes it."""
    meta_before = (old_run / "meta.json").read_bytes()

    def full_disk(path, data):
        raise OSError(28, "No space left on device", str(path))

    monkeypatch.setattr(derive, "write_atomic", full_disk)
    assert derive.main([], old_run.parent.parent) == 1
    assert "No space left on device" in capsys.readouterr().err
    assert (old_run / "meta.json").read_bytes() == meta_before
    with pytest.raises(OlderFormat):
        runs.open_run(CHAPTER, SOURCE.name, old_run.parent.parent)
    monkeypatch.undo()
    assert derive.main([], old_run.parent.parent) == 0
    assert runs.open_run(CHAPTER, SOURCE.name, old_run.parent.parent).meta["format"] == formats.CURRENT


def test_derive_migrates_a_gallery_run_and_keeps_its_pack_json_true(tmp_path, capsys):
    """A gallery run (runs/gallery/<gpu>/ is a runs folder) is migrated too, and its pack.json
    lists the new files and meta.json as they are now, as `gallery add` checks them."""
    folder = tmp_path / "gallery" / "nvidia-h200" / "launch-overhead" / GALLERY_RUN.name
    shutil.copytree(GALLERY_RUN, folder)
    meta = as_format_1(folder)
    manifest = json.loads((folder / pack.PACK_JSON).read_text())
    manifest["files"] = {n: e for n, e in manifest["files"].items() if n in meta["files"] or n == "meta.json"}
    manifest["files"]["meta.json"] = {
        "bytes": (folder / "meta.json").stat().st_size,
        "sha256": replay.sha256_hex((folder / "meta.json").read_bytes()),
    }
    (folder / pack.PACK_JSON).write_text(json.dumps(manifest))
    gallery._check_listed(folder, "before")  # a whole gallery run of format 1
    with pytest.raises(OlderFormat):
        gallery.entries(tmp_path)
    assert derive.main(["launch-overhead"], tmp_path) == 0
    assert capsys.readouterr().out.startswith(f"gallery/nvidia-h200/launch-overhead/{GALLERY_RUN.name}: format 1 -> ")
    gallery._check_listed(folder, "after")
    [entry] = gallery.entries(tmp_path)
    assert entry.run.meta["format"] == formats.CURRENT
    assert set(entry.run.meta["derived"]) == set(json.loads((GALLERY_RUN / "meta.json").read_text())["derived"])


@pytest.mark.parametrize("wrong", ["extra files", "a digest"])
def test_derive_refuses_a_gallery_run_whose_pack_json_is_not_its_own(tmp_path, capsys, wrong):
    folder = tmp_path / "gallery" / "nvidia-h200" / "launch-overhead" / GALLERY_RUN.name
    shutil.copytree(GALLERY_RUN, folder)
    meta = as_format_1(folder)  # pack.json still lists the replay tables of before
    if wrong == "a digest":
        manifest = json.loads((folder / pack.PACK_JSON).read_text())
        manifest["files"] = {n: e for n, e in manifest["files"].items() if n in meta["files"] or n == "meta.json"}
        manifest["files"]["step_times.csv"]["sha256"] = "0" * 64
        (folder / pack.PACK_JSON).write_text(json.dumps(manifest))
    before = tree_bytes(tmp_path)
    assert derive.main([], tmp_path) == 1
    assert "pack.json does not list the run's files as its meta.json does" in capsys.readouterr().err
    assert tree_bytes(tmp_path) == before


def test_a_derive_stopped_before_pack_json_is_finished_by_the_next(tmp_path, monkeypatch, capsys):
    folder = tmp_path / "gallery" / "nvidia-h200" / "launch-overhead" / GALLERY_RUN.name
    shutil.copytree(GALLERY_RUN, folder)
    meta = as_format_1(folder)
    manifest = json.loads((folder / pack.PACK_JSON).read_text())
    manifest["files"] = {n: e for n, e in manifest["files"].items() if n in meta["files"] or n == "meta.json"}
    (folder / pack.PACK_JSON).write_text(json.dumps(manifest))
    real = derive.write_atomic

    def stop_at_pack_json(path, data):
        if path.name == pack.PACK_JSON:
            raise OSError(5, "Input/output error", str(path))
        real(path, data)

    monkeypatch.setattr(derive, "write_atomic", stop_at_pack_json)
    assert derive.main([], tmp_path) == 1
    with pytest.raises(gallery.GalleryError, match="is not listed in pack.json"):
        gallery._check_listed(folder, "stopped")
    monkeypatch.undo()
    capsys.readouterr()
    assert derive.main([], tmp_path) == 0
    assert capsys.readouterr().out.endswith("up to date; its pack.json now lists it as it is\n")
    gallery._check_listed(folder, "finished")
    once = tree_bytes(tmp_path)
    assert derive.main([], tmp_path) == 0 and tree_bytes(tmp_path) == once


def test_derive_refuses_while_another_command_holds_the_runs_folder(old_run, capsys):
    root = old_run.parent.parent
    with lock.held(root, "nightly"):
        before = tree_bytes(root)
        with pytest.raises(lock.Busy, match="another nightly"):
            derive.main([], root)
        assert tree_bytes(root) == before
    assert derive.main([], root) == 0 and not (root / lock.NAME).exists()
