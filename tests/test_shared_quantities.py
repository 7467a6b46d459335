"""One quantity, one number: every shared quantity (labsupport.chapters.shared.QUANTITIES) has
one value in the whole book, the one its owner chapter's published run gives.

- On the built book: every value glued under a shared name, on any page, is the same text, and
  equals `shared.values()[name].text`; `shared_run_<owner>` names the owner's published run.
  The build leaves each page's glued values in _build/jupyter_execute/<page>.glue.json (myst-nb
  takes them out of the executed notebook; each is an output with the metadata
  {"scrapbook": {"name": ...}} and its text in data "text/plain").
- On the sources: no page refers to a shared name with a format spec ({glue:text}`eager_wall_ms:.1f`:
  the format is declared once, in shared.py), and no notebook glues a shared name itself (only
  shared.glue_values does).
- On the fixture runs (tests/fixtures/runs): shared.values() and Shown.

Set LABSUPPORT_BOOK_HTML to the HTML folder of a book already built to check it instead of
building one.
"""

from __future__ import annotations

import ast
import json
import math
import os
import re
from pathlib import Path

import pytest

from labsupport import runs
from labsupport.chapters import shared
from labsupport.measure import hardware
from tests.conftest import fixture_run

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parent.parent
NAMES = set(shared.QUANTITIES)
RUN_NAMES = {f"shared_run_{owner.replace('-', '_')}": owner for owner in shared.OWNERS}
# A glue reference in MyST: {glue}`name`, {glue:text}`name:.2f`, {glue:md}`name`, ...
GLUE_ROLE = re.compile(r"\{glue(?::(\w+))?\}`([^`]+)`")


def _sources() -> dict[str, tuple[list[str], list[str]]]:
    """Every page of the book: {page: (markdown texts, code texts)}, notebooks and MyST pages."""
    out = {}
    for nb in sorted((REPO / "notebooks").glob("*.ipynb")):
        cells = json.loads(nb.read_text())["cells"]
        md = ["".join(c["source"]) for c in cells if c["cell_type"] == "markdown"]
        code = ["".join(c["source"]) for c in cells if c["cell_type"] == "code"]
        out[str(nb.relative_to(REPO))] = (md, code)
    for page in sorted((REPO / "book").glob("*.md")):
        text = page.read_text()
        code = re.findall(r"```\{code-cell\}[^\n]*\n(.*?)```", text, re.S)
        out[str(page.relative_to(REPO))] = ([re.sub(r"```\{code-cell\}.*?```", "", text, flags=re.S)], code)
    return out


SOURCES = _sources()


def _code(text: str) -> ast.Module | None:
    """A code cell parsed as Python (IPython's magics and shell lines left out)."""
    lines = [ln for ln in text.splitlines() if not ln.lstrip().startswith(("%", "!", ":tags:"))]
    try:
        return ast.parse("\n".join(lines))
    except SyntaxError:
        return None


