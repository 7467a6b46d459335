"""The README's recipe, "Adding a chapter", followed as a newcomer would, in a scratch copy of the
repository: a toy chapter on the tiny model (its folder, its notebook, its _toc.yml line, its line in
the registry), its first run recorded by `python -m labsupport live` on the CPU and frozen as its
fixture by `python -m labsupport fixture`, the declaration and layer checks run on the copy, the
notebook replayed, and the chapter built as a book page whose HTML holds the numbers it glues.
A step of the recipe left out stops the first command that needs it, in a line saying what to add."""

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pandas as pd
import pytest

from labsupport.chapters import cells

from .conftest import REPO

pytestmark = pytest.mark.live

SLUG, PACKAGE = "toy-chapter", "toy_chapter"
NOTEBOOK = f"notebooks/{PACKAGE}.ipynb"
# What the chapter's live run is given on the CPU: its Params fields' `cpu` values (DECLARATION below).
CPU = {"preset": "tiny", "repeats": 3, "device": "cpu"}

# --- the toy chapter, as the recipe writes it -----------------------------------------------------
DECLARATION = '''\
"""What "A toy chapter" declares: its run's files and its parameters."""

from __future__ import annotations

from dataclasses import dataclass

from labsupport.chapters.declaring import DEVICE, REPEATS, Chapter, File, Parameters, param
from labsupport.chapters.rules import preset


@dataclass
class Params(Parameters):
    preset: str = param("qwen3-8b", check=preset(), cpu="tiny")
    repeats: int = param(20, check=REPEATS, smoke=3, cpu=3)
    device: str = param("cuda", check=DEVICE, cpu="cpu")


DECLARATION = Chapter(
    "toy-chapter",
    (File("timings.csv", "every timed trial of each variant", ("variant", "repeat", "wall_ms"), required=True),),
    Params,
)
'''

INIT = '''\
"""Chapter "A toy chapter": one decoder layer's up projection of a model preset, two ways, timed."""

from __future__ import annotations

from .declaration import DECLARATION, Params  # noqa: F401 (the package's, for its notebook)
from .measuring import projections  # noqa: F401 (what the live cell calls)
from .page import US, Page, page  # noqa: F401 (what the page and figure cells call)

CHAPTER, load, progress = DECLARATION.slug, DECLARATION.load, DECLARATION.progress


def headline(run) -> dict:
    return {"wall_ms": float(run.table("timings")["wall_ms"].min())}
'''

MEASURING = '''\
"""What the live cell times: the up projection of one token, as F.linear and as a matmul."""

from __future__ import annotations

from labsupport.measure import models


def projections(preset: str, device: str) -> dict:
    """{variant: call}: one token's hidden state times the preset's up-projection weights."""
    import torch

    cfg = models.preset_config(preset)
    x = torch.randn(1, cfg["hidden_size"], device=device)
    w = torch.randn(cfg["intermediate_size"], cfg["hidden_size"], device=device)
    return {"F.linear": lambda: torch.nn.functional.linear(x, w), "matmul": lambda: torch.matmul(x, w.T)}
'''

PAGE = '''\
"""The page of "A toy chapter": the numbers its prose glues and the table it shows."""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

from labsupport import runs

US = "µs (least of the calls)"  # the table's column of times


@dataclass
class Page:
    run_label: str
    variants: int
    fastest: str
    fastest_us: float
    table: pd.DataFrame = field(metadata={"glue": False})


def page(run: runs.Run) -> Page:
    t = run.table("timings")
    best = (t.groupby("variant").wall_ms.min() * 1e3).sort_values()
    table = pd.DataFrame({"variant": best.index, US: best.values})
    return Page(run.label, len(best), str(best.index[0]), float(best.iloc[0]), table)
'''

LIVE = """\
if mode == "live":
    w = recording.PendingRun(ch.DECLARATION, params, run_id, ceilings=False, progress=ch.progress)
    calls = ch.projections(params.preset, params.device)
    timed = harness.interleaved(calls, device=params.device, rounds=params.repeats, what="per call")
    w.write_table("timings", pd.DataFrame([r for name, t in timed.items() for r in t.rows(variant=name)]))
    run_id = w.write()"""

FIGURE = """\
from labsupport import figures

fig = figures.hbars(p.table.variant, p.table[ch.US], run.label, "One token's up projection", "µs per call")"""


