"""The fact memory's store, ``memory.sqlite`` (seed 004).

One table of entries for every store (facts, patterns, history, procedures, relations),
addressed within a scope (organisation, workspace) by ``(store, category, key)``. A key
has at most one current entry (``valid_until`` NULL); an update archives the current one
(``valid_until`` set, kept in the table) and the new one names it in ``supersedes``, so the
timeline of a key is every version in order.

Capacity (``reclaim``) is the one place entries leave the table: when a store of a scope
holds ``max`` entries or more, the entries past ``reclaim_target(max, headroom)`` in the
store's retention order are copied to ``archive`` and removed, in one transaction. With
``reclaim_enabled = false`` only the overflow goes (the store is kept at ``max``). The
archive has no retention limit; ``restore`` moves entries back. An entry's id never
changes, and an id is in exactly one of the two tables.

Every statement filters on ``org`` and ``workspace`` in SQL.
"""

from __future__ import annotations

import re
import threading
import unicodedata
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import apsw

from knowledge_server.memory.policy import STORES, MemoryPolicy, reclaim_target
from knowledge_server.schema import Migrations, Step, immediate, open_db

__all__ = [
    "DB_FILE",
    "MIGRATIONS",
    "ConsolidateReport",
    "Contradiction",
    "Entry",
    "MemoryStore",
    "RecallResult",
    "RestoreReport",
    "Scope",
    "Written",
    "polarity",
    "severity",
    "similarity",
]

DB_FILE = "memory.sqlite"

_COLUMNS = (
    "id, org, workspace, store, category, key, value, confidence, confirmations, created_at,"
    " updated_at, decay_from, valid_from, valid_until, supersedes, touched"
)

_E_COLUMNS = ", ".join("e." + c.strip() for c in _COLUMNS.split(","))

_BASELINE = f"""
CREATE TABLE entries (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    org TEXT NOT NULL,
    workspace TEXT NOT NULL,
    store TEXT NOT NULL,
    category TEXT NOT NULL,
    key TEXT NOT NULL,
    value TEXT NOT NULL,
    confidence REAL NOT NULL,
    confirmations INTEGER NOT NULL,
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL,
    decay_from TEXT,
    valid_from TEXT NOT NULL,
    valid_until TEXT,
    supersedes INTEGER,
    touched INTEGER NOT NULL
);
CREATE INDEX entries_key ON entries(org, workspace, store, category, key);
CREATE INDEX entries_touched ON entries(org, workspace, store, touched);
CREATE TABLE archive (
    {_COLUMNS.replace("id,", "id INTEGER PRIMARY KEY,", 1)},
    archived_at TEXT NOT NULL,
    reason TEXT NOT NULL,
    merged_into INTEGER
);
CREATE INDEX archive_scope ON archive(org, workspace, store, archived_at);
CREATE INDEX archive_key ON archive(org, workspace, store, category, key);
CREATE TABLE contradictions (
    id INTEGER PRIMARY KEY,
    org TEXT NOT NULL,
    workspace TEXT NOT NULL,
    store TEXT NOT NULL,
    category TEXT NOT NULL,
    key TEXT NOT NULL,
    existing_id INTEGER NOT NULL,
    new_id INTEGER NOT NULL,
    severity TEXT NOT NULL,
    at TEXT NOT NULL
);
CREATE INDEX contradictions_scope ON contradictions(org, workspace, id);
CREATE TABLE counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
INSERT INTO counters VALUES ('touched', 0);
CREATE VIRTUAL TABLE entries_words USING fts5(
    category, key, value, content='entries', content_rowid='id',
    tokenize='unicode61 remove_diacritics 0'
);
CREATE TRIGGER entries_words_insert AFTER INSERT ON entries BEGIN
    INSERT INTO entries_words(rowid, category, key, value)
    VALUES (new.id, new.category, new.key, new.value);
END;
CREATE TRIGGER entries_words_delete AFTER DELETE ON entries BEGIN
    INSERT INTO entries_words(entries_words, rowid, category, key, value)
    VALUES ('delete', old.id, old.category, old.key, old.value);
END;
CREATE TRIGGER entries_words_update AFTER UPDATE OF category, key, value ON entries BEGIN
    INSERT INTO entries_words(entries_words, rowid, category, key, value)
    VALUES ('delete', old.id, old.category, old.key, old.value);
    INSERT INTO entries_words(rowid, category, key, value)
    VALUES (new.id, new.category, new.key, new.value);
END;
"""  # noqa: S608 - columns, tables and placeholders from module constants; values bound


def fold(text: str) -> str:
    """``text`` as the word index and Recall compare it: NFKC (the "ﬁ" ligature is "fi",
    full-width letters are ASCII) and case-folded ("Straße" is "strasse"), which SQLite's
    unicode61 tokenizer does not do by itself (it keeps "ß" and "ﬁ")."""
    return unicodedata.normalize("NFKC", unicodedata.normalize("NFKC", text).casefold())


def _folded(category: str, key: str, value: str) -> str:
    """What the word index holds for an entry (``entries.folded``)."""
    return fold(f"{category}\n{key}\n{value}")