def glued_names(tree: ast.AST) -> list[str]:
    """The names a piece of code glues with a literal name: glue("x", ...), glue_text("x", ...),
    glue_all({"x": ...}, prefix="p_") (each key with its prefix), any call whose function's
    name starts with `glue` (book.glue, glue.glue, myst_nb.glue) except shared.glue_values."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        fn = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
        if not fn.startswith("glue") or fn == "glue_values":
            continue
        prefix = ""
        for kw in node.keywords:
            if kw.arg == "prefix" and isinstance(kw.value, ast.Constant) and isinstance(kw.value.value, str):
                prefix = kw.value.value
        if node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
            found.append(node.args[0].value)
        for arg in node.args:
            if isinstance(arg, ast.Dict):
                keys = [k.value for k in arg.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)]
                found += [prefix + k for k in keys]
    return found


# --- the sources -------------------------------------------------------------------------


@pytest.mark.parametrize("page", sorted(SOURCES))
def test_a_shared_quantity_is_never_shown_with_a_format_of_its_own(page):
    """Prose shows a shared quantity as its one text: {glue:text}`eager_wall_ms`, no format spec."""
    md, _ = SOURCES[page]
    bad = [
        m.group(0)
        for text in md
        for m in GLUE_ROLE.finditer(text)
        if ":" in m.group(2) and m.group(2).split(":", 1)[0] in NAMES | set(RUN_NAMES)
    ]
    assert not bad, f"{page}: shared quantities with a format spec of their own: {bad}"


@pytest.mark.parametrize("page", sorted(SOURCES))
def test_a_shared_quantity_is_glued_only_by_shared_glue_values(page):
    _, code = SOURCES[page]
    bad = []
    for text in code:
        tree = _code(text)
        if tree is not None:
            bad += [n for n in glued_names(tree) if n in NAMES or n in RUN_NAMES]
    assert not bad, f"{page}: glues shared quantities itself (use shared.glue_values()): {sorted(set(bad))}"


def test_the_static_checks_see_what_they_look_for():
    """The two scans above find a format spec and a glue call of a shared name."""
    md = "took {glue:text}`eager_wall_ms:.1f` ms, {glue:text}`eager_wall_ms` ms and {glue}`own:.2f`"
    assert [m.group(2) for m in GLUE_ROLE.finditer(md)] == ["eager_wall_ms:.1f", "eager_wall_ms", "own:.2f"]
    code = (
        "book.glue('eager_wall_ms', Shown('1'))\nglue.glue_all({'wall_ms': 1, 'x': 2}, prefix='eager_')\n"
        "shared.glue_values()\nbook.glue_text('mine', 'x')"
    )
    assert glued_names(ast.parse(code)) == ["eager_wall_ms", "eager_wall_ms", "eager_x", "mine"]


# --- the built book ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def glued(request) -> dict[str, dict[str, str]]:
    """{page: {glue name: its text as {glue:text} shows it}} of every page of the built book."""
    from myst_nb.core.variables import format_plain_text

    given = os.environ.get("LABSUPPORT_BOOK_HTML")
    html = Path(given).resolve() if given else request.getfixturevalue("built_book")
    executed = html.parent / "jupyter_execute"
    out = {}
    for path in sorted(executed.rglob("*.glue.json")):
        page = str(path.relative_to(executed)).removesuffix(".glue.json")
        data = json.loads(path.read_text())
        # as the page shows it: myst-nb's glue:text evaluates text/plain as a literal first ("2,218" would
        # be the tuple (2, 218)), then formats it
        out[page] = {
            name: format_plain_text("".join(o.get("data", {}).get("text/plain", "")), "") for name, o in data.items()
        }
    assert out, f"no glued values under {executed}"
    return out


@pytest.mark.book
def test_every_shared_quantity_has_one_value_in_the_book(glued):
    """Each shared name glued on any page has one text across all pages: its owner's value."""
    want = shared.values(root=REPO / "runs")
    problems = []
    for name in sorted(NAMES):
        seen = {page: text for page, values in glued.items() if name in values for text in [values[name]]}
        if not seen:
            continue
        if len(set(seen.values())) > 1:
            problems.append(f"{name} differs between pages: {seen}")
        wrong = {p: t for p, t in seen.items() if t != want[name].text}
        if wrong:
            problems.append(f"{name} is {want[name].text!r} in {want[name].run.run_id} but {wrong}")
    assert not problems, "\n".join(problems)


@pytest.mark.book
def test_every_shared_run_named_is_the_owners_published_run(glued):
    published = runs.published(REPO / "runs")
    wrong = {
        (page, name): text
        for page, values in glued.items()
        for name, text in values.items()
        if name in RUN_NAMES and text != published[RUN_NAMES[name]]
    }
    assert not wrong, f"pages naming another run than the owner's published one: {wrong}"


# --- shared.values() and Shown on the fixture runs ----------------------------------------


