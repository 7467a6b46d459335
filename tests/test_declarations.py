"""One declaration per chapter: the registry entry (labsupport.chapters) is the only place that names
a chapter's files, columns and descriptions, its load() and progress(); a notebook's `parameters`
cell and its chapter's Params dataclass cannot disagree."""

import ast
import dataclasses
import importlib
from pathlib import Path

import pytest

from labsupport import chapters
from labsupport.ops import params as notebook_params

pytestmark = pytest.mark.unit

PACKAGE = Path(__file__).resolve().parent.parent / "labsupport"
REGISTRY = PACKAGE / "chapters" / "__init__.py"
# What the book compares against (published figures), not a run of ours: its tables may share
# a run's column names.
NOT_A_RUN = {PACKAGE / "chapters" / "published.py"}
# Params fields that no notebook parameter sets: what the chapter fixes for every run (sizes of
# its kernels, the model's single token) and the device, which the notebook derives from allow_cpu.
FIXED = {
    "what-a-kernel": {"n", "block", "num_warps", "burst_n", "device"},
    "model-code-to-kernels": {"tokens", "device"},
    "kernels-in-one-token": {"context_repeats", "device"},
    "one-token-two-gpus": {"sweep_iters", "device"},
}


def chapter_module(chapter):
    return importlib.import_module(f"labsupport.chapters.{chapter.module}")


def defaults(cls) -> dict:
    out = {}
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING:
            out[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            out[f.name] = f.default_factory()
        else:
            out[f.name] = dataclasses.MISSING
    return out


@pytest.mark.parametrize("chapter", chapters.CHAPTERS, ids=lambda c: c.slug)
def test_notebook_parameters_and_params_agree(chapter):
    """Every parameter of the notebook (but mode, run_id and allow_cpu, which the command sets) is a
    field of the chapter's Params with the same default; every other field is one the chapter fixes."""
    given = {k: v for k, v in notebook_params.notebook_parameters(chapter).items() if k not in notebook_params.RESERVED}
    cls = getattr(chapter_module(chapter), "Params", None)
    if cls is None:
        return
    fields = defaults(cls)
    assert set(given) <= set(fields), f"{chapter.slug}: notebook parameters not in Params: {set(given) - set(fields)}"
    differ = {k: (given[k], fields[k]) for k in given if given[k] != fields[k]}
    assert not differ, f"{chapter.slug}: notebook default != Params default: {differ}"
    extra = set(fields) - set(given)
    assert extra == FIXED.get(chapter.slug, {"device"}) - set(given), f"{chapter.slug}: Params only: {extra}"
    for name in chapter.checks:
        assert name in given, f"{chapter.slug}: a check on {name}, which the notebook does not define"


@pytest.mark.parametrize("chapter", chapters.CHAPTERS, ids=lambda c: c.slug)
def test_chapter_module_takes_its_name_load_and_progress_from_the_registry(chapter):
    m = chapter_module(chapter)
    assert chapter.slug == m.CHAPTER
    assert m.load.__self__ is chapter and m.progress.__self__ is chapter


def chapter_sources():
    return sorted(p for p in (PACKAGE / "chapters").rglob("*.py") if p != REGISTRY and p not in NOT_A_RUN)


def test_files_columns_and_descriptions_are_declared_once():
    """No chapter module repeats what the registry declares: a list of a table's columns, a run's
    files, a description of a file, a slug as its CHAPTER, or its own load() and progress()."""
    declared = {}
    for c in chapters.CHAPTERS:
        declared |= {tuple(cols): f"{c.slug} {name} columns" for name, cols in c.columns.items()}
        declared[tuple(c.artifacts)] = f"{c.slug} artifacts"
    described = {d: c.slug for c in chapters.CHAPTERS for d in c.describes.values()}
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
def test_every_declared_file_is_described(chapter):
    """Every file the registry names for a chapter (its artifacts, its tables) has its one line."""
    for name in (*chapter.artifacts, *chapter.columns):
        assert chapter.describes.get(name), f"{chapter.slug}: {name} has no description"
