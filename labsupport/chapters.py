"""The chapter notebooks, in book order: the run folder each records into, the files
its run must contain, and the module that measures and analyses it."""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path

from .provenance import REPO_ROOT


@dataclass(frozen=True)
class Chapter:
    slug: str                    # also the folder under runs/
    notebook: str                # path from the repository root
    module: str                  # labsupport module with record(), load() and headline()
    artifacts: tuple[str, ...]   # files every run of the chapter must contain

    @property
    def path(self) -> Path:
        return REPO_ROOT / self.notebook

    def headline(self, run) -> dict:
        """The few numbers of a run that the status page follows from night to night."""
        return importlib.import_module(f"labsupport.{self.module}").headline(run)


CHAPTERS = [
    Chapter("why-a-gpu", "notebooks/why_a_gpu.ipynb", "why_a_gpu",
            ("ceilings.csv", "matvec.csv", "batch_sweep.csv")),
    Chapter("what-a-kernel", "notebooks/what_a_kernel.ipynb", "what_a_kernel",
            ("add_kernels.csv", "add_times.csv", "queue.csv", "sync.csv", "burst_trace.json.gz")),
    Chapter("model-code-to-kernels", "notebooks/model_code_to_kernels.ipynb", "code_to_kernels",
            ("mlp_kernels.csv", "rmsnorm_kernels.csv", "rmsnorm_times.csv")),
    Chapter("where-kernels-come-from", "notebooks/where_kernels_come_from.ipynb", "kernel_sources",
            ("fusion_kernels.csv", "fusion_times.csv", "fused_rmsnorm_source.py", "attention_backends.csv")),
    Chapter("kernels-in-one-token", "notebooks/kernels_in_one_token.ipynb", "one_token",
            ("kernels.csv", "census.csv", "step_times.csv", "context_sweep.csv", "trace.json.gz")),
    Chapter("launch-overhead", "notebooks/launch_overhead.ipynb", "launch_overhead",
            ("ceilings.csv", "variants.csv", "step_times.csv", "trace-eager.json.gz")),
    Chapter("prefill-vs-decode", "notebooks/prefill_vs_decode.ipynb", "prefill_decode",
            ("phase_times.csv", "kernels-prefill.csv", "kernels-decode.csv", "census.csv", "prompt_sweep.csv",
             "trace-prefill.json.gz", "trace-decode.json.gz")),
    Chapter("hybrid-model-token", "notebooks/hybrid_model_token.ipynb", "hybrid",
            ("variants.csv", "step_times.csv", "prefill.csv", "cache_growth.csv", "trace-reference-eager.json.gz")),
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


def by_slug(slug: str) -> Chapter:
    return find([slug])[0]
