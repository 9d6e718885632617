"""The shared audit log (``knowledge_server.audit``): AUD-n invariants.

AUD-1 a chain of appended events verifies; AUD-2 an edited event is found; AUD-3 a
removed event is found; AUD-4 reordered events are found; AUD-5 a cut tail is found
against a recorded head; AUD-6 the store refuses UPDATE and DELETE; AUD-7 appends from
several processes form one valid chain; AUD-8 the input is hashed, never stored; AUD-10
an event the busy log cannot take waits in its pending file and joins the chain, in order
and once.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import stat
from pathlib import Path

import apsw
import knowledge_server.audit as audit_module
import pytest
from click.testing import CliRunner
from knowledge_server.audit import GENESIS, KEY_FILE, AuditLog, chain_hash, input_hash
from knowledge_server.cli import main as cli_main


def _fill(log: AuditLog, n: int) -> None:
    for i in range(n):
        log.append(
            principal=f"p{i % 3}",
            org="acme",
            operation="kb.revision.submit",
            targets=[f"rev-{i}"],
            input={"i": i},
        )


def _raw(path: Path) -> apsw.Connection:
    """The store opened outside the log's code, triggers dropped: what a tamperer does."""
    conn = apsw.Connection(str(path))
    conn.execute("DROP TRIGGER IF EXISTS events_no_update; DROP TRIGGER IF EXISTS events_no_delete")
    return conn


def test_aud1_appended_events_verify(tmp_path: Path) -> None:
    log = AuditLog(tmp_path / "audit.sqlite")
    assert log.verify().ok and log.head() == (0, GENESIS)
    _fill(log, 25)
    v = log.verify()
    assert v.ok and v.checked == 25 and (v.head_seq, v.head_hash) == log.head()
    assert [e.seq for e in log.tail(3)] == [23, 24, 25]
    assert log.tail(3)[0].prev_hash == log.tail(4)[0].hash


def test_aud2_an_edited_event_is_found(tmp_path: Path) -> None:
    path = tmp_path / "audit.sqlite"
    log = AuditLog(path)
    _fill(log, 10)
    _raw(path).execute("UPDATE events SET principal='someone-else' WHERE seq=6")
    v = log.verify()
    assert not v.ok and v.first_bad_seq == 6 and "edited" in v.reason


def test_aud2_an_edited_outcome_with_a_recomputed_hash_breaks_the_next_link(
    tmp_path: Path,
) -> None:
    """Rewriting one event and its own hash still leaves the next event pointing at the old one."""
    path = tmp_path / "audit.sqlite"
    log = AuditLog(path)
    _fill(log, 5)
    ev = log.tail(5)[2]
    forged = {**ev.body(), "outcome": "KNOWLEDGE_DENIED"}
    conn = _raw(path)
    conn.execute(
        "UPDATE events SET outcome=?, hash=? WHERE seq=?",
        ("KNOWLEDGE_DENIED", chain_hash(ev.prev_hash, forged), ev.seq),
    )
    v = log.verify()
    assert not v.ok and v.first_bad_seq == ev.seq + 1 and "prev_hash" in v.reason


def test_aud3_a_removed_event_is_found(tmp_path: Path) -> None:
    path = tmp_path / "audit.sqlite"
    log = AuditLog(path)
    _fill(log, 10)
    _raw(path).execute("DELETE FROM events WHERE seq=4")
    v = log.verify()
    assert not v.ok and v.first_bad_seq == 5 and "removed" in v.reason
    # The first one too.
    _raw(path).execute("DELETE FROM events WHERE seq=1")
    assert log.verify().first_bad_seq == 2


def test_aud4_reordered_events_are_found(tmp_path: Path) -> None:
    path = tmp_path / "audit.sqlite"
    log = AuditLog(path)
    _fill(log, 10)
    conn = _raw(path)
    # Swap events 3 and 7, each keeping its own hash and link: the order is the lie.
    conn.execute("UPDATE events SET seq=-3 WHERE seq=3")
    conn.execute("UPDATE events SET seq=3 WHERE seq=7")
    conn.execute("UPDATE events SET seq=7 WHERE seq=-3")
    v = log.verify()
    assert not v.ok and v.first_bad_seq == 3


