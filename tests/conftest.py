import dataclasses
import json
import os
import shutil
import signal
import time
from pathlib import Path

import pytest

# Under pytest-xdist (`make test`) the workers share the CPUs: each gets its share for torch's
# threads (and so do the processes it starts, which inherit this), instead of every worker's
# threads spinning on every CPU. Set before torch is imported, which reads it then.
if os.environ.get("PYTEST_XDIST_WORKER"):
    _share = len(os.sched_getaffinity(0)) // int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, _share)))

from labsupport import runs  # noqa: E402
from labsupport.chapters import Chapter, File  # noqa: E402
from labsupport.chapters import kernels_in_one_token as one_token  # noqa: E402
from labsupport.measure import harness  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
RUNS = REPO / "runs"
# Copies of real H200 runs, one per chapter, frozen for the unit tests: a nightly that changes
# the published runs does not change what the tests assert (validation checks those).
FIXTURES = Path(__file__).resolve().parent / "fixtures" / "runs"


# --- tiers ---------------------------------------------------------------------------------
# Every test is in one tier (pyproject.toml declares the markers; `make test-fast` runs `unit`):
#   unit  small committed fixtures, in this process; no notebook is executed, no book is built.
#   book  reads the session's one book build (built_book: the HTML, the notebooks it executed,
#         what tests/figure_probe.py saw of their figures), or executes a chapter notebook in
#         replay on a runs folder of its own (a tampered run, a fixture run).
#   live  runs a chapter on the CPU with the tiny model (its module's one `tiny_run`, a live
#         command, the nightly), or a full tiny model through Triton's interpreter.
# A test carries its tier itself: its file's `pytestmark`, or a mark on the test, which wins
# over its file's. Collection stops, naming the test, on a test with no tier, with two at one
# level, or with a tier its fixtures contradict (a test that reads the book build is a book test).
TIERS = ("unit", "book", "live")
BOOK_FIXTURES = {"built_book", "book_html", "glued", "book_figures", "browser"}
LIVE_FIXTURES = {"tiny_run", "tiny", "tiny_hybrid_run", "live_env"}


def _reads_book(item) -> bool:
    return bool(set(getattr(item, "fixturenames", ())) & BOOK_FIXTURES)


class TierError(Exception):
    """A test without exactly one tier; the message is one line naming it."""


def tier_of(item) -> str:
    """The tier mark closest to the test (its own, else its file's): TierError when it has none,
    two at one level, or one that its fixtures contradict."""
    for node in reversed(item.listchain()):
        marked = sorted({m.name for m in node.own_markers if m.name in TIERS})
        if len(marked) > 1:
            raise TierError(f"{item.nodeid}: one tier, not {' and '.join(marked)}")
        if marked:
            tier = marked[0]
            break
    else:
        raise TierError(f"{item.nodeid}: no tier: mark it unit, book or live (pytestmark, or @pytest.mark.<tier>)")
    names = set(getattr(item, "fixturenames", ()))
    wants = "live" if names & LIVE_FIXTURES else "book" if names & BOOK_FIXTURES else None
    if wants and tier != wants:
        raise TierError(f"{item.nodeid}: marked {tier}, but its fixtures make it a {wants} test")
    return tier


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector):
    """A test file with a test that lacks one tier fails to collect, in a line naming the test
    (a collection error: pytest-xdist's workers report it as such, where a usage error is lost)."""
    report = yield
    if report.passed:
        wrong = []
        for item in report.result:
            if isinstance(item, pytest.Item):
                try:
                    tier_of(item)
                except TierError as e:
                    wrong.append(str(e))
        if wrong:
            report.outcome, report.longrepr, report.result = "failed", "\n".join(wrong), []
    return report


