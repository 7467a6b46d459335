"""A run's commit is one of this repository's, and its code digest says what the box ran."""

import json
import shutil
import subprocess
import tarfile

import pandas as pd
import pytest

from labsupport import chapters, runs
from labsupport.ops import live, validate
from labsupport.runs import provenance

from .conftest import FIXTURES, REPO, TOY

pytestmark = pytest.mark.unit

HAS_GIT = (REPO / ".git").exists() and shutil.which("git") is not None
needs_git = pytest.mark.skipif(not HAS_GIT, reason="no .git here: the commit cannot be looked up")
NOT_A_COMMIT = "12c4b3236a60096284ea43dd0142f2dcdeffbc6e"  # 40 hex digits, no such object


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, check=True).stdout.strip()


@needs_git
def test_every_published_run_names_a_commit_in_the_history_of_head():
    """runs/published.json: each run's git_commit (less '-dirty') is HEAD or an ancestor of it."""
    manifest = json.loads((REPO / "runs" / "published.json").read_text())
    bad = {}
    for chapter, run_id in sorted(manifest.items()):
        commit = json.loads((REPO / "runs" / chapter / run_id / "meta.json").read_text())["provenance"]["git_commit"]
        problem = provenance.commit_problem(commit)
        if problem:
            bad[(chapter, run_id)] = problem
    assert not bad, "\n".join(f"{c} {r}: {p}" for (c, r), p in bad.items())


@pytest.mark.parametrize("value", ["12c4b32", "HEAD", "12C4B3236A60096284EA43DD0142F2DCDEFFBC6E", "x" * 40, "main\n"])
def test_a_given_commit_that_is_not_40_hex_digits_is_one_line(monkeypatch, value):
    monkeypatch.setenv("LABSUPPORT_GIT_COMMIT", value)
    with pytest.raises(provenance.ProvenanceError) as e:
        provenance.git_commit()
    assert "\n" not in str(e.value) and "40 lower-case hex digits" in str(e.value)
    with pytest.raises(SystemExit, match="not a full commit hash"):  # live and nightly stop before running
        live.set_environment()


@needs_git
def test_the_checkout_commit_is_recorded_and_a_differing_given_one_refused(monkeypatch):
    head = git("rev-parse", "HEAD")
    monkeypatch.delenv("LABSUPPORT_GIT_COMMIT", raising=False)
    assert provenance.git_commit().removesuffix("-dirty") == head
    monkeypatch.setenv("LABSUPPORT_GIT_COMMIT", head)
    assert provenance.git_commit().removesuffix("-dirty") == head
    monkeypatch.setenv("LABSUPPORT_GIT_COMMIT", NOT_A_COMMIT)
    with pytest.raises(provenance.ProvenanceError, match=f"differs from this checkout's HEAD {head}"):
        provenance.git_commit()


def test_without_git_the_given_commit_is_recorded(monkeypatch, tmp_path):
    monkeypatch.setenv("LABSUPPORT_GIT_COMMIT", NOT_A_COMMIT)
    assert provenance.git_commit(tmp_path) == NOT_A_COMMIT
    assert provenance.commit_problem(NOT_A_COMMIT, tmp_path) is None  # nothing here to look it up in
    monkeypatch.delenv("LABSUPPORT_GIT_COMMIT")
    assert provenance.git_commit(tmp_path) == "unknown"  # which validation refuses


@needs_git
def test_commits_outside_the_history_are_named():
    head = git("rev-parse", "HEAD")
    assert provenance.commit_problem(head) is None
    assert provenance.commit_problem(head + "-dirty") is None
    assert provenance.commit_problem(git("rev-parse", "HEAD~1")) is None
    assert "is not a commit of this repository" in provenance.commit_problem(NOT_A_COMMIT)
    assert "not a full commit hash" in provenance.commit_problem("12c4b32")
    tree = git("rev-parse", "HEAD^{tree}")  # an object, but no commit
    assert "is not a commit of this repository" in provenance.commit_problem(tree)


def _run_with_commit(root, commit: str) -> runs.Run:
    src = sorted((FIXTURES / "what-a-kernel").iterdir())[-1]
    shutil.copytree(src, root / "what-a-kernel" / src.name)
    meta_path = root / "what-a-kernel" / src.name / "meta.json"
    meta = json.loads(meta_path.read_text())
    meta["provenance"]["git_commit"] = commit
    meta_path.write_text(json.dumps(meta))
    (root / "published.json").write_text("{}")
    return runs.load_run(chapters.by_slug("what-a-kernel"), src.name, root)


