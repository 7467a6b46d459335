"""Model presets, built from published configurations with random weights, and their counts
(parameters, the bytes a decode step reads). Beside them: qwen3_decode, our own Qwen3 decode step
in the manner of gpt-fast, and gated_deltanet, the hybrid model's linear-attention backends.

Nothing here downloads anything: a preset is a configuration written out in
full, and the model is created from it with random weights directly on the
target device.  Which kernels run, and for how long, depends on shapes, dtypes
and code paths, not on the values of the weights.
"""

from __future__ import annotations

from dataclasses import dataclass

# Qwen3-8B's published configuration (config.json of the released model).
QWEN3_8B = dict(
    model_type="qwen3",
    vocab_size=151_936,
    hidden_size=4096,
    intermediate_size=12_288,
    num_hidden_layers=36,
    num_attention_heads=32,
    num_key_value_heads=8,
    head_dim=128,
    hidden_act="silu",
    max_position_embeddings=40_960,
    rms_norm_eps=1e-6,
    rope_theta=1_000_000.0,
    tie_word_embeddings=False,
    attention_bias=False,
)

# Qwen3-1.7B's published configuration (config.json of Qwen/Qwen3-1.7B on Hugging Face): the
# same architecture as Qwen3-8B, smaller, with the LM head tied to the embedding table. It is
# the preset offered on a GPU too small for Qwen3-8B (labsupport.measure.environment).
QWEN3_1_7B = dict(
    QWEN3_8B,
    hidden_size=2048,
    intermediate_size=6144,
    num_hidden_layers=28,
    num_attention_heads=16,
    num_key_value_heads=8,
    head_dim=128,
    tie_word_embeddings=True,
)

# Same architecture at toy size: used by the tests to run the live path on a CPU.
TINY = dict(
    QWEN3_8B,
    vocab_size=512,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=4096,
)


