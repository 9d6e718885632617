"""Lane deadlines (knowledge_server.lanes.common.bound_reader / run_bounded).

Our lanes run their SQLite reads on the event loop's thread. Invariants behind KC-3/KC-4
(a slow or stuck lane degrades alone, in its timeout): a reader's query still running at
the lane deadline is stopped there; a busy database is waited for until the deadline at
most; outside a lane call (no deadline) nothing is interrupted; and an answer a blocking
lane returns after its timeout is not used.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import apsw
import pytest
from knowledge_server._gen.knowledge.v1 import search_pb2
from knowledge_server.lanes.common import LaneDeadlineExceeded, bound_reader, run_bounded
from knowledge_server.search.coordinator import Coordinator
from knowledge_server.search.lanes import LANE_DEADLINE, LaneQuery, LaneResult, empty_lane
from knowledge_server.search.validate import validate_search

# Minutes of work for SQLite unless something stops it.
ENDLESS = (
    "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 5000000000)"
    " SELECT count(*) FROM c"
)


def _reader(busy_ms: int = 5000, path: str = ":memory:") -> apsw.Connection:
    conn = apsw.Connection(path)
    bound_reader(conn, busy_ms=busy_ms)
    return conn


def _with_deadline(seconds: float, fn):  # type: ignore[no-untyped-def]
    token = LANE_DEADLINE.set(time.monotonic() + seconds)
    try:
        return run_bounded(fn)
    finally:
        LANE_DEADLINE.reset(token)


def test_query_is_stopped_at_the_lane_deadline() -> None:
    conn = _reader()
    started = time.monotonic()
    with pytest.raises(LaneDeadlineExceeded):
        _with_deadline(0.05, lambda: conn.execute(ENDLESS).fetchone())
    assert time.monotonic() - started < 10  # uninterrupted, the query runs for minutes
    # The connection stays usable.
    assert conn.execute("SELECT 42").fetchone() == (42,)


def test_no_deadline_no_interruption() -> None:
    conn = _reader()
    n = conn.execute(
        "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 300000)"
        " SELECT count(*) FROM c"
    ).fetchone()[0]
    assert n == 300000
    assert run_bounded(lambda: conn.execute("SELECT 1").fetchone()) == (1,)


def _locked_db(tmp_path: Path) -> tuple[str, apsw.Connection]:
    path = str(tmp_path / "busy.sqlite")
    writer = apsw.Connection(path)
    writer.execute("CREATE TABLE t(x)")
    writer.execute("BEGIN EXCLUSIVE")  # rollback journal: readers see SQLITE_BUSY
    writer.execute("INSERT INTO t VALUES (1)")
    return path, writer


def test_busy_database_is_waited_for_until_the_deadline_only(tmp_path: Path) -> None:
    path, writer = _locked_db(tmp_path)
    try:
        reader = _reader(busy_ms=60_000, path=path)
        started = time.monotonic()
        with pytest.raises(apsw.BusyError):
            _with_deadline(0.1, lambda: reader.execute("SELECT count(*) FROM t").fetchone())
        assert time.monotonic() - started < 10  # not the 60 s busy timeout
    finally:
        writer.execute("ROLLBACK")


def test_busy_database_without_deadline_waits_the_busy_timeout(tmp_path: Path) -> None:
    path, writer = _locked_db(tmp_path)
    try:
        reader = _reader(busy_ms=300, path=path)
        started = time.monotonic()
        with pytest.raises(apsw.BusyError):
            reader.execute("SELECT count(*) FROM t").fetchone()
        assert time.monotonic() - started >= 0.25
    finally:
        writer.execute("ROLLBACK")
    assert reader.execute("SELECT count(*) FROM t").fetchone() == (0,)


class _BlockingLane:
    """Blocks the loop instead of awaiting, as our lanes do, then answers anyway."""

    def __init__(self, name: str, seconds: float) -> None:
        self.name, self.seconds = name, seconds

    async def search(self, q: LaneQuery) -> LaneResult:
        time.sleep(self.seconds)  # noqa: ASYNC251 - blocking on purpose, as our lanes do
        lane = empty_lane(self.name)
        if self.name == "code":
            lane.items.add(id="chunk:late", chunk_id="late", path="late.py", start_line=1)
        else:
            lane.items.add(id="ep:late:1", session_id="late", seq=1)
        return LaneResult(lane=lane)


class _StuckQueryLane:
    """A lane whose SQLite query would run for minutes."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.conn = _reader()

    async def search(self, q: LaneQuery) -> LaneResult:
        return run_bounded(lambda: self.conn.execute(ENDLESS).fetchone())  # type: ignore[return-value]


