"""torch.compile, the one way the book calls it: with inductor's data-dependent choices pinned,
so that the same code compiles to the same kernels on every box, and with what the compiler
did (its counters, its caches) recorded in the run.

Inductor's pad_mm pass (on by default, `shape_padding`) times a matrix multiply whose size is not
a multiple of 8 (the decode step's attention bmms, M = 4) against a padded one on every cold
compile and pads when the unpadded call is more than 1.1x slower; its FX-graph cache then replays
whichever verdict the first compile on that box reached. The same commit gave 803 kernels per step
on one H200 and 875 on another. With `shape_padding` off the pass never runs: 803 every time.
"""

from __future__ import annotations

import os

# Inductor options that would make the kernels depend on a benchmark taken while compiling.
PINNED = {"shape_padding": False}
# The inductor counters a run records (0 when the compiler never counted them).
COUNTERS = ("pad_mm_bench", "fxgraph_cache_hit", "fxgraph_cache_miss", "fxgraph_cache_bypass")
CACHE_VARIABLES = ("TORCHINDUCTOR_FORCE_DISABLE_CACHES", "TORCHINDUCTOR_CACHE_DIR")


def options(mode: str | None = None) -> dict:
    """Inductor's options for a torch.compile `mode` ("reduce-overhead", "max-autotune"; None for the
    default), with PINNED on top: torch.compile takes either a mode or options, never both, so a mode
    is passed as the options it stands for (torch._inductor.list_mode_options)."""
    from torch._inductor import list_mode_options

    return {**(list_mode_options(mode) if mode and mode != "default" else {}), **PINNED}


def torch_compile(fn, mode: str | None = None, **kwargs):
    """torch.compile(fn, **kwargs) in `mode`, with options(mode)."""
    import torch

    return torch.compile(fn, options=options(mode), **kwargs)


def record() -> dict:
    """What inductor did in this process: its COUNTERS (and every other counter it kept), the
    options pinned, and the state of its caches (the variables that set them, and whether they were
    off), for the run's results under "compile"."""
    from torch._dynamo.utils import counters
    from torch._inductor import config

    counted = {k: int(v) for k, v in sorted(counters["inductor"].items())}
    return {
        "counters": {**dict.fromkeys(COUNTERS, 0), **counted},
        "pinned": dict(PINNED),
        "caches": {
            **{v: os.environ.get(v, "unset") for v in CACHE_VARIABLES},
            "force_disable_caches": bool(config.force_disable_caches),
        },
    }
