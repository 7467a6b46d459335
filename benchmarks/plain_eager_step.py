"""The eager Qwen3-8B decode step timed by a plain script, outside the book's harness: the
yardstick the book's shared eager step (chapter "The kernels in one token") is checked against.

    python benchmarks/plain_eager_step.py --trials 100
    python benchmarks/plain_eager_step.py --trials 60 --csv plain_eager_step.csv

Builds the model from its published configuration with random weights (nothing is downloaded),
prefills a fresh 256-token prompt before every trial (outside the timed span), times one decode
step per trial with the host clock around a synchronised call, and prints one JSON line: the
minimum, quartiles and median in ms. The timing imports nothing from labsupport, on purpose.
With `--csv` it also writes one row per trial, `wall_ms` and `probe_ms`: the reading of the book's
host probe (labsupport.measure.hostprobe.sample, the one import, made only then) taken just before
the trial, so that the book estimates this step as it estimates its own. `--tiny` (a two-layer
model) and `--device cpu` exercise the script where no GPU is.
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import sys
import time
from pathlib import Path

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
TINY = {**QWEN3_8B, "vocab_size": 1000, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16}  # fmt: skip


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def probe():
    """The book's host probe (one timing of its fixed CPU workload), imported only for --csv."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from labsupport.measure import hostprobe

    return hostprobe.sample


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=100)
    ap.add_argument("--prompt-len", type=int, default=256)
    ap.add_argument("--csv", type=Path, help="also write every trial (wall_ms, probe_ms) to this file")
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--tiny", action="store_true", help="a two-layer model of the same shape family")
    a = ap.parse_args()
    if a.trials < 2 or a.prompt_len < 1:
        ap.error("--trials must be at least 2 and --prompt-len at least 1")
    sample = probe() if a.csv else (lambda: float("nan"))
    cfg = Qwen3Config(**(TINY if a.tiny else QWEN3_8B))
    with torch.device(a.device):
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).eval()
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, cfg.vocab_size, (1, a.prompt_len), generator=gen).to(a.device)
    walls, probes = [], []
    with torch.inference_mode():
        for i in range(a.trials + 3):
            cache = DynamicCache(config=cfg)
            out = model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
            tok = out.logits[:, -1].argmax(-1, keepdim=True)
            sync(a.device)
            p = sample()
            t0 = time.perf_counter()
            out = model(input_ids=tok, past_key_values=cache, use_cache=True)
            out.logits[:, -1].argmax(-1, keepdim=True)
            sync(a.device)
            if i >= 3:
                walls.append((time.perf_counter() - t0) * 1e3)
                probes.append(p)
    if a.csv:
        tmp = a.csv.with_name(a.csv.name + ".tmp")
        with tmp.open("w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["trial", "wall_ms", "probe_ms"])
            w.writerows((i, w_ms, p_ms) for i, (w_ms, p_ms) in enumerate(zip(walls, probes, strict=True)))
        tmp.replace(a.csv)  # whole or not at all
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
