"""The governed knowledge base (seed 002): topics, revisions from draft to published, the
PROCESS queue and its worker, releases and reconcile (``docs/kb.md``)."""
