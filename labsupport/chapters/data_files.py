"""The list of data at the end of each chapter: each file a chapter's run holds with the line its
chapter's declaration gives it (its File's `describes`); a file without one is listed as
undescribed, and a test fails on it. And the host's speed while the run was recorded."""

from __future__ import annotations

from labsupport import glue
from labsupport.traces.replay import is_derived

META = "provenance (GPU, driver, CUDA, library versions, commit, time, command), parameters, results, checksums"

DERIVED = {
    "events": "derived from the trace of the same name: its events in a table, which replay reads instead of the trace",
    "kernels": "derived from the trace of the same name: its kernels with their launching call, operator, module",
    "regions": "derived from the trace of the same name: its annotated regions (start, length in ns)",
}


def is_trace(name: str) -> bool:
    """A raw profiler trace (gzipped Chrome-trace JSON), which Perfetto opens."""
    return name.endswith(".json.gz")


def describe(declaration, name: str) -> str | None:
    """The line on file `name` of a run of the chapter `declaration` declares (meta.json's for any
    chapter), or None."""
    if name == "meta.json":
        return META
    if is_derived(name):  # the replay tables beside each trace (labsupport.traces.replay)
        return DERIVED[name.rsplit(".", 3)[1]]
    return declaration.describe(name)


def about_this_run(run):
    """One folded box for the end of a chapter, "About this run": its provenance (GPU, driver,
    versions, commit, time), how each kind of number was taken (results["method"]), the host
    probe's readings, and every file of the run (data_list_html). What a reader checks, not what a reader
    reads first; so it is closed until opened."""
    import html

    from IPython.display import HTML

    def table(rows) -> str:
        cells = "".join(f"<tr><th>{html.escape(str(k))}</th><td>{html.escape(str(v))}</td></tr>" for k, v in rows)
        return f'<table class="provenance"><tbody>{cells}</tbody></table>'

    method = dict(run.results.get("method", {}))  # how each kind of number was taken (the harness's record)
    host = method.pop("host", {})
    method_rows = [*method.items(), *((f"host: {k}", v) for k, v in host.items())]
    taken = f"<p>How the numbers were taken:</p>{table(method_rows)}" if method_rows else ""
    gpu, day = run.provenance.get("gpu", "?"), str(run.provenance.get("utc_time", ""))[:10]
    return HTML(
        '<details class="about-run"><summary>About this run: '
        f"{html.escape(str(gpu))}, run <code>{html.escape(run.run_id)}</code>, {html.escape(day)}</summary>"
        f"{table([*run.provenance.items(), ('run', run.run_id)])}{taken}{data_list_html(run)}</details>"
    )


def data_list_html(run) -> str:
    """The chapter's closing list of data (HTML): every file of its run, linked for download, with its
    size and one line on what it holds, the host's speed, and how to record a run of one's own."""
    import html

    names = ["meta.json", *sorted(run.meta["files"])]
    rows = []
    for name in names:
        path = run.path / name
        size = path.stat().st_size
        size = f"{size / 1e6:.1f} MB" if size >= 1e5 else f"{size / 1e3:.0f} kB"
        href = f"../runs/{run.chapter}/{run.run_id}/{name}"
        what = describe(run.declaration, name) or "(not described)"
        # A trace also opens in Perfetto from the page (book/_static/perfetto.js).
        opens = f"<br>{glue.perfetto_link(href, f'{name} ({run.chapter}, run {run.run_id})')}" if is_trace(name) else ""
        rows.append(
            f'<tr><td><a href="{html.escape(href)}" download><code>{html.escape(name)}</code></a>{opens}</td>'
            f"<td>{size}</td><td>{html.escape(what)}</td></tr>"
        )
    return (
        f"<p>Run <code>{html.escape(run.run_id)}</code> of <code>{html.escape(run.chapter)}</code>; "
        "CSV tables open in any spreadsheet, traces in <a href='https://ui.perfetto.dev'>Perfetto</a> "
        "(<em>Open in Perfetto</em> hands the served trace to a Perfetto window in your browser).</p>"
        '<table class="data-files"><thead><tr><th>file</th><th>size</th><th>what it holds</th></tr></thead>'
        f"<tbody>{''.join(rows)}</tbody></table>"
        f"<p>{html.escape(host_text(run))}</p>"
        "<p>To record a run of your own, on your GPU: download this page's notebook (the download button at "
        "the top of the page), install what <a href='../book/run_it_yourself.html'>Run a chapter yourself</a> "
        'lists, and run the notebook with <code>mode = "live"</code>.</p>'
    )


def host_reference_ms(run) -> float | None:
    """The host's best speed seen on this GPU: the quickest host-probe reading of any published
    run recorded on the same GPU (None when none has a probe). A run whose typical reading is
    well above it was recorded while the host was slower than it can be."""
    from labsupport import runs
    from labsupport.measure import hostprobe

    best = []
    try:
        published = runs.published()
    except runs.RunError:
        published = {}
    for slug, rid in {**published, run.chapter: run.run_id}.items():
        try:
            other = run if (slug, rid) == (run.chapter, run.run_id) else runs.open_run(slug, rid, verify=False)
        except runs.RunError:
            continue
        if other.provenance.get("gpu") != run.provenance.get("gpu"):
            continue
        h = hostprobe.assess(other.results.get("host_probe", []))
        if h is not None:
            best.append(h.best_ms)
    return min(best) if best else None


def _host_speed(run):
    from labsupport.measure import hostprobe

    return hostprobe.assess(
        run.results.get("host_probe", []),
        reference_ms=host_reference_ms(run),
        reference_what="the host's best reading on this GPU",
    )