_FOLDED_WORDS = """
CREATE VIRTUAL TABLE entries_words USING fts5(
    folded, content='entries', content_rowid='id',
    tokenize='unicode61 remove_diacritics 0'
);
CREATE TRIGGER entries_words_insert AFTER INSERT ON entries BEGIN
    INSERT INTO entries_words(rowid, folded) VALUES (new.id, new.folded);
END;
CREATE TRIGGER entries_words_delete AFTER DELETE ON entries BEGIN
    INSERT INTO entries_words(entries_words, rowid, folded) VALUES ('delete', old.id, old.folded);
END;
CREATE TRIGGER entries_words_update AFTER UPDATE OF folded ON entries BEGIN
    INSERT INTO entries_words(entries_words, rowid, folded) VALUES ('delete', old.id, old.folded);
    INSERT INTO entries_words(rowid, folded) VALUES (new.id, new.folded);
END;
INSERT INTO entries_words(entries_words) VALUES ('rebuild');
"""


def _index_folded_words(cur: apsw.Cursor) -> None:
    """Step 002: the word index holds each entry's folded text (``fold``), kept in the new
    column ``entries.folded``, so "hauptstrasse" finds "Hauptstraße" and "file" finds
    "ﬁle"; before, it indexed category, key and value as written."""
    cur.execute(
        "DROP TRIGGER entries_words_insert; DROP TRIGGER entries_words_delete;"
        " DROP TRIGGER entries_words_update; DROP TABLE entries_words;"
        " ALTER TABLE entries ADD COLUMN folded TEXT NOT NULL DEFAULT ''"
    )
    rows = cur.execute("SELECT id, category, key, value FROM entries").fetchall()
    cur.executemany(
        "UPDATE entries SET folded = ? WHERE id = ?",
        [(_folded(str(c), str(k), str(v)), i) for i, c, k, v in rows],
    )
    cur.execute(_FOLDED_WORDS)


MIGRATIONS = Migrations(
    DB_FILE,
    (Step("001_initial", _BASELINE), Step("002_folded_words", _index_folded_words)),
)

# Retention order of each store, best kept first (the tail is what a reclaim archives).
# Facts and procedures keep current entries before superseded versions; ties always end
# on ``id`` so the order is total.
RETENTION: dict[str, str] = {
    "facts": "(valid_until IS NULL) DESC, confidence DESC, confirmations DESC, touched DESC, id DESC",
    "procedures": "(valid_until IS NULL) DESC, confirmations DESC, confidence DESC, touched DESC, id DESC",
    "patterns": "touched DESC, id DESC",
    "history": "touched DESC, id DESC",
    "relations": "touched DESC, id DESC",
}
if set(RETENTION) != set(STORES):
    raise RuntimeError("every store needs a retention order")

RELATION_ARROW = " -> "
_WORD = re.compile(r"\w+", re.UNICODE)


def words(text: str) -> frozenset[str]:
    """The words of ``text``, folded (``fold``) as the word index holds them."""
    return frozenset(_WORD.findall(fold(text)))


# Words that turn a statement into its opposite ("always" to "never", a "not" added). Two
# values that differ in them are two values however many other words they share: a long
# rule whose meaning flips by one word stays above the similarity threshold.
# English and German (the seed's language); kept short on purpose, since every word here
# makes two otherwise equal texts a contradiction. A contraction ending in "n't" and
# "cannot" count as "not", so "don't" and "do not" agree.
POLARITY_WORDS = frozenset(
    {
        "not",
        "no",
        "never",
        "always",
        "none",
        "nothing",
        "without",
        "nicht",
        "nichts",
        "nie",
        "niemals",
        "immer",
        "ohne",
        "kein",
        "keine",
        "keinen",
        "keinem",
        "keiner",
        "keines",
    }
)
# A word with its apostrophes (straight or typographic) kept, so a contraction stays one word.
_POLAR_WORD = re.compile(r"\w+(?:['\u2019]\w+)*", re.UNICODE)


def polarity(text: str) -> tuple[str, ...]:
    """The polarity words of ``text`` (``POLARITY_WORDS``), folded, sorted, each as often
    as it occurs; a contraction of "not" and "cannot" are "not"."""
    found = []
    for word in _POLAR_WORD.findall(fold(text)):
        if word == "cannot" or word.endswith(("n't", "n\u2019t")):
            found.append("not")
        elif word in POLARITY_WORDS:
            found.append(word)
    return tuple(sorted(found))


def similarity(a: str, b: str) -> float:
    """Word similarity: Jaccard of the case-folded word sets. Two texts without words
    ("✅", "!=") have nothing to measure by words: they are similar only when their folded
    text is the same (whitespace aside), else a new symbol would pass for the old one."""
    wa, wb = words(a), words(b)
    if not wa and not wb:
        return 1.0 if fold(a).split() == fold(b).split() else 0.0
    return len(wa & wb) / len(wa | wb)


def same_value(a: str, b: str, threshold: float) -> bool:
    """Case-insensitively equal, or with the same polarity words (``polarity``) and word
    similarity at or above ``threshold``."""
    if a.strip().casefold() == b.strip().casefold():
        return True
    return polarity(a) == polarity(b) and similarity(a, b) >= threshold


def severity(confidence: float, confirmations: int, contradiction_threshold: float) -> str:
    """Seed 004's severity of contradicting an entry with this confidence and count."""
    if confidence >= 0.9 and confirmations >= 2:
        return "high"
    if confidence >= contradiction_threshold:
        return "medium"
    return "low"


def _int(value: object) -> int:
    """An integer column's value (SQLite hands back ``int``; anything else is a bug)."""
    if isinstance(value, int | float | str):
        return int(value)
    raise TypeError(f"expected an integer, got {type(value).__name__}")


