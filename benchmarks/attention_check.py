"""The one-kernel attention (labsupport.measure.kernels.decode_attention) checked and timed on
Qwen3-8B's shapes at 256 tokens, in half a minute, before a nightly spends its minutes on it:

- **checked**: every config tune_one may choose (the cluster kernel's where it builds), against the
  two-kernel form, on the same cache;
- **alone**: tune_one's time per call of each config, and the two kernels' timed the same way;
- **after the QKV GEMV**: the time a layer's QKV GEMV and its attention add to a CUDA graph of many
  layers, as a step runs them (the GEMV PDL-launched with its weights first, the one kernel too),
  less the GEMVs alone: what the attention costs a step's layer, which its time alone need not say.

    python benchmarks/attention_check.py

It prints one JSON line.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

HEADS, KV_HEADS, HEAD_DIM, HIDDEN, SLOTS, POS = 32, 8, 128, 4096, 272, 256


def check(layers: int = 36) -> dict:
    """The JSON line's fields (module docstring), on `layers` layers' own caches and QKV weights."""
    import torch

    from labsupport.measure import hardware
    from labsupport.measure.kernels import cluster_attention, gemv
    from labsupport.measure.kernels import decode_attention as da

    dev, dt = "cuda", torch.bfloat16
    g = torch.Generator(device="cpu").manual_seed(0)

    def r(*size, scale=1.0):
        return (torch.randn(*size, generator=g) * scale).to(device=dev, dtype=dt)

    rows = (HEADS + 2 * KV_HEADS) * HEAD_DIM
    caches = [(r(1, KV_HEADS, SLOTS, HEAD_DIM), r(1, KV_HEADS, SLOTS, HEAD_DIM)) for _ in range(layers)]
    wqkv = [r(rows, HIDDEN, scale=HIDDEN**-0.5) for _ in range(layers)]
    x, qkv = r(1, 1, HIDDEN), r(rows)
    qn, kn = 0.5 + r(HEAD_DIM).abs(), 0.5 + r(HEAD_DIM).abs()
    cos, sin = r(SLOTS, HEAD_DIM), r(SLOTS, HEAD_DIM)
    at = torch.tensor([POS], device=dev)
    args = (qn, kn, cos, sin)

    kc, vc = caches[0]
    ref = da.decode_attention(qkv, *args, kc.clone(), vc.clone(), at, HEADS, 1e-6).float()
    diff = {}
    cluster = cluster_attention.unusable(dev) is None
    for c in da.tuned_configs(HEADS // KV_HEADS, HEAD_DIM, cluster_for=(SLOTS, dt) if cluster else None):
        out = da.decode_attention_one(qkv, *args, kc.clone(), vc.clone(), at, HEADS, 1e-6, config=c).float()
        form = "c" if c.cluster else "h" if c.per_head else "g"
        diff[f"{c.block_s}x{c.num_warps}{form}"] = float((out - ref).abs().max())

    alone = da.tune_one(HEADS, KV_HEADS, HEAD_DIM, SLOTS, POS, dt)

    def two_kernels():
        for kc, vc in caches:
            da.decode_attention(qkv, *args, kc, vc, at, HEADS, 1e-6)

    two_alone = hardware.graph_us_per_call(two_kernels, layers)

    def chain(attention):  # each layer's QKV GEMV, then (with `attention`) its attention on that GEMV's output
        def run():
            for w, (kc, vc) in zip(wqkv, caches, strict=True):
                y = gemv.gemv(x, w, pdl=True, early=True).reshape(-1)
                if attention == "one":
                    da.decode_attention_one(y, *args, kc, vc, at, HEADS, 1e-6, pdl=True)
                elif attention == "two":
                    da.decode_attention(y, *args, kc, vc, at, HEADS, 1e-6)

        return hardware.graph_us_per_call(run, layers)

    gemvs = chain(None)
    return {
        "device": torch.cuda.get_device_name(),
        "max_abs_diff_vs_two_kernels": diff,
        "alone_us": alone,
        "two_kernels_alone_us": two_alone,
        "after_qkv_us": {"gemv alone": gemvs, "one kernel": chain("one") - gemvs, "two kernels": chain("two") - gemvs},
    }


def main() -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    print(json.dumps(check()))


if __name__ == "__main__":
    main()
