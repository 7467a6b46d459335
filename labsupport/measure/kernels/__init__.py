"""The book's own GPU kernels, in Triton: the GEMV (BF16 and FP8 weights, and its folded-norm and
argmax epilogues), decode attention, and the small kernels of What a kernel is."""
