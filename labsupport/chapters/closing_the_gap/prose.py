"""The page's sentences that depend on the run: which rungs failed or chose another token, the
tolerances, the FP8 rungs against their own floor, several tokens per forward, the matmuls shape by
shape and how they were launched, what torch.compile did to them, the compile times and the
overlap of dependent launches. Each returns Markdown the page glues; the rest of the prose is in
the notebook's markdown."""

from __future__ import annotations

import pandas as pd

from labsupport import runs
from labsupport.chapters.closing_the_gap.analysis import Floor, fp8_error_factor, kernel_table, overlaps
from labsupport.chapters.closing_the_gap.params import (
    ERROR_FACTOR,
    FP8_RUNGS,
    OWN_OPTIONS,
    RUNG_SHORT,
    RUNGS,
    built_on,
    trace_file,
)
from labsupport.measure import hardware, models


def rung_names(rungs) -> str:
    """Rungs by their short names, in Markdown italics: "*a*", "*a* and *b*", "*a*, *b* and *c*"."""
    n = [f"*{RUNG_SHORT.get(r, r)}*" for r in rungs]
    return " and ".join(filter(None, (", ".join(n[:-1]), n[-1]))) if n else ""


def failed_text(ladder: pd.DataFrame) -> str:
    """Every rung has numbers, or which have none and why (ladder(): one row per rung)."""
    failed = ladder[ladder.status != "ok"]
    if failed.empty:
        return "Every rung has numbers."
    by_reason = failed.groupby("status", sort=False).rung.agg(list)  # the rungs of one reason named together
    said = [f"{rung_names(rungs)}: {why}" for why, rungs in by_reason.items()]
    return "Not every rung has numbers: " + "; ".join(said) + "."


def eager_error(run: runs.Run) -> float:
    """Eager's own largest logit error against float32 in this run: the yardstick of every check."""
    return float(run.table("rungs").set_index("rung").loc["eager", "eager_abs_err"])


def check_note(run: runs.Run) -> str:
    """The rungs that chose eager's token but failed the check on their logit error (Markdown; empty
    when none did): each error against float32 and its multiple of eager's own beside the bound, so
    that a "no" in the table comes with its size. Where the first call passed and a later call of the
    same step failed (repeated_fidelity), that is said with the worst call's error. The rungs of
    another token are token_note's."""
    r = run.table("rungs")
    eager_err = eager_error(run)
    bad = r[(r.status == "ok") & r.same_token.astype(str).eq("True") & ~r.passed.astype(str).eq("True")]
    if bad.empty:
        return ""
    each = []
    for x in bad.to_dict("records"):
        bound = fp8_error_factor(run) if x["rung"] in FP8_RUNGS else ERROR_FACTOR
        failed = x.get("replays_failed")
        failed = int(failed) if pd.notna(failed) else 0  # a run before the replays: none
        worst = x["replay_max_abs_err"] if failed else x["max_abs_err"]  # the worst call's, the first included
        later = f" on {failed} of its {int(x['replays'])} later calls" if failed else ""
        each.append(
            f"*{RUNG_SHORT.get(x['rung'], x['rung'])}* {worst:.3f}{later}, {worst / eager_err:.2f} times eager's own "
            f"(bound: {bound:g} times)"
        )
    who = "These rungs chose eager's token, but their" if len(each) > 1 else "This rung chose eager's token, but its"
    return f"Not every rung passed in this run. {who} largest logit error against float32 was past the bound: " + (
        "; ".join(each) + "."
    )


def atomic_adders(run: runs.Run) -> dict[str, list[str]]:
    """Our rungs whose step adds floats by atomics, each with what it adds so: x's sum of squares from
    the folded norms on, and a split-K GEMV's partial sums in a rung that allows split-K where this
    run's tuner kept a split-K config (gemv_tuning.csv; a run without that table: none)."""
    split = False
    if "gemv_tuning.csv" in run.meta["files"]:
        t = run.table("gemv_tuning")
        kept = t[[c for c in ("chosen_split", "chosen_early") if c in t]].astype(str).eq("True").any(axis=1)
        split = bool(((t.split_k > 1) & kept).any())
    out = {}
    for rung, opts in OWN_OPTIONS.items():
        what = ["x's sum of squares, the folded norms'"] if opts.get("fold_norms") else []
        what += ["a split-K GEMV's partial sums"] if split and opts.get("split_k") else []
        if what:
            out[rung] = what
    return out


