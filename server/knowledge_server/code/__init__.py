"""Code lane: "where is it" — every hit is an exact ``path:start-end`` at an ``index_rev``."""

from .chunking import CHUNKER_VERSION, chunk_file
from .embed import E5Embedder, Embedder, EmbeddingError, HashingEmbedder, OpenAIEmbedder
from .index import CodeIndex
from .model import (
    Chunk,
    ChunkRecord,
    CodeHit,
    CodeSearchResult,
    Freshness,
    IndexInterrupted,
    IndexOptions,
    IndexReport,
)
from .walker import WalkResult, walk_workspace

__all__ = [
    "CHUNKER_VERSION",
    "Chunk",
    "ChunkRecord",
    "CodeHit",
    "CodeIndex",
    "CodeSearchResult",
    "E5Embedder",
    "Embedder",
    "EmbeddingError",
    "Freshness",
    "HashingEmbedder",
    "IndexInterrupted",
    "IndexOptions",
    "IndexReport",
    "OpenAIEmbedder",
    "WalkResult",
    "chunk_file",
    "walk_workspace",
]
