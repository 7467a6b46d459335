"""The package's layers, checked on its source: data flows measure -> record -> load -> analyse
-> figure/glue, so lower layers never import higher ones, no chapter imports another chapter,
no module reaches into another module's private names, and every module stays short."""

import ast
import json
import re
from pathlib import Path

import pytest

from labsupport import chapters

pytestmark = pytest.mark.unit

PACKAGE = Path(__file__).resolve().parent.parent / "labsupport"
NOTEBOOKS = PACKAGE.parent / "notebooks"
MAX_LINES = 600  # modules cut by concept, not by a line cap; past this a module has two concerns

# What each layer may import from labsupport (besides itself).
ALLOWED = {
    "runs": set(),
    "traces": set(),
    "measure": {"runs", "traces"},
    "figures": {"traces"},
    "glue": set(),
    "chapters": {"runs", "traces", "measure", "figures", "glue", "chapters"},
    "ops": {"runs", "traces", "measure", "figures", "glue", "chapters", "ops"},
}


def modules():
    return sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


def layer(path: Path) -> str:
    rel = path.relative_to(PACKAGE)
    return rel.parts[0].removesuffix(".py") if len(rel.parts) > 1 or rel.stem in ALLOWED else "top"


def imported(tree: ast.AST) -> list[tuple[str, list[str]]]:
    """(module, names) for every import of a labsupport module in `tree`."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("labsupport"):
            out.append((node.module, [a.name for a in node.names]))
        elif isinstance(node, ast.Import):
            out += [(a.name, []) for a in node.names if a.name.startswith("labsupport")]
    return out


def targets(module: str, names: list[str]) -> list[str]:
    """The labsupport modules an import brings in: `from labsupport.measure import harness`
    names labsupport.measure.harness."""
    if not names:
        return [module]
    found = []
    for n in names:
        candidate = f"{module}.{n}"
        path = PACKAGE.parent / candidate.replace(".", "/")
        found.append(candidate if path.with_suffix(".py").exists() or path.is_dir() else module)
    return found


@pytest.mark.parametrize("path", modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_module_is_short(path):
    n = len(path.read_text().splitlines())
    assert n <= MAX_LINES, f"{path.relative_to(PACKAGE)} has {n} lines"


@pytest.mark.parametrize("path", modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_imports_follow_the_layers(path):
    me = layer(path)
    if me == "top":
        return  # labsupport/__init__.py and __main__.py (the command line) may import anything
    tree = ast.parse(path.read_text())
    for module, names in imported(tree):
        for target in targets(module, names):
            parts = target.split(".")
            if len(parts) < 2:
                continue
            other = parts[1]
            assert other == me or other in ALLOWED[me], f"{path.relative_to(PACKAGE)} ({me}) imports {target}"
            if me == "chapters" and other == "chapters" and len(parts) > 2:
                mine = path.relative_to(PACKAGE / "chapters").parts[0].removesuffix(".py")
                if mine in ("shared", "__init__"):
                    continue  # the registry, and the one module that reads every owner's shared quantities
                if parts[3:] == ["declaration"]:
                    continue  # another chapter's declaration: what its runs hold, to load one (never its code)
                ok = (mine, "published", "data_files", "shared", "table_keys", "rules", "declaring")
                assert parts[2] in ok, f"chapter {mine} imports chapter {parts[2]}"
            for n in names:
                assert not (n.startswith("_") and n != "__version__"), f"{path.name} imports private {target}.{n}"


# measure/ by concept, each part importing only the parts before it: the instrument (the modules at
# measure/'s top) may read the model presets (measure.models itself), never a kernel, a decoder or
# the distributed code; kernels read the instrument; models read kernels; distributed reads models.
MEASURE_PARTS = {
    "instrument": {"instrument", "presets"},
    "kernels": {"instrument", "kernels"},
    "presets": set(),
    "models": {"instrument", "kernels", "presets", "models"},
    "distributed": {"instrument", "kernels", "presets", "models", "distributed"},
}


def measure_part(parts: tuple[str, ...]) -> str:
    """The part of measure/ a module (its path under labsupport/measure, without .py) is in."""
    if parts[0] == "models" and parts[1:] in ((), ("__init__",)):
        return "presets"
    return parts[0] if parts[0] in MEASURE_PARTS and len(parts) > 1 else "instrument"


@pytest.mark.parametrize(
    "path", [p for p in modules() if layer(p) == "measure"], ids=lambda p: str(p.relative_to(PACKAGE))
)
def test_measure_parts_import_one_way(path):
    me = measure_part(path.relative_to(PACKAGE / "measure").with_suffix("").parts)
    for module, names in imported(ast.parse(path.read_text())):
        for target in targets(module, names):
            parts = tuple(target.split(".")[2:])
            if target.split(".")[1:2] != ["measure"] or not parts:
                continue
            other = measure_part(parts)
            assert other in MEASURE_PARTS[me], f"{path.relative_to(PACKAGE)} ({me}) imports {target} ({other})"


@pytest.mark.parametrize("path", modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_private_names_of_other_modules(path):
    tree = ast.parse(path.read_text())
    aliases = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("labsupport"):
            aliases |= {a.asname or a.name for a in node.names}
        elif isinstance(node, ast.Import):
            aliases |= {(a.asname or a.name).split(".")[0] for a in node.names if a.name.startswith("labsupport")}
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in aliases
            and node.attr.startswith("_")
            and not node.attr.startswith("__")
        ):
            raise AssertionError(f"{path.relative_to(PACKAGE)}:{node.lineno} uses {node.value.id}.{node.attr}")


@pytest.mark.parametrize("chapter", chapters.CHAPTERS, ids=lambda c: c.slug)
def test_chapter_named_like_its_notebook_and_run_folder(chapter):
    stem = chapter.slug.replace("-", "_")
    assert Path(chapter.notebook).stem == stem == chapter.module
    assert (PACKAGE / "chapters" / stem / "__init__.py").exists(), "a chapter is a folder (a package)"


@pytest.mark.parametrize("chapter", chapters.CHAPTERS, ids=lambda c: c.slug)
def test_notebook_reads_only_declared_chapters(chapter):
    """A notebook imports its own chapter module only, and every other chapter whose run it
    loads is declared in the registry (`reads`)."""
    nb = json.loads(chapter.path.read_text())
    src = "\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code")
    own = chapter.module
    imported_chapters = set(re.findall(r"from labsupport\.chapters import ([\w, ]+)", src))
    names = {n.strip().split(" as ")[0] for group in imported_chapters for n in group.split(",")}
    shared = {own, "published", "data_files", "shared"}  # published figures; list of data; shared quantities
    assert names <= shared, f"{chapter.slug} imports {names - shared}"
    loaded = set(re.findall(r"load_run\(\s*[\"']([a-z0-9-]+)[\"']", src))
    assert loaded - {chapter.slug} <= set(chapter.reads), f"{chapter.slug} reads undeclared {loaded}"
    for slug in chapter.reads:
        chapters.by_slug(slug)


@pytest.mark.parametrize("chapter", chapters.CHAPTERS, ids=lambda c: c.slug)
def test_every_file_of_a_run_is_described(chapter):
    """The closing list of data of each chapter says in one line what each file holds."""
    from labsupport.chapters import data_files

    from .conftest import fixture_run

    run = fixture_run(chapter.slug)
    missing = [n for n in run.meta["files"] if not data_files.describe(chapter, n)]
    assert not missing, f"{chapter.slug}: no description for {missing}"
    assert all(data_files.describe(chapter, a) for a in chapter.artifacts)
    html = data_files.data_list_html(run)
    assert html.count("<tr>") == len(run.meta["files"]) + 2 and "(not described)" not in html
    assert "../book/run_it_yourself.html" in html  # how to record one's own run, from every chapter


def module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def import_graph() -> dict[str, set[str]]:
    """{module: the labsupport modules it imports}, at the top or inside a function alike (a lazy
    import is still a circle). A package's __init__ counts as importing nothing it merely
    re-exports from itself."""
    known = {module_name(p) for p in modules()}
    graph = {}
    for path in modules():
        me = module_name(path)
        out = set()
        for module, names in imported(ast.parse(path.read_text())):
            out |= {t for t in targets(module, names) if t in known and t != me}
        graph[me] = out
    return graph


def test_no_import_circles():
    """No module imports, directly or through others, a module that imports it back (live and
    nightly did: live now finds the nightly's folders in leftovers)."""
    graph = import_graph()
    circles = []
    state: dict[str, int] = {}  # 1: on the path being walked, 2: done

    def walk(node, trail):
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                circles.append(trail[trail.index(nxt) :] + [nxt])
            elif nxt not in state:
                walk(nxt, trail + [nxt])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            walk(node, [node])
    # A package and the modules it re-exports import each other by construction only if a module
    # reads a name from its own package's __init__; none may.
    assert not circles, "import circles: " + "; ".join(" -> ".join(c) for c in circles)


def test_runs_load_no_chapter_code():
    """runs/ is below the chapters: importing it brings in no chapter module, and nothing is
    declared to it at import: whoever writes or loads a run hands it the chapter's declaration."""
    import subprocess
    import sys

    code = (
        "import sys, labsupport.runs as r; "
        "bad = sorted(m for m in sys.modules if m.startswith('labsupport.chapters')); "
        "assert not bad, bad; "
        "import labsupport.chapters as c; "
        "assert not any(hasattr(r.tables, n) for n in ('SCHEMAS', 'declare', 'declared_columns'))"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=PACKAGE.parent)


@pytest.mark.parametrize(
    "path", [p for p in modules() if layer(p) == "chapters"], ids=lambda p: str(p.relative_to(PACKAGE))
)
def test_no_chapter_module_looks_modules_up_by_name(path):
    """Every edge between chapter modules is an import the layer test sees: no importlib, no
    __import__ (a chapter's headline and shared quantities are reached through explicit imports)."""
    tree = ast.parse(path.read_text())
    names = {a.name for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom)) for a in node.names}
    modules_from = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert "importlib" not in names | modules_from, f"{path.relative_to(PACKAGE)} imports importlib"
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Name) and n.id == "__import__"]
    assert not calls, f"{path.relative_to(PACKAGE)} calls __import__"
