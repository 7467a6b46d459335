"""The chapter "One token on two GPUs" on a CPU: its live cells start torchrun twice (TP=1,
then two ranks talking over gloo, the tiny model), the same worker code as on GPUs, and
collect every rank into one run; its analysis and its page on that run; the check that stops
live mode, and the skip of the nightly, on a box with too few GPUs."""

import sys

import pandas as pd
import pytest

from labsupport import chapters
from labsupport.chapters import data_files
from labsupport.chapters import one_token_two_gpus as ch
from labsupport.measure import models
from labsupport.measure.distributed import allreduce
from labsupport.ops import live

from .conftest import with_shared_owners
from .live_cells import run_live_cells

pytestmark = pytest.mark.unit

NOTEBOOK = "notebooks/one_token_two_gpus.ipynb"
TINY = {"preset": "tiny", "prompt_len": 16, "repeats": 2, "gpus": 2, "sweep_max": 16384, "allow_cpu": True}
TINY_CFG = models.preset_config("tiny")


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    mp = pytest.MonkeyPatch()
    mp.setenv("LABSUPPORT_RUNS", str(root))
    try:
        ns = run_live_cells(NOTEBOOK, variants=["eager", "cuda-graph"], **TINY)
    finally:
        mp.undo()
    return ns["run"]


@pytest.mark.live
def test_every_degree_and_rank_has_its_rows(tiny_run):
    v = tiny_run.table("variants")
    assert set(zip(v.tp, v["rank"], strict=True)) == {(1, 0), (2, 0), (2, 1)}
    ok = v[v.status == "ok"]
    assert set(ok.variant) == {"eager"} and len(ok) == 3
    assert v[v.variant == "cuda-graph"].status.eq("needs a CUDA GPU").all()
    t = tiny_run.table("step_times")
    for r in ok.itertuples():
        w = t[(t.tp == r.tp) & (t["rank"] == r.rank) & (t.variant == "eager")].wall_ms
        assert len(w) == TINY["repeats"] and t.clean.all()
        assert (r.wall_ms_median, r.wall_ms_min, r.wall_ms_max) == pytest.approx((w.median(), w.min(), w.max()))
    files = set(tiny_run.meta["files"])
    assert {ch.trace_file(1, 0, "eager"), ch.trace_file(2, 0, "eager"), ch.trace_file(2, 1, "eager")} <= files
    assert not any("cuda-graph" in f for f in files)
    ranks = tiny_run.results["ranks"]
    assert [(r["tp"], r["rank"], r["backend"]) for r in ranks] == [(1, 0, "gloo"), (2, 0, "gloo"), (2, 1, "gloo")]


@pytest.mark.live
def test_two_all_reduces_per_layer_of_the_hidden_state(tiny_run):
    layers, hidden = TINY_CFG["num_hidden_layers"], TINY_CFG["hidden_size"]
    c = tiny_run.table("collectives")
    assert c[c.tp == 1].empty, "the model as written, on one rank, communicates nothing"
    for rank in (0, 1):
        mine = c[(c.tp == 2) & (c["rank"] == rank)]
        assert list(mine.op) == ["all_reduce"] * 2 * layers
        assert set(mine.bytes) == {hidden * 1 * 2} and set(mine.dtype) == {"bfloat16"}  # batch 1, BF16
    v = tiny_run.table("variants").set_index(["tp", "rank", "variant"])
    assert v.loc[(2, 0, "eager"), "allreduce_calls"] == v.loc[(2, 1, "eager"), "allreduce_calls"] == 2 * layers
    assert v.loc[(1, 0, "eager"), "allreduce_calls"] == 0
    s = ch.collectives(tiny_run, rank=1)
    assert (s.tp, s.per_step, s.per_layer, s.message_bytes) == (2, 2 * layers, 2.0, hidden * 2)
    assert s.step_bytes == 2 * layers * hidden * 2
    assert s.comm_ms == 0 and s.comm_us_each != s.comm_us_each, "gloo launches no GPU kernel: no time, NaN each"