def test_aud5_a_cut_tail_is_found_against_a_recorded_head(tmp_path: Path) -> None:
    path = tmp_path / "audit.sqlite"
    log = AuditLog(path)
    _fill(log, 10)
    head = log.head()
    assert log.verify(expect=head).ok
    _fill(log, 2)
    assert log.verify(expect=head).ok  # appending after the recorded head is fine
    _raw(path).execute("DELETE FROM events WHERE seq>=9")
    assert log.verify().ok  # the chain alone cannot tell
    v = log.verify(expect=head)
    assert not v.ok and "removed from its end" in v.reason
    # A head whose hash no longer matches (history rewritten up to it) is found as well.
    assert not log.verify(expect=(5, "f" * 64)).ok


def test_aud6_the_store_refuses_update_and_delete(tmp_path: Path) -> None:
    path = tmp_path / "audit.sqlite"
    log = AuditLog(path)
    _fill(log, 3)
    conn = apsw.Connection(str(path))
    with pytest.raises(apsw.ConstraintError, match="append-only"):
        conn.execute("UPDATE events SET outcome='x' WHERE seq=1")
    with pytest.raises(apsw.ConstraintError, match="append-only"):
        conn.execute("DELETE FROM events")
    assert log.verify().ok and log.head()[0] == 3


def _append_many(path: str, who: str, n: int) -> None:
    log = AuditLog(path)
    for i in range(n):
        log.append(principal=who, org="acme", operation="index", targets=[str(i)])
    log.close()


def test_aud7_appends_from_several_processes_form_one_chain(tmp_path: Path) -> None:
    path = str(tmp_path / "audit.sqlite")
    AuditLog(path).close()
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_append_many, args=(path, f"w{k}", 60)) for k in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    log = AuditLog(path)
    v = log.verify()
    assert v.ok and v.checked == 180
    assert {e.principal for e in log.events()} == {"w0", "w1", "w2"}


def test_aud8_the_input_is_hashed_never_stored(tmp_path: Path) -> None:
    path = tmp_path / "audit.sqlite"
    log = AuditLog(path)
    secret = "sk-live-THE-INPUT-TEXT-1234567890"
    ev = log.append(
        principal="alice", org="acme", operation="memory.remember", input={"text": secret}
    )
    assert ev.input_hash == log.input_hash({"text": secret}) != log.input_hash({"text": "x"})
    log.close()
    for f in tmp_path.iterdir():
        assert secret.encode() not in f.read_bytes()
    assert secret not in ev.to_json()


def test_aud8_input_hashes_are_keyed_so_an_exported_log_cannot_test_guesses(
    tmp_path: Path,
) -> None:
    """Without the data directory's key (``audit.key``, owner-only), an input cannot be
    checked against its event: a refused secret's event does not let whoever holds an
    exported log try guesses. With the key (the same data directory) the check works."""
    log = AuditLog(tmp_path / "audit.sqlite")
    guess = {"category": "wifi", "key": "password", "value": "winter2024"}
    ev = log.append(
        principal="a",
        org="o",
        operation="memory.remember",
        input=guess,
        outcome="KNOWLEDGE_SECRET_REFUSED",
    )
    log.close()
    assert ev.input_hash != input_hash(guess)  # a plain SHA-256 guess does not match
    key = tmp_path / KEY_FILE
    assert stat.S_IMODE(key.stat().st_mode) == 0o600 and len(key.read_bytes()) == 32
    again = AuditLog(tmp_path / "audit.sqlite")  # the same directory, the same key
    try:
        assert again.input_hash(guess) == ev.input_hash
    finally:
        again.close()
    other = AuditLog(tmp_path / "other" / "audit.sqlite")
    try:
        assert other.input_hash(guess) != ev.input_hash
    finally:
        other.close()


def test_an_event_needs_an_operation(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="operation"):
        AuditLog(tmp_path / "a.sqlite").append(principal="p", org="o", operation="")