class _QuickLane:
    def __init__(self, name: str) -> None:
        self.name = name

    async def search(self, q: LaneQuery) -> LaneResult:
        lane = empty_lane(self.name)
        lane.items.add(id="ep:s1:1", session_id="s1", seq=1, snippet="quick")
        return LaneResult(lane=lane)


def _search(lanes: dict, timeout_ms: int) -> search_pb2.SearchResponse:  # type: ignore[type-arg]
    co = Coordinator(lanes, timeout_ms=timeout_ms, cache_size=0)
    v = validate_search(
        search_pb2.SearchRequest(
            schema="knowledge.search/v1", query="who fixed it", include=["episodes", "code"]
        )
    )
    return asyncio.run(co.search(v, None))


@pytest.mark.parametrize("code_lane", [_StuckQueryLane("code"), _BlockingLane("code", 0.4)])
def test_kc3_lane_past_its_timeout_degrades_and_the_other_answers(code_lane: object) -> None:
    started = time.monotonic()
    resp = _search({"episodes": _QuickLane("episodes"), "code": code_lane}, timeout_ms=150)
    assert time.monotonic() - started < 10
    assert resp.lanes.code.degraded and "timeout" in resp.lanes.code.degradation_reason
    assert not resp.lanes.code.items  # the late answer is not used
    assert [it.id for it in resp.lanes.episodes.items] == ["ep:s1:1"] and resp.found


def test_kc4_each_blocking_lane_gets_its_whole_timeout() -> None:
    """Blocking lanes run one after another; a lane's time counts from its own start, so
    two lanes that each stay within the timeout both answer although together they take
    longer than it."""
    lanes = {"episodes": _BlockingLane("episodes", 0.25), "code": _BlockingLane("code", 0.25)}
    resp = _search(lanes, timeout_ms=400)
    assert not resp.lanes.episodes.degraded and not resp.lanes.code.degraded
    assert [it.id for it in resp.lanes.code.items] == ["chunk:late"]


def test_every_built_in_lane_reader_stops_at_the_deadline(tmp_path: Path) -> None:
    """The wiring: the reader connections our lanes search with are bound."""
    from knowledge_server.lanes.code import CodeLane
    from knowledge_server.lanes.derived import DerivedLane
    from knowledge_server.lanes.episodes import EpisodesLane

    lanes = [EpisodesLane(tmp_path), CodeLane(tmp_path), DerivedLane(tmp_path)]
    try:
        for lane in lanes:
            with lane._readers.get() as store, pytest.raises(LaneDeadlineExceeded):  # type: ignore[attr-defined]
                _with_deadline(0.05, lambda s=store: s.conn.execute(ENDLESS).fetchone())
    finally:
        for lane in lanes:
            lane.close()  # type: ignore[attr-defined]


class _HttpBackendLane:
    """An external backend: awaits a real HTTP service instead of blocking the loop, knows
    nothing of LANE_DEADLINE, and still fits the coordinator unchanged (KC-3)."""

    def __init__(self, name: str, url: str) -> None:
        self.name, self.url = name, url

    async def search(self, q: LaneQuery) -> LaneResult:
        import httpx

        async with httpx.AsyncClient(timeout=30) as client:
            answer = (await client.get(self.url)).json()
        lane = empty_lane(self.name)
        lane.items.add(id=f"ep:{answer['session']}:1", session_id=answer["session"], seq=1)
        return LaneResult(lane=lane)

    def revision(self) -> None:
        return None


@pytest.fixture
def slow_http() -> object:
    """A local HTTP server: /fast answers at once, /slow after 3 s; counts finished answers."""
    import http.server
    import json
    import threading

    finished: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path == "/slow":
                time.sleep(3)
            body = json.dumps({"session": self.path.strip("/")}).encode()
            try:
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                finished.append(self.path)
            except OSError:
                pass  # the caller gave up

        def log_message(self, *args: object) -> None:
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", finished
    httpd.shutdown()
    httpd.server_close()


def test_kc3_an_async_external_backend_is_cut_off_at_its_timeout(slow_http) -> None:  # type: ignore[no-untyped-def]
    """The coordinator's timeout does not depend on how a lane waits: an awaiting lane is
    cancelled at its deadline (no answer used, the search returns within the timeout)
    while an awaiting lane that answers in time is used as it is."""
    url, _ = slow_http
    lanes = {
        "episodes": _HttpBackendLane("episodes", f"{url}/fast"),
        "code": _HttpBackendLane("code", f"{url}/slow"),
    }
    started = time.monotonic()
    resp = _search(lanes, timeout_ms=1000)
    took = time.monotonic() - started
    assert took < 2.5, took  # the slow backend answers after 3 s
    assert resp.lanes.code.degraded and "timeout" in resp.lanes.code.degradation_reason
    assert not resp.lanes.code.items
    assert [it.id for it in resp.lanes.episodes.items] == ["ep:fast:1"] and resp.found