@pytest.hookimpl(tryfirst=True)  # before `-m` selects by tier
def pytest_collection_modifyitems(config, items):
    tiers = {item: tier_of(item) for item in items}
    # `-m` sees every mark above a test too: leave each test its one tier, on itself.
    for item, tier in tiers.items():
        for node in item.listchain()[:-1]:
            node.own_markers[:] = [m for m in node.own_markers if m.name not in TIERS]
        if not any(m.name == tier for m in item.own_markers):
            item.add_marker(getattr(pytest.mark, tier))
    # The files with tests that read the session's book build last: it builds in the background
    # meanwhile. Under pytest-xdist `make test` sends each file to one worker (`--dist loadfile`),
    # so that a module's fixtures (a chapter's one tiny-model run, the browser) are made once.
    with_book = {i.nodeid.split("::")[0] for i in items if _reads_book(i)}
    items.sort(key=lambda i: i.nodeid.split("::")[0] in with_book)


@pytest.fixture(autouse=True)
def _unit_tier_executes_no_notebook(request, monkeypatch):
    """A unit test that executes a notebook through papermill belongs to another tier: say so
    instead of making `make test-fast` slow without a word."""
    if not request.node.get_closest_marker("unit"):
        return
    import papermill

    def refused(*args, **kw):
        raise AssertionError(
            f"{request.node.nodeid} executes a notebook: mark it book or live (tests/conftest.py, TIERS)"
        )

    monkeypatch.setattr(papermill, "execute_notebook", refused)


def fixture_run(chapter) -> runs.Run:
    """The recorded run of `chapter` (its slug or its declaration) kept under tests/fixtures/runs/
    (the newest, if several)."""
    from labsupport import chapters

    declaration = chapters.by_slug(chapter) if isinstance(chapter, str) else chapter
    folder = FIXTURES / declaration.slug
    ids = sorted(p.name for p in folder.iterdir() if p.is_dir()) if folder.is_dir() else []
    if not ids:
        pytest.fail(
            f"no fixture run of {declaration.slug} under tests/fixtures/runs/: "
            f"python -m labsupport fixture {declaration.slug} (README, Adding a chapter)",
            pytrace=False,
        )
    return runs.load_run(declaration, ids[-1], root=FIXTURES)


@dataclasses.dataclass
class ToyParams:
    a: int = 1


# A chapter of no book, for the tests of the runs layer: one table, t.csv.
TOY = Chapter("ch", (File("t.csv", "a toy table", ("x",)),), ToyParams)


@pytest.fixture(autouse=True)
def _environment_restored():
    """Commands run in-process (nightly.main, live.smoke) set variables for their notebook
    kernels (PYTHONPATH, LABSUPPORT_COMMAND, LABSUPPORT_RUNS); none may leak into later tests."""
    saved = dict(os.environ)
    yield
    if dict(os.environ) != saved:
        os.environ.clear()
        os.environ.update(saved)


@pytest.fixture(scope="session")
def published():
    """A recorded H200 run of "The kernels in one token" (the fixture copy, not runs/)."""
    return fixture_run("kernels-in-one-token")


@pytest.fixture(scope="session")
def published_kernels(published):
    return one_token.kernel_table(published)


@pytest.fixture
def runs_root(tmp_path, monkeypatch):
    """An empty runs folder that labsupport writes to instead of the repository's."""
    root = tmp_path / "runs"
    root.mkdir()
    monkeypatch.setenv("LABSUPPORT_RUNS", str(root))
    return root


@pytest.fixture
def copied_runs(tmp_path, monkeypatch):
    """A copy of the repository's runs folder, safe to damage."""
    root = tmp_path / "published-runs"
    shutil.copytree(RUNS, root)
    monkeypatch.setenv("LABSUPPORT_RUNS", str(root))
    return root


def cpu_args(slug: str) -> list[str]:
    """Command-line arguments that run chapter `slug` live on a CPU with its tiny parameters
    (its Params fields' `cpu` values, device="cpu" among them), for `python -m labsupport live/nightly`."""
    from labsupport import chapters

    args = [slug, "--allow-cpu"]
    for name, value in chapters.by_slug(slug).cpu.items():
        args += ["--param", f"{name}={json.dumps(value)}"]
    return args


