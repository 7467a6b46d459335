"""`python -m labsupport profile MODEL_DIR`: tiny checkpoints of several architectures, saved here by
save_pretrained (real safetensors, loaded back) and one folder with a configuration only (random
weights), each profiled on the CPU by the command in a process of its own (a process that has
profiled may not time again); the run it writes is the chapter's, packed and added to a scratch
gallery. Every bad input is refused in one line, with nothing written."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from labsupport import runs
from labsupport.chapters import kernels_in_one_token as ch
from labsupport.traces import kernels

from .checkpoints import CHECKPOINTS, TINY, save_checkpoint, tiny_model

pytestmark = pytest.mark.live

REPO = Path(__file__).resolve().parent.parent
# the dtype each checkpoint is profiled in
DTYPE = {"llama": "bfloat16", "qwen3": "bfloat16", "mistral": "float16", "gpt2": "float32"}


def profile_command(folder: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    # One thread: on a loaded host, threads waiting for each other stretch a tiny model's operators.
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    env.pop("LABSUPPORT_RUNS", None)
    return subprocess.run(
        [sys.executable, "-m", "labsupport", "profile", str(folder), *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.fixture(scope="module")
def profiled(tmp_path_factory):
    """{model type: (its folder, the command's result, its run)}: each checkpoint profiled once on
    the CPU into a runs folder of its own."""
    out = {}
    for model_type, (_, weights) in CHECKPOINTS.items():
        base = tmp_path_factory.mktemp(model_type)
        folder = save_checkpoint(base / model_type, model_type, weights)
        root = base / "runs"
        done = profile_command(folder, "--allow-cpu", "--out", str(root), "--dtype", DTYPE[model_type], cwd=base)
        assert done.returncode == 0, done.stderr[-3000:]
        (run_id,) = runs.list_runs(ch.CHAPTER, root)
        out[model_type] = (folder, done, runs.load_run(ch.DECLARATION, run_id, root))
    return out


@pytest.mark.parametrize("model_type", list(CHECKPOINTS))
def test_every_kernel_is_counted_by_kind_and_by_source(profiled, model_type):
    _, done, run = profiled[model_type]
    k = run.table("kernels")
    census = run.table("census").set_index("kind")
    assert len(k) > 10
    assert census.loc["total", "kernels"] == len(k) == census.drop("total").kernels.sum()
    assert census.loc["matrix multiply", "kernels"] >= 2 * 4  # at least the projections of two layers
    assert kernels.source_census(k).kernels.sum() == len(k)
    # The report prints the run's own counts, by kind and by source.
    printed = done.stdout
    assert re.search(rf"per token: {len(k):,}\b", printed), printed
    for kind, n in census.drop("total").kernels.items():
        if n:
            assert re.search(rf"^\s+{re.escape(kind)}\s+{int(n):,}\s", printed, re.M), (kind, printed)
    for r in kernels.source_census(k).itertuples():
        assert re.search(rf"^\s+{re.escape(r.source)}\s+{r.kernels:,}\s", printed, re.M), (r.source, printed)
    assert "CUDA graph and torch.compile: GPU only, not measured on a CPU" in printed
    assert "floor and practical ceiling: none on a CPU" in printed
    assert re.search(r"^operators busy: [\d.]+ ms of a [\d.]+ ms step", printed, re.M), printed


@pytest.mark.parametrize("model_type", list(CHECKPOINTS))
def test_the_run_records_where_its_model_came_from(profiled, model_type):
    from labsupport.measure import models

    folder, _, run = profiled[model_type]
    src = run.results["model_source"]
    weights = CHECKPOINTS[model_type][1]
    expected = tiny_model(model_type)  # the same architecture and shapes, counted here
    counted = models.count_model(expected)
    assert src["weights"] == ("loaded" if weights else "random")
    assert src["weight_files"] == (["model.safetensors"] if weights else [])
    assert src["config_sha256"] == hashlib.sha256((folder / "config.json").read_bytes()).hexdigest()
    assert src["architecture"] == type(expected).__name__
    assert src["parameters"] == counted.parameters == run.results["model"]["parameters"]
    per = {"bfloat16": 2, "float16": 2, "float32": 4}[DTYPE[model_type]]
    assert src["bytes_per_parameter"] == per
    assert src["decode_bytes"] == counted.non_embedding_parameters * per == run.results["model"]["decode_bytes"]
    assert run.parameters["model"] == folder.name and run.parameters["preset"] == ""
    assert run.parameters["dtype"] == DTYPE[model_type]
    prov = run.provenance
    assert re.fullmatch(r"[0-9a-f]{40}(-dirty)?", prov["git_commit"]) and prov["device"] == "cpu"
    assert re.fullmatch(r"[0-9a-f]{64}", prov["tree_digest"])


@pytest.mark.parametrize("model_type", list(CHECKPOINTS))
def test_the_matrices_by_shape_are_the_models(profiled, model_type):
    """The chapter's matrices by shape (what validation checks against the practical ceiling) read
    the shapes the run recorded of its model, in its dtype; GPT-2's fused matrices have other names
    (and are no nn.Linear), so its LM head alone is there."""
    _, _, run = profiled[model_type]
    g = ch.gemv_by_shape(run).set_index("projection")
    model = tiny_model(model_type)
    linear = {n.rsplit(".", 1)[-1]: m for n, m in model.named_modules() if type(m).__name__ == "Linear"}
    assert set(g.index) == set(ch.PROJECTIONS) & set(linear)
    assert len(g) == (1 if model_type == "gpt2" else len(ch.PROJECTIONS))  # GPT-2: its LM head alone
    per = {"bfloat16": 2, "float16": 2, "float32": 4}[DTYPE[model_type]]
    for name, r in g.iterrows():
        assert r["shape"] == f"{linear[name].out_features:,} x {linear[name].in_features:,}"
        assert r["bytes"] == linear[name].weight.numel() * per


@pytest.mark.unit
def test_the_report_of_a_gpu_run(tmp_path):
    """The report's GPU lines (GPU busy, the datasheet floor, the practical ceiling, the CUDA graph and
    torch.compile) on real H200 data: the fixture run of the chapter (its kernels, step times and
    ceilings) with the model source of the same Qwen3-8B configuration and the step forms of the
    fixture run of Launch overhead, where `profile` records them on a GPU."""
    from labsupport.measure import hardware, harness, models
    from labsupport.measure.models import source
    from labsupport.ops import profile

    from .conftest import fixture_run

    census_run, forms_run = fixture_run(ch.CHAPTER), fixture_run("launch-overhead")
    root = tmp_path / "runs"
    shutil.copytree(census_run.path, root / ch.CHAPTER / census_run.run_id)
    models.hf_config("qwen3-8b").save_pretrained(tmp_path / "qwen3-8b")
    src = source.open_folder(tmp_path / "qwen3-8b")
    model = source.build(src, "meta", "bfloat16")
    t = forms_run.table("step_times")
    forms = {v: harness.table_estimate(t[t.variant == v]) for v in ("eager", *profile.FORMS)}
    meta_path = root / ch.CHAPTER / census_run.run_id / "meta.json"
    meta = json.loads(meta_path.read_text())
    meta["parameters"].update(preset="", model="qwen3-8b")
    meta["results"]["model_source"] = src.record(model, models.count_model(model))
    meta["results"]["step_forms"] = {v: {"status": "ok", "wall_ms": e.value} for v, e in forms.items()}
    meta_path.write_text(json.dumps(meta))
    run = runs.load_run(ch.DECLARATION, census_run.run_id, root)
    lines = profile.report(run)
    text = "\n".join(lines)
    assert "model: Qwen3ForCausalLM from qwen3-8b/ (random weights; config.json sha256" in text
    assert "device: NVIDIA H200" in lines and "operators" not in text
    assert f"kernels per token: {len(run.table('kernels')):,}," in text
    assert re.search(r"^GPU busy: [\d.]+ ms of a [\d.]+ ms step \(\d+%", text, re.M), text
    bandwidth = hardware.datasheet("NVIDIA H200").bandwidth_tbs
    floor = run.results["model"]["decode_bytes"] / 1e9 / bandwidth
    assert f"floor: {floor:.2f} ms, the step's bytes at the datasheet's {bandwidth:.2f} TB/s" in text
    ceiling = hardware.run_limits(run).ceiling_tbs
    assert ceiling and f"practical ceiling: {ceiling:.2f} TB/s measured in this run" in text
    for form in profile.FORMS:
        times = forms["eager"].value / forms[form].value
        assert re.search(rf"^{form}: [\d.]+ ms against the eager [\d.]+ ms .*: {times:.2f} times as fast", text, re.M)
    assert "GPU only" not in text and "none on a CPU" not in text


@pytest.mark.unit
def test_a_step_form_that_cannot_run_is_recorded_and_the_rest_timed(tmp_path, monkeypatch):
    """step_forms, which only a GPU runs in `profile`: on a CPU no CUDA graph can be captured, so it
    records why and times the eager step all the same (the compiled form is left out here: inductor's
    CPU compile is slow, and not what a GPU compiles)."""
    from labsupport.measure import decode, harness
    from labsupport.measure.models import source
    from labsupport.ops import profile

    monkeypatch.setattr(profile, "FORMS", ("cuda-graph",))
    monkeypatch.setattr(harness, "_profiles_in_process", 0)  # no CUPTI on a CPU: time as a fresh process would
    model = source.build(source.open_folder(save_checkpoint(tmp_path / "llama", "llama", False)), "cpu", "float32")
    params = profile.ProfileParams(model="llama", device="cpu", repeats=3, prompt_len=16)
    forms = profile.step_forms(model, decode.Prompt.random(256, 1, 16, "cpu"), params, progress=lambda line: None)
    assert forms["cuda-graph"]["status"].startswith("failed: ") and "wall_ms" not in forms["cuda-graph"]
    assert forms["eager"]["status"] == "ok" and forms["eager"]["of"] == 3 and forms["eager"]["wall_ms"] > 0


@pytest.mark.unit
def test_loaded_weights_are_the_folders(tmp_path):
    """A folder with weights runs those weights, byte for byte, not random ones."""
    import torch

    from labsupport.measure.models import source

    folder = save_checkpoint(tmp_path / "llama", "llama")
    saved = tiny_model("llama").state_dict()
    built = source.build(source.open_folder(folder), "cpu", "float32").state_dict()
    assert set(built) == set(saved)
    assert all(torch.equal(built[name], saved[name]) for name in saved)


BUSIER_THAN_THE_STEP = "its kernels ran longer than the step they ran in"


def agreeing_run(profiled, tmp_path) -> runs.Run:
    """A profiled run whose numbers agree with each other. On a loaded host the profiled step can be
    preempted until its operators outlast the fastest timed step, and the gallery refuses such a
    run (gallery_row.problems); then the checkpoint is profiled again, at most three times."""
    from labsupport.ops import gallery_row

    def problems(run):
        return gallery_row.problems(gallery_row.row(run, "test", ""))

    candidates = [run for _, _, run in profiled.values()]
    for attempt in range(3):
        for run in candidates:
            found = problems(run)
            if not found:
                return run
            assert all(BUSIER_THAN_THE_STEP in p for p in found), found  # the loaded host's, nothing else
        folder = profiled["qwen3"][0]
        root = tmp_path / f"again-{attempt}"
        assert profile_command(folder, "--allow-cpu", "--out", str(root), cwd=tmp_path).returncode == 0
        candidates = [runs.load_run(ch.DECLARATION, runs.list_runs(ch.CHAPTER, root)[0], root)]
    pytest.fail("no profiled run's numbers agreed in three more tries")


def test_the_run_packs_and_the_gallery_takes_it(profiled, tmp_path):
    from labsupport.ops import gallery, pack

    run = agreeing_run(profiled, tmp_path)
    folder = run.parameters["model"]
    archive, summary = pack.pack(ch.CHAPTER, run.run_id, root=run.path.parent.parent, out_dir=tmp_path / "packs")
    assert f"model folder {folder}" in summary
    said = gallery.add(archive, root=tmp_path / "scratch-runs")
    assert said.startswith(f"added {ch.CHAPTER} run {run.run_id}")
    (entry,) = gallery.entries(tmp_path / "scratch-runs")
    assert entry.run.results["model_source"] == run.results["model_source"]
    assert pack.form(entry.run)["preset"] == f"model folder {folder}"


# --- bad input: one line, exit status 1, nothing written -----------------------------------------


def refused(folder: Path, tmp_path: Path, capsys, *args: str) -> str:
    """Run the command in this process on `folder`; assert it refused in one line and wrote nothing."""
    from labsupport.__main__ import main

    out = tmp_path / "out"
    capsys.readouterr()  # what making the folder printed
    rc = main(["profile", str(folder), "--out", str(out), *args])
    said = capsys.readouterr()
    lines = said.err.strip().splitlines()
    assert rc == 1 and len(lines) == 1, said.err
    assert lines[0].startswith("profile refused: ") and lines[0].endswith("; nothing was written")
    assert not out.exists()
    return lines[0]


@pytest.mark.unit
def test_a_folder_without_a_config_is_not_a_model(tmp_path, capsys):
    (tmp_path / "weights").mkdir()
    assert "is not a model folder: it has no config.json" in refused(tmp_path / "weights", tmp_path, capsys)
    assert "is not a folder" in refused(tmp_path / "nowhere", tmp_path, capsys)


@pytest.mark.unit
def test_a_configuration_transformers_cannot_read_or_build_is_refused(tmp_path, capsys):
    unknown = tmp_path / "unknown"
    unknown.mkdir()
    (unknown / "config.json").write_text(json.dumps({"model_type": "no-such-architecture"}))
    assert "transformers cannot read this configuration" in refused(unknown, tmp_path, capsys, "--allow-cpu")
    (unknown / "config.json").write_text("{not json")
    assert "transformers cannot read this configuration" in refused(unknown, tmp_path, capsys, "--allow-cpu")
    encoder = tmp_path / "encoder"  # a configuration, but of no causal language model
    from transformers import AutoConfig

    AutoConfig.for_model("vit", hidden_size=64, num_hidden_layers=1, num_attention_heads=4).save_pretrained(encoder)
    said = refused(encoder, tmp_path, capsys, "--allow-cpu")
    assert "transformers cannot build a causal language model from it" in said


@pytest.mark.unit
def test_weights_that_do_not_match_the_configuration_are_refused(tmp_path, capsys):
    folder = save_checkpoint(tmp_path / "llama", "llama")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "intermediate_size": 96}))
    said = refused(folder, tmp_path, capsys, "--allow-cpu")
    assert re.search(r"do not match its configuration: model\.layers\.0\.mlp\.\w+\.weight.* of another shape", said), (
        said
    )
    (folder / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 3}))
    said = refused(folder, tmp_path, capsys, "--allow-cpu")
    assert re.search(r"do not match its configuration: model\.layers\.2\.\S+ and \d+ more missing in", said), said
    other = save_checkpoint(tmp_path / "mistral", "mistral")  # another architecture's weights, same shapes
    shutil.copy(other / "model.safetensors", folder / "model.safetensors")
    (folder / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 1}))
    said = refused(folder, tmp_path, capsys, "--allow-cpu")
    assert re.search(r"do not match its configuration: model\.layers\.1\.\S+ and \d+ more unexpected in", said), said
    (folder / "model.safetensors").rename(folder / "weights.safetensors")  # a name transformers does not load
    said = refused(folder, tmp_path, capsys, "--allow-cpu")
    assert "holds weights.safetensors but neither model.safetensors nor model.safetensors.index.json" in said


@pytest.mark.unit
def test_a_model_too_large_for_the_memory_is_refused_before_it_is_built(tmp_path, capsys):
    folder = tmp_path / "huge"
    from transformers import AutoConfig

    # 2^40 embedding parameters: terabytes, more than any machine has free; counted on the meta device
    AutoConfig.for_model("llama", **{**TINY, "vocab_size": 1 << 32, "hidden_size": 256}).save_pretrained(folder)
    said = refused(folder, tmp_path, capsys, "--allow-cpu")
    assert re.search(r"its weights take [\d.]+ GiB and a step needs about \d+ GiB more, but this machine has", said)


@pytest.mark.unit
def test_a_model_the_step_cannot_run_is_refused_naming_it(tmp_path, capsys):
    """BLOOM's attention (transformers 5.17) cannot take the chapter's static cache: refused in one
    line that names the architecture, before anything is profiled."""
    from transformers import AutoConfig

    folder = tmp_path / "bloom"
    AutoConfig.for_model("bloom", vocab_size=256, hidden_size=64, n_layer=2, n_head=4).save_pretrained(folder)
    said = refused(folder, tmp_path, capsys, "--allow-cpu")
    assert re.search(r"bloom: BloomForCausalLM cannot run the census's decode step \(\w+Error: ", said), said


@pytest.mark.unit
def test_a_commit_that_cannot_be_the_checkouts_is_refused(tmp_path, capsys, monkeypatch):
    """The provenance rules of every run: LABSUPPORT_GIT_COMMIT is 40 hex digits, and where .git is
    here, this checkout's HEAD (runs.provenance.git_commit)."""
    folder = save_checkpoint(tmp_path / "llama", "llama", weights=False)
    monkeypatch.setenv("LABSUPPORT_GIT_COMMIT", "12c4b32")
    said = refused(folder, tmp_path, capsys, "--allow-cpu")
    assert said.startswith("profile refused: LABSUPPORT_GIT_COMMIT='12c4b32' is not a full commit hash"), said
    monkeypatch.setenv("LABSUPPORT_GIT_COMMIT", "0" * 40)
    said = refused(folder, tmp_path, capsys, "--allow-cpu")
    assert said.startswith(f"profile refused: LABSUPPORT_GIT_COMMIT={'0' * 40} differs from this checkout's HEAD"), said


@pytest.mark.unit
def test_no_gpu_without_allow_cpu_is_refused(tmp_path, capsys, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    folder = save_checkpoint(tmp_path / "llama", "llama", weights=False)
    assert "no CUDA GPU is visible; --allow-cpu profiles on the CPU" in refused(folder, tmp_path, capsys)


@pytest.mark.unit
def test_a_kernel_no_rule_knows_is_counted_under_other_by_its_name():
    k = pd.DataFrame(
        {
            "name": [
                "void my_fused_thing<float>(float*)",
                "ampere_bf16_gemv_kernel",
                "void my_fused_thing<float>(float*)",
            ],
            "dur_ns": [100, 200, 300],
        }
    )
    k["kind"] = k["name"].map(kernels.classify)
    census = kernels.census(k).set_index("kind")
    assert census.loc["other", "kernels"] == 2 and census.loc["total", "kernels"] == 3
    by_source = kernels.source_census(k).set_index("source")
    assert by_source.loc["other", "kernels"] == 2 and by_source.kernels.sum() == 3
    assert kernels.unrecognised(k).to_dict() == {"my_fused_thing": 2}
    # A kind the rules of today do not name (a table classified by older rules) is kept, not dropped.
    older = kernels.census(k.assign(kind=["copy", "matrix multiply", "copy"])).set_index("kind")
    assert older.loc["copy", "kernels"] == 2 and older.loc["total", "kernels"] == 3


@pytest.mark.unit
def test_the_committed_llama_folder_is_llama_3_1_8b_counted_without_building_it():
    """benchmarks/models/llama-3.1-8b: the published configuration's 8.03 billion parameters (Meta's model
    card gives 8.03B), counted on the meta device, nothing allocated."""
    from labsupport.measure.models import source

    src = source.open_folder(REPO / "benchmarks" / "models" / "llama-3.1-8b")
    counts = source.counts(src, "bfloat16")
    assert not src.weight_files and src.model_type == "llama"
    assert counts.parameters == 8_030_261_248 and counts.layers == 32
    assert counts.embedding_parameters == 128_256 * 4096


# The Llama 3.1 8B configuration (random weights) profiled on an H100 and added to the gallery.
GALLERY_LLAMA = REPO / "runs" / "gallery" / "nvidia-h100-80gb-hbm3"
LLAMA_RUN = "20261205T175428Z-h100-80gb-hbm3"
LLAMA_NEWEST = "20261205T191315Z-h100-80gb-hbm3"  # the same folder profiled again, on another H100 box


def test_the_report_of_a_real_gpu_profile_sets_the_forms_against_both_eager_timings():
    """On the H100, the eager step timed beside the CUDA graph and the compiled step took 31% more
    than the step of the wall-time line, timed before they were built: the report shows both, and
    sets each form against the second too, rather than leave two eager steps unexplained."""
    from labsupport.ops import profile

    run = runs.load_run(ch.DECLARATION, LLAMA_RUN, root=GALLERY_LLAMA)
    lines = profile.report(run)
    assert lines[0].startswith("model: LlamaForCausalLM from llama-3.1-8b/ (random weights;")
    assert "1,462, 45 in each of 32 layers" in lines[3]
    (busy,) = [line for line in lines if line.startswith("GPU busy:")]
    assert busy.startswith("GPU busy: 7.87 ms of a 17.87 ms step")
    (both,) = [line for line in lines if "the eager step beside them" in line]
    assert both == (
        "  the eager step beside them took +31% against the 17.87 ms step above, timed before they were built; "
        "against that step: cuda-graph 1.98 times as fast, compile-reduce-overhead 2.16 times as fast"
    )
    forms = run.results["step_forms"]
    forms["eager"]["wall_ms"] = 18.5  # within 10% of the step above: one eager step, nothing to set beside it
    assert not [line for line in profile.report(run) if "the eager step beside them" in line]


def test_the_book_shows_the_newest_profile_run_of_the_gallery():
    """*Run a chapter yourself* prints the report of the gallery's newest `profile` run: a census of
    a model folder with its step forms, never a chapter's own run nor one without the forms."""
    from labsupport.ops import gallery, profile

    found = [e.run for e in gallery.entries(REPO / "runs")]
    assert profile.example(found).run_id == LLAMA_NEWEST
    assert profile.example([r for r in found if r.run_id != LLAMA_NEWEST]).run_id == LLAMA_RUN
    llama = (LLAMA_RUN, LLAMA_NEWEST)
    assert profile.example([r for r in found if r.run_id not in llama]) is None, "the H200 gallery runs are presets'"
    assert profile.example([]) is None
