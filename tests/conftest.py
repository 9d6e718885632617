"""Shared fixtures."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from knowledge_licensing import FEATURE_DOC_GRAPH, generate_keypair, issue_licence

REPO_ROOT = Path(__file__).resolve().parent.parent

# Test tiers, as markers (``./run test -m unit|contract|e2e``):
# - contract: the published invariants (KC-n, KD-n, the proto and surface contracts);
# - e2e: a real server on a real port, or real processes (CLI, workers, harness clients);
# - unit: everything else (one module, real SQLite files, no server).
TIERS = {
    "contract": {
        "test_audit_log",
        "test_budget_fit",
        "test_contract_proto",
        "test_dispatch_kd",
        "test_generated",
        "test_kb_index_contract",
        "test_kb_retrieve_contract",
        "test_kc_contract",
        "test_layering",
        "test_lane_deadline",
        "test_lane_finish",
        "test_memory_store",
        "test_proto_options",
        "test_search_cache_revisions",
        "test_surface_parity",
        "test_workspace_sql",
    },
    "e2e": {
        "test_auth_e2e",
        "test_bad_input",
        "test_cli",
        "test_code_e5_stop",
        "test_code_kill",
        "test_code_openai_e2e",
        "test_code_server",
        "test_deadline_e2e",
        "test_docgraph_editions",
        "test_docgraph_server",
        "test_edition_gate",
        "test_hooks",
        "test_integrations",
        "test_install_wheel",
        "test_integrations_l2",
        "test_integrations_live",
        "test_isolation_canary_e2e",
        "test_kb_admin_e2e",
        "test_kb_http_e2e",
        "test_kb_retrieve_e2e",
        "test_kb_surfaces_e2e",
        "test_live_ingest_e2e",
        "test_mcp_bridge",
        "test_mcp_http",
        "test_memory_e2e",
        "test_outbox_quota_e2e",
        "test_request_limits",
        "test_sdk_client",
        "test_sdk_standalone",
        "test_server_e2e",
        "test_ts_client_e2e",
        "test_observability_e2e",
        "test_skills_scope_e2e",
        "test_storage_full",
        "test_symlink_scope_e2e",
        "test_wire_fuzz",
        "test_workers",
    },
}


def episodes_alone(store: Any, path: Path, roots: list[str]) -> Any:
    """A copy of the episode store ``store`` at ``path`` holding only the events of the
    sessions under ``roots``: its bm25() ranks with the statistics of those events alone."""
    from knowledge_server.episodes import EpisodeStore
    from knowledge_server.workspaces import under_sql

    path.mkdir(parents=True)
    store.conn.execute("VACUUM INTO ?", (str(path / "episodes.sqlite"),))
    copy = EpisodeStore(str(path))
    cond, args = under_sql("s.cwd", roots)
    with copy.conn:
        copy.conn.execute(
            "DELETE FROM events WHERE session_id NOT IN"
            f" (SELECT s.session_id FROM sessions s WHERE {cond})",
            args,
        )
    return copy


def write_session_log(path: Path, session_id: str, cwd: Path, text: str) -> None:
    """A one-record generic session log: one user message in ``cwd``."""
    line = {
        "session_id": session_id,
        "seq": 1,
        "time": "2026-10-21T09:00:00Z",
        "cwd": str(cwd),
        "harness": "generic",
        "role": "user",
        "text": text,
    }
    path.write_text(json.dumps(line) + "\n")


@contextmanager
def serving_data_dir(data_dir: Path) -> Iterator[None]:
    """Hold ``data_dir`` as a running `knowledge serve` does (its serve lock, taken by the
    CLI's own function): a recorded address is followed only while a server holds it."""
    from knowledge_server.cli import _hold_data_dir

    fd = _hold_data_dir(data_dir)
    try:
        yield
    finally:
        os.close(fd)


async def ingest_and_derive(address: str, token: str, logs: Path, *, full: bool = True) -> None:
    """Ingest the session logs under ``logs`` and rebuild the derived layer (actors, skill
    uses), as an operator with ``token`` does over gRPC."""
    from knowledge_sdk import AsyncKnowledgeClient

    async with AsyncKnowledgeClient(address, token=token) as kc:
        async for _ in kc.ingest_sessions([str(logs)]):
            pass
        async for _ in kc.rebuild_derived(full=full):
            pass


def tier_of(module: str) -> str:
    return next((tier for tier, names in TIERS.items() if module in names), "unit")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        item.add_marker(getattr(pytest.mark, tier_of(item.path.stem)))


def _shared_data_dir() -> Path:
    env = os.environ.get("KNOWLEDGE_SHARED_DATA")
    if env:
        return Path(env)
    return REPO_ROOT.parent / "shared" / "data"


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The real data folder (session logs, skills, documents); skips when absent."""
    path = _shared_data_dir()
    if not path.is_dir():
        pytest.skip(f"real data folder {path} is absent (set KNOWLEDGE_SHARED_DATA to use another)")
    return path


SEED_DIR = REPO_ROOT.parent / "shared" / "seeds"


@dataclass(frozen=True)
class LicenceVendor:
    """A vendor key pair that signs licences and installs them where a server reads them."""

    private: Path
    public: Path

    def issue(
        self,
        *,
        edition: str = "enterprise",
        features: tuple[str, ...] | None = None,
        not_before: datetime | timedelta = timedelta(days=-1),
        expires_at: datetime | timedelta = timedelta(days=30),
        issued_at: datetime | None = None,
        licence_id: str = "lic-1",
        licensee: str = "Example",
    ) -> bytes:
        """A signed licence. A ``timedelta`` is relative to the moment of issue, not of
        import, so a long test session cannot turn "not yet valid" into valid. Features
        default to doc-graph for every edition but Community."""
        now = datetime.now(UTC)
        if features is None:
            features = (FEATURE_DOC_GRAPH,) if edition != "community" else ()
        return issue_licence(
            self.private,
            licence_id=licence_id,
            licensee=licensee,
            edition=edition,
            features=features,
            not_before=now + not_before if isinstance(not_before, timedelta) else not_before,
            expires_at=now + expires_at if isinstance(expires_at, timedelta) else expires_at,
            issued_at=issued_at,
        )

    def trust(self, ring: Path) -> Path:
        """Put the public key into the key-ring directory ``ring``; returns ``ring``.

        Test keys are development keys: a server trusts ``ring`` only when its
        ``licence_dev_keys_dir`` names it (see :func:`dev_keys`)."""
        ring.mkdir(parents=True, exist_ok=True)
        (ring / self.public.name).write_bytes(self.public.read_bytes())
        return ring

    def install(self, data_dir: Path, licence: bytes | None = None) -> Path:
        """Put this vendor's key into ``data_dir/licence-keys`` and write ``licence`` (by
        default a valid Enterprise one) as the licence file; returns the file's path.
        The server trusts the key only with the development setting (:func:`dev_keys`)."""
        self.trust(data_dir / "licence-keys")
        path = data_dir / "licence.json"
        path.write_bytes(self.issue() if licence is None else licence)
        return path


def dev_keys(data_dir: Path) -> dict[str, str]:
    """Server overrides that trust the development keys of ``data_dir/licence-keys``
    (where :meth:`LicenceVendor.install` puts them)."""
    return {"licence_dev_keys_dir": str(data_dir / "licence-keys")}


def make_vendor(keys_dir: Path, key_id: str = "vendor-1") -> LicenceVendor:
    return LicenceVendor(*generate_keypair(key_id, keys_dir))


@pytest.fixture
def licence_vendor(tmp_path: Path) -> LicenceVendor:
    """A fresh vendor key pair (key id ``vendor-1``) under ``tmp_path/vendor``."""
    return make_vendor(tmp_path / "vendor")


class RunningServer:
    """A real grpc.aio server on a free loopback port, with its app and config."""

    def __init__(self, served, config) -> None:  # type: ignore[no-untyped-def]
        self.served = served
        self.server = served.server
        self.port = served.port
        self.app = served.app
        self.config = config

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def http_url(self) -> str:
        """The HTTP face's base URL (``retrieve_http_listen`` set)."""
        assert self.served.http is not None, "retrieve_http_listen is not set"
        return f"http://127.0.0.1:{self.served.http.port}"


