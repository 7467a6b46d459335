"""Tiny checkpoints of several decoder architectures, saved by save_pretrained (config.json and,
with weights, real safetensors that transformers loads back): the model folders the tests hand to
`python -m labsupport profile` and to the chapters' `model` parameter."""

from __future__ import annotations

from pathlib import Path

TINY = dict(
    vocab_size=256,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
)
# model type -> (configuration, saved with its weights?)
CHECKPOINTS = {
    "llama": (TINY, True),
    "qwen3": ({**TINY, "head_dim": 16}, True),
    "mistral": (TINY, True),
    "gpt2": (dict(vocab_size=256, n_embd=64, n_layer=2, n_head=4, n_positions=512), False),
}


def tiny_model(model_type: str):
    """The tiny model of `model_type`, its weights drawn from seed 0."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type, **CHECKPOINTS[model_type][0]))


def save_checkpoint(folder: Path, model_type: str, weights: bool = True) -> Path:
    """A tiny model of `model_type` saved to `folder` by save_pretrained (config.json and, with
    `weights`, model.safetensors)."""
    model = tiny_model(model_type)
    if weights:
        model.save_pretrained(folder)
    else:
        model.config.save_pretrained(folder)
    return folder
