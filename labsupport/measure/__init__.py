"""Measuring, by concept:

- here, the instrument: the harness (time a region, profile a region), the host probe, fresh
  processes, the step forms (eager, static cache, CUDA graph, compiled), compiling, hardware
  ceilings and datasheets, the environment, and opening a new run (recording);
- kernels/: the book's own GPU kernels in Triton (the GEMV, FP8 weights, decode attention);
- models/: model presets and their counts, our gpt-fast-like Qwen3 decode step (qwen3_decode),
  Gated DeltaNet's backends;
- distributed/: tensor parallelism (DTensor and the hand-split step) and the all-reduce.
"""