def repeat_note(run: runs.Run) -> str:
    """Whether each of our rungs gave the same logits, bit for bit, on every call of its step after the
    check (Markdown; empty for a run recorded before it called them again). Calls differ where floats
    are added by atomics in an order that changes from call to call (atomic_adders); a rung that adds
    none and still differs has a kernel reading memory that another still writes, and is named apart."""
    r = run.table("rungs")
    if "replays_differing" not in r:
        return ""
    ours = r[(r.status == "ok") & (r.replays.fillna(0) > 0)]
    if ours.empty:
        return ""
    n = int(ours.replays.max())
    text = f"After its check each of our rungs was called {n} more times, the same step on the same buffers"
    differ = ours[ours.replays_differing > 0]
    if differ.empty:
        return text + ": every call gave its first call's logits, bit for bit."
    counts = ", ".join(f"*{RUNG_SHORT.get(x.rung, x.rung)}* {int(x.replays_differing)}" for x in differ.itertuples())
    adders = atomic_adders(run)
    atomics = differ.rung.isin(list(adders))
    text += f". Calls of {n} that gave other logits than the first: {counts}"
    if atomics.all():
        what = " and ".join(dict.fromkeys(what for rung in differ.rung for what in adders[rung]))
        text += (
            "; every other rung gave the same bit for bit. Each of these adds floats by atomics from many programs "
            f"({what}), and floats added in another order round differently."
        )
    else:
        text += (
            f". Of these, {rung_names(differ.rung[~atomics])} adds no floats by atomics, so a kernel of its step "
            "reads memory that another still writes; every rung not named gave the same logits bit for bit."
        )
    # each against its own bound: an FP8 rung's weights round more, and it is allowed more
    fp8, worst = differ.rung.isin(FP8_RUNGS), []
    if (~fp8).any():
        worst.append(f"{differ[~fp8].replay_max_abs_err.max():.3f}" + (" for the BF16 rungs" if fp8.any() else ""))
    if fp8.any():
        whose = "the FP8 rungs" if fp8.sum() > 1 else "the FP8 rung"
        worst.append(
            f"{differ[fp8].replay_max_abs_err.max():.3f} for {whose} (allowed {fp8_error_factor(run):g} times "
            "eager's error: its weights are rounded to 8 bits)"
        )
    said = " and ".join(worst)
    return (
        text
        + f" The largest error against float32 over all their calls was {said}, eager's own {eager_error(run):.3f}."
    )


