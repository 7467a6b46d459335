"""Which code runs the Gated DeltaNet (linear-attention) layers of the hybrid model.

transformers (5.17) picks the implementation once, when its Qwen3.5 modelling module is
imported: flash-linear-attention's Triton kernels if that package imports, its own
reference PyTorch code if not. To measure both in one process, `use(name)` swaps the two
module-level functions the layer calls (the chunked rule for a prompt, the recurrent rule
for one new token) and puts them back afterwards. The short causal convolution stays on
PyTorch's conv1d in both: its fused kernel (the causal-conv1d package) needs a CUDA build
that is not available here.
"""

from __future__ import annotations

import contextlib
import inspect

BACKENDS = {
    "reference": "transformers' reference PyTorch code",
    "fla": "flash-linear-attention's Triton kernels",
}
# The names the layer's forward looks up in its module when it runs.
_RULES = ("torch_chunk_gated_delta_rule", "torch_recurrent_gated_delta_rule")
_FLA_RULES = ("chunk_gated_delta_rule", "fused_recurrent_gated_delta_rule")


class UnknownBackendError(ValueError):
    """A Gated DeltaNet backend name that is not in BACKENDS."""


def _modeling():
    import transformers.models.qwen3_5.modeling_qwen3_5 as modeling

    return modeling


def _check(name: str) -> None:
    if name not in BACKENDS:
        raise UnknownBackendError(f"unknown Gated DeltaNet backend {name!r}; known: {', '.join(BACKENDS)}")


def unavailable_reason(name: str, device: str) -> str | None:
    """Why backend `name` cannot run on `device` here (None when it can)."""
    _check(name)
    if name == "reference":
        return None
    if device != "cuda":
        return "flash-linear-attention's Triton kernels need a CUDA GPU"
    try:
        import fla.ops.gated_delta_rule  # noqa: F401
    except Exception as e:  # ImportError, or an incompatible torch/triton raising on import
        first = next((ln for ln in str(e).splitlines() if ln.strip()), "")
        return f"flash-linear-attention does not import here ({type(e).__name__}: {first[:160]})"
    return None


def version(name: str) -> str | None:
    """The installed version of the package behind backend `name` (None for the reference)."""
    _check(name)
    if name == "reference":
        return None
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    for dist in ("flash-linear-attention", "fla-core"):
        try:
            return dist_version(dist)
        except PackageNotFoundError:
            continue
    return None


def _reference_rules() -> dict:
    """transformers' own PyTorch functions, unwrapped from its kernel-selection decorator."""
    m = _modeling()
    out = {}
    for n in _RULES:
        f = inspect.unwrap(getattr(m, n))
        if f.__code__.co_filename != m.__file__:
            raise RuntimeError(f"cannot find transformers' reference {n} (found {f.__module__}.{f.__name__})")
        out[n] = f
    return out


def _fla_rules() -> dict:
    from fla.ops import gated_delta_rule as ops

    return {n: getattr(ops, f) for n, f in zip(_RULES, _FLA_RULES, strict=False)}


@contextlib.contextmanager
def use(name: str, device: str = "cuda"):
    """Run the model's Gated DeltaNet layers with backend `name` inside the block."""
    _check(name)
    reason = unavailable_reason(name, device)
    if reason:
        raise RuntimeError(f"Gated DeltaNet backend {name!r} cannot run: {reason}")
    m = _modeling()
    saved = {n: getattr(m, n) for n in _RULES}
    rules = _reference_rules() if name == "reference" else _fla_rules()
    try:
        for n, f in rules.items():
            setattr(m, n, f)
        yield
    finally:
        for n, f in saved.items():
            setattr(m, n, f)
