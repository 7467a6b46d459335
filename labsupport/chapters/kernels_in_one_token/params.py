"""What one run of "The kernels in one token" measures, and where it lies."""

from __future__ import annotations

from .declaration import DECLARATION

CHAPTER, load, progress = DECLARATION.slug, DECLARATION.load, DECLARATION.progress  # its declaration's
TRACE_FILE = "trace.json.gz"
