"""What each of the two gloo ranks of tests/test_tp_split.py runs (a module of its own: the
ranks are spawned processes, which import the function they run)."""

from pathlib import Path
from types import SimpleNamespace

import torch
import torch.distributed as dist

PROMPT = 8


class NoReduce:
    """A wrong split: the row-split matmuls' partial sums are never added up (the all-reduce
    left out; the logits are still gathered)."""

    def __init__(self, comm):
        self.comm, self.choice, self.group, self.rank, self.world = comm, comm.choice, comm.group, comm.rank, comm.world

    def all_reduce(self, t):
        return t

    def gather_last(self, shard):
        return self.comm.gather_last(shard)


def work(rank: int, store_path: str, out: str) -> None:
    dist.init_process_group("gloo", store=dist.FileStore(store_path, 2), rank=rank, world_size=2)
    from labsupport.measure import models
    from labsupport.measure.distributed import tp_split, tp_split_run
    from labsupport.measure.models import qwen3_decode

    torch.manual_seed(0)
    model = models.build_model("tiny", dtype=torch.float32)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, model.config.vocab_size, (1, PROMPT + 1), generator=g)
    prompt, tok = ids[:, :PROMPT], ids[:, PROMPT:]
    res = {"rank": rank}
    with torch.no_grad():
        res["eager"] = model(input_ids=ids).logits[:, -1].float()
    for name, opts in (("plain", qwen3_decode.Options()), ("fused", qwen3_decode.Options(fused=True))):
        own = qwen3_decode.OwnStep(model, prompt, tok, opts, compile=False, graph=False)
        res[f"own-{name}"] = own()[0].float()
        comm = tp_split.Collectives("process-group")
        step = tp_split.SplitStep(model, prompt, tok, opts, comm, compile=False, graph=False)
        res[f"split-{name}"] = step()[0].float()
        res[f"first-{name}"] = step.first_logits
        res[f"census-{name}"] = step.census
        res[f"shards-{name}"] = tp_split.shard_census(step.dec, model)
        res[f"weight-bytes-{name}"] = step.dec.weight_bytes()
        res[f"kv-{name}"] = tuple(step.dec.k_cache[0].shape)
    wrong = tp_split.SplitDecoder(model, PROMPT + 16, qwen3_decode.Options(), NoReduce(tp_split.Collectives()))
    with torch.no_grad():
        wrong.forward(prompt, torch.arange(PROMPT), step=False)
        res["split-wrong"] = wrong.forward(tok, torch.tensor([PROMPT])).float()
    try:
        tp_split.Collectives("symm-mem", message=((1, 1, 64), torch.float32))
        res["symm-mem"] = "built"
    except tp_split.NotAvailable as e:
        res["symm-mem"] = str(e)
    del model
    args = SimpleNamespace(
        preset="tiny", prompt_len=PROMPT, repeats=2, options="plain", choices=list(tp_split.CHOICES),
        dtype="float32", compile=False, seed=0, reference=True,
    )  # fmt: skip
    host = dist.new_group(backend="gloo")
    tp_split_run.measure_rank(args, Path(out) / "run" / f"rank{rank}", "cpu", host, say=lambda m: None)
    torch.save(res, Path(out) / f"rank{rank}.pt")
    dist.destroy_process_group()
