"""The cluster form of the one-kernel attention (CUDA C++, labsupport.measure.kernels.cluster_attention):
which shapes it takes, why it cannot run where it cannot, how the tuner and the page name it, and that
its source builds for Hopper where nvcc is installed. (It runs only on a GPU of compute capability 9.0
or later: the nightly checks its output against the two-kernel form there, in every rung's check.)"""

import shutil
import subprocess

import pytest
import torch

from labsupport.chapters.closing_the_gap import prose
from labsupport.measure.kernels import cluster_attention, decode_attention

pytestmark = pytest.mark.unit


def test_it_takes_bfloat16_heads_of_128_and_at_most_a_cluster_of_stretches():
    # Qwen3-8B at 256 tokens: 272 slots, 5 stretches of 64 or 3 of 128; 9 of 32 exceed the portable 8
    assert cluster_attention.fits(272, 64, 128, torch.bfloat16)
    assert cluster_attention.fits(272, 128, 128, torch.bfloat16)
    assert not cluster_attention.fits(272, 32, 128, torch.bfloat16)
    assert not cluster_attention.fits(272, 64, 64, torch.bfloat16)  # another head size
    assert not cluster_attention.fits(272, 64, 128, torch.float16)
    assert not cluster_attention.fits(272, 48, 128, torch.bfloat16)  # a length it is not built for


def test_it_says_why_it_cannot_run_without_a_cuda_gpu_and_refuses_shapes_it_does_not_take():
    assert cluster_attention.unusable("cpu") == "needs a CUDA GPU, not cpu"
    kc = torch.zeros(1, 2, 20, 16)
    with pytest.raises(ValueError, match="cluster attention takes bfloat16 heads of 128"):
        cluster_attention.attention(torch.zeros(128), None, None, None, None, kc, kc, None, 4, 1e-6, 64, False)


def test_the_tuner_adds_the_cluster_configs_only_where_the_kernel_can_run():
    plain = decode_attention.tuned_configs(4, 128)
    both = decode_attention.tuned_configs(4, 128, cluster_for=(272, torch.bfloat16))
    assert not any(c.cluster for c in plain)
    assert both[: len(plain)] == plain
    assert [(c.block_s, c.num_warps, c.per_head) for c in both[len(plain) :]] == [(64, 4, True), (128, 8, True)]
    # a cache of 1,024 positions is 16 stretches of 64 (more than a cluster holds), 8 of 128
    longer = decode_attention.tuned_configs(4, 128, cluster_for=(1024, torch.bfloat16))
    assert [(c.block_s, c.num_warps) for c in longer[len(plain) :]] == [(128, 8)]
    assert decode_attention.tuned_configs(4, 128, cluster_for=(272, torch.float16)) == plain


def test_decode_attention_one_runs_the_cluster_kernel_for_a_cluster_config():
    # on a CPU the cluster kernel refuses the float32 heads of 16 it is handed, with its own error
    kc = torch.zeros(1, 2, 20, 16)
    config = decode_attention.OneConfig(64, 4, per_head=True, cluster=True)
    with pytest.raises(ValueError, match="cluster attention takes"):
        decode_attention.decode_attention_one(
            torch.zeros(128), None, None, None, None, kc, kc.clone(), None, 4, 1e-6, config=config
        )


def test_the_page_names_the_cluster_form_and_why_it_is_cuda():
    words = prose.attention_form({"per_head": True, "cluster": True})
    assert words.startswith("one program per query head, a head's programs one thread-block cluster")
    assert words.endswith("in CUDA C++ since Triton cannot address another block's shared memory")
    assert prose.attention_form({"per_head": True, "cluster": False}) == "one program per query head"


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed here")
def test_the_cuda_source_builds_for_hopper_without_spilling(tmp_path):
    out = subprocess.run(
        ["nvcc", "-O3", "-gencode=arch=compute_90,code=sm_90", "--ptxas-options=-v", "-c",
         str(cluster_attention.SOURCE), "-o", str(tmp_path / "k.o")],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    kernels = [line for line in out.stderr.splitlines() if "spill stores" in line]
    assert len(kernels) == len(cluster_attention.BLOCKS)  # one instantiation per block length
    assert all("0 bytes spill stores" in line for line in kernels)


def test_it_refuses_a_tensor_it_cannot_read_eight_bytes_at_a_time():
    # the step's tensors are contiguous and aligned; a strided view, or one a bfloat16 off, is refused
    kc = torch.zeros(1, 8, 272, 128, dtype=torch.bfloat16)
    qkv = torch.zeros(48 * 128 + 1, dtype=torch.bfloat16)
    ones = torch.ones(128, dtype=torch.bfloat16)
    table = torch.zeros(272, 128, dtype=torch.bfloat16)
    args = (ones, ones, table, table, kc, kc.clone(), None, 32, 1e-6, 64, False)
    with pytest.raises(ValueError, match="8-byte-aligned addresses; qkv is not"):
        cluster_attention.attention(qkv[1:], *args)
    with pytest.raises(ValueError, match="; cos is not"):
        cluster_attention.attention(qkv[:-1], ones, ones, table.t().contiguous().t(), table, kc, kc, None, 32, 1e-6,
                                    64, False)  # fmt: skip


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed here")
def test_after_the_wait_the_qkv_gemvs_output_is_read_through_l2_never_the_read_only_path(tmp_path):
    """With PDL the kernel lives while the QKV GEMV still writes its output, so that output must not be read by
    ld.global.nc (correct only for memory nothing writes during the kernel): in the PTX of every instantiation, each
    load after griddepcontrol.wait is ld.global.cg (the q, k and v rows, five a lane), and the read-only loads (the
    rotary rows, the norms' weights, the position) all come before the wait."""
    ptx = tmp_path / "k.ptx"
    out = subprocess.run(
        ["nvcc", "-O3", "-arch=sm_90", "-ptx", str(cluster_attention.SOURCE), "-o", str(ptx)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    bodies = ptx.read_text().split(".entry")[1:]
    assert len(bodies) == len(cluster_attention.BLOCKS)
    for body in bodies:
        before, after = body.split("griddepcontrol.wait;")
        loads_after = [line.split()[0] for line in after.splitlines() if line.strip().startswith("ld.global")]
        assert loads_after == ["ld.global.cg.v2.u32"] * 5
        assert sum(line.strip().startswith("ld.global.nc") for line in before.splitlines()) == 7  # 6 rows and pos
