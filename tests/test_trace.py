"""Reading profiler traces: the recorded H200 trace and a CPU trace made here."""

import gzip

import pandas as pd
import pytest

from labsupport.chapters import kernels_in_one_token as one_token
from labsupport.traces import kernels, trace

pytestmark = pytest.mark.unit


def test_busy_is_the_union_of_intervals():
    assert trace.busy_ns([], []) == 0
    assert trace.busy_ns([0], [10]) == 10
    assert trace.busy_ns([0, 20], [10, 25]) == 15  # disjoint
    assert trace.busy_ns([0, 5], [10, 12]) == 12  # overlapping
    assert trace.busy_ns([0, 2], [10, 4]) == 10  # nested
    assert trace.busy_ns([20, 0, 10], [30, 10, 20]) == 30  # touching, unsorted


def test_census_recomputed_from_raw_trace_matches_committed_table(published):
    committed = published.table("census").set_index("kind")
    recomputed = one_token.recompute_census(published).set_index("kind")
    # A kind added to the rules after the run was recorded must be empty in it.
    assert (recomputed.drop(committed.index).kernels == 0).all()
    pd.testing.assert_frame_equal(recomputed.loc[committed.index], committed, check_dtype=False)


def test_kernel_table_recomputed_from_raw_trace_matches_committed(published, published_kernels):
    again = kernels.annotate(trace.read_kernels(published.file(one_token.TRACE_FILE)))
    cols = ["name", "start_ns", "end_ns", "dur_ns", "stream", "grid", "block", "correlation", "op", "module", "kind"]
    pd.testing.assert_frame_equal(again[cols], published_kernels[cols], check_dtype=False)


def test_kernel_table_structure(published_kernels):
    k = published_kernels
    assert len(k) > 1000
    assert (k.end_ns - k.start_ns == k.dur_ns).all()
    assert (k.dur_ns > 0).all()
    assert k.start_ns.is_monotonic_increasing
    assert (k.launch_ns <= k.start_ns).all(), "a kernel cannot start before its launch call"
    assert (k.op != "").all(), "every kernel is traced to the operator that launched it"
    assert (k.module != "").all()
    assert k.grid.str.fullmatch(r"\d+,\d+,\d+").all() and k.block.str.fullmatch(r"\d+,\d+,\d+").all()


def test_every_decoder_layer_launches_the_same_kernels(published, published_kernels):
    k = published_kernels.dropna(subset=["layer"])
    layers = published.results["model"]["layers"]
    assert sorted(k.layer.unique()) == list(range(layers))
    sequences = k.groupby("layer")["kind"].apply(tuple)
    assert sequences.nunique() == 1
    lm_head = published_kernels[published_kernels.module == "lm_head"]
    assert len(lm_head) == 1 and lm_head.kind.iloc[0] == "matrix multiply"


def test_nanosecond_timestamps_are_exact(tmp_path):
    # Kineto writes absolute microseconds with three decimals: 16 digits, beyond float64.
    t = tmp_path / "t.json"
    t.write_text(
        '{"traceEvents": ['
        '{"ph": "X", "cat": "user_annotation", "name": "decode_step", "pid": 1, "tid": 1, '
        '"ts": 5138519848339.056, "dur": 100.000},'
        '{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 5138519848340.001, "dur": 5.5},'
        '{"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, '
        '"ts": 5138519848341.003, "dur": 2.001, "args": {"correlation": 7}},'
        '{"ph": "X", "cat": "kernel", "name": "nvjet_x", "pid": 0, "tid": 7, "ts": 5138519848350.123, '
        '"dur": 3.457, "args": {"correlation": 7, "stream": 7, "grid": [4, 1, 1], "block": [128, 1, 1]}}'
        "]}"
    )
    k = trace.read_kernels(t)
    row = k.iloc[0]
    assert row.start_ns == 11067 and row.dur_ns == 3457 and row.launch_ns == 1947
    assert row.op == "aten::mm" and row.module == "decode_step" and row.grid == "4,1,1"


def test_unreadable_trace_is_a_clear_error(tmp_path):
    bad = tmp_path / "trace.json.gz"
    bad.write_bytes(gzip.compress(b'{"traceEvents": [')[:-4])
    with pytest.raises(trace.TraceError, match="cannot read profiler trace"):
        trace.read_kernels(bad)
    notrace = tmp_path / "x.json"
    notrace.write_text("[1, 2]")
    with pytest.raises(trace.TraceError, match="not a Chrome trace"):
        trace.read_kernels(notrace)
