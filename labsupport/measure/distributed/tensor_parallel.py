"""One decode step split across GPUs (tensor parallelism): the worker each rank runs.

    python -m torch.distributed.run --standalone --nproc-per-node 2 \\
        -m labsupport.measure.distributed.tensor_parallel --out DIR --preset qwen3-8b --prompt-len 256

Every rank builds the same model from its preset with the same seed, then (on more than one
rank) shards each decoder layer with PyTorch's own stack, DTensor's `parallelize_module`:
column-parallel q/k/v and gate/up (each rank keeps its share of the heads and of the MLP's
columns), row-parallel o_proj and down_proj (each rank's partial sum, then one all-reduce).
That is two all-reduces per layer. The embedding, the norms and the LM head stay whole on
every rank. On one rank the model runs as written (TP=1, no DTensor).

Each rank then times every step form first (harness.interleaved, clean: the forms in turn, round
after round), profiles one step
of each (harness.profile_region), and writes into DIR/rank<r>/: step_times.csv,
variants.csv, collectives.csv (what one eager step all-reduces), allreduce.csv (with
--sweep), trace-<variant>.json.gz and info.json. NCCL on GPUs, gloo on a CPU (the tests).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time
from pathlib import Path

import pandas as pd
import torch

from labsupport.measure import decode, harness, models, steps
from labsupport.measure.distributed import allreduce
from labsupport.traces import kernels, kinds, trace

COLUMNWISE = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.gate_proj", "mlp.up_proj")
ROWWISE = ("self_attn.o_proj", "mlp.down_proj")
VARIANTS = ("eager", "cuda-graph", "compile")  # the last two on a GPU only


def tp_plan(model) -> dict:
    """{module path: ColwiseParallel() or RowwiseParallel()} for every decoder layer (local outputs)."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    prefix = model.base_model_prefix
    plan = {}
    for i in range(model.config.num_hidden_layers):
        plan |= {f"{prefix}.layers.{i}.{m}": ColwiseParallel() for m in COLUMNWISE}
        plan |= {f"{prefix}.layers.{i}.{m}": RowwiseParallel() for m in ROWWISE}
    return plan


