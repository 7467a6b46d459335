"""Chapter "What a kernel is": the analysis on its recorded H200 run (tests/fixtures), the
sentences for runs without the cache's size or the add out of the cache, and the notebook's
measuring cells run live on a CPU to check that every time is taken before a profile."""

import functools
import math
import shutil

import pandas as pd
import pytest

from labsupport import runs
from labsupport.chapters import shared
from labsupport.chapters import what_a_kernel as ch
from labsupport.measure import decode, environment, harness
from labsupport.measure.kernels import triton_kernels
from labsupport.traces import kernels

from .conftest import FIXTURES, ceilings_on_another_gpu, fixture_run
from .notebook_cells import assert_times_before_profiles, definitions, run_live
from .page_names import prose_names, unglued

pytestmark = pytest.mark.unit

NOTEBOOK = "what_a_kernel.ipynb"


@pytest.fixture(scope="module")
def run():
    return fixture_run(ch.CHAPTER)


def without(run, root, files=(), results=None):
    """A copy of `run` under `root` without some of its files, with some results replaced."""
    with runs.RunWriter(
        run.declaration, run.parameters, run.run_id, root=root, meta={"provenance": run.provenance}
    ) as w:
        for name in run.meta["files"]:
            if name not in files:
                shutil.copy(run.path / name, w.path / name)
        w.extra.update({**run.results, **(results or {})})
    return runs.load_run(run.declaration, run.run_id, root=root)


def test_vector_add_launches(run):
    k = ch.add_kernels(run)
    assert sorted(k.implementation) == sorted([ch.TORCH_ADD, ch.OUR_ADD]), "one kernel each"
    cfg = ch.launches(run)
    n, block, warps = (run.parameters[p] for p in ("n", "block", "num_warps"))
    assert (cfg.threads == cfg.blocks * cfg["threads per block"]).all()
    ours = cfg.loc[ch.OUR_ADD]
    assert ours.kernel == "add_kernel"
    assert kernels.source(k.loc[k.implementation == ch.OUR_ADD, "name"].item()) == "Triton (ours)"
    assert ours.blocks == math.ceil(n / block) and ours["threads per block"] == warps * 32
    torch_row = cfg.loc[ch.TORCH_ADD]
    assert "CUDAFunctor_add" in torch_row.kernel and n % torch_row.threads == 0  # each thread: n/threads pairs
    assert run.results["triton_matches_torch"] is True
    assert set(k.kind) == {"elementwise"}, "kinds by today's rules"


def test_add_table_and_headline(run):
    at = ch.add_table(run)
    t = run.table("add_times").set_index("implementation")
    k = run.table("add_kernels").groupby("implementation").dur_ns.sum() / 1e3
    assert (at["kernel µs (profiler)"] == k.reindex(at.index)).all()
    # the estimator: the least of the calls (every run recorded ms_min)
    assert (at["per call µs (CUDA events)"] == t.ms_min.reindex(at.index) * 1e3).all()
    assert (at["kernel µs (profiler)"] < at["per call µs (CUDA events)"]).all(), "the launch costs more than the add"
    h = ch.headline(run)
    assert h["torch add µs"] == at.loc[ch.TORCH_ADD, "per call µs (CUDA events)"]
    assert h["Triton add µs"] == at.loc[ch.OUR_ADD, "per call µs (CUDA events)"]


def test_sync_costs_by_what(run):
    s = ch.sync_costs(run)
    assert set(s.index) == {ch.SYNC_IDLE, ch.SYNC_ITEM, ch.SYNC_TINY}
    assert (s > 0).all()
    assert (s == run.table("sync").set_index("what").us_min).all(), "the minimum, the book's estimator"
    # an old run has no quartiles: the table shows what it has
    assert list(ch.sync_table(run).columns) == ["what", "µs (min)", "µs (median)", "µs (max)"]


def test_launch_config_without_launch_dimensions():
    empty = pd.DataFrame(columns=["name", "grid", "block", "registers", "dur_ns"])
    assert ch.launch_config(empty).empty
    odd = pd.DataFrame(
        {
            "name": ["a", "b", "c"],
            "grid": ["", None, "4,2,1"],
            "block": ["128,1,1", "odd", "32"],
            "registers": [1, 2, 3],
            "dur_ns": [1, 2, 3],
        }
    )
    cfg = ch.launch_config(odd).set_index(odd.name)
    assert cfg.blocks.isna().tolist() == [True, True, False] and cfg.threads.isna().tolist() == [True, True, False]
    assert cfg.blocks["c"] == 8 and cfg["threads per block"]["a"] == 128 and cfg.threads["c"] == 256