def with_shared_owners(root: Path) -> None:
    """Put the published runs of the chapters that own the shared quantities under the runs
    folder `root` (beside the runs a test recorded there) and name them in its manifest, as the
    book's runs folder has them: a page that shows a shared quantity reads them."""
    from labsupport.chapters import shared

    book = REPO / "runs"
    pub = runs.published(book)
    manifest = root / "published.json"
    have = json.loads(manifest.read_text()) if manifest.is_file() else {}
    for owner in shared.OWNERS:
        shutil.copytree(book / owner / pub[owner], root / owner / pub[owner], dirs_exist_ok=True)
        have[owner] = pub[owner]
    manifest.write_text(json.dumps(have, indent=2, sort_keys=True) + "\n")


def ceilings_on_another_gpu(root: Path, gpu: str = "NVIDIA H100 80GB HBM3") -> Path:
    """A runs folder `root` whose only published run is the fixture run of *Why a GPU* (the owner of
    the ceilings), its GPU renamed to `gpu`: a page of an H200 run beside ceilings measured on
    another GPU, as the book has when chapters were recorded on different boxes."""
    owner = fixture_run("why-a-gpu")
    copy = root / owner.chapter / owner.run_id
    shutil.copytree(owner.path, copy)
    meta = json.loads((copy / "meta.json").read_text())
    meta["provenance"]["gpu"] = gpu
    (copy / "meta.json").write_text(json.dumps(meta))
    (root / "published.json").write_text(json.dumps({owner.chapter: owner.run_id}))
    return root


def tree_bytes(root: Path) -> dict:
    """Every file under root with its bytes, to check that nothing changed."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def wait_while_running(proc, ready, limit_s: float = 600) -> bool:
    """Poll `ready()` until it holds, `proc` exits or `limit_s` passes; returns `ready()`. The
    limit is generous on purpose: a loaded CI machine once took over 120 s to start a nightly."""
    deadline = time.time() + limit_s
    while time.time() < deadline and proc.poll() is None and not ready():
        time.sleep(0.05)
    return ready()


def wait_until_measuring(proc, logs: Path, chapter: str) -> None:
    """Wait until a live or nightly command's notebook is seen measuring (its log under `logs`
    shows the tiny model being built); fail the test, ending the command, if it never is."""

    def measuring():
        found = list(logs.glob(f"*/{chapter}.log"))
        return bool(found) and "building tiny" in found[0].read_text(errors="replace")

    if not wait_while_running(proc, measuring) or proc.poll() is not None:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        _, err = proc.communicate(timeout=60)
        pytest.fail(f"the notebook was never seen measuring (exit {proc.returncode}): {err[-2000:]}")


# --- the session's one book build ---------------------------------------------------------
# Started in the background as soon as the tests are collected (when any of them reads it), so
# that it runs while the unit and live tests do; the tests that read it run last. Under
# pytest-xdist (`make test` runs `-n auto`) the first worker starts it in a folder every worker
# shares, and the others wait for its exit status there: the book is built once, not once a worker.
BOOK_RC, BOOK_LOG = "book-build.rc", "book-build.log"
_book: dict = {}


def _worker() -> str | None:
    return os.environ.get("PYTEST_XDIST_WORKER")


def _book_folder(config) -> Path:
    base = config._tmp_path_factory.getbasetemp()  # this process's; its parent is shared under xdist
    return (base.parent if _worker() else base) / "session-book"


def _start_book_build(config) -> None:
    import subprocess
    import threading

    from labsupport.ops import bookbuild

    from . import figure_probe

    out = _book_folder(config)
    out.mkdir(parents=True)
    # The notebook kernels of the build check every figure they draw (tests/figure_probe.py).
    ipython_dir = figure_probe.startup_folder(out / "ipython", out / "figure-probe")
    with open(out / BOOK_LOG, "w") as log:  # the build writes to its own copy of the file
        proc = subprocess.Popen(
            bookbuild.command(out),  # what `make book` runs
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "IPYTHONDIR": str(ipython_dir)},
        )

    def finish():
        try:
            rc = proc.wait(timeout=1800)
        except subprocess.TimeoutExpired:
            proc.kill()
            rc = "timed out after 1800 s"
        tmp = out / (BOOK_RC + ".tmp")
        tmp.write_text(f"{rc}\n")
        tmp.replace(out / BOOK_RC)  # whole, or not there

    waiter = threading.Thread(target=finish, daemon=True)
    waiter.start()
    _book.update(proc=proc, waiter=waiter)


def pytest_collection_finish(session):
    if session.config.option.collectonly:  # nothing runs, nothing reads it
        return
    if any(_reads_book(i) for i in session.items) and _worker() in (None, "gw0"):
        _start_book_build(session.config)


def pytest_sessionfinish(session, exitstatus):
    """The build is never left running: an interrupted session stops it; otherwise the first
    worker waits for it, as another worker may still be reading it."""
    if "proc" in _book:
        if exitstatus == pytest.ExitCode.INTERRUPTED:
            _book["proc"].kill()
        _book["waiter"].join(timeout=1800)


@pytest.fixture(scope="session")
def built_book(request):
    """The book built once per test session from the recorded runs, warnings as errors.

    Returns the HTML folder. Every test that looks at the rendered book shares this build.
    """
    out = _book_folder(request.config)
    deadline = time.time() + 1800
    while not (out / BOOK_RC).exists():
        assert time.time() < deadline, f"the session's book build did not finish: {out / BOOK_LOG}"
        time.sleep(0.5)
    rc, log = (out / BOOK_RC).read_text().strip(), (out / BOOK_LOG).read_text(errors="replace")
    assert rc == "0", f"the book build exited with {rc}:\n{log[-4000:]}"
    # An extension that does not declare itself safe for a parallel read makes Sphinx read serially.
    assert "doing serial read" not in log, log[-4000:]
    return out / "_build" / "html"


def executed_notebook(html: Path, notebook: Path) -> Path:
    """The notebook as the book build executed it (myst-nb keeps it beside the HTML)."""
    return html.parent / "jupyter_execute" / notebook.resolve().relative_to(REPO)


@pytest.fixture(scope="session")
def book_figures(built_book) -> list[dict]:
    """What the figure probe saw in each notebook kernel of the session's book build."""
    from . import figure_probe

    return figure_probe.records(built_book.parents[1] / "figure-probe")


