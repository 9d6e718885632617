"""Episodes lane: what agents already did, imported from harness session logs.

Public entry points: :class:`EpisodeStore` (``episodes.sqlite``: search, get_event, counts,
sessions, iter_events_meta), :func:`ingest` / :func:`watch`, :func:`discover`.
"""

from .discover import default_roots, discover
from .ingest import ingest, ingest_file, ingest_sample_if_empty, sample_path, watch
from .model import (
    EpisodeHit,
    Event,
    EventDetail,
    EventMeta,
    IngestReport,
    SessionInfo,
    SessionMeta,
    event_id,
    parse_event_id,
)
from .store import DB_FILE, EpisodeStore, InvalidQuery

__all__ = [
    "DB_FILE",
    "EpisodeHit",
    "EpisodeStore",
    "Event",
    "EventDetail",
    "EventMeta",
    "IngestReport",
    "InvalidQuery",
    "SessionInfo",
    "SessionMeta",
    "default_roots",
    "discover",
    "event_id",
    "ingest",
    "ingest_file",
    "ingest_sample_if_empty",
    "parse_event_id",
    "sample_path",
    "watch",
]