def shard(model, device: str):
    """Split `model` across every rank of the default group (in place); a clear error when its
    heads or MLP width do not divide among the ranks."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import parallelize_module

    n, c = dist.get_world_size(), model.config
    for what in ("num_attention_heads", "num_key_value_heads", "intermediate_size"):
        if getattr(c, what) % n:
            raise ValueError(f"tensor parallelism over {n} ranks: {what}={getattr(c, what)} does not divide by {n}")
    mesh = init_device_mesh(device, (n,))
    return parallelize_module(model, mesh, tp_plan(model))


def build_step(variant: str, model, prompt):
    if variant == "eager":  # no_grad at every degree: inference_mode sends DTensor down its slow path
        return steps.EagerStep(model, prompt, no_grad=True)
    static = steps.StaticStep(model, prompt.ids)
    if variant == "cuda-graph":
        return steps.GraphStep(static)
    return steps.CompiledStep(static, mode="reduce-overhead")


def slow_sharding_calls(step, grad_mode) -> int | None:
    """How many times DTensor worked out an operator's sharding outside its caches (its Python
    slow path) in one warm eager `step` run under `grad_mode` ("no_grad" or "inference_mode");
    None where this torch has no such path."""
    from torch.distributed.tensor import _dispatch

    cls, name = _dispatch.OpDispatcher, "_propagate_op_sharding_dispatch_slow_path"
    real = getattr(cls, name, None)
    if real is None:
        return None
    step.no_grad, calls = grad_mode == "no_grad", []
    step.prepare()
    step()  # warm: the caches filled

    def counting(self, *args, **kwargs):
        calls.append(1)
        return real(self, *args, **kwargs)

    step.prepare()
    setattr(cls, name, counting)
    try:
        step()
    finally:
        setattr(cls, name, real)
    return len(calls)


def fence(group, device: str) -> None:
    """This rank's GPU idle, then every rank met on the host (a gloo barrier, nothing queued
    on a GPU): around each profiler start, step and stop, so that no rank's NCCL kernel waits
    for a peer while the peer is inside the profiler (CUPTI) or writing its trace."""
    import torch.distributed as dist

    harness.sync(device)
    dist.barrier(group=group)


def agree(ok: bool, device: str) -> bool:
    """Whether every rank succeeded (a variant failing on one rank is failed on all: the others
    would otherwise wait for its collectives)."""
    import torch.distributed as dist

    flag = torch.tensor([0 if ok else 1], device=device)
    dist.all_reduce(flag)
    return int(flag.item()) == 0


def first_line(e: BaseException) -> str:
    msg = next((ln for ln in str(e).splitlines() if ln.strip()), "")
    return f"{type(e).__name__}: {msg[:200]}"


def variant_row(variant: str, k: pd.DataFrame, t: harness.Timing, path: Path) -> dict:
    """variants.csv's row of a variant timed (`t`) and profiled (kernels `k`, trace `path`):
    communication kernels (NCCL's, on a GPU) and the all-reduce calls the host made."""
    comm = k[k.kind == "communication"]
    calls, calls_ns = allreduce.issued(path)
    return {
        "variant": variant,
        "status": "ok",
        **kernels.profile_row(k),
        "comm_kernels": len(comm),
        "comm_ns": int(comm.dur_ns.sum()),
        "allreduce_calls": calls,
        "allreduce_call_ns": calls_ns,
        "profiled_step_ns": trace.origin_span_ns(trace.load_events(path)),
        **t.summary(fast=False, issue=True, count=None),
    }


def time_variants(model, prompt, args, where: str, say) -> tuple[dict, dict, list]:
    """Build each step form asked for, then time them in turn, round after round (harness.interleaved:
    a change in the host's speed touches every form alike), every rank in step (the same forms in the
    same order on every rank): ({variant: (step, Timing)}, {variant: why it has no numbers},
    step_times rows). If the interleaved timing fails on any rank, each form is timed alone."""
    device = where.split(":")[0]
    steps_built, status, times = {}, {}, []
    for v in [v for v in args.variants if v in VARIANTS]:
        if v != "eager" and device != "cuda":
            status[v] = "needs a CUDA GPU"
            continue
        try:
            say(f"{v}: building (a compile takes minutes)" if v == "compile" else f"{v}: building")
            step = build_step(v, model, prompt)
            ok, err = True, ""
        except Exception as e:  # recorded, not hidden: the variant's row says why
            ok, err = False, first_line(e)
        if not agree(ok, where):
            status[v] = f"failed: {err}" if err else "failed on another rank"
            continue
        steps_built[v] = step
    timed, err = {}, ""
    if steps_built:
        say(f"timing {', '.join(steps_built)} in turn, {args.repeats} rounds")
        try:
            timed = harness.interleaved(
                {v: (step, steps.setup(step)) for v, step in steps_built.items()},
                device=device,
                rounds=args.repeats,
                warmup=3,
                what="step",
            )
            ok = True
        except (harness.TimingError, harness.ProfileError):
            raise
        except Exception as e:
            ok, err = False, first_line(e)
        if not agree(ok, where):
            say(f"interleaved timing failed ({err or 'on another rank'}); timing each form alone")
            timed = {}
            for v, step in steps_built.items():
                try:
                    t = harness.time_region(
                        step, what=f"{v} step", device=device, repeats=args.repeats, setup=steps.setup(step)
                    )
                    ok, err = True, ""
                except (harness.TimingError, harness.ProfileError):
                    raise
                except Exception as e:
                    ok, err = False, first_line(e)
                if agree(ok, where):
                    timed[v] = t
                else:
                    status[v] = f"failed: {err}" if err else "failed on another rank"
    built = {}
    for v, t in timed.items():
        built[v] = (steps_built[v], t)
        times += t.rows(variant=v)
        say(f"{v}: least {t.low:.3f} ms, median {t.median:.3f} ms over {len(t.wall_ms)} repeats")
    return built, status, times


def profile_variants(model, built: dict, out: Path, device: str, note, fenced=None) -> list[dict]:
    """Profile one step of each timed variant (after every timing), every rank in step
    (`fenced`: fence() between the profiler's phases); variants.csv's rows."""
    rows = []
    for v, (step, t) in built.items():
        path = out / f"trace-{v}.json.gz"
        labels = (lambda: decode.annotated_modules(model)) if v == "eager" else None
        note(f"profiling {v}")
        t0 = time.perf_counter()
        k = harness.profile_region(
            step, path, region="decode_step", device=device, setup=steps.setup(step), labels=labels, fence=fenced
        )
        rows.append(variant_row(v, k.assign(kind=k["name"].map(kinds.classify)), t, path))
        took = time.perf_counter() - t0
        note(f"profiled {v}: {len(k)} kernels, {rows[-1]['comm_kernels']} communication kernels, {took:.1f} s")
    return rows


def run(args) -> Path:
    """Measure this rank; returns its output folder."""
    import torch.distributed as dist

    device = args.device
    backend = "nccl" if device == "cuda" else "gloo"
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if device == "cuda":
        torch.cuda.set_device(local)
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=args.timeout_s))
    rank, world = dist.get_rank(), dist.get_world_size()
    where = f"cuda:{local}" if device == "cuda" else "cpu"
    harness.for_chapter(f"tensor parallel, rank {rank}/{world}")
    out = Path(args.out) / f"rank{rank}"
    out.mkdir(parents=True, exist_ok=True)

    def say(msg):  # one write per line: the ranks share the pipe to the notebook
        if rank == 0:
            sys.stdout.write(f"[TP={world}] {msg}\n")
            sys.stdout.flush()

    def note(msg):  # every rank's own progress
        sys.stdout.write(f"[TP={world} rank {rank}] {msg}\n")
        sys.stdout.flush()

    host = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=args.timeout_s))

    torch.manual_seed(args.seed)  # the same weights on every rank before sharding
    model = models.build_model(args.preset, device=where, dtype=args.dtype)
    counts = models.count_model(model, args.preset)
    if world > 1:
        shard(model, device)
    prompt = decode.Prompt.random(model.config.vocab_size, args.batch, args.prompt_len, where)
    say(f"{args.preset} built{' and split' if world > 1 else ''} on {world} rank(s)")

    log = allreduce.CollectiveLog()  # what one eager step all-reduces (untimed), and what it computes
    cache, tok = decode.prefill(model, prompt, torch.no_grad)
    with log, torch.no_grad():
        logits = model(input_ids=tok, past_key_values=cache, use_cache=True).logits[:, -1].float()
    top = logits.topk(5, dim=-1)
    check = {"next_token": logits.argmax(-1).tolist(), "top5_ids": top.indices.tolist(), "top5": top.values.tolist()}
    del cache, tok, logits
    collectives = pd.DataFrame(log.rows, columns=["seq", "op", "bytes", "dtype", "shape"]).assign(rank=rank)
    slow = {}
    if world > 1:  # untimed: what inference_mode costs a split model, counted
        probe = steps.EagerStep(model, prompt)
        slow = {m: slow_sharding_calls(probe, m) for m in ("no_grad", "inference_mode")}
        say(f"DTensor sharding worked out afresh per eager step: {slow}")
        del probe

    sweep = []
    if args.sweep and world > 1:  # timings before any profile
        extra = tuple(sorted(set(collectives.bytes)))
        sweep = allreduce.sweep(
            allreduce.sizes(args.sweep_min, args.sweep_max, extra), where, iters=args.sweep_iters, progress=say
        )

    built, status, times = time_variants(model, prompt, args, where, say)
    note("timed; profiling next")
    rows = profile_variants(model, built, out, device, note, fenced=lambda: fence(host, device))
    rows += [{"variant": v, "status": s} for v, s in status.items()]
    keys = {"tp": world, "rank": rank}
    pd.DataFrame(rows).assign(**keys).to_csv(out / "variants.csv", index=False)
    pd.DataFrame(times).assign(**keys).to_csv(out / "step_times.csv", index=False)
    collectives.assign(tp=world).to_csv(out / "collectives.csv", index=False)
    if sweep:
        pd.DataFrame(sweep).to_csv(out / "allreduce.csv", index=False)
    info = {
        "rank": rank,
        "world": world,
        "backend": backend,
        "device": torch.cuda.get_device_name(local) if device == "cuda" else "cpu",
        "nccl": ".".join(map(str, torch.cuda.nccl.version())) if device == "cuda" else None,
        "torch": torch.__version__,
        "model": counts.as_record(),
        "sharded_parameters": local_parameters(model),
        "first_step": check,  # the same prompt and weights at every degree: the same token expected
        "dtensor_slow_path_per_step": slow,
        "method": harness.method(),
    }
    (out / "info.json").write_text(json.dumps(info, indent=1))
    note("written")
    fence(host, device)
    note("done")
    if world > 1 and device == "cuda":
        # On two H200s (torch 2.11) ranks that had written everything hung at exit, in NCCL's
        # teardown; all is on disk and every rank has met the others: leave without it.
        sys.stdout.flush()
        os._exit(0)
    dist.destroy_process_group()
    return out


def local_parameters(model) -> int:
    """Parameters this rank holds (its shards of the split layers, all of the rest)."""
    return sum(getattr(p, "to_local", lambda p=p: p)().numel() for p in model.parameters())


def arguments(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--preset", default="qwen3-8b")
    p.add_argument("--prompt-len", type=int, default=256)
    p.add_argument("--dtype", default=models.DEFAULT_DTYPE, choices=models.DTYPES)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--variants", nargs="*", default=list(VARIANTS))
    p.add_argument("--sweep", action="store_true", help="also time all-reduces from --sweep-min to --sweep-max bytes")
    p.add_argument("--sweep-min", type=int, default=allreduce.SWEEP_MIN)
    p.add_argument("--sweep-max", type=int, default=allreduce.SWEEP_MAX)
    p.add_argument("--sweep-iters", type=int, default=20)
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout-s", type=int, default=180, help="collectives waiting longer fail the rank")
    return p.parse_args(argv)


if __name__ == "__main__":
    run(arguments())
