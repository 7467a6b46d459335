"""The gallery page's data: every gallery run beside the book's published run of its chapter, one
row per GPU and form (dtype, preset), each set against its own GPU's floor and ceilings.

The numbers are read from each run's own tables, whichever of them its chapter records:

- *step ms*: the least step time of the run's fastest step form that gives the step's answers and
  reads its bytes (an FP8 rung has a floor of its own and is left out); `host` when timed by the
  host's clock, `CUDA events` when by events on the GPU's stream;
- *x floor*: that time over the floor, the step's bytes (meta.json: results.model.decode_bytes) at
  the datasheet's bandwidth of the run's GPU; empty when the GPU is not in the datasheet table;
- *GPU-busy*: the share of the eager step's span (first kernel start to last kernel end, one
  profiled step) in which a kernel ran; *kernels*: kernels in that step; *µs per kernel*: the
  span over the kernels, the time between kernel arrivals on average (profiled);
- *matmul x bandwidth*: the best rate any one matrix-vector product reached (closing-the-gap's
  matmuls table) over the datasheet bandwidth.

Every text is HTML-escaped in `html`: a gallery run's provenance is a reader's text.
"""

from __future__ import annotations

import html as _html
import math
from pathlib import Path

import pandas as pd

from labsupport import runs
from labsupport.chapters.closing_the_gap import FP8_RUNGS
from labsupport.measure import hardware
from labsupport.ops import gallery, pack

STEP_TABLES = {"launch-overhead": ("variants", "variant"), "closing-the-gap": ("rungs", "rung")}
# Step forms that read other bytes than the step's own (FP8 weights): each has a floor of its own, so
# none may stand as the run's step against the step's floor.
OWN_FLOOR = {"closing-the-gap": set(FP8_RUNGS)}
PUBLISHED = "the book's published run"
DOWNLOADS = "download/gallery"  # under the HTML folder


def _f(v) -> float:
    try:
        v = float(v)
    except (TypeError, ValueError):
        return math.nan
    return v if math.isfinite(v) else math.nan


def _eager(t: pd.DataFrame) -> dict:
    ok = t[t.status.astype(str) == "ok"] if "status" in t else t
    row = ok.iloc[0] if len(ok) else None
    if row is None or not {"kernels", "gpu_busy_ns", "first_kernel_ns", "last_kernel_end_ns"} <= set(ok.columns):
        return {}
    span = _f(row.last_kernel_end_ns) - _f(row.first_kernel_ns)
    k = _f(row.kernels)
    return {
        "kernels": k,
        "GPU-busy": _f(row.gpu_busy_ns) / span if span > 0 else math.nan,
        "µs per kernel": span / k / 1e3 if k > 0 else math.nan,
    }


def _best_step(t: pd.DataFrame, name_col: str, own_floor=frozenset()) -> tuple[float, str, str]:
    """(ms, form, timed by) of the fastest step form with a time that gives the step's answers
    (where the table says: its `passed` column) and reads the step's own bytes (not in `own_floor`)."""
    ok = t[t.status.astype(str) == "ok"] if "status" in t else t
    if "passed" in ok:
        ok = ok[ok.passed.astype(str) == "True"]
    ok = ok[~ok[name_col].astype(str).isin(own_floor)]
    best = (math.nan, "", "")
    for _, r in ok.iterrows():
        for col, how in (("gpu_ms_min", "CUDA events"), ("wall_ms_min", "host")):
            v = _f(r.get(col))
            if v == v and not (best[0] <= v):
                best = (v, str(r[name_col]), how)
                break
    return best


def numbers(run: runs.Run) -> dict:
    """The normalised numbers of one run (those its chapter's tables allow)."""
    files = run.meta["files"]
    sheet = hardware.datasheet_or_none(run.provenance.get("gpu", ""))
    nbytes = _f((run.results.get("model") or {}).get("decode_bytes"))
    floor = nbytes / sheet.bandwidth_tbs / 1e9 if sheet and sheet.bandwidth_tbs and nbytes == nbytes else math.nan
    out = {"floor ms": floor, "step ms": math.nan, "step": "", "timed by": ""}
    if run.chapter in STEP_TABLES and f"{STEP_TABLES[run.chapter][0]}.csv" in files:
        table, col = STEP_TABLES[run.chapter]
        t = run.table(table)
        out.update(_eager(t))
        out["step ms"], out["step"], out["timed by"] = _best_step(t, col, OWN_FLOOR.get(run.chapter, set()))
    elif run.chapter == "kernels-in-one-token" and {"census.csv", "step_times.csv"} <= set(files):
        census, steps = run.table("census"), run.table("step_times")
        census = census[census.kind.astype(str) != "total"]  # the kinds, without their total row
        gpu = pd.to_numeric(steps.get("gpu_ms"), errors="coerce").min() if "gpu_ms" in steps else math.nan
        wall = pd.to_numeric(steps.wall_ms, errors="coerce").min()
        k = _f(census.kernels.sum())
        busy_ms = _f(census.gpu_ms.sum())
        step = gpu if gpu == gpu else wall
        out.update({"step ms": step, "step": "eager", "timed by": "CUDA events" if gpu == gpu else "host"})
        out.update({"kernels": k, "GPU-busy": busy_ms / step if step > 0 else math.nan})
        out["µs per kernel"] = step * 1e3 / k if k > 0 else math.nan
    if "matmuls.csv" in files and sheet and sheet.bandwidth_tbs:
        mm = run.table("matmuls")
        best = max(_f(mm[c].max()) for c in ("cublas_tbs", "triton_tbs") if c in mm)
        out["matmul x bandwidth"] = best / sheet.bandwidth_tbs
    out["x floor"] = out["step ms"] / floor if floor == floor else math.nan
    out["datasheet"] = sheet.name if sheet else "not in the table: its measured ceilings only"
    return out


