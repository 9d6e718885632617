"""The CLI against a real `knowledge serve` process (stable operator interface).

Serving and signals need a real process; every other command runs in process through
click's CliRunner (same code path, same real server over a real port, no interpreter
start per call)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from click.testing import CliRunner, Result
from knowledge_server.cli import main
from knowledge_server.cli.common import code_refs_text

from tests.conftest import REPO_ROOT

KNOWLEDGE = [sys.executable, "-m", "knowledge_server.cli"]


def _invoke(env: dict[str, str], *args: str) -> Result:
    """One CLI command in this process, with ``env`` as its environment."""
    return CliRunner().invoke(main, list(args), env=env, catch_exceptions=False)


def _env(tmp_path: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("KNOWLEDGE_ADDRESS", None)
    env["KNOWLEDGE_DATA_DIR"] = str(tmp_path / "data")
    env["KNOWLEDGE_LOG_FORMAT"] = "json"
    return env


@pytest.fixture
def served(tmp_path: Path):  # type: ignore[no-untyped-def]
    env = _env(tmp_path)
    proc = subprocess.Popen(
        [*KNOWLEDGE, "serve", "--listen", "127.0.0.1:0", "--no-bootstrap"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO_ROOT,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    assert line.startswith("listening on 127.0.0.1:"), line
    port = int(line.rsplit(":", 1)[1])
    assert port > 0
    yield proc, env, port
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=20)


def test_serve_prints_bound_port_and_search_json_is_one_document(served) -> None:  # type: ignore[no-untyped-def]
    _proc, env, port = served
    # The address recorded in the data dir is found without --address.
    out = _invoke(env, "search", "where is the config", "--json")
    assert out.exit_code == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["schema"] == "knowledge.search/v1"
    assert set(doc["lanes"]) >= {"episodes", "code"}
    assert "index_rev" in doc["lanes"]["code"] and "degradation_reason" in doc["lanes"]["code"]
    status = _invoke(env, "--address", f"127.0.0.1:{port}", "status", "--json")
    assert json.loads(status.stdout)["edition"]["edition"] == "community"


def test_search_says_why_a_lane_is_empty(served, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Seed 000 §9 on the command line: each empty lane names its reason (a fresh service:
    nothing indexed; a lane left out of --include: not requested; after an ingest, a
    question nothing matches), and the errors of the answer are printed too."""
    _proc, env, _port = served
    fresh = _invoke(env, "search", "where is the config loaded")
    assert fresh.exit_code == 0, fresh.stderr
    text = " ".join(fresh.stdout.split())
    assert "empty: index_empty: no session logs have been ingested" in text
    assert "empty: index_empty: nothing indexed" in text
    assert "error KNOWLEDGE_NO_SOURCE" in " ".join(fresh.stderr.split())
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "s.jsonl").write_text(
        json.dumps({"session_id": "s1", "seq": 0, "role": "user", "text": "rotate the cookie"})
        + "\n"
    )
    assert _invoke(env, "ingest", str(logs), "--json").exit_code == 0
    only = _invoke(env, "search", "qqxvzrtk wwpfhjnb", "--include", "episodes")
    text = " ".join(only.stdout.split())
    assert "episodes rev=" in text and "empty: no_match: nothing matched" in text
    assert "code not requested" in text
    doc = json.loads(_invoke(env, "search", "cookie", "--include", "code", "--json").stdout)
    assert doc["lanes"]["episodes"]["empty_reason"] == "not_requested"
    assert doc["lanes"]["episodes"]["degraded"] is False


