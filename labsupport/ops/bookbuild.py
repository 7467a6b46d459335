"""Build the book (`make book`, and the nightly's staged build): check the runs first, run
jupyter-book with its output kept in a log, and when it fails say why in one line, last.

A run that is damaged is found before the build starts (labsupport.runs.check_published) and
reported as that one line. When the build fails anyway, the labsupport errors in its log
(a notebook's RunError, say) are found and the first is printed last, after jupyter-book's
own output, instead of being buried in it.

The Colab launch button on each notebook page needs the public GitHub repository the notebooks
are in, and no such address is committed: the build adds the button (Jupyter Book's
`repository` and `launch_buttons: colab_url`, in a copy of _config.yml passed with --config)
only when it is told the repository, by LABSUPPORT_REPOSITORY (owner/name or its github.com
address) or by the GitHub Actions variables of the workflow that builds it (GITHUB_REPOSITORY
on GITHUB_SERVER_URL https://github.com). Without one the book has no launch button, and *Run
a chapter yourself* says how to open a chapter in Colab by hand.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

from labsupport import runs
from labsupport.ops import history
from labsupport.runs.provenance import REPO_ROOT

ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
ERROR = re.compile(r"\b(RunError|ParamError|NoGPUError): (.+)$")
HTML_DIR = REPO_ROOT / "_build" / "html"
COLAB = "https://colab.research.google.com"
GITHUB = "https://github.com"
REPOSITORY = re.compile(r"(?:https://github\.com/)?([A-Za-z0-9][A-Za-z0-9-]*)/([A-Za-z0-9._-]+?)(?:\.git)?/?")


class BuildError(RuntimeError):
    """The book did not build (the message is the one-line reason)."""


def check_runs(root: Path) -> None:
    """The runs the book replays are whole (every file, every trace, the declared columns of
    every table, every number in its range, no declared table empty) and the history reads:
    else one BuildError line naming the file (and the column and row of a bad value)."""
    from labsupport import chapters

    try:
        for run in runs.check_published(chapters.CHAPTERS, root).values():
            for name in run.meta["files"]:
                if name.endswith(".csv"):
                    df = run.table(name[:-4])  # every value in its declared range (its declaration)
                    if df.empty and run.declaration.columns_of(name):
                        raise runs.RunError(f"{run.path / name} has no rows")
        history.read(root)
    except runs.RunError as e:
        raise BuildError(str(e)) from None


def first_error(log: str) -> str | None:
    """The first labsupport error line in a build log (colour codes removed)."""
    for line in ANSI.sub("", log).splitlines():
        m = ERROR.search(line)
        if m:
            return f"{m.group(1)}: {m.group(2).strip()}"
    return None


def repository(env=None) -> dict | None:
    """The GitHub repository the book's notebooks are in, as Jupyter Book's `repository`
    section ({url, branch, path_to_book}), or None when the build is not told one.

    LABSUPPORT_REPOSITORY (owner/name, or https://github.com/owner/name) wins, on the branch
    LABSUPPORT_REPOSITORY_BRANCH (default main); else, in GitHub Actions on github.com,
    GITHUB_REPOSITORY on the branch being built (GITHUB_REF refs/heads/<branch>), or the commit
    built (GITHUB_SHA) when the ref is no branch (a pull request, a tag). A repository that
    is not on github.com gets no button (Colab opens notebooks from GitHub only)."""
    env = os.environ if env is None else env
    given = env.get("LABSUPPORT_REPOSITORY", "").strip()
    if given:
        m = REPOSITORY.fullmatch(given)
        if not m:
            raise BuildError(f"LABSUPPORT_REPOSITORY={given!r} is not a GitHub repository (owner/name)")
        branch = env.get("LABSUPPORT_REPOSITORY_BRANCH", "").strip() or "main"
    else:
        m = REPOSITORY.fullmatch(env.get("GITHUB_REPOSITORY", "").strip())
        if not m or env.get("GITHUB_SERVER_URL", GITHUB).rstrip("/") != GITHUB:
            return None
        ref = env.get("GITHUB_REF", "")
        branch = ref.removeprefix("refs/heads/") if ref.startswith("refs/heads/") else env.get("GITHUB_SHA", "")
        if not branch:
            return None
    return {"url": f"{GITHUB}/{m.group(1)}/{m.group(2)}", "branch": branch, "path_to_book": ""}


def launch_config(repo: dict, source: Path = REPO_ROOT / "_config.yml") -> dict:
    """The book's configuration with `repo` and a Colab launch button, for a file outside the
    repository: the local extensions' folders, relative to _config.yml, made absolute."""
    config = yaml.safe_load(source.read_text())
    sphinx = config.setdefault("sphinx", {})
    sphinx["local_extensions"] = {
        name: str((source.parent / folder).resolve()) for name, folder in (sphinx.get("local_extensions") or {}).items()
    }
    config["repository"] = repo
    config["launch_buttons"] = {"colab_url": COLAB, "notebook_interface": "classic"}
    return config


def _run(cmd: list[str], env: dict, log: Path, echo: bool) -> int:
    """Run jupyter-book, its output into `log` (and to stdout when `echo`); its exit status."""
    with open(log, "w") as f:
        p = subprocess.Popen(
            cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace"
        )
        for line in p.stdout:
            f.write(line)
            if echo:
                sys.stdout.write(line)
        return p.wait()


def command(out: Path | None = None) -> list[str]:
    """The jupyter-book command line that builds the HTML (into `out`/_build/html, default the
    repository's _build/), warnings as errors, every notebook executed; the tests' session build
    runs the same one."""
    cmd = [
        sys.executable,
        "-m",
        "labsupport.ops.jupyterbook_parallel",  # jupyter-book's command, several notebooks at once
        "build",
        str(REPO_ROOT),
        "--all",
        "--warningiserror",
        "--keep-going",
        "--builder",
        "html",
    ]
    return cmd + (["--path-output", str(out)] if out is not None else [])


def build(runs_root: Path | None = None, out: Path | None = None, log: Path | None = None, echo: bool = True) -> Path:
    """Build the HTML from `runs_root` (default: runs/) into `out` (default: the repository's
    _build/); returns the HTML folder, or raises BuildError with one line."""
    from labsupport import chapters

    problem = chapters.toc_problem(REPO_ROOT / "_toc.yml")  # a chapter the book would leave out, or fail on
    if problem:
        raise BuildError(problem)
    root = runs_root or runs.runs_root()
    check_runs(root)
    log = log or REPO_ROOT / "build" / "book.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    cmd = command(out)
    env = {**os.environ, "LABSUPPORT_RUNS": str(root)}
    repo = repository()
    with tempfile.TemporaryDirectory() as tmp:
        if repo is not None:  # the Colab button (this module's docstring)
            config = Path(tmp) / "_config.yml"
            config.write_text(yaml.safe_dump(launch_config(repo), sort_keys=False))
            cmd += ["--config", str(config)]
            if echo:
                print(f"Colab launch buttons for {repo['url']} ({repo['branch']})")
        rc = _run(cmd, env, log, echo)
    if rc != 0:
        found = first_error(log.read_text(errors="replace"))
        raise BuildError(f"{found or f'jupyter-book exited with {rc}'} (full log: {log})")
    return (out / "_build" / "html") if out is not None else HTML_DIR
