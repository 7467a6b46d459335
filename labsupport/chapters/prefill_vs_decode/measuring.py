"""What the chapter measures and how: its names (run folder and files from its declaration, its two phases, the keys its
tables use for the matrices they compare; display labels in SHORT), the FLOP and byte model of a forward pass of batch 1
(the model's shape, a pass's work, the arithmetic intensity of a prefill's matrix multiplies), and what the notebook's
live cells call to measure: the parameters of a run, the model's description for meta.json, the interleaved timing of
the decode step and the prefills, the profile of one prefill, the kernel tables, and the prompt sweep's rows.

The order of the measurements is the notebook's (every wall time before the first profile: labsupport.measure.harness).
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass

import pandas as pd

from labsupport.measure import decode, harness, models
from labsupport.measure.models import source
from labsupport.traces import kernels, trace

from .declaration import DECLARATION

CHAPTER, load, progress = DECLARATION.slug, DECLARATION.load, DECLARATION.progress  # its declaration's
# Files every run of the chapter contains (ceilings.csv too, on a GPU), and the columns of its tables.
ARTIFACTS = DECLARATION.artifacts
PHASES = ("prefill", "decode")
# The profiler annotation that each phase's trace is timed from.
ORIGIN = {"prefill": "prefill", "decode": "decode_step"}
# The matrix multiplies of one decoder layer, in the order they run.
GEMM_MODULES = (
    "self_attn.q_proj",
    "self_attn.k_proj",
    "self_attn.v_proj",
    "self_attn.o_proj",
    "mlp.gate_proj",
    "mlp.up_proj",
    "mlp.down_proj",
)
LM_HEAD = "lm_head"
# The points of the roofline figure: each weight matrix of a decoder layer, then the LM head.
ROOFLINE_MODULES = (*GEMM_MODULES, LM_HEAD)
# Display labels of the matrices (applied when a table or figure is shown).
SHORT = {
    "self_attn.q_proj": "q",
    "self_attn.k_proj": "k",
    "self_attn.v_proj": "v",
    "self_attn.o_proj": "o",
    "mlp.gate_proj": "gate",
    "mlp.up_proj": "up",
    "mlp.down_proj": "down",
    LM_HEAD: "LM head",
}
MATMUL = "matrix multiply"


def trace_file(phase: str) -> str:
    return f"trace-{phase}.json.gz"


def kernels_table_name(phase: str) -> str:
    return f"kernels-{phase}"


# The columns of the kernel tables (kernels-prefill.csv, kernels-decode.csv): a trace's kernel table
# without the launch details, with the annotations (kernels.annotate); then those read as text.
LAUNCH_DETAILS = ("registers", "shared_mem", "correlation", "launch_api", "launch_ns", "launch_dur_ns")
KERNEL_COLUMNS = [c for c in trace.KERNEL_COLUMNS if c not in LAUNCH_DETAILS] + ["kind", "short_name", "layer", "part"]
TEXT_COLUMNS = ["name", "stream", "grid", "block", "op", "module", "kind", "short_name", "part"]


@dataclass(frozen=True)
class ModelShape:
    """What the FLOP and byte counts need to know of a model (batch 1, BF16)."""

    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    matmul_parameters: int  # every nn.Linear weight, the LM head included
    lm_head_parameters: int
    weight_bytes: int  # every weight outside the embedding table (models.ModelCounts.decode_bytes)
    bytes_per_value: int = 2

    @property
    def layer_matmul_parameters(self) -> int:
        """Weights of the decoder layers' matrix multiplies (all layers together)."""
        return self.matmul_parameters - self.lm_head_parameters

    @property
    def matmul_bytes(self) -> int:
        return self.matmul_parameters * self.bytes_per_value

    @property
    def kv_bytes_per_token(self) -> int:
        """Bytes of one token's keys and values, over all layers."""
        shape = {"num_hidden_layers": self.layers, "num_key_value_heads": self.kv_heads, "head_dim": self.head_dim}
        return source.kv_bytes_per_position(shape, self.bytes_per_value)


def model_shape(model) -> ModelShape:
    """The shape of a built model (works on the `meta` device, too)."""
    counts = models.count_model(model)
    cfg = source.shape(model.config)
    return ModelShape(
        layers=cfg["num_hidden_layers"],
        heads=cfg["num_attention_heads"],
        kv_heads=cfg["num_key_value_heads"],
        head_dim=cfg["head_dim"],
        matmul_parameters=counts.matmul_weight_parameters,
        lm_head_parameters=model.get_output_embeddings().weight.numel(),
        weight_bytes=counts.decode_bytes,
        bytes_per_value=counts.bytes_per_parameter,
    )


def preset_shape(name: str) -> ModelShape:
    """The shape of preset `name` in BF16, from a model on the meta device (no memory used)."""
    return model_shape(models.build_model(name, device="meta"))


@dataclass(frozen=True)
class Work:
    """The arithmetic and the memory traffic a forward pass cannot do without."""

    matmul_flops: int
    attention_flops: int
    bytes: int

    @property
    def flops(self) -> int:
        return self.matmul_flops + self.attention_flops

    @property
    def flop_per_byte(self) -> float:
        return self.flops / self.bytes


