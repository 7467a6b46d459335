import json
import os
import shutil
import time
from pathlib import Path

import pytest

from labsupport import runs
from labsupport.chapters import kernels_in_one_token as one_token
from labsupport.measure import harness  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
RUNS = REPO / "runs"
# Copies of real H200 runs, one per chapter, frozen for the unit tests: a nightly that changes
# the published runs does not change what the tests assert (validation checks those).
FIXTURES = Path(__file__).resolve().parent / "fixtures" / "runs"


def fixture_run(chapter: str) -> runs.Run:
    """The recorded run of `chapter` kept under tests/fixtures/runs/ (the newest, if several)."""
    ids = sorted(p.name for p in (FIXTURES / chapter).iterdir() if p.is_dir())
    return runs.load_run(chapter, ids[-1], root=FIXTURES)


@pytest.fixture(autouse=True)
def _environment_restored():
    """Commands run in-process (nightly.main, live.smoke) set variables for their notebook
    kernels (PYTHONPATH, LABSUPPORT_COMMAND, LABSUPPORT_RUNS); none may leak into later tests."""
    saved = dict(os.environ)
    yield
    if dict(os.environ) != saved:
        os.environ.clear()
        os.environ.update(saved)


@pytest.fixture(scope="session")
def published():
    """A recorded H200 run of "The kernels in one token" (the fixture copy, not runs/)."""
    return fixture_run("kernels-in-one-token")


@pytest.fixture(scope="session")
def published_kernels(published):
    return one_token.kernel_table(published)


@pytest.fixture
def runs_root(tmp_path, monkeypatch):
    """An empty runs folder that labsupport writes to instead of the repository's."""
    root = tmp_path / "runs"
    root.mkdir()
    monkeypatch.setenv("LABSUPPORT_RUNS", str(root))
    return root


@pytest.fixture
def copied_runs(tmp_path, monkeypatch):
    """A copy of the repository's runs folder, safe to damage."""
    root = tmp_path / "published-runs"
    shutil.copytree(RUNS, root)
    monkeypatch.setenv("LABSUPPORT_RUNS", str(root))
    return root


def cpu_args(slug: str) -> list[str]:
    """Command-line arguments that run chapter `slug` live on a CPU with its tiny parameters
    (the registry's `cpu` entry), for `python -m labsupport live/nightly`."""
    from labsupport import chapters

    args = [slug, "--allow-cpu"]
    for name, value in chapters.by_slug(slug).cpu.items():
        args += ["--param", f"{name}={json.dumps(value)}"]
    return args


def tree_bytes(root: Path) -> dict:
    """Every file under root with its bytes, to check that nothing changed."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def wait_while_running(proc, ready, limit_s: float = 600) -> bool:
    """Poll `ready()` until it holds, `proc` exits or `limit_s` passes; returns `ready()`. The
    limit is generous on purpose: a loaded CI machine once took over 120 s to start a nightly."""
    deadline = time.time() + limit_s
    while time.time() < deadline and proc.poll() is None and not ready():
        time.sleep(0.05)
    return ready()


@pytest.fixture(scope="session")
def built_book(tmp_path_factory):
    """The book built once per test session from the recorded runs, warnings as errors.

    Returns the HTML folder. Every test that looks at the rendered book shares this build.
    """
    import subprocess
    import sys

    out = tmp_path_factory.mktemp("book")
    jb = Path(sys.executable).with_name("jupyter-book")
    r = subprocess.run(
        [
            str(jb),
            "build",
            str(REPO),
            "--all",
            "--warningiserror",
            "--keep-going",
            "--builder",
            "html",
            "--path-output",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    return out / "_build" / "html"


@pytest.fixture
def calls(monkeypatch):
    """Every time_region and profile_region call, in order, as ("time"/"profile", what)."""
    order = []
    real_time, real_profile = harness.time_region, harness.profile_region

    def time_region(fn, *, what, **kw):
        order.append(("time", what))
        return real_time(fn, what=what, **kw)

    def profile_region(fn, path, *, region, **kw):
        order.append(("profile", region))
        return real_profile(fn, path, region=region, **kw)

    monkeypatch.setattr(harness, "time_region", time_region)
    monkeypatch.setattr(harness, "profile_region", profile_region)
    return order
