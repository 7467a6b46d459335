"""The environment check at the top of every chapter notebook (labsupport.measure.environment):
one line per problem, nothing when all is fine; its memory estimate; the smaller preset it
offers; and the notebooks' first cell without labsupport installed."""

import re
import sys

import nbformat
import pytest
import torch

import labsupport.measure
from labsupport import chapters
from labsupport.measure import environment, models
from labsupport.ops import live

from .conftest import REPO

pytestmark = pytest.mark.unit

H200 = "NVIDIA H200"


@pytest.fixture
def gpu(monkeypatch):
    """A fake CUDA GPU: its name, compute capability and free/total memory, and the allocator cap
    it was given."""
    state = {"name": H200, "capability": (9, 0), "free": 140e9, "total": 143e9, "fraction": None}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0: state["name"])
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i=0: state["capability"])
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda i=0: (state["free"], state["total"]))
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction", lambda f, i=0: state.update(fraction=f))
    monkeypatch.delenv(environment.MEMORY_VARIABLE, raising=False)
    return state


def test_replay_with_everything_installed_says_nothing(capsys):
    assert environment.check("kernels-in-one-token", "replay", "qwen3-8b") == []
    assert capsys.readouterr().out == ""


def test_a_missing_package_stops_the_chapter_in_one_line(monkeypatch):
    real = environment.installed
    monkeypatch.setattr(environment, "installed", lambda d: None if d == "pandas" else real(d))
    with pytest.raises(environment.EnvironmentProblem) as e:
        environment.check("launch-overhead", "replay")
    line = str(e.value)
    assert "\n" not in line and line.startswith("pandas is not installed") and "wheel" in line


def test_an_old_package_is_one_note(monkeypatch, capsys):
    real = environment.installed
    monkeypatch.setattr(environment, "installed", lambda d: "2.1.0+cu121" if d == "torch" else real(d))
    lines = environment.check("launch-overhead", "replay")
    assert lines == ["torch 2.1.0+cu121 is older than the 2.5 the chapters are written for: upgrade if a cell fails"]
    assert capsys.readouterr().out == lines[0] + "\n"


