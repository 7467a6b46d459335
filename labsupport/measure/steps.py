"""The decode step in the forms the book measures, one class each: eager as written (dynamic
cache), static cache, captured in a CUDA graph, and compiled with torch.compile.

Each is a callable step with `prepare()`, which resets its state (a fresh prefill, or the
static cache's write position) outside any timed or profiled span; `setup(step)` makes that
the harness's `setup`.
"""

from __future__ import annotations

import time


def prepare(step) -> None:
    """Reset a step's state, if it has any."""
    if hasattr(step, "prepare"):
        step.prepare()


class EagerStep:
    """The decode step as written, with transformers' dynamic cache. `prepare()` (outside
    any timing) prefills a fresh cache, so every step sees the same context.

    `no_grad=True` runs it under torch.no_grad instead of torch.inference_mode, as a model split
    with DTensor needs: under inference_mode, composite operators such as aten.linear reach
    DTensor undecomposed, and DTensor works out their sharding afresh, outside its caches, at
    every call (torch 2.11-2.13; the tensor-parallel worker counts these per step)."""

    def __init__(self, model, prompt, no_grad: bool = False):
        self.model, self.prompt, self.state = model, prompt, None
        self.no_grad = no_grad

    def grad_mode(self):
        import torch

        return torch.no_grad() if self.no_grad else torch.inference_mode()

    def prepare(self):
        from labsupport.measure import decode

        self.state = decode.prefill(self.model, self.prompt, self.grad_mode)

    def __call__(self):
        from labsupport.measure import decode

        cache, tok = self.state
        return decode.decode_step(self.model, cache, tok, self.grad_mode)


class StaticStep:
    """One decode step at a fixed position of a static (fixed-address) KV cache.

    Every step writes the new token's keys and values into the same slot and attends over
    the same prompt, so repeated steps do identical work and can be captured in a CUDA graph.
    transformers (5.17) keeps each layer's write position in a device counter that every
    step advances; `prepare()` puts it back, outside any timing, before each step.
    """

    def __init__(self, model, prompt_ids):
        import torch
        from transformers import StaticCache

        n = prompt_ids.shape[1]
        self.model, self.n = model, n
        self.cache = StaticCache(config=model.config, max_cache_len=n + 16)
        with torch.no_grad():
            out = model(
                input_ids=prompt_ids,
                past_key_values=self.cache,
                use_cache=True,
                cache_position=torch.arange(n, device=prompt_ids.device),
                logits_to_keep=1,
            )
        self.tok = out.logits[:, -1].argmax(-1, keepdim=True)
        self.pos = torch.tensor([n], device=prompt_ids.device)

    def prepare(self):
        for layer in self.cache.layers:
            counter = getattr(layer, "cumulative_length", None)
            if hasattr(counter, "fill_"):
                counter.fill_(self.n)

    def forward(self, tok, pos):
        out = self.model(input_ids=tok, past_key_values=self.cache, use_cache=True, cache_position=pos)
        return out.logits[:, -1].argmax(-1, keepdim=True)

    def __call__(self):
        import torch

        with torch.no_grad():
            return self.forward(self.tok, self.pos)


class GraphStep:
    """The static-cache step captured once in a CUDA graph, then replayed."""

    def __init__(self, static: StaticStep):
        import torch

        self.static = static
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s), torch.no_grad():
            for _ in range(3):
                static.prepare()
                static.forward(static.tok, static.pos)
        torch.cuda.current_stream().wait_stream(s)
        static.prepare()
        torch.cuda.synchronize()
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph), torch.no_grad():
            self.out = static.forward(static.tok, static.pos)

    def prepare(self):
        self.static.prepare()

    def __call__(self):
        self.graph.replay()
        return self.out


class CompiledStep:
    """The static-cache step through torch.compile (which adds CUDA graphs in these modes), with
    inductor's data-dependent choices pinned (labsupport.measure.compiling)."""

    def __init__(self, static: StaticStep, mode: str, fullgraph: bool = True):
        import torch

        from labsupport.measure import compiling

        self.static = static
        self.fn = compiling.torch_compile(static.forward, mode, fullgraph=fullgraph)
        t = time.perf_counter()
        with torch.no_grad():
            for _ in range(4):  # compile, then let CUDA graph trees record
                static.prepare()
                self.fn(static.tok, static.pos)
        torch.cuda.synchronize()
        self.compile_s = time.perf_counter() - t

    def prepare(self):
        self.static.prepare()

    def __call__(self):
        import torch

        with torch.no_grad():
            return self.fn(self.static.tok, self.static.pos)


def setup(step):
    """The harness's `setup` for a step: reset its state, outside the measured span."""

    def reset():
        prepare(step)
        return ()

    return reset


def graphs_compiled() -> int:
    """How many graphs torch.compile (Dynamo) has compiled in this process so far: a profile
    that changes it recompiled something."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])