@pytest.fixture
def calls(monkeypatch):
    """Every time_region and profile_region call, in order, as ("time"/"profile", what)."""
    order = []
    real_time, real_profile = harness.time_region, harness.profile_region

    def time_region(fn, *, what, **kw):
        order.append(("time", what))
        return real_time(fn, what=what, **kw)

    def profile_region(fn, path, *, region, **kw):
        order.append(("profile", region))
        return real_profile(fn, path, region=region, **kw)

    monkeypatch.setattr(harness, "time_region", time_region)
    monkeypatch.setattr(harness, "profile_region", profile_region)
    return order


# Fixtures of the tests that run our Triton kernels in the interpreter (TRITON_INTERPRET=1).
@pytest.fixture
def waits_as_no_ops(monkeypatch):
    """Triton's interpreter has no grid dependency control; it runs one program after another, each
    kernel to its end before the next, so a wait that does nothing is exact there."""
    import triton.language.extra.cuda as cuda

    monkeypatch.setattr(cuda, "gdc_wait", lambda *a, **k: None)
    monkeypatch.setattr(cuda, "gdc_launch_dependents", lambda *a, **k: None)


@pytest.fixture
def launches(monkeypatch):
    """The keyword arguments of every GEMV launch ("gemv") and every one-kernel attention call
    ("one"), in order, the kernels still run: what a step asked of its kernels."""
    from labsupport.measure.kernels import decode_attention, gemv

    seen = {"gemv": [], "one": []}
    launch, one = gemv.launch, decode_attention.decode_attention_one

    def counted(name, kernel):
        def call(*a, **k):
            seen[name].append(k)
            return kernel(*a, **k)

        return call

    monkeypatch.setattr(gemv, "launch", counted("gemv", launch))
    monkeypatch.setattr(decode_attention, "decode_attention_one", counted("one", one))
    return seen


