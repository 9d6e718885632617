"""The service's audit log: one append-only, tamper-evident record of every write.

Every operation that changes what the service knows or who may use it (index, ingest,
dispatch commit, tokens, licence, knowledge-base state changes, memory writes) appends one
event: when, which principal of which organisation, the operation, the ids it touched, a
hash of its input and its outcome. Never the input itself: an event holds no query text,
no snippets, no secrets, only ``input_hash``: HMAC-SHA256 of the input's canonical JSON
under the data directory's own key (``audit.key``), so a log that leaves the machine (an
export) cannot be used to test guesses of what a write held, e.g. a refused secret.

Tamper evidence is a hash chain. Each event's ``hash`` is SHA-256 over the previous
event's hash and the event's own canonical fields (``seq`` included), so editing an event
breaks its own hash, removing one leaves a gap in ``seq`` and a broken link, and reordering
breaks the links of both. What a chain cannot show by itself is a cut tail (the newest
events removed, the rest intact): ``verify(expect=...)`` checks a head (``seq`` and
``hash``) an operator recorded earlier (``knowledge audit verify --expect SEQ:HASH``), and
``head()`` gives the current one to record.

Append-only is also enforced by the store: triggers refuse UPDATE and DELETE on the events
table, so only someone who edits the file outside this code can change history, and then
``verify`` names the first event that no longer fits.

The log is its own store, ``audit.sqlite`` in the data directory, written under
``BEGIN IMMEDIATE`` so the serving processes of one data directory append to one chain.
"""

from __future__ import annotations

import contextlib
import fcntl
import getpass
import hashlib
import hmac
import json
import os
import secrets
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from threading import Lock
from typing import Any, Protocol, cast

import apsw

from knowledge_server.logs import get_logger
from knowledge_server.schema import Migrations, Step, immediate, open_db

__all__ = [
    "AUDIT_FILE",
    "GENESIS",
    "AuditEvent",
    "AuditLog",
    "CliRecorder",
    "Verification",
    "cli_principal",
    "cli_recorder",
    "input_hash",
    "load_key",
    "record_cli",
]

AUDIT_FILE = "audit.sqlite"
# Events kept while the log's write lock could not be had (``AuditLog.append``), next to it.
PENDING_SUFFIX = ".pending"
DRAINING_SUFFIX = ".draining."
REJECTED_SUFFIX = ".pending-rejected"  # kept lines that are not the service's own
_MAX_KEPT_LINE = 1 << 20  # a kept event's line is a few hundred bytes
_PENDING_FIELDS = ("at", "principal", "org", "operation", "targets", "input_hash", "outcome")
KEY_FILE = "audit.key"  # the input hashes' key, next to the log (created on first use)
_KEY_BYTES = 32

# The "previous hash" of the first event.
GENESIS = "0" * 64

_BASELINE = """
CREATE TABLE events (
    seq INTEGER PRIMARY KEY,
    at TEXT NOT NULL,
    principal TEXT NOT NULL,
    org TEXT NOT NULL,
    operation TEXT NOT NULL,
    targets TEXT NOT NULL,
    input_hash TEXT NOT NULL,
    outcome TEXT NOT NULL,
    prev_hash TEXT NOT NULL,
    hash TEXT NOT NULL
);
CREATE INDEX events_operation ON events(operation, seq);
CREATE TRIGGER events_no_update BEFORE UPDATE ON events
BEGIN SELECT RAISE(ABORT, 'the audit log is append-only'); END;
CREATE TRIGGER events_no_delete BEFORE DELETE ON events
BEGIN SELECT RAISE(ABORT, 'the audit log is append-only'); END;
"""

MIGRATIONS = Migrations("audit.sqlite", (Step("001_initial", _BASELINE),))

_SELECT = (
    "SELECT seq, at, principal, org, operation, targets, input_hash, outcome, prev_hash, hash"
    " FROM events"
)


