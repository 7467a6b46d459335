"""What is read from runs/ is checked at the boundary, and every problem is one line naming
the file: names and paths, symlinks, tables, traces, provenance, the manifest, the history."""

import gzip
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from labsupport import chapters, runs
from labsupport.ops import bookbuild, history, validate
from labsupport.runs import paths

from .conftest import REPO, RUNS, tree_bytes

pytestmark = pytest.mark.unit

CH = "kernels-in-one-token"


def rehash(run_dir, name):
    """Make meta.json agree with a changed file (as a careful tamperer, or an old run, would)."""
    meta = json.loads((run_dir / "meta.json").read_text())
    meta["files"][name] = hashlib.sha256((run_dir / name).read_bytes()).hexdigest()
    (run_dir / "meta.json").write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")


def one_line(e):
    msg = str(e.value)
    assert "\n" not in msg, msg
    return msg


@pytest.fixture
def run_dir(copied_runs):
    return copied_runs / CH / runs.published(copied_runs)[CH]


@pytest.mark.parametrize(
    "manifest,fragment",
    [
        ({CH: "../../../outside/x"}, "chapter kernels-in-one-token: '../../../outside/x' is not a run id"),
        ({"../../outside": "20261130T002417Z-h200"}, "'../../outside' is not a chapter name"),
        ({CH: 42}, "42 is not a run id"),
        ([CH], "expected an object mapping chapters to run ids"),
    ],
)
def test_published_json_entries_are_checked(copied_runs, manifest, fragment):
    (copied_runs / "published.json").write_text(json.dumps(manifest))
    with pytest.raises(runs.RunError) as e:
        runs.published()
    assert fragment in one_line(e) and "published.json" in str(e.value)


def test_corrupt_published_json_is_an_error_never_an_empty_manifest(copied_runs):
    (copied_runs / "published.json").write_text('{"kernels-in-one-token": ')
    with pytest.raises(runs.RunError, match="published.json is corrupt"):
        runs.published()
    with pytest.raises(runs.RunError):
        runs.publish_many({}, copied_runs)  # would otherwise drop every other chapter


@pytest.mark.parametrize("cmd", [["runs"], ["live", CH, "--allow-cpu", "--param", "preset=tiny"], ["book"]])
def test_commands_say_one_line_about_a_corrupt_manifest(copied_runs, tmp_path, cmd):
    (copied_runs / "published.json").write_text("{not json")
    before = tree_bytes(copied_runs)
    env = {
        **os.environ,
        "LABSUPPORT_RUNS": str(copied_runs),
        "PYTHONPATH": str(REPO),
        "LABSUPPORT_BOOK_DIR": str(tmp_path / "html"),
        "LABSUPPORT_NIGHTLY_DIR": str(tmp_path / "logs"),
    }
    r = subprocess.run(
        [sys.executable, "-m", "labsupport", *cmd], cwd=REPO, env=env, capture_output=True, text=True, timeout=300
    )
    err = r.stderr.strip().splitlines()
    assert r.returncode == 1 and len(err) == 1 and "published.json is corrupt" in err[0], r.stderr
    assert "Traceback" not in r.stderr and "[1/1]" not in r.stdout
    assert tree_bytes(copied_runs) == before


