"""The hand-split decode step (labsupport.measure.distributed.tp_split) on a CPU: two gloo ranks, spawned
once for the module (tests/tp_split_ranks.py), the tiny model in float32, eager. Its logits
against the whole model's, each rank's shards, the collectives of one step, the worker's rank
folders and their collection into the chapter's tables; the summary and the answer check on
tables made here. What only two GPUs can check (the compile, the CUDA graph, our Triton kernels,
the symmetric-memory all-reduce, every time and census) is listed in tp_split's docstring."""

import json
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import torch

from labsupport.chapters.one_token_two_gpus import split
from labsupport.measure import models
from labsupport.measure.distributed import tp_split

from . import tp_split_ranks

pytestmark = pytest.mark.unit

CFG = models.preset_config("tiny")
LAYERS = CFG["num_hidden_layers"]


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    import torch.multiprocessing as mp

    out = tmp_path_factory.mktemp("tp2")
    mp.spawn(tp_split_ranks.work, args=(str(out / "store"), str(out)), nprocs=2, join=True)
    return out, [torch.load(out / f"rank{r}.pt", weights_only=False) for r in (0, 1)]


def close(a, b):  # float32 rounding of a tiny model's logits (|logit| < 1)
    return torch.allclose(a, b, rtol=0, atol=1e-5)


@pytest.mark.parametrize("opts", ["plain", "fused"])
def test_the_split_step_gives_the_whole_models_logits(ranks, opts):
    _, res = ranks
    for r in res:
        assert close(r[f"own-{opts}"], r["eager"]), "our unsplit decoder is transformers' step"
        assert close(r[f"split-{opts}"], r["eager"]) and close(r[f"split-{opts}"], r[f"own-{opts}"])
        assert close(r[f"first-{opts}"], r[f"split-{opts}"]), "the recorded eager step is the step"
        assert r[f"split-{opts}"].argmax() == r["eager"].argmax()
    assert torch.equal(res[0][f"split-{opts}"], res[1][f"split-{opts}"]), "every rank has the same logits"


def test_a_split_without_its_all_reduces_is_caught(ranks):
    _, res = ranks
    for r in res:
        assert not close(r["split-wrong"], r["eager"])


