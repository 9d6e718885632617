"""Document graph (Enterprise): entities, relations and themes of non-code chunks.

Pipeline: :class:`DocGraphBuilder` (LLM extraction with validation and cache, structural
extraction, deterministic themes, cited summaries) writes revisions into ``docgraph.sqlite``
(:class:`DocGraphStore`); :class:`DocGraphOps` answers the fixed read-only operations. The edition
gate lives in the transport layer, not here.
"""

from __future__ import annotations

from .build import BuildReport, BuildSettings, DocGraphBuilder, Estimate
from .extract import ExtractionSettings
from .llm import NOT_CONFIGURED_REASON, LLMClient, LLMSettings, LLMUnavailable, make_client
from .model import DocChunk, chunk_markdown_file, entity_id_for, theme_id_for
from .ops import OPS, DocGraphOps
from .prompts import KEYWORDS_PROMPT_VERSION, PROMPT_VERSION, SUMMARY_PROMPT_VERSION
from .store import DB_FILENAME, DocGraphStore
from .structural import STRUCTURAL_VERSION
from .themes import ThemeSettings

__all__ = [
    "DB_FILENAME",
    "KEYWORDS_PROMPT_VERSION",
    "NOT_CONFIGURED_REASON",
    "OPS",
    "PROMPT_VERSION",
    "STRUCTURAL_VERSION",
    "SUMMARY_PROMPT_VERSION",
    "BuildReport",
    "BuildSettings",
    "DocChunk",
    "DocGraphBuilder",
    "DocGraphOps",
    "DocGraphStore",
    "Estimate",
    "ExtractionSettings",
    "LLMClient",
    "LLMSettings",
    "LLMUnavailable",
    "ThemeSettings",
    "chunk_markdown_file",
    "entity_id_for",
    "make_client",
    "theme_id_for",
]
