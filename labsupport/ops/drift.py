"""Compare a new run of a chapter with the published one: structural changes (kernel
counts and names, by kind and by source) apart from timing noise (headline numbers that
moved by more than a threshold). A host-timed headline number (a wall time) that moved with
the host, as the ratio of the two runs' host-probe readings (their best, or their typical) says, is
labelled "host", not moved.
A new run recorded on another GPU than the published one is compared all the same, and said to
be: its changes are the GPU's, not drift, and the night's count of changes leaves them out.

The markdown report escapes everything that comes from run data (kernel names above all), so
the status page renders it as text, never as HTML."""

from __future__ import annotations

import html
import json
import math
import re
from dataclasses import asdict, dataclass, field

import pandas as pd

from labsupport import chapters, runs
from labsupport.chapters import Chapter
from labsupport.measure import hostprobe
from labsupport.traces import kernels

DEFAULT_TIMING_THRESHOLD = 0.25  # relative change of a headline number still called noise
# Headline numbers taken on the host's clock (wall times, per-call µs): they follow the CPU's speed.
HOST_TIMED = re.compile(r"\bwall\b|^(prefill|decode) ms$|µs$")


@dataclass
class ChapterDrift:
    chapter: str
    old_run: str | None
    new_run: str
    structural: list[dict] = field(default_factory=list)
    timing: list[dict] = field(default_factory=list)
    host: dict = field(default_factory=dict)  # host_speed(): the probe of the new run against the published
    gpus: dict = field(default_factory=dict)  # {"published": ..., "new": ...} where the two runs' GPUs differ

    @property
    def moved(self) -> list[dict]:
        return [t for t in self.timing if t["moved"]]

    @property
    def other_gpu(self) -> bool:
        return bool(self.gpus)

    @property
    def slow_host(self) -> bool:
        return bool(self.host.get("slow"))


def host_speed(new: runs.Run, old: runs.Run | None) -> dict:
    """What the host probe says of the new run: its readings against its own quickest and against
    the published run's typical reading ({} when the new run has no probe: recorded before it)."""
    ref = hostprobe.assess(old.results.get("host_probe", [])) if old is not None else None
    h = hostprobe.assess(
        new.results.get("host_probe", []),
        reference_ms=ref.median_ms if ref else None,
        reference_what="the published run's",
    )
    if h is None:
        return {}
    return {
        "readings": h.readings,
        "best_ms": h.best_ms,
        "median_ms": h.median_ms,
        "worst_ms": h.worst_ms,
        "published_median_ms": h.reference_ms,
        "slow": h.slow,
        "why": h.why,
    }


def probe_ratios(new: runs.Run, old: runs.Run) -> tuple[float | None, float | None]:
    """The new run's best and typical (median) host-probe readings over the published run's (None
    when either has no probe). The best says how fast the host could run in each; the typical, where
    it mostly was: a run taken mostly in the slow mode has a fast best and a slow typical reading,
    and its host-timed numbers follow the slow one."""
    a = hostprobe.assess(new.results.get("host_probe", []))
    b = hostprobe.assess(old.results.get("host_probe", []))
    if not (a and b):
        return None, None
    return (a.best_ms / b.best_ms if b.best_ms > 0 else None, a.median_ms / b.median_ms if b.median_ms > 0 else None)


def explained_by_host(change: float, ratio: float | None, threshold: float) -> bool:
    """Whether a host-timed number's relative `change` is the host's: it moved the way the probe
    moved, and no further than the probe's move plus the noise threshold (a host-bound step follows
    the CPU at most one for one)."""
    if ratio is None or ratio <= 0 or change <= -1:
        return False
    move = 1 + change
    if (move > 1) != (ratio > 1):
        return False  # it moved against the host
    return abs(math.log(move)) <= abs(math.log(ratio)) + math.log(1 + threshold)


def _kernel_tables(run: runs.Run) -> dict[str, pd.DataFrame]:
    """Every kernel table of a run: its CSV kernel tables, and the kernels of each raw
    profiler trace (chapters such as the hybrid one keep their kernels in traces only)."""
    from labsupport.traces import trace

    out = {}
    device = run.provenance.get("device", "cuda")
    for name in sorted(run.meta.get("files", {})):
        if name.endswith(".csv"):
            df = run.table(name[:-4])
            if {"name", "dur_ns"} <= set(df.columns):
                out[name] = df
        elif name.endswith(".json.gz"):
            out[name] = trace.read_kernels(run.file(name), device=device)
    return out


def _counts(df: pd.DataFrame, by) -> dict:
    return df.name.map(by).value_counts().to_dict()


LAYER = re.compile(r"(?:^|\.)layers\.(\d+)(?:\.|$)")  # a decoder layer's module path