def _row(run: runs.Run, source: str, download: str) -> dict:
    p, f = run.provenance, pack.form(run)
    clocks = pack.clocks(p)
    return {
        "chapter": run.chapter,
        "GPU": f["gpu"],
        "dtype": f["dtype"],
        "preset": f["preset"],
        "run": run.run_id,
        "source": source,
        **numbers(run),
        "provenance": f"torch {p.get('torch')}, CUDA {p.get('cuda')}, driver {p.get('driver')}, "
        f"commit {str(p.get('git_commit'))[:10]}, {str(p.get('utc_time'))[:10]}"
        + (
            f"; SM clock max {clocks.get('nvidia_smi_clocks_max_sm')} MHz, power limit "
            f"{clocks.get('nvidia_smi_power_limit')} W"
            if clocks
            else "; clocks and power limit not recorded"
        ),
        "download": download,
    }


def rows(root: Path | None = None) -> pd.DataFrame:
    """Every gallery run and, for each chapter that has one, the book's published run."""
    root = root or runs.runs_root()
    found = gallery.entries(root)
    out = []
    published = runs.published(root)
    in_gallery = {(e.run.chapter, e.run.run_id) for e in found}
    for chapter in sorted({e.run.chapter for e in found}):
        if chapter in published and (chapter, published[chapter]) not in in_gallery:
            run = runs.load_run(chapter, published[chapter], root)
            out.append(_row(run, PUBLISHED, f"download/runs/{chapter}.zip"))
    for e in found:
        label = gallery.shown(e.manifest.get("label") or "a reader's run")
        out.append(_row(e.run, f"gallery: {label}", f"{DOWNLOADS}/{download_name(e)}"))
    return pd.DataFrame(out)


def download_name(e: gallery.Entry) -> str:
    return f"{e.run.chapter}-{e.run.run_id}-{e.gpu_slug}.zip"


COLUMNS = ("GPU", "dtype", "preset", "source", "step", "step ms", "x floor", "GPU-busy", "kernels", "µs per kernel")


def _cell(col: str, v) -> str:
    if isinstance(v, float):
        if v != v:
            return "–"
        if col == "GPU-busy":
            return f"{v:.0%}"
        if col == "matmul x bandwidth":
            return f"{v:.0%}"
        return f"{v:,.0f}" if col == "kernels" else f"{v:.2f}"
    return _html.escape(str(v))


def html(df: pd.DataFrame, prefix: str = "../") -> str:
    """The page's tables, one per chapter, every text escaped; `prefix` leads from the page to
    the HTML folder's root (downloads)."""
    if df.empty:
        return "<p>The gallery has no runs yet.</p>"
    parts = []
    for chapter, g in df.groupby("chapter", sort=True):
        cols = [*COLUMNS, *(["matmul x bandwidth"] if "matmul x bandwidth" in g else []), "provenance", "download"]
        head = "".join(f"<th>{_html.escape(c)}</th>" for c in cols)
        body = []
        for _, r in g.iterrows():
            cells = []
            for c in cols:
                if c == "download":
                    cells.append(f'<td><a href="{_html.escape(prefix + r[c], quote=True)}">zip</a></td>')
                elif c == "step ms" and r["timed by"]:
                    cells.append(f"<td>{_cell(c, r[c])} <small>({_html.escape(r['timed by'])})</small></td>")
                elif c == "x floor" and r[c] != r[c]:
                    cells.append(f"<td>– <small>({_html.escape(r['datasheet'])})</small></td>")
                else:
                    cells.append(f"<td>{_cell(c, r.get(c, math.nan))}</td>")
            body.append("<tr>" + "".join(cells) + "</tr>")
        parts.append(
            # .table-wrap (book/_static/book.css): a table wider than the screen scrolls in its box.
            f"<h2>{_html.escape(chapter)}</h2>\n<div class='table-wrap'><table class='gallery'><thead><tr>{head}</tr>"
            f"</thead><tbody>{''.join(body)}</tbody></table></div>"
        )
    return "\n".join(parts)