@pytest.mark.live
def test_each_rank_holds_its_share_of_the_split_layers(tiny_run):
    c = TINY_CFG
    per_layer = (
        c["hidden_size"] * c["head_dim"] * (c["num_attention_heads"] + 2 * c["num_key_value_heads"])  # q, k, v
        + c["num_attention_heads"] * c["head_dim"] * c["hidden_size"]  # o_proj
        + 3 * c["hidden_size"] * c["intermediate_size"]  # gate, up, down
    )
    ranks = {(r["tp"], r["rank"]): r for r in tiny_run.results["ranks"]}
    whole = ranks[(1, 0)]["sharded_parameters"]
    assert whole == ranks[(1, 0)]["model"]["parameters"]
    for rank in (0, 1):
        assert ranks[(2, rank)]["sharded_parameters"] == whole - c["num_hidden_layers"] * per_layer // 2


@pytest.mark.live
def test_the_split_model_computes_what_the_whole_one_does(tiny_run):
    """Column- and row-parallel layers with local heads (transformers reshapes with -1 heads):
    the same next token as the model as written, the top logits equal up to BF16 rounding."""
    g = ch.agreement(tiny_run)
    assert list(zip(g.tp, g["rank"], strict=True)) == [(1, 0), (2, 0), (2, 1)]
    assert g["same tokens as TP=1"].all()
    assert (g["largest top-5 logit difference"] <= 0.02 * g["top logit"].abs()).all()
    assert g.set_index("tp").loc[1, "largest top-5 logit difference"] == 0


@pytest.mark.live
def test_the_all_reduce_sweep(tiny_run):
    a = tiny_run.table("allreduce")
    step = TINY_CFG["hidden_size"] * 2
    expected = allreduce.sizes(8 << 10, TINY["sweep_max"], (step,))
    assert expected == [step, 8192, 16384]
    for rank in (0, 1):
        assert list(a[a["rank"] == rank].bytes) == expected
    assert (a.world == 2).all() and (a.latency_us_min <= a.latency_us_median).all()
    bus = a.bytes / (a.latency_us_median * 1e-6) / 1e9  # 2(n-1)/n = 1 at n=2
    assert list(a.busbw_gbs) == pytest.approx(list(bus)) and list(a.algbw_gbs) == pytest.approx(list(bus))
    curve = ch.allreduce_curve(tiny_run)
    assert list(curve.bytes) == expected and list(curve["decode step"]) == [True, False, False]
    assert ch.at_bytes(curve, 8192) == pytest.approx(curve.set_index("bytes").latency_us[8192])
    assert allreduce.bus_bandwidth(100, 1.0, 4) == 150


@pytest.mark.live
def test_analysis_of_a_cpu_run(tiny_run):
    s = ch.steps(tiny_run)
    ok = s[s.status == "ok"]
    assert list(zip(ok.tp, ok["rank"], strict=True)) == [(1, 0), (2, 0), (2, 1)]
    base = ok[ok.tp == 1]["wall ms"].iloc[0]
    assert (ok["speed-up over TP=1"] == base / ok["wall ms"]).all()
    assert (ok["tokens/s"] == 1e3 / ok["wall ms"]).all()
    assert (ok["GPU idle ms"] == ok["wall ms"] - ok["GPU busy ms"]).all()
    a = ch.answer(tiny_run)
    assert a.tp == 2 and a.wall_ms_n == ok[ok.tp == 2]["wall ms"].max() and a.speedup == a.wall_ms_1 / a.wall_ms_n
    assert a.kernels_n == ok[ok.tp == 2].kernels.max() and a.ideal_ms == a.wall_ms_1 / 2
    c = ch.census(tiny_run)
    assert list(c.columns.get_level_values(0).unique()) == ["TP=1 rank 0", "TP=2 rank 0", "TP=2 rank 1"]
    v = tiny_run.table("variants").set_index(["tp", "rank", "variant"])
    for (tp, rank), col in (((1, 0), "TP=1 rank 0"), ((2, 1), "TP=2 rank 1")):
        assert c.loc["total", (col, "kernels")] == v.loc[(tp, rank, "eager"), "kernels"]
    k = ch.kernel_table(tiny_run, 2, 0, "eager")
    assert k.layer.max() == TINY_CFG["num_hidden_layers"] - 1
    refs = ch.references(tiny_run)
    assert len(refs) == 3 and refs["this run"].iloc[0] == a.speedup
    assert refs["published"].iloc[0] == pytest.approx(149.1 / 93.8)
    assert set(ch.headline(tiny_run)) == {
        "TP=1 eager wall ms",
        "TP=2 eager wall ms",
        "all-reduce us at the step's size",
    }, "a CPU run: eager only, all-reduces launched one by one"
    assert ch.main_form(tiny_run) == "eager" and ch.allreduce_curve(tiny_run, allreduce.GRAPH).empty


