"""Governed project memory (seed 004): facts with a timeline, contradictions with severity,
bounded outputs, lossless eviction to an archive with restore (``docs/memory.md``)."""
