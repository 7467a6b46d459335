"""The hand-split decode step (tp_split) measured on every rank: the worker torchrun starts.

    python -m torch.distributed.run --standalone --nproc-per-node 2 \\
        -m labsupport.measure.distributed.tp_split_run --out DIR --preset qwen3-8b --prompt-len 256

Every rank builds the same model from its preset with the same seed, keeps its shard of it
(tp_split.SplitDecoder) and drops the whole model, then for each all-reduce choice it can run
(tp_split.CHOICES: "symm-mem" only where tp_split.symm_mem_support finds none missing; the reason
recorded otherwise) builds the split step: prefill, one eager step whose collectives and logits are
recorded, compile, capture in one CUDA graph (on a GPU). Then it times the steps in turn, round
after round (harness.interleaved, clean, before any profile), profiles one step of each
(harness.profile_region, every rank passing each phase together), and writes into DIR/rank<r>/:
step_times.csv, variants.csv (tensor_parallel.variant_row's columns plus the choice's compile
time), collectives.csv (one eager step's collectives), info.json (the options, each rank's
shard census, why a choice did not run, the first step's top logits), trace-<choice>.json.gz, and
on rank 0 logits-<choice>.npy (the first step's logits, as float32) and reference.npy (the same
step of the whole model in float32, transformers' eager: the answer is checked at collection).

On one rank (--nproc-per-node 1) it is the unsplit decoder with the same code (TP=1: no
collective runs). NCCL on GPUs, gloo on a CPU (the tests: tiny model, eager, no graph).
Only a GPU run exercises the compile, the CUDA graph, the Triton options and the symmetric-memory
choice (tp_split's docstring).
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import sys
from pathlib import Path

import pandas as pd
import torch

from labsupport.measure import decode, harness, models
from labsupport.measure.distributed import tensor_parallel, tp_split
from labsupport.measure.models.qwen3_decode import Options
from labsupport.traces import kinds

# The options of the split step, by name (qwen3_decode.Options): "best-bf16" is the fastest rung of
# Closing the gap that gave eager's answer in its published run (20261201T230816Z-h200: fused-gemv,
# 4.57 ms; the three faster rungs picked another token); "pdl" is its fastest rung. A CPU has
# PyTorch's options alone ("plain", "fused").
_OURS = {"fused": True, "matmul": "triton", "fuse_gemv": True}
OPTIONS = {
    "plain": {},
    "fused": {"fused": True},
    "best-bf16": _OURS,
    "pdl": _OURS | {"fused_attention": True, "split_k": True, "pdl": True},
}


def build_steps(model, ids, tok, opts, where: str, args, say) -> tuple[dict, dict]:
    """({choice: SplitStep}, {choice: why it has no step}), every rank agreeing on each choice."""
    device = where.split(":")[0]
    built, status = {}, {}
    for choice in tp_split.CHOICES:
        if choice not in args.choices:
            continue
        why = tp_split.symm_mem_support(where) if choice == "symm-mem" else None
        if why is not None:
            status[choice] = f"not available: {why}"
            say(f"{choice}: {status[choice]}")
            continue
        try:
            say(f"{choice}: building the split step{' (compiles: minutes)' if args.compile else ''}")
            message = ((1, 1, model.config.hidden_size), model.dtype)
            comm = tp_split.Collectives(choice, device=where, message=message)
            step = tp_split.SplitStep(model, ids, tok, opts, comm, compile=args.compile, graph=device == "cuda")
            ok, err = True, ""
        except Exception as e:  # recorded, not hidden: the choice's row says why
            ok, err = False, tensor_parallel.first_line(e)
        if not tensor_parallel.agree(ok, where):
            status[choice] = f"failed: {err}" if err else "failed on another rank"
            say(f"{choice}: {status[choice]}")
            continue
        built[choice] = step
    return built, status


def reference_logits(model, ids):
    """The last position's logits of transformers' eager forward over `ids` [1, T] (the prompt and
    the step's token) on a float32 copy of `model`, as a float32 array [1, vocab]."""
    import copy

    ref = copy.deepcopy(model).float()
    with torch.no_grad():
        logits = ref(input_ids=ids).logits[:, -1].float().cpu().numpy()
    del ref
    return logits


def measure_rank(args, out: Path, where: str, host, say=print) -> Path:
    """Build, time, profile and write this rank's folder `out` (the process group is set up)."""
    import numpy as np
    import torch.distributed as dist

    device = where.split(":")[0]
    rank, world = dist.get_rank(), dist.get_world_size()
    out.mkdir(parents=True, exist_ok=True)
    opts = Options(**OPTIONS[args.options])
    torch.manual_seed(args.seed)  # the same weights on every rank before the split
    dtype = getattr(torch, args.dtype)
    model = models.build_model(args.preset, device=where, dtype=dtype)
    counts = models.count_model(model, args.preset)
    prompt = decode.Prompt.random(model.config.vocab_size, 1, args.prompt_len + 1, where, seed=args.seed)
    ids, tok = prompt.ids[:, :-1], prompt.ids[:, -1:]
    if rank == 0 and args.reference:  # the whole model's step in float32: the answer's yardstick
        np.save(out / "reference.npy", reference_logits(model, prompt.ids))
    built, status = build_steps(model, ids, tok, opts, where, args, say)
    census = {c: tp_split.shard_census(s.dec, model) for c, s in built.items()}
    del model  # each rank keeps its shards alone
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()
    timed = {}
    if built:
        say(f"timing {', '.join(built)} in turn, {args.repeats} rounds")
        timed = harness.interleaved(built, device=device, rounds=args.repeats, warmup=3, what="split step")
    rows, times, colls = [], [], []
    for choice, step in built.items():
        t = timed[choice]
        times += t.rows(variant=choice)
        path = out / f"trace-{choice}.json.gz"
        k = harness.profile_region(
            step, path, region="decode_step", device=device, fence=lambda: tensor_parallel.fence(host, device)
        )
        row = tensor_parallel.variant_row(choice, k.assign(kind=k["name"].map(kinds.classify)), t, path)
        rows.append(row | {"compile_s": step.compile_s, "weight_bytes": step.dec.weight_bytes()})
        colls += [r | {"variant": choice} for r in step.census]
        if rank == 0:
            np.save(out / f"logits-{choice}.npy", step.first_logits.cpu().numpy())
        say(f"{choice}: median {t.median:.3f} ms, {row['comm_kernels']} communication kernels")
    rows += [{"variant": c, "status": s} for c, s in status.items()]
    keys = {"tp": world, "rank": rank}
    pd.DataFrame(rows).assign(**keys).to_csv(out / "variants.csv", index=False)
    pd.DataFrame(times).assign(**keys).to_csv(out / "step_times.csv", index=False)
    cols = ["seq", "op", "bytes", "dtype", "shape", "variant"]
    pd.DataFrame(colls, columns=cols).assign(**keys).to_csv(out / "collectives.csv", index=False)
    first = {c: s.first_logits for c, s in built.items()}
    info = {
        "rank": rank,
        "world": world,
        "backend": dist.get_backend(),
        "device": torch.cuda.get_device_name(torch.cuda.current_device()) if device == "cuda" else "cpu",
        "torch": torch.__version__,
        "options": {"name": args.options, **OPTIONS[args.options]},
        "compiled": bool(args.compile),
        "graph": device == "cuda",
        "dtype": args.dtype,
        "model": counts.as_record(),
        "shards": census,
        "status": status,
        "symm_mem": tp_split.symm_mem_support(where),
        "first_step": {
            c: {"next_token": v.argmax(-1).tolist(), "top5": v.topk(5).indices.tolist()} for c, v in first.items()
        },
        "method": harness.method(),
    }
    (out / "info.json").write_text(json.dumps(info, indent=1))
    tensor_parallel.fence(host, device)
    return out


def main(argv=None) -> None:
    import torch.distributed as dist

    args = arguments(argv)
    device = args.device
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if device == "cuda":
        torch.cuda.set_device(local)
    timeout = datetime.timedelta(seconds=args.timeout_s)
    dist.init_process_group("nccl" if device == "cuda" else "gloo", timeout=timeout)
    rank, world = dist.get_rank(), dist.get_world_size()
    where = f"cuda:{local}" if device == "cuda" else "cpu"
    harness.for_chapter(f"hand-split tensor parallel, rank {rank}/{world}")
    host = dist.new_group(backend="gloo", timeout=timeout)

    def say(msg):
        sys.stdout.write(f"[TP={world} rank {rank}] {msg}\n")
        sys.stdout.flush()

    measure_rank(args, Path(args.out) / f"rank{rank}", where, host, say)
    say("done")
    if world > 1 and device == "cuda":  # as tensor_parallel: NCCL's teardown hung at exit on the H200 pair
        sys.stdout.flush()
        os._exit(0)
    dist.destroy_process_group()


def arguments(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--preset", default="qwen3-8b")
    p.add_argument("--prompt-len", type=int, default=256)
    p.add_argument("--repeats", type=int, default=30)
    p.add_argument("--options", default="best-bf16", choices=sorted(OPTIONS))
    p.add_argument("--choices", nargs="*", default=list(tp_split.CHOICES))
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    p.add_argument("--no-compile", dest="compile", action="store_false")
    p.add_argument("--no-reference", dest="reference", action="store_false", help="no float32 reference on rank 0")
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout-s", type=int, default=300)
    return p.parse_args(argv)


if __name__ == "__main__":
    main()
