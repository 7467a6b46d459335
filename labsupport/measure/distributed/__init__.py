"""Tensor parallelism: the transformers model split by DTensor, our hand-split decode step, and
the all-reduce that joins the ranks; run under torchrun, one process per GPU."""
