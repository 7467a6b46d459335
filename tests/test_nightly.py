"""The nightly rebuild on the CPU with the tiny model: the path that promotes, and every
path that must leave the published runs byte for byte as they were."""

import os
import re
import signal
import subprocess
import sys

import pytest

from labsupport import runs

from .conftest import REPO, cpu_args, tree_bytes, wait_until_measuring

pytestmark = pytest.mark.live

TINY = cpu_args("kernels-in-one-token")


@pytest.fixture
def env(copied_runs, tmp_path):
    return {
        **os.environ,
        "LABSUPPORT_RUNS": str(copied_runs),
        "PYTHONPATH": str(REPO),
        "LABSUPPORT_NIGHTLY_DIR": str(tmp_path / "nightly-logs"),
        "LABSUPPORT_BOOK_DIR": str(tmp_path / "book-html"),
    }


def nightly(args, env, **kw):
    return subprocess.run(
        [sys.executable, "-m", "labsupport", "nightly", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        **kw,
    )


def one_line_failure(r):
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("nightly failed:")]
    assert r.returncode == 1 and len(lines) == 1, r.stderr[-2000:]
    return lines[0]


def test_a_good_night_promotes_records_and_builds_the_book(env, copied_runs, tmp_path):
    before = runs.published(copied_runs)
    r = nightly(TINY, env)
    assert r.returncode == 0, r.stderr[-3000:]
    after = runs.published(copied_runs)
    new_id = after["kernels-in-one-token"]
    assert new_id != before["kernels-in-one-token"] and new_id.endswith("-cpu")
    assert {k: v for k, v in after.items() if k != "kernels-in-one-token"} == {
        k: v for k, v in before.items() if k != "kernels-in-one-token"
    }
    # The drift report compares with the run it replaced, and is kept under runs/nightly/.
    report = (copied_runs / "nightly" / f"{new_id}-drift.md").read_text()
    assert f"against published run `{before['kernels-in-one-token']}`" in report
    assert "| kernels.csv | kernels |" in report  # the CPU run has far fewer kernels: structural
    hist = (copied_runs / "history.csv").read_text()
    assert f"nightly {new_id},kernels-in-one-token,{new_id}" in hist and "notebook seconds" in hist
    # The staged book replaced the book folder, and shows the new run.
    page = (tmp_path / "book-html" / "notebooks" / "kernels_in_one_token.html").read_text()
    assert new_id in page
    # Only the new run and the one it replaced are kept.
    assert runs.list_runs("kernels-in-one-token", copied_runs) == sorted([before["kernels-in-one-token"], new_id])
    assert "[1/1] kernels-in-one-token: done in" in r.stdout


def test_a_notebook_that_raises(env, copied_runs, tmp_path):
    before = tree_bytes(copied_runs)
    # Qwen3-8B (the default preset) on a CPU: the notebook refuses to measure.
    args = ["kernels-in-one-token", "--allow-cpu", "--param", "prompt_len=16", "--param", "repeats=2", "--no-book"]
    line = one_line_failure(nightly(args, env))
    assert "notebook failed (EnvironmentProblem: live mode needs a CUDA GPU" in line and "nothing was published" in line
    assert tree_bytes(copied_runs) == before
    logs = list((tmp_path / "nightly-logs").glob("*/kernels-in-one-token.log"))
    assert logs and list((tmp_path / "nightly-logs").glob("*/FAILED.txt"))


def test_a_validation_failure(env, copied_runs, tmp_path):
    before = tree_bytes(copied_runs)
    line = one_line_failure(nightly(TINY + ["--no-book", "--min-kernels", "100000"], env))
    assert "validation failed: kernels-in-one-token: kernels.csv:" in line and "fewer than the minimum 100000" in line
    assert tree_bytes(copied_runs) == before
    aside = list((tmp_path / "nightly-logs").glob("*/failed-runs/kernels-in-one-token/*"))
    assert len(aside) == 1 and (aside[0] / "meta.json").is_file(), "the failed run is kept aside, whole"