def _canonical(value: object) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def input_hash(value: object, key: bytes | None = None) -> str:
    """HMAC-SHA256 under ``key`` of a JSON-able input in canonical form (sorted keys, no
    spaces); SHA-256 without a key. The same input and key give the same hash on every
    machine. ``None`` hashes as JSON ``null``."""
    if key is None:
        return hashlib.sha256(_canonical(value)).hexdigest()
    return hmac.new(key, _canonical(value), hashlib.sha256).hexdigest()


def load_key(path: Path) -> bytes:
    """The key at ``path``, created (owner-only, written whole) if there is none. Serving
    processes of one data directory may race to create it: one link wins and every process
    reads that one (on a filesystem without hard links, one exclusive create wins, and a
    reader waits for its bytes)."""
    if not path.exists():
        _create_key(path)
    key = b""
    for _ in range(100):
        key = path.read_bytes()
        if len(key) == _KEY_BYTES:
            break
        time.sleep(0.01)  # another process is writing it (no hard links here)
    if len(key) != _KEY_BYTES:
        raise ValueError(f"{path}: not an audit key ({len(key)} bytes, expected {_KEY_BYTES})")
    return key


@dataclass(frozen=True)
class AuditEvent:
    seq: int
    at: str  # RFC 3339, UTC, microseconds
    principal: str
    org: str
    operation: str
    targets: tuple[str, ...]
    input_hash: str
    outcome: str  # "ok", or the error code the operation ended with
    prev_hash: str
    hash: str

    def body(self) -> dict[str, object]:
        """The fields the chain hash covers (everything but the hash itself)."""
        return {
            "seq": self.seq,
            "at": self.at,
            "principal": self.principal,
            "org": self.org,
            "operation": self.operation,
            "targets": list(self.targets),
            "input_hash": self.input_hash,
            "outcome": self.outcome,
            "prev_hash": self.prev_hash,
        }

    def to_json(self) -> str:
        """One line of ``knowledge audit export`` (JSON lines)."""
        return json.dumps({**self.body(), "hash": self.hash}, ensure_ascii=False)


def chain_hash(prev_hash: str, body: dict[str, object]) -> str:
    return hashlib.sha256(prev_hash.encode() + b"\n" + _canonical(body)).hexdigest()


@dataclass(frozen=True)
class Verification:
    ok: bool
    checked: int  # events read
    head_seq: int  # 0 for an empty log
    head_hash: str
    first_bad_seq: int | None = None
    reason: str = ""


def _row_event(row: Sequence[object]) -> AuditEvent:
    seq, at, principal, org, operation, targets, ihash, outcome, prev, h = row
    return AuditEvent(
        seq=int(seq),  # type: ignore[call-overload]
        at=str(at),
        principal=str(principal),
        org=str(org),
        operation=str(operation),
        targets=tuple(json.loads(str(targets))),
        input_hash=str(ihash),
        outcome=str(outcome),
        prev_hash=str(prev),
        hash=str(h),
    )


def _last(conn: apsw.Connection) -> tuple[int, str]:
    rows = conn.execute("SELECT seq, hash FROM events ORDER BY seq DESC LIMIT 1").fetchall()
    return (cast(int, rows[0][0]), cast(str, rows[0][1])) if rows else (0, GENESIS)


def _write_key(fd: int, key: bytes) -> None:
    with os.fdopen(fd, "wb") as fh:
        fh.write(key)
        fh.flush()
        os.fsync(fh.fileno())


def _create_key(path: Path) -> None:
    key = secrets.token_bytes(_KEY_BYTES)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        _write_key(fd, key)
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass
        except OSError:  # a filesystem without hard links: the first exclusive create wins
            _create_in_place(path, key)
    finally:
        tmp.unlink(missing_ok=True)


def _create_in_place(path: Path, key: bytes) -> None:
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return
    try:
        _write_key(fd, key)
    except BaseException:
        path.unlink(missing_ok=True)  # ours (the exclusive create): no empty key stays
        raise