@pytest.mark.live
def test_every_file_of_the_run_is_described_and_the_run_validates(tiny_run):
    from labsupport.ops import validate

    assert validate.check_run(ch.DECLARATION, tiny_run) == []
    missing = [n for n in tiny_run.meta["files"] if not data_files.describe(ch.DECLARATION, n)]
    assert not missing
    assert all(data_files.describe(ch.DECLARATION, a) for a in ch.DECLARATION.artifacts)
    for f in ch.DECLARATION.files:
        if f.name.endswith(".csv") and f.name in tiny_run.meta["files"]:
            assert set(f.columns) <= set(pd.read_csv(tiny_run.path / f.name).columns), f.name


@pytest.mark.live
def test_the_live_run_records_the_hand_split_step_at_both_degrees(tiny_run):
    """The notebook's hand-split cell (labsupport.measure.distributed.tp_split_run on one and two gloo ranks,
    the tiny model in BF16, eager): optional tables the page does not read yet."""
    v = tiny_run.table("split_variants")
    ok = v[v.status == "ok"]
    assert set(zip(ok.tp, ok["rank"], ok.variant, strict=True)) == {
        (1, 0, "process-group"),
        (2, 0, "process-group"),
        (2, 1, "process-group"),
    }
    assert v[v.variant == "symm-mem"].status.str.startswith("not available: ").all()
    assert len(v[v.variant == "symm-mem"]) == 3  # one row per rank and degree, with the reason
    s = ch.split_summary(
        {n: tiny_run.table(n) for n in ("split_variants", "split_collectives")}, TINY_CFG["num_hidden_layers"]
    ).set_index("tp")
    assert s.loc[1, "allreduces_per_step"] == 0 and s.loc[2, "allreduces_per_layer"] == 2.0
    assert s.loc[2, "weight_bytes_per_gpu"] < s.loc[1, "weight_bytes_per_gpu"]
    t = tiny_run.table("split_step_times")
    assert len(t) == TINY["repeats"] * 3 and t.clean.all()
    a = tiny_run.table("split_answer").set_index("tp")
    assert set(a.index) == {1, 2} and (a.max_abs_diff < 0.1 * a.max_abs_logit).all()  # BF16 against float32
    files = set(tiny_run.meta["files"])
    assert {ch.split.trace_name(2, r, "process-group") for r in (0, 1)} <= files
    assert [(r["world"], r["rank"]) for r in tiny_run.results["split_ranks"]] == [(1, 0), (2, 0), (2, 1)]


@pytest.mark.live
def test_the_page_replays_the_cpu_run(tiny_run, tmp_path):
    from .test_launch_overhead import replay_notebook

    with_shared_owners(tiny_run.path.parents[1])
    text = replay_notebook(NOTEBOOK, tiny_run, tmp_path)
    assert "Traceback" not in text and "image/png" in text
    assert "TP=2 rank 1" in text and "decode step" in text
    layers = TINY_CFG["num_hidden_layers"]  # o_proj and down_proj, each layer
    assert f"worked out the sharding of {2 * layers} operators per step" in text and "under no_grad 0." in text
    assert "The kernels in one token, run " in text, "the one-GPU eager wall is the shared one, labelled"


@pytest.mark.live
def test_a_launch_that_dies_is_run_again_with_the_eager_step_alone(tmp_path, monkeypatch):
    """A crash that takes the ranks down (a CUDA-graph capture, say) loses its forms, not the run."""
    real, calls = ch.launch, []

    def launch(cmd):
        calls.append(cmd)
        if cmd[cmd.index("--nproc-per-node") + 1] == "2":
            raise RuntimeError("torchrun exited with 1; its last lines:\nSegmentation fault (core dumped)")
        real(cmd)

    monkeypatch.setattr(ch, "launch", launch)  # the notebook's call; the relaunch inside is the real one
    monkeypatch.setenv("LABSUPPORT_RUNS", str(tmp_path))
    params = {**TINY, "sweep_max": 8192, "repeats": 1}
    run = run_live_cells(NOTEBOOK, variants=["eager", "cuda-graph"], **params)["run"]
    dtensor = [c for c in calls if ch.measuring.WORKER in c]
    assert len(dtensor) == 2, "TP=1, then the TP=2 launch that died; its eager relaunch is not the patched call"
    split = run.table("split_variants")  # the hand-split launch at TP=2 died too: left out, the run kept
    assert set(split.tp) == {1} and len(calls) == 4
    v = run.table("variants").set_index(["tp", "rank", "variant"])
    for rank in (0, 1):
        assert v.loc[(2, rank, "eager"), "status"] == "ok"
        assert v.loc[(2, rank, "cuda-graph"), "status"] == "failed: the ranks died (Segmentation fault (core dumped))"
    assert v.loc[(1, 0, "cuda-graph"), "status"] == "needs a CUDA GPU"
    assert set(run.table("allreduce").bytes) == {128, 8192}, "the relaunch times the sweep too"