@needs_git
def test_validation_and_publishing_refuse_a_commit_outside_the_history(tmp_path):
    from labsupport import chapters

    run = _run_with_commit(tmp_path, NOT_A_COMMIT)
    problems = validate.check_run(chapters.by_slug("what-a-kernel"), run)
    assert problems == [
        f"run {run.run_id} of what-a-kernel: git_commit {NOT_A_COMMIT} is not a commit of this repository"
    ]
    with pytest.raises(runs.RunError, match="is not a commit of this repository; not published") as e:
        runs.publish("what-a-kernel", run.run_id, tmp_path)
    assert "\n" not in str(e.value)
    assert json.loads((tmp_path / "published.json").read_text()) == {}
    with pytest.raises(runs.RunError, match="not published"):  # the live command's publish path
        live.publish_run(tmp_path, chapters.by_slug("what-a-kernel"), run, 1.0)
    assert json.loads((tmp_path / "published.json").read_text()) == {}


@needs_git
def test_a_run_at_head_is_validated_and_published(tmp_path):
    from labsupport import chapters

    run = _run_with_commit(tmp_path, git("rev-parse", "HEAD") + "-dirty")
    assert validate.check_run(chapters.by_slug("what-a-kernel"), run) == []
    runs.publish("what-a-kernel", run.run_id, tmp_path)
    assert runs.published(tmp_path) == {"what-a-kernel": run.run_id}


def _tree_at(commit: str, dst):
    """The digested paths of the tree at `commit`, as `git archive` gives them."""
    dst.mkdir()
    archive = dst.parent / f"{dst.name}.tar"
    with open(archive, "wb") as f:
        subprocess.run(["git", "archive", commit, *provenance.DIGESTED], cwd=REPO, stdout=f, check=True)
    with tarfile.open(archive) as tar:
        tar.extractall(dst, filter="data")
    return dst


@needs_git
def test_the_digest_of_a_tree_is_reproducible_and_follows_its_files(tmp_path):
    head = git("rev-parse", "HEAD")
    a, b = _tree_at(head, tmp_path / "a"), _tree_at(head, tmp_path / "b")
    digest = provenance.tree_digest(a)
    assert len(digest) == 64 and digest == provenance.tree_digest(b) == provenance.tree_digest(a)
    (b / "labsupport" / "__pycache__").mkdir(exist_ok=True)  # what Python writes beside the sources
    (b / "labsupport" / "__pycache__" / "x.cpython-312.pyc").write_bytes(b"\0")
    assert provenance.tree_digest(b) == digest
    req = b / "requirements-gpubox.txt"
    req.write_text(req.read_text() + "# one more line\n")
    assert provenance.tree_digest(b) != digest
    req.unlink()
    assert provenance.tree_digest(b) != digest
    shutil.copyfile(a / "requirements-gpubox.txt", req)
    assert provenance.tree_digest(b) == digest
    nb = sorted((b / "notebooks").glob("*.ipynb"))[0]
    nb.rename(b / "notebooks" / ("z" + nb.name))  # the same bytes under another name
    assert provenance.tree_digest(b) != digest


def test_a_recorded_run_holds_the_digest_of_this_tree(tmp_path, monkeypatch):
    """provenance.collect() (what every live run records) has the commit and the digest of the code."""
    monkeypatch.delenv("LABSUPPORT_GIT_COMMIT", raising=False)
    prov = provenance.collect()
    assert prov["tree_digest"] == provenance.tree_digest()
    with runs.RunWriter(TOY, {}, "20260101T000000Z-test", root=tmp_path, meta={"provenance": prov}) as w:
        w.write_table("t", pd.DataFrame({"x": [1]}))
    assert runs.load_run(TOY, "20260101T000000Z-test", tmp_path).provenance["tree_digest"] == prov["tree_digest"]


@needs_git
def test_the_trust_page_table_shows_each_published_commit_and_digest(tmp_path):
    """validate.published_provenance (the trust page's table): the commit (as many digits as `git show`
    needs), whether it is in the history, and the code digest (or that the run predates it)."""
    run = _run_with_commit(tmp_path, NOT_A_COMMIT)
    (tmp_path / "published.json").write_text(json.dumps({"what-a-kernel": run.run_id}))
    row = validate.published_provenance(tmp_path).iloc[0]
    assert row["GPU"] == run.provenance["gpu"] and row["GPU"]
    assert (row["commit"], row["in the history"], row["code digest (SHA-256)"]) == (
        NOT_A_COMMIT[:12],
        "no",
        "not recorded",
    )
    meta_path = run.path / "meta.json"
    meta = json.loads(meta_path.read_text())
    meta["provenance"].update(git_commit=git("rev-parse", "HEAD"), tree_digest="ab" * 32)
    meta_path.write_text(json.dumps(meta))
    row = validate.published_provenance(tmp_path).iloc[0]
    assert (row["in the history"], row["code digest (SHA-256)"]) == ("yes", "ab" * 8)
