"""The hand-split step (labsupport.measure.distributed.tp_split, measured by tp_split_run on every rank):
the torchrun command, the collection of every rank's folder into tables, and what the chapter
will read of them. A live run records them as optional tables (record_split); the page does
not read them yet: no run of the hand-split step on GPUs exists (issue 27).

    split_command   the torchrun command of tp_split_run at one degree
    split_options   its options for a run's Params (our kernels on GPUs, PyTorch's on a CPU)
    collect_split   every rank's folder -> {"split_variants", "split_step_times",
                    "split_collectives"} and the ranks' facts
    record_split    all of it, the traces and the answer (split_answer) into a live run
    split_summary   per degree and all-reduce choice: the step (the slowest rank's median), the
                    all-reduces per layer, their share of the profiled step, the weights per GPU
    same_answer     each split step's first logits against a reference (the largest move, the token)
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pandas as pd

WORKER = "labsupport.measure.distributed.tp_split_run"


def split_command(tp: int, out: Path, preset: str = "qwen3-8b", prompt_len: int = 256, repeats: int = 30, **kw):
    """The command that measures the hand-split step on `tp` ranks (one per GPU) into `out`;
    `kw`: further options of tp_split_run (options="plain", device="cpu", compile=False, ...)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1"]
    cmd += ["--nproc-per-node", str(tp), "-m", WORKER, "--out", str(out), "--preset", preset]
    cmd += ["--prompt-len", str(prompt_len), "--repeats", str(repeats)]
    for k, v in kw.items():
        if k == "compile":
            cmd += [] if v else ["--no-compile"]
        elif isinstance(v, (list, tuple)):
            cmd += [f"--{k.replace('_', '-')}", *map(str, v)]
        else:
            cmd += [f"--{k.replace('_', '-')}", str(v)]
    return cmd


def first_line(e: BaseException) -> str:
    """What the notebook says of a hand-split launch that failed: the exception's first line."""
    lines = [ln for ln in str(e).splitlines() if ln.strip()]
    return f"{type(e).__name__}: {lines[0][:200]}" if lines else type(e).__name__


def split_options(params) -> dict:
    """split_command's options for a run of the chapter (its Params): on GPUs the best BF16 rung's
    options, compiled and captured; on a CPU (the tests) PyTorch's, eager."""
    if params.device == "cuda":
        return {"preset": params.preset, "prompt_len": params.prompt_len, "repeats": params.repeats}
    return {
        "preset": params.preset,
        "prompt_len": params.prompt_len,
        "repeats": params.repeats,
        "options": "plain",
        "device": "cpu",
        "compile": False,
    }


def trace_name(tp: int, rank: int, choice: str) -> str:
    """The run's trace of one rank's profiled hand-split step with all-reduce `choice` at degree `tp`."""
    return f"trace-split-tp{tp}-rank{rank}-{choice}.json.gz"


def rank_folders(out: Path, tp: int) -> list[Path]:
    ranks = sorted((p for p in Path(out).glob("rank*") if p.is_dir()), key=lambda p: int(p.name[4:]))
    if len(ranks) != tp:
        raise RuntimeError(f"hand-split step: TP={tp} wrote {len(ranks)} rank folders under {out}")
    return ranks


def collect_split(out: Path, tp: int, tables: dict | None = None) -> tuple[dict, list]:
    """Every rank's tables under `out` (rank<r>/, written by tp_split_run) appended to `tables`
    ({"split_variants", "split_step_times", "split_collectives"}); returns (tables, the ranks'
    info.json facts, each with its folder)."""
    tables = {} if tables is None else tables
    facts = []
    for folder in rank_folders(out, tp):
        for name in ("variants", "step_times", "collectives"):
            df = pd.read_csv(folder / f"{name}.csv")
            old = tables.get(f"split_{name}")
            tables[f"split_{name}"] = df if old is None else pd.concat([old, df], ignore_index=True)
        info = json.loads((folder / "info.json").read_text())
        facts.append({k: v for k, v in info.items() if k != "method"} | {"folder": str(folder)})
    return tables, facts