def test_the_nightly_stops_on_a_corrupt_manifest_or_history(copied_runs, tmp_path):
    env = {
        **os.environ,
        "LABSUPPORT_RUNS": str(copied_runs),
        "PYTHONPATH": str(REPO),
        "LABSUPPORT_NIGHTLY_DIR": str(tmp_path / "logs"),
        "LABSUPPORT_BOOK_DIR": str(tmp_path / "html"),
    }
    for name, text, fragment in [
        ("published.json", "{", "published.json is corrupt"),
        ("history.csv", 'a,b\n1,"2\n', "history.csv is corrupt"),
    ]:
        saved = (copied_runs / name).read_bytes()
        (copied_runs / name).write_text(text)
        before = tree_bytes(copied_runs)
        r = subprocess.run(
            [sys.executable, "-m", "labsupport", "nightly", CH, "--allow-cpu", "--no-book"],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        lines = [ln for ln in r.stderr.splitlines() if ln.startswith("nightly failed:")]
        assert r.returncode == 1 and len(lines) == 1 and fragment in lines[0], r.stderr
        assert "[1/1]" not in r.stdout and tree_bytes(copied_runs) == before
        (copied_runs / name).write_bytes(saved)


def test_corrupt_history_is_one_line(copied_runs):
    (copied_runs / "history.csv").write_text('published_as,chapter\n"unterminated\n')
    with pytest.raises(runs.RunError) as e:
        history.read()
    assert "history.csv is corrupt" in one_line(e)
    (copied_runs / "history.csv").write_text("a,b\n1,2\n")
    with pytest.raises(runs.RunError, match="history.csv is corrupt: its columns are a, b"):
        history.read()


@pytest.mark.parametrize("value", ["inf", "-inf", "1e999"])
def test_history_refuses_a_value_that_is_not_finite_on_read_and_on_write(copied_runs, value):
    path = copied_runs / "history.csv"
    good = path.read_bytes()
    rows = len(good.decode().splitlines())
    path.write_bytes(good + f"live x,why-a-gpu,20261130T002417Z-h200,t,g,copy TB/s,{value}\n".encode())
    with pytest.raises(runs.RunError) as e:
        history.read()
    assert f"history.csv is corrupt: column 'value', row {rows}: " in one_line(e) and "is not a finite number" in str(
        e.value
    )
    with pytest.raises(bookbuild.BuildError, match="is not a finite number"):
        bookbuild.check_runs(copied_runs)
    path.write_bytes(good)
    row = dict(zip(history.COLUMNS, ["live x", "why-a-gpu", "r", "t", "g", "copy TB/s", float(value)], strict=True))
    with pytest.raises(runs.RunError) as e:
        history.append([row])
    assert f"why-a-gpu copy TB/s: {float(value)!r} is not a finite number; nothing was appended" in one_line(e)
    assert path.read_bytes() == good


def test_files_listed_in_meta_json_must_be_plain_names(copied_runs, run_dir, tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("secret\n")
    meta = json.loads((run_dir / "meta.json").read_text())
    meta["files"]["../../../../secret.txt"] = hashlib.sha256(secret.read_bytes()).hexdigest()
    (run_dir / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(runs.RunError) as e:
        runs.load_run(chapters.by_slug(CH))
    assert "'../../../../secret.txt', which is not a plain file name inside the run" in one_line(e)


def test_symlinks_are_refused_when_reading_and_serving(copied_runs, run_dir, tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("step,x\n")
    target = run_dir / "step_times.csv"
    shutil.copy(target, secret)
    target.unlink()
    target.symlink_to(secret)  # same bytes, so the checksum matches
    with pytest.raises(runs.RunError, match="step_times.csv is a symbolic link"):
        runs.load_run(chapters.by_slug(CH))
    with pytest.raises(runs.RunError, match="symbolic link"):
        runs.copy_published(tmp_path / "served", link=False)
    target.unlink()
    shutil.copy(secret, target)
    # A chapter folder that is a link is refused too.
    shutil.move(str(copied_runs / CH), tmp_path / "elsewhere")
    (copied_runs / CH).symlink_to(tmp_path / "elsewhere")
    with pytest.raises(runs.RunError, match="is a symbolic link"):
        runs.load_run(chapters.by_slug(CH))


def test_serving_copies_only_the_published_runs_listed_files(copied_runs, run_dir, tmp_path):
    (run_dir / "not-listed.txt").write_text("x")
    served = tmp_path / "served"
    runs.copy_published(served, link=False)
    assert not (served / CH / run_dir.name / "not-listed.txt").exists()
    assert (served / CH / run_dir.name / "trace.json.gz").is_file()
    assert sorted(p.name for p in served.iterdir() if p.is_dir()) == sorted(runs.published())
    assert not any(p.is_symlink() for p in served.rglob("*"))


def test_a_table_with_the_wrong_columns_or_empty(run_dir):
    path = run_dir / "census.csv"
    path.write_text(path.read_text().replace("kind,", "kinds,", 1))
    rehash(run_dir, "census.csv")
    run = runs.load_run(chapters.by_slug(CH))
    with pytest.raises(runs.RunError) as e:
        run.table("census")
    assert f"{path} lacks column kind (it has kinds," in one_line(e)
    assert any("census.csv lacks column kind" in p for p in validate.check_run(chapters.by_slug(CH), run))
    with pytest.raises(bookbuild.BuildError, match="census.csv lacks column kind"):
        bookbuild.check_runs(run_dir.parent.parent)
    path.write_text("")
    rehash(run_dir, "census.csv")
    with pytest.raises(runs.RunError) as e:
        runs.load_run(chapters.by_slug(CH)).table("census")
    assert one_line(e) == f"{path} is empty"


def test_provenance_without_gpu(run_dir):
    meta = json.loads((run_dir / "meta.json").read_text())
    del meta["provenance"]["gpu"]
    (run_dir / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(runs.RunError) as e:
        runs.load_run(chapters.by_slug(CH))
    assert one_line(e) == f"{run_dir / 'meta.json'}: provenance lacks gpu"


@pytest.mark.parametrize("damage", ["truncated", "not json"])
def test_a_damaged_trace_with_a_matching_hash(run_dir, damage):
    trace = run_dir / "trace.json.gz"
    data = trace.read_bytes()
    trace.write_bytes(data[: len(data) // 2] if damage == "truncated" else gzip.compress(b"this is not json"))
    rehash(run_dir, "trace.json.gz")
    run = runs.load_run(chapters.by_slug(CH))  # the checksum matches
    with pytest.raises(runs.RunError) as e:
        run.file("trace.json.gz")
    assert one_line(e).startswith(f"{trace} is not a readable trace: ")
    with pytest.raises(runs.RunError, match="is not a readable trace"):
        runs.check_published(chapters.CHAPTERS)
    assert any("is not a readable trace" in p for p in validate.check_run(chapters.by_slug(CH), run))


@pytest.mark.book
def test_a_damaged_trace_fails_the_book_with_one_line_last(run_dir, copied_runs):
    trace = run_dir / "trace.json.gz"
    trace.write_bytes(trace.read_bytes()[:1000])
    rehash(run_dir, "trace.json.gz")
    env = {**os.environ, "LABSUPPORT_RUNS": str(copied_runs), "PYTHONPATH": str(REPO)}
    r = subprocess.run(["make", "-s", "book"], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode != 0, (r.stdout, r.stderr)
    lines = [ln for ln in (r.stdout + r.stderr).strip().splitlines() if not re.match(r"make(\[\d+\])?: ", ln)]
    assert lines, (r.returncode, r.stdout, r.stderr)
    last = lines[-1]
    assert last.startswith("make book failed: ") and "trace.json.gz is not a readable trace" in last, r.stderr[-2000:]


def test_the_build_log_error_is_found():
    log = (
        'Traceback (most recent call last)\n  raise RunError(f"{path} is corrupt")\n'
        "\x1b[0;31mRunError\x1b[0m: /x/runs/ch/20261130T002417Z-h200/kernels.csv lacks column op\n"
        "RuntimeError: There was an error in building your book\n"
    )
    assert bookbuild.first_error(log) == "RunError: /x/runs/ch/20261130T002417Z-h200/kernels.csv lacks column op"
    assert bookbuild.first_error("nothing to see\n") is None


def test_run_ids_and_chapter_names():
    for bad in ["../x", "20261130T002417Z/../../x", "20261130T002417Z-h200/..", ".", "", "20261130T002417Z-.."]:
        with pytest.raises(runs.RunError):
            runs.check_run_id(bad)
    for bad in ["../x", "A", "a/b", "-a", "a--b", ""]:
        with pytest.raises(runs.RunError):
            runs.check_chapter(bad)
    assert runs.check_run_id("20261130T002417Z-h200") and runs.check_chapter("kernels-in-one-token")
    runs.check_published(chapters.CHAPTERS, RUNS)


@pytest.mark.parametrize(
    "pattern,good",
    [
        (runs.RUN_ID_PATTERN, "20261130T002417Z-h200"),
        (runs.CHAPTER_PATTERN, "kernels-in-one-token"),
        (runs.FILE_PATTERN, "trace.json.gz"),
    ],
    ids=["run id", "chapter", "file"],
)
def test_names_match_their_pattern_in_full_and_within_their_length(pattern, good):
    """A name with a final newline (which `$` lets through) or longer than its limit matches no
    pattern, whichever of match and fullmatch a caller uses."""
    limit = {runs.RUN_ID_PATTERN: paths.MAX_RUN_ID, runs.CHAPTER_PATTERN: paths.MAX_CHAPTER}.get(
        pattern, paths.MAX_FILE_NAME
    )
    longest = good + "_" * (limit - len(good)) if pattern is not runs.CHAPTER_PATTERN else "a" * limit
    assert pattern.match(good) and pattern.match(longest)
    for bad in (good + "\n", good + "\r", "\n" + good, longest + "a"):
        assert not pattern.match(bad) and not pattern.fullmatch(bad), repr(bad)


def test_the_longest_names_leave_room_for_every_derived_name():
    """The longest derived name, a packed run's scratch archive `.<chapter>-<run id>-<GPU>.tar.gz.tmp`
    (ops.pack), stays well under the 255 bytes a file name may have."""
    from labsupport.ops import pack

    gpu = pack.gpu_slug("NVIDIA " + "H200 SXM " * 40)
    name = f".{'a' * paths.MAX_CHAPTER}-{'2' * paths.MAX_RUN_ID}-{gpu}.tar.gz.tmp"
    assert len(name.encode()) <= 200 and paths.MAX_FILE_NAME <= 200
    tag = runs.new_run_id("NVIDIA " + "GeForce RTX " * 30)
    assert len(tag) <= paths.MAX_RUN_ID and runs.check_run_id(tag) and tag.endswith("-geforce")


@pytest.mark.parametrize("bad", ["20261130T002417Z-h200\n", "20261130T002417Z-" + "x" * 235], ids=["newline", "252"])
def test_a_bad_run_id_is_refused_where_a_run_is_written_loaded_published_or_packed(copied_runs, run_dir, bad):
    """A run id ending in a newline, or of 252 characters (whose zip broke every later book),
    is one RunError line wherever it comes in."""
    from labsupport.ops import pack

    with pytest.raises(runs.RunError) as e:
        runs.RunWriter(chapters.by_slug(CH), {}, bad, root=copied_runs)
    one_line(e)
    shutil.copytree(run_dir, copied_runs / CH / bad)
    for load in (
        lambda: runs.load_run(chapters.by_slug(CH), bad),
        lambda: pack.pack(CH, bad, out_dir=copied_runs.parent / "packs"),
    ):
        with pytest.raises(runs.RunError) as e:
            load()
        assert "is not a run id" in one_line(e)
    (copied_runs / "published.json").write_text(json.dumps({CH: bad}))
    with pytest.raises(runs.RunError) as e:
        runs.published()
    assert "is not a run id" in one_line(e)
    assert not (copied_runs.parent / "packs").exists()


def test_a_failed_jupyter_book_run_is_a_build_error_with_the_line(monkeypatch, tmp_path):
    """bookbuild.build never ignores jupyter-book's exit status, and names the cause."""

    class Failed:
        def __init__(self, *a, **k):
            self.stdout = iter(
                [
                    "Executing notebook\n",
                    "\x1b[31mRunError\x1b[0m: /r/trace.json.gz is not a readable trace: x\n",
                    "RuntimeError: There was an error in building your book\n",
                ]
            )

        def wait(self):
            return 1

    monkeypatch.setattr(bookbuild.subprocess, "Popen", Failed)
    with pytest.raises(bookbuild.BuildError) as e:
        bookbuild.build(runs_root=RUNS, out=tmp_path / "out", log=tmp_path / "book.log", echo=False)
    assert one_line(e).startswith("RunError: /r/trace.json.gz is not a readable trace: x (full log: ")
