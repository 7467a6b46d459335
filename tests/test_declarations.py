"""One declaration per chapter, in its own folder (labsupport/chapters/<package>/declaration.py): the
only place that names a chapter's files, columns and descriptions, its parameters with their checks,
and its load() and progress(); the registry only lists the chapters, in the book's order."""

import ast
import dataclasses
import importlib
import json
from pathlib import Path

import pytest
import yaml

from labsupport import chapters
from labsupport.chapters import cells

pytestmark = pytest.mark.unit

PACKAGE = Path(__file__).resolve().parent.parent / "labsupport"
REGISTRY = PACKAGE / "chapters" / "__init__.py"
# What the book compares against (published figures), not a run of ours: its tables may share
# a run's column names. And the declarations themselves.
NOT_A_RUN = {PACKAGE / "chapters" / "published.py", PACKAGE / "chapters" / "declaring.py"}


def chapter_module(chapter):
    return importlib.import_module(f"labsupport.chapters.{chapter.module}")


def test_the_registry_lists_the_chapters_in_the_order_of_the_table_of_contents():
    assert chapters.toc_problem(PACKAGE.parent / "_toc.yml") is None


def _toc_with(folder: Path, change) -> Path:
    """A copy of _toc.yml in `folder` whose chapters' list `change` has edited in place."""
    toc = yaml.safe_load((PACKAGE.parent / "_toc.yml").read_text())
    change(toc["parts"][0]["chapters"])
    folder.mkdir()
    path = folder / "_toc.yml"
    path.write_text(yaml.safe_dump(toc, sort_keys=False))
    return path


def test_a_table_of_contents_that_disagrees_with_the_registry_says_what_to_add(tmp_path, monkeypatch):
    """A newcomer who forgot the registry's line, or the _toc.yml line, is told which, in one line;
    `python -m labsupport book` stops on it before building."""
    from labsupport.ops import bookbuild

    extra = _toc_with(tmp_path / "extra", lambda cs: cs.append({"file": "notebooks/no_such_chapter"}))
    assert chapters.toc_problem(extra) == (
        "_toc.yml has notebooks/no_such_chapter, a chapter of no package in PACKAGES: import it, list it "
        "(labsupport/chapters/__init__.py)"
    )
    last = chapters.CHAPTERS[-1].notebook.removesuffix(".ipynb")
    missing = _toc_with(tmp_path / "missing", lambda cs: cs.remove({"file": last}))
    assert chapters.toc_problem(missing) == (
        f"{last} (PACKAGES, labsupport/chapters/__init__.py) has no line in _toc.yml: add `- file: {last}`"
    )
    swapped = _toc_with(tmp_path / "swapped", lambda cs: cs.insert(0, cs.pop(1)))
    assert "lists the chapters in another order than _toc.yml" in chapters.toc_problem(swapped)
    monkeypatch.setattr(bookbuild, "REPO_ROOT", extra.parent)
    monkeypatch.setattr(bookbuild, "check_runs", lambda root: pytest.fail("the runs were read before the toc"))
    with pytest.raises(bookbuild.BuildError, match="^_toc.yml has notebooks/no_such_chapter, a chapter of no package"):
        bookbuild.build(tmp_path / "runs")


def test_a_package_without_a_declaration_and_an_unknown_chapter_are_one_line(monkeypatch):
    import types

    with pytest.raises(ImportError, match=r"^labsupport.chapters.no_such_chapter has no DECLARATION: its __init__.py"):
        chapters.declaration_of(types.ModuleType("labsupport.chapters.no_such_chapter"))
    with pytest.raises(SystemExit, match=r"unknown chapter\(s\) no-such-chapter \(a chapter is a package listed in"):
        chapters.find(["no-such-chapter"])


def test_the_registry_is_short_and_registers_nothing():
    """At most 200 lines: the types, the ordered list, the look-ups; no chapter is declared in it."""
    source = REGISTRY.read_text()
    assert len(source.splitlines()) <= 200
    assert "Chapter(" not in source and "File(" not in source


@pytest.mark.parametrize("chapter", chapters.CHAPTERS, ids=lambda c: c.slug)
def test_chapter_declares_itself_in_its_folder(chapter):
    path = PACKAGE / "chapters" / chapter.module / "declaration.py"
    m = importlib.import_module(f"labsupport.chapters.{chapter.module}.declaration")
    assert path.is_file() and m.DECLARATION is chapter and chapter.params is m.Params
    assert chapter_module(chapter).Params is m.Params and chapter_module(chapter).DECLARATION is chapter


@pytest.mark.parametrize("chapter", chapters.CHAPTERS, ids=lambda c: c.slug)
def test_chapter_module_takes_its_name_load_and_progress_from_its_declaration(chapter):
    m = chapter_module(chapter)
    assert chapter.slug == m.CHAPTER
    assert m.load.__self__ is chapter and m.progress.__self__ is chapter