def test_the_queue(run):
    q = run.table("queue")
    assert len(q) == run.parameters["burst"]
    assert (q.call_return_us >= q.call_start_us).all() and q.gpu_done_us.is_monotonic_increasing
    s = ch.queue_summary(run)
    call = q.call_return_us - q.call_start_us
    assert s["launch_call_us"] == call.min() and s["launch_call_us_median"] == call.median()
    assert s["launch_call_us"] <= s["launch_call_us_q1"] <= s["launch_call_us_median"] <= s["launch_call_us_q3"]
    assert s["host_issue_all_ms"] < s["gpu_done_all_ms"] <= s["host_sync_returned_ms"] + 1e-3
    assert s["gpu_done_all_ms"] == q.gpu_done_us.max() / 1e3
    assert 0 < s["queue_depth_at_last_launch"] <= run.parameters["burst"]
    assert s["add_mb"] == 3 * run.parameters["burst_n"] * 4 / 1e6
    bk = ch.burst_kernels(run)
    assert len(bk) == 40 and (bk.launch_ns <= bk.start_ns).all()


def test_l2_and_the_add_out_of_the_cache(run, monkeypatch):
    monkeypatch.setenv("LABSUPPORT_RUNS", str(FIXTURES))  # the owners' runs recorded on the fixture run's GPU
    c, h = ch.cache(run), ch.hbm_add(run)
    assert c.working_set_bytes == 3 * run.parameters["n"] * 4
    assert c.l2_bytes == 60 * 2**20 and c.fits
    assert (h.n == run.parameters["hbm_n"]).all() and (h["GB/s"] == h.bytes / (h.ms_median * 1e-3) / 1e9).all()
    assert (h["of datasheet"] == h["GB/s"] / 4800).all()
    lim = shared.limits()  # the ceilings of "Why a GPU", not this run's own
    assert lim.copy_tbs and (h["of measured copy"] == h["GB/s"] / (lim.copy_tbs * 1e3)).all()
    torch_gbs = h.set_index("implementation").loc[ch.TORCH_ADD, "GB/s"]
    text = ch.hbm_text(run)
    assert f"{torch_gbs:,.0f} GB/s" in text and "datasheet" in text and "copy" in text
    l2_text = ch.l2_text(run)
    assert "60 MiB L2 cache" in l2_text
    kernel_gbs = ch.add_table(run).loc[ch.TORCH_ADD, "GB/s during the kernel"]
    assert ("faster than the H200 SXM datasheet" in l2_text) == (kernel_gbs > 4800)


def test_a_run_on_another_gpu_than_why_a_gpus_is_set_against_its_own_datasheet(run, tmp_path, monkeypatch):
    """The H200 fixture run beside a run of *Why a GPU* recorded on an H100 (its fixture run, its GPU
    renamed): the add is set against the H200's datasheet, and against no copy (that copy was
    measured on the other GPU)."""
    monkeypatch.setenv("LABSUPPORT_RUNS", str(ceilings_on_another_gpu(tmp_path)))
    assert shared.limits().datasheet_name == "H100 SXM"
    h = ch.hbm_add(run)
    assert (h["of datasheet"] == h["GB/s"] / 4800).all() and h["of measured copy"].isna().all()
    assert "H200 SXM datasheet" in ch.hbm_text(run) and "Why a GPU" not in ch.hbm_text(run)


def test_runs_without_the_cache_size_or_the_add_out_of_it(run, tmp_path):
    old = without(run, tmp_path / "old", files={"hbm_add.csv"}, results={"l2_cache_bytes": None})
    assert ch.cache(old).l2_bytes is None and ch.cache(old).fits is None and ch.hbm_add(old) is None
    assert "did not record the cache's size" in ch.l2_text(old)
    assert "did not time an add larger" in ch.hbm_text(old)
    small = without(run, tmp_path / "small", results={"l2_cache_bytes": 2**20})
    assert not ch.cache(small).fits and "larger than this GPU's" in ch.l2_text(small)


def watch_interleaved(monkeypatch, calls):
    """Log each interleaved timing in `calls` as ("time", what), as the fixture logs time_region."""
    real = harness.interleaved

    def interleaved(variants, **kw):
        calls.append(("time", kw.get("what", "")))
        return real(variants, **kw)

    monkeypatch.setattr(harness, "interleaved", interleaved)


