"""Opening the configured retrieval index.

``IndexSettings`` is what a deployment chooses: the embedded SQLite index (the default,
``DATA_DIR/kb_index.sqlite``) or Milvus, at a local Milvus Lite file
(``DATA_DIR/kb_index.milvus.db`` when no URI is given) or a server / cluster URI such as
``http://host:19530``. Importing this module imports pymilvus (a few seconds on a loaded
machine): the serving runtime imports it, client commands should not.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from knowledge_server.kb.index.milvus import MilvusRetrievalIndex
from knowledge_server.kb.index.port import RetrievalIndex
from knowledge_server.kb.index.sqlite import STORE_FILE, SqliteRetrievalIndex

__all__ = ["BACKENDS", "MILVUS_LITE_FILE", "IndexSettings", "open_index"]

BACKENDS = ("sqlite", "milvus")
MILVUS_LITE_FILE = "kb_index.milvus.db"


@dataclass(frozen=True)
class IndexSettings:
    backend: str = "sqlite"
    # Milvus only. Empty: Milvus Lite in DATA_DIR/kb_index.milvus.db.
    milvus_uri: str = ""
    # A Milvus server's credentials ("user:password" or an API key); never logged.
    milvus_token: str = ""
    milvus_db: str = ""
    milvus_collection: str = "kb_chunks"
    milvus_timeout_s: float = 30.0

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ValueError(f"retrieval index backend must be one of {', '.join(BACKENDS)}")
        if self.milvus_timeout_s <= 0:
            raise ValueError("milvus_timeout_s must be positive")

    def describe(self) -> str:
        """Where the index lives, for status and logs (no credentials)."""
        if self.backend == "sqlite":
            return f"sqlite ({STORE_FILE})"
        uri = self.milvus_uri or MILVUS_LITE_FILE
        if "@" in uri:  # credentials written into the URI stay out of what is shown
            scheme, _, rest = uri.partition("://")
            uri = f"{scheme}://{rest.rsplit('@', 1)[1]}" if rest else "(uri)"
        return f"milvus ({uri}, collection {self.milvus_collection})"


def open_index(
    data_dir: Path | str, dim: int, settings: IndexSettings | None = None
) -> RetrievalIndex:
    """The retrieval index for vectors of ``dim`` dimensions (the embedder's)."""
    settings = settings or IndexSettings()
    data = Path(data_dir)
    if settings.backend == "sqlite":
        return SqliteRetrievalIndex(data / STORE_FILE, dim=dim)
    uri = settings.milvus_uri
    if not uri:
        data.mkdir(parents=True, exist_ok=True)
        uri = str(data / MILVUS_LITE_FILE)
    return MilvusRetrievalIndex(
        uri,
        dim=dim,
        collection=settings.milvus_collection,
        token=settings.milvus_token,
        db_name=settings.milvus_db,
        timeout_s=settings.milvus_timeout_s,
    )
