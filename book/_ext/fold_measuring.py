"""Sphinx extension: a chapter's measuring code, folded in the book under one label.

A chapter notebook measures in visible cells that run only live (`if mode == "live":`); in the
book, which replays a recorded run, they do nothing, yet they stood between a chapter's answer
and its first figure. This folds them where they stand, with no change to the notebook (where
they stay visible and runnable): in the section that holds live cells, its first paragraph (what
the code measures, in a sentence) stays in view, and everything from there to the last live cell
goes into one closed <details> box, "The code that measured this". What follows the last live
cell (loading the run, a slow-host warning) stays outside.
"""

from __future__ import annotations

from docutils import nodes

LIVE = 'if mode == "live":'
LABEL = "The code that measured this (it runs on a GPU, when the notebook runs live)"


def _has_live_cell(node: nodes.Node) -> bool:
    return any(b.astext().lstrip().startswith(LIVE) for b in node.findall(nodes.literal_block))


def fold_sections(doctree: nodes.Node) -> int:
    """Fold the live cells of every chapter section (a second-level heading) that holds them; returns
    how many were folded. The children after the section's title and its first paragraph, up to the
    last child holding a live cell, go into the box; a subsection holding live cells is folded whole."""
    folded = 0
    for section in list(doctree.findall(nodes.section)):
        parent = section.parent
        if not (isinstance(parent, nodes.section) and isinstance(parent.parent, nodes.document)):
            continue  # the page's title section, or a subsection: the chapter section decides
        children = list(section.children)
        live = [i for i, c in enumerate(children) if _has_live_cell(c)]
        if not live:
            continue
        first_paragraph = next((i for i, c in enumerate(children) if isinstance(c, nodes.paragraph)), 0)
        start = min(first_paragraph + 1, live[0])
        opening = f'<details class="measuring-code"><summary>{LABEL}</summary>'
        section.insert(live[-1] + 1, nodes.raw("", "</details>", format="html"))
        section.insert(start, nodes.raw("", opening, format="html"))
        folded += 1
    return folded


def _fold(app, doctree, docname):
    if app.builder.format == "html":
        fold_sections(doctree)


def setup(app):
    app.connect("doctree-resolved", _fold)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
