"""Every piece of labsupport that a page names in code (`labsupport.measure.kernels.megakernel`,
`labsupport/measure/kernels/gemv.py`, `labsupport.measure.models.qwen3_decode.Options`) exists:
a reader who looks for it finds it. Scanned: the notebooks' markdown cells and book/*.md."""

import importlib
import json
import re

import pytest

from .conftest import REPO

pytestmark = pytest.mark.unit

DOTTED = re.compile(r"`(labsupport(?:\.\w+)+)`")
PATH = re.compile(r"`(labsupport/[\w/]+(?:\.py)?)/?`")


def _pages():
    for nb in sorted((REPO / "notebooks").glob("*.ipynb")):
        cells = json.loads(nb.read_text())["cells"]
        yield nb.name, "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
    for md in sorted((REPO / "book").glob("*.md")):
        yield md.name, md.read_text()


def _resolves(dotted: str) -> bool:
    """Whether `dotted` is a module of labsupport, or a name inside one."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for name in parts[cut:]:
            if not hasattr(obj, name):
                return False
            obj = getattr(obj, name)
        return True
    return False


def test_every_module_file_and_name_a_page_gives_exists():
    named = {(page, m) for page, text in _pages() for m in DOTTED.findall(text)}
    paths = {(page, p) for page, text in _pages() for p in PATH.findall(text)}
    assert named and paths  # the pages do name code
    missing = [f"{page}: {m}" for page, m in sorted(named) if not _resolves(m)]
    missing += [f"{page}: {p}" for page, p in sorted(paths) if not (REPO / p).exists()]
    assert not missing, "named on a page, not in the code:\n" + "\n".join(missing)


def test_a_name_that_is_not_there_is_found_missing():
    assert _resolves("labsupport.measure.kernels.megakernel.step")
    assert not _resolves("labsupport.measure.kernels.layer_kernel")
    assert not _resolves("labsupport.measure.kernels.gemv.no_such_function")
