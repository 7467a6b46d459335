"""`pack`: a recorded run, checked as for publication, as one archive holding its files byte for
byte with a manifest; a run that fails a check is one line and no archive."""

import json
import shutil
import subprocess
import sys
import tarfile

import pytest

from labsupport import chapters
from labsupport.ops import pack

from .conftest import FIXTURES, REPO

pytestmark = pytest.mark.unit

CHAPTER = "what-a-kernel"


@pytest.fixture
def fixture_runs(tmp_path):
    root = tmp_path / "runs"
    run_id = sorted(p.name for p in (FIXTURES / CHAPTER).iterdir())[-1]
    shutil.copytree(FIXTURES / CHAPTER / run_id, root / CHAPTER / run_id)
    (root / "published.json").write_text(json.dumps({CHAPTER: run_id}))
    return root, run_id


def test_pack_writes_one_archive_of_the_run(fixture_runs, tmp_path):
    root, run_id = fixture_runs
    out, summary = pack.pack(CHAPTER, root=root, out_dir=tmp_path / "packs", label="a test")
    assert out.name == f"{CHAPTER}-{run_id}-nvidia-h200.tar.gz" and "\n" not in summary
    assert summary.startswith(f"packed {CHAPTER} run {run_id} (NVIDIA H200, bfloat16,") and str(out) in summary
    run_dir = root / CHAPTER / run_id
    with tarfile.open(out) as tar:
        names = sorted(m.name for m in tar)
        assert all(m.isreg() for m in tar)
        manifest = json.load(tar.extractfile(f"{run_id}/pack.json"))
        for m in tar:
            if not m.name.endswith("pack.json"):
                assert tar.extractfile(m).read() == (run_dir / m.name.split("/", 1)[1]).read_bytes()
    meta = json.loads((run_dir / "meta.json").read_text())
    assert names == sorted(f"{run_id}/{n}" for n in [*meta["files"], "meta.json", "pack.json"])
    assert manifest["label"] == "a test" and manifest["chapter"] == CHAPTER and manifest["clocks"] == {}
    assert not list((tmp_path / "packs").glob(".*"))


def test_a_damaged_run_is_not_packed(fixture_runs, tmp_path):
    root, run_id = fixture_runs
    csv = next((root / CHAPTER / run_id).glob("*.csv"))
    csv.write_text(csv.read_text() + "tampered\n")
    with pytest.raises(Exception, match="does not match its checksum"):
        pack.pack(CHAPTER, root=root, out_dir=tmp_path / "packs")
    assert not (tmp_path / "packs").exists() or not list((tmp_path / "packs").iterdir())


def test_a_run_with_incomplete_provenance_is_refused_in_one_line(fixture_runs, tmp_path):
    root, run_id = fixture_runs
    meta_path = root / CHAPTER / run_id / "meta.json"
    meta = json.loads(meta_path.read_text())
    meta["provenance"]["driver"] = "unknown"
    meta_path.write_text(json.dumps(meta))
    env = {"LABSUPPORT_RUNS": str(root), "PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}
    r = subprocess.run(
        [sys.executable, "-m", "labsupport", "pack", CHAPTER], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "cannot be packed: provenance field 'driver' is empty or unknown" in r.stderr


def test_clock_fields_are_checked_where_recorded(fixture_runs):
    from labsupport import runs

    root, run_id = fixture_runs
    run = runs.load_run(chapters.by_slug(CHAPTER), run_id, root)
    run.meta["provenance"]["nvidia_smi_power_limit"] = " "
    assert "provenance field 'nvidia_smi_power_limit' is empty" in pack.check(run)


def test_gpu_slug():
    assert pack.gpu_slug("NVIDIA GeForce RTX 4090") == "nvidia-geforce-rtx-4090"
    assert pack.gpu_slug("../../<script>") == "script" and pack.gpu_slug("") == "unknown-gpu"