# Too few GPUs ----------------------------------------------------------------------------


def test_live_mode_stops_in_one_line_without_the_gpus(runs_root, monkeypatch):
    from labsupport.chapters.one_token_two_gpus import measuring
    from labsupport.measure import environment

    with pytest.raises(ch.TooFewGPUs) as e:
        ch.require_gpus(ch.Params(gpus=2))
    assert str(e.value).count("\n") == 0 and "needs 2 GPUs and this box has 0" in str(e.value)
    monkeypatch.setattr(measuring, "gpus_here", lambda: 1)
    with pytest.raises(ch.TooFewGPUs, match="^one-token-two-gpus needs 2 GPUs and this box has 1; use mode='replay'"):
        ch.pending_run(ch.Params(gpus=2))
    # The notebook's first cell (the environment check every chapter starts with) stops a box with no GPU.
    with pytest.raises(environment.EnvironmentProblem, match="^live mode needs a CUDA GPU and none is visible"):
        run_live_cells(NOTEBOOK, **{**TINY, "allow_cpu": False})
    assert not any(runs_root.rglob("meta.json"))
    with pytest.raises(ValueError, match="gpus must be at least 2"):
        ch.require_gpus(ch.Params(gpus=1, device="cpu", preset="tiny"))


def test_the_nightly_skips_a_chapter_that_needs_more_gpus(monkeypatch, capsys):
    one = chapters.by_slug("launch-overhead")
    two = ch.DECLARATION
    monkeypatch.setattr(live, "gpus_here", lambda: 1)
    assert live.fitting([one, two], allow_cpu=False, who="nightly") == [one]
    assert capsys.readouterr().out == "[nightly] one-token-two-gpus: skipped: needs 2 GPUs, this box has 1\n"
    monkeypatch.setattr(live, "gpus_here", lambda: 2)
    assert live.fitting([one, two], allow_cpu=False) == [one, two]
    monkeypatch.setattr(live, "gpus_here", lambda: 0)
    assert live.fitting([two], allow_cpu=True) == [two], "on a CPU the ranks are processes"
    from labsupport.ops import nightly

    monkeypatch.setattr(live, "gpus_here", lambda: 1)
    monkeypatch.setattr(live, "check_gpu", lambda allow_cpu: None)
    monkeypatch.setattr(chapters, "find", lambda names: [two])
    assert nightly.main([two.slug], {}) == 0
    assert "skipped: needs 2 GPUs, this box has 1" in capsys.readouterr().out


# The interconnect, from nvidia-smi topo -m ---------------------------------------------


TOPO = """\
\tGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID
GPU0\t X \tNV18\t0-63\t0\t\tN/A
GPU1\tNV18\t X \t0-63\t0\t\tN/A

Legend:

  X    = Self
  NV#  = Connection traversing a bonded set of # NVLinks
"""


def test_the_link_between_two_gpus():
    assert ch.link_between(TOPO) == "NV18" and ch.interconnect("NV18") == "NVLink (18 links)"
    assert ch.link_between(TOPO.replace("NV18", "PIX")) == "PIX" and ch.interconnect("PIX").startswith("PCIe")
    assert ch.interconnect("SYS") == "PCIe across CPU sockets" and ch.interconnect(None) == "unknown"
    assert ch.link_between("GPU0\tX\n") is None


def test_the_torchrun_command():
    cmd = ch.torchrun_command(ch.Params(), 2, "/tmp/x", sweep=True)
    assert cmd[1:4] == ["-m", "torch.distributed.run", "--standalone"]
    assert cmd[cmd.index("--nproc-per-node") + 1] == "2" and "labsupport.measure.distributed.tensor_parallel" in cmd
    assert "--sweep" in cmd and "--sweep" not in ch.torchrun_command(ch.Params(), 1, "/tmp/x", sweep=False)
    assert cmd[cmd.index("--dtype") + 1] == "bfloat16"
    half = ch.torchrun_command(ch.Params(dtype="float16"), 2, "/tmp/x", sweep=False)
    assert half[half.index("--dtype") + 1] == "float16"  # the worker builds the model in the run's dtype