def _names_by_layer(df: pd.DataFrame) -> dict[tuple[str, str], int]:
    """How many kernels of each short name each decoder layer launched (by the module that launched
    them; a kernel outside every layer counts as "outside the layers", and a table that does not say
    which module launched each kernel counts as one "step")."""
    names = df.name.map(kernels.short_name)
    if "module" in df.columns:
        found = df.module.fillna("").astype(str).str.extract(LAYER)[0]
        where = ("layer " + found).fillna("outside the layers")
    else:
        where = pd.Series("step", index=df.index)
    return pd.DataFrame({"where": where, "name": names}).value_counts().to_dict()


def _spans(numbers: list[int]) -> str:
    """1, 2, 3, 7 -> "1-3, 7"."""
    out, start = [], None
    for i, n in enumerate(numbers):
        start = n if start is None else start
        if i + 1 == len(numbers) or numbers[i + 1] != n + 1:
            out.append(str(start) if start == n else f"{start}-{n}")
            start = None
    return ", ".join(out)


def layer_name_changes(table: str, old: pd.DataFrame, new: pd.DataFrame) -> list[dict]:
    """The census compared by kernel name within each decoder layer, not only by count: every
    (layer, short name) whose number of kernels differs between the two tables, one change per name
    and pair of counts, with the layers it holds for ("layers 0-35: ..."). Two steps that launch
    the same kernels in different layers, or trade one kernel for another of the same kind, differ
    here even when every total agrees."""
    a, b = _names_by_layer(old), _names_by_layer(new)
    grouped: dict[tuple[str, int, int], list[str]] = {}
    for where, name in sorted(set(a) | set(b)):
        n_old, n_new = a.get((where, name), 0), b.get((where, name), 0)
        if n_old != n_new:
            grouped.setdefault((name, n_old, n_new), []).append(where)
    out = []
    for (name, n_old, n_new), places in sorted(grouped.items()):
        layers = sorted(int(w.split()[1]) for w in places if w.startswith("layer "))
        others = [w for w in places if not w.startswith("layer ")]
        label = [f"layer{'s' if len(layers) > 1 else ''} {_spans(layers)}"] if layers else []
        out.append({"table": table, "what": f"{', '.join(label + others)}: {name}", "old": n_old, "new": n_new})
    return out


def compare(
    chapter: Chapter, new: runs.Run, old: runs.Run | None, threshold: float = DEFAULT_TIMING_THRESHOLD
) -> ChapterDrift:
    d = ChapterDrift(chapter.slug, old.run_id if old else None, new.run_id, host=host_speed(new, old))
    if old is None:
        return d
    gpu_old, gpu_new = old.provenance.get("gpu"), new.provenance.get("gpu")
    if gpu_old != gpu_new:
        d.gpus = {"published": gpu_old, "new": gpu_new}
    new_k, old_k = _kernel_tables(new), _kernel_tables(old)
    for table in sorted(set(new_k) | set(old_k)):
        if table not in new_k or table not in old_k:
            d.structural.append({"table": table, "what": "table", "old": table in old_k, "new": table in new_k})
            continue
        a, b = old_k[table], new_k[table]
        if len(a) != len(b):
            d.structural.append({"table": table, "what": "kernels", "old": len(a), "new": len(b)})
        d.structural += layer_name_changes(table, a, b)
        for label, fn in (("kind", kernels.classify), ("source", kernels.source)):
            ca, cb = _counts(a, fn), _counts(b, fn)
            for key in sorted(set(ca) | set(cb)):
                if ca.get(key, 0) != cb.get(key, 0):
                    d.structural.append(
                        {"table": table, "what": f"{label}: {key}", "old": ca.get(key, 0), "new": cb.get(key, 0)}
                    )
        na, nb = set(a.name.map(kernels.short_name)), set(b.name.map(kernels.short_name))
        for name in sorted(nb - na):
            d.structural.append(
                {
                    "table": table,
                    "what": f"new kernel {name}",
                    "old": 0,
                    "new": int((b.name.map(kernels.short_name) == name).sum()),
                }
            )
        for name in sorted(na - nb):
            d.structural.append(
                {
                    "table": table,
                    "what": f"kernel gone {name}",
                    "old": int((a.name.map(kernels.short_name) == name).sum()),
                    "new": 0,
                }
            )
    h_new, h_old = chapters.headline(chapter, new), chapters.headline(chapter, old)
    ratios = probe_ratios(new, old)
    for key in h_new:
        if key not in h_old:
            continue
        o, n = float(h_old[key]), float(h_new[key])
        if not (math.isfinite(o) and math.isfinite(n)):
            continue  # a number one of the runs does not have: nothing to compare
        rel = (n - o) / o if o else float("inf") if n else 0.0
        host = (
            abs(rel) > threshold
            and HOST_TIMED.search(key) is not None
            and any(explained_by_host(rel, r, threshold) for r in ratios)
        )
        d.timing.append(
            {"metric": key, "old": o, "new": n, "change": rel, "moved": abs(rel) > threshold and not host, "host": host}
        )
    return d


