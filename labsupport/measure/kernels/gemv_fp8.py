"""FP8 weights for our GEMV: each weight matrix stored as float8 E4M3 (torch.float8_e4m3fn, one
byte a weight) with one float32 scale per output row (per channel), read by our Triton GEMV
(labsupport.measure.kernels.gemv, `scale=`) with BF16 activations and float32 accumulation.

Per-channel scaling: row i is divided by s_i = max_j |W_ij| / 448 (448 is E4M3's largest
finite value), so every row uses the format's whole range and its largest weight is exact
to E4M3's precision; the kernel multiplies each row's sum by s_i at the end (a row's scale
factors out of its dot product).

Why the error is larger than BF16's: E4M3 keeps 3 mantissa bits, so neighbouring values are
2^-3 apart relative to their power of two and rounding to nearest is off by at most half that,
2^-4 (6.25%) at the bottom of a power of two and less above it; what it is on average over a
model's weights is measured from the weights themselves (rounding_error: about 2.25% on
near-Gaussian weights). BF16 keeps 8 significant bits (7 stored), a relative step of 2^-7. The
weights' rounding error is therefore about 2^4 = 16 times BF16's. (Weights far below their row's
largest, under 2^-6 x s_i (E4M3's smallest normal value, scaled), fall into E4M3's subnormals and
lose more; with the near-Gaussian weights of a linear layer those are a small share.) The
chapter's FP8 tolerance follows from that (closing_the_gap.params.FP8_ERROR_FACTOR).

In a model run in float16 the activations, norms and eager's step are float16, which keeps 11
significant bits (10 stored), a relative step of 2^-10: eager's own error against float32 is
about 2^3 = 8 times smaller than in BF16, while the FP8 weights' rounding error is the same
E4M3 step. Against eager's own error the FP8 weights are then 2^-3 / 2^-10 = 2^7 = 128 times
coarser, and the tolerance is the same factor times 128 (tolerance_factor(f, "float16")).
"""

from __future__ import annotations

E4M3_MAX = 448.0  # the largest finite float8_e4m3fn
MANTISSA_BITS = 3  # E4M3's stored mantissa bits; BF16 stores 7
RELATIVE_STEP = 2.0**-MANTISSA_BITS  # spacing of neighbouring values, relative to their power of two
BF16_RELATIVE_STEP = 2.0**-7
# The relative step of the model's half-precision type: 7 stored mantissa bits (BF16), 10 (float16).
HALF_RELATIVE_STEP = {"bfloat16": BF16_RELATIVE_STEP, "float16": 2.0**-10}
E4M3_MIN_NORMAL = 2.0**-6  # below it (scaled), E4M3's subnormals: a coarser relative step


def quantize(w, emulate: bool = False):
    """(W in E4M3, float32 row scales) of a weight [N, K]: W ~ W8 * scale[:, None]. With
    `emulate`, W8 is returned as float32 holding the E4M3 values exactly (for Triton's
    interpreter, which has no float8 type)."""
    import torch

    wf = w.float()
    scale = (wf.abs().amax(dim=1) / E4M3_MAX).clamp(min=1e-12)
    w8 = (wf / scale[:, None]).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return (w8.float() if emulate else w8), scale.contiguous()


def rounding_error(weights, rows: int = 8192) -> dict:
    """How far quantize() moves the weights, measured on them: the mean relative error |W8 x
    scale - W| / |W| over every nonzero weight, the largest over the weights in E4M3's normal range
    (at least E4M3_MIN_NORMAL of their row's scale: at most 2^-4 there), the largest over all (a
    subnormal can lose most of itself), and the share of weights below the normal range. `weights`:
    the weight matrices [N, K] (any device), quantized `rows` rows at a time."""
    total, count, worst_normal, worst, below = 0.0, 0, 0.0, 0.0, 0
    for w in weights:
        for part in w.detach().split(rows):
            w8, scale = quantize(part)
            wf = part.float()
            back = w8.float() * scale[:, None]
            nonzero = wf != 0
            rel = ((back - wf).abs() / wf.abs().clamp(min=1e-30))[nonzero]
            normal = (wf.abs() >= E4M3_MIN_NORMAL * scale[:, None])[nonzero]
            total += float(rel.double().sum())
            count += int(nonzero.sum())
            worst = max(worst, float(rel.max())) if rel.numel() else worst
            worst_normal = max(worst_normal, float(rel[normal].max())) if normal.any() else worst_normal
            below += int((~normal).sum())
    return {
        "mean": total / count if count else float("nan"),
        "max_normal": worst_normal,
        "max": worst,
        "subnormal_share": below / count if count else float("nan"),
        "weights": count,
    }


def dequantize(w8, scale, dtype):
    """The weight W8 * scale as `dtype` (for the prompt's matmuls, through F.linear)."""
    return (w8.float() * scale[:, None]).to(dtype)


def tolerance_factor(error_factor: float, dtype: str = "bfloat16") -> float:
    """The FP8 rung's allowed error, as a multiple of eager's own: the other rungs' factor times
    the ratio of E4M3's relative step to that of the model's `dtype` (BF16: 2^-3 / 2^-7 = 16;
    float16: 2^-3 / 2^-10 = 128; module docstring)."""
    return error_factor * RELATIVE_STEP / HALF_RELATIVE_STEP[dtype]