def test_live_without_a_gpu_stops_and_replay_does_not(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(environment.EnvironmentProblem, match=r"^live mode needs a CUDA GPU and none is .*replay"):
        environment.check("kernels-in-one-token", "live", "qwen3-8b")
    assert environment.check("kernels-in-one-token", "replay", "qwen3-8b") == []
    assert environment.check("kernels-in-one-token", "live", "tiny", allow_cpu=True) == []


def test_a_gpu_without_a_datasheet_is_one_note(gpu, capsys):
    gpu["name"] = "NVIDIA RTX PRO 9000"
    lines = environment.check("kernels-in-one-token", "live", "qwen3-8b")
    assert len(lines) == 1 and "'NVIDIA RTX PRO 9000' is not in the book's datasheet table" in lines[0]
    assert "measures on it only" in lines[0]
    assert environment.check("kernels-in-one-token", "live", "qwen3-8b") == lines  # as often as asked
    gpu["name"] = H200
    assert environment.check("kernels-in-one-token", "live", "qwen3-8b") == []


def test_too_little_memory_names_the_largest_preset_that_fits(gpu, monkeypatch):
    monkeypatch.setenv(environment.MEMORY_VARIABLE, "8")
    with pytest.raises(environment.EnvironmentProblem) as e:
        environment.check("kernels-in-one-token", "live", "qwen3-8b")
    line = str(e.value)
    need = environment.needed_gb("qwen3-8b")
    assert "\n" not in line
    assert line.startswith(f"preset 'qwen3-8b' needs about {need:.1f} GB of GPU memory")
    assert "8.0 GB usable (LABSUPPORT_GPU_MEMORY_GB=8;" in line
    assert line.endswith("the largest preset that fits is 'qwen3-1.7b' (overrides = {'preset': 'qwen3-1.7b'})")
    assert gpu["fraction"] == pytest.approx(8e9 / gpu["total"])  # the allocator is capped too
    assert environment.check("kernels-in-one-token", "live", "qwen3-1.7b") == []  # and that one runs


def test_a_live_run_of_the_default_preset_is_checked_for_memory_when_it_opens(gpu, monkeypatch, runs_root):
    """The notebook's first check knows only the preset its overrides name; the run's opening
    (recording.writer) checks the preset it will build, the default included, and caps the
    allocator, before any model is built or any run written."""
    from labsupport.chapters import launch_overhead
    from labsupport.measure import recording

    monkeypatch.setenv(environment.MEMORY_VARIABLE, "8")
    with pytest.raises(environment.EnvironmentProblem, match=r"^preset 'qwen3-8b' needs about .*'qwen3-1\.7b'"):
        recording.writer(launch_overhead.DECLARATION, launch_overhead.Params())
    assert gpu["fraction"] == pytest.approx(8e9 / gpu["total"]) and not any(runs_root.iterdir())


def test_free_memory_counts_without_a_cap_and_nothing_may_fit(gpu, monkeypatch):
    gpu["free"] = 2e9  # another process holds the rest
    with pytest.raises(environment.EnvironmentProblem, match=r"2\.0 GB free of 143\.0 GB: no preset of it fits$"):
        environment.check("prefill-vs-decode", "live", "qwen3-8b")
    assert gpu["fraction"] is None
    gpu["free"] = 60e9  # the hybrid's 27B needs about 70 GB and has no smaller real preset
    with pytest.raises(environment.EnvironmentProblem, match=r"'qwen3\.5-27b' needs about 70\.\d GB.*no preset of it"):
        environment.check("hybrid-model-token", "live", "qwen3.5-27b")


def test_a_gpu_without_bf16_runs_float16_and_says_so_in_one_line(gpu, capsys):
    gpu.update(name="Tesla T4", capability=(7, 5), free=15e9, total=15.8e9)
    lines = environment.check("kernels-in-one-token", "live", "qwen3-1.7b")
    assert lines == ["the GPU 'Tesla T4' (compute capability 7.5) has no BF16: the model runs in float16"]
    assert capsys.readouterr().out == lines[0] + "\n"
    assert environment.dtype_here("bfloat16") == "float16"  # the notebook's default follows the GPU
    assert environment.dtype_here("float16") == "float16"
    assert environment.dtype_here("bfloat16", device="cpu") == "bfloat16"  # the tiny model on a CPU: as asked
    assert environment.check("kernels-in-one-token", "live", "qwen3-1.7b", dtype="float16") == []


def test_an_explicit_bfloat16_on_a_gpu_without_it_is_refused_in_one_line(gpu):
    gpu.update(name="Tesla V100-SXM2-16GB", capability=(7, 0), free=15e9, total=16e9)
    with pytest.raises(environment.EnvironmentProblem) as e:
        environment.check("launch-overhead", "live", "qwen3-1.7b", dtype="bfloat16")
    line = str(e.value)
    assert "\n" not in line and "(compute capability 7.0) has no BF16, which dtype='bfloat16' asks for" in line
    assert line.endswith("set dtype='float16'")
    gpu.update(name=H200, capability=(9, 0), free=140e9, total=143e9)
    assert environment.check("launch-overhead", "live", "qwen3-8b", dtype="bfloat16") == []  # a GPU with BF16
    assert environment.dtype_here("bfloat16") == "bfloat16"
    with pytest.raises(environment.EnvironmentProblem, match="dtype must be one of bfloat16, float16"):
        environment.dtype_here("float32")


def test_the_live_command_passes_only_an_explicit_dtype_to_the_check(monkeypatch):
    seen = []

    def run(cmd, **kw):
        import json
        import subprocess

        seen.extend(json.loads(cmd[-1]))
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr("subprocess.run", run)
    picked = chapters.find(["launch-overhead", "closing-the-gap"])
    assert (
        live.check_environment(picked, {"launch-overhead": {"dtype": "bfloat16"}, "closing-the-gap": {}}, False) is None
    )
    assert [row[3] for row in seen] == ["bfloat16", None]


def test_float16_weights_take_as_much_memory_as_bf16():
    assert environment.needed_gb("qwen3-1.7b", "float16") == environment.needed_gb("qwen3-1.7b")
    assert models.preset_counts("tiny", "float16").bytes_per_parameter == 2


@pytest.mark.parametrize("raw", ["eight", "0", "-3"])
def test_a_bad_memory_cap_is_one_line(gpu, monkeypatch, raw):
    monkeypatch.setenv(environment.MEMORY_VARIABLE, raw)
    with pytest.raises(environment.EnvironmentProblem, match=f"^LABSUPPORT_GPU_MEMORY_GB={raw!r}"):
        environment.check("kernels-in-one-token", "live", "qwen3-8b")


def test_memory_estimate_is_the_weights_of_count_model_and_the_stated_margin():
    counts = models.count_model(models.build_model("qwen3-8b", device="meta"), "qwen3-8b")
    weights = counts.parameters * counts.bytes_per_parameter / 1e9
    assert environment.weight_gb("qwen3-8b") == pytest.approx(weights)
    assert weights == pytest.approx(16.38, abs=0.01)  # Qwen3-8B: 8.19 billion parameters in BF16
    assert environment.needed_gb("qwen3-8b") == pytest.approx(weights * 1.25 + 3.0)


def test_the_qwen3_1_7b_preset_is_the_published_model():
    """Qwen3-1.7B: 1.72 billion parameters (1.41 billion without the embedding table), its LM
    head tied to the embedding table, so a decode step reads the table whole."""
    cfg = models.hf_config("qwen3-1.7b")
    assert (cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers) == (2048, 6144, 28)
    assert (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim) == (16, 8, 128)
    assert cfg.tie_word_embeddings and cfg.vocab_size == 151_936
    model = models.build_model("qwen3-1.7b", device="meta")
    c = models.count_model(model, "qwen3-1.7b")
    assert c.parameters == pytest.approx(1.72e9, rel=0.005)
    assert c.parameters - 151_936 * 2048 == pytest.approx(1.41e9, rel=0.005)
    assert c.decode_bytes == c.parameters * 2  # the LM head is the table: read whole every step
    norms = 28 * (2 * 2048 + 2 * 128) + 2048  # two norms in each layer, its q and k norms, the final norm
    assert c.matmul_weight_parameters == c.parameters - norms
    assert models.preset_counts("qwen3-8b").embedding_parameters == 151_936 * 4096  # untied: not read


def _pins(path):
    return dict(re.findall(r"^([\w-]+)==([\d.]+)", (REPO / path).read_text(), re.M))


def test_versions_agree_with_the_requirements_files():
    gpubox, tested = _pins("requirements-gpubox.txt"), _pins("requirements.txt")
    for dist, (oldest, _) in {**environment.OPTIONAL, **environment.BY_CHAPTER["hybrid-model-token"]}.items():
        assert gpubox[dist] == oldest, dist
    for dist, oldest in environment.PACKAGES.items():
        assert environment.version_tuple(oldest) <= environment.version_tuple(tested[dist]), dist


def _first_cell(chapter):
    nb = nbformat.read(chapter.path, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    i = next(i for i, c in enumerate(code) if "parameters" in c.metadata.get("tags", []))
    assert i <= 1  # after the cell that installs labsupport where it is missing (test_elsewhere.py)
    return code[i].source, code[i + 1].source


@pytest.mark.parametrize("chapter", chapters.CHAPTERS, ids=lambda c: c.slug)
def test_the_first_cell_says_in_one_line_what_is_missing(chapter, monkeypatch, capsys):
    params, first = _first_cell(chapter)
    assert f'env_notes = environment.check(\n    "{chapter.slug}", mode, overrides.get("preset")' in first
    ns = {}
    exec(params, ns)
    exec(first, ns)  # replay, everything installed: silent
    assert capsys.readouterr().out == ""
    monkeypatch.delattr(labsupport.measure, "environment", raising=False)
    monkeypatch.setitem(sys.modules, "labsupport.measure.environment", None)
    with pytest.raises(ImportError) as e:
        exec(first, ns)
    assert "\n" not in str(e.value) and str(e.value).startswith("labsupport is not installed: pip install")
    assert "download/" in str(e.value)


@pytest.mark.parametrize("chapter", chapters.CHAPTERS, ids=lambda c: c.slug)
def test_the_first_cell_stops_a_live_run_without_a_gpu(chapter, monkeypatch):
    params, first = _first_cell(chapter)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    ns = {}
    exec(params, ns)
    ns["mode"] = "live"
    with pytest.raises(environment.EnvironmentProblem, match="^live mode needs a CUDA GPU and none is visible"):
        exec(first, ns)


def test_live_command_checks_in_a_child_process_before_any_notebook(capsys):
    """On this machine (no CUDA GPU) the child's check stops kernels-in-one-token in one line;
    with --allow-cpu and the tiny preset it passes."""
    ch = chapters.by_slug("kernels-in-one-token")
    if torch.cuda.is_available():
        pytest.skip("needs a machine without a CUDA GPU")
    assert live.check_environment([ch], {ch.slug: {}}, allow_cpu=False) == (
        "kernels-in-one-token: live mode needs a CUDA GPU and none is visible (mode='replay' shows the recorded run)"
    )
    assert live.check_environment([ch], {ch.slug: {"preset": "tiny"}}, allow_cpu=True) is None


def test_the_run_it_yourself_page_states_the_estimates_of_the_code():
    page = " ".join((REPO / "book" / "run_it_yourself.md").read_text().split())
    small = environment.needed_gb("qwen3-1.7b")
    assert f"Qwen3-8B needs about {environment.needed_gb('qwen3-8b'):.1f} GB" in page
    assert f"architecture, published configuration) about {small:.1f} GB" in page
    assert f"27B about {environment.needed_gb('qwen3.5-27b'):.0f} GB" in page
    assert f"a quarter of that plus {environment.MARGIN_GB:g} GB" in page and environment.MARGIN_FRACTION == 0.25
