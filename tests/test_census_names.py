"""The drift report's census compares kernel names within each decoder layer, not only counts."""

import pandas as pd
import pytest

from labsupport import chapters
from labsupport.ops import drift

from .conftest import fixture_run

pytestmark = pytest.mark.unit

CHAPTER = "kernels-in-one-token"


def _step():
    run = fixture_run(CHAPTER)
    return run, drift._kernel_tables(run)["kernels.csv"]


def test_the_same_census_has_no_layer_change():
    _, k = _step()
    assert drift.layer_name_changes("kernels.csv", k, k.sample(frac=1, random_state=0)) == []


def test_kernels_traded_between_layers_are_a_structural_change(monkeypatch):
    """Two layers trade a kernel each: every count, every kind, every source and the set of names
    stay the same, and only the comparison by layer sees it, in the drift report's own compare()."""
    run, k = _step()
    new = k.copy()
    attn2 = new.index[new.module.str.startswith("layers.2.self_attn") & new.name.str.contains("gemm|gemv|nvjet")][0]
    norm5 = new.index[new.module.str.startswith("layers.5.input_layernorm")][0]
    new.loc[[attn2, norm5], "name"] = new.loc[[norm5, attn2], "name"].values
    tables = {id(run): {"kernels.csv": k}}
    other = fixture_run(CHAPTER)
    tables[id(other)] = {"kernels.csv": new}
    monkeypatch.setattr(drift, "_kernel_tables", lambda r: tables[id(r)])
    d = drift.compare(chapters.by_slug(CHAPTER), other, run)
    assert sorted(s["what"].split(":")[0] for s in d.structural) == ["layer 2", "layer 2", "layer 5", "layer 5"]
    assert {s["table"] for s in d.structural} == {"kernels.csv"}


def test_a_change_in_every_layer_is_one_line_naming_the_layers():
    _, k = _step()
    extra = k[k.module.str.fullmatch(r"layers\.\d+\.self_attn")].drop_duplicates("module")

    changes = drift.layer_name_changes("kernels.csv", k, pd.concat([k, extra]))
    names = extra.name.map(drift.kernels.short_name).unique()
    assert len(changes) == len(names) and all(c["what"].startswith("layers 0-35: ") for c in changes), changes
    assert all(c["new"] == c["old"] + 1 for c in changes)


def test_a_run_on_another_gpu_is_compared_and_said_to_be_uncounted(tmp_path):
    """The fixture run against a copy of itself recorded (by its provenance) on an H100: no kernel
    changed, the report names both GPUs, and the night's line leaves the chapter out of its counts."""
    import json
    import shutil

    from labsupport import runs

    run = fixture_run(CHAPTER)
    copy = tmp_path / CHAPTER / run.run_id
    shutil.copytree(run.path, copy)
    meta = json.loads((copy / "meta.json").read_text())
    meta["provenance"]["gpu"] = "NVIDIA H100 80GB HBM3"
    (copy / "meta.json").write_text(json.dumps(meta))
    other = runs.load_run(chapters.by_slug(CHAPTER), run.run_id, root=tmp_path)
    d = drift.compare(chapters.by_slug(CHAPTER), other, run)
    assert d.gpus == {"published": run.provenance["gpu"], "new": "NVIDIA H100 80GB HBM3"} and not d.structural
    md = drift.to_markdown([d], 0.25, "t")
    assert "**Another GPU**" in md and "NVIDIA H100 80GB HBM3" in md
    same = drift.compare(chapters.by_slug(CHAPTER), run, run)
    assert not same.other_gpu and "Another GPU" not in drift.to_markdown([same], 0.25, "t")
    d.structural.append({"table": "kernels.csv", "what": "kernels", "old": 1, "new": 2})
    line = drift.summary_line([d, same], 0.25)
    assert line.startswith("drift: 0 structural changes, 0 headline numbers moved beyond 25%")
    assert line.endswith(f"not counted: {CHAPTER}")
    assert drift.from_json(drift.to_json([d], 0.25))[0][0].gpus == d.gpus