# The columns every table of host-timed trials has (harness.Timing.rows); the others name what was
# measured (a variant, a batch size, a context), one measurement per combination.
TRIAL_COLUMNS = ("repeat", "round", "wall_ms", "issue_ms", "gpu_ms", "clean", "probe_ms")


def trial_tables(run) -> dict:
    """The run's tables of host-timed trials (those whose trials carry a `probe_ms` reading), by file name."""
    out = {}
    for name in sorted(run.meta["files"]):
        if name.endswith(".csv") and not is_derived(name):
            t = run.table(name.removesuffix(".csv"))
            if "probe_ms" in t and t.probe_ms.notna().any():
                out[name] = t[t.probe_ms.notna()]
    return out


def slow_tables(run) -> str:
    """The measurements (a table's rows of one variant, batch size, context, ...) of at least
    MIN_FAST_TRIALS trials of which fewer than MIN_FAST_TRIALS were taken within FAST_HOST of the
    quickest trial reading anywhere in the run, said in words by table ("" when none): each was taken
    wholly in the host's slow mode, though the host was faster in the same run. (Runs recorded before
    the harness judged a measurement by the run's best judged it by its own, and counted such trials
    as fast. A run recorded since has the harness's own verdict, results["host_slow"], and gets "".)"""
    from labsupport.measure import harness

    if harness.judged_by_run_best(getattr(run, "results", {})):
        return ""
    tables = trial_tables(run)
    if not tables:
        return ""
    best = min(float(t.probe_ms.min()) for t in tables.values())
    said = []
    for name, t in tables.items():
        keys = [c for c in t.columns if c not in TRIAL_COLUMNS]
        groups = [g for _, g in t.groupby(keys, sort=False)] if keys else [t]
        judged = [g for g in groups if len(g) >= harness.MIN_FAST_TRIALS]
        slow = [g for g in judged if (g.probe_ms <= best * harness.FAST_HOST).sum() < harness.MIN_FAST_TRIALS]
        if len(judged) == 1 and slow:
            said.append(name)
        elif slow:
            share = "all" if len(slow) == len(judged) else f"{len(slow)} of its"
            said.append(f"{name} ({share} {len(judged)} measurements)")
    if not said:
        return ""
    listed = " and ".join(filter(None, (", ".join(said[:-1]), said[-1])))
    return (
        f"the trials of {listed} were taken while the host probe read well above its quickest trial reading in "
        f"the run, {best:.2f} ms"
    )


def slow_why(run, h, tables: str | None = None) -> str:
    """Why the run counts as taken on a slow host ("" when it does not). A run that records its
    slow-host measurements (results["host_slow"], harness.interleaved) is slow when one of them kept
    too few fast-host trials, when a table of its trials was taken wholly on a slow host while the host
    was faster elsewhere in the run (slow_tables), or when even its quickest probe reading was well
    above the host's best on this GPU; an older run by its probe readings alone (hostprobe.assess).
    `tables`: slow_tables(run), where the caller has it already."""
    from labsupport.measure import harness, hostprobe

    notes = run.results.get("host_slow")
    if notes is None:
        return h.why if h.slow else ""
    why = []
    if notes:
        what = ", ".join(sorted({str(n.get("what", "")) for n in notes}))
        why.append(
            f"{len(notes)} of its measurements ({what}) kept fewer than {harness.MIN_FAST_TRIALS} trials on a "
            "fast host after waiting and retrying"
        )
    tables = slow_tables(run) if tables is None else tables
    if tables:
        why.append(tables)
    if h.reference_ms and h.best_ms >= hostprobe.SLOW * h.reference_ms:
        why.append(f"even its quickest probe reading was {h.best_ms / h.reference_ms:.2f}x the host's best on this GPU")
    return "; ".join(why)


def host_text(run) -> str:
    """One sentence on the host's speed while the run was recorded, from its host probe
    (labsupport.measure.hostprobe), against the best speed the probe saw in any published run on
    this GPU: the readings' range, and whether the host was slow."""
    h = _host_speed(run)
    if h is None:
        return "This run was recorded before the host probe existed: the host's speed at the time is not known."
    text = (
        f"Host probe (a fixed CPU workload, {h.readings} readings while the run was recorded): "
        f"{h.best_ms:.2f} to {h.worst_ms:.2f} ms, typically {h.median_ms:.2f} ms"
        + (f", against {h.reference_ms:.2f} ms at the host's best on this GPU." if h.reference_ms else ".")
    )
    why = slow_why(run, h)
    if why:
        return text + f" The host was slower than usual during this run: {why}."
    if "host_slow" in run.results:
        return text + " Its host-timed numbers come from trials taken while the host was at its fast speed."
    return text + " The host held its speed through the run."


def host_banner(run):
    """A warning for the top of a chapter whose run was recorded on a slow host (nothing when the
    host held its speed): its host-timed numbers are then higher than the host's best."""
    import html

    from IPython.display import HTML

    h = _host_speed(run)
    tables = slow_tables(run) if h is not None and "host_slow" in run.results else ""
    why = slow_why(run, h, tables) if h is not None else ""
    if not why:
        return HTML("")
    if "host_slow" not in run.results:
        how = "are reported by their minimum, which a slow phase raises least"
    elif tables:  # judged by their own best reading, which was a slow one
        how = (
            "are reported by the median of the trials taken while the host was at its fastest during each "
            "measurement, which for the measurements named was its slow speed"
        )
    else:
        how = "are reported by the median of the trials taken while the host was at its fastest in the run"
    return HTML(
        '<div class="admonition warning"><p class="admonition-title">A slow host</p><p>'
        + html.escape(
            f"While this run was recorded the host was slower than usual ({why}). Host-timed numbers on "
            f"this page (wall times of eager steps, launch calls) {how}, but may still be higher than on a "
            "quiet host; GPU times are not affected."
        )
        + "</p></div>"
    )
