"""The `model` parameter of every chapter whose model is a transformers decoder: a local folder
with a config.json in place of the preset. Each chapter's live cells run on the CPU on a tiny
checkpoint saved here by save_pretrained (three architectures: Llama, Qwen3 and Mistral, their
safetensors loaded back), into a copy of the published runs, and the run records where its model
came from; its byte counts and shapes are the checkpoint's. A model folder that lacks what a chapter
measures (GPT-2's configuration: no RMSNorm, no MLP intermediate size, no `.layers`) is refused in
one line before anything is measured, and no run is written."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest

from labsupport import chapters, runs
from labsupport.measure import harness, models
from labsupport.measure.models import source

from .checkpoints import CHECKPOINTS, save_checkpoint, tiny_model
from .conftest import RUNS
from .live_cells import run_live_cells

pytestmark = pytest.mark.live

# chapter slug -> the architecture it runs here (each of the three at least once)
ARCHITECTURE = {
    "kernels-in-one-token": "llama",
    "launch-overhead": "qwen3",
    "prefill-vs-decode": "mistral",
    "why-a-gpu": "qwen3",
    "model-code-to-kernels": "mistral",
    "where-kernels-come-from": "llama",
}
# What each chapter runs with on the CPU beside `model` (its declaration's CPU values, smaller where
# a chapter has none: the two GPU-only chapters).
SMALL = {
    "kernels-in-one-token": dict(prompt_len=16, contexts=[16, 32], repeats=2),
    "launch-overhead": dict(prompt_len=16, repeats=3),
    "prefill-vs-decode": dict(prompt_len=16, prompt_lens=[1, 8, 16], repeats=2),
    "why-a-gpu": dict(prompt_len=16, batches=[1, 2], rounds=2, matvec_repeats=2),
    "model-code-to-kernels": dict(repeats=3),
    "where-kernels-come-from": dict(contexts=[16], repeats=3),
}


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    """{model type: its tiny checkpoint's folder}: Llama, Qwen3 and Mistral with their weights, GPT-2
    as a configuration alone."""
    base = tmp_path_factory.mktemp("checkpoints")
    return {t: save_checkpoint(base / t, t, weights) for t, (_, weights) in CHECKPOINTS.items()}


@pytest.fixture
def runs_copy(tmp_path, monkeypatch) -> Path:
    """A copy of the published runs as LABSUPPORT_RUNS (the pages read the other owners' runs)."""
    root = tmp_path / "runs"
    shutil.copytree(RUNS, root)
    monkeypatch.setenv("LABSUPPORT_RUNS", str(root))
    return root


def record(slug: str, folder: Path, **more):
    """The chapter's live cells on the CPU with `model=folder`: the notebook's namespace."""
    ch = chapters.by_slug(slug)
    return run_live_cells(ch.notebook, model=str(folder), allow_cpu=True, **{**SMALL[slug], **more})


def check_source(run: runs.Run, folder: Path, model_type: str, dtype: str = "bfloat16", shapes_only=False) -> None:
    """The run names its model folder and records where the model came from, with the counts of the
    checkpoint's own model (counted here, independently, in the run's dtype)."""
    assert run.parameters["model"] == str(folder) and run.provenance["device"] == "cpu"
    src = run.results["model_source"]
    expected = tiny_model(model_type).to(models.torch_dtype(dtype))
    counted = models.count_model(expected)
    assert src["folder"] == folder.name and src["model_type"] == model_type
    assert src["architecture"] == type(expected).__name__
    assert src["config_sha256"] == hashlib.sha256((folder / "config.json").read_bytes()).hexdigest()
    assert src["weights"] == ("shapes only" if shapes_only else "loaded")
    assert src["weight_files"] == ([] if shapes_only else ["model.safetensors"])
    assert src["parameters"] == counted.parameters and src["decode_bytes"] == counted.decode_bytes
    config = expected.config
    assert src["shape"]["hidden_size"] == config.hidden_size == 64
    assert src["shape"]["num_key_value_heads"] == config.num_key_value_heads == 2
    assert src["shape"]["head_dim"] == 16


def test_kernels_in_one_token_runs_the_folder_and_counts_its_bytes(folders, runs_copy):
    from labsupport.chapters import kernels_in_one_token as ch

    folder = folders["llama"]
    run = record(ch.CHAPTER, folder)["run"]
    check_source(run, folder, "llama")
    assert run.results["model"]["decode_bytes"] == run.results["model_source"]["decode_bytes"]
    # The fresh processes and the plain script build the preset: a model folder is timed here only.
    assert not {"plain_eager_step.csv", "fresh_processes.csv"} & set(run.meta["files"])
    k = ch.kernel_table(run)
    census = run.table("census").set_index("kind")
    assert census.loc["total", "kernels"] == len(k) and {"matrix multiply", "attention"} <= set(k.kind)
    # The matrices by shape and the KV cache are the checkpoint's: Llama's 64-wide layers, 2 KV heads of 16.
    g = ch.gemv_by_shape(run).set_index("projection")
    assert g.loc["k_proj", "shape"] == "32 x 64" and g.loc["lm_head", "bytes"] == 256 * 64 * 2
    assert ch.kv_bytes_per_token(run) == 2 * 2 * 2 * 16 * 2
    kv = ch.kv_cache_traffic(run).set_index("context")
    assert kv.loc[32, "cache GB"] == pytest.approx(32 * 256 / 1e9)
    # Packed and shown in the gallery as the model folder it measured, not the preset's default beside it.
    from labsupport.ops import pack

    assert run.parameters["preset"] == "qwen3-8b" and pack.form(run)["preset"] == "model folder llama"
    # The page replays the run.
    from labsupport.chapters import shared

    p = ch.page(run, shared.values(given={ch.CHAPTER: run}), shared.limits())
    assert p.fresh_n == 0 and p.kernels_per_layer > 0


def test_launch_overhead_runs_the_folder(folders, runs_copy):
    from labsupport.chapters import launch_overhead as ch

    folder = folders["qwen3"]
    ns = record(ch.CHAPTER, folder)
    run = ns["run"]
    check_source(run, folder, "qwen3")
    v = run.table("variants").set_index("variant")
    assert v.loc["eager", "status"] == "ok" and v.loc["eager", "kernels"] > 0
    assert run.results["model"]["decode_bytes"] == run.results["model_source"]["decode_bytes"]
    from labsupport.chapters import shared

    assert ch.page(run, shared.values(given={ch.CHAPTER: run}), shared.limits()).prompt_len == 16  # it replays


def test_prefill_vs_decode_takes_the_shapes_of_the_folder(folders, runs_copy):
    from labsupport.chapters import prefill_vs_decode as ch

    folder = folders["mistral"]
    run = record(ch.CHAPTER, folder)["run"]
    check_source(run, folder, "mistral")
    shape = run.results["shape"]
    assert (shape["layers"], shape["heads"], shape["kv_heads"], shape["head_dim"]) == (2, 4, 2, 16)
    assert shape["weight_bytes"] == run.results["model_source"]["decode_bytes"]
    assert run.results["gemm_shapes"]["mlp.gate_proj"] == [64, 128]
    assert set(run.table("census").phase) == {"prefill", "decode"}
    assert ch.page(run) is not None  # the page replays it


def test_why_a_gpu_counts_the_folders_kv_cache_and_attention(folders, runs_copy):
    from labsupport.chapters import why_a_gpu as ch

    folder = folders["qwen3"]
    run = record(ch.CHAPTER, folder)["run"]
    check_source(run, folder, "qwen3")
    assert run.results["kv_bytes_per_token"] == 2 * 2 * 2 * 16 * 2  # K and V, 2 layers, 2 heads of 16, BF16
    assert ch.attention_flop_per_context_token(run) == 4 * 4 * 16 * 2  # 4 query heads of 16, 2 layers
    assert ch.counts(run).decode_bytes == run.results["model_source"]["decode_bytes"]
    assert list(run.table("batch_sweep").batch) == [1, 2]
    from labsupport.chapters import shared

    assert ch.page(run, shared.values(), None) is not None  # the page replays it


def test_model_code_to_kernels_takes_the_folders_sizes(folders, runs_copy, monkeypatch):
    """The MLP and RMSNorm at the checkpoint's sizes. The chapter's own RMSNorm is a Triton kernel,
    which needs a GPU: on the CPU, PyTorch's rms_norm stands in for it."""
    import torch.nn.functional as F

    from labsupport.chapters import model_code_to_kernels as ch
    from labsupport.measure.kernels import triton_kernels

    monkeypatch.setattr(triton_kernels, "rmsnorm", lambda x, w, eps: F.rms_norm(x, (x.shape[-1],), w, eps))
    folder = folders["mistral"]
    run = record(ch.CHAPTER, folder)["run"]
    check_source(run, folder, "mistral", shapes_only=True)
    assert run.results["mlp"]["bytes"] == ch.mlp_bytes(64, 128, 1)
    assert set(run.table("rmsnorm_times").variant) == {ch.AS_WRITTEN, ch.F_RMS_NORM, ch.OURS}
    assert ch.page(run) is not None  # the page replays it


def test_where_kernels_come_from_takes_the_folders_sizes(folders, runs_copy):
    from labsupport.chapters import where_kernels_come_from as ch

    folder = folders["llama"]
    run = record(ch.CHAPTER, folder)["run"]
    check_source(run, folder, "llama", shapes_only=True)
    a = run.table("attention_backends")
    assert list(a.context.unique()) == [16] and (a.status == "ok").any()
    assert set(run.table("fusion_times").variant) == {ch.EAGER, ch.COMPILED}
    assert (run.path / ch.FUSED_SOURCE).read_text()  # the code torch.compile generated for this width
    assert ch.page(run) is not None  # the page replays it


# --- refused in one line, before anything is measured, no run written ----------------------------


@pytest.fixture
def nothing_measured(monkeypatch):
    """Any timing or profile fails the test: a refusal comes first."""

    def measured(*a, **k):
        raise AssertionError("measured before the refusal")

    for name in ("interleaved", "time_region", "profile_region"):
        monkeypatch.setattr(harness, name, measured)


REFUSED = {
    "model-code-to-kernels": "model-code-to-kernels needs the MLP's intermediate size (its gate and up projections), "
    "and this gpt2 configuration has no intermediate_size",
    "where-kernels-come-from": "where-kernels-come-from needs an RMSNorm (its epsilon), and this gpt2 configuration "
    "has no rms_norm_eps",
    "why-a-gpu": "why-a-gpu needs the MLP's intermediate size (the weight matrices' shapes), and this gpt2 "
    "configuration has no intermediate_size",
    "prefill-vs-decode": "prefill-vs-decode compares one decoder layer's matrix multiplies, and GPT2LMHeadModel keeps "
    "no decoder layers at .transformer.layers",
}


@pytest.mark.unit
@pytest.mark.parametrize("slug", list(REFUSED))
def test_a_model_without_what_the_chapter_measures_is_refused_in_one_line(slug, folders, runs_copy, nothing_measured):
    before = sorted(runs_copy.rglob("meta.json"))
    with pytest.raises(source.SourceError) as e:
        record(slug, folders["gpt2"])
    said = str(e.value)
    assert "\n" not in said and said.endswith(REFUSED[slug]), said
    assert sorted(runs_copy.rglob("meta.json")) == before and not list(runs_copy.rglob(".incomplete-*"))


@pytest.mark.unit
@pytest.mark.parametrize("slug", list(ARCHITECTURE))
def test_a_folder_that_is_not_a_model_is_refused_in_one_line(slug, tmp_path, runs_copy, nothing_measured):
    (tmp_path / "weights").mkdir()
    before = sorted(runs_copy.rglob("meta.json"))
    with pytest.raises(source.SourceError) as e:
        record(slug, tmp_path / "weights")
    assert str(e.value) == f"{tmp_path / 'weights'} is not a model folder: it has no config.json"
    assert sorted(runs_copy.rglob("meta.json")) == before


@pytest.mark.unit
def test_a_model_too_large_for_this_machine_is_refused_before_it_is_built(tmp_path, runs_copy, nothing_measured):
    """Counted on the meta device from its configuration (2^40 embedding parameters: terabytes)."""
    from transformers import AutoConfig

    from .checkpoints import TINY

    folder = tmp_path / "huge"
    AutoConfig.for_model("llama", **{**TINY, "vocab_size": 1 << 32, "hidden_size": 256}).save_pretrained(folder)
    with pytest.raises(source.SourceError) as e:
        record("launch-overhead", folder)
    said = str(e.value)
    assert said.startswith(f"{folder}: its weights take ") and "but this machine has" in said and "\n" not in said


@pytest.mark.unit
def test_the_read_kernels_shapes_are_the_folders(folders):
    """Why a GPU times its read kernels (on a GPU) at the weight shapes of the model folder's configuration."""
    from labsupport.chapters import why_a_gpu as ch

    params = ch.Params(model=str(folders["llama"]), device="cpu")
    config, recorded = source.chapter_config(params, ch.CHAPTER, ch.MODEL_NEEDS)
    assert recorded["model_source"]["weights"] == "shapes only"
    assert ch.step_matrices(config) == {  # matrices of one shape share a row
        "q_proj, o_proj": (64, 64),
        "k_proj / v_proj": (32, 64),
        "gate_proj / up_proj, qkv (fused)": (128, 64),
        "down_proj": (64, 128),
        "gate_up (fused), lm_head": (256, 64),
    }
    assert ch.step_matrices(source.chapter_config(ch.Params(), ch.CHAPTER, ch.MODEL_NEEDS)[0]) == ch.step_matrices(
        "qwen3-8b"
    )  # no model folder: the preset's, as before


@pytest.mark.unit
def test_the_documented_command_line_is_the_clis(folders, monkeypatch):
    """*Run a chapter yourself* shows `live CHAPTER --param model=DIR`: with a real folder for DIR, the
    command hands `live` that chapter with `model` given, and the parameter checks take it."""
    import shlex

    from labsupport.__main__ import main
    from labsupport.ops import live, params

    page = (Path(__file__).resolve().parent.parent / "book" / "run_it_yourself.md").read_text()
    (line,) = [ln for ln in page.splitlines() if "--param model=" in ln]
    argv = shlex.split(line.replace("path/to/my-model", str(folders["llama"])))
    assert argv[:3] == ["python", "-m", "labsupport"]
    handed = []
    monkeypatch.setattr(live, "main", lambda names, given, **kw: handed.append((names, given, kw)) or 0)
    assert main(argv[3:]) == 0
    ((names, given, kw),) = handed
    assert names == ["prefill-vs-decode"] and kw["publish"] is False
    selected = [chapters.by_slug(slug) for slug in names]
    assert params.resolve(selected, given) == {"prefill-vs-decode": {"model": str(folders["llama"])}}


# --- the live command, through papermill ------------------------------------------------------------


def live_command(root: Path, *args: str):
    import os
    import subprocess
    import sys

    repo = Path(__file__).resolve().parent.parent
    env = {**os.environ, "LABSUPPORT_RUNS": str(root), "PYTHONPATH": str(repo), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "labsupport", "live", *args]
    return subprocess.run(cmd, cwd=repo, env=env, capture_output=True, text=True, timeout=600)


def test_the_live_command_runs_a_chapter_on_a_model_folder(folders, runs_copy):
    """`python -m labsupport live CHAPTER --param model=DIR`, as *Run a chapter yourself* shows it (on
    the CPU, with the chapter's CPU values): the notebook runs through papermill and records the run."""
    from labsupport.chapters import launch_overhead as ch

    from .conftest import cpu_args

    before = set(runs.list_runs(ch.CHAPTER, runs_copy))
    done = live_command(runs_copy, *cpu_args(ch.CHAPTER), "--param", f"model={folders['mistral']}", "--no-publish")
    assert done.returncode == 0, done.stderr[-2000:]
    (run_id,) = set(runs.list_runs(ch.CHAPTER, runs_copy)) - before
    check_source(ch.load(run_id, runs_copy), folders["mistral"], "mistral")


def test_the_live_command_refuses_a_model_the_chapter_cannot_measure_in_one_line(folders, runs_copy):
    from labsupport.chapters import why_a_gpu as ch

    from .conftest import cpu_args, tree_bytes

    before = tree_bytes(runs_copy)
    done = live_command(runs_copy, *cpu_args(ch.CHAPTER), "--param", f"model={folders['gpt2']}")
    assert done.returncode == 1
    (said,) = [ln for ln in done.stderr.splitlines() if ln.startswith("error:")]
    assert REFUSED[ch.CHAPTER] in said, said
    assert tree_bytes(runs_copy) == before
    done = live_command(runs_copy, *cpu_args(ch.CHAPTER), "--param", f"model={runs_copy / 'nowhere'}")
    assert done.returncode == 1 and "Traceback" not in done.stderr
    (said,) = [ln for ln in done.stderr.splitlines() if ln.strip()]
    assert "--param model=" in said and f"{runs_copy / 'nowhere'} is not a folder" in said, said