# The all-reduce sweep times the all-reduces to their end ---------------------------------


def sweep_rank(rank: int, world: int, rendezvous: str, out: str) -> None:
    """One rank of a two-process gloo group: the sweep at a tiny and a large message."""
    import json

    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=rendezvous, rank=rank, world_size=world)
    try:
        rows = allreduce.sweep([4096, 32 << 20], "cpu", iters=2, repeats=3)
    finally:
        dist.destroy_process_group()
    with open(f"{out}.{rank}", "w") as f:
        json.dump(rows, f)


def test_the_sweep_times_each_all_reduce_until_it_has_finished(tmp_path):
    """A 32 MB all-reduce moves 8192x the bytes of a 4 KB one: timed to its end (not to when the
    call was queued, which on NCCL took the same 25 us at every size on the H200s) it takes
    longer, and the bus bandwidth is 2(n-1)/n x bytes / latency."""
    import json

    import torch.multiprocessing as mp

    out = str(tmp_path / "sweep")
    mp.spawn(sweep_rank, args=(2, f"file://{tmp_path / 'rendezvous'}", out), nprocs=2, join=True)
    for rank in (0, 1):
        small, large = json.loads((tmp_path / f"sweep.{rank}").read_text())
        assert (small["bytes"], large["bytes"], small["world"]) == (4096, 32 << 20, 2)
        assert large["latency_us_median"] > 4 * small["latency_us_median"]
        assert small["timer"] == large["timer"] == "host clock"
        for r in (small, large):
            assert r["busbw_gbs"] == pytest.approx(2 * (2 - 1) / 2 * r["bytes"] / (r["latency_us_median"] * 1e-6) / 1e9)
            assert r["latency_us_min"] <= r["latency_us_median"] <= r["latency_us_max"]


@pytest.mark.live
def test_the_split_eager_step_stays_on_dtensors_fast_path(tiny_run):
    """Under torch.inference_mode, aten.linear reaches DTensor whole and its sharding is worked
    out afresh at every call (the 696 ms eager step at TP=2 on the H200s); the chapter's eager
    step runs under torch.no_grad, where none is."""
    ranks = {(r["tp"], r["rank"]): r for r in tiny_run.results["ranks"]}
    assert ranks[(1, 0)]["dtensor_slow_path_per_step"] == {}
    for rank in (0, 1):
        slow = ranks[(2, rank)]["dtensor_slow_path_per_step"]
        assert slow["no_grad"] == 0
        assert slow["inference_mode"] > 0, "this torch decomposes linear before DTensor in inference_mode too"


@pytest.mark.live
def test_the_pages_figures_are_legible(tiny_run, monkeypatch):
    """tests/test_figures.py's legibility rules (text height at 390 and 1280 px, no scientific
    tick labels on a log axis) on the figures the page draws from the CPU run."""
    import matplotlib.pyplot as plt
    import nbformat

    from .conftest import REPO
    from .test_figures import problems

    with_shared_owners(tiny_run.path.parents[1])  # the page reads the shared one-GPU steps
    monkeypatch.setenv("LABSUPPORT_RUNS", str(tiny_run.path.parents[1]))
    monkeypatch.chdir(REPO / "notebooks")
    ns, drawn = {"mode": "replay"}, []
    plt.close("all")
    from labsupport import glue

    glued = glue.glue_figure  # a figure glued for the prose is closed by its cell: looked at as it is glued
    monkeypatch.setattr(glue, "glue_figure", lambda name, fig: (drawn.append((name, fig)), glued(name, fig)))
    for cell in nbformat.read(REPO / NOTEBOOK, as_version=4).cells:
        if cell.cell_type != "code":
            continue
        exec(compile(cell.source, "<one_token_two_gpus cell>", "exec"), ns)  # noqa: S102
        if "parameters" in cell.metadata.get("tags", []):
            ns["run_id"] = tiny_run.run_id
        drawn += [(cell.source.splitlines()[0], plt.figure(n)) for n in plt.get_fignums()]
        plt.close("all")
    assert len(drawn) == 2, "the layer timeline per rank and the all-reduce curve"
    found = [p for name, fig in drawn for p in problems(name, fig)]
    assert not found, "\n".join(found)


