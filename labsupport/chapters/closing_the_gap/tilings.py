"""The folded steps' GEMV tilings settled in the whole step: the tuner times each GEMV alone, and a
kernel between its neighbours in a PDL-launched step need not rank as it does alone. So the
folded-norms step (BF16) and the FP8 folded step are built with their QKV's and gate/up's fastest
tilings alone, each combination, checked and timed whole, and the fastest step keeps its tilings
where the rung built next reads them."""

from __future__ import annotations

from dataclasses import asdict

from labsupport.chapters.closing_the_gap.measuring import Reference, build, error_factor, fidelity, weight_shapes
from labsupport.chapters.closing_the_gap.params import (
    STEP_ONE_TILING,
    STEP_TIE,
    STEP_TIE_FP8,
    STEP_TIE_MOST,
    STEP_TIE_ROUNDS,
    progress,
)
from labsupport.measure import decode, steps


def folded_tie_cases(model) -> dict[str, tuple]:
    """The GEMVs whose tiling a folded step settles, by name: the folded QKV (plain: its norm is in
    the weights) and gate/up writing silu(gate) * up."""
    from labsupport.measure.kernels.gemv import PLAIN, Fusion

    s = weight_shapes(model)
    return {"qkv": (*s["qkv (fused)"], PLAIN), "gate_up": (*s["gate_up (fused)"], Fusion(silu=True))}


def folded_step_cases(model) -> dict[str, tuple]:
    """Every GEMV of a folded step, by name, each (N, K, Fusion) as that step launches it:
    folded_tie_cases, o_proj and down_proj adding the residual, and the LM head (plain)."""
    from labsupport.measure.kernels.gemv import PLAIN, Fusion

    s = weight_shapes(model)
    cases = folded_tie_cases(model)
    return {"qkv": cases["qkv"], "o_proj": (*s["o_proj"], Fusion(residual=True)), "gate_up": cases["gate_up"],
            "down": (*s["down_proj"], Fusion(residual=True)), "lm_head": (*s["lm_head"], PLAIN)}  # fmt: skip


def step_trials(trials, case, fp8: bool = False) -> list:
    """The trials of `case` (N, K, Fusion) timed as a folded step launches it (PDL, W's first tiles
    before the wait: gemv.Trial.early): BF16's (or FP16's), or with `fp8` FP8's."""
    return [t for t in trials if (t.n, t.k, t.fusion) == case and t.early and (t.weights == "fp8") == fp8]


def near_ties(trials, case, within: float = STEP_TIE, most: int = STEP_TIE_MOST, fp8: bool = False) -> list:
    """The trials of `case` (N, K, Fusion) timed as a folded step launches it (step_trials) within
    `within` of the fastest, fastest first, at most `most`; [] where none was timed so (no PDL on
    this GPU)."""
    mine = sorted(step_trials(trials, case, fp8), key=lambda t: t.us)
    return [t for t in mine if t.us <= mine[0].us * (1 + within)][:most]


def one_tiling(trials, cases: dict) -> dict | None:
    """STEP_ONE_TILING's BF16 trial of each of `cases` (by name), timed as the folded-norms step
    launches them (early); None where one of them was not timed so."""
    from labsupport.measure.kernels import gemv

    one = gemv.Config(*STEP_ONE_TILING)
    picks = {}
    for name, case in cases.items():
        mine = [t for t in step_trials(trials, case) if t.config == one]
        if not mine:
            return None
        picks[name] = mine[0]
    return picks


def step_config(case, fp8: bool):
    """What a folded step's GEMV of `case` runs unless told otherwise: the FP8 tuner's pick, or the
    folded-norms step's (CHOSEN_FOLDED, else CHOSEN_EARLY's)."""
    from labsupport.measure.kernels import gemv

    return gemv.choose(*case, fp8=True) if fp8 else gemv.choose(*case, early=True, folded=True)


def folded_tries(model, trials, fp8: bool = False) -> list[dict]:
    """The GEMV configs settle_folded_tilings builds a folded step with, each {name: trial}: each
    combination of the QKV's and gate/up's near ties (the other GEMVs running step_config), then for
    BF16 every GEMV on STEP_ONE_TILING (one_tiling), where it was timed and no combination already
    runs it on every GEMV; [] where the QKV or gate/up was not timed as the step launches it."""
    from itertools import product

    cases, every = folded_tie_cases(model), folded_step_cases(model)
    within = STEP_TIE_FP8 if fp8 else STEP_TIE
    ties = {name: near_ties(trials, case, within, fp8=fp8) for name, case in cases.items()}
    if any(not t for t in ties.values()):
        return []
    tries = [dict(zip(ties, picks, strict=True)) for picks in product(*ties.values())]
    one = None if fp8 else one_tiling(trials, every)

    def step_configs(pick: dict) -> dict:
        return {name: pick[name].config if name in pick else step_config(case, fp8) for name, case in every.items()}

    if one is not None and all(step_configs(pick) != step_configs(one) for pick in tries):
        tries.append(one)
    return tries