class AuditLog:
    """The audit store of one data directory. Thread-safe: one writer connection, used
    under a lock; ``append`` is a short write (one row), so callers on the event loop run
    it off the loop like any other store write."""

    def __init__(self, path: Path | str, *, busy_ms: int = 10_000) -> None:
        self.path = str(path)
        self._lock = Lock()
        self._conn = open_db(self.path, MIGRATIONS, busy_ms=busy_ms, synchronous_normal=False)
        self._key: bytes | None = None
        # Whether draining files may have been left (by a drain that stopped before
        # removing its file): looked for when the log is opened, when a pending file is
        # drained, and after a drain of this object's failed; not on every append (a
        # listing of the data directory each time).
        self._left_files = True
        # The chain's last seq when the log was closed; None while it is open. An event
        # appended after close (work that ran on past shutdown: a document graph build, a
        # derived rebuild) is kept in the pending file, as when the log is busy.
        self._closed_after: int | None = None

    def input_hash(self, value: object) -> str:
        """``value``'s ``input_hash`` under this log's key (``KEY_FILE`` next to it)."""
        if self._key is None:
            self._key = load_key(Path(self.path).with_name(KEY_FILE))
        return input_hash(value, self._key)

    def close(self) -> None:
        with self._lock:
            if self._closed_after is None:
                try:
                    self._closed_after = _last(self._conn)[0]
                except apsw.Error:
                    self._closed_after = 0
            self._conn.close()

    def append(
        self,
        *,
        principal: str,
        org: str,
        operation: str,
        targets: Sequence[str] = (),
        input: object = None,
        outcome: str = "ok",
    ) -> AuditEvent:
        """Append one event; returns it with its place in the chain. ``input`` is hashed,
        never stored. Committed (synchronous=FULL) before this returns.

        When the log's write lock stays taken past ``busy_ms`` (another process's long
        transaction, a backup holding it), the event is kept in the pending file instead
        (fsynced, ``seq`` 0 returned) and joins the chain, in the order kept, at the next
        append that gets the lock: the write it records has happened, and its caller is
        answered as such rather than told it failed (a retry would do it twice). Events
        kept there first are appended before this one. After ``close`` (work that ran on
        past shutdown) the event is kept there too, and joins the chain at the next append
        to the log by any process."""
        if not operation:
            raise ValueError("an audit event needs an operation")
        at = datetime.now(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")
        fields = {
            "at": at,
            "principal": principal,
            "org": org,
            "operation": operation,
            "targets": [str(t) for t in targets],
            "input_hash": self.input_hash(input),
            "outcome": outcome,
        }
        drained: list[str] = []
        event: AuditEvent | None = None
        try:
            with self._lock:
                if self._closed_after is None:
                    with immediate(self._conn):
                        try:
                            drained = self._drain()
                            event = self._insert(fields)
                        except BaseException:
                            self._left_files = True  # a file it renamed stays for the next drain
                            raise
        except apsw.BusyError:
            return self._keep_pending(fields, "log busy")
        if event is None:
            return self._keep_pending(fields, "log closed")
        for path in drained:
            # Committed: the kept events are in the chain (a crash before this unlink is
            # harmless: the next drain finds them there and skips them).
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
            except OSError:
                self._left_files = True
        return event

    def _insert(self, fields: dict[str, Any]) -> AuditEvent:
        """Chain one event after the last (within the caller's write transaction)."""
        last_seq, prev = _last(self._conn)
        event = AuditEvent(
            seq=last_seq + 1,
            at=str(fields["at"]),
            principal=str(fields["principal"]),
            org=str(fields["org"]),
            operation=str(fields["operation"]),
            targets=tuple(str(t) for t in fields["targets"]),
            input_hash=str(fields["input_hash"]),
            outcome=str(fields["outcome"]),
            prev_hash=prev,
            hash="",
        )
        h = chain_hash(prev, event.body())
        self._conn.execute(
            "INSERT INTO events (seq, at, principal, org, operation, targets, input_hash, outcome,"
            " prev_hash, hash) VALUES (?,?,?,?,?,?,?,?,?,?)",
            (
                event.seq,
                event.at,
                event.principal,
                event.org,
                event.operation,
                json.dumps(list(event.targets)),
                event.input_hash,
                event.outcome,
                prev,
                h,
            ),
        )
        return AuditEvent(**{**event.__dict__, "hash": h})

    # The pending file: events kept while the log's write lock could not be had, one JSON
    # object a line, each with an HMAC under the log's key (a line the service did not
    # write is not chained). Writers append under an exclusive flock on it; a drain takes
    # the same lock to rename it to a draining file of its own (a unique name), so no line
    # is written to a file being read, and a drain removes only the file it made.
    def _keep_pending(self, fields: dict[str, Any], reason: str) -> AuditEvent:
        pending = self.path + PENDING_SUFFIX
        with self._lock:
            after_seq = self._closed_after
            if after_seq is None:
                try:
                    after_seq = _last(self._conn)[0]
                except apsw.Error:
                    after_seq = 0
        kept = {**fields, "after_seq": after_seq}
        kept["mac"] = self._mac(kept)
        line = (json.dumps(kept, ensure_ascii=False) + "\n").encode()
        while True:
            fd = os.open(
                pending,
                os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW,
                0o600,
            )
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                try:
                    current = os.stat(pending, follow_symlinks=False).st_ino == os.fstat(fd).st_ino
                except FileNotFoundError:
                    current = False
                if current:  # else a drain renamed it between open and lock: open anew
                    size = os.fstat(fd).st_size
                    # A line an earlier writer left unfinished (killed, or a short write on
                    # a full disk) is ended first, so it cannot swallow this one.
                    if size and os.pread(fd, 1, size - 1) != b"\n":
                        line = b"\n" + line
                    view = memoryview(line)
                    while view:
                        view = view[os.write(fd, view) :]
                    os.fsync(fd)
                    break
            finally:
                os.close(fd)
        get_logger("knowledge.audit").warning(
            "audit.event_pending", operation=fields["operation"], reason=reason
        )
        return AuditEvent(
            seq=0, prev_hash="", hash="", **{**fields, "targets": tuple(fields["targets"])}
        )

    def _mac(self, kept: dict[str, Any]) -> str:
        if self._key is None:
            self._key = load_key(Path(self.path).with_name(KEY_FILE))
        body = {k: kept[k] for k in (*_PENDING_FIELDS, "after_seq")}
        return hmac.new(self._key, _canonical(body), hashlib.sha256).hexdigest()

    def _draining_files(self) -> list[str]:
        """The draining files left, oldest first (their names hold when each was made; the
        one name of the first version of this, ``audit.sqlite.draining``, sorts first)."""
        folder, base = os.path.split(self.path)
        prefix = base + DRAINING_SUFFIX
        return sorted(
            os.path.join(folder, name)
            for name in os.listdir(folder or ".")
            if name.startswith(prefix) or name == prefix[:-1]
        )

    def _drain(self) -> list[str]:
        """Append the events kept pending (within the write transaction), in the order kept:
        the draining files another drain left (it stopped before removing them), then the
        pending file. Returns the draining files to remove once committed. An event already
        in the chain after the place it was kept at (a drain that committed and stopped
        before removing its file) is not appended again; a line that is not one the
        service wrote (unreadable, wrong types, no valid MAC) is set aside in the rejected
        file and logged, never chained and never in the way of the appends after it."""
        pending = self.path + PENDING_SUFFIX
        try:
            fd = os.open(pending, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
        except FileNotFoundError:
            fd = -1
        files = self._draining_files() if fd >= 0 or self._left_files else []
        self._left_files = False
        if fd >= 0:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                target = f"{self.path}{DRAINING_SUFFIX}{time.time_ns():020d}.{uuid.uuid4().hex[:8]}"
                with contextlib.suppress(FileNotFoundError):
                    os.rename(pending, target)
                    files.append(target)
            finally:
                os.close(fd)
        for path in files:
            try:
                fh = open(path, "rb")
            except FileNotFoundError:
                continue  # another drain chained it and removed it meanwhile
            with fh:
                for raw in fh:
                    self._chain_kept(raw)
        return files

    def _chain_kept(self, raw: bytes) -> None:
        raw = raw.strip()
        if not raw:
            return
        fields = self._kept_fields(raw)
        if fields is None:
            # A line cut by a crash and then ended by the next writer's line break, or
            # text the service did not write: set aside, never chained.
            fd = os.open(
                self.path + REJECTED_SUFFIX,
                os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW,
                0o600,
            )
            with os.fdopen(fd, "ab") as out:
                out.write(raw[:_MAX_KEPT_LINE] + b"\n")
            get_logger("knowledge.audit").error("audit.pending_line_rejected")
            return
        after = int(fields.pop("after_seq"))
        if not self._already_chained(fields, after):
            self._insert(fields)

    def _kept_fields(self, raw: bytes) -> dict[str, Any] | None:
        """A kept line's fields when it is one the service wrote: a JSON object with each
        field of its type and an HMAC under the log's key that matches; else None."""
        if len(raw) > _MAX_KEPT_LINE:
            return None
        try:
            kept = json.loads(raw)
        except ValueError:
            return None
        if not isinstance(kept, dict):
            return None
        texts = ("at", "principal", "org", "operation", "input_hash", "outcome", "mac")
        if not all(isinstance(kept.get(k), str) for k in texts):
            return None
        targets, after = kept.get("targets"), kept.get("after_seq")
        if not (isinstance(targets, list) and all(isinstance(t, str) for t in targets)):
            return None
        if not isinstance(after, int) or isinstance(after, bool) or after < 0:
            return None
        if not hmac.compare_digest(str(kept["mac"]), self._mac(kept)):
            return None
        return {k: kept[k] for k in (*_PENDING_FIELDS, "after_seq")}

    def _already_chained(self, fields: dict[str, Any], after_seq: int) -> bool:
        rows = self._conn.execute(
            "SELECT 1 FROM events WHERE seq > ? AND at = ? AND principal = ? AND org = ?"
            " AND operation = ? AND targets = ? AND input_hash = ? AND outcome = ? LIMIT 1",
            (
                after_seq,
                fields["at"],
                fields["principal"],
                fields["org"],
                fields["operation"],
                json.dumps(list(fields["targets"])),
                fields["input_hash"],
                fields["outcome"],
            ),
        ).fetchall()
        return bool(rows)

    def pending(self) -> int:
        """How many lines wait in the pending and draining files to join the chain."""
        n = 0
        for path in [self.path + PENDING_SUFFIX, *self._draining_files()]:
            try:
                with open(path, "rb") as fh:
                    n += sum(1 for line in fh if line.strip())
            except FileNotFoundError:
                continue
        return n

    def events(self, *, after_seq: int = 0, batch: int = 1000) -> Iterator[AuditEvent]:
        """Every event after ``after_seq``, in chain order, read in batches."""
        cursor = after_seq
        while True:
            with self._lock:
                rows = self._conn.execute(
                    _SELECT + " WHERE seq > ? ORDER BY seq LIMIT ?",
                    (cursor, batch),
                ).fetchall()
            if not rows:
                return
            for row in rows:
                event = _row_event(row)
                cursor = event.seq
                yield event

    def tail(self, n: int) -> list[AuditEvent]:
        """The newest ``n`` events, oldest first."""
        with self._lock:
            rows = self._conn.execute(
                _SELECT + " ORDER BY seq DESC LIMIT ?", (max(0, n),)
            ).fetchall()
        return [_row_event(r) for r in reversed(rows)]

    def head(self) -> tuple[int, str]:
        """The last event's ``seq`` and ``hash`` (``(0, GENESIS)`` when empty): record it
        somewhere else to detect a cut tail later."""
        with self._lock:
            return _last(self._conn)

    def verify(self, *, expect: tuple[int, str] | None = None) -> Verification:
        """Walk the chain from the first event. Reports the first event that does not fit:
        a gap or reordering in ``seq`` (removed or moved events), a ``prev_hash`` that is
        not its predecessor's hash, or a hash that does not match the event's fields
        (edited). With ``expect``, the event at that ``seq`` must still carry that hash (a
        cut tail, or history rewritten up to there)."""
        prev_seq, prev_hash, checked = 0, GENESIS, 0
        seen_expected = expect is None or expect[0] == 0
        try:
            for event in self.events():
                checked += 1
                bad = self._misfit(event, prev_seq, prev_hash)
                if bad:
                    return Verification(False, checked, prev_seq, prev_hash, event.seq, bad)
                if expect is not None and event.seq == expect[0]:
                    if event.hash != expect[1]:
                        return Verification(
                            False,
                            checked,
                            prev_seq,
                            prev_hash,
                            event.seq,
                            "the event's hash is not the one recorded for it",
                        )
                    seen_expected = True
                prev_seq, prev_hash = event.seq, event.hash
        except (ValueError, TypeError, apsw.SQLError) as exc:
            return Verification(
                False, checked, prev_seq, prev_hash, prev_seq + 1, f"unreadable event: {exc}"
            )
        if expect is not None and not seen_expected:
            return Verification(
                False,
                checked,
                prev_seq,
                prev_hash,
                prev_seq + 1,
                f"the log ends at seq {prev_seq}; the recorded head is seq {expect[0]}"
                " (events were removed from its end)",
            )
        return Verification(True, checked, prev_seq, prev_hash)

    @staticmethod
    def _misfit(event: AuditEvent, prev_seq: int, prev_hash: str) -> str:
        if event.seq != prev_seq + 1:
            return f"seq {event.seq} follows seq {prev_seq} (events removed or reordered)"
        if event.prev_hash != prev_hash:
            return "prev_hash is not the previous event's hash (events removed or reordered)"
        if chain_hash(event.prev_hash, event.body()) != event.hash:
            return "the event's fields do not match its hash (edited)"
        return ""


def cli_principal() -> str:
    """Who a write made on the server's machine with the CLI is recorded as: the CLI has
    no token, so ``cli:<operating-system user>``."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = str(os.getuid())
    return f"cli:{user}"


class CliRecorder(Protocol):
    def __call__(
        self,
        operation: str,
        *,
        org: str,
        targets: Sequence[str] = (),
        input: object = None,
        outcome: str = "ok",
    ) -> AuditEvent: ...


@contextmanager
def cli_recorder(data_dir: Path | str) -> Iterator[CliRecorder]:
    """The audit log of ``data_dir`` for one CLI write, opened (with its key) before the
    write changes anything: a log that cannot be written stops the write instead of
    leaving it unrecorded. Yields ``record(operation, org=..., ...)``."""
    log = AuditLog(Path(data_dir) / AUDIT_FILE)
    try:
        log.input_hash(None)  # reads (or creates) the key now, not after the write

        def record(
            operation: str,
            *,
            org: str,
            targets: Sequence[str] = (),
            input: object = None,
            outcome: str = "ok",
        ) -> AuditEvent:
            return log.append(
                principal=cli_principal(),
                org=org,
                operation=operation,
                targets=targets,
                input=input,
                outcome=outcome,
            )

        yield record
    finally:
        log.close()


def record_cli(
    data_dir: Path | str,
    operation: str,
    *,
    org: str,
    targets: Sequence[str] = (),
    input: object = None,
    outcome: str = "ok",
) -> AuditEvent:
    """Append one event for a CLI write to ``<data_dir>/audit.sqlite``."""
    with cli_recorder(data_dir) as record:
        return record(operation, org=org, targets=targets, input=input, outcome=outcome)