def test_profiling_ranks_meet_around_every_phase_of_the_profiler(tmp_path):
    """harness.profile_region calls its fence before the profiler starts, before and after each
    of its steps (warm-up and kept) and after it stops: no rank is inside the profiler while
    another queues collectives."""
    import torch

    from labsupport.measure import harness

    calls = []
    harness.profile_region(
        lambda: torch.ones(8).sum(),
        tmp_path / "t.json.gz",
        region="decode_step",
        device="cpu",
        warmup=2,
        fence=lambda: calls.append(1),
    )
    assert len(calls) == 1 + 2 * 3 + 1


def test_a_launch_whose_ranks_are_done_but_do_not_exit_is_stopped(tmp_path):
    """On the two-H200 box the ranks wrote everything and then hung in NCCL's teardown: once
    every rank has said it is done, the launch stops the rest (a child holding the pipe too)
    and returns as finished, without waiting."""
    import time

    script = (
        "import subprocess, sys, time\n"
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
        "print('[TP=2 rank 0] done', flush=True)\n"
        "print('[TP=2 rank 1] done', flush=True)\n"
        "time.sleep(600)\n"
    )
    t0 = time.perf_counter()
    ch.launch([sys.executable, "-c", script, "--nproc-per-node", "2"], exit_grace_s=1)
    assert time.perf_counter() - t0 < 30


def test_a_launch_that_fails_before_every_rank_is_done_raises_with_its_log():
    script = "print('[TP=2 rank 0] done', flush=True); print('boom'); raise SystemExit(3)"
    with pytest.raises(RuntimeError, match="exited with 3(.|\n)*boom"):
        ch.launch([sys.executable, "-c", script, "--nproc-per-node", "2"], exit_grace_s=1)


# The recorded two-H200 run (tests/fixtures/runs/one-token-two-gpus): the analysis on real NCCL data.


@pytest.fixture(scope="module")
def h200_run():
    from .conftest import fixture_run

    return fixture_run("one-token-two-gpus")


def test_the_h200_run_all_reduces_72_times_8_kb_per_step_on_each_rank(h200_run):
    c = ch.collectives(h200_run)
    assert (c.tp, c.per_step, c.message_bytes) == (2, 72, 4096 * 2), "36 layers x 2; Qwen3-8B's hidden 4096 in BF16"
    v = h200_run.table("variants").set_index(["tp", "rank", "variant"])
    for form in ("eager", "cuda-graph", "compile"):
        for rank in (0, 1):
            assert v.loc[(2, rank, form), "comm_kernels"] == 72, "one NCCL kernel per all-reduce, in every form"
        assert v.loc[(1, 0, form), "comm_kernels"] == 0
    names = set(ch.kernel_table(h200_run, 2, 0, "cuda-graph").query("kind == 'communication'").name)
    assert names and all(n.startswith("ncclDevKernel_AllReduce") for n in names)


def test_the_h200_run_compares_degrees_in_the_cuda_graph_and_best_against_best(h200_run):
    assert ch.main_form(h200_run) == "cuda-graph"
    s = ch.steps(h200_run)
    a = ch.answer(h200_run, "cuda-graph")
    graph = s[s.variant == "cuda-graph"].set_index(["tp", "rank"])["wall ms"]
    assert a.wall_ms_1 == graph[(1, 0)] and a.wall_ms_n == max(graph[(2, 0)], graph[(2, 1)])
    b = ch.best(h200_run).set_index("tp")
    ok = s[s.status == "ok"].groupby(["tp", "variant"])["wall ms"].max()
    for tp in (1, 2):
        assert b.loc[tp, "wall ms"] == ok.loc[tp].min() and b.loc[tp, "variant"] == ok.loc[tp].idxmin()
    assert b.loc[2].iloc[-1] == pytest.approx(b.loc[1, "wall ms"] / b.loc[2, "wall ms"])


def test_the_time_split_adds_up_to_the_profiled_census(h200_run):
    t = ch.time_split(h200_run)
    c = ch.census(h200_run, "cuda-graph")
    assert t.loc["total", "TP=1 ms"] == pytest.approx(c.loc["total", ("TP=1 rank 0", "gpu_ms")])
    busier = max(c.loc["matrix multiply", (f"TP=2 rank {r}", "gpu_ms")] for r in (0, 1))
    assert t.loc["matrix multiply", "TP=2 ms"] == pytest.approx(busier)
    assert (t["change ms"] == t["TP=2 ms"] - t["TP=1 ms"]).all()
    assert t.loc["communication", "TP=1 ms"] == 0 and t.loc["communication", "TP=2 ms"] > 0
    assert (t["split perfectly ms"] == t["TP=1 ms"] / 2).all()