def test_the_app_records_a_principals_write_in_its_data_directory(tmp_path: Path) -> None:
    """AUD-9: ``KnowledgeApp.record`` appends the principal's id and organisation."""
    import asyncio

    from knowledge_server.app import KnowledgeApp
    from knowledge_server.auth_model import Principal
    from knowledge_server.config import Config

    app = KnowledgeApp(Config(data_dir=tmp_path))
    who = Principal(id="ed", organisation="acme", workspaces=None, role="operator")
    ev = asyncio.run(app.record(who, "kb.topic.create", targets=["t-1"], input={"k": "v"}))
    assert (ev.seq, ev.principal, ev.org, ev.targets) == (1, "ed", "acme", ("t-1",))
    app.close()
    assert AuditLog(tmp_path / "audit.sqlite").verify().checked == 1


def test_aud8_the_cli_checks_an_input_against_its_event(tmp_path: Path) -> None:
    """``knowledge audit hash FILE`` gives the input_hash an event has for that input, with
    this data directory's key."""
    log = AuditLog(tmp_path / "audit.sqlite")
    request = {"category": "deploy", "key": "day", "value": "never on fridays"}
    ev = log.append(principal="a", org="o", operation="memory.remember", input=request)
    log.close()
    runner = CliRunner()
    out = runner.invoke(
        cli_main, ["--data-dir", str(tmp_path), "audit", "hash", "-"], input=json.dumps(request)
    )
    assert out.exit_code == 0, out.output
    assert out.output.strip() == ev.input_hash
    bad = runner.invoke(cli_main, ["--data-dir", str(tmp_path), "audit", "hash", "-"], input="{")
    assert bad.exit_code != 0 and "not JSON" in bad.output


def test_aud8_the_key_is_made_where_hard_links_are_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Some filesystems (network, FAT) refuse hard links: the key is then made with one
    exclusive create, and appends go on."""

    def no_links(src: object, dst: object) -> None:
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "link", no_links)
    log = AuditLog(tmp_path / "audit.sqlite")
    try:
        ev = log.append(principal="a", org="o", operation="index", input={"x": 1})
        assert ev.input_hash == log.input_hash({"x": 1})
    finally:
        log.close()
    assert len((tmp_path / KEY_FILE).read_bytes()) == 32
    assert sorted(p.name for p in tmp_path.iterdir()) == ["audit.key", "audit.sqlite"]


def test_aud8_a_key_that_could_not_be_written_leaves_nothing_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without hard links the key is created in place: if writing it fails (a full disk),
    the empty file is removed, so the next append, once there is room, makes a whole key."""
    real_write = audit_module._write_key
    calls = []

    def full_on_second(fd: int, key: bytes) -> None:
        calls.append(fd)
        if len(calls) == 2:
            os.close(fd)
            raise OSError(28, "No space left on device")
        real_write(fd, key)

    def no_links(src: object, dst: object) -> None:
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "link", no_links)
    monkeypatch.setattr(audit_module, "_write_key", full_on_second)
    log = AuditLog(tmp_path / "audit.sqlite")
    try:
        with pytest.raises(OSError, match="No space"):
            log.append(principal="a", org="o", operation="index")
        assert not (tmp_path / KEY_FILE).exists()
        log.append(principal="a", org="o", operation="index")  # room again
    finally:
        log.close()
    assert len((tmp_path / KEY_FILE).read_bytes()) == 32


def test_aud8_a_key_whose_temporary_file_cannot_be_written_leaves_no_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full disk while the key's temporary file is written leaves neither it nor a key;
    the next append, with room again, makes the key."""
    real_write = audit_module._write_key
    calls: list[int] = []

    def full_once(fd: int, key: bytes) -> None:
        calls.append(fd)
        if len(calls) == 1:
            os.close(fd)
            raise OSError(28, "No space left on device")
        real_write(fd, key)

    monkeypatch.setattr(audit_module, "_write_key", full_once)
    log = AuditLog(tmp_path / "audit.sqlite")
    try:
        with pytest.raises(OSError, match="No space"):
            log.append(principal="a", org="o", operation="index")
        assert not [p.name for p in tmp_path.iterdir() if "key" in p.name]
        log.append(principal="a", org="o", operation="index")
    finally:
        log.close()
    assert [p.name for p in tmp_path.iterdir() if "key" in p.name] == ["audit.key"]


def _hold_write_lock(path: Path) -> apsw.Connection:
    """Another connection holding the log's write lock (a long transaction elsewhere)."""
    conn = apsw.Connection(str(path))
    conn.execute("BEGIN IMMEDIATE")
    return conn