def tiling_label(c, fp8: bool) -> str:
    """A config as the run's rows name it: rows x columns, and for FP8 the warps and an accumulator a
    weight (chunk 1), which FP8's near ties may differ by alone."""
    if not fp8:
        return f"{c.block_n}x{c.block_k}"
    return f"{c.block_n}x{c.block_k} {c.num_warps}w" + (" chunk 1" if c.chunk == 1 else "")


def settle_folded_tilings(model, prompt: decode.Prompt, ref: Reference, device: str, trials, dtype: str,
                          rounds: int = STEP_TIE_ROUNDS, fp8: bool = False) -> list[dict]:  # fmt: skip
    """Build the folded-norms step (with `fp8`, the FP8 folded step) with each set of GEMV configs of
    folded_tries (the near-tied tilings of its QKV and gate/up, or the tuner's pair alone where nothing
    ties; for BF16 every GEMV on STEP_ONE_TILING), check each against eager, time those that pass
    interleaved (CUDA events on a GPU), and keep the fastest step's configs where the rung built next
    reads them: gemv.CHOSEN_FOLDED, marking `trials` chosen_folded (the config each GEMV of the step
    runs); with `fp8`, gemv.CHOSEN_FP8 for the QKV and gate/up (the FP8 folded step alone launches
    them so), marking those trials chosen. Timed alone, BF16's two tilings tie and the tuner's pick
    swung o_proj's and down's time in the step (STEP_TIE), one tiling on every GEMV beat the tuner's
    picks (STEP_ONE_TILING), and FP8's QKV kept a tiling 4% faster alone that was slower in the step
    (STEP_TIE_FP8): the step decides.
    One row per step built: the QKV's and gate/up's config and their times alone, whether every GEMV
    ran the one tiling (`every`), the tie's width (`within`), the step's times, the tuner's picks
    (`tuned`) and the one kept (`chosen`); [] where there is nothing to try (or no PDL here)."""
    from labsupport.measure import harness
    from labsupport.measure.kernels import gemv

    rung, table = ("fp8-folded", gemv.CHOSEN_FP8) if fp8 else ("folded-norms", gemv.CHOSEN_FOLDED)
    cases, every = folded_tie_cases(model), folded_step_cases(model)
    tries = folded_tries(model, trials, fp8)
    if len(tries) < 2:
        return []
    tuned = {name: (gemv.CHOSEN_FP8 if fp8 else gemv.CHOSEN_EARLY).get(case) for name, case in cases.items()}
    rows, variants, configs = {}, {}, {}
    for pick in tries:
        whole = len(pick) > len(cases)
        label = ", ".join(f"{name} {tiling_label(t.config, fp8)}" for name, t in pick.items() if name in cases)
        if whole:
            c = pick["qkv"].config
            label = f"every GEMV {c.block_n}x{c.block_k}, {c.num_warps} warps"
        row = {name: asdict(pick[name].config) for name in cases}
        row |= {f"{name}_us": pick[name].us for name in cases}
        row |= {"variant": label, "every": whole, "chosen": False, "within": STEP_TIE_FP8 if fp8 else STEP_TIE,
                "tuned": not whole and all(pick[name].config == tuned[name] for name in cases)}  # fmt: skip
        rows[label] = row
        configs[label] = {every[name]: t.config for name, t in pick.items()}
        saved = dict(table)
        try:
            table.update(configs[label])
            step = build(rung, model, prompt, ref.token, device)  # captured here, with these tilings
        finally:
            table.clear()
            table.update(saved)
        steps.prepare(step)
        check = fidelity(step(), ref, error_factor(rung, dtype))
        row["passed"] = bool(check["passed"])
        if row["passed"]:
            variants[label] = (step, steps.setup(step))
        progress(f"  {rung} with {label}: built, same answers: {row['passed']}")
    timed = harness.interleaved(variants, device=device, rounds=rounds, warmup=3, what=f"{rung} tilings",
                                progress=progress) if variants else {}  # fmt: skip
    for label, t in timed.items():
        vals = list(t.gpu_ms) or list(t.wall_ms)
        rows[label] |= {"ms_min": min(vals), "ms_median": harness.quantile(vals, 0.5), "repeats": len(vals)}
        progress(f"  {rung} with {label}: {rows[label]['ms_median']:.3f} ms (median)")
    step, variants, timed = None, None, None  # the steps built here are freed before the rungs are built
    if device == "cuda":
        import torch

        torch.cuda.empty_cache()
    done = [r for r in rows.values() if "ms_median" in r]
    if not done:
        return list(rows.values())
    best = min(done, key=lambda r: r["ms_median"])
    best["chosen"] = True
    table.update(configs[best["variant"]])
    for case in (cases if fp8 else every).values():
        runs_it = step_config(case, fp8)
        for t in step_trials(trials, case, fp8):
            if fp8:
                t.chosen = t.config == runs_it
            else:
                t.chosen_folded = t.config == runs_it
    return list(rows.values())