def test_a_layer_of_the_graphed_step_runs_between_two_pairs_of_all_reduces(h200_run):
    for rank in (0, 1):
        k = ch.layer_kernels(h200_run, 2, rank, "cuda-graph", 18)
        assert (k.kind == "communication").sum() == 2, "one after attention, one ending the layer"
        assert k.kind.iloc[-1] == "communication"
        assert (k.kind == "attention").sum() == 1 and 5 <= (k.kind == "matrix multiply").sum() <= 12
    eager = ch.layer_kernels(h200_run, 2, 0, "eager", 18)
    assert (eager.kind == "communication").sum() == 2


def test_the_sweep_was_timed_both_ways_and_the_graph_is_faster_for_small_messages(h200_run):
    one, graph = ch.allreduce_curve(h200_run), ch.allreduce_curve(h200_run, allreduce.GRAPH)
    assert list(one.bytes) == list(graph.bytes) and one.bytes.min() == 8192 and one.bytes.max() == 256 << 20
    small = one.bytes <= 64 << 10
    assert (graph.latency_us[small].values < one.latency_us[small].values).all()
    assert one["decode step"].sum() == graph["decode step"].sum() == 1
    h = ch.headline(h200_run)
    assert h["all-reduce us at the step's size, CUDA graph"] == graph.loc[graph["decode step"], "latency_us"].iloc[0]
    assert {"TP=1 compile wall ms", "TP=2 cuda-graph wall ms"} <= set(h)


def test_the_interconnect_is_read_from_the_recorded_topology(h200_run):
    raw = h200_run.file("topology.txt").read_text()
    assert "\x1b[" in raw, "nvidia-smi's own terminal escapes, kept as recorded"
    assert ch.recorded_interconnect(h200_run) == {"gpu0_gpu1": "NV18", "means": "NVLink (18 links)"}


@pytest.mark.live
def test_the_page_says_whether_the_split_picked_the_same_token(h200_run, tiny_run):
    g = ch.agreement(h200_run)
    text = ch.agreement_text(h200_run)
    one, two = g[g.tp == 1]["next tokens"].iloc[0], g[g.tp == 2]["next tokens"].iloc[0]
    if one == two:
        assert text.startswith("Every rank at TP=2 computed the same next token")
    else:
        assert f"picked token {two} where the model on one GPU picked {one}" in text
    assert ch.agreement_text(tiny_run).startswith("Every rank at TP=2 computed the same next token")


def test_the_one_gpu_walls_shown_are_the_shared_ones():
    """The page's TP=1 walls are the book's shared values (eager: The kernels in one token; CUDA graph
    and compiled: Launch overhead), labelled; the split rows are this run's, by their minimum."""
    from .conftest import fixture_run

    run = fixture_run("one-token-two-gpus")
    mine = ch.steps(run)
    v = run.table("variants")
    assert (
        mine["wall ms"]
        == v.set_index(["tp", "rank", "variant"])
        .wall_ms_min.reindex(list(zip(mine.tp, mine["rank"], mine.variant, strict=True)))
        .values
    ).all(), "the minimum, the book's estimator"
    given = {"eager": 29.9, "cuda-graph": 9.3, "compile": 7.0}
    shown = ch.steps_shown(run, given, {f: f"owner of {f}" for f in given})
    one = shown[shown.tp == 1].set_index("variant")
    assert one["wall ms"].to_dict() == given and one["GPU idle ms"].isna().all()
    assert one.loc["eager", "wall from"] == "owner of eager"
    split = shown[shown.tp == 2]
    assert (split["wall from"] == "this run").all()
    assert (split["wall ms"].values == mine[mine.tp == 2]["wall ms"].values).all()
    assert (shown["speed-up over TP=1"] == mine["speed-up over TP=1"]).all(), "the speed-up stays this run's own"
    assert set(ch.SHARED_ONE_GPU.values()) <= set(shared_names())


def shared_names():
    from labsupport.chapters import shared

    return shared.QUANTITIES


