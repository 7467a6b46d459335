"""The practical ceiling, defined once (hardware.practical_ceiling): the best read rate of the
ceilings owner's run, never a copy's; its read-kernels table (why_a_gpu.read_kernels); the fallback
of runs recorded before it; and the validation that refuses a kernel the book shows reading faster.

The read kernels of these tests are real H200 timings: the LM head and every other weight shape as
*Closing the gap*'s recorded fixture run timed them (cuBLAS and the tuner's Triton configs), put
into a copy of the fixture run of *Why a GPU* from the same night."""

import shutil

import pytest

from labsupport import chapters, runs
from labsupport.chapters import shared
from labsupport.chapters import why_a_gpu as ch
from labsupport.measure import hardware
from labsupport.measure.kernels import gemv
from labsupport.ops import validate

from .conftest import fixture_run
from .test_why_a_gpu import derived_run

pytestmark = pytest.mark.unit


def read_kernels_of(closing: runs.Run):
    """A read_kernels table from the GEMVs a run of *Closing the gap* timed: cuBLAS per weight shape
    (matmuls.csv) and each plain BF16 config of its tuner (gemv_tuning.csv)."""
    m = closing.table("matmuls")
    names = {(int(r.n), int(r.k)): r.matrix for r in m.itertuples()}
    rows = [ch.read_kernels.row(ch.CUBLAS, r.matrix, int(r.n), int(r.k), "", r.cublas_us) for r in m.itertuples()]
    t = closing.table("gemv_tuning")
    t = t[t.fusion == "plain"]  # this run's tuner: BF16 weights, no split-K
    for r in t.itertuples():
        c = gemv.Config(int(r.block_n), int(r.block_k), int(r.num_warps), int(r.num_stages))
        rows.append(
            ch.read_kernels.row(ch.TRITON, names[(r.n, r.k)], int(r.n), int(r.k), ch.read_kernels.config_text(c), r.us)
        )
    return ch.read_kernels.table(rows)


@pytest.fixture
def closing():
    return fixture_run("closing-the-gap")


@pytest.fixture
def root(tmp_path, closing):
    """A runs folder: the fixture why-a-gpu run with read kernels, published, and closing-the-gap's."""
    root = tmp_path / "runs"
    owner = derived_run(fixture_run("why-a-gpu"), root, {hardware.READ_KERNELS: read_kernels_of(closing)})
    shutil.copytree(closing.path, root / closing.chapter / closing.run_id)
    runs.publish_many({owner.chapter: owner.run_id, closing.chapter: closing.run_id}, root)
    return root


def test_without_read_kernels_the_ceiling_is_the_best_read_never_the_copy():
    run = fixture_run("why-a-gpu")  # recorded before read_kernels.csv
    lim = hardware.run_limits(run)
    assert lim.copy_tbs > lim.read_tbs, "in this run the copy's read-plus-write is the larger number"
    assert lim.ceiling_tbs == lim.read_tbs and lim.ceiling_by.startswith("read stream")
    assert lim.measured_ridge == pytest.approx(lim.gemm_tflops / lim.read_tbs)
    assert ch.shared(run)["ceiling_tbs"] == lim.ceiling_tbs and ch.shared(run)["measured_ridge"] == lim.measured_ridge


def test_with_read_kernels_the_ceiling_is_the_fastest_kernel(root, closing):
    owner = shared.owner_run(shared.CEILINGS, root=root)
    rk = owner.table(hardware.READ_KERNELS)
    lim = hardware.run_limits(owner)
    assert lim.ceiling_tbs == pytest.approx(rk.tbs.max()) and lim.ceiling_tbs > lim.read_tbs
    assert lim.ceiling_by.startswith(ch.TRITON) and "lm_head, 151,936 x 4,096" in lim.ceiling_by
    assert rk.tbs.to_numpy() == pytest.approx((rk.bytes / (rk.ms * 1e-3) / 1e12).to_numpy())
    assert ch.shared(owner)["ceiling_tbs"] == lim.ceiling_tbs
    assert ch.shared(owner)["measured_ridge"] == pytest.approx(lim.gemm_tflops / lim.ceiling_tbs)
    assert ch.ridge(owner).ceilings_batch == pytest.approx(lim.measured_ridge)
    assert "read_kernels.csv" in ch.memory_ceiling_text(owner)
    # Every rate the closing-the-gap run shows is at or under it, within the declared noise.
    top = max(t for _, t in validate._read_rates(closing))
    assert top <= lim.ceiling_tbs * (1 + hardware.CEILING_TOLERANCE)
    assert hardware.CEILING_TOLERANCE <= 0.01
    # The eager step's matmuls (cuBLAS, profiled) are counted too, the LM head the fastest of them.
    eager = dict(validate._read_rates(fixture_run("kernels-in-one-token")))
    assert len(eager) == 8 and max(eager, key=eager.get).startswith("the eager step's lm_head")
    assert max(eager.values()) <= lim.ceiling_tbs


def test_validation_passes_a_run_under_the_ceiling(root, closing):
    run = runs.load_run(closing.declaration, root=root)
    assert validate.check_ceiling(run) == []