def token_note(run: runs.Run) -> str:
    """What the rungs whose greedy token is not eager's mean (Markdown; empty when every rung
    chose eager's). Random weights make the top logits close, so two tokens can be a near tie
    that BF16's rounding alone swaps: a run records, per rung, how far apart the float32 step
    puts the two tokens (`tie_gap`); an older run did not, and cannot tell a tie from a fault."""
    r = run.table("rungs")
    r = r[(r.status == "ok") & ~r.same_token.astype(str).eq("True")]
    if r.empty:
        return ""
    eager_err = eager_error(run)
    text = f"{rung_names(r.rung)} chose another greedy token than eager. "
    if "tie_gap" not in r or r.tie_gap.isna().all():
        return text + (
            "This run did not record how far apart the float32 step puts the two tokens (runs recorded since do: "
            "the column `tie_gap`), so it cannot tell a near tie, which BF16's rounding alone can swap, from a "
            f"fault; the rule counts them as failed. Their largest error against float32 was "
            f"{r.max_abs_err.max():.3f}, eager's own {eager_err:.3f}, and their logits' cosine with eager's "
            f"{r.cosine.min():.4f}: the numbers of a correct step, but the rule does not pass a rung on them."
        )
    half = models.dtype_label(models.run_dtype(run))
    ties = r[r.tie_gap <= eager_err]
    if len(ties):
        text += (
            f"For {rung_names(ties.rung)} float32 puts the two tokens {ties.tie_gap.max():.3f} apart at most, less "
            f"than eager's own error ({eager_err:.3f}): a near tie that {half}'s rounding alone can swap, which the "
            "rule passes when the error is within its bound. "
        )
    far = r[r.tie_gap > eager_err]
    within = far[far.tie_gap <= far.max_abs_err]  # past eager's error (the near-tie bound), within the rung's own

    def apart(rows: pd.DataFrame) -> tuple[str, str, bool]:
        # the opening the rungs of `rows` share, their own errors in words, and whether they are several
        many = len(rows) > 1
        errors = " and ".join(f"{e:.3f}" for e in rows.max_abs_err)
        opening = (
            f"For {rung_names(rows.rung)} float32 puts the two tokens {rows.tie_gap.max():.3f} apart at most: more "
            f"than eager's own error ({eager_err:.3f})"
        )
        whose = "rungs' own errors" if many else "rung's own error"
        return opening, f"{whose} ({errors})", many

    # A rung of coarser weights (FP8) rounds more than eager: a gap within its own error is a tie at its precision.
    own = within[within.rung.isin(FP8_RUNGS)]
    if len(own):
        opening, errors, many = apart(own)
        text += (
            f"{opening}, so {half}'s rounding cannot swap them, but less than the FP8 {errors}, so rounding the "
            "weights to 8 bits can. Random weights put the top logits close together; the rule (eager's token, or a "
            f"near tie within eager's error) fails {'them' if many else 'the rung'}, and a run on random weights "
            "cannot tell this from a fault. "
        )
    # A BF16 rung sums in another order than eager: a gap past eager's error but within the rung's own is no fault
    # that the run can show, though the rule (whose bound is eager's error) fails it.
    bf16 = within[~within.rung.isin(FP8_RUNGS)]
    if len(bf16):
        opening, errors, many = apart(bf16)
        text += (
            f"{opening}, the bound of a near tie, but less than the {errors}, so {'their' if many else 'its'} "
            f"rounding, in another order than eager's, can swap them. The rule fails {'them' if many else 'the rung'}, "
            "and a run on random weights cannot tell this from a fault. "
        )
    beyond = far[far.tie_gap > far.max_abs_err]
    if len(beyond):
        text += (
            f"For {rung_names(beyond.rung)} float32 puts the two tokens further apart than the rung's own error: no "
            "rounding explains it, and the rung fails."
        )
    return text.strip()


def tolerance_text() -> str:
    return f"{ERROR_FACTOR:g} times eager's own"


def fp8_tolerance_text(run: runs.Run | None = None) -> str:
    return f"{fp8_error_factor(run):g} times eager's own"


def overlap_text(run: runs.Run, rung: str = "pdl", without: str = "split-k") -> str:
    """What the trace of the dependent-launch rung shows (Markdown): how many kernels overlap the
    one before them, against the same kernels launched without it (rung `without`)."""
    o = overlaps(kernel_table(run, rung))
    text = (
        f"With programmatic dependent launch (rung {RUNG_SHORT[rung].split()[0]}) {o['overlapping']:,} of its "
        f"{o['kernels']:,} kernels started before the kernel before them had ended ({o['overlap_us']:,.0f} µs "
        "shared in all)"
    )
    if without in set(run.table("rungs").query("status == 'ok'").rung) and trace_file(without) in run.meta["files"]:
        o0 = overlaps(kernel_table(run, without))
        text += (
            f", against {o0['overlapping']:,} of {o0['kernels']:,} for the same kernels launched without it "
            f"(rung {RUNG_SHORT[without].split()[0]})"
        )
    return text + (
        ". A kernel launched this way starts early and waits (`gdc_wait`) for the one before it, and the trace counts "
        "the wait in its duration, so its rate by that duration (*TB/s*) reads low; by exclusive time, which leaves "
        "the wait out, the rates are those the kernels streamed at (*TB/s exclusive*)."
    )


def fp8_rounding_text(run: runs.Run) -> str:
    """How far rounding to FP8 moved this run's weights (measured on them when recorded)."""
    rounding = (run.results.get("fp8") or {}).get("rounding_error")
    if not rounding:
        return (
            "This run did not measure the rounding error on its weights (runs recorded since keep it in meta.json: "
            "`fp8.rounding_error`)."
        )
    return (
        f"Measured on this run's weights (every matrix rounded as the FP8 rungs store it), rounding moved a weight by "
        f"{rounding['mean']:.2%} of itself on average and by {rounding['max_normal']:.1%} at most within the normal "
        f"range; {rounding['subnormal_share']:.3%} of the weights lie below it, in E4M3's subnormals, and lose more "
        f"(up to {rounding['max']:.0%})."
    )