def test_search_names_the_workspace_of_each_code_item_when_there_are_several(served) -> None:  # type: ignore[no-untyped-def]
    """Two checkouts of one repository indexed side by side hold the same paths: the text
    answer names each code item's workspace, so its address is not ambiguous."""
    _proc, env, _port = served
    # Short roots: the console folds a word longer than its width, as pytest's paths are.
    with tempfile.TemporaryDirectory(prefix="ks-") as tmp:
        roots = [Path(tmp).resolve() / "one", Path(tmp).resolve() / "two"]
        for root in roots:
            (root / "src").mkdir(parents=True)
            (root / "src" / "cookies.py").write_text(
                "def rotate_cookie_secret(store):\n    return store.rotate()\n"
            )
            assert _invoke(env, "index", str(root), "--json").exit_code == 0
        both = _invoke(env, "search", "rotate cookie secret", "--include", "code")
        assert both.exit_code == 0, both.stderr
        text = " ".join(both.stdout.split())
        assert text.count("src/cookies.py:1-2 in ") == 2
        for root in roots:
            assert f"src/cookies.py:1-2 in {root} rotate_cookie_secret" in text
        one = _invoke(
            env, "search", "rotate cookie secret", "--include", "code", "--workspace", str(roots[0])
        )
        assert "src/cookies.py:1-2 rotate_cookie_secret" in " ".join(one.stdout.split())


def test_text_from_logs_and_file_names_is_printed_as_text_not_markup(served) -> None:  # type: ignore[no-untyped-def]
    """A session id or a file name holding console markup (``[/x]``, ``[bold]``) is printed
    as written by search, get-episode and get-chunk: it once stopped the command with a
    markup error, and could restyle what followed it."""
    _proc, env, _port = served
    with tempfile.TemporaryDirectory(prefix="ks-") as tmp:
        root = Path(tmp).resolve()
        (root / "src").mkdir()
        (root / "src" / "a[x]ill.py").write_text(
            "def settle_invoice_markup(bill):\n    return bill\n"
        )
        logs = root / "logs"
        logs.mkdir()
        record = {
            "session_id": "s[/x][bold]",
            "seq": 1,
            "role": "user",
            "cwd": str(root),
            "text": "settle invoice markup for the [red]client[/red]",
        }
        (logs / "s.jsonl").write_text(json.dumps(record) + "\n")
        assert _invoke(env, "index", str(root), "--json").exit_code == 0
        assert _invoke(env, "ingest", str(logs), "--json").exit_code == 0
        out = _invoke(env, "search", "settle invoice markup")
        assert out.exit_code == 0, out.stderr
        text = " ".join(out.stdout.split())
        assert "src/a[x]ill.py:1-2" in text and "ep:s[/x][bold]:" in text
        found = json.loads(_invoke(env, "search", "settle invoice markup", "--json").stdout)
        episode_id = found["lanes"]["episodes"]["items"][0]["id"]
        assert episode_id.startswith("ep:s[/x][bold]:")
        episode = _invoke(env, "get-episode", episode_id)
        assert episode.exit_code == 0, episode.stderr
        assert episode_id in episode.stdout and "[red]client[/red]" in episode.stdout
        chunk_id = found["lanes"]["code"]["items"][0]["id"]
        chunk = _invoke(env, "get-chunk", chunk_id)
        assert chunk.exit_code == 0, chunk.stderr
        assert "src/a[x]ill.py:1-2" in chunk.stdout
        # A skipped file named in an operation's problems: ".../odd[/x]notes.jsonl".
        odd = root / "odd["
        odd.mkdir()
        (odd / "x]notes.jsonl").write_text("not a session log\n")
        ingested = _invoke(env, "ingest", str(odd))
        assert ingested.exit_code == 0, ingested.stderr
        assert f"{odd}/x]notes.jsonl" in ingested.stderr
        # Workspace roots in the status table: "[bold]" is a name, not a style.
        other = root / "[bold]two"
        other.mkdir()
        (other / "b.py").write_text("def other():\n    return 2\n")
        assert _invoke(env, "index", str(other), "--json").exit_code == 0
        status = _invoke(env, "status")
        assert status.exit_code == 0, status.stderr
        assert "[bold]two" in "".join(status.stdout.split())