def test_the_page_says_whose_cost_the_ratio_is_and_shows_no_own_one_gpu_wall():
    import json

    from .conftest import REPO

    nb = json.loads((REPO / "notebooks" / NOTEBOOK.split("/")[-1]).read_text())
    text = "".join("".join(c["source"]) for c in nb["cells"])
    assert "DTensor's and the host's cost, not tensor parallelism's" in text
    for own in ("a_wall_ms_1", "e_wall_ms_1", "k_wall_ms_1", "best_1_ms"):
        assert f"`{own}" not in text, own
    assert "{glue:text}`eager_wall_ms`" in text
    md = [
        i for i, c in enumerate(nb["cells"]) if c["cell_type"] == "markdown" and "## The answer" in "".join(c["source"])
    ]
    live = next(i for i, c in enumerate(nb["cells"]) if 'if mode == "live":' in "".join(c["source"]))
    assert len(md) == 1 and md[0] < live


# --- the page: every number and text the prose glues ------------------------------------------


def test_every_glue_name_of_the_prose_is_a_page_field_or_a_shared_quantity():
    """The page cell glues the Page's fields and the book's shared quantities; nothing else glues."""
    from .page_names import page_names, unglued, unshown

    assert unglued(NOTEBOOK, ch.Page) == set()
    assert unshown(NOTEBOOK, ch.Page) == set()
    assert not page_names(ch.Page) & set(shared_names())


def test_page_of_the_recorded_run_against_its_tables(h200_run):
    from labsupport.chapters import shared

    values = shared.values()
    p = ch.page(h200_run, values)
    assert p.tp == 2 and p.form_short == ch.SHORT["cuda-graph"] and p.form_name == ch.VARIANTS["cuda-graph"]
    # the one-GPU walls are the book's shared ones, the ideal split half of them
    assert p.one_gpu_ms == {form: values[name].value for form, name in ch.SHARED_ONE_GPU.items()}
    assert p.a_ideal_ms == values["graph_wall_ms"].value / 2
    assert p.one_gpu_from["eager"].startswith("The kernels in one token, run ")
    # the split rows: the slower rank's wall of this run's variants.csv
    recorded = h200_run.table("variants")
    split = recorded[(recorded.tp == 2) & (recorded.status == "ok")].groupby("variant").wall_ms_min.max()
    assert (p.a_wall_ms_n, p.e_wall_ms_n, p.k_wall_ms_n) == (split["cuda-graph"], split["eager"], split["compile"])
    assert p.k_issue_n == recorded[(recorded.tp == 2) & (recorded.variant == "compile")].issue_ms_median.max()
    # the all-reduces of one step, from collectives.csv (rank 0 of the split)
    comm = h200_run.table("collectives")
    rank0 = comm[(comm.tp == 2) & (comm["rank"] == 0)]
    assert p.ar_bytes == 8192 and p.ar_16x_bytes == 16 * 8192
    assert p.ar_step_bytes == rank0.bytes.sum() and p.ar_per_layer == p.ar_per_step / p.layers
    curve = h200_run.table("allreduce")
    assert p.ar_largest_bytes_mb == curve.bytes.max() / 2**20
    assert p.failed_text == "Every form of the step ran at every degree."
    assert p.interconnect_text.startswith("`nvidia-smi topo -m` lists `NV")
    assert p.fast_us == min(ch.published_allreduce_us().values())


def test_page_of_a_run_whose_compiled_split_step_failed(h200_run, tmp_path):
    """A form that did not run at the split degree: the page names it with its status, and its numbers are NaN."""
    import shutil

    from labsupport import runs

    copy = tmp_path / ch.CHAPTER / h200_run.run_id
    shutil.copytree(h200_run.path, copy)
    recorded = pd.read_csv(copy / "variants.csv")
    recorded.loc[(recorded.tp == 2) & (recorded.variant == "compile"), "status"] = "failed: out of memory"
    recorded.to_csv(copy / "variants.csv", index=False)
    p = ch.page(runs.load_run(ch.DECLARATION, h200_run.run_id, root=tmp_path, verify=False))
    assert p.failed_text == f"Not every form ran: *{ch.VARIANTS['compile']}* at TP=2: failed: out of memory."
    assert p.k_wall_ms_n != p.k_wall_ms_n and p.k_speedup != p.k_speedup and p.k_idle_n != p.k_idle_n
    assert p.a_wall_ms_n == p.a_wall_ms_n  # the main form still ran
