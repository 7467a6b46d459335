"""The book's own GPU kernels, in Triton: the GEMV (BF16 and FP8 weights, persistent, and its
folded-norm and argmax epilogues), decode attention, a decoder layer or a whole decode step as one
persistent kernel (megakernel), and the small kernels of What a kernel is."""