def _every_fourth_full(layers: int) -> list[str]:
    return ["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(layers)]


# The 27B hybrid class (Qwen3.5-27B): 48 Gated DeltaNet (linear attention) layers and 16
# full-attention layers, every fourth (transformers' Qwen3_5TextConfig).
QWEN3_5_27B = dict(
    model_type="qwen3_5_text",
    vocab_size=248_320,
    hidden_size=5120,
    intermediate_size=17_408,
    num_hidden_layers=64,
    layer_types=_every_fourth_full(64),
    num_attention_heads=24,
    num_key_value_heads=4,
    head_dim=256,
    partial_rotary_factor=0.25,
    rope_theta=10_000_000.0,
    linear_num_key_heads=16,
    linear_num_value_heads=48,
    linear_key_head_dim=128,
    linear_value_head_dim=128,
    linear_conv_kernel_dim=4,
    tie_word_embeddings=False,
)

# The same hybrid architecture at toy size, for tests on a CPU.
TINY_HYBRID = dict(
    QWEN3_5_27B,
    vocab_size=512,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=4,
    layer_types=_every_fourth_full(4),
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    linear_key_head_dim=16,
    linear_value_head_dim=16,
    max_position_embeddings=4096,
)

PRESETS = {
    "qwen3-8b": QWEN3_8B,
    "qwen3-1.7b": QWEN3_1_7B,
    "tiny": TINY,
    "qwen3.5-27b": QWEN3_5_27B,
    "tiny-hybrid": TINY_HYBRID,
}


class UnknownPresetError(ValueError):
    """Raised for a model preset name that is not in PRESETS."""


def preset_config(name: str) -> dict:
    """The configuration dict of preset `name`, or a clear error listing the known ones."""
    try:
        return dict(PRESETS[name])
    except KeyError:
        known = ", ".join(sorted(PRESETS))
        raise UnknownPresetError(f"unknown model preset {name!r}; known presets: {known}") from None


def weight_shapes(config: dict) -> dict[str, tuple[int, int]]:
    """The weight matrices of one decoder layer (separate, and fused as our own decode step runs
    them) and the LM head, by name: (rows N, columns K), as a matmul of one token reads them.
    `config`: a preset's (preset_config) or a loaded model's (`model.config.to_dict()`)."""
    h, i = config["hidden_size"], config["intermediate_size"]
    head = config.get("head_dim") or h // config["num_attention_heads"]
    q, kv = config["num_attention_heads"] * head, config["num_key_value_heads"] * head
    return {
        "q_proj": (q, h),
        "k_proj / v_proj": (kv, h),
        "o_proj": (h, q),
        "gate_proj / up_proj": (i, h),
        "down_proj": (h, i),
        "qkv (fused)": (q + 2 * kv, h),
        "gate_up (fused)": (2 * i, h),
        "lm_head": (config["vocab_size"], h),
    }


def hf_config(name: str):
    """A transformers configuration object for preset `name`."""
    from transformers import AutoConfig

    cfg = preset_config(name)
    model_type = cfg.pop("model_type")
    rope = {"rope_theta": cfg.pop("rope_theta")}
    if "partial_rotary_factor" in cfg:
        rope["partial_rotary_factor"] = cfg.pop("partial_rotary_factor")
    config = AutoConfig.for_model(model_type, **cfg)
    # transformers 5 keeps rope settings in `rope_parameters`; older releases as attributes.
    if hasattr(config, "rope_parameters") and isinstance(config.rope_parameters, dict):
        config.rope_parameters.update(rope)
    else:
        for key, value in rope.items():
            setattr(config, key, value)
    return config


# The half-precision types a chapter's model may run in (its `dtype` parameter): bfloat16, the
# default every published run used, or float16 for GPUs without BF16 (compute capability below 8.0).
DTYPES = ("bfloat16", "float16")
DEFAULT_DTYPE = "bfloat16"


def torch_dtype(dtype=None):
    """The torch dtype of `dtype` (a name of DTYPES, a torch dtype, or None: bfloat16)."""
    import torch

    if dtype is None:
        return torch.bfloat16
    if isinstance(dtype, str):
        if dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, not {dtype!r}")
        return getattr(torch, dtype)
    return dtype


def dtype_label(dtype: str | None = None) -> str:
    """How the pages name a dtype: "BF16" or "FP16"."""
    return {"bfloat16": "BF16", "float16": "FP16"}.get(dtype or DEFAULT_DTYPE, str(dtype))


def run_dtype(run) -> str:
    """The dtype a recorded run's model ran in: runs from before the parameter ran in bfloat16."""
    return (getattr(run, "parameters", None) or {}).get("dtype", DEFAULT_DTYPE)


def build_model(name: str, device="cpu", dtype=None):
    """Preset `name` with random weights, created directly on `device` (no hub, no copy), in
    `dtype` (a name of DTYPES or a torch dtype; None: bfloat16)."""
    import torch
    from transformers import AutoModelForCausalLM

    dtype = torch_dtype(dtype)
    config = hf_config(name)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    return model.eval()


@dataclass(frozen=True)
class ModelCounts:
    """Parameter and byte counts of a model, derived from its modules."""

    preset: str
    parameters: int
    embedding_parameters: int
    matmul_weight_parameters: int
    bytes_per_parameter: int
    layers: int

    @property
    def non_embedding_parameters(self) -> int:
        return self.parameters - self.embedding_parameters

    @property
    def decode_bytes(self) -> int:
        """Bytes of weights one decode step reads: every weight outside the embedding table
        (the embedding lookup reads one row, which is negligible). A table tied to the LM head
        is read whole by it: count_model then counts no embedding parameters."""
        return self.non_embedding_parameters * self.bytes_per_parameter

    @property
    def matmul_bytes(self) -> int:
        """Bytes of the weight matrices the matrix multiplies read once each per step."""
        return self.matmul_weight_parameters * self.bytes_per_parameter

    @property
    def decode_flops(self) -> int:
        """Operations of one token's matrix-vector products: a multiply and an add per weight."""
        return 2 * self.matmul_weight_parameters

    def as_record(self) -> dict:
        """The counts and the byte and operation totals derived from them, as a run records them."""
        from dataclasses import asdict

        return {
            **asdict(self),
            "decode_bytes": self.decode_bytes,
            "matmul_bytes": self.matmul_bytes,
            "decode_flops": self.decode_flops,
        }


def count_model(model, preset: str = "") -> ModelCounts:
    """Counts of a built model (works on a model on the `meta` device, too)."""
    import torch

    params = list(model.parameters())
    total = sum(p.numel() for p in params)
    embed = model.get_input_embeddings().weight.numel()
    out = model.get_output_embeddings()
    if out is not None and out.weight is model.get_input_embeddings().weight:
        embed = 0  # tied: the table is also the LM head's weight, which every step reads whole
    linear = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    return ModelCounts(
        preset=preset,
        parameters=total,
        embedding_parameters=embed,
        matmul_weight_parameters=linear,
        bytes_per_parameter=params[0].element_size(),
        layers=model.config.num_hidden_layers,
    )


def preset_counts(name: str, dtype=None) -> ModelCounts:
    """Counts of preset `name` in `dtype` (None: BF16), from a model built on the meta device
    (no memory used)."""
    return count_model(build_model(name, device="meta", dtype=dtype), preset=name)
