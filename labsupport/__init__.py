"""Support package of the executable book "The GPU kernels behind one LLM token".

Modules, one concern each: hardware (datasheets, ceilings), models (presets),
decode (one decode step), trace (profiler traces to kernel tables), kernels
(kinds), runs (record/replay), plots, book (glue), published (others' figures),
chapters/live (papermill), and one module per chapter (one_token).
"""
import os

__version__ = "0.1.0"

# After a torch.profiler session, NVIDIA's profiling interface (CUPTI) stays attached to the
# process unless PyTorch's profiler library (Kineto) is told to tear it down, and every later
# kernel launch pays for it (pytorch/pytorch#146604; pytorch/kineto#1264 makes teardown the
# default from CUDA 12.6 in newer releases). The chapters time steps in the same process in
# which they profile them, so they ask for the teardown. A value set by the user wins.
os.environ.setdefault("TEARDOWN_CUPTI", "1")
