"""The workflows keep least privilege: read-only by default, write tokens only in the jobs
that commit or deploy, no credentials kept by the job that runs notebooks, actions pinned by
commit, and a push that fails stops the deployment."""

import re

import pytest
import yaml

from .conftest import REPO

pytestmark = pytest.mark.unit

WORKFLOWS = sorted((REPO / ".github" / "workflows").glob("*.yml"))


def load(path):
    return yaml.safe_load(path.read_text())


def steps(job):
    return job.get("steps", [])


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_read_only_by_default_and_pinned_by_commit(path):
    wf = load(path)
    assert wf["permissions"] == {"contents": "read"}
    for name, job in wf["jobs"].items():
        for step in steps(job):
            if "uses" in step:
                assert re.fullmatch(r"[\w.-]+/[\w.-]+@[0-9a-f]{40}", step["uses"]), f"{name}: {step['uses']}"


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_jobs_that_run_project_code_hold_no_write_token_nor_credentials(path):
    for name, job in load(path)["jobs"].items():
        runs_code = any("make " in step.get("run", "") for step in steps(job))
        if not runs_code:
            continue
        assert all(v in ("read", "none") for v in job.get("permissions", {"contents": "read"}).values()), name
        checkout = [s for s in steps(job) if s.get("uses", "").startswith("actions/checkout@")]
        assert checkout and all(s.get("with", {}).get("persist-credentials") is False for s in checkout), name


def test_the_nightly_deploys_only_after_a_successful_push():
    jobs = load(REPO / ".github" / "workflows" / "nightly.yml")["jobs"]
    writers = {name for name, job in jobs.items() if "write" in job.get("permissions", {}).values()}
    assert writers == {"commit", "deploy"}
    assert jobs["commit"]["permissions"] == {"contents": "write"}
    assert jobs["deploy"]["permissions"] == {"pages": "write", "id-token": "write"}
    assert "commit" in jobs["deploy"]["needs"]
    script = "\n".join(s.get("run", "") for s in steps(jobs["commit"]))
    assert "set -euo pipefail" in script and "git push" in script
    assert "||" not in script, "a failed push must fail the job"
