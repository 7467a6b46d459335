"""HTML from run data is escaped: a recorded kernel name and op holding `<`, `>`, `&`, a
<script> and an <img onerror> show as text in the chapter's tables (rendered by executing
the chapter in replay against a tampered copy of its run), in drift reports and in glued
markdown."""

import hashlib
import json
import re
import shutil

import nbformat
import pandas as pd
import papermill as pm
import pytest
from markdown_it import MarkdownIt

from labsupport import chapters, glue, runs
from labsupport.chapters import kernels_in_one_token as one_token
from labsupport.ops import drift, status

from .conftest import RUNS

pytestmark = pytest.mark.unit

CH = "kernels-in-one-token"
OP = '<img src=x onerror=alert("op")> & <script>alert("op")</script>'
NAME = "<img src=x onerror=alert(1)>&evil_kernel<script>alert(2)</script>"
RAW = ("<img src=x onerror", "<script>alert")


@pytest.fixture(scope="module")
def tampered(tmp_path_factory):
    """A copy of the published runs whose kernels-in-one-token run has hostile op and kernel names
    in its middle layer (meta.json updated, so the run loads)."""
    root = tmp_path_factory.mktemp("tampered") / "runs"
    rid = runs.published(RUNS)[CH]
    shutil.copytree(RUNS, root)  # every published run: the page reads the other owners' shared quantities
    run = runs.load_run(chapters.by_slug(CH), rid, root)
    mid = one_token.middle_layer(run)
    path = run.path / "kernels.csv"
    k = pd.read_csv(path, dtype=str, keep_default_na=False)
    rows = k.layer == str(mid)
    k.loc[rows, "op"] = OP
    k.loc[rows[rows].index[:3], "name"] = NAME
    k.to_csv(path, index=False)
    meta = json.loads((run.path / "meta.json").read_text())
    meta["files"]["kernels.csv"] = hashlib.sha256(path.read_bytes()).hexdigest()
    (run.path / "meta.json").write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
    return root


def assert_escaped(html: str):
    for raw in RAW:
        assert raw not in html, f"{raw!r} rendered as a tag"
    assert re.search(r"&lt;img src=x onerror=alert\((&quot;|&#34;)op(&quot;|&#34;)\)&gt; &amp; &lt;script&gt;", html)
    assert "&amp;evil_kernel" in html


def test_the_layer_table_styler_escapes(tampered):
    run = runs.load_run(chapters.by_slug(CH), root=tampered)
    df = one_token.layer_kernels(run, one_token.middle_layer(run))
    # The chapter's own call: formats for some columns must leave the others escaped too.
    assert_escaped(glue.table(df, {"start µs": "{:.1f}", "µs": "{:.2f}"}).data)
    html = glue.styled(df, {"start µs": "{:.1f}", "µs": "{:.2f}"}).hide(axis="index").to_html()
    assert_escaped(html)
    html = glue.styled(df.set_index("operator"), "{:.2f}", subset=["µs"]).to_html()  # labels too
    assert_escaped(html)


def test_importing_glue_changes_nothing_in_pandas():
    """The escaping is the table helpers' own: no global patch of pandas' Styler or its options."""
    import subprocess
    import sys

    code = (
        "import pandas as pd; from pandas.io.formats.style import Styler; "
        "before = (Styler.format, Styler.format_index, Styler.__init__, pd.get_option('styler.format.escape')); "
        "import labsupport.glue; "
        "assert before == (Styler.format, Styler.format_index, Styler.__init__, pd.get_option('styler.format.escape'))"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=RUNS.parent)


@pytest.mark.book
def test_the_chapter_page_escapes(tampered, tmp_path, monkeypatch):
    """Execute the chapter in replay against the tampered run: the HTML its cells give the
    book (text/html outputs, embedded as they are) shows the names as text."""
    monkeypatch.setenv("LABSUPPORT_RUNS", str(tampered))
    ch = chapters.by_slug(CH)
    out = tmp_path / "replayed.ipynb"
    pm.execute_notebook(
        str(ch.path),
        str(out),
        parameters={"mode": "replay"},
        cwd=str(ch.path.parent),
        kernel_name="python3",
        progress_bar=False,
    )
    nb = nbformat.read(out, as_version=4)
    html = "\n".join(
        o.get("data", {}).get("text/html", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
    )
    assert_escaped(html)
    markdown = "\n".join(
        o.get("data", {}).get("text/markdown", "")
        for c in nb.cells
        if c.cell_type == "code"
        for o in c.get("outputs", [])
    )
    for raw in RAW:
        assert raw not in MarkdownIt("commonmark").render(_outside_code(markdown))


def _outside_code(md: str) -> str:
    return re.sub(r"`[^`]*`", "", md)


def test_drift_reports_escape_kernel_names(tampered, tmp_path, monkeypatch):
    d = drift.ChapterDrift(
        CH,
        "20261130T001955Z-h200",
        "20261130T002417Z-h200",
        structural=[{"table": "kernels.csv", "what": f"new kernel {NAME}", "old": 0, "new": 1}],
        timing=[{"metric": OP, "old": 1.0, "new": 1.1, "change": 0.1, "moved": False}],
    )
    md = drift.to_markdown([d], 0.25, "Drift")
    html = MarkdownIt("commonmark").enable("table").render(md)
    for raw in RAW:
        assert raw not in html
    assert "&amp;evil_kernel" in html and "<table>" in html
    # The status page renders the published night's report from its JSON, escaped the same way.
    monkeypatch.setenv("LABSUPPORT_RUNS", str(tampered))
    rid = runs.published(tampered)[CH]
    d.new_run = rid
    (tampered / "nightly").mkdir(exist_ok=True)
    (tampered / "nightly" / f"{rid}-drift.json").write_text(drift.to_json([d], 0.25))
    (tampered / "nightly" / f"{rid}-drift.md").write_text("# raw <script>alert(3)</script>\n")
    page = MarkdownIt("commonmark").enable("table").render(status.latest_drift())
    for raw in RAW:
        assert raw not in page
    assert "alert(3)" not in page, "the report is rendered from its JSON, not from the markdown file"


def test_glued_markdown_keeps_code_spans_and_escapes_the_rest():
    assert glue.md_safe(f"GPU {NAME}, kernel `{NAME}` **bold**") == (
        "GPU &lt;img src=x onerror=alert(1)&gt;&amp;evil_kernel&lt;script&gt;alert(2)&lt;/script&gt;, "
        f"kernel `{NAME}` **bold**"
    )
    html = MarkdownIt("commonmark").render(glue.md_safe(f"GPU {NAME}, kernel `{NAME}`"))
    assert "<img" not in html and "<script>" not in html and "<code>&lt;img" in html
