"""Helpers for the knowledge base's management calls (``KnowledgeBaseAdminService``)."""

from __future__ import annotations

import errno
from collections.abc import Callable
from pathlib import Path

from knowledge_sdk._gen.knowledge import v1
from knowledge_sdk.client import KnowledgeClient

__all__ = ["PIECE_BYTES", "upload_file"]

# The service takes at most 1 MiB per UploadSource call.
PIECE_BYTES = 1024 * 1024


def upload_file(
    client: KnowledgeClient,
    revision_id: str,
    expected_version: int,
    path: str | Path,
    *,
    file_name: str = "",
    media_type: str = "",
    piece_bytes: int = PIECE_BYTES,
    progress: Callable[[int, int], None] | None = None,
) -> v1.UploadSourceResponse:
    """Upload a whole file as a source of a DRAFT revision, in pieces; the last call adds
    it (checked against ``expected_version``). ``progress(sent, total)`` after each piece.
    A file that shrinks during the upload is ``OSError`` (the source is not added)."""
    path = Path(path)
    total = path.stat().st_size
    name = file_name or path.name
    upload_id = ""
    sent = 0
    with path.open("rb") as fh:
        while True:
            data = fh.read(piece_bytes)
            if not data and sent < total:
                # Shorter than when it was measured: the file changed under the upload
                # (sending nothing more would never end it).
                raise OSError(
                    errno.EIO,
                    f"the file changed while it was uploaded ({total} bytes at the start,"
                    f" {sent} read); nothing was added",
                    str(path),
                )
            final = sent + len(data) >= total
            resp = client.kb_upload_source_piece(
                revision_id,
                upload_id=upload_id,
                file_name=name,
                media_type=media_type,
                offset=sent,
                data=data,
                final=final,
                expected_version=expected_version,
            )
            upload_id = resp.upload_id
            sent += len(data)
            if progress is not None:
                progress(sent, total)
            if final:
                return resp
