"""The knowledge base's admin operations in the application layer (no server): audit
events of writes and of refused writes, and a full disk answered as
RESOURCE_EXHAUSTED / KNOWLEDGE_STORAGE_FULL, never INTERNAL."""

from __future__ import annotations

from pathlib import Path

import pytest
from knowledge_server._gen.knowledge.v1 import kb_admin_pb2 as pb
from knowledge_server.app import KnowledgeApp
from knowledge_server.auth_model import Principal
from knowledge_server.code.embed import HashingEmbedder
from knowledge_server.config import load_config
from knowledge_server.errors import NotFound, StaleVersion, StorageFull
from knowledge_server.kb.service import KnowledgeBase

from tests.kb_fakes import MemoryIndex

ED = Principal("ed", "org-a", None, "operator")


@pytest.fixture
def app(tmp_path: Path) -> KnowledgeApp:
    cfg = load_config(env={}, overrides={"data_dir": str(tmp_path), "bootstrap": False})
    kb = KnowledgeBase(tmp_path, index=MemoryIndex(), embedder=HashingEmbedder())
    return KnowledgeApp(cfg, kb=kb)


async def test_writes_and_refused_writes_are_audited_without_their_text(app: KnowledgeApp) -> None:
    topic = (
        await app.kb_admin(
            "CreateTopic", pb.CreateTopicRequest(knowledge_key="k", title="Secret title"), ED
        )
    ).topic
    rev = (
        await app.kb_admin(
            "CreateRevision", pb.CreateRevisionRequest(topic_id=topic.id, version_label="1"), ED
        )
    ).revision
    with pytest.raises(StaleVersion):
        await app.kb_admin(
            "PutFaq",
            pb.PutFaqRequest(
                revision_id=rev.id, expected_version=9, question="q", answer="hidden answer"
            ),
            ED,
        )
    await app.kb_admin("ListTopics", pb.ListTopicsRequest(), ED)  # a read: no event
    events = list(app.audit.events())
    assert [(e.operation, e.outcome) for e in events] == [
        ("kb.topic.create", "ok"),
        ("kb.revision.create", "ok"),
        ("kb.faq.put", "KNOWLEDGE_STALE_VERSION"),
    ]
    assert tuple(events[2].targets) == (rev.id,)
    raw = (app.config.data_dir / "audit.sqlite").read_bytes()
    assert b"hidden answer" not in raw and b"Secret title" not in raw
    assert app.audit.verify().ok


async def test_a_full_disk_is_storage_full_and_nothing_half_written(app: KnowledgeApp) -> None:
    assert app.kb is not None
    conn = app.kb.store._conn
    pages = conn.execute("PRAGMA page_count").fetchone()[0]
    conn.execute(f"PRAGMA max_page_count = {pages}")
    created = 0
    with pytest.raises(StorageFull):
        for i in range(200):
            await app.kb_admin(
                "CreateTopic", pb.CreateTopicRequest(knowledge_key=f"k{i}", title="t" * 200), ED
            )
            created += 1
    # The refused one left nothing: exactly the topics that were answered exist.
    assert len(app.kb.store.topics("org-a", limit=1000)) == created


def test_the_upload_limit_is_a_setting_the_served_app_uses(tmp_path: Path) -> None:
    from knowledge_server.config import ConfigError
    from knowledge_server.runtime import build_app

    cfg = load_config(
        env={"KNOWLEDGE_KB_MAX_SOURCE_MIB": "2"},
        overrides={"data_dir": str(tmp_path), "bootstrap": False},
    )
    app = build_app(cfg)
    try:
        assert app.kb is not None and app.kb.max_source_bytes == 2 * 1024 * 1024
    finally:
        app.close()
    with pytest.raises(ConfigError, match="kb_max_source_mib"):
        load_config(env={}, overrides={"data_dir": str(tmp_path), "kb_max_source_mib": 0})


async def test_an_unfinished_upload_is_forgotten_after_its_time(app: KnowledgeApp) -> None:
    assert app.kb is not None
    topic = (
        await app.kb_admin("CreateTopic", pb.CreateTopicRequest(knowledge_key="u", title="U"), ED)
    ).topic
    rev = (
        await app.kb_admin(
            "CreateRevision", pb.CreateRevisionRequest(topic_id=topic.id, version_label="1"), ED
        )
    ).revision
    piece = await app.kb_admin(
        "UploadSource",
        pb.UploadSourceRequest(revision_id=rev.id, file_name="a.md", data=b"# half"),
        ED,
    )
    part = app.kb.store.upload_part(piece.upload_id)
    assert part.exists()
    assert app.kb.sweep_uploads() == 0  # young: kept
    assert app.kb.sweep_uploads(older_than_s=-1) == 1
    assert not part.exists()
    with pytest.raises(NotFound):
        await app.kb_admin(
            "UploadSource",
            pb.UploadSourceRequest(
                revision_id=rev.id, upload_id=piece.upload_id, offset=6, data=b"x"
            ),
            ED,
        )