def test_edition_refusal_is_one_line_with_the_edition(served) -> None:  # type: ignore[no-untyped-def]
    _proc, env, _port = served
    out = _invoke(env, "docgraph", "themes")
    assert out.exit_code == 3
    lines = [ln for ln in out.stderr.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and "enterprise" in lines[0]


def _serves_by_its_recorded_address(
    env: dict[str, str], proc: subprocess.Popen[str], check: Any = None
) -> str:
    """Wait until `proc` (a `knowledge serve`) records its address, check a client finds
    it there (and ``check(proc)``), stop it with SIGTERM (exit 0, no traceback, address
    withdrawn); its standard error."""
    recorded = Path(env["KNOWLEDGE_DATA_DIR"]) / "server.json"
    try:
        for _ in range(600):
            if recorded.exists() or proc.poll() is not None:
                break
            time.sleep(0.1)
        assert proc.poll() is None, "the server stopped"
        assert recorded.exists(), "no address recorded"
        assert _invoke(env, "status").exit_code == 0
        if check is not None:
            check(proc)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.stderr is not None
    err = proc.stderr.read()
    assert "Traceback" not in err, err[-2000:]
    assert not recorded.exists()
    return err


def test_serve_whose_stdout_nobody_reads_serves_on_and_stops_on_sigterm(
    tmp_path: Path,
) -> None:
    """`knowledge serve --workers 2` whose standard output has no reader (the reader of a
    pipe gone, as `| head -0` leaves it): the listening line is lost, not the service; it
    records its address, answers there and stops on SIGTERM. Before, the failed line
    left the workers serving and the process waiting for them until killed, with no
    address recorded."""
    env = _env(tmp_path)
    read_end, write_end = os.pipe()
    os.close(read_end)
    proc = subprocess.Popen(
        [*KNOWLEDGE, "serve", "--listen", "127.0.0.1:0", "--no-bootstrap", "--workers", "2"],
        env=env,
        stdout=write_end,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO_ROOT,
    )
    os.close(write_end)
    assert "server.listening_line_lost" in _serves_by_its_recorded_address(env, proc)


def test_serve_with_standard_output_closed_serves_on_and_stops_on_sigterm(
    tmp_path: Path,
) -> None:
    """`knowledge serve --workers 2 >&-` (standard output closed, as some supervisors
    start a daemon): it records its address, answers there and stops on SIGTERM, its
    workers with it. Before, writing the listening line raised an AttributeError, and
    the process waited for its workers until killed."""
    env = _env(tmp_path)
    proc = subprocess.Popen(
        [*KNOWLEDGE, "serve", "--listen", "127.0.0.1:0", "--no-bootstrap", "--workers", "2"],
        env=env,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO_ROOT,
        preexec_fn=lambda: os.close(1),  # the child starts with standard output closed
    )

    def null_on_stdout(proc: subprocess.Popen[str]) -> None:
        # The null device took descriptor 1, not the first file the server opened.
        assert os.readlink(f"/proc/{proc.pid}/fd/1") == os.devnull

    _serves_by_its_recorded_address(env, proc, null_on_stdout)


def test_serve_prints_its_line_when_only_the_address_cannot_be_recorded(
    tmp_path: Path,
) -> None:
    """The address cannot be recorded (a full disk; here its temporary file's name is
    taken by a folder): the listening line still goes to standard output, and the log
    says what failed (the line was withheld, and blamed on standard output)."""
    env = _env(tmp_path)
    data = Path(env["KNOWLEDGE_DATA_DIR"])
    (data / "server.json.tmp").mkdir(parents=True)
    proc = subprocess.Popen(
        [*KNOWLEDGE, "serve", "--listen", "127.0.0.1:0", "--no-bootstrap"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO_ROOT,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("listening on 127.0.0.1:"), line
        assert not (data / "server.json").exists()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.stderr is not None
    err = proc.stderr.read()
    assert "server.address_not_recorded" in err and "listening_line_lost" not in err, err


def test_serve_makes_its_folders_owner_only_so_its_clients_follow_it(tmp_path: Path) -> None:
    """Under a umask of 002 with a group shared with others, the data directory and its
    `locks/` came out group-writable, and clients (rightly) refused the address recorded
    there: every client of a server on another port dialled the default. The server makes
    both owner-only, and a `locks/` an earlier version left group-writable loses that bit."""
    import stat as st

    env = _env(tmp_path)
    data = Path(env["KNOWLEDGE_DATA_DIR"])
    for round_ in (1, 2):
        proc = subprocess.Popen(
            [*KNOWLEDGE, "serve", "--listen", "127.0.0.1:0", "--no-bootstrap"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            cwd=REPO_ROOT,
            preexec_fn=lambda: os.umask(0o002),  # the child's umask
        )
        try:
            assert proc.stdout is not None
            assert proc.stdout.readline().startswith("listening on ")
            assert st.S_IMODE(data.stat().st_mode) & 0o022 == 0
            assert st.S_IMODE((data / "locks").stat().st_mode) & 0o022 == 0, round_
            assert _invoke(env, "status").exit_code == 0
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=60) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        (data / "locks").chmod(0o775)  # as an earlier version left it


def test_sigterm_stops_gracefully(served) -> None:  # type: ignore[no-untyped-def]
    proc, env, _port = served
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=20) == 0
    assert not (Path(env["KNOWLEDGE_DATA_DIR"]) / "server.json").exists()


def test_serve_withdraws_its_address_when_asked_to_stop_not_when_the_process_ends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Work that runs on past the stop (a document graph build) keeps the process alive
    after its port is given up: server.json must be gone by then, or clients follow it
    to a port anyone may take (it was removed only when the process ended). And a
    server.json a killed server left is removed as soon as `serve` holds the directory,
    before anything is opened."""
    import knowledge_server.server as server_module

    data = tmp_path / "data"
    data.mkdir(mode=0o700)
    (data / "server.json").write_text(json.dumps({"address": "127.0.0.1:1", "pid": 1}))
    seen: dict[str, bool] = {}

    async def fake_serve(config: Any, *, out: Any, on_stopping: Any, **_: Any) -> None:
        seen["stale_left"] = (data / "server.json").exists()
        print("listening on 127.0.0.1:45999", file=out, flush=True)
        seen["recorded"] = (data / "server.json").exists()
        on_stopping()  # SIGTERM: the stop is asked; the grace and the stores follow
        seen["withdrawn_at_stop"] = not (data / "server.json").exists()

    monkeypatch.setattr(server_module, "serve", fake_serve)
    env = {**_env(tmp_path), "KNOWLEDGE_DATA_DIR": str(data)}
    out = CliRunner().invoke(main, ["serve", "--listen", "127.0.0.1:0", "--no-bootstrap"], env=env)
    assert out.exit_code == 0, out.output
    assert seen == {"stale_left": False, "recorded": True, "withdrawn_at_stop": True}


def test_second_serve_on_a_busy_port_leaves_the_first_alone(served) -> None:  # type: ignore[no-untyped-def]
    """A second `serve` on the port of a running one, with the same data directory: one
    line naming the address and exit 2; the first keeps serving and keeps its server.json."""
    proc, env, port = served
    recorded = Path(env["KNOWLEDGE_DATA_DIR"]) / "server.json"
    before = recorded.read_text()
    assert json.loads(before)["pid"] == proc.pid
    second = subprocess.run(
        [*KNOWLEDGE, "serve", "--listen", f"127.0.0.1:{port}", "--no-bootstrap"],
        env=env,
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        timeout=60,
    )
    assert second.returncode == 2, second.stderr
    assert second.stdout == ""
    lines = second.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), second.stderr
    assert f"127.0.0.1:{port} is already in use" in lines[0]
    assert proc.poll() is None
    assert recorded.read_text() == before
    status = _invoke(env, "status", "--json")  # found through the recorded address
    assert status.exit_code == 0, status.stderr


def test_a_port_shared_among_another_servers_workers_is_busy_too() -> None:
    """A server with workers listens with SO_REUSEPORT; the start check binds without it, so
    a second server is refused rather than silently sharing the port."""
    import socket

    from knowledge_server.config import ConfigError
    from knowledge_server.server import check_port_free

    with socket.socket() as other:
        other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        other.bind(("127.0.0.1", 0))
        other.listen(1)
        port = other.getsockname()[1]
        with pytest.raises(ConfigError, match=f"127.0.0.1:{port} is already in use"):
            check_port_free(f"127.0.0.1:{port}")
    check_port_free(f"127.0.0.1:{port}")  # free again once it is closed


def test_clear_address_keeps_the_file_of_another_process(tmp_path: Path) -> None:
    from knowledge_server.cli.common import clear_address, record_address

    (tmp_path / "server.json").write_text(json.dumps({"address": "127.0.0.1:1", "pid": 1}))
    clear_address(tmp_path)
    assert (tmp_path / "server.json").exists()
    record_address(tmp_path, "127.0.0.1:2")
    clear_address(tmp_path)
    assert not (tmp_path / "server.json").exists()


def test_unreachable_service_is_a_clear_error(tmp_path: Path) -> None:
    out = _invoke(_env(tmp_path), "--address", "127.0.0.1:1", "--timeout", "0.5", "status")
    assert out.exit_code == 4 and "cannot reach the service" in out.stderr


def test_bad_configuration_exits_2_with_the_setting(tmp_path: Path) -> None:
    env = _env(tmp_path)
    env["KNOWLEDGE_LANE_TIMEOUT_MS"] = "nope"
    out = _invoke(env, "serve", "--listen", "127.0.0.1:0")
    assert out.exit_code == 2 and "KNOWLEDGE_LANE_TIMEOUT_MS" in out.stderr


def test_serve_refuses_a_workspace_that_does_not_exist(tmp_path: Path) -> None:
    missing = tmp_path / "nonexistent"
    out = subprocess.run(
        [*KNOWLEDGE, "serve", "--listen", "127.0.0.1:0", "--workspace", str(missing)],
        env=_env(tmp_path),
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        timeout=60,
    )
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.splitlines() == [
        f"error: configuration: workspaces: {missing} does not exist"
    ]
    assert not (tmp_path / "data" / "server.json").exists()


def test_a_workspace_that_is_a_file_is_refused(tmp_path: Path) -> None:
    from knowledge_server.config import ConfigError, check_workspaces, load_config

    (tmp_path / "file.py").write_text("x = 1\n")
    cfg = load_config(env={}, overrides={"workspaces": [str(tmp_path / "file.py")]})
    with pytest.raises(ConfigError, match="is not a directory"):
        check_workspaces(cfg)
    check_workspaces(load_config(env={}, overrides={"workspaces": [str(tmp_path)]}))


def test_every_command_has_help() -> None:
    from knowledge_server.cli import iter_commands

    for path in iter_commands():
        out = _invoke({}, *path.split(), "--help")
        assert out.exit_code == 0 and "Usage:" in out.stdout, path
        assert len(out.stdout.splitlines()) > 3, path


def test_search_filters_from_the_command_line(served, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """--since/--until reach the episodes lane through the SDK and the service: each window
    returns the events inside it and only those; a window after the newest event returns
    none; a malformed time is refused before any call, naming the option. --actor and
    --skill reach the service too."""
    _proc, env, _port = served
    logs = tmp_path / "logs"
    logs.mkdir()
    lines = [
        json.dumps(
            {
                "session_id": sid,
                "seq": 0,
                "time": when,
                "role": "user",
                "text": "rotate the session cookie",
                "cwd": "/work/app",
            }
        )
        for sid, when in (("early", "2026-01-10T08:00:00Z"), ("late", "2026-02-20T08:00:00Z"))
    ]
    (logs / "s.jsonl").write_text("\n".join(lines) + "\n")

    def run(*args: str) -> Result:
        return _invoke(env, *args)

    assert run("ingest", str(logs), "--json").exit_code == 0

    def sessions(*window: str) -> set[str]:
        out = run("search", "cookie", "--include", "episodes", "--json", *window)
        assert out.exit_code == 0, out.stderr
        return {i["session_id"] for i in json.loads(out.stdout)["lanes"]["episodes"]["items"]}

    assert sessions() == {"early", "late"}
    assert sessions("--since", "2026-02-01") == {"late"}
    assert sessions("--until", "2026-01-31T23:59:59Z") == {"early"}
    assert sessions("--since", "2026-01-10T08:00:00+00:00", "--until", "2026-01-10T08:00:00Z") == {
        "early"
    }
    assert sessions("--since", "2027-01-01") == set()
    bad = run("search", "cookie", "--since", "last tuesday")
    assert bad.exit_code == 2 and "--since" in bad.stderr and "RFC 3339" in bad.stderr

    # --actor narrows the actors to the ones named; --skill is passed on (no catalog here).
    def actors(*flags: str) -> set[str]:
        out = run("search", "who rotated the cookie", "--json", *flags)
        assert out.exit_code == 0, out.stderr
        return {a["actor_id"] for a in json.loads(out.stdout).get("actors", [])}

    every = actors()
    assert len(every) == 2, every
    one = min(every)
    assert actors("--actor", one) == {one}
    assert actors("--skill", "no-such-skill") == every


def test_dispatch_code_refs_name_their_workspace_when_there_are_several() -> None:
    """The hand-off package printed by `dispatch` and `outbox`: a code reference names its
    workspace when the references come from more than one (two checkouts hold the same
    paths), and only then."""

    def ref(ws: str) -> SimpleNamespace:
        return SimpleNamespace(path="src/app.py", start_line=1, end_line=9, workspace=ws)

    assert code_refs_text([ref("/work/a"), ref("/work/b")]) == [
        "code src/app.py:1-9 in /work/a",
        "code src/app.py:1-9 in /work/b",
    ]
    assert code_refs_text([ref("/work/a"), ref("/work/a")]) == ["code src/app.py:1-9"] * 2


def test_connection_settings_and_deadlines_fail_in_one_line_with_their_exit_code(
    tmp_path: Path,
) -> None:
    """docs/cli.md's exit codes: the caller's own input (a TLS file that cannot be read, a
    certificate without its key, a --timeout that is no positive number) is 2, one line;
    a service that accepts and never answers is 4 with its address, as one that cannot be
    reached (it was a bare "Deadline Exceeded", 1; the TLS file 1; --timeout nan and -5
    were sent as deadlines)."""
    import socket

    base = {"KNOWLEDGE_DATA_DIR": str(tmp_path), "KNOWLEDGE_ADDRESS": "127.0.0.1:1"}
    for env in (
        {"KNOWLEDGE_TLS_CA": str(tmp_path / "missing-ca.pem")},
        {"KNOWLEDGE_TLS_CERT": str(tmp_path / "c.pem")},
    ):
        result = CliRunner().invoke(main, ["status"], env={**base, **env})
        assert result.exit_code == 2, result.output
        assert "Traceback" not in result.output
    for value in ("nan", "-5", "0"):
        result = CliRunner().invoke(main, ["--timeout", value, "status"], env=base)
        assert result.exit_code == 2, (value, result.output)
    mute = socket.socket()
    mute.bind(("127.0.0.1", 0))
    mute.listen(8)  # connections complete, nothing is ever said
    try:
        address = f"127.0.0.1:{mute.getsockname()[1]}"
        result = CliRunner().invoke(
            main, ["--timeout", "1", "status"], env={**base, "KNOWLEDGE_ADDRESS": address}
        )
    finally:
        mute.close()
    assert result.exit_code == 4, result.output
    assert address in result.output and "within the deadline" in result.output


def test_ingest_watch_json_prints_one_summary_per_line_and_stops_cleanly_on_ctrl_c(
    served, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    """`ingest --watch --json` prints JSON Lines: one summary a round, each a JSON object
    on its own line (it printed indented documents one after another, no JSON at all);
    Ctrl-C, the documented way to stop it, ends it with exit 0 (it was 1, "Aborted!")."""
    import time

    _proc, env, _port = served
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "s.jsonl").write_text(
        json.dumps({"session_id": "s", "role": "user", "text": "hi"}) + "\n"
    )
    watch = subprocess.Popen(
        [*KNOWLEDGE, "ingest", str(logs), "--watch", "--interval", "0.2", "--json"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO_ROOT,
    )
    assert watch.stdout is not None
    lines = [watch.stdout.readline(), watch.stdout.readline()]  # two rounds
    time.sleep(0.1)
    watch.send_signal(signal.SIGINT)
    rest, err = watch.communicate(timeout=30)
    assert watch.returncode == 0, err
    for line in [*lines, *rest.splitlines()]:
        if line.strip():
            assert "index_rev" in json.loads(line)


def test_serve_refuses_a_session_path_that_does_not_exist(tmp_path: Path) -> None:
    """`serve --sessions PATH` with a path that does not exist is a usage error (exit 2,
    naming it), as `--workspace` is; it started and ingested nothing, without a word."""
    missing = tmp_path / "no-such-logs"
    result = CliRunner().invoke(
        main,
        ["serve", "--listen", "127.0.0.1:0", "--sessions", str(missing)],
        env={"KNOWLEDGE_DATA_DIR": str(tmp_path / "data")},
    )
    assert result.exit_code == 2, result.output
    assert "no-such-logs" in result.output and "does not exist" in result.output


def test_a_second_serve_on_the_same_data_directory_is_refused_naming_the_first(
    served,
) -> None:  # type: ignore[no-untyped-def]
    """Two servers on one data directory each ran a bootstrap, a task worker and a log
    watcher of their own, and the second one's exit removed the first one's server.json
    (clients then dialled the default address). The second is refused (exit 2, naming the
    first's address), and the first keeps serving and its server.json."""
    _proc, env, port = served
    second = subprocess.run(
        [*KNOWLEDGE, "serve", "--listen", "127.0.0.1:0", "--no-bootstrap"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO_ROOT,
        check=False,
    )
    assert second.returncode == 2, second.stderr
    assert "in use by another `knowledge serve`" in second.stderr
    assert f"127.0.0.1:{port}" in second.stderr
    recorded = json.loads((Path(env["KNOWLEDGE_DATA_DIR"]) / "server.json").read_text())
    assert recorded["address"] == f"127.0.0.1:{port}"
    assert _invoke(env, "status").exit_code == 0


def test_only_a_file_the_command_reads_is_the_callers_error(tmp_path: Path) -> None:
    """A file a command reads that fails (an upload that changed) is one line and exit 2;
    an OSError about no file (a broken pipe to `head`, a full disk under the output) is
    not the caller's input and is left to click, as before (it became exit 2, "usage")."""
    import click
    from knowledge_server.cli.common import handle_errors

    def command(exc: OSError) -> click.Command:
        @click.command()
        @handle_errors
        def run() -> None:
            raise exc

        return run

    result = CliRunner().invoke(command(OSError(5, "the file changed", "notes.md")))
    assert result.exit_code == 2 and "notes.md: the file changed" in result.output
    for exc in (BrokenPipeError(32, "Broken pipe"), OSError(28, "No space left on device")):
        result = CliRunner().invoke(command(exc))
        assert result.exit_code != 2 and "error:" not in result.output, result.output


def test_serve_expands_a_home_relative_session_path_before_checking_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--sessions=~/logs` (a shell expands no `~` after `=`, nor a unit file) names the
    home's logs: it is expanded, then checked; refused, it had served before the check."""
    from knowledge_server.cli import _existing_paths

    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "logs").mkdir()
    assert _existing_paths(("~/logs",), "--sessions") == (str(tmp_path / "logs"),)


def test_ingest_watch_stopped_before_any_round_ended_is_no_success(tmp_path: Path) -> None:
    """Ctrl-C ends `ingest --watch` with exit 0 only after a round ended: stopped while the
    first never did (a service that accepts and never answers), it is no success (it was
    0, so a script could not tell it never worked)."""
    import socket
    import time

    mute = socket.socket()
    mute.bind(("127.0.0.1", 0))
    mute.listen(8)
    logs = tmp_path / "logs"
    logs.mkdir()
    env = {**_env(tmp_path), "KNOWLEDGE_ADDRESS": f"127.0.0.1:{mute.getsockname()[1]}"}
    try:
        watch = subprocess.Popen(
            [*KNOWLEDGE, "ingest", str(logs), "--watch", "--json"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=REPO_ROOT,
        )
        time.sleep(2)  # well into its first round, which never ends
        watch.send_signal(signal.SIGINT)
        out, err = watch.communicate(timeout=30)
    finally:
        mute.close()
    assert watch.returncode != 0, (out, err)
    assert out == ""
