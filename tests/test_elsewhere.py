"""Running a chapter elsewhere: the Colab launch button only where the build knows the GitHub
repository (labsupport.ops.bookbuild), the notebooks' first code cell that installs the served
labsupport wheel where labsupport is missing, and the "Open in Perfetto" link beside each trace."""

import functools
import json
import re
import shutil
import subprocess
import sys
import threading
import venv
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import nbformat
import pytest
import yaml

from labsupport import chapters, glue
from labsupport.chapters import data_files
from labsupport.ops import bookbuild

from .conftest import REPO

pytestmark = pytest.mark.unit

VERSION = re.search(r'^version = "([^"]+)"', (REPO / "pyproject.toml").read_text(), re.M).group(1)
WHEEL = f"labsupport-{VERSION}-py3-none-any.whl"


# The Colab button -----------------------------------------------------------------------------


def test_no_repository_no_button():
    assert bookbuild.repository({}) is None
    assert "repository" not in yaml.safe_load((REPO / "_config.yml").read_text())  # nothing committed
    assert "launch_buttons" not in yaml.safe_load((REPO / "_config.yml").read_text())
    # GitHub Actions on another server (GitHub Enterprise): Colab opens github.com only
    assert bookbuild.repository({"GITHUB_REPOSITORY": "o/r", "GITHUB_SERVER_URL": "https://git.example.com"}) is None
    assert bookbuild.repository({"GITHUB_REPOSITORY": "o/r"}) is None  # no ref, no commit: no link to make


def test_the_repository_from_github_actions_or_the_variable():
    push = {"GITHUB_REPOSITORY": "lab/book", "GITHUB_SERVER_URL": "https://github.com", "GITHUB_REF": "refs/heads/main"}
    assert bookbuild.repository(push) == {"url": "https://github.com/lab/book", "branch": "main", "path_to_book": ""}
    pr = {**push, "GITHUB_REF": "refs/pull/7/merge", "GITHUB_SHA": "a" * 40}
    assert bookbuild.repository(pr)["branch"] == "a" * 40  # not a branch: the commit built
    given = {"LABSUPPORT_REPOSITORY": "https://github.com/me/fork.git", **push}
    assert bookbuild.repository(given) == {"url": "https://github.com/me/fork", "branch": "main", "path_to_book": ""}
    given["LABSUPPORT_REPOSITORY_BRANCH"] = "dev"
    assert bookbuild.repository(given)["branch"] == "dev"
    with pytest.raises(bookbuild.BuildError, match="not a GitHub repository"):
        bookbuild.repository({"LABSUPPORT_REPOSITORY": "https://gitlab.com/me/book"})


def test_the_launch_config_gives_every_notebook_page_a_colab_button(tmp_path):
    """The configuration the build passes with --config, read as jupyter-book reads it: the
    theme's repository and Colab launch button, the local extensions still found."""
    from jupyter_book.config import get_final_config

    repo = {"url": "https://github.com/lab/book", "branch": "main", "path_to_book": ""}
    path = tmp_path / "_config.yml"
    path.write_text(yaml.safe_dump(bookbuild.launch_config(repo), sort_keys=False))
    before = list(sys.path)
    try:
        config, _ = get_final_config(user_yaml=path, sourcedir=REPO, cli_config={"latex_individualpages": False})
    finally:
        sys.path[:] = before
    theme = config["html_theme_options"]
    assert theme["repository_url"] == repo["url"] and theme["repository_branch"] == "main"
    assert theme["launch_buttons"]["colab_url"] == "https://colab.research.google.com"
    assert not theme.get("use_repository_button") and not theme.get("use_issues_button")
    committed = yaml.safe_load((REPO / "_config.yml").read_text())
    for name in committed["sphinx"]["local_extensions"]:
        assert name in config["extensions"]
        folder = Path(bookbuild.launch_config(repo)["sphinx"]["local_extensions"][name])
        assert (folder / f"{name}.py").is_file(), name
    assert config["html_js_files"] == committed["sphinx"]["config"]["html_js_files"]


