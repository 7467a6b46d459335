"""The chapter notebooks, in book order, and the run folder each one records into."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .provenance import REPO_ROOT


@dataclass(frozen=True)
class Chapter:
    slug: str          # also the folder under runs/
    notebook: str      # path from the repository root

    @property
    def path(self) -> Path:
        return REPO_ROOT / self.notebook


CHAPTERS = [
    Chapter("why-a-gpu", "notebooks/why_a_gpu.ipynb"),
    Chapter("what-a-kernel", "notebooks/what_a_kernel.ipynb"),
    Chapter("model-code-to-kernels", "notebooks/model_code_to_kernels.ipynb"),
    Chapter("where-kernels-come-from", "notebooks/where_kernels_come_from.ipynb"),
    Chapter("kernels-in-one-token", "notebooks/kernels_in_one_token.ipynb"),
    Chapter("launch-overhead", "notebooks/launch_overhead.ipynb"),
]


def find(names: list[str] | None) -> list[Chapter]:
    """Chapters by slug (all when `names` is empty); an unknown name is a clear error."""
    if not names:
        return list(CHAPTERS)
    by_slug = {c.slug: c for c in CHAPTERS}
    unknown = [n for n in names if n not in by_slug]
    if unknown:
        raise SystemExit(f"unknown chapter(s) {', '.join(unknown)}; known: {', '.join(by_slug)}")
    return [by_slug[n] for n in names]
