"""The book builds from the recorded runs with warnings as errors, and shows their numbers."""

import re

import pytest

from labsupport import chapters, runs
from labsupport.chapters import kernels_in_one_token as one_token

pytestmark = pytest.mark.book


def test_book_shows_the_recorded_numbers(built_book):
    published = runs.load_run(one_token.DECLARATION)  # the run the book was built from, in runs/
    html = (built_book / "notebooks" / "kernels_in_one_token.html").read_text()
    text = re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html))
    from labsupport.chapters import shared

    vals = shared.values()  # the page shows the shared eager step with the digits every page shows
    assert vals["eager_kernels"].text in text
    assert f"{vals['eager_matmul_tbs'].text} TB/s" in text and f"{vals['eager_wall_ms'].text} ms" in text
    assert vals["eager_kernels"].run.run_id == published.run_id
    assert published.run_id in text
    pasted = re.findall(r'class="pasted-text">([^<]*)<', html)
    assert len(pasted) >= 40
    assert not [p for p in pasted if p.strip() in ("", "nan", "None", "nan%")]
    cells = [re.sub(r"<[^>]+>", "", c).strip() for c in re.findall(r"<td[^>]*>(.*?)</td>", html, re.S)]
    assert len(cells) > 100
    assert not [c for c in cells if c in ("nan", "None", "NaN", "<NA>")]
    assert "{glue" not in text and "glue:" not in text
    assert (built_book / "book" / "methodology.html").is_file()


def test_timeline_traces_are_downloadable(built_book):
    """Each chapter with a timeline figure links to the raw trace behind it, served with the book."""
    pages = {
        "kernels_in_one_token": "trace.json.gz",
        "what_a_kernel": "burst_trace.json.gz",
        "launch_overhead": "trace-eager.json.gz",
    }
    for page, name in pages.items():
        html = (built_book / "notebooks" / f"{page}.html").read_text()
        links = re.findall(r'href="(\.\./runs/[^"]+)"', html)
        assert any(link.endswith("/" + name) for link in links), page
        for link in links:
            assert (built_book / "notebooks" / link).resolve().is_file(), link
        assert "Perfetto" in html and "chrome://tracing" in html