def test_the_launch_button_stays_on_ipynb_pages_only():
    """Colab opens .ipynb files only: book/_ext/launch_notebooks_only.py takes the theme's launch
    buttons off a MyST Markdown page (book/methodology.md) and leaves them on a notebook's."""
    import importlib.util
    from types import SimpleNamespace

    path = REPO / "book" / "_ext" / "launch_notebooks_only.py"
    spec = importlib.util.spec_from_file_location("launch_notebooks_only", path)
    ext = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ext)
    suffix = {"book/methodology": ".md", "notebooks/why_a_gpu": ".ipynb"}
    app = SimpleNamespace(env=SimpleNamespace(doc2path=lambda name: REPO / (name + suffix[name])))
    for page, kept in (("book/methodology", False), ("notebooks/why_a_gpu", True)):
        buttons = [{"label": "download-buttons"}, {"label": "launch-buttons", "buttons": [{"text": "Colab"}]}]
        ext._drop_launch_buttons(app, page, "page.html", {"header_buttons": buttons}, None)
        assert [b["label"] for b in buttons] == ["download-buttons", *(["launch-buttons"] if kept else [])], page
    assert "launch_notebooks_only" in yaml.safe_load((REPO / "_config.yml").read_text())["sphinx"]["local_extensions"]


# The install cell -----------------------------------------------------------------------------


def _install_cell(chapter) -> nbformat.NotebookNode:
    nb = nbformat.read(chapter.path, as_version=4)
    assert nb.cells[0].cell_type == "markdown" and nb.cells[0].source.startswith("# ")
    return nb.cells[1]


def test_every_chapter_starts_with_the_same_install_cell():
    cells = [_install_cell(c) for c in chapters.CHAPTERS]
    assert all(c.cell_type == "code" and c.metadata.get("tags") == ["hide-input"] for c in cells)
    assert len({c.source for c in cells}) == 1
    source = cells[0].source
    assert f'"{WHEEL}"' in source  # the name serve_package's wheel has (pyproject's version)
    assert "requirements-gpubox.txt" in source and "LABSUPPORT_BOOK_URL" in source


