"""Lane helpers: ``ts`` gives the same Timestamp as protobuf's own FromDatetime;
``snapshot`` holds a lane call's reads to one state of the store."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import apsw
import pytest
from google.protobuf import timestamp_pb2
from hypothesis import given
from hypothesis import strategies as st
from knowledge_server.lanes.common import ts
from knowledge_server.schema import snapshot

_ZONES = st.one_of(
    st.none(),
    st.just(UTC),
    st.builds(
        lambda m: timezone(timedelta(minutes=m)), st.integers(min_value=-14 * 60, max_value=14 * 60)
    ),
)


@given(
    st.datetimes(min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30)),
    _ZONES,
)
def test_ts_of_datetime_equals_from_datetime(dt: datetime, zone: timezone | None) -> None:
    value = dt.replace(tzinfo=zone)
    ref = timestamp_pb2.Timestamp()
    ref.FromDatetime(value if value.tzinfo else value.replace(tzinfo=UTC))
    got = ts(value)
    assert got is not None and (got.seconds, got.nanos) == (ref.seconds, ref.nanos)


@given(st.floats(min_value=-1e10, max_value=2.5e11, allow_nan=False))
def test_ts_of_posix_seconds_equals_from_datetime(seconds: float) -> None:
    ref = timestamp_pb2.Timestamp()
    ref.FromDatetime(datetime.fromtimestamp(seconds, tz=UTC))
    got = ts(seconds)
    assert got is not None and (got.seconds, got.nanos) == (ref.seconds, ref.nanos)
    assert ts(None) is None


def test_snapshot_reads_one_state_and_ends_its_transaction(tmp_path: Path) -> None:
    """A lane call's reads see one state of the store: a commit by another connection in
    between is not seen until the snapshot ends; the transaction ends on success, on
    error, and a snapshot inside a transaction changes nothing."""
    path = str(tmp_path / "s.sqlite")
    writer = apsw.Connection(path)
    writer.execute("PRAGMA journal_mode=WAL").fetchall()
    writer.execute("CREATE TABLE t(x)")
    writer.execute("INSERT INTO t VALUES (1)")
    reader = apsw.Connection(path)
    count = "SELECT count(*) FROM t"
    with snapshot(reader):
        assert reader.execute(count).fetchone() == (1,)
        writer.execute("INSERT INTO t VALUES (2)")
        assert reader.execute(count).fetchone() == (1,)
        with snapshot(reader):  # nested: the same transaction
            assert reader.execute(count).fetchone() == (1,)
        assert not reader.getautocommit()
    assert reader.getautocommit()
    assert reader.execute(count).fetchone() == (2,)
    with pytest.raises(ZeroDivisionError), snapshot(reader):
        reader.execute(count).fetchone()
        raise ZeroDivisionError
    assert reader.getautocommit()
