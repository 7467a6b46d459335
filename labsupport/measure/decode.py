"""One decode step of a Hugging Face causal LM, as written: prompt, prefill, step.

A decode step is one forward pass of one new token per sequence against the
key/value cache of the prompt, followed by greedy sampling (argmax). The cache
is rebuilt by a fresh prefill before every measured step, so every step sees
exactly `prompt_len` cached tokens.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

from labsupport.measure import harness

if TYPE_CHECKING:  # torch is imported where it is used: a replay (the book's build) never loads it
    import torch


class NoGPUError(RuntimeError):
    """Live measurement was asked for on a machine without a CUDA GPU."""


def require_device(device: str, allow_cpu: bool = False) -> str:
    """Check that live measurement can run on `device`; CPU only when explicitly allowed."""
    import torch

    if device == "cuda":
        if not torch.cuda.is_available():
            raise NoGPUError(
                "live mode needs a CUDA GPU and none is visible (use mode='replay' to read the recorded run)"
            )
        return device
    if device == "cpu" and allow_cpu:
        return device
    raise NoGPUError(f"live mode measures a GPU; device {device!r} is only allowed for tests (with a 'tiny' preset)")


sync = harness.sync


@dataclass
class Prompt:
    """A batch of random token ids (random ids give the same kernels as real text)."""

    ids: torch.Tensor

    @classmethod
    def random(cls, vocab_size: int, batch: int, length: int, device: str, seed: int = 0) -> Prompt:
        import torch

        g = torch.Generator(device="cpu").manual_seed(seed)
        return cls(torch.randint(0, vocab_size, (batch, length), generator=g).to(device))


def prefill(model, prompt: Prompt, grad_mode=None):
    """Run the prompt through the model; return (cache, next tokens). `grad_mode`: the context
    it runs in (torch.inference_mode by default; torch.no_grad for a DTensor-split model: see EagerStep)."""
    import torch
    from transformers import DynamicCache

    with (grad_mode or torch.inference_mode)():
        cache = DynamicCache(config=model.config)
        out = model(input_ids=prompt.ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
        return cache, out.logits[:, -1].argmax(-1, keepdim=True)


def decode_step(model, cache, tokens, grad_mode=None):
    """One new token per sequence: forward against the cache, then greedy sampling (under
    `grad_mode`, torch.inference_mode by default)."""
    import torch

    with (grad_mode or torch.inference_mode)():
        out = model(input_ids=tokens, past_key_values=cache, use_cache=True)
        with torch.profiler.record_function("sample"):
            return out.logits[:, -1].argmax(-1, keepdim=True)


@contextlib.contextmanager
def annotated_modules(model):
    """Label every submodule's forward in the profiler trace with its path
    ('layers.3.mlp.down_proj'), so each kernel can be traced to the module that launched it."""
    import torch

    handles = []
    base = model.base_model_prefix + "."

    for path, module in model.named_modules():
        if not path or isinstance(module, (torch.nn.ModuleList, torch.nn.ModuleDict)):
            continue
        label = path[len(base) :] if path.startswith(base) else path

        def pre(mod, args, _label=label):
            rf = torch.profiler.record_function(_label)
            rf.__enter__()
            mod.__dict__.setdefault("_labsupport_rf", []).append(rf)

        def post(mod, args, out):
            mod.__dict__["_labsupport_rf"].pop().__exit__(None, None, None)

        handles.append(module.register_forward_pre_hook(pre))
        handles.append(module.register_forward_hook(post))
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def time_decode_steps(
    model, prompt: Prompt, device: str, repeats: int = 20, warmup: int = 3, allow_after_profile: bool = False
) -> harness.Timing:
    """Wall time of `repeats` decode steps, each after a fresh prefill (outside the timed span)."""
    return harness.time_region(
        lambda cache, tok: decode_step(model, cache, tok),
        setup=lambda: prefill(model, prompt),
        what=f"decode step, {prompt.ids.shape[1]} tokens",
        device=device,
        repeats=repeats,
        warmup=warmup,
        allow_after_profile=allow_after_profile,
    )


def profile_decode_step(model, prompt: Prompt, device: str, trace_path, warmup: int = 2):
    """Profile one steady-state decode step; write its Chrome trace to `trace_path` (.json.gz
    ok), each kernel labelled with the module that launched it; return its kernel table.

    Every step, warm-up or kept, starts from a fresh prefill of `prompt`, outside the
    `decode_step` region."""
    return harness.profile_region(
        lambda cache, tok: decode_step(model, cache, tok),
        trace_path,
        region="decode_step",
        device=device,
        warmup=warmup,
        setup=lambda: prefill(model, prompt),
        labels=lambda: annotated_modules(model),
    )
