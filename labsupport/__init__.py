"""Support package of the executable book "The GPU kernels behind one LLM token".

Modules, one concern each: hardware (datasheets, ceilings), models (presets),
decode (one decode step), trace (profiler traces to kernel tables), kernels
(kinds), runs (record/replay), plots, book (glue), published (others' figures),
chapters/live (papermill), and one module per chapter (one_token).
"""
__version__ = "0.1.0"
