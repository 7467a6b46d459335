"""The book folds a chapter's live measuring cells under one label (book/_ext/fold_measuring.py), on
the doctree of a real chapter page: Sphinx reads it from the notebook's own source, unexecuted."""

import json
import sys
from pathlib import Path

import pytest
from docutils import nodes
from docutils.frontend import get_default_settings
from docutils.parsers.rst import Parser
from docutils.utils import new_document

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "book" / "_ext"))
import fold_measuring  # noqa: E402

pytestmark = pytest.mark.unit


def _page(cells: list[tuple[str, str]]) -> nodes.document:
    """A doctree shaped as myst-nb makes a chapter's: markdown as sections and paragraphs, each code cell
    a container holding its source as a literal block."""
    doc = new_document("chapter", get_default_settings(Parser))
    title = nodes.section(ids=["chapter"])
    title += nodes.title(text="A chapter")
    doc += title
    section = title
    for kind, text in cells:
        if kind == "h2":
            section = nodes.section(ids=[text.lower().replace(" ", "-")])
            section += nodes.title(text=text)
            title += section
        elif kind == "p":
            section += nodes.paragraph(text=text)
        else:
            cell = nodes.container(classes=["cell"])
            cell += nodes.literal_block(text, text)
            section += cell
    return doc


def _notebook_cells(name: str) -> list[tuple[str, str]]:
    """A committed chapter notebook as (kind, text) pieces: its second-level headings, paragraphs and code."""
    cells = []
    for cell in json.loads((REPO / "notebooks" / name).read_text())["cells"]:
        src = "".join(cell["source"])
        if cell["cell_type"] == "code":
            cells.append(("code", src))
            continue
        for block in src.split("\n\n"):
            if block.startswith("## "):
                cells.append(("h2", block.splitlines()[0][3:]))
                block = "\n".join(block.splitlines()[1:])
            if block.strip() and not block.startswith("#"):
                cells.append(("p", block))
    return cells


def _html(doc) -> str:
    return "".join(n.astext() if isinstance(n, nodes.raw) else "" for n in doc.findall(nodes.raw))


@pytest.mark.parametrize("notebook", sorted(p.name for p in (REPO / "notebooks").glob("*.ipynb")))
def test_every_live_cell_of_a_chapter_is_folded_and_the_answer_is_not(notebook):
    doc = _page(_notebook_cells(notebook))
    live = [b for b in doc.findall(nodes.literal_block) if b.astext().lstrip().startswith(fold_measuring.LIVE)]
    folded = fold_measuring.fold_sections(doc)
    if not live:
        assert folded == 0, "a page without live cells (the status page) folds nothing"
        return
    assert folded == 1, "one box per chapter"
    section = next(s for s in doc.findall(nodes.section) if any(isinstance(c, nodes.raw) for c in s.children))
    children = list(section.children)
    opened = next(i for i, c in enumerate(children) if isinstance(c, nodes.raw) and "<details" in c.astext())
    closed = next(i for i, c in enumerate(children) if isinstance(c, nodes.raw) and c.astext() == "</details>")
    inside = children[opened + 1 : closed]
    assert all(any(b is n or b in n.findall(nodes.literal_block) for n in inside) for b in live), "every live cell"
    assert isinstance(children[1], nodes.paragraph) or opened == 1, "the sentence on what is measured stays in view"
    assert fold_measuring.LABEL in children[opened].astext()
    answer = next((s for s in doc.findall(nodes.section) if s["ids"] == ["the-answer"]), None)
    assert answer is None or not any(isinstance(c, nodes.raw) for c in answer.children), "the answer is never folded"
    assert not any(fold_measuring.LIVE in c.astext() for c in children[closed + 1 :]), "nothing live after the box"


def test_a_page_without_live_cells_is_left_as_it_is():
    doc = _page([("h2", "The answer"), ("p", "It is fast."), ("code", "run = ch.load(run_id)")])
    before = doc.pformat()
    assert fold_measuring.fold_sections(doc) == 0 and doc.pformat() == before


def test_live_cells_in_a_subsection_fold_it_whole_and_the_load_after_it_stays_out():
    doc = _page([("h2", "What is measured"), ("p", "One decode step, timed and profiled.")])
    outer = list(doc.findall(nodes.section))[-1]
    sub = nodes.section(ids=["the-measuring-code"])
    sub += nodes.title(text="The measuring code")
    cell = nodes.container(classes=["cell"])
    cell += nodes.literal_block("", 'if mode == "live":\n    w = ch.pending_run(params, run_id)')
    sub += cell
    outer += sub
    load = nodes.container(classes=["cell"])
    load += nodes.literal_block("", "run = ch.load(run_id)")
    outer += load
    assert fold_measuring.fold_sections(doc) == 1
    kinds = [type(c).__name__ if not isinstance(c, nodes.raw) else c.astext()[:8] for c in outer.children]
    assert kinds == ["title", "paragraph", "<details", "section", "</detail", "container"]