def record_split(w, out: Path, tp: int) -> None:
    """Add the hand-split step's rank folders under `out` (degree `tp`) to `w`, a
    recording.PendingRun: the split_* tables, every rank's traces (trace_name), the ranks' facts
    (results' "split_ranks"), and, where rank 0 kept the float32 reference, the answer of each
    all-reduce choice against it (split_answer)."""
    tables, facts = collect_split(out, tp, w.tables)
    for f in facts:
        for trace in Path(f["folder"]).glob("trace-*.json.gz"):
            choice = trace.name.removeprefix("trace-").removesuffix(".json.gz")
            shutil.copyfile(trace, w.path / trace_name(tp, f["rank"], choice))
        w.extra.setdefault("split_ranks", []).append({k: v for k, v in f.items() if k != "folder"})
    reference = Path(facts[0]["folder"]) / "reference.npy"
    if reference.is_file():
        answer = same_answer(facts, np.load(reference))
        old = tables.get("split_answer")
        tables["split_answer"] = answer if old is None else pd.concat([old, answer], ignore_index=True)


def split_summary(tables: dict, layers: int) -> pd.DataFrame:
    """One row per (tp, choice) of the steps that ran: the step's median wall time (the slowest
    rank's: a step ends when every rank has), the ranks' spread, all-reduces per step and per
    layer (one eager step's collectives), the communication kernels' share of each rank's
    profiled GPU time (the largest), the weight bytes per GPU, and the step against the fastest
    TP=1 step (`x_tp1`: 1 is as fast; the target is 0.70 or less)."""
    v = tables["split_variants"]
    v = v[v.status == "ok"]
    c = tables["split_collectives"]
    rows = []
    for (tp, choice), g in v.groupby(["tp", "variant"], sort=True):
        mine = c[(c.tp == tp) & (c.variant == choice)]
        per_rank = mine[mine.op == "all_reduce"].groupby("rank").size()
        reduces = int(per_rank.max()) if len(per_rank) else 0
        if len(per_rank) and per_rank.nunique() != 1:
            raise ValueError(f"TP={tp} {choice}: the ranks issued different all-reduces: {dict(per_rank)}")
        busy = g.gpu_busy_ns.where(g.gpu_busy_ns > 0)
        rows.append(
            {
                "tp": int(tp),
                "choice": choice,
                "ranks": len(g),
                "step_ms": float(g.wall_ms_median.max()),
                "step_ms_fastest_rank": float(g.wall_ms_median.min()),
                "allreduces_per_step": reduces,
                "allreduces_per_layer": reduces / layers,
                "comm_share": float((g.comm_ns / busy).max()) if busy.notna().any() else float("nan"),
                "weight_bytes_per_gpu": int(g.weight_bytes.max()),
            }
        )
    out = pd.DataFrame(rows)
    if out.empty:
        return out
    one = out[out.tp == 1].step_ms
    out["x_tp1"] = out.step_ms / one.min() if len(one) else float("nan")
    return out


def same_answer(facts: list, reference: np.ndarray) -> pd.DataFrame:
    """For each split step whose rank 0 kept its first logits (logits-<choice>.npy): the largest
    move of a logit from `reference` (float32 logits of the same step, [B, vocab]), the largest
    reference logit, and whether the greedy token is the reference's."""
    rows = []
    for f in facts:
        for path in sorted(Path(f["folder"]).glob("logits-*.npy")):
            got = np.load(path)
            if got.shape != reference.shape:
                raise ValueError(f"{path.name}: logits {got.shape}, reference {reference.shape}")
            rows.append(
                {
                    "tp": f["world"],
                    "choice": path.stem.removeprefix("logits-"),
                    "max_abs_diff": float(np.abs(got - reference).max()),
                    "max_abs_logit": float(np.abs(reference).max()),
                    "same_token": bool((got.argmax(-1) == reference.argmax(-1)).all()),
                }
            )
    return pd.DataFrame(rows)