def fp8_text(run: runs.Run, rung: str, fp8: pd.Series, fp8_floor: Floor, best: pd.Series) -> str:
    """The best FP8 rung (`rung`, analysis.best_fp8) against its own floor, beside the best BF16 rung
    (`fp8`, `best`: their ladder rows), with its error and the book's verdict (a greedy token that is
    not eager's is said once, in *Same answers*: token_note)."""
    fidelity = run.table("rungs").set_index("rung").loc[rung]
    passed = str(fidelity.passed) == "True"
    verdict = "gives the same answer." if passed else "does not give the same answer."
    passing = "the fastest FP8 rung that gives eager's answers" if passed else "the fastest FP8 rung (none passes)"
    return (
        f"*{RUNGS[rung]}*, {passing}, reads {fp8_floor.decode_bytes / 1e9:.2f} GB, a floor of "
        f"{fp8_floor.floor_ms:.2f} ms, and took "
        f"{fp8.ms:.2f} ms ({fp8['x floor']:.2f}× its floor, {fp8['TB/s']:.2f} TB/s), against {best.ms:.2f} ms for "
        f"the best BF16 rung. Its largest logit error against float32 was "
        f"{fidelity.max_abs_err / fidelity.eager_abs_err:.1f} times eager's (allowed: {fp8_error_factor(run):g}): "
        f"by the book's rule (*Same answers* above) it {verdict}"
    )


# Each FP8 rung after the first, the FP8 rung it is built on, and what it changes (fp8_launch_text).
FP8_CHANGES = (
    ("fp8-pdl", "fp8-weights", "dependent launch, each GEMV's weights loaded before its wait and attention in one "
     "kernel"),
    ("fp8-folded", "fp8-pdl", "rung 14's folded norms and argmax"),
)  # fmt: skip


def fp8_launch_text(ladder: pd.DataFrame) -> str:
    """What each FP8 rung after the first changed against the FP8 rung it is built on (FP8_CHANGES),
    each against its own floor (Markdown; ladder(): one row per rung): a sentence a pair, none where
    neither has numbers, and why where one has none."""
    d = ladder.set_index("rung")
    said = []
    for rung, before, what in FP8_CHANGES:
        has = {r: d.status.get(r) == "ok" and d.ms.get(r) == d.ms.get(r) for r in (before, rung)}
        number = {r: RUNG_SHORT[r].split()[0] for r in (before, rung)}
        if not any(has.values()):
            continue
        if not all(has.values()):
            missing = next(r for r, ok in has.items() if not ok)
            said.append(f"Rung {number[missing]} has no numbers here: {d.status.get(missing)}.")
            continue
        a, b = d.loc[before], d.loc[rung]
        saved = a.ms - b.ms
        change = f"took {saved:.2f} ms off" if saved >= 0 else f"added {-saved:.2f} ms to"
        said.append(
            f"Rung {number[rung]} took {b.ms:.2f} ms ({b['x floor']:.2f}× its floor, {b['TB/s']:.2f} TB/s) against "
            f"rung {number[before]}'s {a.ms:.2f} ms ({a['x floor']:.2f}×): {what} {change} the FP8 step."
        )
    return " ".join(dict.fromkeys(said))  # a rung without numbers is said once


def tokens_text(measured: pd.DataFrame | None) -> str:
    """What one forward on several tokens costs (tokens_per_forward(), its rows that ran; None: not measured)."""
    if measured is None or measured.empty:
        return "this run has no such measurement (it was recorded before it)."
    one, top = measured.iloc[0], measured.iloc[-1]
    return (
        f"one token took {one.ms_min:.2f} ms per forward, {int(top.tokens)} tokens {top.ms_min:.2f} ms: "
        f"{top['ms per token']:.3f} ms per token, {top['token x floor']:.2f}× the floor of one forward. The time per "
        "forward grows far slower than the tokens, because the weights dominate the bytes; it grows at all because "
        "more tokens mean more attention over the cache and more arithmetic per weight read."
    )


