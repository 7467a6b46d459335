"""The key of every table a chapter's run holds: the columns that name a row, so that no two rows
of the table may share them (a repeated row would be counted twice, or turn one number into two).
Beside the chapters' declarations (labsupport.chapters.declaring), which read it through Chapter.key_of: {chapter slug:
{csv file: its key columns, space-separated}}; "" is a table of one row. A table of events (every
kernel launched) has no key; tests/test_runs.py lists the tables without one and checks every
committed run against the keys.
"""

# ceilings.csv, which most chapters' runs hold, is one row: the GPU's.
SHARED = {"ceilings.csv": ""}

KEYS = {
    "why-a-gpu": {
        "matvec.csv": "device dtype timing",
        "batch_sweep.csv": "batch",
        "batch_times.csv": "batch repeat",
        "batch_matmuls.csv": "batch name grid block",
        "read_kernels.csv": "kernel matrix config",
    },
    "what-a-kernel": {
        "add_times.csv": "implementation n",
        "hbm_add.csv": "implementation n",
        "queue.csv": "launch",
        "sync.csv": "what",
    },
    "model-code-to-kernels": {"rmsnorm_times.csv": "variant"},
    "where-kernels-come-from": {"fusion_times.csv": "variant", "attention_backends.csv": "backend context"},
    "kernels-in-one-token": {
        "census.csv": "kind",
        "step_times.csv": "repeat",
        "context_sweep.csv": "context",
        "context_census.csv": "context cache kind",
        "context_ops.csv": "context cache kind call",
        "context_times.csv": "context cache repeat",
        "fresh_processes.csv": "process",
        "profiler_effect.csv": "condition process",
        "plain_eager_step.csv": "trial",
    },
    "launch-overhead": {"variants.csv": "variant", "step_times.csv": "variant repeat"},
    "closing-the-gap": {
        "rungs.csv": "rung",
        "step_times.csv": "rung repeat",
        "matmuls.csv": "matrix",
        "gemv_tuning.csv": "weights n k fusion split_k ctas_per_sm block_n block_k num_warps num_stages chunk early",
        "tokens_per_forward.csv": "tokens path",
    },
    "prefill-vs-decode": {
        "census.csv": "phase kind",
        "phase_times.csv": "phase repeat",
        "prompt_sweep.csv": "prompt_len",
    },
    "hybrid-model-token": {
        "variants.csv": "backend mode",
        "step_times.csv": "backend mode repeat",
        "prefill.csv": "backend",
        "cache_growth.csv": "context layer_type",
    },
    "one-token-two-gpus": {
        "variants.csv": "tp rank variant",
        "step_times.csv": "tp rank variant repeat",
        "collectives.csv": "tp rank seq",
        "allreduce.csv": "rank world bytes launch",
        "split_variants.csv": "tp rank variant",
        "split_step_times.csv": "tp rank variant repeat",
        "split_collectives.csv": "tp rank variant seq",
        "split_answer.csv": "tp choice",
    },
}