def test_aud10_an_event_the_busy_log_cannot_take_waits_and_joins_the_chain_in_order(
    tmp_path: Path,
) -> None:
    """AUD-10: a write that happened is recorded. When the log's write lock stays taken past
    the wait, the event is kept in the pending file (not lost, and the write's caller is
    not told it failed: a retry would do it twice); the next append that gets the lock
    chains the kept events first, in order, and the chain verifies. Before, the append
    raised and the committed write had no event."""
    path = tmp_path / "audit.sqlite"
    log = AuditLog(path, busy_ms=50)
    _fill(log, 2)
    holder = _hold_write_lock(path)
    kept = [
        log.append(principal="a", org="acme", operation="memory.remember", targets=[f"mem:{i}"])
        for i in (1, 2)
    ]
    assert [e.seq for e in kept] == [0, 0]
    assert log.pending() == 2 and log.head()[0] == 2
    holder.execute("ROLLBACK")
    holder.close()
    after = log.append(principal="b", org="acme", operation="memory.remember", targets=["mem:3"])
    assert after.seq == 5
    events = list(log.events())
    assert [(e.seq, e.principal, e.targets) for e in events[2:]] == [
        (3, "a", ("mem:1",)),
        (4, "a", ("mem:2",)),
        (5, "b", ("mem:3",)),
    ]
    assert events[2].at == kept[0].at  # when the write happened, not when it was chained
    assert log.verify().ok and log.pending() == 0
    assert not [p.name for p in tmp_path.iterdir() if ".pending" in p.name or ".draining" in p.name]


def test_aud10_kept_events_are_chained_once_after_a_drain_that_stopped_before_cleanup(
    tmp_path: Path,
) -> None:
    """AUD-10: a drain that committed and stopped before removing its file (a crash) leaves
    the kept events in the draining file; the next append finds them in the chain and does
    not append them again."""
    path = tmp_path / "audit.sqlite"
    log = AuditLog(path, busy_ms=50)
    holder = _hold_write_lock(path)
    log.append(principal="a", org="acme", operation="memory.remember", targets=["mem:1"])
    holder.execute("ROLLBACK")
    holder.close()
    pending = Path(str(path) + ".pending")
    kept = pending.read_bytes()
    log.append(principal="b", org="acme", operation="memory.remember", targets=["mem:2"])
    # As if a drain had renamed the file, committed, and its process died before
    # removing it: the next process's log finds the file when it first appends.
    Path(str(path) + ".draining.00000000000000000001.x").write_bytes(kept)
    log.close()
    log = AuditLog(path, busy_ms=50)
    log.append(principal="c", org="acme", operation="memory.remember", targets=["mem:3"])
    assert [e.principal for e in log.events()] == ["a", "b", "c"]
    assert log.verify().ok and log.pending() == 0


def test_aud10_verify_says_how_many_events_are_pending(tmp_path: Path) -> None:
    path = tmp_path / "audit.sqlite"
    log = AuditLog(path, busy_ms=50)
    _fill(log, 1)
    holder = _hold_write_lock(path)
    log.append(principal="a", org="acme", operation="memory.remember", targets=["mem:1"])
    holder.execute("ROLLBACK")
    holder.close()
    log.close()
    out = CliRunner().invoke(cli_main, ["--data-dir", str(tmp_path), "audit", "verify"])
    assert out.exit_code == 0, out.output
    assert "ok: 1 events;" in out.output and "; 1 pending" in out.output


