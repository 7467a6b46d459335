"""The layer and step kernels (labsupport.measure.kernels.megakernel) checked and timed against
the folded-norms step's kernels on Qwen3-8B's shapes, in a minute or two, before a nightly spends
its quarter of an hour on them: random folded weights for a few layers and an LM head, run three
ways on the same input:

- **separate kernels**: rung 14's, each layer's folded GEMVs and its one-kernel attention
  (qwen3_decode.layer with the folded-norms options), then the LM head's GEMV with its argmax;
- **one kernel a layer** (rung 16's): the layer kernel on each layer, the same LM head;
- **one kernel a step** (rung 17's): the step kernel, every layer and the LM head.

All three launch their kernels with programmatic dependent launch (on a CPU the waits are no-ops:
the interpreter runs one kernel after another). It prints one JSON line: each way's largest logit
difference from the separate kernels' (over their largest logit), whether its argmax token is
theirs, the waits that gave up, and on a GPU each way's microseconds per step of these layers,
replayed in a CUDA graph. The layer kernel's configs are tuned first, as the chapter's notebook
tunes them.

    python benchmarks/megakernel_check.py --layers 4
    python benchmarks/megakernel_check.py --tiny     (a CPU: Triton's interpreter, no timing)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import asdict
from pathlib import Path

QWEN3_8B = dict(hidden=4096, inter=12288, heads=32, kv_heads=8, head_dim=128, vocab=151936, slots=272, pos=256)
TINY = dict(hidden=40, inter=24, heads=4, kv_heads=2, head_dim=16, vocab=50, slots=20, pos=13)
WAYS = ("separate kernels", "one kernel a layer", "one kernel a step")


def check(shape: dict, layers: int, device: str, seed: int = 0) -> dict:
    """Run the three ways on `layers` random layers of `shape` on `device`; the JSON line's fields."""
    import torch

    from labsupport.measure import hardware
    from labsupport.measure.kernels import folded_norms, gemv, megakernel
    from labsupport.measure.models import qwen3_decode

    s = shape
    g = torch.Generator(device="cpu").manual_seed(seed)
    dt = torch.bfloat16 if device == "cuda" else torch.float32

    def r(*size, scale=1.0):
        return (torch.randn(*size, generator=g) * scale).to(device=device, dtype=dt)

    qkv_rows = (s["heads"] + 2 * s["kv_heads"]) * s["head_dim"]
    ws = [{"qkv": r(qkv_rows, s["hidden"], scale=s["hidden"] ** -0.5),
           "o_proj": r(s["hidden"], s["heads"] * s["head_dim"], scale=(s["heads"] * s["head_dim"]) ** -0.5),
           "gate_up": r(2 * s["inter"], s["hidden"], scale=s["hidden"] ** -0.5),
           "down": r(s["hidden"], s["inter"], scale=s["inter"] ** -0.5),
           "q_norm": 0.5 + r(s["head_dim"]).abs(), "k_norm": 0.5 + r(s["head_dim"]).abs()}
          for _ in range(layers)]  # fmt: skip
    caches = [(r(1, s["kv_heads"], s["slots"], s["head_dim"]), r(1, s["kv_heads"], s["slots"], s["head_dim"]))
              for _ in range(layers)]  # fmt: skip
    lm = r(s["vocab"], s["hidden"], scale=s["hidden"] ** -0.5)
    x = r(1, 1, s["hidden"])
    cfg = type("Cfg", (), {"rope_theta": 1_000_000.0, "head_dim": s["head_dim"]})()
    cos, sin = qwen3_decode.rotary(cfg, s["slots"], device, dt)
    pos = torch.tensor([s["pos"]], device=device)
    shape_ = qwen3_decode.Shape(s["heads"], s["kv_heads"], s["head_dim"], 1e-6)
    kernels = qwen3_decode.ops()
    if device == "cuda":
        megakernel.tune(s["hidden"], s["inter"], s["heads"], s["kv_heads"], s["head_dim"], s["slots"], s["pos"], dt)

    def fresh():
        """Each way's own caches, Σx² scalars and argmax word, as a step finds them."""
        own = [(kc.clone(), vc.clone()) for kc, vc in caches]
        sums = folded_norms.sums(layers, device)
        sums[0, 0] = x.float().pow(2).sum()
        return own, sums, folded_norms.argmax_word(device)

    def layers_then_head(own, sums, word, layer_kernel: bool):
        opts = qwen3_decode.Options(fused=True, matmul="triton", fuse_gemv=True, fused_attention=True, pdl=True,
                                    early_weights=True, one_attention=True, fold_norms=True,
                                    layer_kernel=layer_kernel)  # fmt: skip
        h = x
        for i, (w, (kc, vc)) in enumerate(zip(ws, own, strict=True)):
            mats = (None, None, w["q_norm"], w["k_norm"], w["qkv"], w["o_proj"], w["gate_up"], w["down"])
            h = qwen3_decode.layer(h, pos, cos, sin, kc, vc, *mats, shape=shape_, opts=opts, kernels=kernels,
                                   sums=sums[2 * i : 2 * i + 3])  # fmt: skip
        return gemv.gemv(h, lm, eps=1e-6, sumsq_in=sums[-1, :1], argmax=word, pdl=True, early=True).reshape(-1)

    def one_launch(own, sums, word):
        table = megakernel.table([{**w, "k_cache": kc, "v_cache": vc} for w, (kc, vc) in zip(ws, own, strict=True)])
        return megakernel.step(
            x, table, lm, word, cos, sin, pos, sums, inter=s["inter"], heads=s["heads"], kv_heads=s["kv_heads"],
            head_dim=s["head_dim"], slots=s["slots"], eps=1e-6, pdl=True,
        )  # fmt: skip

    runs = {WAYS[0]: lambda *a: layers_then_head(*a, layer_kernel=False),
            WAYS[1]: lambda *a: layers_then_head(*a, layer_kernel=True), WAYS[2]: one_launch}  # fmt: skip
    gave_up = megakernel.timeouts(device)
    out, tokens, us = {}, {}, {}
    for way, run in runs.items():
        state = fresh()
        with torch.no_grad():
            out[way] = run(*state).float()
            tokens[way] = int(folded_norms.token_of(state[2]))
            if device == "cuda":  # replayed on the state the first call left (the numbers are checked above, not here)
                us[way] = hardware.graph_us_per_call(lambda run=run, state=state: run(*state), 1)
    ref, top = out[WAYS[0]], float(out[WAYS[0]].abs().max())
    config = megakernel.chosen(s["hidden"], s["inter"], s["heads"], s["kv_heads"], s["head_dim"], s["slots"])
    return {
        "device": torch.cuda.get_device_name() if device == "cuda" else device,
        "layers": layers,
        "shape": s,
        "config": asdict(config),
        "rel_diff": {way: float((o - ref).abs().max()) / top for way, o in out.items()},
        "same_token": {way: t == tokens[WAYS[0]] for way, t in tokens.items()},
        "timeouts": megakernel.timeouts(device) - gave_up,
        "us": us,
    }


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--tiny", action="store_true", help="small shapes, on the CPU in Triton's interpreter")
    a = parser.parse_args(argv)
    if a.tiny:  # Triton's interpreter runs one kernel, and one program, after another: a wait is a no-op there
        os.environ["TRITON_INTERPRET"] = "1"
        import triton.language.extra.cuda as cuda

        cuda.gdc_wait = cuda.gdc_launch_dependents = lambda *args, **kwargs: None
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    print(json.dumps(check(TINY if a.tiny else QWEN3_8B, a.layers, "cpu" if a.tiny else "cuda")))


if __name__ == "__main__":
    main()