def forward_work(shape: ModelShape, new_tokens: int, past_tokens: int = 0, logits_tokens: int = 1) -> Work:
    """Model FLOPs and bytes of one forward pass of `new_tokens` tokens (batch 1) on top of
    `past_tokens` tokens already in the KV cache: a prefill is (prompt, 0), a decode step
    (1, prompt).

        matmul FLOPs    = 2 × new_tokens × (weights of the decoder layers' matrix multiplies)
                        + 2 × logits_tokens × (weights of the LM head)
        attention FLOPs = 4 × layers × heads × head_dim × (query-key pairs)
        query-key pairs = new_tokens × past_tokens + new_tokens × (new_tokens + 1) / 2
        bytes           = every weight outside the embedding table, once
                        + (past_tokens + new_tokens) × (bytes of one token's keys and values)

    Each weight is used for one multiply and one add per token. The LM head runs for
    `logits_tokens` tokens only (a prefill asks for the logits of its last token,
    `logits_to_keep=1`). Attention is causal: a new token is scored against every token
    before it and itself, 2 × head_dim operations for the score (Q times K) and 2 × head_dim
    for the weighted sum of values (P times V), in every query head of every layer. The
    bytes are the least that must move: the weights read once, and the keys and values of
    the context read (the cache) or written (the new tokens) once. Not counted: norms,
    rotary embeddings, softmax and activation functions (elementwise, few FLOPs), and the
    activations' own memory traffic.
    """
    pairs = new_tokens * past_tokens + new_tokens * (new_tokens + 1) // 2
    return Work(
        matmul_flops=2 * new_tokens * shape.layer_matmul_parameters + 2 * logits_tokens * shape.lm_head_parameters,
        attention_flops=4 * shape.layers * shape.heads * shape.head_dim * pairs,
        bytes=shape.weight_bytes + (past_tokens + new_tokens) * shape.kv_bytes_per_token,
    )


def phase_work(shape: ModelShape, phase: str, prompt_len: int) -> Work:
    """The work of the prefill of `prompt_len` tokens, or of the decode step right after it."""
    if phase == "prefill":
        return forward_work(shape, prompt_len, 0)
    if phase == "decode":
        return forward_work(shape, 1, prompt_len)
    raise ValueError(f"unknown phase {phase!r}; phases: {', '.join(PHASES)}")


def matmul_intensity(shape: ModelShape, tokens: int) -> float:
    """FLOP per byte of weights of a prefill's matrix multiplies: about `tokens`, since each
    weight (2 bytes) does 2 operations per token (the LM head, run once, pulls it down a little)."""
    return forward_work(shape, tokens).matmul_flops / shape.matmul_bytes


def tokens_at_intensity(shape: ModelShape, flop_per_byte: float) -> float:
    """The prompt length whose matrix multiplies reach `flop_per_byte` (matmul_intensity inverted)."""
    p = shape.bytes_per_value
    p = shape.bytes_per_value
    return (flop_per_byte * p * shape.matmul_parameters - 2 * shape.lm_head_parameters) / (
        2 * shape.layer_matmul_parameters
    )


def free(device: str) -> None:
    """Give the memory of finished work back to the GPU (nothing to do on a CPU)."""
    if device == "cuda":
        import torch

        torch.cuda.empty_cache()


def model_record(model, preset: str) -> dict:
    """What meta.json's results say of the model: its counts, its shape (for the FLOP and byte
    counts), and the weight shapes of the decoder layer whose matrix multiplies are compared."""
    import torch

    counts = models.count_model(model, preset)
    sh = model_shape(model)
    layer = sh.layers // 2
    layers = getattr(getattr(model, model.base_model_prefix, None), "layers", None)
    if layers is None:  # a model folder of another layout (GPT-2's decoder layers are `h`)
        raise source.SourceError(
            f"{CHAPTER} compares one decoder layer's matrix multiplies, and {type(model).__name__} keeps "
            f"no decoder layers at .{model.base_model_prefix}.layers"
        )
    block = layers[layer]
    return {
        "model": counts.as_record(),
        "shape": asdict(sh),
        "gemm_layer": layer,
        "gemm_shapes": {
            name: [m.in_features, m.out_features] for name, m in block.named_modules() if isinstance(m, torch.nn.Linear)
        },
    }


