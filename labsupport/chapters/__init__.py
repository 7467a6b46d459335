"""The chapters, in book order. Each chapter declares itself in its own folder
(labsupport/chapters/<package>/declaration.py: its files, its Params with their checks, the runs it
reads, the GPUs it needs; the types are in labsupport.chapters.declaring); this registry only
lists the packages, in the order of _toc.yml (tests/test_declarations.py checks it), and finds
a chapter by its slug. Nothing is registered anywhere when it is imported: the runs layer is
handed a chapter's declaration when it writes or loads a run (Chapter.load, runs.load_run)."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

from labsupport.chapters import (
    closing_the_gap,
    hybrid_model_token,
    kernels_in_one_token,
    launch_overhead,
    model_code_to_kernels,
    one_token_two_gpus,
    prefill_vs_decode,
    what_a_kernel,
    where_kernels_come_from,
    why_a_gpu,
)
from labsupport.chapters.declaring import (
    BATCH,
    CEILINGS,
    DTYPE,
    KERNELS,
    KERNELS_BY_LAYER,
    LENGTHS,
    MAY_LACK,
    RANGES,
    REPEATS,
    TOKENS,
    Chapter,
    File,
    param,
)

__all__ = [
    "BATCH",
    "CEILINGS",
    "CHAPTERS",
    "DTYPE",
    "KERNELS",
    "KERNELS_BY_LAYER",
    "LENGTHS",
    "MAY_LACK",
    "PACKAGES",
    "RANGES",
    "REPEATS",
    "TOKENS",
    "Chapter",
    "File",
    "by_slug",
    "declaration_of",
    "find",
    "headline",
    "package",
    "param",
    "toc_problem",
]

# The chapters' packages, in book order: each holds its DECLARATION, its headline(run), its figures.
PACKAGES: tuple[ModuleType, ...] = (
    why_a_gpu,
    what_a_kernel,
    model_code_to_kernels,
    where_kernels_come_from,
    kernels_in_one_token,
    launch_overhead,
    closing_the_gap,
    prefill_vs_decode,
    hybrid_model_token,
    one_token_two_gpus,
)
REGISTRY = "labsupport/chapters/__init__.py"


def declaration_of(p: ModuleType) -> Chapter:
    """The package's DECLARATION; a package without one (README, "Adding a chapter") stops in one line."""
    found = getattr(p, "DECLARATION", None)
    if not isinstance(found, Chapter):
        raise ImportError(f"{p.__name__} has no DECLARATION: its __init__.py imports it from its declaration.py")
    return found


CHAPTERS: list[Chapter] = [declaration_of(p) for p in PACKAGES]


def find(names: list[str] | None) -> list[Chapter]:
    """Chapters by slug (all when `names` is empty); an unknown name is a clear error."""
    if not names:
        return list(CHAPTERS)
    slugs = {c.slug: c for c in CHAPTERS}
    unknown = [n for n in names if n not in slugs]
    if unknown:
        raise SystemExit(
            f"unknown chapter(s) {', '.join(unknown)} (a chapter is a package listed in PACKAGES, {REGISTRY}); "
            f"known: {', '.join(slugs)}"
        )
    return [slugs[n] for n in names]


def by_slug(slug: str) -> Chapter:
    return find([slug])[0]


def package(chapter: Chapter) -> ModuleType:
    """The chapter's package (labsupport.chapters.<module>): its analysis, figures and headline."""
    return next(p for p in PACKAGES if p.DECLARATION is chapter)


def headline(chapter: Chapter, run) -> dict:
    """The few numbers of a run that the status page follows from night to night."""
    return package(chapter).headline(run)


def toc_problem(toc: Path) -> str | None:
    """Where the chapters of the table of contents `toc` (its notebooks but the status page) and
    PACKAGES disagree, in one line saying what to add; None when they list the same, in one order."""
    import yaml  # the book's tools have it; a replay from the served wheel never reads _toc.yml

    listed = [c["file"] for part in yaml.safe_load(toc.read_text())["parts"] for c in part["chapters"]]
    in_book = [f for f in listed if f.startswith("notebooks/") and f != "notebooks/status"]
    registered = [c.notebook.removesuffix(".ipynb") for c in CHAPTERS]
    if in_book == registered:
        return None
    if unlisted := [f for f in in_book if f not in registered]:
        return f"{toc.name} has {unlisted[0]}, a chapter of no package in PACKAGES: import it, list it ({REGISTRY})"
    if missing := [f for f in registered if f not in in_book]:
        return f"{missing[0]} (PACKAGES, {REGISTRY}) has no line in {toc.name}: add `- file: {missing[0]}`"
    return f"PACKAGES ({REGISTRY}) lists the chapters in another order than {toc.name}: {', '.join(in_book)}"