def from_json(text: str) -> tuple[list[ChapterDrift], float]:
    """The drifts and threshold of a report written by to_json."""
    data = json.loads(text)
    return [ChapterDrift(**d) for d in data["chapters"]], float(data["timing_threshold"])


_MD_SPECIAL = re.compile(r"([\\`*_{}\[\]()#+!|~])")


def md_text(value) -> str:
    """`value` as literal markdown text: HTML escaped, markdown punctuation backslashed."""
    return _MD_SPECIAL.sub(r"\\\1", html.escape(str(value), quote=False)).replace("\n", " ")


def md_code(value) -> str:
    """`value` as a markdown code span (which shows HTML as text)."""
    return "`" + str(value).replace("`", "'").replace("\n", " ") + "`"


def to_json(drifts: list[ChapterDrift], threshold: float) -> str:
    return (
        json.dumps({"timing_threshold": threshold, "chapters": [asdict(d) for d in drifts]}, indent=2, default=float)
        + "\n"
    )


def to_markdown(drifts: list[ChapterDrift], threshold: float, title: str) -> str:
    lines = [
        f"# {title}",
        "",
        f"Structural changes are any change in kernel counts or names; a headline number counts as "
        f"moved when it changed by more than {threshold:.0%}.",
        "",
    ]
    for d in drifts:
        lines += [
            f"## {md_text(d.chapter)}",
            "",
            f"new run {md_code(d.new_run)} against published run {md_code(d.old_run or 'none')}",
            "",
        ]
        lines += [host_line(d.host), ""]
        if d.other_gpu:
            lines += [
                f"**Another GPU**: the published run was recorded on {md_text(d.gpus['published'])}, this one on "
                f"{md_text(d.gpus['new'])}. The changes below are what changes with the GPU, not drift.",
                "",
            ]
        if d.old_run is None:
            lines += ["No published run to compare with.", ""]
            continue
        if d.structural:
            lines += ["| table | change | published | new |", "|---|---|---|---|"]
            lines += [
                f"| {md_text(s['table'])} | {md_text(s['what'])} | {md_text(s['old'])} | {md_text(s['new'])} |"
                for s in d.structural
            ]
        else:
            lines.append("No structural change: the same kernels, by kind and by source.")
        lines += ["", "| headline number | published | new | change | |", "|---|---|---|---|---|"]
        lines += [timing_row(t) for t in d.timing]
        lines.append("")
    return "\n".join(lines)


def summary_line(drifts: list[ChapterDrift], threshold: float) -> str:
    """The night's one line: structural changes and moved numbers of the chapters recorded on the
    GPU of their published runs; those recorded on another GPU are named apart, uncounted."""
    same = [d for d in drifts if not d.other_gpu]
    other = [d.chapter for d in drifts if d.other_gpu]
    text = (
        f"drift: {sum(len(d.structural) for d in same)} structural changes, "
        f"{sum(len(d.moved) for d in same)} headline numbers moved beyond {threshold:.0%}"
    )
    if other:
        text += f"; on another GPU than their published runs, not counted: {', '.join(other)}"
    return text


def host_line(h: dict) -> str:
    """One line on the host's speed during the new run, from its probe (host_speed)."""
    if not h:
        return "Host probe: none (the run was recorded before the probe existed)."
    pub = h.get("published_median_ms")
    ref = f"; the published run's typical reading {pub:.2f} ms" if pub else ""
    text = (
        f"Host probe: {h['readings']} readings, {h['best_ms']:.2f}-{h['worst_ms']:.2f} ms "
        f"(typical {h['median_ms']:.2f} ms){ref}."
    )
    if h.get("slow"):
        return text + f" **Host slower than usual**: {md_text(h['why'])}."
    return text + " The host held its speed."


def timing_row(t: dict) -> str:
    """One headline number's row; a number either run lacks (reports written before compare()
    skipped them) shows as a dash, not as nan."""
    if not all(math.isfinite(float(t[k])) for k in ("old", "new")):
        return f"| {md_text(t['metric'])} | {_num(t['old'])} | {_num(t['new'])} | – | not in both runs |"
    label = "**moved**" if t["moved"] else "host" if t.get("host") else "noise"
    return f"| {md_text(t['metric'])} | {t['old']:.4g} | {t['new']:.4g} | {t['change']:+.1%} | {label} |"


def _num(v) -> str:
    return f"{float(v):.4g}" if math.isfinite(float(v)) else "–"
