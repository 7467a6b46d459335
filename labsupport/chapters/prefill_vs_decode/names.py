"""The chapter's names: its run folder and files (from the registry), its two phases, and the
keys that its tables use for the matrices they compare (display labels are in SHORT)."""

from __future__ import annotations

from labsupport import chapters

ENTRY = chapters.of_module(__name__)  # the registry's entry: its slug, load() and progress()
CHAPTER, load, progress = ENTRY.slug, ENTRY.load, ENTRY.progress
# Files every run of the chapter contains (ceilings.csv too, on a GPU), and the columns of its tables.
ARTIFACTS = ENTRY.artifacts
COLUMNS = ENTRY.columns
PHASES = ("prefill", "decode")
# The profiler annotation that each phase's trace is timed from.
ORIGIN = {"prefill": "prefill", "decode": "decode_step"}
# The matrix multiplies of one decoder layer, in the order they run.
GEMM_MODULES = (
    "self_attn.q_proj",
    "self_attn.k_proj",
    "self_attn.v_proj",
    "self_attn.o_proj",
    "mlp.gate_proj",
    "mlp.up_proj",
    "mlp.down_proj",
)
LM_HEAD = "lm_head"
# The points of the roofline figure: each weight matrix of a decoder layer, then the LM head.
ROOFLINE_MODULES = (*GEMM_MODULES, LM_HEAD)
# Display labels of the matrices (applied when a table or figure is shown).
SHORT = {
    "self_attn.q_proj": "q",
    "self_attn.k_proj": "k",
    "self_attn.v_proj": "v",
    "self_attn.o_proj": "o",
    "mlp.gate_proj": "gate",
    "mlp.up_proj": "up",
    "mlp.down_proj": "down",
    LM_HEAD: "LM head",
}
MATMUL = "matrix multiply"


def trace_file(phase: str) -> str:
    return f"trace-{phase}.json.gz"


def kernels_table_name(phase: str) -> str:
    return f"kernels-{phase}"


# The columns of the kernel tables (kernels-prefill.csv, kernels-decode.csv), and those read as text.
KERNEL_COLUMNS = [
    "name",
    "start_ns",
    "end_ns",
    "dur_ns",
    "stream",
    "grid",
    "block",
    "op",
    "module",
    "kind",
    "short_name",
    "layer",
    "part",
]
TEXT_COLUMNS = ["name", "stream", "grid", "block", "op", "module", "kind", "short_name", "part"]