def test_a_corrupt_published_run_stops_the_night_before_it_starts(env, copied_runs):
    pub = runs.published(copied_runs)["kernels-in-one-token"]
    census = copied_runs / "kernels-in-one-token" / pub / "census.csv"
    census.write_text(census.read_text().replace("matrix multiply", "matrix multiplY"))
    before = tree_bytes(copied_runs)
    r = nightly(TINY + ["--no-book"], env)
    line = one_line_failure(r)
    assert "published state is damaged" in line and "census.csv does not match its checksum" in line
    assert "[1/1]" not in r.stdout, "no chapter may run against a damaged baseline"
    assert tree_bytes(copied_runs) == before


def test_no_gpu(env, copied_runs):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    before = tree_bytes(copied_runs)
    r = nightly(["--no-book"], env)
    assert r.returncode != 0 and "live mode needs a CUDA GPU" in r.stderr and "Traceback" not in r.stderr
    assert tree_bytes(copied_runs) == before


def test_an_interrupted_night(env, copied_runs, tmp_path):
    before = tree_bytes(copied_runs)
    p = subprocess.Popen(
        [sys.executable, "-m", "labsupport", "nightly", *TINY, "--no-book"],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )

    # Interrupt it while the notebook measures: its log shows the model being built. (The run
    # folder itself is written whole by the notebook's last cell, in milliseconds, too brief
    # a window to wait for.) Before the notebook starts, the nightly checks every published run
    # and papermill starts a kernel that imports torch.
    wait_until_measuring(p, tmp_path / "nightly-logs", "kernels-in-one-token")
    os.kill(p.pid, signal.SIGTERM)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 1 and "nightly failed: interrupted" in err, err[-2000:]
    assert tree_bytes(copied_runs) == before


def test_smoke_runs_chapters_small_into_a_scratch_folder_and_publishes_nothing(env, copied_runs, tmp_path):
    before = tree_bytes(copied_runs)
    env = {**env, "LABSUPPORT_SMOKE_DIR": str(tmp_path / "smoke")}
    r = subprocess.run(
        [sys.executable, "-m", "labsupport", "live", "--smoke", "prefill-vs-decode", "what-a-kernel", "--allow-cpu"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    table = r.stdout[r.stdout.index("\nsmoke ") :]
    assert re.search(r"prefill-vs-decode\s+pass\s+\d+ s", table)
    assert re.search(r"what-a-kernel\s+skip .*no CPU path", table)
    assert "smoke: 1 passed, 0 failed, 1 skipped" in table
    assert "'prompt_lens': [1, 8, 16]" in r.stdout, "the chapter's smoke and CPU parameters were used"
    scratch = list((tmp_path / "smoke").glob("*/runs/prefill-vs-decode/*-cpu"))
    assert len(scratch) == 1 and (scratch[0] / "meta.json").is_file()
    assert tree_bytes(copied_runs) == before


def test_a_failed_smoke_chapter_fails_the_command(monkeypatch, copied_runs, tmp_path, capsys):
    from labsupport.ops import live

    monkeypatch.setattr(live, "SMOKE_DIR", tmp_path / "smoke")
    monkeypatch.setattr(live, "check_gpu", lambda allow_cpu: None)

    def fail(ch, *a, **k):
        raise live.LiveRunError(f"{ch.slug}: notebook failed (RuntimeError: boom)")

    monkeypatch.setattr(live, "run_logged", fail)
    assert live.smoke(["prefill-vs-decode"], {}, allow_cpu=True) == 1
    out = capsys.readouterr().out
    assert re.search(r"prefill-vs-decode\s+fail .*boom", out) and "smoke: 0 passed, 1 failed" in out


def test_an_unknown_preset_stops_the_night_before_it_starts(env, copied_runs, tmp_path):
    before = tree_bytes(copied_runs)
    r = nightly(TINY + ["--no-book", "--param", 'preset="no-such-model"'], env)
    assert r.returncode == 1 and r.stderr.strip().splitlines() == [r.stderr.strip()], r.stderr
    assert "--param preset=\"no-such-model\": unknown model preset 'no-such-model'" in r.stderr
    assert not (tmp_path / "nightly-logs").exists() and tree_bytes(copied_runs) == before