async def start_server(tmp_path: Path, app_factory=None, authenticate=None, **overrides):  # type: ignore[no-untyped-def]
    """Start the real server (create_server on 127.0.0.1:0) with a temp data dir."""
    from knowledge_server.config import load_config
    from knowledge_server.runtime import build_app
    from knowledge_server.server import create_server, start_served

    values = {"listen": "127.0.0.1:0", "data_dir": str(tmp_path / "data"), "bootstrap": False}
    values.update(overrides)
    cfg = load_config(env={}, overrides=values)
    app = app_factory(cfg) if app_factory else build_app(cfg)
    served = await create_server(cfg, app, authenticate=authenticate)
    await start_served(served)
    return RunningServer(served, cfg)


@pytest.fixture
async def running_server(tmp_path: Path):  # type: ignore[no-untyped-def]
    rs = await start_server(tmp_path)
    yield rs
    await rs.server.stop(0)


class ServerThread:
    """The real server on its own event loop in a background thread, for sync tests
    that share one indexed server (module-scoped fixtures)."""

    def __init__(self, tmp_path: Path, **overrides) -> None:  # type: ignore[no-untyped-def]
        import asyncio
        import threading

        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self.error: BaseException | None = None
        self.rs: RunningServer | None = None

        async def main() -> None:
            try:
                self.rs = await start_server(tmp_path, **overrides)
                self._stop = asyncio.Event()
            except BaseException as exc:  # noqa: BLE001 - reported to the test thread
                self.error = exc
                self._ready.set()
                return
            self._ready.set()
            await self._stop.wait()
            if self.rs.served.http is not None:
                await self.rs.served.http.stop(0)
            await self.rs.server.stop(0)
            close = getattr(self.rs.app, "close", None)
            if close:
                close()
            # What asyncio.run does before it closes its loop: the tasks still pending (the
            # knowledge base's worker, cancelled by close) run to their end, rather than
            # being destroyed pending when the loop goes.
            pending = asyncio.all_tasks() - {asyncio.current_task()}
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.wait(pending, timeout=10)

        self._thread = threading.Thread(
            target=lambda: self._loop.run_until_complete(main()), daemon=True
        )
        self._thread.start()
        self._ready.wait(60)
        if self.error:
            raise self.error
        assert self.rs is not None

    @property
    def address(self) -> str:
        assert self.rs is not None
        return self.rs.address

    @property
    def app(self):  # type: ignore[no-untyped-def]
        assert self.rs is not None
        return self.rs.app

    def stop(self) -> None:
        if self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(30)


def serve_process(
    data_dir: Path,
    *extra: str,
    stderr: int = subprocess.PIPE,
    env_extra: dict[str, str] | None = None,
) -> subprocess.Popen[str]:
    """`knowledge serve` as a real process on a free loopback port: no bootstrap, JSON logs,
    no address inherited from the environment. Its first stdout line is `listening on ...`."""
    env = dict(os.environ, KNOWLEDGE_DATA_DIR=str(data_dir), KNOWLEDGE_LOG_FORMAT="json")
    env.pop("KNOWLEDGE_ADDRESS", None)
    env.update(env_extra or {})
    cmd = [
        sys.executable,
        "-m",
        "knowledge_server.cli",
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--no-bootstrap",
        *extra,
    ]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=stderr, text=True)