def matmul_text(shapes: pd.DataFrame | None, tuned: pd.DataFrame | None, floor: Floor) -> str:
    """cuBLAS against our GEMV shape by shape (matmuls()), with how many configurations the tuner
    tried (tuning()), against the datasheet and the practical ceiling."""
    if shapes is None:
        return "This run timed no matmuls shape by shape (a run on a CPU cannot)."
    tuned = tuned[~tuned.persistent]  # the rungs' one GEMV kernel (the persistent rung's form is its own)
    winners = tuned[tuned.chosen]
    tried = int(tuned.groupby(["n", "k", "fusion", "weights", "early"]).size().max())  # each launched one way
    slowest = shapes.loc[shapes.cublas_tbs.idxmin()]
    small, top = shapes.loc[shapes.triton_tbs.idxmin()], shapes.loc[shapes.triton_tbs.idxmax()]
    text = (
        f"cuBLAS read between {shapes.cublas_tbs.min():.2f} and {shapes.cublas_tbs.max():.2f} TB/s across the shapes, "
        f"slowest on `{slowest.matrix}` ({slowest.cublas_us:.1f} µs for {slowest.bytes / 1e6:,.0f} MB); our GEMV "
        f"between {shapes.triton_tbs.min():.2f} and {shapes.triton_tbs.max():.2f} TB/s, having tried up to {tried} "
        f"configurations on each of {len(winners)} cases (shape and fusion). Not every shape gets close: the "
        f"smallest matrix, `{small.matrix}` ({small.bytes / 1e6:,.0f} MB), is read in "
        f"{small.triton_us:.1f} µs by ours, {small.triton_tbs:.2f} TB/s"
    )
    if floor.datasheet_tbs:
        text += f" ({small.triton_tbs / floor.datasheet_tbs:.0%} of the datasheet's {floor.datasheet_tbs:.2f} TB/s)"
    text += (
        ": a kernel that short spends much of its time starting up and draining, and the larger shapes "
        f"do better, up to {top.triton_tbs:.2f} TB/s on `{top.matrix}`."
    )
    if floor.ceiling_tbs and top.triton_tbs > floor.ceiling_tbs:
        over = top.triton_tbs / floor.ceiling_tbs - 1
        text += (
            f" That is above the practical ceiling, {floor.ceiling_tbs:.2f} TB/s, the best read rate *Why a GPU*'s run "
        )
        if over <= hardware.CEILING_TOLERANCE:  # the same kernel timed on two nights
            by = f"{over:.1%}" if over >= 0.001 else "less than 0.1%"
            text += f"recorded, by {by}: within the run-to-run noise of one kernel timed twice."
        else:
            text += "recorded: that run timed no kernel at this rate."
    if floor.datasheet_tbs:
        share = top.triton_tbs / floor.datasheet_tbs
        text += (
            f" It stays below the datasheet's {floor.datasheet_tbs:.2f} TB/s ({share:.0%}), the limit no kernel beats."
        )
    return text


def launch_text(run: runs.Run, theirs: pd.DataFrame | None, ours: pd.DataFrame | None) -> str:
    """How cuBLAS's matmul kernels and our GEMV were launched (matmul_launches() of the last cuBLAS
    rung and of the first with ours; None: the run cannot compare them)."""
    if theirs is None or ours is None:
        return "This run has no launch shapes to compare (it ran on a CPU, or without both rungs)."
    # the weight matmuls: attention's two batched products per layer are the short ones (under 5 µs)
    cublas = theirs[~theirs.kernel.str.contains("splitKreduce") & (theirs["µs"] >= 5)]
    reduce_kernels = int(theirs[theirs.kernel.str.contains("splitKreduce")].kernels.sum())
    gemv_rows = ours[ours.kernel == "gemv_kernel"]

    def span(values: pd.Series) -> str:  # "a", or "a–b" where they differ
        lo, hi = int(values.min()), int(values.max())
        return f"{lo:,}" if lo == hi else f"{lo:,}–{hi:,}"

    return (
        f"cuBLAS ran the weight matmuls (the two kernels under 5 µs per layer are attention's batched products) "
        f"with {span(cublas.blocks)} thread blocks of "
        f"{span(cublas.threads)} threads, each holding {cublas['shared KB'].min():.0f} KB or more of shared memory "
        "(its pipeline of weight tiles), so one block fits on an SM (a Hopper SM has 228 KB) and a matmul uses at "
        f"most {cublas.blocks.max():,} of the GPU's {run.provenance['gpu_sms']} SMs; its split-K matmuls add a "
        f"reduction kernel after them ({reduce_kernels} in the step). Our GEMV runs {span(gemv_rows.blocks)} "
        f"programs of {span(gemv_rows.threads)} threads with "
        f"{gemv_rows['shared KB'].max():.0f} KB of shared memory: several on every SM at once, each "
        "streaming a few rows, so that every SM keeps loads in flight."
    )