def notebook() -> nbformat.NotebookNode:
    """The toy chapter's notebook: the shared cells (labsupport.chapters.cells), its imports, its
    parameters, one live cell, the load cell, the page cell, the prose with glued numbers, a table
    and the closing box."""
    md, code = nbformat.v4.new_markdown_cell, nbformat.v4.new_code_cell
    hidden = {"tags": ["hide-input"]}
    return nbformat.v4.new_notebook(
        cells=[
            md("# A toy chapter\n\nOne token's up projection, measured on {glue:md}`run_label`."),
            code(cells.BOOTSTRAP, metadata=hidden),
            code(cells.PARAMETERS, metadata={"tags": ["parameters"]}),
            code(cells.ENVIRONMENT.replace("{slug}", SLUG), metadata=hidden),
            code(
                "import pandas as pd\n\nfrom labsupport.chapters import toy_chapter as ch\n"
                "from labsupport.measure import harness, recording"
            ),
            code(cells.PARAMS),
            code(LIVE),
            code("run = ch.load(run_id)\nprint(run.label)"),
            code("from labsupport import glue\n\np = ch.page(run)\nglue.glue_page(p)", metadata=hidden),
            md(
                "Of {glue:text}`variants` ways, {glue:md}`fastest` was the fastest: "
                "{glue:text}`fastest_us:.3f` µs per call."
            ),
            code('glue.table(p.table, csv_href=glue.run_csv_href(run, "timings.csv"))', metadata=hidden),
            code(FIGURE, metadata=hidden),
            code("from labsupport.chapters import data_files\n\ndata_files.about_this_run(run)", metadata=hidden),
        ],
        metadata={"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
    )


# --- the scratch copy ------------------------------------------------------------------------------
COPIED = ("labsupport", "notebooks", "book", "_toc.yml", "_config.yml", "pyproject.toml", "requirements-gpubox.txt")
# The checks the README names, run on the scratch copy, and what they need of tests/ (the fixture runs).
CHECKS = (
    "tests/test_declarations.py",
    "tests/test_layers.py",
    "tests/test_params.py::test_every_default_smoke_and_cpu_value_passes_its_check",
    "tests/test_params.py::test_every_numeric_parameter_has_a_check_with_an_upper_bound",
)
TESTS = (
    "__init__.py",
    "conftest.py",
    "figure_probe.py",
    "test_declarations.py",
    "test_layers.py",
    "test_params.py",
    "fixtures",
)


def scratch_copy(dest: Path, tests: bool) -> Path:
    """The repository's code, pages and configuration (its runs left out) under `dest`."""
    ignore = shutil.ignore_patterns("__pycache__", ".ipynb_checkpoints")
    for name in COPIED:
        src = REPO / name
        (shutil.copytree(src, dest / name, ignore=ignore) if src.is_dir() else shutil.copy(src, dest / name))
    (dest / "tests").mkdir()
    for name in TESTS if tests else ():
        src = REPO / "tests" / name
        (
            shutil.copytree(src, dest / "tests" / name, ignore=ignore)
            if src.is_dir()
            else shutil.copy(src, dest / "tests" / name)
        )
    return dest


def add_folder(repo: Path) -> None:
    """Step 1: the folder labsupport/chapters/toy_chapter/."""
    folder = repo / "labsupport" / "chapters" / PACKAGE
    folder.mkdir()
    for name, text in (("declaration", DECLARATION), ("__init__", INIT), ("measuring", MEASURING), ("page", PAGE)):
        (folder / f"{name}.py").write_text(text)


def add_to_registry(repo: Path) -> None:
    """Step 1, last: the registry imports the package and lists it in PACKAGES, where _toc.yml has it."""
    path = repo / "labsupport" / "chapters" / "__init__.py"
    text = path.read_text()
    last = "    one_token_two_gpus,\n"
    assert text.count(last) == 2, "the registry's import list and PACKAGES each end with one_token_two_gpus"
    path.write_text(text.replace(last, last + f"    {PACKAGE},\n"))


def add_notebook(repo: Path) -> None:
    """Step 2: the notebook, without outputs."""
    nbformat.write(notebook(), repo / NOTEBOOK)


def add_to_toc(repo: Path) -> None:
    """Step 3: the notebook's line in _toc.yml, after the last chapter."""
    path = repo / "_toc.yml"
    last = "      - file: notebooks/one_token_two_gpus\n"
    assert last in path.read_text(), "_toc.yml's chapters end with one_token_two_gpus"
    path.write_text(path.read_text().replace(last, last + f"      - file: notebooks/{PACKAGE}\n"))


def run_in(repo: Path, *args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    """`python -m ...` in the scratch copy, which imports its own labsupport, with its own runs folder."""
    env = {**os.environ, "PYTHONPATH": str(repo), "LABSUPPORT_RUNS": str(repo / "runs")}
    for name in ("LABSUPPORT_LIVE_DIR", "LABSUPPORT_SMOKE_DIR"):
        env.pop(name, None)
    return subprocess.run(
        [sys.executable, "-m", *args], cwd=repo, env=env, capture_output=True, text=True, timeout=timeout
    )


def ok(done: subprocess.CompletedProcess) -> str:
    assert done.returncode == 0, (
        f"{' '.join(done.args[2:])} exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    )
    return done.stdout


def test_the_recipe_builds_a_toy_chapter(tmp_path):
    """Steps 1 to 4 of the README, then the chapter's notebook run live through papermill (by the
    `live` command), checked, replayed and built: 35 to 85 s on two shared CPU cores."""
    repo = scratch_copy(tmp_path / "repo", tests=True)
    took = {}
    t = time.perf_counter()
    add_folder(repo)
    add_notebook(repo)
    add_to_toc(repo)
    add_to_registry(repo)

    # Step 4: its first run, recorded live (here on the CPU with the tiny model) and published,
    # then frozen as its fixture.
    cpu = [a for name, value in CPU.items() for a in ("--param", f"{name}={json.dumps(value)}")]
    out = ok(run_in(repo, "labsupport", "live", SLUG, "--allow-cpu", *cpu))
    run_id = json.loads((repo / "runs" / "published.json").read_text())[SLUG]
    assert f"{SLUG}: published run {run_id}" in out
    took["live"] = time.perf_counter() - t
    ok(run_in(repo, "labsupport", "fixture", SLUG))
    frozen = repo / "tests" / "fixtures" / "runs" / SLUG / run_id
    assert (frozen / "timings.csv").is_file() and (frozen / "meta.json").is_file()
    assert json.loads((frozen.parents[1] / "published.json").read_text())[SLUG] == run_id

    # The checks the README names, on the copy: names, imports, the registry's order, the notebook's
    # shared cells, every file described (the toy chapter's fixture run among them).
    t = time.perf_counter()
    checked = ok(run_in(repo, "pytest", "-v", "-p", "no:cacheprovider", "-n", "0", *CHECKS))
    on_toy = [line for line in checked.splitlines() if f"[{SLUG}]" in line]
    assert len(on_toy) >= 9 and all(" PASSED " in line for line in on_toy), "\n".join(on_toy)
    took["checks"] = time.perf_counter() - t

    # The notebook replayed, from the published run.
    t = time.perf_counter()
    replayed = tmp_path / "replayed.ipynb"
    ok(
        run_in(
            repo,
            "papermill",
            NOTEBOOK,
            str(replayed),
            "--cwd",
            str(repo / "notebooks"),
            "-k",
            "python3",
            "-p",
            "mode",
            "replay",
        )
    )
    (loaded,) = [c for c in nbformat.read(replayed, as_version=4).cells if c.source.startswith("run = ch.load")]
    assert f"run {run_id}" in loaded.outputs[0].text  # the published run, recorded above
    took["replay"] = time.perf_counter() - t

    # The book, with the toy chapter its only chapter: the numbers the prose glues are in the HTML,
    t = time.perf_counter()
    # with the page of downloads (and the two pages it links to), where its runs' row is written.
    pages = "".join(f"  - file: book/{name}\n" for name in ("run_it_yourself", "trust", "gallery"))
    (repo / "_toc.yml").write_text(f"format: jb-book\nroot: notebooks/{PACKAGE}\nchapters:\n{pages}")
    ok(
        run_in(
            repo,
            "labsupport.ops.jupyterbook_parallel",
            "build",
            str(repo),
            "--all",
            "--warningiserror",
            "--keep-going",
            "--builder",
            "html",
        )
    )
    html = (repo / "_build" / "html" / "notebooks" / f"{PACKAGE}.html").read_text()
    took["book"] = time.perf_counter() - t
    print(f"recipe steps took (s): { {k: round(v) for k, v in took.items()} }")
    best = pd.read_csv(frozen / "timings.csv").groupby("variant").wall_ms.min().sort_values() * 1e3
    glued = f'Of <span class="pasted-text">2</span> ways, {best.index[0]} was the fastest: '
    assert f'{glued}<span class="pasted-text">{best.iloc[0]:.3f}</span> µs per call.' in html
    assert f"measured on none (CPU) · run {run_id}" in html and "{glue" not in html
    # the figure, with its alt text from the figure's description (book/_ext/figure_alt.py)
    assert "<img alt=\"Figure. One token's up projection: horizontal axis: µs per call;" in html
    assert f'smallest: {best.index[0]}, {best.iloc[0]:.2f}."' in html
    # its runs served as one zip, and its row on the page of downloads (book/_ext/serve_runs.py)
    assert (repo / "_build" / "html" / "download" / "runs" / f"{SLUG}.zip").is_file()
    downloads = (repo / "_build" / "html" / "book" / "run_it_yourself.html").read_text()
    assert f'<a href="../download/runs/{SLUG}.zip" download>{SLUG}.zip</a>' in downloads


# Each step of the recipe, undone in a scratch copy that has all the others; the command that needs
# it, and the line it stops with (the last of its standard error).
WITHOUT = {
    "the registry's line": (
        add_to_registry,
        ("labsupport", "live", SLUG, "--allow-cpu"),
        "unknown chapter(s) toy-chapter (a chapter is a package listed in PACKAGES, "
        "labsupport/chapters/__init__.py); known: why-a-gpu,",
    ),
    "the _toc.yml line": (
        add_to_toc,
        ("labsupport", "book"),
        "make book failed: notebooks/toy_chapter (PACKAGES, labsupport/chapters/__init__.py) has no line in "
        "_toc.yml: add `- file: notebooks/toy_chapter`",
    ),
    "the fixture run": (
        None,
        ("pytest", "-q", "-p", "no:cacheprovider", "-n", "0", "tests/test_layers.py", "-k", "described and toy"),
        "no fixture run of toy-chapter under tests/fixtures/runs/: python -m labsupport fixture toy-chapter",
    ),
}


@pytest.mark.parametrize("step", WITHOUT)
def test_a_step_left_out_stops_in_a_line_saying_what_to_add(tmp_path, step):
    repo = scratch_copy(tmp_path / "repo", tests=step == "the fixture run")
    left_out, args, line = WITHOUT[step]
    for add in (add_folder, add_notebook, add_to_toc, add_to_registry):
        if add is not left_out:
            add(repo)
    done = run_in(repo, *args, timeout=300)
    assert done.returncode != 0 and line in done.stdout + done.stderr, f"{done.stdout[-2000:]}\n{done.stderr[-2000:]}"


def test_a_package_that_exports_no_declaration_is_named_by_the_registry(tmp_path):
    """A chapter's __init__.py left empty: every command stops, its last line saying what is missing."""
    repo = scratch_copy(tmp_path / "repo", tests=False)
    for add in (add_folder, add_notebook, add_to_toc, add_to_registry):
        add(repo)
    init = repo / "labsupport" / "chapters" / PACKAGE / "__init__.py"
    init.write_text('"""Chapter "A toy chapter"."""\n')
    done = run_in(repo, "labsupport", "runs", timeout=300)
    assert done.returncode != 0 and done.stderr.strip().splitlines()[-1] == (
        "ImportError: labsupport.chapters.toy_chapter has no DECLARATION: its __init__.py imports it from its "
        "declaration.py"
    )


@pytest.mark.unit
def test_the_fixture_command_copies_a_whole_run_once_and_names_it(tmp_path):
    """`python -m labsupport fixture`: the published run (or one by id) copied whole beside the
    fixtures' manifest, which names it; a chapter with no published run, or a run frozen already,
    is one line and leaves the fixtures as they were."""
    from labsupport import runs
    from labsupport.ops import fixture

    from .conftest import FIXTURES, tree_bytes

    slug = "what-a-kernel"
    run_id = runs.published(FIXTURES)[slug]
    frozen = tmp_path / "fixtures"
    (frozen / slug / "20200101T000000Z-old").mkdir(parents=True)
    (frozen / "published.json").write_text(json.dumps({"why-a-gpu": "x"}))
    dest = fixture.freeze(slug, root=FIXTURES, fixtures=frozen)
    assert tree_bytes(dest) == tree_bytes(FIXTURES / slug / run_id)
    assert json.loads((frozen / "published.json").read_text()) == {"why-a-gpu": "x", slug: run_id}
    assert [p.name for p in (frozen / slug).iterdir()] == [run_id]  # the older fixture run replaced
    before = tree_bytes(frozen)
    with pytest.raises(runs.RunError, match=f"^{dest} is there already; nothing was copied$"):
        fixture.freeze(slug, run_id, root=FIXTURES, fixtures=frozen)
    empty = tmp_path / "runs"
    empty.mkdir()
    (empty / "published.json").write_text("{}")
    with pytest.raises(runs.RunError, match=f"^{slug} has no published run in {empty}: record one"):
        fixture.freeze(slug, root=empty, fixtures=frozen)
    assert tree_bytes(frozen) == before
