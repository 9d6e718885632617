"""A knowledge-base source holding secrets, over a real server with a SQLite index and a
local model server.

KB-SEC-1: processing replaces every secret ``knowledge_server.redact`` recognises in a
source's text (documents and FAQ entries, headings too) before embedding: the embedding
service, the index file, Retrieve's sources and the prompt Answer sends never hold one,
and the task counts what it replaced."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import apsw
from knowledge_server.redact import looks_like_secret

from tests.kb_world import publish, start_world, wait_task

AWS_KEY = "AKIAIOSFODNN7EXAMPLE"
PASSWORD = "Hunter2Hunter2"
FAQ_TOKEN = "ghp_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8"
DOC = f"""# Staging database

Connect to the staging database with these settings:

password={PASSWORD} and aws_key {AWS_KEY} for the backup bucket.

## Restores

Restores of the backup bucket take about an hour.
"""


def test_kb_sec1_secrets_never_reach_embedder_index_retrieve_or_prompt(tmp_path: Path) -> None:
    assert looks_like_secret(f"password={PASSWORD}") and looks_like_secret(AWS_KEY)
    assert looks_like_secret(FAQ_TOKEN)
    world = start_world(tmp_path, "sqlite", rerank_url="")
    secrets = (AWS_KEY, PASSWORD, FAQ_TOKEN)
    try:
        with world.client("admin-org-a") as kc:
            _, rev_id = publish(
                kc,
                "staging-db",
                "Staging database",
                "v1",
                markdown=DOC,
                faqs=(("Which token deploys staging?", f"The deploy token is {FAQ_TOKEN}."),),
            )
            embedded = repr(world.fake.last_request["embeddings"])
            tasks = kc.kb_get_revision(rev_id).tasks
        assert [t.secrets_redacted for t in tasks] == [3]
        assert "backup bucket" in embedded
        for secret in secrets:
            assert secret not in embedded
        with world.client("agent-org-a") as kc:
            found = kc.kb_retrieve("staging database password backup bucket deploy token")
            texts = " ".join(s.content for s in found.sources)
            assert "backup bucket" in texts and "[REDACTED:" in texts
            answer = kc.kb_answer("Which token deploys staging and what is the password?")
            prompt = repr(world.fake.last_request["chat"])
        assert answer.sources and "[REDACTED:" in prompt
        for secret in secrets:
            assert secret not in texts and secret not in prompt and secret not in answer.answer
        index = apsw.Connection(str(tmp_path / "data" / "kb_index.sqlite"))
        rows = index.execute("SELECT text FROM chunks").fetchall()
        assert rows
        for (text,) in rows:
            for secret in secrets:
                assert secret not in text
    finally:
        world.stop()


def _pem(lines: int) -> str:
    body = [("MIIEvQIBADANBgkqhkiG9w0BAQEFAASC" + f"{i:04d}")[:32] * 2 for i in range(lines)]
    return "\n".join(["-----BEGIN PRIVATE KEY-----", *body, "-----END PRIVATE KEY-----"])


def test_kb_sec1_a_document_is_redacted_whole_before_chunking_and_counted_once() -> None:
    """Redaction runs on the converted document, not on its chunks: a key longer than a
    chunk is found whole (a chunk holding the key's middle has no BEGIN line to match), one
    split over blocks (a PDF's lines) is replaced to its END line, and a heading repeated in
    every chunk of its section counts once."""
    from knowledge_server.kb import pipeline
    from knowledge_server.kb.chunk import ChunkSettings, chunk_document
    from knowledge_server.kb.convert import Block, Document

    key = _pem(60)
    key_lines = key.split("\n")
    doc = Document(
        title=f"Keys {AWS_KEY}",
        media_type="text/markdown",
        blocks=(
            Block("heading", f"password={PASSWORD}", level=1),
            *(Block("text", f"Paragraph {i} about the backup bucket. " * 8) for i in range(6)),
            Block("text", key),
            Block("text", "Before the split key:\n" + "\n".join(key_lines[:20])),
            *(Block("text", line) for line in key_lines[20:-1]),
            Block("text", key_lines[-1] + "\nAfter the split key."),
            Block("faq", f"The token is {FAQ_TOKEN}.", question=f"Where is {AWS_KEY}?"),
        ),
    )
    clean, count = pipeline.redacted(doc)
    assert count == 6  # title, heading, whole key, split key, FAQ question, FAQ answer
    chunks = chunk_document(clean, ChunkSettings(max_tokens=64, overlap_tokens=8))
    assert len(chunks) > 10
    texts = " ".join(c.text + " " + c.title + " " + " ".join(c.section_path) for c in chunks)
    for value in (AWS_KEY, PASSWORD, FAQ_TOKEN, *key_lines[1:-1]):
        assert value not in texts
    assert "Before the split key:" in texts and "After the split key." in texts
    assert "backup bucket" in texts
    plain = Document(title="t", media_type="text/markdown", blocks=(Block("text", "no secret"),))
    assert pipeline.redacted(plain) == (plain, 0)


def _stage_as_uploaded(world: Any, topic_id: str, rev_id: str, title: str) -> None:
    """Stage a revision's chunks as an earlier version staged them: the text as uploaded."""
    from knowledge_server.kb import pipeline
    from knowledge_server.kb.index.port import index_chunks

    kb = world.app.kb
    rev = kb.store.revision("org-a", rev_id)
    (src,) = kb.store.sources("org-a", rev_id)
    source = pipeline.SourceInput(
        src.id, src.kind, src.file_name, src.media_type, kb.store.blob_path(src.sha256)
    )
    raw = pipeline.chunk_document(pipeline.convert_source(source, title))
    chunks = index_chunks(
        org="org-a", topic_id=topic_id, revision_id=rev_id, tags=rev.tags, sources=[(src.id, raw)]
    )
    kb.index.stage("org-a", rev_id, chunks, kb.embedder.embed([c.text for c in chunks]))


def test_kb_sec1_revisions_indexed_before_redaction_are_restaged_on_upgrade(
    tmp_path: Path,
) -> None:
    """A store written before processing redacted secrets: its indexed revisions hold the
    sources' text as uploaded, and so do retired ones (offline, rolled back), whose chunks
    stay until a reconcile drops them. The schema steps that come with redaction queue
    each of them once for a RESTAGE, so the next server's worker replaces their chunks
    with redacted ones; states and releases stay as they were."""
    from knowledge_server.kb.store import DB_FILE

    world = start_world(tmp_path, "sqlite", rerank_url="")
    try:
        with world.client("admin-org-a") as kc:
            topic_id, rev_id = publish(kc, "staging-db", "Staging database", "v1", markdown=DOC)
            old_id, old_rev = publish(kc, "old-db", "Old database", "v1", markdown=DOC)
            kc.kb_offline(old_id, old_rev)
        _stage_as_uploaded(world, topic_id, rev_id, "Staging database")
        _stage_as_uploaded(world, old_id, old_rev, "Old database")
    finally:
        world.stop()
    index = apsw.Connection(str(tmp_path / "data" / "kb_index.sqlite"))
    assert sum(AWS_KEY in t for (t,) in index.execute("SELECT text FROM chunks")) >= 2
    index.close()
    store = apsw.Connection(str(tmp_path / "data" / DB_FILE))
    store.execute("DELETE FROM migrations WHERE name LIKE '00%_restage%_for_redaction'")
    store.close()

    world = start_world(tmp_path, "sqlite", rerank_url="")
    try:
        with world.client("admin-org-a") as kc:
            for rev in (rev_id, old_rev):
                restage = [t for t in kc.kb_get_revision(rev).tasks if t.kind == "RESTAGE"]
                assert len(restage) == 1, rev
                done = wait_task(kc, restage[0].id)
                assert done.state == "SUCCEEDED" and done.secrets_redacted == 2
            assert kc.kb_get_topic(topic_id).topic.release_revision_id == rev_id
            assert kc.kb_get_revision(old_rev).revision.state == "OFFLINE"
        with world.client("agent-org-a") as kc:
            found = kc.kb_retrieve("staging database password backup bucket")
            assert found.sources and all(AWS_KEY not in s.content for s in found.sources)
        index = apsw.Connection(str(tmp_path / "data" / "kb_index.sqlite"))
        texts = [t for (t,) in index.execute("SELECT text FROM chunks")]
        assert texts and not any(AWS_KEY in t or PASSWORD in t for t in texts)
    finally:
        world.stop()


def test_kb_sec1_a_text_that_names_a_key_line_keeps_the_rest_of_its_document() -> None:
    """Only key material is carried past a block that opens a key: a how-to that names the
    BEGIN line in a sentence loses the rest of that sentence (the rule runs to the end of
    its text), never the sections after it."""
    from knowledge_server.kb import pipeline
    from knowledge_server.kb.convert import Block, Document

    doc = Document(
        title="SSH keys",
        media_type="text/markdown",
        blocks=(
            Block(
                "text",
                "A key file starts with `-----BEGIN OPENSSH PRIVATE KEY-----`; never paste it.",
            ),
            Block("heading", "Rotating a key", level=2),
            Block("text", "Run ssh-keygen -t ed25519 and add the new public key."),
            Block("text", "MIIEvQIBADANBgkqhkiG9w0BAQEFAASC"),
        ),
    )
    clean, count = pipeline.redacted(doc)
    assert count == 1
    assert [b.text for b in clean.blocks[1:]] == [b.text for b in doc.blocks[1:]]


def test_kb_sec1_a_key_joined_into_paragraphs_or_cut_by_a_footer_is_found_whole() -> None:
    """How converters hand over a key: its lines joined into paragraphs (Markdown), a
    page's footer between its parts (PDF), a short last line. The stretch up to the END
    line reads as key material and goes; the text around it stays."""
    from knowledge_server.kb import pipeline
    from knowledge_server.kb.convert import Block, Document

    body = _pem(24).split("\n")[1:-1]
    cases = {
        "paragraphs": [
            "-----BEGIN RSA PRIVATE KEY-----\nProc-Type: 4,ENCRYPTED\nDEK-Info: AES-128-CBC,AB12",
            " ".join(body[:12]),
            " ".join(body[12:]) + " Zw==",
            "-----END RSA PRIVATE KEY-----",
        ],
        "footer": [
            "-----BEGIN PRIVATE KEY-----\n" + "\n".join(body[:12]),
            "Page 1 of 2",
            "\n".join(body[12:]) + "\nZw==\n-----END PRIVATE KEY-----",
        ],
    }
    for name, key_blocks in cases.items():
        doc = Document(
            title="Deploy key",
            media_type="text/markdown",
            blocks=(
                Block("text", "The staging deploy key:"),
                *(Block("text", t) for t in key_blocks),
                Block("text", "Rotate it yearly."),
            ),
        )
        clean, count = pipeline.redacted(doc)
        texts = [b.text for b in clean.blocks]
        assert count == 1, name
        assert texts[0] == "The staging deploy key:" and texts[-1] == "Rotate it yearly.", name
        joined = "\n".join(texts)
        assert not any(line in joined for line in (*body, "Zw==", "DEK-Info")), (name, joined)


def test_kb_sec1_mentions_lists_and_a_second_key_in_an_end_block() -> None:
    """A BEGIN line named in prose does not reach across the prose to a later example key
    (each is counted); a list of commit hashes after such a mention is not key material;
    a key that begins in the block where another ends is found too."""
    from knowledge_server.kb import pipeline
    from knowledge_server.kb.convert import Block, Document

    body = _pem(12).split("\n")[1:-1]
    prose = "To create a key for the staging server run openssl genrsa on the bastion."
    tutorial = (
        Block("text", "Never commit a file that contains `-----BEGIN RSA PRIVATE KEY-----`"),
        Block("text", prose),
        Block("text", "-----BEGIN RSA PRIVATE KEY-----\n" + "\n".join(body)),
        Block("text", "-----END RSA PRIVATE KEY-----\nRotate yearly."),
    )
    hashes = [f"- {'%040x' % (0xABCDEF12345 * (i + 7))} revert deploy key" for i in range(4)]
    incident = (
        Block("text", "The leaked file began with -----BEGIN OPENSSH PRIVATE KEY-----"),
        *(Block("text", h) for h in hashes),
    )
    two = (
        Block("text", "-----BEGIN EC PRIVATE KEY-----\n" + "\n".join(body[:6])),
        Block(
            "text",
            "\n".join(body[6:]) + "\n-----END EC PRIVATE KEY-----\n"
            "-----BEGIN EC PRIVATE KEY-----\n" + "\n".join(body[:6]),
        ),
        Block("text", "\n".join(body[6:]) + "\n-----END EC PRIVATE KEY-----\nRotate yearly."),
    )
    for name, blocks, count, kept in (
        ("tutorial", tutorial, 2, [prose, "Rotate yearly."]),
        ("incident", incident, 1, hashes),
        ("two keys", two, 2, ["Rotate yearly."]),
    ):
        clean, n = pipeline.redacted(Document(title="Keys", media_type="text/plain", blocks=blocks))
        joined = "\n".join(b.text for b in clean.blocks)
        assert n == count, (name, n)
        assert all(k in joined for k in kept), (name, joined)
        assert not any(line in joined for line in body), (name, joined)


STAMP = "2026-01-01T00:00:00.000000Z"


def _upgraded_from_step_003(
    root: Path, revisions: list[tuple[str, str]], tasks: list[tuple[str, str, str, str, str]]
) -> tuple[list[tuple[str, str, str, str]], list[str]]:
    """A store as step 003 left it, holding ``revisions`` ((id, state), 3 chunks each) and
    ``tasks`` ((id, revision, kind, idempotency key, state)), opened by the current code:
    its tasks (id, revision, kind, state) and the steps it has recorded."""
    from knowledge_server.kb.store import DB_FILE, KBStore

    KBStore(root).close()
    conn = apsw.Connection(str(root / DB_FILE))
    conn.execute("DELETE FROM migrations WHERE name LIKE '004%'")
    for rev, state in revisions:
        conn.execute(
            "INSERT INTO revisions(id, org, topic_id, version_label, state, version, created_by,"
            " chunk_count, created_at, updated_at) VALUES (?, 'org-a', 't', 'v1', ?, 5, 'u', 3, ?, ?)",
            (rev, state, STAMP, STAMP),
        )
    for task, rev, kind, key, state in tasks:
        conn.execute(
            "INSERT INTO tasks(id, org, revision_id, kind, idempotency_key, state, version,"
            " created_by, created_at, updated_at) VALUES (?, 'org-a', ?, ?, ?, ?, 3, 'u', ?, ?)",
            (task, rev, kind, key, state, STAMP, STAMP),
        )
    conn.close()
    KBStore(root).close()
    conn = apsw.Connection(str(root / DB_FILE))
    after = conn.execute("SELECT id, revision_id, kind, state FROM tasks ORDER BY id").fetchall()
    applied = [r[0] for r in conn.execute("SELECT name FROM migrations ORDER BY name")]
    conn.close()
    return after, applied


def test_kb_sec1_a_revision_restaged_for_redaction_and_then_retired_is_not_queued_again(
    tmp_path: Path,
) -> None:
    """Step 003 restaged a published revision, and its topic went offline afterwards: step
    004 (retired revisions) leaves it, where it failed on the idempotency key before and
    stopped the server from opening the store."""
    tasks, applied = _upgraded_from_step_003(
        tmp_path,
        [("rev_1", "OFFLINE")],
        [("task_1", "rev_1", "RESTAGE", "restage:rev_1:redaction", "SUCCEEDED")],
    )
    assert tasks == [("task_1", "rev_1", "RESTAGE", "SUCCEEDED")]
    assert applied[-1] == "004_restage_retired_for_redaction"


def test_kb_sec1_a_begin_line_alone_opens_a_key_and_hashes_between_mentions_stay() -> None:
    """A BEGIN line on a block of its own, its body in the next blocks and no END line (a
    truncated key, one line per block): the body goes. Commit ids and checksums between a
    BEGIN and an END named in prose are hexadecimal, not a key's base64: they stay."""
    from knowledge_server.kb import pipeline
    from knowledge_server.kb.convert import Block, Document

    body = _pem(8).split("\n")[1:-1]
    truncated = (
        Block("text", "-----BEGIN OPENSSH PRIVATE KEY-----"),
        *(Block("text", b) for b in body),
    )
    sums = [f"- {'%064x' % (0x1234567 * (i + 3))} pkg-{i}.tgz" for i in range(4)]
    mentions = (
        Block("text", "The leaked file began with -----BEGIN RSA PRIVATE KEY-----."),
        *(Block("text", s) for s in sums),
        Block("text", "and it ended with -----END RSA PRIVATE KEY-----."),
    )
    clean, n = pipeline.redacted(Document(title="k", media_type="text/plain", blocks=truncated))
    joined = "\n".join(b.text for b in clean.blocks)
    assert n == 1 and not any(line in joined for line in body), joined
    clean, _ = pipeline.redacted(Document(title="k", media_type="text/plain", blocks=mentions))
    assert [b.text for b in clean.blocks[1:-1]] == sums


def test_kb_sec1_a_callers_task_key_in_the_restage_namespace_does_not_stop_the_upgrade(
    tmp_path: Path,
) -> None:
    """ProcessRevision takes any idempotency key, one like a restage's too: the steps that
    queue restages leave such a key be instead of failing the store's opening."""
    tasks, applied = _upgraded_from_step_003(
        tmp_path,
        [("rev_1", "OFFLINE"), ("rev_2", "APPROVED")],
        [("task_1", "rev_2", "PROCESS", "restage:rev_1:redaction-retired", "SUCCEEDED")],
    )
    assert applied[-1] == "004_restage_retired_for_redaction"
    assert tasks == [("task_1", "rev_2", "PROCESS", "SUCCEEDED")]
