"""The distributed retrieval index: Milvus through ``pymilvus.MilvusClient``.

The same code serves Milvus Lite (``uri`` a local file, e.g. ``DATA_DIR/kb_index.milvus.db``)
and a Milvus server or cluster (``http://host:19530``, with ``token``). One collection,
``<collection>_d<dim>``, holds every organisation's chunks (schema in docs/kb-index.md):

- ``pk``: sha-256 of (org, chunk_id), the primary key (chunk ids are unique per org only);
- ``org``: the partition key, so each organisation's rows sit in their own partitions;
- ``lexical``: title, section path and text, analysed (``ANALYZER``), turned into the
  sparse ``sparse`` field by a BM25 function; ``text`` keeps the chunk text as stored;
- ``dense``: the chunk's embedding (cosine);
- the scalar fields of ``IndexChunk`` (``section_path`` as a JSON string, ``page`` 0 for none,
  ``tags`` an array of tag codes).

Every request carries an explicit ``org == ... and revision_id in [...]`` filter, and every
row the server answers is checked again (``port.recheck``): ``hybrid_search`` has been
reported not to enforce partition-key isolation by itself. Values enter an expression only
as string literals written by ``_literal`` (quotes and backslashes escaped, control
characters refused): Milvus Lite does not read filter templates (``{name}`` with
``filter_params``), so the same code cannot rely on them.

Hybrid queries (text and vector) use ``hybrid_search`` with ``RRFRanker(RRF_K)``, so the
fused score is the same as the embedded index's, but the server does not report each
list's ranks: those hits have ``lexical_rank`` and ``vector_rank`` None. A query with
text only or a vector only is one ``search`` and reports its rank.

Staging replaces a revision by a delete and inserts, which are not one transaction in
Milvus: a revision is staged before it is published and never re-staged while visible.
It ends with a flush, so the staged rows are durable and in indexed segments before the
revision can be published.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Collection, Mapping, Sequence
from types import ModuleType
from typing import Any

from knowledge_server.kb.index.port import (
    RRF_K,
    IndexChunk,
    IndexHit,
    recheck,
    validate_stage,
)


def _pymilvus() -> ModuleType:
    """pymilvus, imported on first use: importing it takes seconds (bench/RESULTS.md), and a
    server on the embedded index never needs it."""
    import pymilvus

    module: ModuleType = pymilvus
    return module


__all__ = ["ANALYZER", "MilvusRetrievalIndex"]

# Word tokens, lower-cased. Milvus Lite 3.2 knows the ``standard`` and ``jieba`` (Chinese)
# tokenizers and leaves a ``stemmer`` filter without effect ("refunds" did not find
# "refund" with one), so the default is what it runs; a Milvus server may be given
# another analyzer (docs/kb-index.md).
ANALYZER: Mapping[str, Any] = {"tokenizer": "standard", "filter": ["lowercase"]}
_MAX_VARCHAR = 65_535
_MAX_TAGS = 64
_INSERT_BATCH = 1_000
_FIELDS = [
    "org",
    "chunk_id",
    "topic_id",
    "revision_id",
    "source_id",
    "ordinal",
    "kind",
    "title",
    "section_path",
    "page",
    "text",
    "tags",
]


def _literal(value: str) -> str:
    """A Milvus string literal holding ``value`` exactly."""
    if any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in value):
        raise ValueError("ids and tag codes cannot contain control characters")
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _literals(values: Collection[str]) -> str:
    return "[" + ", ".join(_literal(v) for v in sorted(set(values))) + "]"


def _pk(org: str, chunk_id: str) -> str:
    return hashlib.sha256(json.dumps([org, chunk_id]).encode()).hexdigest()


def _entity_chunk(entity: Mapping[str, Any]) -> IndexChunk:
    page = int(entity["page"])
    return IndexChunk(
        chunk_id=str(entity["chunk_id"]),
        org=str(entity["org"]),
        topic_id=str(entity["topic_id"]),
        revision_id=str(entity["revision_id"]),
        source_id=str(entity["source_id"]),
        ordinal=int(entity["ordinal"]),
        kind=str(entity["kind"]),
        title=str(entity["title"]),
        section_path=tuple(json.loads(str(entity["section_path"]))),
        page=page if page > 0 else None,
        text=str(entity["text"]),
        tags=tuple(str(t) for t in entity["tags"]),
    )


def _clip(text: str, limit: int = _MAX_VARCHAR) -> str:
    """``text`` within ``limit`` UTF-8 bytes (Milvus VARCHAR lengths are in bytes)."""
    data = text.encode("utf-8")
    if len(data) <= limit:
        return text
    return data[:limit].decode("utf-8", errors="ignore")


class MilvusRetrievalIndex:
    """``RetrievalIndex`` over one Milvus collection for vectors of ``dim`` dimensions."""

    def __init__(
        self,
        uri: str,
        *,
        dim: int,
        collection: str = "kb_chunks",
        token: str = "",
        db_name: str = "",
        timeout_s: float = 30.0,
        analyzer: Mapping[str, Any] | None = None,
    ) -> None:
        self.dim = dim
        self.collection = f"{collection}_d{int(dim)}"
        self.timeout_s = timeout_s
        self.client = _pymilvus().MilvusClient(
            uri=uri, token=token, db_name=db_name, timeout=timeout_s
        )
        if not self.client.has_collection(self.collection):
            self._create(analyzer or ANALYZER)
        self.client.load_collection(self.collection)

    def _create(self, analyzer: Mapping[str, Any]) -> None:
        schema = self.client.create_schema(auto_id=False, enable_dynamic_field=False)
        schema.add_field("pk", _pymilvus().DataType.VARCHAR, is_primary=True, max_length=64)
        schema.add_field("org", _pymilvus().DataType.VARCHAR, max_length=256, is_partition_key=True)
        schema.add_field("chunk_id", _pymilvus().DataType.VARCHAR, max_length=512)
        schema.add_field("topic_id", _pymilvus().DataType.VARCHAR, max_length=256)
        schema.add_field("revision_id", _pymilvus().DataType.VARCHAR, max_length=256)
        schema.add_field("source_id", _pymilvus().DataType.VARCHAR, max_length=256)
        schema.add_field("ordinal", _pymilvus().DataType.INT64)
        schema.add_field("kind", _pymilvus().DataType.VARCHAR, max_length=16)
        schema.add_field("title", _pymilvus().DataType.VARCHAR, max_length=4096)
        schema.add_field("section_path", _pymilvus().DataType.VARCHAR, max_length=8192)
        schema.add_field("page", _pymilvus().DataType.INT64)
        schema.add_field("text", _pymilvus().DataType.VARCHAR, max_length=_MAX_VARCHAR)
        schema.add_field(
            "lexical",
            _pymilvus().DataType.VARCHAR,
            max_length=_MAX_VARCHAR,
            enable_analyzer=True,
            analyzer_params=dict(analyzer),
        )
        schema.add_field("sparse", _pymilvus().DataType.SPARSE_FLOAT_VECTOR)
        schema.add_field("dense", _pymilvus().DataType.FLOAT_VECTOR, dim=self.dim)
        schema.add_field(
            "tags",
            _pymilvus().DataType.ARRAY,
            element_type=_pymilvus().DataType.VARCHAR,
            max_capacity=_MAX_TAGS,
            max_length=128,
        )
        schema.add_function(
            _pymilvus().Function(
                name="lexical_bm25",
                function_type=_pymilvus().FunctionType.BM25,
                input_field_names=["lexical"],
                output_field_names=["sparse"],
            )
        )
        index = self.client.prepare_index_params()
        index.add_index("sparse", index_type="SPARSE_INVERTED_INDEX", metric_type="BM25")
        index.add_index("dense", index_type="AUTOINDEX", metric_type="COSINE")
        self.client.create_collection(
            self.collection, schema=schema, index_params=index, consistency_level="Strong"
        )

    def warm(self, org: str | None = None, *, wait: bool = False) -> None:
        """Nothing to prepare: the Milvus server holds what its searches need."""

    def close(self) -> None:
        self.client.close()

    # ------------------------------------------------------------------ writes

    def _count(self, expr: str) -> int:
        rows = self.client.query(
            self.collection, filter=expr, output_fields=["count(*)"], timeout=self.timeout_s
        )
        return int(rows[0]["count(*)"]) if rows else 0

    def drop_revision(self, org: str, revision_id: str) -> int:
        expr = f"org == {_literal(org)} and revision_id == {_literal(revision_id)}"
        n = self._count(expr)
        if n:
            self.client.delete(self.collection, filter=expr, timeout=self.timeout_s)
        return n

    def stage(
        self,
        org: str,
        revision_id: str,
        chunks: Sequence[IndexChunk],
        vectors: Sequence[Sequence[float]],
    ) -> None:
        validate_stage(org, revision_id, chunks, vectors, self.dim)
        rows = []
        for chunk, vector in zip(chunks, vectors, strict=True):
            if len(chunk.text.encode("utf-8")) > _MAX_VARCHAR or len(chunk.tags) > _MAX_TAGS:
                raise ValueError(f"chunk {chunk.chunk_id!r} is over the collection's field limits")
            rows.append(
                {
                    "pk": _pk(org, chunk.chunk_id),
                    "org": org,
                    "chunk_id": chunk.chunk_id,
                    "topic_id": chunk.topic_id,
                    "revision_id": revision_id,
                    "source_id": chunk.source_id,
                    "ordinal": chunk.ordinal,
                    "kind": chunk.kind,
                    "title": _clip(chunk.title, 4096),
                    "section_path": json.dumps(list(chunk.section_path), ensure_ascii=False),
                    "page": chunk.page or 0,
                    "text": chunk.text,
                    "lexical": _clip("\n".join([chunk.title, *chunk.section_path, chunk.text])),
                    "dense": [float(x) for x in vector],
                    "tags": list(chunk.tags),
                }
            )
        # The new rows replace the old ones by key first (a chunk's key is its revision and
        # ordinal), then the rows past the new last ordinal go: a revision staged again while
        # it is visible (reconcile, an upgrade) keeps rows at every moment, and a failure
        # half-way leaves the old rows, not none.
        for start in range(0, len(rows), _INSERT_BATCH):
            self.client.upsert(
                self.collection, rows[start : start + _INSERT_BATCH], timeout=self.timeout_s
            )
        self.client.delete(
            self.collection,
            filter=f"org == {_literal(org)} and revision_id == {_literal(revision_id)}"
            f" and ordinal > {max((c.ordinal for c in chunks), default=-1)}",
            timeout=self.timeout_s,
        )
        # Seal the new rows into indexed segments: searches over growing (unflushed)
        # segments took 0.5-1 s in Milvus Lite at 1,400 chunks, 15-30 ms once flushed.
        self.client.flush(self.collection, timeout=self.timeout_s)

    # ------------------------------------------------------------------ reads

    @staticmethod
    def _filter(
        org: str, revision_ids: Collection[str], tags: Collection[str], any_tags: Collection[str]
    ) -> str:
        expr = f"org == {_literal(org)} and revision_id in {_literals(revision_ids)}"
        if tags:
            expr += f" and array_contains_all(tags, {_literals(tags)})"
        if any_tags:
            expr += f" and array_contains_any(tags, {_literals(any_tags)})"
        return expr

    def search(
        self,
        org: str,
        text: str,
        vector: Sequence[float] | None,
        *,
        revision_ids: Collection[str],
        k: int,
        tags: Collection[str] = (),
        any_tags: Collection[str] = (),
        timeout_s: float | None = None,
    ) -> list[IndexHit]:
        if k <= 0 or not revision_ids:
            return []
        if vector is not None and len(vector) != self.dim:
            raise ValueError(f"query vector has {len(vector)} dimensions, not {self.dim}")
        expr = self._filter(org, revision_ids, tags, any_tags)
        # pymilvus applies the client's timeout to connecting only: a call without one
        # waits for a stopped server until the connection's keepalive gives up.
        timeout = self.timeout_s if timeout_s is None else max(0.001, timeout_s)
        query = _clip(text.strip())
        dense = None if vector is None else [float(x) for x in vector]
        if query and dense is not None:
            reqs = [
                _pymilvus().AnnSearchRequest(
                    data=[query], anns_field="sparse", param={}, limit=k, expr=expr
                ),
                _pymilvus().AnnSearchRequest(
                    data=[dense], anns_field="dense", param={}, limit=k, expr=expr
                ),
            ]
            result = self.client.hybrid_search(
                self.collection,
                reqs,
                _pymilvus().RRFRanker(RRF_K),
                limit=k,
                output_fields=_FIELDS,
                timeout=timeout,
            )
            ranked: list[tuple[Any, float, int | None, int | None]] = [
                (hit, float(hit["distance"]), None, None) for hit in result[0]
            ]
        elif query or dense is not None:
            field = "sparse" if query else "dense"
            result = self.client.search(
                self.collection,
                data=[query] if query else [dense],
                anns_field=field,
                filter=expr,
                limit=k,
                output_fields=_FIELDS,
                timeout=timeout,
            )
            ranked = [
                (
                    hit,
                    1.0 / (RRF_K + rank),
                    rank if field == "sparse" else None,
                    rank if field == "dense" else None,
                )
                for rank, hit in enumerate(result[0], 1)
            ]
        else:
            return []
        allowed = set(revision_ids)
        hits: list[IndexHit] = []
        for hit, score, lex_rank, vec_rank in ranked:
            chunk = _entity_chunk(hit["entity"])
            if recheck(chunk, org, allowed, tags, any_tags):
                hits.append(IndexHit(chunk, score, lex_rank, vec_rank))
        return hits[:k]

    def revision_counts(self, org: str | None = None) -> dict[tuple[str, str], int]:
        expr = "" if org is None else f"org == {_literal(org)}"
        counts: dict[tuple[str, str], int] = {}
        it = self.client.query_iterator(
            self.collection,
            batch_size=4096,
            filter=expr,
            output_fields=["org", "revision_id"],
            timeout=self.timeout_s,
        )
        try:
            while True:
                batch = it.next()
                if not batch:
                    break
                for row in batch:
                    key = (str(row["org"]), str(row["revision_id"]))
                    counts[key] = counts.get(key, 0) + 1
        finally:
            it.close()
        return counts

    def get_chunks(self, org: str, chunk_ids: Collection[str]) -> list[IndexChunk]:
        wanted = list(dict.fromkeys(chunk_ids))
        if not wanted:
            return []
        rows = self.client.query(
            self.collection,
            filter=f"org == {_literal(org)} and chunk_id in {_literals(wanted)}",
            output_fields=_FIELDS,
            timeout=self.timeout_s,
        )
        found = {c.chunk_id: c for c in map(_entity_chunk, rows) if c.org == org}
        return [found[c] for c in wanted if c in found]