def compile_matmul_text(lo_run: runs.Run, reduce_overhead: dict | None, autotune: dict | None) -> str:
    """What torch.compile did to the matmuls in each mode (compiled_matmuls() of *Launch overhead*'s run)."""
    if not (reduce_overhead and autotune):
        return (
            f"(*Launch overhead*'s run `{lo_run.run_id}` has no profile of both compiled modes to count their matmuls.)"
        )
    ro, at = reduce_overhead, autotune
    return (
        f'In mode "reduce-overhead" (rung 3) it fuses the elementwise work around the matmuls (norms, rotary '
        f"embedding, SiLU × up, residual adds) into generated Triton kernels and leaves the matmuls to the "
        f"library: {ro['library']:,} of the {ro['kernels']:,} matrix-multiply kernels of its profiled step are library "
        'kernels (cuBLAS, CUTLASS). In mode "max-autotune" (rung 4) it also writes the matmuls itself: '
        f"{at['generated']:,} of the "
        f"{at['kernels']:,} matrix-multiply kernels of its step are Triton kernels Inductor generated (names "
        f"`triton_red_fused_..._mm_...`), {at['fused']:,} of them with other operations fused in (their names "
        f"list an `add`, the `mean` of a norm or a `silu`), and {at['library']:,} are library kernels; the matmuls "
        f"took {at['gpu_ms']:.2f} ms of GPU time there, "
        f"against {ro['gpu_ms']:.2f} ms in reduce-overhead (run `{lo_run.run_id}`)."
    )


def compile_text(run: runs.Run, ladder: pd.DataFrame) -> str:
    """How long compiling and warming each of our rungs took, and tuning our GEMV."""
    times = [
        f"{RUNG_SHORT[r.rung]} {r['compile s']:.1f} s" for _, r in ladder.iterrows() if r["compile s"] == r["compile s"]
    ]
    tuned = run.results.get("tuning_s") or {}
    what = {"bf16": "BF16, with split-K", "fp8": "FP8", "persistent": "persistent"}
    parts = [f"{tuned[k]:.0f} s ({label})" for k, label in what.items() if k in tuned]
    tuning = (
        f" Tuning our GEMV took {', '.join(parts[:-1])}{' and ' if len(parts) > 1 else ''}{parts[-1]}." if parts else ""
    )
    attention = (
        attention_tuning_text(run)
        + layer_tuning_text(run)
        + folded_tilings_text(run)
        + folded_tilings_text(run, fp8=True)
    )
    return "Compiling and warming each of our rungs took: " + ", ".join(times) + "." + tuning + attention


def attention_tuning_text(run: runs.Run) -> str:
    """What the one-kernel attention took a call with the config the run kept (rungs 13 on run it),
    and the range over every config it tried, where the run tuned it (results["attention_tuning"]).
    Runs tuned before warps and forms were tuned ran 4 warps, a group's heads together."""
    rows = run.results.get("attention_tuning") or []
    if not rows:
        return ""
    kept = next((r for r in rows if r.get("chosen")), min(rows, key=lambda r: r["us"]))
    heads = attention_form(kept)
    times = [r["us"] for r in rows if r.get("status", "ok") == "ok"]
    failed = len(rows) - len(times)
    return (
        f" One call of the one-kernel attention took {kept['us']:.1f} µs with {kept['block_s']} positions per "
        f"program ({kept['programs']} programs of {kept.get('num_warps', 4)} warps, {heads}): the fastest of "
        f"{len(rows)} configs tried, which took {min(times):.1f} to {max(times):.1f} µs"
        + (f" ({failed} did not run here)." if failed else ".")
    )


def attention_form(row: dict) -> str:
    """How a config of the one-kernel attention splits the work, in words: a program per query head
    (`per_head`), those of a head one thread-block cluster in CUDA C++ (`cluster`), or per K/V head
    with its query heads in one product (runs before the per-head form was tried have `grouped`
    instead, False for one query head after another in that program)."""
    if row.get("cluster"):
        return (
            "one program per query head, a head's programs one thread-block cluster that combines their "
            "partials in shared memory, in CUDA C++ since Triton cannot address another block's shared memory"
        )
    if row.get("per_head"):
        return "one program per query head"
    return "its query heads together" if row.get("grouped", True) else "one query head after another"


