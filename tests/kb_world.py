"""A real serving process with a knowledge base for the Retrieve / Answer tests: the real
server on a real port (``build_app``, authentication on), the configured retrieval index
(SQLite or Milvus Lite), and one local model server (``testing/fake_models.py``) as
embedder, reranker and chat model over real HTTP. Two organisations with an admin token
(every kb capability, self-approval allowed) and an agent token each.

``publish`` drives a revision from draft to published through the real admin RPCs."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from knowledge_sdk import KnowledgeClient
from knowledge_server.auth import TokenStore
from knowledge_server.testing.fake_models import FakeModelServer

from tests.conftest import ServerThread

ORGS = ("org-a", "org-b")
KB_CAPS = ["kb.read", "kb.edit", "kb.review", "kb.publish", "kb.admin"]


@dataclass
class KbWorld:
    server: ServerThread
    fake: FakeModelServer
    tokens: dict[str, str]
    backend: str
    topics: dict[str, str] = field(default_factory=dict)

    def client(self, who: str, timeout: float = 30) -> KnowledgeClient:
        return KnowledgeClient(self.server.address, token=self.tokens[who], timeout=timeout)

    @property
    def app(self) -> Any:
        return self.server.app

    def stop(self) -> None:
        self.server.stop()
        self.fake.stop()


def _serve(
    root: Path, backend: str, fake: FakeModelServer, store: TokenStore, **overrides: Any
) -> ServerThread:
    settings: dict[str, Any] = {
        "auth": "on",
        "embedder": "openai",
        "embedder_url": fake.url,
        "embedder_model": "fake-embed",
        "embedder_dim": fake.dim,
        "kb_index": backend,
        "rerank_url": fake.url,
        "rerank_model": "fake-rerank",
        "llm_url": fake.url,
        "llm_model": "fake-chat",
        "llm_max_retries": 0,
        "retrieve_total_timeout_ms": 2500,
        "watch_sessions": False,
    }
    settings.update(overrides)
    try:
        return ServerThread(root, authenticate=store.authenticate, **settings)
    except BaseException:
        fake.stop()
        raise


def start_world(root: Path, backend: str, **overrides: Any) -> KbWorld:
    """The server with the model server as its embedder, reranker and chat model; pass
    ``rerank_url=""`` for no reranker."""
    fake = FakeModelServer(dim=256).start()
    data = root / "data"
    store = TokenStore(data / "tokens.json")
    tokens: dict[str, str] = {}
    for org in ORGS:
        tokens[f"admin-{org}"] = store.create(f"admin-{org}", org, None, "operator", KB_CAPS)[1]
        tokens[f"agent-{org}"] = store.create(f"agent-{org}", org, None, "agent")[1]
    tokens["editor-only"] = store.create("editor-only", "org-a", None, "operator", ["kb.edit"])[1]
    server = _serve(root, backend, fake, store, **overrides)
    world = KbWorld(server, fake, tokens, backend)
    for org in ORGS:
        with world.client(f"admin-{org}") as kc:
            policy = kc.kb_get_policy().policy
            kc.kb_set_policy(True, policy.version if policy else 0)
    return world


def restart_world(world: KbWorld, root: Path, *, dim: int, **overrides: Any) -> KbWorld:
    """``world`` (stopped first) served again from the same data directory and tokens,
    with a new model server whose vectors have ``dim`` dimensions; ``overrides`` as for
    ``start_world`` (``embedder_model`` names another embedding model)."""
    world.stop()
    fake = FakeModelServer(dim=dim).start()
    store = TokenStore(root / "data" / "tokens.json")
    server = _serve(root, world.backend, fake, store, **overrides)
    return KbWorld(server, fake, world.tokens, world.backend, dict(world.topics))


def wait_task(kc: KnowledgeClient, task_id: str) -> Any:
    last = None
    for event in kc.kb_watch_task(task_id):
        last = event.task
    assert last is not None
    return last


def publish(
    kc: KnowledgeClient,
    key: str,
    title: str,
    label: str,
    *,
    markdown: str = "",
    faqs: tuple[tuple[str, str], ...] = (),
    tags: tuple[str, ...] = (),
    files: tuple[tuple[str, bytes], ...] = (),
    publish_it: bool = True,
) -> tuple[str, str]:
    """(topic id, revision id) of a new revision of the topic ``key`` (created when new)
    with a markdown file, other files (``(file name, bytes)``) and FAQ entries, processed
    and (by default) published."""
    topics = {t.knowledge_key: t for t in kc.kb_list_topics().topics}
    topic = topics.get(key)
    if topic is None:
        topic = kc.kb_create_topic(key, title).topic
    assert topic is not None
    release = kc.kb_get_topic(topic.id).topic.release_revision_id
    rev = kc.kb_create_revision(topic.id, label).revision
    assert rev is not None
    if markdown:
        rev = kc.kb_upload_source_piece(
            rev.id,
            file_name=f"{key}.md",
            data=markdown.encode(),
            final=True,
            expected_version=rev.version,
        ).revision
    for file_name, data in files:
        rev = kc.kb_upload_source_piece(
            rev.id, file_name=file_name, data=data, final=True, expected_version=rev.version
        ).revision
    for question, answer in faqs:
        rev = kc.kb_put_faq(rev.id, rev.version, question, answer).revision
    if tags:
        rev = kc.kb_update_revision(rev.id, rev.version, tags=list(tags)).revision
    rev = kc.kb_submit(rev.id, rev.version).revision
    rev = kc.kb_approve(rev.id, rev.version).revision
    task = kc.kb_process(rev.id, rev.version, idempotency_key=f"{key}-{label}").task
    done = wait_task(kc, task.id)
    assert done.state == "SUCCEEDED", (done.error_category, done.error_message)
    rev = kc.kb_get_revision(rev.id).revision
    if publish_it:
        kc.kb_publish(rev.id, rev.version, expected_release=release)
    return topic.id, rev.id