@pytest.mark.live
def test_the_notebook_times_everything_before_it_profiles(runs_root, calls, monkeypatch):
    watch_interleaved(monkeypatch, calls)
    monkeypatch.setattr(decode, "require_device", lambda device, allow_cpu=False: device)
    monkeypatch.setattr(triton_kernels, "add", lambda a, b, block=1024, num_warps=4: a + b)
    monkeypatch.setattr(ch, "Params", functools.partial(ch.Params, n=4096, burst_n=1024, device="cpu"))
    monkeypatch.setattr(environment, "check", lambda *a, **k: [])  # a CPU stands in for the GPU
    run = run_live(NOTEBOOK, repeats=3, burst=50, hbm_n=8192)
    assert_times_before_profiles(calls)
    assert [w for k, w in calls if k == "profile"] == ["torch add", "triton add", "burst"]
    h = run.table("hbm_add")
    assert list(h.implementation) == [ch.TORCH_ADD, ch.OUR_ADD] and (h.n == 8192).all()
    assert (h.bytes == 3 * 8192 * 4).all() and h.clean.all()
    assert list(run.table("sync").what) == [ch.SYNC_IDLE, ch.SYNC_ITEM, ch.SYNC_TINY]
    assert [w for k, w in calls if k == "time"][:1] == ["adds, 4096 elements"], "the two adds interleaved"
    sync = run.table("sync")
    assert (sync.us_min <= sync.us_q1).all() and (sync.us_q1 <= sync.us_median).all()
    assert (sync.us_median <= sync.us_q3).all() and (sync.repeats == 3).all()
    at = run.table("add_times")
    assert {"ms_min", "ms_q1", "ms_q3"} <= set(at.columns) and (at.repeats == 3).all()
    assert "ceilings.csv" not in run.meta["files"], "the ceilings are those of Why a GPU"
    assert run.table("add_times").clean.all()
    assert set(ch.add_kernels(run).implementation) == {ch.TORCH_ADD, ch.OUR_ADD}
    assert set(run.results["method"]) == set(harness.method())


def test_the_queue_refuses_after_a_profile(monkeypatch):
    monkeypatch.setattr(harness, "profiled", lambda: True)
    measure_queue = definitions(NOTEBOOK, repeats=3, burst=2, hbm_n=16)["measure_queue"]
    with pytest.raises(harness.TimingError, match="the queue"):
        measure_queue(2, 16)


def test_the_answer_comes_before_the_measuring_code():
    import json

    from .conftest import REPO

    nb = json.loads((REPO / "notebooks" / "what_a_kernel.ipynb").read_text())
    md = [
        i for i, c in enumerate(nb["cells"]) if c["cell_type"] == "markdown" and "## The answer" in "".join(c["source"])
    ]
    live = next(i for i, c in enumerate(nb["cells"]) if 'if mode == "live":' in "".join(c["source"]))
    assert len(md) == 1 and md[0] < live


# The page ------------------------------------------------------------------------------------


def test_the_page_quotes_the_runs_tables(run):
    page = ch.page(run)
    times = run.table("add_times").set_index("implementation")
    launched = run.table("add_kernels", dtype={"grid": str, "block": str}).set_index("implementation")
    waits = run.table("sync").set_index("what").us_min
    assert page.n == run.parameters["n"] == times.loc[ch.TORCH_ADD, "n"]
    assert page.torch_us == pytest.approx(times.loc[ch.TORCH_ADD, "ms_min"] * 1e3)  # the least of the calls
    assert page.ours_us_median == pytest.approx(times.loc[ch.OUR_ADD, "ms_median"] * 1e3)
    assert page.torch_kernel_us == pytest.approx(launched.loc[ch.TORCH_ADD, "dur_ns"] / 1e3)
    assert page.tk_kernel_share == pytest.approx(page.torch_kernel_us / page.torch_us)
    grid, block = (int(launched.loc[ch.OUR_ADD, col].split(",")[0]) for col in ("grid", "block"))
    assert (page.ours_blocks, page.ours_tpb) == (grid, block)
    assert page.per_thread == pytest.approx(page.n / page.torch_threads)
    assert page.ours_kernel == "`add_kernel`" and page.torch_kernel.startswith("`") and page.kernels_torch == 1
    assert page.match == "exactly the same numbers as"  # the run's results say the two adds agreed
    assert page.sync_us == waits[ch.SYNC_IDLE] and page.item_us == waits[ch.SYNC_ITEM]
    assert page.burst == run.parameters["burst"] and page.burst_m == run.parameters["burst_n"] / 1e6
    assert set(page.sync_formats) == set(page.sync_table.columns) - {"what"}
    assert list(page.hbm_table.implementation) == [ch.TORCH_ADD, ch.OUR_ADD]
    assert page.hbm_text == ch.hbm_text(run) and "L2" in page.l2_text
    assert "def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):" in ch.triton_add_source()


def test_the_page_of_a_run_without_the_add_out_of_the_cache(run, tmp_path):
    old = without(run, tmp_path, files=("hbm_add.csv",))
    assert ch.hbm_display(old) is None and len(ch.hbm_display(run)) == len(run.table("hbm_add"))


def test_every_glue_name_of_the_prose_is_a_page_field():
    notebook = f"notebooks/{NOTEBOOK}"
    assert len(prose_names(notebook)) > 30 and unglued(notebook, ch.Page) == set()