def time_passes(
    model, prompts: dict, prompt_len: int, rounds: int, device: str, warmup: int = 2, progress=print
) -> tuple[harness.Timing, dict[int, harness.Timing | str]]:
    """Wall time of one decode step after a prefill of `prompts[prompt_len]` and of the prefill
    of every prompt `prompts[n]`, each into a fresh cache, timed interleaved (harness.interleaved):
    every round times the decode step and one prefill of each length once, in an order that
    rotates from round to round, so a change of the host's speed touches every length and both
    phases alike. The decode step's prefill is its `setup`, outside the timed span. Each length
    is first run once untimed: one that runs out of GPU memory is given the status "out of
    memory" instead of a timing. Returns the decode step's timing and {n: timing or status}."""
    import torch

    fits = {}
    for n, p in prompts.items():
        try:
            decode.prefill(model, p)
            harness.sync(device)
            fits[n] = True
        except torch.OutOfMemoryError:
            fits[n] = False
            progress(f"prompt {n}: out of GPU memory, recorded as such")
            free(device)
    context = prompts[prompt_len]
    variants = {
        "decode": (lambda cache, tok: decode.decode_step(model, cache, tok), lambda: decode.prefill(model, context))
    }
    variants |= {f"prefill {n}": (lambda p=p: decode.prefill(model, p)) for n, p in prompts.items() if fits[n]}
    t = harness.interleaved(
        variants,
        device=device,
        rounds=rounds,
        warmup=warmup,
        what="decode step and prefills",
        progress=progress,
        min_fast=harness.MIN_FAST_TRIALS,  # the chapter's headline: waits for a fast host
    )
    return t["decode"], {n: t[f"prefill {n}"] if fits[n] else "out of memory" for n in prompts}


def profile_prefill(
    model, prompt, device: str, trace_path, warmup: int = 2, label_modules: bool = True
) -> pd.DataFrame:
    """Profile one prefill (after `warmup` profiled-and-discarded ones in the same session),
    timed from a "prefill" annotation; write its trace to `trace_path`; return its kernels.
    With `label_modules` each kernel is labelled with the module that launched it."""
    return harness.profile_region(
        lambda: decode.prefill(model, prompt),
        trace_path,
        region=ORIGIN["prefill"],
        device=device,
        warmup=warmup,
        labels=(lambda: decode.annotated_modules(model)) if label_modules else None,
    )


def annotate(k: pd.DataFrame) -> pd.DataFrame:
    """A profile's kernels with kind, short name, decoder layer and part: the kernel table's columns."""
    return kernels.annotate(k)[KERNEL_COLUMNS]


def annotated_kernels(path, device: str, phase: str) -> pd.DataFrame:
    """The kernels of a phase's trace, with kind, short name, decoder layer and part."""
    return annotate(trace.read_kernels(path, device=device, origin=ORIGIN[phase]))


def census_table(k: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """census.csv: kernels and GPU time by kind, for each phase's kernel table in `k`."""
    parts = []
    for phase in PHASES:
        c = kernels.census(k[phase])
        c.insert(0, "phase", phase)
        parts.append(c)
    return pd.concat(parts, ignore_index=True)


def kind_column(kind: str) -> str:
    """The prompt sweep's column of GPU time for kernels of `kind` (e.g. "attention_ns")."""
    legacy = {MATMUL: "matmul_ns", "copy/convert/concat": "copy_ns"}
    return legacy.get(kind) or re.sub(r"\W+", "_", kind).strip("_") + "_ns"


# The prompt sweep's column of GPU time for each kind of kernel (kernels.KINDS decides the kinds).
KIND_COLUMNS = {kind: kind_column(kind) for kind in kernels.KINDS}


def sweep_row(n: int, k: pd.DataFrame, t: harness.Timing) -> dict:
    """The prompt sweep's row for a prompt of `n` tokens: its profiled kernels `k` and its timing `t`."""
    kind = k["name"].map(kernels.classify)
    by_kind = {col: int(k.loc[kind == name, "dur_ns"].sum()) for name, col in KIND_COLUMNS.items()}
    return {
        "prompt_len": n,
        "status": "ok",
        **kernels.profile_row(k),
        **by_kind,
        **t.summary(issue=True, count="wall_repeats", clean="wall_clean"),  # _estimate: the book's estimator
    }


def profile_sweep(
    model,
    prompts: dict,
    timings: dict,
    prompt_lens: list[int],
    prompt_len: int,
    prefill_kernels: pd.DataFrame,
    device: str,
    scratch,
) -> pd.DataFrame:
    """prompt_sweep.csv: one row per prompt length, each other length's prefill profiled once
    (its trace written to `scratch`, then deleted). The row of `prompt_len` is the phase's own
    profile (`prefill_kernels`): one measurement per configuration. A length that ran out of
    memory keeps that status."""
    import torch

    rows = []
    for n in prompt_lens:
        if isinstance(timings[n], str):
            rows.append({"prompt_len": n, "status": timings[n]})
            continue
        if n == prompt_len:
            rows.append(sweep_row(n, prefill_kernels, timings[n]))
            continue
        try:
            k = profile_prefill(model, prompts[n], device, scratch, warmup=1, label_modules=False)
            rows.append(sweep_row(n, k, timings[n]))
            r = rows[-1]
            progress(
                f"prompt {n}: GPU busy {r['gpu_busy_ns'] / 1e6:.2f} ms, matrix multiplies {r['matmul_ns'] / 1e6:.2f} ms"
            )
        except torch.OutOfMemoryError:
            rows.append({"prompt_len": n, "status": "out of memory"})
            progress(f"prompt {n}: out of GPU memory while profiling, recorded as such")
        finally:
            scratch.unlink(missing_ok=True)
            free(device)
    return pd.DataFrame(rows)
