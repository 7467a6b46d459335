"""Measuring: the harness (time a region, profile a region), the step forms, models and their
byte counts, hardware ceilings, and opening a new run."""
