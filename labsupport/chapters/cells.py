"""The cells every chapter notebook opens with, each written once here (tests/test_declarations.py
checks that every chapter notebook holds them exactly): the install cell, the parameters cell
papermill replaces, the environment check, and the cell that shows the run's parameters."""

from __future__ import annotations

# Installs labsupport where it is missing, as the book serves it (serve_package: the wheel and
# requirements-gpubox.txt under download/), from the notebook's folder or LABSUPPORT_BOOK_URL.
BOOTSTRAP = """\
# Outside a machine set up for the book (Colab, an empty folder): install the wheel the book serves, found beside
# this notebook or under LABSUPPORT_BOOK_URL, with requirements-gpubox.txt (a live run's tools) where it is there.
import importlib.util
import os
import subprocess
import sys
import urllib.request

if importlib.util.find_spec("labsupport") is None:
    whl, reqs, url = "labsupport-0.1.0-py3-none-any.whl", "requirements-gpubox.txt", os.getenv("LABSUPPORT_BOOK_URL")
    for name in (whl, reqs) if url and not os.path.exists(whl) else ():
        urllib.request.urlretrieve(f"{url.rstrip('/')}/download/{name}", name)
    if not os.path.exists(whl):
        raise ImportError(f"labsupport is not installed: put {whl} beside this notebook, or set LABSUPPORT_BOOK_URL")
    more = ["-r", reqs] if os.path.exists(reqs) else []
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", whl, *more], check=True)
    importlib.invalidate_caches()
    print(f"installed {' and '.join([whl, *more[1:]])}")"""

# What papermill replaces: the mode, the run, and what this run changes from the chapter's Params.
PARAMETERS = """\
# Parameters: papermill replaces this cell ("replay" reads the recorded run; "live" measures now).
mode = "replay"
run_id = None
overrides = {}  # any field of ch.Params by name: what this run changes from the defaults below"""

# The environment check, before anything else of labsupport is imported; {slug} is the chapter's.
ENVIRONMENT = """\
# What this machine lacks for this chapter, one line each (nothing when all is fine).
try:
    from labsupport.measure import environment
except ImportError:
    raise ImportError(
        "labsupport is not installed: pip install the labsupport wheel that the book serves under download/ "
        "(with its [live] extra for a live run; page 'Run a chapter yourself')"
    ) from None

env_notes = environment.check(
    "{slug}", mode, overrides.get("preset"), overrides.get("device") == "cpu", overrides.get("dtype")
)"""

# The first visible cell after the imports: every parameter of the run, its defaults and overrides.
PARAMS = """\
params = ch.Params(**overrides)
params"""