def test_the_install_cell_does_nothing_where_labsupport_imports(capsys):
    ns = {}
    exec(_install_cell(chapters.CHAPTERS[0]).source, ns)
    assert capsys.readouterr().out == ""
    assert "wheels" not in ns


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """A wheel of this checkout's labsupport, built as serve_package builds the served one."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    shutil.copytree(REPO / "labsupport", src / "labsupport", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", src / "pyproject.toml")
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp), str(src)]
    subprocess.run(cmd, check=True, capture_output=True, timeout=300)
    return tmp / WHEEL


def _fresh_python(where: Path) -> Path:
    """The python of a new virtual environment, with pip and nothing else (no labsupport)."""
    venv.EnvBuilder(with_pip=True).create(where)
    return where / "bin" / "python"


def _run_cell(python: Path, cwd: Path, **env) -> subprocess.CompletedProcess:
    source = _install_cell(chapters.CHAPTERS[0]).source
    # No index here: the wheel alone, without the numpy, pandas and matplotlib it declares (installing
    # those from the index is tests/test_replay_command.py's fresh venv).
    clean = {"PATH": "/usr/bin:/bin", "HOME": str(cwd), "PIP_NO_INDEX": "1", "PIP_NO_DEPS": "1"}
    clean["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return subprocess.run(
        [str(python), "-c", source + "\nimport labsupport; print(labsupport.__file__)"],
        cwd=cwd,
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=300,
    )


def _installed(r: subprocess.CompletedProcess, python: Path, said: str) -> None:
    assert r.returncode == 0, r.stderr[-3000:]
    lines = r.stdout.strip().splitlines()
    assert lines[0] == said and len(lines) == 2, r.stdout
    assert Path(lines[1]).resolve().is_relative_to(python.parent.parent.resolve())  # the venv's, not the repo's


def test_the_install_cell_installs_the_wheel_beside_the_notebook(tmp_path, wheel):
    """An empty folder with the downloaded wheel (and requirements-gpubox.txt, here holding no
    requirement: pip has no index on this machine): the cell installs it and labsupport imports;
    run again, it says nothing. With neither wheel nor address it stops in one line."""
    python = _fresh_python(tmp_path / "venv")
    reader = tmp_path / "reader"
    reader.mkdir()
    nothing = _run_cell(python, reader)
    assert nothing.returncode != 0
    last = nothing.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: labsupport is not installed: put " + WHEEL), last
    shutil.copy(wheel, reader / WHEEL)
    (reader / "requirements-gpubox.txt").write_text("# the GPU box's requirements (none here)\n")
    r = _run_cell(python, reader)
    _installed(r, python, f"installed {WHEEL} and requirements-gpubox.txt")
    quiet = _run_cell(python, reader)
    assert quiet.returncode == 0 and len(quiet.stdout.strip().splitlines()) == 1  # only the test's own print


def test_the_install_cell_downloads_the_served_wheel(tmp_path, wheel):
    """With LABSUPPORT_BOOK_URL the cell downloads <book>/download/<wheel> and the requirements,
    as serve_package serves them, into the empty folder and installs them."""
    site = tmp_path / "site"
    (site / "download").mkdir(parents=True)
    shutil.copy(wheel, site / "download" / WHEEL)
    (site / "download" / "requirements-gpubox.txt").write_text("# none here\n")
    handler = functools.partial(SimpleHTTPRequestHandler, directory=str(site))
    handler.log_message = lambda *a: None
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        python = _fresh_python(tmp_path / "venv")
        reader = tmp_path / "reader"
        reader.mkdir()
        url = f"http://127.0.0.1:{server.server_address[1]}/"
        r = _run_cell(python, reader, LABSUPPORT_BOOK_URL=url)
    finally:
        server.shutdown()
        server.server_close()
    _installed(r, python, f"installed {WHEEL} and requirements-gpubox.txt")
    assert (reader / WHEEL).read_bytes() == wheel.read_bytes()


# Open in Perfetto ------------------------------------------------------------------------------


def test_every_trace_in_a_data_list_opens_in_perfetto(published):
    html = data_files.data_list_html(published)
    traces = [n for n in published.meta["files"] if data_files.is_trace(n)]
    assert traces
    opened = re.findall(r'class="perfetto-open"[^>]*data-trace="([^"]+)"', html)
    assert sorted(opened) == sorted(f"../runs/{published.chapter}/{published.run_id}/{n}" for n in traces)


def test_a_trace_download_opens_in_perfetto_and_escapes(published):
    html = glue.trace_download(published, "trace.json.gz").data
    assert f'data-trace="../runs/{published.chapter}/{published.run_id}/trace.json.gz"' in html
    link = glue.perfetto_link('../runs/x/"><script>/t.json.gz', "a <b> & c")
    assert "<script>" not in link and "<b>" not in link and 'data-title="a &lt;b&gt; &amp; c"' in link


def test_the_perfetto_script_speaks_the_documented_protocol():
    js = (REPO / "book" / "_static" / "perfetto.js").read_text()
    for part in ('"https://ui.perfetto.dev"', '"PING"', '"PONG"', "perfetto: {", "buffer", "fileName", "title"):
        assert part in js, part
    assert json.dumps("perfetto.js") in json.dumps(yaml.safe_load((REPO / "_config.yml").read_text()))


@pytest.mark.book
def test_built_pages_open_each_trace_in_perfetto(built_book):
    """Every trace a chapter page links for download has an Open in Perfetto link beside it,
    to the same served file; the page loads the script."""
    seen = 0
    for chapter in chapters.CHAPTERS:
        page = built_book / "notebooks" / f"{chapter.path.stem}.html"
        html = page.read_text()
        downloads = {u for u in re.findall(r'href="(\.\./runs/[^"]+\.json\.gz)"', html)}
        opened = set(re.findall(r'class="perfetto-open"[^>]*data-trace="([^"]+)"', html))
        assert downloads == opened, chapter.slug
        for link in opened:
            assert (page.parent / link).resolve().is_file(), link
        assert re.search(r'<script src="\.\./_static/perfetto\.js', html), chapter.slug
        seen += len(opened)
    assert seen > 0


def test_about_this_run_is_one_closed_box_with_provenance_host_and_files(published):
    html = data_files.about_this_run(published).data
    assert html.startswith('<details class="about-run"><summary>About this run: ')
    assert html.count("<details") == 1 and "<details open" not in html, "closed until a reader opens it"
    assert f"<code>{published.run_id}</code>" in html and published.provenance["gpu"] in html
    assert "Host probe" in html or "host probe" in html
    assert all(f"<code>{n}</code>" in html for n in published.meta["files"]), "every file of the run is listed"
    assert "How the numbers were taken" in html and html.count("<th>host: ") == len(published.results["method"]["host"])