def layer_tuning_text(run: runs.Run) -> str:
    """What one layer took in the layer kernel with each config tried (the one-kernel-a-layer rung
    runs the fastest), where the run tuned it (results["layer_tuning"])."""
    rows = run.results.get("layer_tuning") or []
    if not rows:
        return ""
    each = [
        f"{r['ctas_per_sm']} program{'s' if r['ctas_per_sm'] > 1 else ''} of {r['num_warps']} warps per SM, "
        f"{r['block_n']} rows of {r['block_k']:,} at a time: "
        + (f"{r['us']:.1f} µs" + (", kept" if r.get("chosen") else "") if r["status"] == "ok" else r["status"])
        for r in rows
    ]
    return " One layer in the layer kernel took, by its config: " + "; ".join(each) + "."


def folded_tilings_text(run: runs.Run, fp8: bool = False) -> str:
    """Which tilings the folded-norms rung runs (with `fp8`, the FP8 folded rung), where the run settled
    them in the whole step (results["folded_tilings"] or ["fp8_folded_tilings"], tilings.settle_folded_tilings):
    each pair of QKV and gate/up tilings tried, and the step with every GEMV on one tiling (`every`), with
    the step's median time."""
    rows = run.results.get("fp8_folded_tilings" if fp8 else "folded_tilings") or []
    if not rows:
        return ""
    step = "FP8 folded step" if fp8 else "folded-norms step"

    def tiling(c: dict) -> str:
        if not fp8:
            return f"{c['block_n']} rows of {c['block_k']:,}"
        each = ", an accumulator a weight" if c.get("chunk") == 1 else ""
        return f"{c['block_n']} rows of {c['block_k']:,} ({c['num_warps']} warps{each})"

    def warps(c: dict) -> str:
        return f"{tiling(c)} with {c['num_warps']} warps"

    def what(r: dict) -> str:
        return (
            f"every GEMV {warps(r['qkv'])}"
            if r.get("every")
            else f"QKV {tiling(r['qkv'])} and gate/up {tiling(r['gate_up'])}"
        )

    each = [
        f"{what(r)}: "
        + (f"{r['ms_median']:.3f} ms" if "ms_median" in r else "not timed (its answers failed the check)")
        + (" (the tuner's picks)" if r.get("tuned") else "")
        + (", kept" if r.get("chosen") else "")
        for r in rows
    ]
    pairs = [r for r in rows if not r.get("every")]
    one = next((r for r in rows if r.get("every")), None)
    every = f"every GEMV on one tiling, {warps(one['qkv'])}" if one is not None else ""
    timed = " and timed whole (the median of its CUDA events): " + "; ".join(each) + "."
    if len(pairs) > 1:
        alone = "FP8 QKV's or gate/up's" if fp8 else "folded QKV's or gate/up's"
        return (
            f" Timed alone, the {alone} two fastest tilings were within "
            f"{100 * rows[0]['within']:g}% of each other, so the {step} was built with each pair"
            + (f", and once with {every}," if one is not None else "") + timed
        )  # fmt: skip
    return f" The {step} was built with the tuner's picks and with {every}," + timed


def costlier_text(costlier: pd.DataFrame, timed=()) -> str:
    """The rungs that cost time on this GPU instead of saving it (kernel_time.costlier_rungs), each
    with the part of the step where its exclusive kernel time grew most, and those of the `timed`
    rungs built on them; "" where every rung paid."""
    if costlier.empty:
        return ""
    each = [
        f"*{RUNG_SHORT[r['rung']]}* took {r['ms']:.2f} ms against {r['before ms']:.2f} for "
        f"*{RUNG_SHORT[r['before']]}*, the rung it is built on (grew most: its {r['part']} kernels' exclusive time, "
        f"{r['part µs']:,.0f} µs a step against {r['before part µs']:,.0f})"
        for _, r in costlier.iterrows()
    ]
    slower = set(costlier.rung)
    carried = [x for x in RUNGS if x in set(timed) and x not in slower and set(_ancestors(x)) & slower]
    also = rung_names(carried)
    carry = f" The rungs built on them carry that cost too: {also}." if also else ""
    return "Not every rung pays on this GPU: " + "; ".join(each) + "." + carry


def _ancestors(rung: str) -> list[str]:
    """The rungs `rung` is built on, nearest first (params.built_on, back to the first rung)."""
    chain = []
    while (rung := built_on(rung)) is not None:
        chain.append(rung)
    return chain