@pytest.mark.parametrize("opts", ["plain", "fused"])
def test_each_rank_holds_half_of_the_split_weights_and_of_the_kv_cache(ranks, opts):
    _, res = ranks
    c = CFG
    whole = (
        LAYERS
        * (
            c["hidden_size"] * c["head_dim"] * (2 * c["num_attention_heads"] + 2 * c["num_key_value_heads"])
            + 3 * c["hidden_size"] * c["intermediate_size"]
        )
        + c["vocab_size"] * c["hidden_size"]
    )
    for r in res:
        s = r[f"shards-{opts}"]
        assert s["whole_split_params"] == whole
        assert s["split_params"] * 2 == whole
        assert s["replicated_params"] == LAYERS * (2 * c["hidden_size"] + 2 * c["head_dim"]) + c["hidden_size"]
        assert r[f"weight-bytes-{opts}"] == 4 * (s["split_params"] + s["replicated_params"])  # float32
        assert r[f"kv-{opts}"] == (1, c["num_key_value_heads"] // 2, tp_split_ranks.PROMPT + 16, c["head_dim"])


@pytest.mark.parametrize("opts", ["plain", "fused"])
def test_a_step_all_reduces_twice_per_layer_and_gathers_the_logits_once(ranks, opts):
    _, res = ranks
    for r in res:
        ops = [row["op"] for row in r[f"census-{opts}"]]
        assert ops == ["all_reduce"] * 2 * LAYERS + ["all_gather_into_tensor"]
        reduce_bytes = {row["bytes"] for row in r[f"census-{opts}"] if row["op"] == "all_reduce"}
        assert reduce_bytes == {CFG["hidden_size"] * 4}  # one token's hidden state, float32


def test_the_symmetric_memory_all_reduce_says_in_one_line_why_it_cannot_run():
    why = tp_split.symm_mem_support("cpu")
    assert why is not None and "\n" not in why
    assert "CUDA" in why or "_symmetric_memory" in why or "one_shot" in why


def test_the_ranks_refuse_the_symmetric_memory_choice_on_a_cpu(ranks):
    _, res = ranks
    for r in res:
        assert r["symm-mem"].startswith("symmetric-memory all-reduce: ") and "\n" not in r["symm-mem"]


def test_heads_that_do_not_divide_are_refused():
    cfg = SimpleNamespace(num_attention_heads=6, num_key_value_heads=3, intermediate_size=9, vocab_size=11)
    with pytest.raises(ValueError, match="num_key_value_heads=3"):
        tp_split.split_sizes(cfg, 2)
    assert tp_split.split_sizes(cfg, 3)["vocab"] == 4  # the last shard padded


def test_the_worker_writes_every_ranks_folder_and_they_are_collected(ranks):
    out, _ = ranks
    tables, facts = split.collect_split(out / "run", 2)
    v = tables["split_variants"]
    assert set(zip(v.variant, v["rank"], v.status, strict=True)) == {
        ("process-group", 0, "ok"),
        ("process-group", 1, "ok"),
    } | {("symm-mem", r, s) for r, s in zip(v["rank"], v.status, strict=True) if s.startswith("not available")}
    assert (v.variant == "symm-mem").sum() == 2, "the choice that cannot run is recorded with its reason"
    t = tables["split_step_times"]
    assert len(t[t.variant == "process-group"]) == 2 * 2 and t.clean.all()  # 2 repeats x 2 ranks
    c = tables["split_collectives"]
    assert (c.groupby("rank").op.apply(list) == pd.Series([["all_reduce"] * 4 + ["all_gather_into_tensor"]] * 2)).all()
    assert [f["world"] for f in facts] == [2, 2] and facts[0]["symm_mem"]
    assert (out / "run" / "rank0" / "logits-process-group.npy").is_file()
    assert (out / "run" / "rank1" / "trace-process-group.json.gz").is_file()
    s = split.split_summary(tables, LAYERS)
    assert list(s.choice) == ["process-group"] and s.allreduces_per_layer.item() == 2.0
    info = json.loads((out / "run" / "rank0" / "info.json").read_text())
    assert info["options"] == {"name": "plain"} and info["compiled"] is False and info["graph"] is False
    first = np.load(out / "run" / "rank0" / "logits-process-group.npy")
    a = split.same_answer(facts, first)
    assert a.max_abs_diff.item() == 0 and a.same_token.item()
    a = split.same_answer(facts, np.load(out / "run" / "rank0" / "reference.npy"))  # the whole model, float32
    assert a.max_abs_diff.item() < 1e-5 and a.same_token.item()


def synthetic_tables():
    v = pd.DataFrame(
        [
            # tp, rank, variant, status, wall median, gpu busy, comm ns, weight bytes
            (1, 0, "process-group", "ok", 4.0, 3_800_000, 0, 16_000),
            (2, 0, "process-group", "ok", 2.9, 2_600_000, 520_000, 8_100),
            (2, 1, "process-group", "ok", 3.1, 2_600_000, 650_000, 8_100),
            (2, 0, "symm-mem", "ok", 2.5, 2_300_000, 230_000, 8_100),
            (2, 1, "symm-mem", "ok", 2.4, 2_300_000, 115_000, 8_100),
            (2, 0, "eager", "failed: x", np.nan, np.nan, np.nan, np.nan),
        ],
        columns=["tp", "rank", "variant", "status", "wall_ms_median", "gpu_busy_ns", "comm_ns", "weight_bytes"],
    )
    rows = [(tp, r, ch, "all_reduce") for tp, r, ch in [(2, 0, "process-group"), (2, 1, "process-group")] * 6]
    rows += [(2, r, "symm-mem", "all_reduce") for r in (0, 1) for _ in range(6)]
    rows += [(2, r, ch, "all_gather_into_tensor") for r in (0, 1) for ch in ("process-group", "symm-mem")]
    c = pd.DataFrame(rows, columns=["tp", "rank", "variant", "op"])
    return {"split_variants": v, "split_collectives": c}


def test_the_summary_takes_the_slowest_rank_and_compares_with_one_gpu():
    s = split.split_summary(synthetic_tables(), layers=3).set_index(["tp", "choice"])
    assert list(s.index) == [(1, "process-group"), (2, "process-group"), (2, "symm-mem")]
    pg = s.loc[(2, "process-group")]
    assert pg.step_ms == 3.1 and pg.step_ms_fastest_rank == 2.9 and pg.ranks == 2
    assert pg.allreduces_per_step == 6 and pg.allreduces_per_layer == 2.0
    assert pg.comm_share == pytest.approx(0.25)
    assert pg.x_tp1 == pytest.approx(3.1 / 4.0)
    assert s.loc[(2, "symm-mem")].x_tp1 == pytest.approx(2.5 / 4.0)
    assert s.loc[(1, "process-group")].allreduces_per_step == 0 and s.loc[(1, "process-group")].x_tp1 == 1


def test_the_summary_refuses_ranks_that_all_reduce_differently():
    t = synthetic_tables()
    t["split_collectives"] = t["split_collectives"].iloc[1:]
    with pytest.raises(ValueError, match="different all-reduces"):
        split.split_summary(t, layers=3)


def test_the_answer_check_reports_the_largest_move_and_the_token(tmp_path):
    ref = np.array([[0.1, 0.9, 0.3]], dtype=np.float32)
    (tmp_path / "rank0").mkdir()
    np.save(tmp_path / "rank0" / "logits-process-group.npy", ref + np.array([[0.0, -0.7, 0.2]], dtype=np.float32))
    a = split.same_answer([{"world": 2, "folder": str(tmp_path / "rank0")}], ref)
    assert a.max_abs_diff.item() == pytest.approx(0.7) and not a.same_token.item()
    assert a.max_abs_logit.item() == pytest.approx(0.9)


def test_the_command_of_the_two_gpu_run():
    cmd = split.split_command(2, "OUT", options="best-bf16", choices=["process-group", "symm-mem"])
    i = cmd.index("-m")
    assert cmd[i : i + 2] == ["-m", "torch.distributed.run"] and "--nproc-per-node" in cmd
    assert cmd[cmd.index("--nproc-per-node") + 1] == "2" and split.WORKER in cmd
    assert cmd[cmd.index("--choices") + 1 :][:2] == ["process-group", "symm-mem"]
    assert "--no-compile" in split.split_command(2, "OUT", compile=False, device="cpu")
    from labsupport.measure.distributed import tp_split_run

    cmd = split.split_command(2, "OUT", options="plain", device="cpu")
    args = tp_split_run.arguments(cmd[cmd.index(split.WORKER) + 1 :])
    assert (args.options, args.device, args.out, args.compile) == ("plain", "cpu", "OUT", True)


def test_the_collective_log_counts_a_symmetric_memory_all_reduce_as_an_all_reduce():
    from labsupport.measure.distributed import allreduce

    class Op:  # stands in for torch.ops.symm_mem.one_shot_all_reduce.default (it needs CUDA)
        namespace = "symm_mem"
        overloadpacket = SimpleNamespace(__name__="one_shot_all_reduce")

        def __call__(self, t, op, group):
            return t

    class Other(Op):
        overloadpacket = SimpleNamespace(__name__="rendezvous")

    log = allreduce.CollectiveLog()
    x = torch.zeros(1, 1, 64, dtype=torch.bfloat16)
    log.__torch_dispatch__(Op(), (), (x, "sum", "0"))
    log.__torch_dispatch__(Other(), (), (x, "sum", "0"))
    assert [(r["op"], r["bytes"], r["dtype"]) for r in log.rows] == [("all_reduce", 128, "bfloat16")]