@pytest.mark.parametrize("chapter", chapters.CHAPTERS, ids=lambda c: c.slug)
def test_every_parameter_check_smoke_and_cpu_value_is_on_a_field(chapter):
    """A parameter is written once: its field in Params carries its default, check, smoke and CPU
    values; the chapter's checks, smoke and cpu are read from the fields."""
    names = [f.name for f in dataclasses.fields(chapter.params)]
    assert "device" in names and set(chapter.checks) | set(chapter.smoke) | set(chapter.cpu) <= set(names)
    assert chapter.defaults == dataclasses.asdict(chapter.params())
    assert not chapter.cpu or chapter.cpu["device"] == "cpu"  # a CPU path is the tiny model on the CPU


def chapter_sources():
    return sorted(
        p
        for p in (PACKAGE / "chapters").rglob("*.py")
        if p != REGISTRY and p not in NOT_A_RUN and p.name != "declaration.py"
    )


def test_files_columns_and_descriptions_are_declared_once():
    """No chapter module repeats what its declaration says: a list of a table's columns, a run's
    files, a description of a file, a slug as its CHAPTER, or its own load() and progress()."""
    declared = {}
    for c in chapters.CHAPTERS:
        declared |= {tuple(f.columns): f"{c.slug} {f.name} columns" for f in c.files if f.columns}
        declared[tuple(c.artifacts)] = f"{c.slug} artifacts"
    described = {f.describes: c.slug for c in chapters.CHAPTERS for f in c.files}
    slugs = {c.slug for c in chapters.CHAPTERS}
    found = []
    for path in chapter_sources():
        tree = ast.parse(path.read_text())
        where = path.relative_to(PACKAGE)
        for node in ast.walk(tree):
            if isinstance(node, (ast.Tuple, ast.List)) and node.elts:
                try:
                    value = tuple(ast.literal_eval(node))
                except (ValueError, TypeError, SyntaxError):
                    continue
                if all(isinstance(v, str) for v in value) and value in declared:
                    found.append(f"{where}:{node.lineno} repeats the registry's {declared[value]}")
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in described:
                found.append(f"{where}:{node.lineno} repeats a description of {described[node.value]}'s files")
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and node.name in ("load", "progress"):
                found.append(f"{where}:{node.lineno} defines its own {node.name}()")
            names_chapter = isinstance(node, ast.Assign) and any(
                getattr(t, "id", None) == "CHAPTER" for t in node.targets
            )
            if names_chapter and isinstance(node.value, ast.Constant) and node.value.value in slugs:
                found.append(f"{where}:{node.lineno} names its chapter's slug")
            if isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                if any(getattr(t, "id", None) == "DESCRIPTIONS" for t in targets):
                    found.append(f"{where}:{node.lineno} declares DESCRIPTIONS")
    assert not found, "\n".join(found)


@pytest.mark.parametrize("chapter", chapters.CHAPTERS, ids=lambda c: c.slug)
def test_every_declared_file_is_described_once(chapter):
    """Every file a chapter declares has its one line, and no name is declared twice."""
    names = [f.name for f in chapter.files]
    assert len(names) == len(set(names))
    for f in chapter.files:
        assert f.describes.strip(), f"{chapter.slug}: {f.name} has no description"
        assert chapter.describe(f.name.format(tp=1, rank=0, choice="symm-mem")), f.name


def test_a_family_of_files_is_one_pattern():
    """One token on two GPUs' traces, one per degree, rank and form: one File each form."""
    two = chapters.by_slug("one-token-two-gpus")
    assert two.describe("trace-tp2-rank1-cuda-graph.json.gz") == "the raw trace of rank 1's CUDA-graph replay at TP=2"
    assert two.describe("trace-split-tp2-rank0-symm-mem.json.gz").endswith("at TP=2, all-reduce symm-mem")
    assert two.describe("trace-tp2-rank1-other.json.gz") is None and two.describe("trace-tp2.json.gz") is None


def _code_cells(chapter) -> list[dict]:
    nb = json.loads(chapter.path.read_text())
    return [c for c in nb["cells"] if c["cell_type"] == "code"]


def _source(cell) -> str:
    return "".join(cell["source"])


@pytest.mark.parametrize("chapter", chapters.CHAPTERS, ids=lambda c: c.slug)
def test_every_notebook_opens_with_the_cells_written_once_in_the_package(chapter):
    """The install cell, the parameters cell (mode, run_id, overrides: nothing else), the
    environment check and the cell that shows the run's Params are labsupport.chapters.cells' texts,
    exactly; the live cells read every parameter from `params`."""
    code = _code_cells(chapter)
    assert _source(code[0]) == cells.BOOTSTRAP and code[0]["metadata"].get("tags") == ["hide-input"]
    (parameters,) = [c for c in code if "parameters" in c["metadata"].get("tags", [])]
    assert _source(parameters) == cells.PARAMETERS and len(cells.PARAMETERS.splitlines()) <= 6
    env = [c for c in code if "environment.check(" in _source(c)]
    assert [_source(c) for c in env] == [cells.ENVIRONMENT.replace("{slug}", chapter.slug)]
    imports = next(i for i, c in enumerate(code) if f"import {chapter.module} as ch" in _source(c))
    assert _source(code[imports + 1]) == cells.PARAMS and not code[imports + 1]["metadata"].get("tags")
    before_load = code[: next(i for i, c in enumerate(code) if "run = ch.load(run_id)" in _source(c))]
    assert not any("allow_cpu" in _source(c) or "ch.Params(" in _source(c) for c in before_load[imports + 2 :])
