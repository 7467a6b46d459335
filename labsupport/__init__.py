"""Support package of the executable book "The GPU kernels behind one LLM token".

Modules, one concern each: hardware (datasheets, ceilings), models (presets),
decode (one decode step), trace (profiler traces to kernel tables), kernels
(kinds), runs (record/replay), figures, glue, published (others' figures),
chapters/live (papermill), and one module per chapter (one_token).
"""

import os

__version__ = "0.1.0"

# After a torch.profiler session, Kineto leaves NVIDIA's profiling interface (CUPTI) attached
# to the process unless told to tear it down (TEARDOWN_CUPTI=1), and later kernel launches pay
# for it (pytorch/pytorch#146604). With the lent box's torch 2.11, tearing it down makes every
# later profile in the process record no kernels, so it stays attached and the harness takes
# every wall time before the first profile (labsupport.measure.harness). A value set by the user wins.
os.environ.setdefault("TEARDOWN_CUPTI", "0")
