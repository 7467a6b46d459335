"""The FLOP and byte model: what a forward pass of batch 1 must compute and move (the model's
shape, a pass's work, and the arithmetic intensity of a prefill's matrix multiplies)."""

from __future__ import annotations

from dataclasses import dataclass

from labsupport.measure import models

from .names import PHASES


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
        return 2 * self.layers * self.kv_heads * self.head_dim * self.bytes_per_value


def model_shape(model) -> ModelShape:
    """The shape of a built model (works on the `meta` device, too)."""
    counts = models.count_model(model)
    cfg = model.config
    return ModelShape(
        layers=cfg.num_hidden_layers,
        heads=cfg.num_attention_heads,
        kv_heads=cfg.num_key_value_heads,
        head_dim=cfg.head_dim,
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