def test_aud10_an_event_appended_after_close_is_kept_and_chained_at_the_next_start(
    tmp_path: Path,
) -> None:
    """AUD-10: work that runs on past shutdown (a document graph build, a derived rebuild)
    ends after the log was closed. Its event is kept in the pending file (owner-only) and
    joins the chain, in order and once, at the first append after the log is opened
    again; before, the append failed on the closed log and the event was lost."""
    path = tmp_path / "audit.sqlite"
    log = AuditLog(path)
    _fill(log, 2)
    log.close()
    late = log.append(principal="local", org="", operation="docgraph.build", targets=["/ws"])
    assert late.seq == 0
    kept = Path(str(path) + ".pending")
    assert kept.stat().st_mode & 0o777 == 0o600
    log.close()  # closing again changes nothing
    again = AuditLog(path)
    try:
        assert again.pending() == 1
        assert again.append(principal="local", org="", operation="ingest").seq == 4
        assert [e.operation for e in again.events()] == [
            "kb.revision.submit",
            "kb.revision.submit",
            "docgraph.build",
            "ingest",
        ]
        assert again.pending() == 0 and again.verify().ok
    finally:
        again.close()


def _keep_one(log: AuditLog, path: Path, principal: str) -> None:
    holder = _hold_write_lock(path)
    try:
        log.append(principal=principal, org="acme", operation="memory.remember", targets=["m"])
    finally:
        holder.execute("ROLLBACK")
        holder.close()


def test_aud10_a_kept_line_the_service_did_not_write_is_set_aside_never_chained(
    tmp_path: Path,
) -> None:
    """AUD-10: lines in the pending file that are not the service's own (junk of wrong
    types, a forged event without the HMAC under the log's key) are set aside in the
    rejected file, never chained, and never block the appends after them. Before, one
    badly typed line failed every later append, and a forged one joined the chain."""
    path = tmp_path / "audit.sqlite"
    log = AuditLog(path, busy_ms=50)
    _fill(log, 1)
    _keep_one(log, path, "kept")
    pending = Path(str(path) + ".pending")
    good = json.loads(pending.read_text())
    forged = {**good, "principal": "admin", "operation": "token.revoke"}
    junk = [
        {**good, "targets": 5},
        {**good, "after_seq": 1e400},
        {**good, "at": {}},
        forged,
    ]
    with pending.open("a") as fh:
        for line in junk:
            fh.write(json.dumps(line) + "\n")
        fh.write("not json at all\n")
    for i in range(3):
        log.append(principal=f"after{i}", org="acme", operation="memory.remember")
    assert [e.principal for e in log.events()] == ["p0", "kept", "after0", "after1", "after2"]
    assert log.verify().ok and log.pending() == 0
    rejected = Path(str(path) + ".pending-rejected").read_text().splitlines()
    assert len(rejected) == 5
    assert stat.S_IMODE(os.stat(str(path) + ".pending-rejected").st_mode) == 0o600


def test_aud10_an_unfinished_kept_line_does_not_swallow_the_next(tmp_path: Path) -> None:
    """AUD-10: a line left unfinished in the pending file (its writer killed, or a short
    write on a full disk) is ended by the next writer before its own line, so the next
    kept event, whose caller was answered as recorded, is chained; before, the two lines
    ran together and were dropped as one unreadable line."""
    path = tmp_path / "audit.sqlite"
    log = AuditLog(path, busy_ms=50)
    _fill(log, 1)
    Path(str(path) + ".pending").write_bytes(b'{"at": "2026-12-05T00:00:00.000000Z", "princ')
    _keep_one(log, path, "kept")
    log.append(principal="next", org="acme", operation="memory.remember")
    assert [e.principal for e in log.events()] == ["p0", "kept", "next"]
    assert log.verify().ok


def test_aud10_a_left_draining_file_and_the_pending_file_are_chained_in_order(
    tmp_path: Path,
) -> None:
    """AUD-10: events kept by a drain that stopped before removing its file come first,
    then the pending file's, then the append's own: the order kept. Before, a left file
    alone was drained and the pending file's events came after the new one."""
    path = tmp_path / "audit.sqlite"
    log = AuditLog(path, busy_ms=50)
    _fill(log, 1)
    _keep_one(log, path, "first")
    Path(str(path) + ".pending").rename(str(path) + ".draining.00000000000000000001.x")
    _keep_one(log, path, "second")
    log.append(principal="third", org="acme", operation="memory.remember")
    assert [e.principal for e in log.events()] == ["p0", "first", "second", "third"]
    assert log.verify().ok and log.pending() == 0