def test_a_reader_can_download_what_a_chapter_needs(built_book):
    """The page on running a chapter links a labsupport wheel and the requirements, both served
    with the book, and the wheel holds every module of the package."""
    import json
    import zipfile
    from pathlib import Path

    html = (built_book / "book" / "run_it_yourself.html").read_text()
    links = re.findall(r'href="(\.\./download/[^"]+)"', html)
    assert {Path(u).suffix for u in links} == {".whl", ".txt", ".zip"}
    for link in links:
        assert (built_book / "book" / link).resolve().is_file(), link
    # Each chapter's published run (and those it reads) as one zip: runs/ with a published.json.

    zips = {Path(u).stem: (built_book / "book" / u).resolve() for u in links if u.endswith(".zip")}
    assert set(zips) == {c.slug for c in chapters.CHAPTERS}
    for slug, path in zips.items():
        named = json.loads(zipfile.ZipFile(path).read("runs/published.json"))
        assert named[slug] == runs.published_run_id(slug), slug
    wheel = next((built_book / "book" / u).resolve() for u in links if u.endswith(".whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    package = Path(runs.__file__).resolve().parents[1]
    expected = {str(p.relative_to(package.parent)) for p in package.rglob("*.py") if "__pycache__" not in p.parts}
    assert expected <= names


def _serve_runs():
    """book/_ext/serve_runs.py, the extension that packs each chapter's runs."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "book" / "_ext" / "serve_runs.py"
    spec = importlib.util.spec_from_file_location("serve_runs", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.unit
def test_the_page_on_running_a_chapter_gets_a_download_row_for_every_chapter():
    """serve_runs writes the table of downloads where "Run a chapter yourself" has its line: a row
    per chapter of the registry, in book order, named by its notebook's title; a new chapter needs
    no row written by hand."""
    from pathlib import Path

    serve_runs = _serve_runs()
    source = [(Path(__file__).resolve().parent.parent / "book" / "run_it_yourself.md").read_text()]
    assert source[0].count(serve_runs.DOWNLOADS) == 1 and "download/runs/" not in source[0]
    serve_runs._write_downloads(None, "book/run_it_yourself", source)
    rows = [line for line in source[0].splitlines() if "download/runs/" in line]
    assert rows[0] == '| Why a GPU | <a href="../download/runs/why-a-gpu.zip" download>why-a-gpu.zip</a> |'
    hybrid = "hybrid-model-token.zip"
    assert f'| A hybrid model\'s token | <a href="../download/runs/{hybrid}" download>{hybrid}</a> |' in rows
    assert [r.split("download/runs/")[1].split(".zip")[0] for r in rows] == [c.slug for c in chapters.CHAPTERS]
    assert "| chapter | its runs |\n|---|---|\n" + rows[0] in source[0]
    connected = []
    serve_runs.setup(type("App", (), {"connect": lambda self, event, fn, **kw: connected.append((event, fn))})())
    assert ("source-read", serve_runs._write_downloads) in connected


REPLAY = """
import json, sys
from labsupport import runs
from labsupport.chapters import shared
from labsupport.chapters import kernels_in_one_token as ch
run = ch.load()
print(json.dumps({"root": str(runs.runs_root()), "run": run.run_id,
                  "eager_wall_ms": shared.values()["eager_wall_ms"].text}))
"""


def test_a_downloaded_chapter_replays_outside_the_repository(tmp_path):
    """A reader with the package (not a checkout: no _toc.yml beside it) and one chapter's
    download replays it: unpacked beside the notebook (runs/ in the working folder), or
    anywhere with LABSUPPORT_RUNS naming it; without either, load() says no published run."""
    import json
    import shutil
    import subprocess
    import sys
    import zipfile
    from pathlib import Path

    from labsupport.chapters import shared
    from tests.conftest import FIXTURES

    manifest = {p.name: sorted(r.name for r in p.iterdir() if r.is_dir())[-1] for p in FIXTURES.iterdir() if p.is_dir()}
    serve = _serve_runs()
    archives = serve.chapter_archives(FIXTURES, tmp_path / "download", manifest)
    zipped = archives["kernels-in-one-token"]
    names = zipfile.ZipFile(zipped).namelist()
    needed = set(serve.needed("kernels-in-one-token"))
    assert {*shared.OWNERS, "kernels-in-one-token"} <= needed
    assert json.loads(zipfile.ZipFile(zipped).read("runs/published.json")) == {s: manifest[s] for s in needed}
    assert {n.split("/")[1] for n in names if n.count("/") > 2} == needed

    site = tmp_path / "site"  # the package as the wheel installs it, away from the repository
    shutil.copytree(
        Path(runs.__file__).resolve().parents[1], site / "labsupport", ignore=shutil.ignore_patterns("__pycache__")
    )
    env = {k: v for k, v in __import__("os").environ.items() if k not in ("LABSUPPORT_RUNS", "PYTHONPATH")}
    env["PYTHONPATH"] = str(site)

    def replay(cwd: Path, **extra) -> subprocess.CompletedProcess:
        cwd.mkdir(parents=True, exist_ok=True)
        return subprocess.run(
            [sys.executable, "-c", REPLAY], cwd=cwd, env={**env, **extra}, capture_output=True, text=True, timeout=300
        )

    empty = replay(tmp_path / "empty")
    assert empty.returncode != 0 and "RunError: no published run" in empty.stderr

    reader = tmp_path / "reader"
    zipfile.ZipFile(zipped).extractall(reader)
    beside = replay(reader)
    assert beside.returncode == 0, beside.stderr[-2000:]
    got = json.loads(beside.stdout.strip().splitlines()[-1])
    assert got["run"] == manifest["kernels-in-one-token"]
    assert Path(got["root"]).resolve() == (reader / "runs").resolve()

    elsewhere = replay(tmp_path / "other", LABSUPPORT_RUNS=str(reader / "runs"))
    assert elsewhere.returncode == 0, elsewhere.stderr[-2000:]
    assert json.loads(elsewhere.stdout.strip().splitlines()[-1]) == got


@pytest.mark.unit
def test_the_runs_folder_a_reader_names(monkeypatch, tmp_path):
    """LABSUPPORT_RUNS names the runs folder, `~` allowed; set but empty, it is not set."""
    from pathlib import Path

    from labsupport.runs.paths import runs_root

    monkeypatch.setenv("LABSUPPORT_RUNS", "~/book-runs")
    assert runs_root() == Path.home() / "book-runs"
    monkeypatch.setenv("LABSUPPORT_RUNS", str(tmp_path))
    assert runs_root() == tmp_path
    monkeypatch.setenv("LABSUPPORT_RUNS", "")
    assert runs_root() != Path("")
    monkeypatch.delenv("LABSUPPORT_RUNS")
    assert runs_root() == Path(runs.__file__).resolve().parents[2] / "runs"  # in a checkout: the book's runs/
