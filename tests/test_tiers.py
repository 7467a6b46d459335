"""Every test carries its tier (unit, book or live) itself: tests/conftest.py stops collection
with one line naming a test that has none, two at one level, or one its fixtures contradict, and
a test's own mark wins over its file's for `-m`."""

import os
import shutil
import subprocess
import sys

import pytest

from .conftest import REPO

pytestmark = pytest.mark.unit


def collect(tmp_path, source: str, *args: str) -> subprocess.CompletedProcess:
    """Collect one test file written from `source` beside a copy of the project's conftest.py and
    pytest settings (pyproject.toml: strict markers, the three tiers)."""
    tmp_path.mkdir(exist_ok=True)
    shutil.copy(REPO / "pyproject.toml", tmp_path)
    (tmp_path / "tests").mkdir()
    shutil.copy(REPO / "tests" / "conftest.py", tmp_path / "tests")
    (tmp_path / "tests" / "test_sample.py").write_text(source)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "tests", *args],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
    )


UNMARKED = "def test_a():\n    pass\n"


def said_in_one_line(r: subprocess.CompletedProcess, says: str) -> bool:
    """The collection error is the line `says`, with no traceback."""
    out = r.stdout + r.stderr
    return says in out.splitlines() and "Traceback" not in out and "INTERNALERROR" not in out


@pytest.mark.parametrize(
    "source, says",
    [
        (
            UNMARKED,
            "tests/test_sample.py::test_a: no tier: mark it unit, book or live (pytestmark, or @pytest.mark.<tier>)",
        ),
        (
            "import pytest\n\n@pytest.mark.unit\n@pytest.mark.live\ndef test_a():\n    pass\n",
            "tests/test_sample.py::test_a: one tier, not live and unit",
        ),
        (
            "import pytest\n\npytestmark = pytest.mark.unit\n\ndef test_a(built_book):\n    pass\n",
            "tests/test_sample.py::test_a: marked unit, but its fixtures make it a book test",
        ),
    ],
    ids=["none", "two", "contradicted"],
)
def test_a_test_without_one_tier_stops_collection_in_one_line(tmp_path, source, says):
    r = collect(tmp_path, source)
    assert r.returncode == pytest.ExitCode.INTERRUPTED and said_in_one_line(r, says), r.stdout + r.stderr


def test_under_xdist_too(tmp_path):
    """`make test` collects in pytest-xdist's workers, which lose a usage error's message."""
    r = collect(tmp_path, UNMARKED, "-n", "2")
    says = "tests/test_sample.py::test_a: no tier: mark it unit, book or live (pytestmark, or @pytest.mark.<tier>)"
    assert r.returncode != 0 and said_in_one_line(r, says), r.stdout + r.stderr


def test_a_tests_own_mark_wins_over_its_files(tmp_path):
    source = (
        "import pytest\n\npytestmark = pytest.mark.unit\n\n"
        "def test_a():\n    pass\n\n"
        "@pytest.mark.book\ndef test_b():\n    pass\n"
    )
    for tier, only in [("unit", "test_a"), ("book", "test_b")]:
        r = collect(tmp_path / tier, source, "-m", tier)
        assert r.returncode == 0, r.stdout + r.stderr
        assert [line for line in r.stdout.splitlines() if "::" in line] == [f"tests/test_sample.py::{only}"], r.stdout
