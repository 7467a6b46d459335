"""The eager Qwen3-8B decode step timed by a plain script, outside the book's harness: the
yardstick the book's shared eager step (chapter "The kernels in one token") is checked against.

    python benchmarks/plain_eager_step.py --trials 100

Builds the model from its published configuration with random weights (nothing is downloaded),
prefills a fresh 256-token prompt before every trial (outside the timed span), times one decode
step per trial with the host clock around a synchronised call, and prints one JSON line: the
minimum, quartiles and median in ms. It imports nothing from labsupport, on purpose.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
from transformers import AutoModelForCausalLM, DynamicCache, Qwen3Config

QWEN3_8B = dict(
    vocab_size=151936,
    hidden_size=4096,
    intermediate_size=12288,
    num_hidden_layers=36,
    num_attention_heads=32,
    num_key_value_heads=8,
    head_dim=128,
    max_position_embeddings=40960,
    rope_theta=1_000_000.0,
    rms_norm_eps=1e-6,
    tie_word_embeddings=False,
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=100)
    ap.add_argument("--prompt-len", type=int, default=256)
    a = ap.parse_args()
    cfg = Qwen3Config(**QWEN3_8B)
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).eval()
    ids = torch.randint(0, cfg.vocab_size, (1, a.prompt_len), generator=torch.Generator().manual_seed(0)).cuda()
    walls = []
    with torch.inference_mode():
        for i in range(a.trials + 3):
            cache = DynamicCache(config=cfg)
            out = model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
            tok = out.logits[:, -1].argmax(-1, keepdim=True)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            out = model(input_ids=tok, past_key_values=cache, use_cache=True)
            out.logits[:, -1].argmax(-1, keepdim=True)
            torch.cuda.synchronize()
            if i >= 3:
                walls.append((time.perf_counter() - t0) * 1e3)
    q = statistics.quantiles(walls, n=4)
    print(
        json.dumps(
            {
                "what": "plain eager step",
                "trials": len(walls),
                "min_ms": min(walls),
                "q1_ms": q[0],
                "median_ms": q[1],
                "q3_ms": q[2],
                "max_ms": max(walls),
                "torch": torch.__version__,
            }
        )
    )


if __name__ == "__main__":
    main()
