"""A knowledge-base source holding secrets, over a real server with a SQLite index and a
local model server.

KB-SEC-1: processing replaces every secret ``knowledge_server.redact`` recognises in a
source's text (documents and FAQ entries, headings too) before embedding: the embedding
service, the index file, Retrieve's sources and the prompt Answer sends never hold one,
and the task counts what it replaced."""

from __future__ import annotations

from pathlib import Path

import apsw
from knowledge_server.redact import looks_like_secret

from tests.kb_world import publish, start_world

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


def test_kb_sec1_headings_and_titles_are_redacted_and_counted() -> None:
    from knowledge_server.kb import pipeline
    from knowledge_server.kb.chunk import Chunk

    clean = Chunk(0, "text", "Backups", ("Restores",), None, "Restores take an hour.")
    secret = Chunk(
        1,
        "text",
        f"Keys {AWS_KEY}",
        ("Setup", f"password={PASSWORD}"),
        2,
        f"Use {AWS_KEY} and {FAQ_TOKEN}.",
    )
    out, count = pipeline.redacted([clean, secret])
    assert count == 4
    assert out[0] is clean
    assert out[1].page == 2 and out[1].ordinal == 1
    assert out[1].section_path[0] == "Setup"
    for field in (out[1].title, " ".join(out[1].section_path), out[1].text):
        assert "[REDACTED:" in field
        for value in (AWS_KEY, PASSWORD, FAQ_TOKEN):
            assert value not in field
