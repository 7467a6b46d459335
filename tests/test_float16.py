"""The float16 path (the `dtype` parameter) on the CPU with the tiny model: the live cells record
a run that says float16 and counts two bytes a weight; runs recorded before the parameter
(every published run) read as bfloat16; the rates and tolerances follow the run's dtype."""

from types import SimpleNamespace

import pytest

from labsupport.chapters import closing_the_gap as gap
from labsupport.chapters import kernels_in_one_token as one_token
from labsupport.chapters import launch_overhead as launch
from labsupport.measure import hardware, models

from .live_cells import run_live_cells

pytestmark = pytest.mark.unit

TINY_TOKEN = dict(preset="tiny", prompt_len=16, contexts=[16], repeats=2, fresh_processes=1, allow_cpu=True)


def assert_float16_model(run):
    assert run.parameters["dtype"] == "float16"
    m = run.results["model"]
    assert m["bytes_per_parameter"] == 2
    assert m["decode_bytes"] == (m["parameters"] - m["embedding_parameters"]) * 2
    assert m["matmul_bytes"] == m["matmul_weight_parameters"] * 2
    assert models.run_dtype(run) == "float16"


def test_kernels_in_one_token_live_cells_in_float16(copied_runs):
    ns = run_live_cells("notebooks/kernels_in_one_token.ipynb", **TINY_TOKEN, dtype="float16")
    assert ns["params"].dtype == "float16"
    run = ns["run"]
    assert_float16_model(run)
    s = one_token.summary(run)
    assert s.kernels > 0 and s.wall_ms > 0
    assert list(run.table("context_sweep").status) == ["ok"]
    assert len(run.table("fresh_processes")) == 1  # the fresh process built its model in float16 too


def test_launch_overhead_live_cells_in_float16(copied_runs):
    run = run_live_cells(
        "notebooks/launch_overhead.ipynb", preset="tiny", prompt_len=16, repeats=2, allow_cpu=True, dtype="float16"
    )["run"]
    assert_float16_model(run)
    v = run.table("variants").set_index("variant")
    assert v.loc["eager", "status"] == "ok" and v.loc["eager-static", "status"] == "ok"


def test_closing_the_gap_live_cells_in_float16(copied_runs):
    run = run_live_cells(
        "notebooks/closing_the_gap.ipynb", preset="tiny", prompt_len=16, repeats=2, allow_cpu=True, dtype="float16"
    )["run"]
    assert_float16_model(run)
    r = run.table("rungs").set_index("rung")
    ok = list(r[r.status == "ok"].index)
    assert ok == ["eager", "own-compiled", "fused-projections"]  # on a CPU, as in BF16
    assert r.loc[ok, "passed"].astype(str).eq("True").all()
    assert gap.fp8_error_factor(run) == gap.ERROR_FACTOR * 128 == 256  # 2^-3 / 2^-10
    d = gap.ladder(run)
    assert set(d[~d.rung.isin(gap.FP8_RUNGS)].weights) == {"fp16"}


def test_a_run_without_dtype_replays_as_bfloat16(published):
    """Every published run was recorded before the parameter: it reads as bfloat16."""
    assert "dtype" not in published.parameters
    assert models.run_dtype(published) == "bfloat16"
    assert hardware.run_limits(published).datasheet_tflops == hardware.datasheet("NVIDIA H200").bf16_tflops
    for ch in (gap, launch, one_token):
        assert ch.Params().dtype == "bfloat16"


def run_on(gpu: str, dtype: str | None):
    parameters = {"dtype": dtype} if dtype else {}
    return SimpleNamespace(parameters=parameters, provenance={"gpu": gpu}, meta={"files": {}})


def test_the_datasheet_rate_follows_the_dtype_and_a_missing_bf16_rate_is_none():
    t4 = hardware.datasheet("Tesla T4")
    assert hardware.run_limits(run_on("Tesla T4", "float16")).datasheet_tflops == t4.fp16_tflops == 65.0
    assert hardware.run_limits(run_on("Tesla T4", None)).datasheet_tflops is None  # never a crash
    for rung in gap.FP8_RUNGS:
        assert gap.error_factor(rung) == gap.FP8_ERROR_FACTOR == gap.ERROR_FACTOR * 16
        assert gap.error_factor(rung, "float16") == gap.FP8_ERROR_FACTORS["float16"] == 256
    assert gap.error_factor("pdl", "float16") == gap.ERROR_FACTOR  # same type on both sides: unchanged


@pytest.mark.parametrize("dtype", ["float32", "int8"])
def test_only_the_two_half_types_are_accepted(dtype):
    with pytest.raises(ValueError, match="dtype must be one of bfloat16, float16"):
        models.torch_dtype(dtype)
