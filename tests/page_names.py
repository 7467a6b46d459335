"""The glue names a chapter notebook's prose uses, against what its cells glue: a chapter's Page
(one field per glue name), the shared quantities (shared.glue_values) and a code cell's own glue."""

from __future__ import annotations

import dataclasses
import json
import re

from labsupport.chapters import shared

from .conftest import REPO

GLUE_ROLE = re.compile(r"\{glue(?::\w+)?\}`([^`:]+)")  # {glue:text}`name:.2f`, {glue:md}`name`, ...
GLUE_DIRECTIVE = re.compile(r"\{glue:\w+\}\s+([A-Za-z0-9_]+)")  # ```{glue:md} name


def prose_names(notebook) -> set[str]:
    """Every glue name the notebook's markdown cells use (`notebook`: its path from the repository root)."""
    cells = json.loads((REPO / notebook).read_text())["cells"]
    prose = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
    return set(GLUE_ROLE.findall(prose)) | set(GLUE_DIRECTIVE.findall(prose))


def page_names(page) -> set[str]:
    """The names glue.glue_page glues of a Page (the class or one page): its fields, less those marked
    {"glue": False}."""
    return {f.name for f in dataclasses.fields(page) if f.metadata.get("glue", True)}


def unglued(notebook: str, page) -> set[str]:
    """The prose's glue names that neither `page`, nor the shared quantities, nor a glue call in one of
    the notebook's code cells (the name as a string literal) provides."""
    cells = json.loads((REPO / notebook).read_text())["cells"]
    code = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
    shared_names = set(shared.QUANTITIES) | {f"shared_run_{owner.replace('-', '_')}" for owner in shared.OWNERS}
    rest = prose_names(notebook) - page_names(page) - shared_names
    return {name for name in rest if not re.search(rf"glue\w*\(\s*f?[\"']{re.escape(name)}[\"']", code)}


def unshown(notebook, page) -> set[str]:
    """The Page's glued fields that the notebook's prose never uses."""
    return page_names(page) - prose_names(notebook)


GLUE_TEXT_ROLE = re.compile(r"\{glue(?::text)?\}`([^`:]+)")  # {glue}`name`, {glue:text}`name:.2f`


def text_roles_on_markdown(notebook, page) -> set[str]:
    """The Page's text fields (glued as Markdown by glue.glue_page, for {glue:md}) that the prose
    uses through {glue:text} or {glue}, which show a Markdown object's repr instead of its words."""
    cells = json.loads((REPO / notebook).read_text())["cells"]
    prose = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
    texts = {f.name for f in dataclasses.fields(page) if f.metadata.get("glue", True) and f.type in (str, "str")}
    return texts & set(GLUE_TEXT_ROLE.findall(prose))
