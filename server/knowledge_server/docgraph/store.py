"""``docgraph.sqlite``: the document graph layer, versioned by ``rev_id`` (apsw only).

Layer tables hold addresses, hashes and offsets; the only text they hold is entity names, theme
titles and LLM-written summaries. A revision is written in one transaction and never changed
afterwards, so readers always see a whole revision. ``extraction_cache`` and ``query_keywords``
are not versioned: they are keyed by everything that determines their content.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import apsw

from knowledge_server.schema import Migrations, Step, has_schema, open_db

__all__ = ["DB_FILENAME", "LAYER_TABLES", "MIGRATIONS", "DocGraphStore"]

DB_FILENAME = "docgraph.sqlite"

_BASELINE = """
CREATE TABLE layer_rev(
  rev_id INTEGER PRIMARY KEY,
  workspace TEXT NOT NULL,
  source_index_rev TEXT NOT NULL,
  fingerprint TEXT NOT NULL,
  created_at TEXT NOT NULL,
  stats_json TEXT NOT NULL
);
CREATE INDEX layer_rev_ws ON layer_rev(workspace, rev_id);
CREATE TABLE drift(
  drift_id INTEGER PRIMARY KEY,
  rev_id INTEGER NOT NULL,
  prev_rev_id INTEGER,
  prev_fingerprint TEXT,
  fingerprint TEXT NOT NULL,
  created_at TEXT NOT NULL,
  changes_json TEXT NOT NULL
);
CREATE TABLE doc_chunk(
  rev_id INTEGER NOT NULL, chunk_id TEXT NOT NULL, path TEXT NOT NULL,
  start_line INTEGER NOT NULL, end_line INTEGER NOT NULL, content_hash TEXT NOT NULL,
  PRIMARY KEY(rev_id, chunk_id)
);
CREATE TABLE entity(
  rev_id INTEGER NOT NULL, entity_id TEXT NOT NULL, name TEXT NOT NULL, norm_name TEXT NOT NULL,
  kind TEXT NOT NULL, mentions INTEGER NOT NULL, first_path TEXT NOT NULL, built_by TEXT NOT NULL,
  PRIMARY KEY(rev_id, entity_id)
);
CREATE INDEX entity_norm ON entity(rev_id, norm_name);
CREATE TABLE entity_mention(
  rev_id INTEGER NOT NULL, entity_id TEXT NOT NULL, chunk_id TEXT NOT NULL, path TEXT NOT NULL,
  start_line INTEGER NOT NULL, end_line INTEGER NOT NULL,
  char_start INTEGER NOT NULL, char_end INTEGER NOT NULL, quote_hash TEXT NOT NULL,
  built_by TEXT NOT NULL,
  PRIMARY KEY(rev_id, entity_id, chunk_id, char_start, char_end)
);
CREATE INDEX mention_chunk ON entity_mention(rev_id, chunk_id);
CREATE INDEX mention_path ON entity_mention(rev_id, path);
CREATE TABLE entity_relation(
  rev_id INTEGER NOT NULL, rel_id TEXT NOT NULL, src_entity_id TEXT NOT NULL,
  dst_entity_id TEXT NOT NULL, kind TEXT NOT NULL, quote_hash TEXT NOT NULL,
  chunk_id TEXT NOT NULL, path TEXT NOT NULL, start_line INTEGER NOT NULL,
  end_line INTEGER NOT NULL, weight INTEGER NOT NULL, built_by TEXT NOT NULL,
  PRIMARY KEY(rev_id, rel_id)
);
CREATE INDEX relation_src ON entity_relation(rev_id, src_entity_id);
CREATE INDEX relation_dst ON entity_relation(rev_id, dst_entity_id);
CREATE TABLE theme(
  rev_id INTEGER NOT NULL, theme_id TEXT NOT NULL, title TEXT NOT NULL,
  seed_entity_id TEXT NOT NULL, size INTEGER NOT NULL, built_by TEXT NOT NULL,
  PRIMARY KEY(rev_id, theme_id)
);
CREATE TABLE theme_member(
  rev_id INTEGER NOT NULL, theme_id TEXT NOT NULL, entity_id TEXT NOT NULL, weight INTEGER NOT NULL,
  PRIMARY KEY(rev_id, theme_id, entity_id)
);
CREATE INDEX member_entity ON theme_member(rev_id, entity_id);
CREATE TABLE theme_summary(
  rev_id INTEGER NOT NULL, theme_id TEXT NOT NULL, model TEXT NOT NULL,
  prompt_version TEXT NOT NULL, text TEXT NOT NULL, citations_json TEXT NOT NULL,
  PRIMARY KEY(rev_id, theme_id)
);
CREATE TABLE extraction_cache(
  cache_key TEXT PRIMARY KEY, result_json TEXT NOT NULL
);
CREATE TABLE query_keywords(
  norm_query_hash TEXT NOT NULL, model TEXT NOT NULL, prompt_version TEXT NOT NULL,
  result_json TEXT NOT NULL,
  PRIMARY KEY(norm_query_hash, model, prompt_version)
);
"""


def _legacy(cur: apsw.Cursor) -> list[str]:
    """A store written before its steps were recorded had the baseline, nothing more."""
    return ["001_initial"] if has_schema(cur, _BASELINE) else []


# The schema as named steps (``knowledge_server.schema.Migrations``): add new ones at the end.
MIGRATIONS = Migrations(
    "docgraph.sqlite",
    (
        Step("001_initial", _BASELINE),
        # Search reads an entity's mentions by entity (mode=docs|themes, search_levels).
        Step(
            "002_mention_entity",
            "CREATE INDEX mention_entity ON entity_mention(rev_id, entity_id, path, start_line);",
        ),
    ),
    legacy=_legacy,
)

# Versioned tables and their columns in dump order (rev_id excluded: it is a counter).
LAYER_TABLES: dict[str, tuple[str, ...]] = {
    "doc_chunk": ("chunk_id", "path", "start_line", "end_line", "content_hash"),
    "entity": ("entity_id", "name", "norm_name", "kind", "mentions", "first_path", "built_by"),
    "entity_mention": (
        "entity_id",
        "chunk_id",
        "path",
        "start_line",
        "end_line",
        "char_start",
        "char_end",
        "quote_hash",
        "built_by",
    ),
    "entity_relation": (
        "rel_id",
        "src_entity_id",
        "dst_entity_id",
        "kind",
        "quote_hash",
        "chunk_id",
        "path",
        "start_line",
        "end_line",
        "weight",
        "built_by",
    ),
    "theme": ("theme_id", "title", "seed_entity_id", "size", "built_by"),
    "theme_member": ("theme_id", "entity_id", "weight"),
    "theme_summary": ("theme_id", "model", "prompt_version", "text", "citations_json"),
}


class DocGraphStore:
    """Owns ``docgraph.sqlite``. ``path`` is the data directory, or a ``*.sqlite`` file."""

    def __init__(self, path: str | Path) -> None:
        p = Path(path)
        if p.suffix not in (".sqlite", ".db"):
            p = p / DB_FILENAME
        self.path = p
        self.conn = open_db(str(p), MIGRATIONS, busy_ms=5000, synchronous_normal=False)

    def close(self) -> None:
        self.conn.close()

    # --- generic helpers ----------------------------------------------------------------------

    def rows(self, sql: str, params: Iterable[Any] = ()) -> list[tuple[Any, ...]]:
        return list(self.conn.execute(sql, tuple(params)))

    def one(self, sql: str, params: Iterable[Any] = ()) -> tuple[Any, ...] | None:
        for row in self.conn.execute(sql, tuple(params)):
            return tuple(row)
        return None

    # --- revisions ----------------------------------------------------------------------------

    # A workspace (absolute, normalised root; "" for a single-workspace deployment) has its own
    # sequence of revisions in this file. Readers pick the workspace's newest revision in SQL, so
    # one workspace's layer is never read through another's.

    def current_rev(self, workspace: str = "") -> dict[str, Any] | None:
        row = self.one(
            "SELECT rev_id, source_index_rev, fingerprint, created_at, stats_json "
            "FROM layer_rev WHERE workspace=? ORDER BY rev_id DESC LIMIT 1",
            (workspace,),
        )
        if row is None:
            return None
        return {
            "workspace": workspace,
            "rev_id": row[0],
            "source_index_rev": row[1],
            "fingerprint": row[2],
            "created_at": row[3],
            "stats": json.loads(row[4]),
        }

    def revision_count(self, workspace: str = "") -> int:
        row = self.one("SELECT count(*) FROM layer_rev WHERE workspace=?", (workspace,))
        return int(row[0]) if row else 0

    def drift_entries(self, workspace: str = "") -> list[dict[str, Any]]:
        return [
            {
                "rev_id": r[0],
                "prev_rev_id": r[1],
                "prev_fingerprint": r[2],
                "fingerprint": r[3],
                "created_at": r[4],
                "changes": json.loads(r[5]),
            }
            for r in self.rows(
                "SELECT rev_id, prev_rev_id, prev_fingerprint, fingerprint, created_at, "
                "changes_json FROM drift WHERE rev_id IN "
                "(SELECT rev_id FROM layer_rev WHERE workspace=?) ORDER BY drift_id",
                (workspace,),
            )
        ]

    def write_revision(
        self,
        *,
        workspace: str = "",
        source_index_rev: str,
        fingerprint: str,
        created_at: str,
        stats: dict[str, Any],
        tables: dict[str, list[tuple[Any, ...]]],
        drift_changes: dict[str, Any] | None,
    ) -> int:
        """Insert a whole revision atomically; rows are tuples in :data:`LAYER_TABLES` order."""
        with self.conn:  # one transaction: readers never see half a revision
            prev = self.current_rev(workspace)
            top = self.one("SELECT max(rev_id) FROM layer_rev")
            rev_id = (top[0] or 0) + 1 if top else 1  # unique across workspaces
            self.conn.execute(
                "INSERT INTO layer_rev(rev_id, workspace, source_index_rev, fingerprint, "
                "created_at, stats_json) VALUES(?,?,?,?,?,?)",
                (
                    rev_id,
                    workspace,
                    source_index_rev,
                    fingerprint,
                    created_at,
                    json.dumps(stats, sort_keys=True),
                ),
            )
            for table, rows in tables.items():
                cols = LAYER_TABLES[table]
                sql = f"INSERT INTO {table}(rev_id, {', '.join(cols)}) VALUES(?{', ?' * len(cols)})"
                self.conn.executemany(sql, [(rev_id, *r) for r in rows])
            if prev is not None and drift_changes is not None:
                self.conn.execute(
                    "INSERT INTO drift(rev_id, prev_rev_id, prev_fingerprint, fingerprint, "
                    "created_at, changes_json) VALUES(?,?,?,?,?,?)",
                    (
                        rev_id,
                        prev["rev_id"],
                        prev["fingerprint"],
                        fingerprint,
                        created_at,
                        json.dumps(drift_changes, sort_keys=True),
                    ),
                )
        return rev_id

    def prune_revisions(self, keep: int = 2, workspace: str = "") -> int:
        """Delete all but the newest ``keep`` revisions (and their drift rows); returns how many.

        Revisions are immutable, so this is the only way rows leave the layer; caches stay.
        """
        if keep < 1:
            raise ValueError("keep must be >= 1")
        with self.conn:
            old = [
                r[0]
                for r in self.rows(
                    "SELECT rev_id FROM layer_rev WHERE workspace=? ORDER BY rev_id DESC "
                    "LIMIT -1 OFFSET ?",
                    (workspace, keep),
                )
            ]
            for rev_id in old:
                for table in LAYER_TABLES:
                    self.conn.execute(f"DELETE FROM {table} WHERE rev_id=?", (rev_id,))  # noqa: S608 - table from the constant LAYER_TABLES
                self.conn.execute("DELETE FROM drift WHERE rev_id=?", (rev_id,))
                self.conn.execute("DELETE FROM layer_rev WHERE rev_id=?", (rev_id,))
        return len(old)

    def dump_layer(self, rev_id: int) -> bytes:
        """Every layer row of a revision, ordered, as bytes (for byte-identity checks)."""
        out: list[str] = []
        for table, cols in LAYER_TABLES.items():
            order = ", ".join(cols)
            for row in self.conn.execute(
                f"SELECT {order} FROM {table} WHERE rev_id=? ORDER BY {order}",  # noqa: S608 - table and columns from the constant LAYER_TABLES
                (rev_id,),
            ):
                out.append(table + "\t" + json.dumps(list(row), ensure_ascii=False))
        return "\n".join(out).encode("utf-8")

    def layer_hash(self, rev_id: int) -> str:
        return hashlib.sha256(self.dump_layer(rev_id)).hexdigest()

    # --- caches -------------------------------------------------------------------------------

    def cache_get(self, key: str) -> str | None:
        row = self.one("SELECT result_json FROM extraction_cache WHERE cache_key=?", (key,))
        return row[0] if row else None

    def cache_put(self, key: str, result_json: str) -> None:
        self.conn.execute(
            "INSERT OR REPLACE INTO extraction_cache(cache_key, result_json) VALUES(?,?)",
            (key, result_json),
        )

    def cache_has_many(self, keys: list[str]) -> set[str]:
        found: set[str] = set()
        for i in range(0, len(keys), 500):
            part = keys[i : i + 500]
            marks = ",".join("?" * len(part))
            for (k,) in self.conn.execute(
                f"SELECT cache_key FROM extraction_cache WHERE cache_key IN ({marks})",  # noqa: S608 - only placeholders are interpolated, values bound
                part,
            ):
                found.add(k)
        return found

    def keywords_get(self, qhash: str, model: str, prompt_version: str) -> str | None:
        row = self.one(
            "SELECT result_json FROM query_keywords WHERE norm_query_hash=? AND model=? "
            "AND prompt_version=?",
            (qhash, model, prompt_version),
        )
        return row[0] if row else None

    def keywords_put(self, qhash: str, model: str, prompt_version: str, result_json: str) -> None:
        self.conn.execute(
            "INSERT OR REPLACE INTO query_keywords(norm_query_hash, model, prompt_version, "
            "result_json) VALUES(?,?,?,?)",
            (qhash, model, prompt_version, result_json),
        )
