"""The book's prose speaks of its subject only: never of issues, the team, targets, or a later
piece of work.

What is scanned is everything that can reach a page: the markdown cells of the notebooks, the
strings and comments of their code cells (a visible cell shows its comments; a hidden one glues
its strings into the prose), the strings the chapter modules glue (every string constant that is
not a docstring), and book/*.md whole. Addresses are left out first: a source cited by its URL
(github.com/pytorch/pytorch/issues/146604) is a reference, not a word of the prose.

The rule, case-insensitive:
- "issue" as a noun: "issue", "issues", "issue's" anywhere, except the verb ("to issue", and
  "issues" followed by what is issued: "the CPU issues about 21 launch calls") and the launch
  term "issue time" (the time the CPU takes to issue a step);
- "team" after "the", "our" or "this" ("the Qwen team" names an author, and passes);
- a later piece of work: "later" before issue, pull request, PR, work, version or change;
- a target: "target" or "targets" (the book's one limit is the floor, and a draft model checks
  its tokens against the *large* model).
"""

import ast
import io
import json
import re
import tokenize

import pytest

from .conftest import REPO

pytestmark = pytest.mark.unit

URL = re.compile(r"https?://\S+|<[^>\s]+>|\b[\w.-]+\.(?:com|org|io|dev)/\S*")
FORBIDDEN = [
    (
        "an issue",
        re.compile(
            r"(?<!\bto )\bissue(?:s\b(?! (?:about|all|the|its|every|each|one|\d))|'s\b|\b(?! (?:time|ms|µs)\b))", re.I
        ),
    ),
    ("the team", re.compile(r"\b(?:the|our|this)\s+team\b", re.I)),
    ("a later piece of work", re.compile(r"\blater\s+(?:issue|pull request|PR|work|version|change)s?\b", re.I)),
    ("a target", re.compile(r"\btargets?\b", re.I)),
]


def _code_text(source: str) -> list[str]:
    """The strings and comments of a notebook's code cell (what a reader may see of it)."""
    out = []
    try:
        for tok in tokenize.generate_tokens(io.StringIO(source).readline):
            if tok.type in (tokenize.STRING, tokenize.COMMENT) or tok.type == getattr(tokenize, "FSTRING_MIDDLE", -1):
                out.append(tok.string)
    except (tokenize.TokenError, IndentationError, SyntaxError):
        out.append(source)  # not Python (a magic): read it all
    return out


def _module_strings(path) -> list[str]:
    """Every string constant of a module that is not a docstring."""
    tree = ast.parse(path.read_text())
    docs = {
        id(n.body[0].value)
        for n in ast.walk(tree)
        if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and n.body
        and isinstance(n.body[0], ast.Expr)
        and isinstance(n.body[0].value, ast.Constant)
    }
    return [
        n.value
        for n in ast.walk(tree)
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs
    ]


def prose() -> list[tuple[str, str]]:
    """(where, text) for everything that can reach a page."""
    out = []
    for nb_path in sorted((REPO / "notebooks").glob("*.ipynb")):
        for i, cell in enumerate(json.loads(nb_path.read_text())["cells"]):
            text = "".join(cell["source"])
            where = f"{nb_path.relative_to(REPO)} cell {i}"
            out += [(where, text)] if cell["cell_type"] == "markdown" else [(where, t) for t in _code_text(text)]
    for md in sorted((REPO / "book").glob("*.md")):
        out.append((str(md.relative_to(REPO)), md.read_text()))
    for py in sorted((REPO / "labsupport" / "chapters").rglob("*.py")):
        out += [(str(py.relative_to(REPO)), s) for s in _module_strings(py)]
    return out


def offences(items) -> list[str]:
    found = []
    for where, text in items:
        text = URL.sub(" ", text)
        for what, pattern in FORBIDDEN:
            for m in pattern.finditer(text):
                found.append(f"{where}: {what}: ...{text[max(0, m.start() - 50) : m.end() + 30]!r}...")
    return found


def test_the_prose_speaks_of_its_subject_only():
    found = offences(prose())
    assert not found, "\n".join(found)


def test_the_rule_catches_what_it_should_and_passes_the_rest():
    bad = [
        "a split without it is measured in a later issue.",
        "The issue's target for the best BF16 rung, 3.80 ms",
        "(issue 27)",
        "See issue #12.",
        "Issues remain.",
        "as the team decided",
        "in a later pull request",
        "the target is 1.15x that",
    ]
    good = [
        "the CPU issues about 21 launch calls per step",
        "ms to issue each step",
        "its wall, busy time, kernels, issue time",
        "The CPU had issued the whole step",
        "(pytorch #146604)",
        "<https://github.com/pytorch/pytorch/issues/146604>",
        "**Qwen3-8B** (Qwen team): hidden size 4,096",
        "the time spent issuing kernels",
        "a kernel of a later chapter",
    ]
    assert [len(offences([("x", t)])) > 0 for t in bad] == [True] * len(bad)
    assert [offences([("x", t)]) for t in good] == [[]] * len(good)