def _iso(when: datetime) -> str:
    return when.astimezone(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


def _parse(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


@dataclass(frozen=True)
class Scope:
    """Whose memory: the principal's organisation and one workspace root ("" = the
    organisation's own memory, for an unrestricted principal)."""

    org: str
    workspace: str


@dataclass(frozen=True)
class Entry:
    id: int
    store: str
    category: str
    key: str
    value: str
    confidence: float
    confirmations: int
    created_at: str
    updated_at: str
    valid_from: str
    valid_until: str | None
    supersedes: int | None
    touched: int
    # Set for archived entries only.
    archived_at: str = ""
    reason: str = ""

    @property
    def current(self) -> bool:
        return self.valid_until is None

    @property
    def evidence_id(self) -> str:
        return f"mem:{self.id}"


def _entry(row: Sequence[object], archived: bool = False) -> Entry:
    (
        id_,
        _org,
        _ws,
        store,
        category,
        key,
        value,
        conf,
        confirmations,
        created,
        updated,
        _decay,
        valid_from,
        valid_until,
        supersedes,
        touched,
        *rest,
    ) = row
    return Entry(
        id=int(id_),  # type: ignore[call-overload]
        store=str(store),
        category=str(category),
        key=str(key),
        value=str(value),
        confidence=float(conf),  # type: ignore[arg-type]
        confirmations=int(confirmations),  # type: ignore[call-overload]
        created_at=str(created),
        updated_at=str(updated),
        valid_from=str(valid_from),
        valid_until=None if valid_until is None else str(valid_until),
        supersedes=None if supersedes is None else int(supersedes),  # type: ignore[call-overload]
        touched=int(touched),  # type: ignore[call-overload]
        archived_at=str(rest[0]) if archived and rest else "",
        reason=str(rest[1]) if archived and len(rest) > 1 else "",
    )


@dataclass(frozen=True)
class Contradiction:
    severity: str  # "high" | "medium" | "low"
    previous: Entry


@dataclass(frozen=True)
class Written:
    """What a write did: ``outcome`` is "created", "confirmed" or "superseded"."""

    entry: Entry
    outcome: str
    contradiction: Contradiction | None = None
    archived_ids: tuple[int, ...] = ()  # what the write's reclaim archived to make room

    @property
    def reclaimed(self) -> int:
        return len(self.archived_ids)


@dataclass(frozen=True)
class Cut:
    """What a budget cut: how many matched, the budget's name and the first ids left out."""

    total: int
    limit_name: str
    limit: int
    omitted_ids: tuple[str, ...] = ()

    @property
    def omitted(self) -> int:
        return max(0, self.total - self.limit)


@dataclass(frozen=True)
class RecallResult:
    entries: list[Entry]
    cut: Cut


@dataclass
class ConsolidateReport:
    dry_run: bool
    stores: list[str]
    decayed: int = 0
    merged: int = 0
    compacted: int = 0
    archived_ids: list[int] = field(default_factory=list)


@dataclass
class RestoreReport:
    restored: list[Entry] = field(default_factory=list)
    # Former current entries restored as superseded versions: their key has a newer one.
    as_history: int = 0
    already_live: int = 0  # left in the archive: the same value is live
    archived_ids: list[int] = field(default_factory=list)  # reclaimed to make room

    @property
    def reclaimed(self) -> int:
        return len(self.archived_ids)


OMITTED_IDS = 20  # ids of cut entries an answer names, at most


class MemoryStore:
    """``memory.sqlite`` of one data directory. Thread-safe: one connection under a lock
    (every call is one short transaction). ``now`` is the clock (tests pass their own)."""

    BUSY_MS = 10_000

    def __init__(
        self,
        path: Path | str,
        policy: MemoryPolicy,
        *,
        now: Callable[[], datetime] | None = None,
    ) -> None:
        self.path = str(path)
        self.policy = policy
        self._now = now or (lambda: datetime.now(UTC))
        self._lock = threading.RLock()
        self.conn = open_db(self.path, MIGRATIONS, busy_ms=self.BUSY_MS)
        self.reclaims = 0  # reclaim runs since opening (for the benchmark and tests)

    def close(self) -> None:
        with self._lock:
            self.conn.close()

    # ------------------------------------------------------------------ writing

    def remember(
        self,
        scope: Scope,
        store: str,
        category: str,
        key: str,
        value: str,
        confidence: float,
    ) -> Written:
        """Write one value. The same value again (case-insensitively, or similar at or
        above ``similarity_threshold``) confirms the current entry; another value becomes
        current and the previous one is kept as a superseded version (reported as a
        contradiction with its severity, and recorded)."""
        _check_store(store)
        with self._lock, immediate(self.conn):
            return self._remember(self.conn, scope, store, category, key, value, confidence)

    def _remember(
        self,
        conn: apsw.Connection,
        scope: Scope,
        store: str,
        category: str,
        key: str,
        value: str,
        confidence: float,
    ) -> Written:
        now = _iso(self._now())
        current = self._current(conn, scope, store, category, key)
        if current is not None and same_value(
            current.value, value, self.policy.similarity_threshold
        ):
            conf = min(1.0, round(max(current.confidence, confidence) + 0.1, 4))
            conn.execute(
                "UPDATE entries SET confidence = ?, confirmations = confirmations + 1,"
                " updated_at = ?, decay_from = NULL, touched = ? WHERE id = ?",
                (conf, now, self._touch(conn), current.id),
            )
            return Written(self._must_get(conn, scope, current.id), "confirmed")
        reclaimed = self._make_room(conn, scope, store, 1)
        contradiction = None
        if current is not None:
            # The reclaim may have archived the current entry itself: it ends there (and
            # comes back from the archive as a superseded version). The writer is shown
            # the version as it now is, ended, not as it was read before.
            for table in ("entries", "archive"):
                conn.execute(
                    f"UPDATE {table} SET valid_until = ? WHERE org = ? AND workspace = ?"  # noqa: S608 - table names from this loop; values bound
                    " AND id = ?",
                    (now, scope.org, scope.workspace, current.id),
                )
            contradiction = Contradiction(
                severity(
                    current.confidence,
                    current.confirmations,
                    self.policy.contradiction_threshold,
                ),
                self._version(conn, scope, current.id),
            )
        supersedes = self._latest_version(conn, scope, store, category, key)
        conn.execute(
            "INSERT INTO entries (org, workspace, store, category, key, value, confidence,"
            " confirmations, created_at, updated_at, valid_from, supersedes, touched, folded)"
            " VALUES (?,?,?,?,?,?,?,1,?,?,?,?,?,?)",
            (
                scope.org,
                scope.workspace,
                store,
                category,
                key,
                value,
                confidence,
                now,
                now,
                now,
                supersedes,
                self._touch(conn),
                _folded(category, key, value),
            ),
        )
        new_id = conn.last_insert_rowid()
        if contradiction is not None:
            conn.execute(
                "INSERT INTO contradictions (org, workspace, store, category, key, existing_id,"
                " new_id, severity, at) VALUES (?,?,?,?,?,?,?,?,?)",
                (
                    scope.org,
                    scope.workspace,
                    store,
                    category,
                    key,
                    contradiction.previous.id,
                    new_id,
                    contradiction.severity,
                    now,
                ),
            )
        entry = self._must_get(conn, scope, new_id)
        outcome = "superseded" if contradiction is not None else "created"
        return Written(entry, outcome, contradiction, tuple(reclaimed))

    @staticmethod
    def _touch(conn: apsw.Connection) -> int:
        row = conn.execute(
            "UPDATE counters SET value = value + 1 WHERE name = 'touched' RETURNING value"
        ).fetchone()
        return _int(row[0]) if row else 0

    def _current(
        self, conn: apsw.Connection, scope: Scope, store: str, category: str, key: str
    ) -> Entry | None:
        row = conn.execute(
            f"SELECT {_COLUMNS} FROM entries WHERE org = ? AND workspace = ? AND store = ?"  # noqa: S608 - columns, tables and placeholders from module constants; values bound
            " AND category = ? AND key = ? AND valid_until IS NULL ORDER BY id DESC LIMIT 1",
            (scope.org, scope.workspace, store, category, key),
        ).fetchone()
        return _entry(row) if row else None

    def _latest_version(
        self, conn: apsw.Connection, scope: Scope, store: str, category: str, key: str
    ) -> int | None:
        """The newest version of a key anywhere (table or archive), for ``supersedes``."""
        row = conn.execute(
            "SELECT id FROM (SELECT id, valid_from FROM entries WHERE org = ? AND workspace = ?"
            " AND store = ? AND category = ? AND key = ? UNION ALL SELECT id, valid_from FROM"
            " archive WHERE org = ? AND workspace = ? AND store = ? AND category = ? AND key = ?)"
            " ORDER BY valid_from DESC, id DESC LIMIT 1",
            (scope.org, scope.workspace, store, category, key) * 2,
        ).fetchone()
        return _int(row[0]) if row else None

    def _next_version(self, conn: apsw.Connection, scope: Scope, entry: Entry) -> str | None:
        """When the version of ``entry``'s key that follows it began (table or archive, in
        the timeline's order of ``valid_from``, id), or None when ``entry`` is the newest."""
        row = conn.execute(
            "SELECT valid_from FROM (SELECT id, valid_from FROM entries WHERE org = ? AND"
            " workspace = ? AND store = ? AND category = ? AND key = ? UNION ALL SELECT id,"
            " valid_from FROM archive WHERE org = ? AND workspace = ? AND store = ? AND"
            " category = ? AND key = ?) WHERE id != ? AND (valid_from > ? OR (valid_from = ?"
            " AND id > ?)) ORDER BY valid_from, id LIMIT 1",
            (
                *(scope.org, scope.workspace, entry.store, entry.category, entry.key) * 2,
                entry.id,
                entry.valid_from,
                entry.valid_from,
                entry.id,
            ),
        ).fetchone()
        return None if row is None else str(row[0])

    def _get(self, conn: apsw.Connection, scope: Scope, entry_id: int) -> Entry | None:
        row = conn.execute(
            f"SELECT {_COLUMNS} FROM entries WHERE org = ? AND workspace = ? AND id = ?",  # noqa: S608 - columns, tables and placeholders from module constants; values bound
            (scope.org, scope.workspace, entry_id),
        ).fetchone()
        return _entry(row) if row else None

    def _version(self, conn: apsw.Connection, scope: Scope, entry_id: int) -> Entry:
        """An entry as stored, in the table or (archived) in the archive."""
        entry = self._get(conn, scope, entry_id)
        if entry is not None:
            return entry
        row = conn.execute(
            f"SELECT {_COLUMNS}, archived_at, reason FROM archive WHERE org = ? AND"  # noqa: S608 - columns, tables and placeholders from module constants; values bound
            " workspace = ? AND id = ?",
            (scope.org, scope.workspace, entry_id),
        ).fetchone()
        if row is None:
            raise RuntimeError(f"memory entry {entry_id} vanished inside its transaction")
        return _entry(row, archived=True)

    def _must_get(self, conn: apsw.Connection, scope: Scope, entry_id: int) -> Entry:
        entry = self._get(conn, scope, entry_id)
        if entry is None:
            raise RuntimeError(f"memory entry {entry_id} vanished inside its transaction")
        return entry

    # ------------------------------------------------------------------ capacity

    def count(self, scope: Scope, store: str, *, archived: bool = False) -> int:
        table = "archive" if archived else "entries"
        with self._lock:
            row = self.conn.execute(
                f"SELECT count(*) FROM {table} WHERE org = ? AND workspace = ? AND store = ?",  # noqa: S608 - columns, tables and placeholders from module constants; values bound
                (scope.org, scope.workspace, store),
            ).fetchone()
        return _int(row[0]) if row else 0

    def _make_room(
        self,
        conn: apsw.Connection,
        scope: Scope,
        store: str,
        incoming: int,
        spare: frozenset[int] = frozenset(),
    ) -> list[int]:
        """The one capacity manager: called before ``incoming`` entries (at most the
        store's capacity) are added to ``store``. At ``len + incoming > max`` it archives
        the retention order's tail down to ``reclaim_target(max, reclaim_headroom_pct)``
        (or, with reclaim disabled, only what keeps the store at ``max`` after the new
        entries), and always low enough for all of them; the entries of ``spare`` are kept
        while they leave room for the incoming ones. Returns the ids it archived."""
        maximum = self.policy.capacity(store)
        row = conn.execute(
            "SELECT count(*) FROM entries WHERE org = ? AND workspace = ? AND store = ?",
            (scope.org, scope.workspace, store),
        ).fetchone()
        size = _int(row[0]) if row else 0
        if size + incoming <= maximum:
            return []
        keep = min(
            reclaim_target(maximum, self.policy.reclaim_headroom_pct)
            if self.policy.reclaim_enabled
            else maximum,
            maximum - incoming,
        )
        self.reclaims += 1
        ordered = [
            _int(r[0])
            for r in conn.execute(
                "SELECT id FROM entries WHERE org = ? AND workspace = ? AND store = ?"  # noqa: S608 - columns, tables and placeholders from module constants; values bound
                f" ORDER BY {RETENTION[store]}",
                (scope.org, scope.workspace, store),
            )
        ]
        kept = [i for i in ordered if i in spare]
        if len(kept) + incoming > maximum:
            kept = []  # not room for them all: the retention order alone decides
        keep = max(keep, len(kept))
        others = [i for i in ordered if i not in spare or not kept]
        ids = others[max(0, keep - len(kept)) :]
        self._archive(conn, scope, ids, "evicted")
        return ids

    def _archive(
        self,
        conn: apsw.Connection,
        scope: Scope,
        ids: Sequence[int],
        reason: str,
        merged_into: int | None = None,
    ) -> int:
        """Copy entries to the archive, then remove them (one transaction: the caller's)."""
        if not ids:
            return 0
        now = _iso(self._now())
        for chunk in _chunks(ids, 500):
            marks = ",".join("?" * len(chunk))
            conn.execute(
                f"INSERT INTO archive ({_COLUMNS}, archived_at, reason, merged_into)"  # noqa: S608 - columns, tables and placeholders from module constants; values bound
                f" SELECT {_COLUMNS}, ?, ?, ? FROM entries"
                f" WHERE org = ? AND workspace = ? AND id IN ({marks})",
                (now, reason, merged_into, scope.org, scope.workspace, *chunk),
            )
            conn.execute(
                f"DELETE FROM entries WHERE org = ? AND workspace = ? AND id IN ({marks})",  # noqa: S608 - columns, tables and placeholders from module constants; values bound
                (scope.org, scope.workspace, *chunk),
            )
        return len(ids)

    # ------------------------------------------------------------------ reading

    def recall(
        self,
        scope: Scope,
        store: str,
        query: str,
        *,
        category: str = "",
        limit: int = 0,
    ) -> RecallResult:
        """Current entries matching ``query`` (every entry when empty): ordered by matched
        words, confidence, confirmations, recency, id; then cut at ``limit`` (at most
        ``recall_facts_limit``)."""
        _check_store(store)
        budget = min(limit or self.policy.recall_facts_limit, self.policy.recall_facts_limit)
        wanted = sorted(words(query))
        if wanted:
            # Candidates from the word index (any query word), then the scope in SQL.
            sql = (
                f"SELECT {_E_COLUMNS} FROM entries_words"  # noqa: S608 - columns from module constants; values bound
                " JOIN entries e ON e.id = entries_words.rowid WHERE entries_words MATCH ?"
                " AND e.org = ? AND e.workspace = ? AND e.store = ? AND e.valid_until IS NULL"
            )
            # The index holds folded text (``fold``), as ``words`` folds the question.
            args: list[object] = [
                " OR ".join('"' + w.replace('"', '""') + '"' for w in wanted),
                scope.org,
                scope.workspace,
                store,
            ]
        else:
            sql = (
                f"SELECT {_COLUMNS} FROM entries WHERE org = ? AND workspace = ? AND store = ?"  # noqa: S608 - columns from module constants; values bound
                " AND valid_until IS NULL"
            )
            args = [scope.org, scope.workspace, store]
        if category:
            sql += " AND e.category = ?" if wanted else " AND category = ?"
            args.append(category)
        with self._lock:
            rows = self.conn.execute(sql, args).fetchall()
        scored: list[tuple[int, Entry]] = []
        for row in rows:
            e = _entry(row)
            hits = len(words(f"{e.category} {e.key} {e.value}") & set(wanted)) if wanted else 0
            if wanted and not hits:
                continue
            scored.append((hits, e))
        scored.sort(
            key=lambda he: (
                -he[0],
                -he[1].confidence,
                -he[1].confirmations,
                -he[1].touched,
                -he[1].id,
            )
        )
        ranked = [e for _, e in scored]
        cut = Cut(
            len(ranked),
            "recall_facts_limit",
            budget,
            tuple(e.evidence_id for e in ranked[budget : budget + OMITTED_IDS]),
        )
        return RecallResult(ranked[:budget], cut)

    def timeline(
        self, scope: Scope, store: str, category: str, key: str, *, limit: int = 0
    ) -> tuple[list[Entry], Cut, int]:
        """Every version of a key still in the table, oldest first; past ``timeline_limit``
        the oldest are cut. Also: how many versions of the key are in the archive."""
        _check_store(store)
        budget = min(limit or self.policy.timeline_limit, self.policy.timeline_limit)
        with self._lock:
            rows = self.conn.execute(
                f"SELECT {_COLUMNS} FROM entries WHERE org = ? AND workspace = ? AND store = ?"  # noqa: S608 - columns, tables and placeholders from module constants; values bound
                " AND category = ? AND key = ? ORDER BY valid_from, id",
                (scope.org, scope.workspace, store, category, key),
            ).fetchall()
            archived = self.conn.execute(
                "SELECT count(*) FROM archive WHERE org = ? AND workspace = ? AND store = ?"
                " AND category = ? AND key = ?",
                (scope.org, scope.workspace, store, category, key),
            ).fetchone()
        versions = [_entry(r) for r in rows]
        dropped = versions[: max(0, len(versions) - budget)]
        cut = Cut(
            len(versions),
            "timeline_limit",
            budget,
            tuple(e.evidence_id for e in dropped[-OMITTED_IDS:]),
        )
        return versions[len(dropped) :], cut, _int(archived[0]) if archived else 0

    def rooms(
        self, scope: Scope, store: str, *, limit: int = 0
    ) -> tuple[list[tuple[str, int, str]], Cut]:
        """Categories with their number of current entries and last update: most entries
        first, then by name; cut at ``rooms_limit``."""
        _check_store(store)
        budget = min(limit or self.policy.rooms_limit, self.policy.rooms_limit)
        with self._lock:
            rows = self.conn.execute(
                "SELECT category, count(*), max(updated_at) FROM entries WHERE org = ? AND"
                " workspace = ? AND store = ? AND valid_until IS NULL GROUP BY category"
                " ORDER BY count(*) DESC, category",
                (scope.org, scope.workspace, store),
            ).fetchall()
        rooms = [(str(c), _int(n), str(u)) for c, n, u in rows]
        cut = Cut(
            len(rooms),
            "rooms_limit",
            budget,
            tuple(r[0] for r in rooms[budget : budget + OMITTED_IDS]),
        )
        return rooms[:budget], cut

    def relations(self, scope: Scope, ref: str, *, limit: int = 0) -> tuple[list[Entry], Cut]:
        """Current relation edges touching ``ref`` (every edge when empty), ordered by kind,
        source, target, id; cut at ``relations_limit``."""
        budget = min(limit or self.policy.relations_limit, self.policy.relations_limit)
        sql = (
            f"SELECT {_COLUMNS} FROM entries WHERE org = ? AND workspace = ?"  # noqa: S608 - columns, tables and placeholders from module constants; values bound
            " AND store = 'relations' AND valid_until IS NULL"
        )
        args: list[object] = [scope.org, scope.workspace]
        if ref:
            # Source and target are both compared exactly, as every key is (LIKE would
            # fold the case of a source, and "API" would find the edges from "api").
            prefix = ref + RELATION_ARROW
            sql += " AND (value = ? OR substr(key, 1, ?) = ?)"
            args.extend([ref, len(prefix), prefix])
        sql += " ORDER BY category, key, id"
        with self._lock:
            rows = self.conn.execute(sql, args).fetchall()
        edges = [_entry(r) for r in rows]
        cut = Cut(
            len(edges),
            "relations_limit",
            budget,
            tuple(e.evidence_id for e in edges[budget : budget + OMITTED_IDS]),
        )
        return edges[:budget], cut

    def archived(self, scope: Scope, store: str) -> list[Entry]:
        with self._lock:
            rows = self.conn.execute(
                f"SELECT {_COLUMNS}, archived_at, reason FROM archive WHERE org = ? AND"  # noqa: S608 - columns, tables and placeholders from module constants; values bound
                " workspace = ? AND store = ? ORDER BY id",
                (scope.org, scope.workspace, store),
            ).fetchall()
        return [_entry(r, archived=True) for r in rows]

    def live(self, scope: Scope, store: str) -> list[Entry]:
        with self._lock:
            rows = self.conn.execute(
                f"SELECT {_COLUMNS} FROM entries WHERE org = ? AND workspace = ? AND store = ?"  # noqa: S608 - columns, tables and placeholders from module constants; values bound
                " ORDER BY id",
                (scope.org, scope.workspace, store),
            ).fetchall()
        return [_entry(r) for r in rows]

    # ------------------------------------------------------------------ lifecycle

    def consolidate(
        self, scope: Scope, stores: Sequence[str], *, dry_run: bool = False
    ) -> ConsolidateReport:
        """Decay, consolidation of near-duplicates, compaction (``lifecycle``). A dry run
        copies the scope's entries into a private in-memory database, runs the same steps
        there and reports; the store is not written."""
        for s in stores:
            _check_store(s)
        report = ConsolidateReport(dry_run=dry_run, stores=list(stores))
        if not dry_run:
            with self._lock, immediate(self.conn):
                self._lifecycle(self.conn, scope, stores, report)
            return report
        copy = apsw.Connection(":memory:")
        try:
            MIGRATIONS.migrate(copy, ":memory:")
            with self._lock:
                cols = _COLUMNS
                rows = self.conn.execute(
                    f"SELECT {cols} FROM entries WHERE org = ? AND workspace = ?",  # noqa: S608 - columns, tables and placeholders from module constants; values bound
                    (scope.org, scope.workspace),
                ).fetchall()
            with immediate(copy):
                copy.executemany(
                    f"INSERT INTO entries ({cols}, folded) VALUES ({','.join('?' * 17)})",  # noqa: S608 - columns and placeholders from module constants; values bound
                    [(*r, _folded(str(r[4]), str(r[5]), str(r[6]))) for r in rows],
                )
                self._lifecycle(copy, scope, stores, report)
        finally:
            copy.close()
        return report

    def _lifecycle(
        self,
        conn: apsw.Connection,
        scope: Scope,
        stores: Sequence[str],
        report: ConsolidateReport,
    ) -> None:
        p = self.policy
        now = self._now()
        for store in stores:
            current = [
                _entry(r)
                for r in conn.execute(
                    f"SELECT {_COLUMNS} FROM entries WHERE org = ? AND workspace = ?"  # noqa: S608 - columns, tables and placeholders from module constants; values bound
                    " AND store = ? AND valid_until IS NULL ORDER BY id",
                    (scope.org, scope.workspace, store),
                )
            ]
            decay_rows = {
                _int(r[0]): r[1]
                for r in conn.execute(
                    "SELECT id, decay_from FROM entries WHERE org = ? AND workspace = ?"
                    " AND store = ? AND valid_until IS NULL",
                    (scope.org, scope.workspace, store),
                )
            }
            # 1. decay: entries not confirmed for ``stale_days`` lose ``decay_rate`` per day
            # since then (counted from the last decay, so a second run the same day adds none).
            confidence: dict[int, float] = {}
            for e in current:
                stale_since = _parse(e.updated_at) + timedelta(days=p.stale_days)
                since = max(
                    stale_since, _parse(str(decay_rows[e.id])) if decay_rows[e.id] else stale_since
                )
                days = (now - since).total_seconds() / 86400
                conf = e.confidence
                if days > 0 and p.decay_rate > 0:
                    conf = max(0.0, round(e.confidence - p.decay_rate * days, 4))
                    conn.execute(
                        "UPDATE entries SET confidence = ?, decay_from = ? WHERE id = ?",
                        (conf, _iso(now), e.id),
                    )
                    report.decayed += 1
                confidence[e.id] = conf
            # 2. consolidate near-duplicates within a category (statements only: a relation's
            # value is its target, shared by edges from other sources, and two history
            # entries of the same text are two events). Bounded: an entry is compared
            # only with the entries sharing one of its ``_RARE_WORDS`` rarest words (at most
            # ``_BUCKET`` per word, the oldest first); two values similar enough to merge share
            # most words, so they share a rare one. The better-ranked entry keeps and takes
            # the other's confirmations; the other is archived.
            alive = {e.id: e for e in current}
            by_cat: dict[str, list[Entry]] = {}
            for e in current if store in MERGED_STORES else ():
                by_cat.setdefault(e.category, []).append(e)
            for cat in sorted(by_cat):
                group = by_cat[cat]  # id order
                wordsets = {e.id: words(e.value) for e in group}
                df: dict[str, int] = {}
                buckets: dict[str, list[Entry]] = {}
                for e in group:
                    for w in wordsets[e.id]:
                        df[w] = df.get(w, 0) + 1
                        bucket = buckets.setdefault(w, [])
                        if len(bucket) < _BUCKET:
                            bucket.append(e)
                for a in group:
                    if a.id not in alive:
                        continue
                    rare = sorted(wordsets[a.id], key=lambda w: (df[w], w))[:_RARE_WORDS]
                    seen = {b.id: b for w in rare for b in buckets[w] if b.id != a.id}
                    for b in sorted(seen.values(), key=lambda e: e.id):
                        if b.id not in alive or a.key == b.key:
                            continue
                        if not same_value(a.value, b.value, p.similarity_threshold):
                            continue
                        keep, drop = sorted(
                            (a, b),
                            key=lambda e: (-confidence[e.id], -e.confirmations, -e.touched, -e.id),
                        )
                        conn.execute(
                            "UPDATE entries SET confirmations = confirmations +"
                            " (SELECT confirmations FROM entries WHERE id = ?) WHERE id = ?",
                            (drop.id, keep.id),
                        )
                        self._archive(conn, scope, [drop.id], "consolidated", keep.id)
                        report.merged += 1
                        report.archived_ids.append(drop.id)
                        del alive[drop.id]
                        if drop.id == a.id:
                            break
            # 3. compact: current entries whose confidence fell below the threshold leave
            # the table for the archive (restorable like every archived entry).
            low = sorted(i for i in alive if confidence[i] < p.low_confidence_threshold)
            report.compacted += self._archive(conn, scope, low, "compacted")
            report.archived_ids.extend(low)

    # ------------------------------------------------------------------ restore

    def restore(self, scope: Scope, store: str, query: str, limit: int) -> RestoreReport:
        """Move archived entries of ``store`` matching ``query`` back (most recently
        archived first, at most ``limit``). An entry whose value is live under its key
        stays archived (``already_live``: nothing is duplicated); every other one goes back
        to its place in its key's timeline: current only when no newer version of the key
        exists (live or archived), else superseded until the next version began."""
        _check_store(store)
        report = RestoreReport()
        wanted = words(query)
        with self._lock, immediate(self.conn):
            rows = self.conn.execute(
                f"SELECT {_COLUMNS}, archived_at, reason FROM archive WHERE org = ? AND"  # noqa: S608 - columns, tables and placeholders from module constants; values bound
                " workspace = ? AND store = ? ORDER BY archived_at DESC, id DESC",
                (scope.org, scope.workspace, store),
            ).fetchall()
            # First what comes back (at most ``limit``, and at most what the store holds),
            # then room for all of it at once: a restored entry is never the one evicted
            # for the next.
            chosen: list[tuple[Any, ...]] = []
            coming: set[tuple[str, str, str]] = set()
            # The current values of the keys coming back stay (an older value restored
            # never becomes current by evicting the live one): what comes back and those
            # values must fit in the store together.
            live_now: set[int] = set()
            capacity = self.policy.capacity(store)
            for row in rows:
                if len(chosen) >= limit:
                    break
                e = _entry(row, archived=True)
                if wanted and not wanted <= words(f"{e.category} {e.key} {e.value}"):
                    continue
                same = (e.category, e.key, e.value.strip().casefold())
                # The key's versions in the store, read once: their values, and the current
                # one's id (the newest without valid_until, as ``_current`` picks it).
                versions = self.conn.execute(
                    "SELECT id, value, valid_until FROM entries WHERE org = ? AND workspace = ?"
                    " AND store = ? AND category = ? AND key = ?",
                    (scope.org, scope.workspace, store, e.category, e.key),
                ).fetchall()
                live_values = {str(v).strip().casefold() for _, v, _ in versions}
                if same[2] in live_values or same in coming:
                    report.already_live += 1
                    continue
                current = max((_int(i) for i, _, until in versions if until is None), default=None)
                spared = live_now | ({current} if current is not None else set())
                if len(chosen) + 1 + len(spared) > capacity:
                    continue  # not beside its key's live value; another may fit
                live_now = spared
                coming.add(same)
                chosen.append(row)
            if not chosen:
                return report
            report.archived_ids = self._make_room(
                self.conn, scope, store, len(chosen), frozenset(live_now)
            )
            for row in chosen:
                e = _entry(row, archived=True)
                # The entry goes back where it belongs in its key's timeline: current only
                # when no newer version of the key exists, in the table or the archive (an
                # older value restored never hides a newer one that is archived too);
                # otherwise superseded, until the next version began.
                following = self._next_version(self.conn, scope, e)
                valid_until = following
                if following is None:
                    live = self._current(self.conn, scope, store, e.category, e.key)
                    if live is not None:
                        # Only an older value can be live here (a store restored before
                        # this rule); it ends where the restored newer one begins.
                        self.conn.execute(
                            "UPDATE entries SET valid_until = ? WHERE id = ?",
                            (e.valid_from, live.id),
                        )
                elif e.valid_until is None:
                    report.as_history += 1
                self.conn.execute(
                    f"INSERT INTO entries ({_COLUMNS}, folded) VALUES ({','.join('?' * 17)})",  # noqa: S608 - columns, tables and placeholders from module constants; values bound
                    (
                        *row[:13],
                        valid_until,
                        row[14],
                        self._touch(self.conn),
                        _folded(e.category, e.key, e.value),
                    ),
                )
                self.conn.execute(
                    "DELETE FROM archive WHERE org = ? AND workspace = ? AND id = ?",
                    (scope.org, scope.workspace, e.id),
                )
            report.restored = [self._must_get(self.conn, scope, _int(r[0])) for r in chosen]
        return report

    def contradictions(self, scope: Scope) -> list[tuple[int, int, str]]:
        with self._lock:
            rows = self.conn.execute(
                "SELECT existing_id, new_id, severity FROM contradictions WHERE org = ? AND"
                " workspace = ? ORDER BY id",
                (scope.org, scope.workspace),
            ).fetchall()
        return [(_int(a), _int(b), str(s)) for a, b, s in rows]


# The stores whose near-duplicate entries Consolidate merges: statements of one thing.
MERGED_STORES = frozenset({"facts", "patterns", "procedures"})
_RARE_WORDS = 2  # an entry's rarest words that pick its merge candidates
_BUCKET = 64  # entries per word considered as candidates


def _check_store(store: str) -> None:
    if store not in STORES:
        raise ValueError(f"unknown memory store {store!r}")


def _chunks(ids: Sequence[int], size: int) -> Iterator[Sequence[int]]:
    for i in range(0, len(ids), size):
        yield ids[i : i + size]
