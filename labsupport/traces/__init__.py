"""Reading profiler traces; kernel kinds, sources and kernel tables."""