def assert_gemv_products(config, *, early: bool, k: int, rows: int, seed: int) -> None:
    """Our GEMV with `config` gives PyTorch's products (float32, the interpreter's tolerance) on a
    random x of K and a gate/up weight of 2 x `rows` rows: plain (called twice: a split-K buffer or a
    persistent program's scalars are found ready again), after RMSNorm, as SiLU(gate) x up, and with
    the residual added."""
    import torch

    from labsupport.measure.kernels import gemv
    from labsupport.measure.models import qwen3_decode

    close = dict(rtol=1e-4, atol=1e-4)
    g = torch.Generator().manual_seed(seed)
    x, nw = torch.randn(1, 1, k, generator=g), torch.randn(k, generator=g)
    gate, up = torch.randn(rows, k, generator=g), torch.randn(rows, k, generator=g)
    w = torch.cat([gate, up])
    for _ in range(2):
        torch.testing.assert_close(gemv.gemv(x, w, config=config, early=early), x @ w.T, **close)
    normed = qwen3_decode.rmsnorm(x, nw, 1e-6)
    torch.testing.assert_close(gemv.gemv(x, w, norm_weight=nw, config=config, early=early), normed @ w.T, **close)
    act = torch.nn.functional.silu(normed @ gate.T) * (normed @ up.T)
    fused = gemv.gemv(x, gemv.interleave(gate, up), norm_weight=nw, silu=True, config=config, early=early)
    torch.testing.assert_close(fused, act, **close)
    r = torch.randn(1, 1, 2 * rows, generator=g)
    torch.testing.assert_close(gemv.gemv(x, w, residual=r, config=config, early=early), r + x @ w.T, **close)


def tiny_model_with_norms(dtype):
    """The tiny model (seed 0) with every RMSNorm's weight drawn from [0.5, 1.5), and a prompt: norms
    that are not all ones, so that folding them into the matrices shows."""
    import torch

    from labsupport.measure import decode, models

    torch.manual_seed(0)
    model = models.build_model("tiny", device="cpu", dtype=dtype)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(0.5 + torch.rand_like(p))
    return model, decode.Prompt.random(model.config.vocab_size, 1, 40, "cpu")


def folded_and_rounded(model):
    """A copy of `model` whose norm weights were folded into the matrices after them (folded_norms.fold),
    those matrices rounded to FP8 and back, and the norms' weights set to one: the weights the FP8 rung
    with folded norms computes with (each row rounded alone, as the step's concatenations round them)."""
    import copy

    import torch

    from labsupport.measure.kernels import folded_norms, gemv_fp8

    def fold_round(linear, norm):
        w = folded_norms.fold(linear.weight, norm)
        linear.weight.copy_(gemv_fp8.dequantize(*gemv_fp8.quantize(w), w.dtype))

    out = copy.deepcopy(model)
    with torch.no_grad():
        for lyr in out.model.layers:
            a, m = lyr.self_attn, lyr.mlp
            for linear in (a.q_proj, a.k_proj, a.v_proj):
                fold_round(linear, lyr.input_layernorm.weight)
            for linear in (m.gate_proj, m.up_proj):
                fold_round(linear, lyr.post_attention_layernorm.weight)
            for linear in (a.o_proj, m.down_proj):
                linear.weight.copy_(gemv_fp8.dequantize(*gemv_fp8.quantize(linear.weight), linear.weight.dtype))
            lyr.input_layernorm.weight.fill_(1.0)
            lyr.post_attention_layernorm.weight.fill_(1.0)
        fold_round(out.lm_head, out.model.norm.weight)
        out.model.norm.weight.fill_(1.0)
    return out


@pytest.fixture(scope="module")
def tiny_with_norms():
    """tiny_model_with_norms in float32, with eager's reference (closing_the_gap.reference)."""
    import torch

    from labsupport.chapters import closing_the_gap as ch

    model, prompt = tiny_model_with_norms(torch.float32)
    return model, prompt, ch.reference(model, prompt)
