"""Our Triton kernels compute what they claim: on a CPU they run in Triton's interpreter."""

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"  # before the kernels are first built

triton = pytest.importorskip("triton")
from labsupport.measure.kernels import triton_kernels  # noqa: E402

pytestmark = pytest.mark.unit

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("n", [1, 1000, 1024, 5000])
def test_add_matches_torch_exactly(n):
    x, y = torch.randn(n, device=DEVICE), torch.randn(n, device=DEVICE)
    assert torch.equal(triton_kernels.add(x, y, block=1024), x + y)
    assert triton_kernels.add_grid(n, 1024) == -(-n // 1024)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_rmsnorm_matches_the_reference(dtype):
    # The interpreter has no bfloat16 (numpy has none); the GPU run checks bfloat16 against
    # transformers and records the difference (model-code-to-kernels' rmsnorm_times.csv).
    x = torch.randn(3, 256, device=DEVICE, dtype=dtype) * 3
    w = torch.randn(256, device=DEVICE, dtype=dtype)
    xf = x.float()
    ref = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(dtype) * w
    out = triton_kernels.rmsnorm(x, w, 1e-6)
    assert out.shape == x.shape and out.dtype == dtype
    torch.testing.assert_close(out, ref, rtol=2e-3, atol=2e-3)