def test_validation_refuses_a_kernel_above_the_ceiling(root, closing):
    m = closing.table("matmuls")
    lim = hardware.run_limits(shared.owner_run(shared.CEILINGS, root=root))
    head = m.matrix == "lm_head"
    m.loc[head, "triton_us"] = m.loc[head, "bytes"] / (lim.ceiling_tbs * 1.02 * 1e6)  # 2% above the ceiling
    m["triton_tbs"] = m.bytes / m.triton_us / 1e6
    problems = validate.check_ceiling(tampered(root, closing, m, "fast"))
    assert len(problems) == 1, problems
    assert problems[0].startswith("Triton GEMV at lm_head reads") and f"{lim.ceiling_tbs:.3f} TB/s" in problems[0]
    fast = runs.load_run(closing.declaration, closing.run_id, root=root.parent / "fast")
    assert problems[0] in validate.check_run(chapters.by_slug(closing.chapter), fast)
    # Within the declared noise it passes.
    m.loc[head, "triton_us"] = m.loc[head, "bytes"] / (lim.ceiling_tbs * 1.005 * 1e6)
    m["triton_tbs"] = m.bytes / m.triton_us / 1e6
    assert validate.check_ceiling(tampered(root, closing, m, "near")) == []


def tampered(root, closing, matmuls, name):
    """A copy of `closing` with its matmuls table replaced, in a runs folder of its own beside the
    published ceilings run of `root`."""
    other = root.parent / name
    shutil.copytree(root / shared.CEILINGS, other / shared.CEILINGS)
    runs.publish_many({shared.CEILINGS: runs.published(root)[shared.CEILINGS]}, other)
    return derived_run(closing, other, {"matmuls": matmuls})


def test_validation_waits_for_a_ceiling_with_read_kernels(tmp_path, closing):
    """The ceilings run recorded before read_kernels.csv: its read stream is below the book's GEMV at
    the LM head by design; the check does not apply until the ceilings owner has the table."""
    root = tmp_path / "runs"
    for run in (fixture_run("why-a-gpu"), closing):
        shutil.copytree(run.path, root / run.chapter / run.run_id)
    runs.publish_many({"why-a-gpu": fixture_run("why-a-gpu").run_id, closing.chapter: closing.run_id}, root)
    run = runs.load_run(closing.declaration, root=root)
    assert max(t for _, t in validate._read_rates(run)) > hardware.run_limits(fixture_run("why-a-gpu")).ceiling_tbs
    assert validate.check_ceiling(run) == []


def test_the_step_matrices_include_the_lm_head():
    m = ch.step_matrices("qwen3-8b")
    assert m["lm_head"] == (151_936, 4096) and m["q_proj, o_proj"] == (4096, 4096)
    assert set(m.values()) == {(4096, 4096), (1024, 4096), (12_288, 4096), (4096, 12_288), (6144, 4096),
                               (24_576, 4096), (151_936, 4096)}  # fmt: skip


def test_time_read_kernels_times_every_kernel_at_every_shape(monkeypatch):
    """The live measuring code on a CPU, its timer replaced (CUDA graphs need a GPU): cuBLAS and every
    candidate config at every shape, each row's rate its bytes over its time."""
    timed = []

    def fake_time(n, k, call, repeats=20, fp8=False, dtype=None):
        timed.append((n, k))
        return float(n * k) / 4e6  # every shape read at 8 TB/s

    monkeypatch.setattr(gemv, "time_per_call_us", fake_time)
    monkeypatch.setattr(gemv, "fused_call", lambda n, k, fusion, config, dtype=None, early=False: (n, k, config))
    t = ch.time_read_kernels("tiny", progress=lambda _: None)
    shapes = ch.step_matrices("tiny")
    assert len(t) == len(shapes) * (1 + len(gemv.CANDIDATES)) == len(timed)
    assert list(t.columns) == list(ch.read_kernels.COLUMNS)
    assert set(zip(t.n, t.k, strict=True)) == set(shapes.values())
    assert (t.groupby("matrix").kernel.value_counts().xs(ch.CUBLAS, level="kernel") == 1).all()
    assert t.tbs.to_numpy() == pytest.approx((t.bytes / (t.ms * 1e-3) / 1e12).to_numpy())
    assert ch.TRITON_EARLY not in set(t.kernel)  # no dependent launch before Hopper (here: no GPU at all)


def test_on_hopper_the_gemv_is_timed_again_as_the_last_rungs_launch_it(monkeypatch):
    """On Hopper every candidate is timed twice at every shape, plainly and with dependent launch and
    weights first (fused_call's `early`), so that the ceiling is one that the last rungs' GEMV cannot beat."""
    launched = []

    def fake_call(n, k, fusion, config, dtype=None, early=False):
        launched.append(early)
        return early

    monkeypatch.setattr(gemv, "time_per_call_us", lambda n, k, call, repeats=20, dtype=None: 2.0 if call else 3.0)
    monkeypatch.setattr(gemv, "fused_call", fake_call)
    monkeypatch.setattr(ch.read_kernels.hardware, "dependent_launch", lambda: True)
    t = ch.time_read_kernels("tiny", progress=lambda _: None)
    shapes = ch.step_matrices("tiny")
    counts = t.groupby("matrix").kernel.value_counts()
    assert (counts.xs(ch.TRITON, level="kernel") == len(gemv.CANDIDATES)).all()
    assert (counts.xs(ch.TRITON_EARLY, level="kernel") == len(gemv.CANDIDATES)).all()
    assert len(launched) == 2 * len(shapes) * len(gemv.CANDIDATES) and sum(launched) == len(launched) // 2
    assert (t[t.kernel == ch.TRITON_EARLY].ms == 2e-3).all() and (t[t.kernel == ch.TRITON].ms == 3e-3).all()