@pytest.fixture(scope="module")
def fixture_values():
    given = {owner: fixture_run(owner) for owner in shared.OWNERS}
    return given, shared.values(given)


def test_values_give_every_declared_quantity_from_its_owners_run(fixture_values):
    given, vals = fixture_values
    assert set(vals) == NAMES
    for name, v in vals.items():
        q = shared.QUANTITIES[name]
        assert v.quantity is q
        assert v.run.run_id == given[q.owner].run_id and v.run.chapter == q.owner
        assert v.text == (
            "–"
            if v.value is None or not math.isfinite(float(v.value))
            else q.fmt.format(int(v.value) if "d}" in q.fmt else v.value)
        )


def test_values_read_the_owners_published_runs_under_a_root(tmp_path, fixture_values):
    """shared.values(root=...) loads each owner's published run of that runs folder."""
    given, vals = fixture_values
    from tests.conftest import FIXTURES

    runs.copy_published(tmp_path / "r", FIXTURES, manifest={o: r.run_id for o, r in given.items()})
    from_root = shared.values(root=tmp_path / "r")
    assert {n: v.text for n, v in from_root.items()} == {n: v.text for n, v in vals.items()}
    assert {v.run.path.parent.parent for v in from_root.values()} == {tmp_path / "r"}
    (tmp_path / "empty").mkdir()
    with pytest.raises(runs.RunError, match="no published run"):
        shared.values(root=tmp_path / "empty")


def test_the_fixture_values_are_what_the_owner_chapters_measured(fixture_values):
    given, vals = fixture_values
    from labsupport.chapters import kernels_in_one_token as one_token

    s = one_token.summary(given["kernels-in-one-token"])
    assert vals["eager_kernels"].value == s.kernels
    assert vals["eager_kernels"].text == f"{s.kernels:,d}"
    assert vals["floor_ms"].value == pytest.approx(vals["step_gb"].value / vals["datasheet_tbs"].value)
    # the best read rate (here the read stream: this run has no read kernels), never the copy
    assert vals["ceiling_tbs"].value == vals["read_tbs"].value != vals["copy_tbs"].value
    assert vals["measured_ridge"].value == pytest.approx(vals["gemm_tflops"].value / vals["ceiling_tbs"].value)
    assert vals["ceiling_ms"].value >= vals["floor_ms"].value  # the floor: no kernel beats it
    lim = shared.limits(given)
    assert isinstance(lim, hardware.Limits) and lim.copy_tbs == pytest.approx(vals["copy_tbs"].value)


def test_shown_is_its_text_and_nothing_else():
    """What {glue:text} and {glue:md} show of a shared value is its text: the kernel count "2,218"
    is not the tuple (2, 218) that myst-nb's literal evaluation makes of an unquoted 2,218."""
    from myst_nb.core.variables import format_plain_text

    s = shared.Shown("29.1")
    assert str(s) == f"{s}" == "29.1"
    for text in ("2,218", "29.1", "–", "20261201T205344Z-h200"):
        assert format_plain_text(repr(shared.Shown(text)), "") == text
        assert shared.Shown(text)._repr_markdown_() == text
    v = shared.Value(shared.QUANTITIES["eager_kernels"], 2218.0, None)
    assert v.text == "2,218"
    assert shared.Value(shared.QUANTITIES["floor_ms"], float("nan"), None).text == "–"
    assert shared.Value(shared.QUANTITIES["floor_ms"], None, None).text == "–"


def test_an_owner_that_gives_other_keys_than_declared_is_an_error(monkeypatch, fixture_values):
    given, _ = fixture_values
    from labsupport.chapters import launch_overhead

    real = launch_overhead.shared
    monkeypatch.setattr(launch_overhead, "shared", lambda run: {**real(run), "graph_wall_median_ms": 1.0})
    with pytest.raises(runs.RunError, match="against the declaration"):
        shared.owner_values("launch-overhead", given["launch-overhead"])
