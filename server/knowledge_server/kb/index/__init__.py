"""The knowledge base's retrieval index: one port (``port.py``), an embedded SQLite
implementation (``sqlite.py``) and a Milvus one (``milvus.py``)."""
