"""Assembles a running service from a Config: licence watcher, token store, lanes.

Kept apart from ``server.py`` so tests can build the same app a real ``serve`` uses.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

from knowledge_licensing import (
    KeyRingError,
    LicenceStatus,
    LicenceWatcher,
    load_trusted_keys,
)

from knowledge_server._gen.knowledge.v1 import index_service_pb2
from knowledge_server.app import KnowledgeApp
from knowledge_server.auth import TokenStore
from knowledge_server.auth_model import Principal
from knowledge_server.code.embed import E5Embedder, Embedder, HashingEmbedder, OpenAIEmbedder
from knowledge_server.code.model import IndexOptions
from knowledge_server.config import Config, ConfigError
from knowledge_server.edition import EditionState, LicenceView
from knowledge_server.kb.convert import Converter, ConvertLimits, DoclingServeClient
from knowledge_server.kb.index.factory import IndexSettings, open_index
from knowledge_server.kb.service import KnowledgeBase
from knowledge_server.lanes.code import CodeLane
from knowledge_server.lanes.contract import Lanes
from knowledge_server.lanes.derived import DerivedLane
from knowledge_server.lanes.docgraph import DocGraphLane, llm_settings_from_config
from knowledge_server.lanes.episodes import EpisodesLane
from knowledge_server.logs import get_logger
from knowledge_server.schema import set_mmap_mib

log = get_logger("knowledge.runtime")


class WatchedLicence(LicenceView):
    """Edition state backed by the licence file; re-read on SIGHUP and when it changes.

    Licences verify with the vendor keys shipped in ``knowledge_licensing``; the keys of
    ``licence_dev_keys_dir`` are added only when that development setting is on, and a
    licence verified with one says so in GetStatus and in the log. SIGHUP re-reads the
    key ring as well as the licence. Anything but a valid licence means Community; the
    reason is in GetStatus and in one log line (the licence blob itself is never logged)."""

    def __init__(self, config: Config, clock: Callable[[], datetime] | None = None) -> None:
        self._dev_dir = config.licence_dev_keys_dir
        try:
            self._keys = load_trusted_keys(self._dev_dir)
        except KeyRingError as exc:
            raise ConfigError(f"licence_dev_keys_dir: {exc}") from None
        self._log_dev_keys()
        self.watcher = LicenceWatcher(config.effective_licence_file, self._keys.ring, clock=clock)
        self._log(self.watcher.status, "licence.loaded")
        # Told of every change the server notices (a file replaced, an expiry, SIGHUP):
        # build_app records it in the audit log.
        self.on_change: Callable[[LicenceStatus], None] | None = None

    def _changed(self, status: LicenceStatus) -> None:
        self._log(status, "licence.changed")
        if self.on_change is not None:
            try:
                self.on_change(status)
            except Exception as exc:  # noqa: BLE001 - a failed audit write is logged, the change stands
                log.error("licence.audit_failed", error_type=type(exc).__name__)

    def _log_dev_keys(self) -> None:
        if self._dev_dir is not None:
            log.warning(
                "licence.dev_keys_enabled",
                dev_keys_dir=str(self._dev_dir),
                dev_key_ids=sorted(self._keys.dev_key_ids),
            )

    def _log(self, status: LicenceStatus, event: str) -> None:
        lic = status.licence
        log.info(
            event,
            licence_state=status.state.value,
            edition=status.effective_edition,
            reason=self._keys.describe(status),
            licence_id=lic.licence_id if lic else None,
            development_key=self._keys.dev_key_of(status) is not None,
        )

    def edition(self) -> EditionState:
        st = self.watcher.status
        return EditionState(st.effective_edition, frozenset(st.effective_features), st.state.value)

    def status(self) -> index_service_pb2.EditionStatus:
        st = self.watcher.status
        out = index_service_pb2.EditionStatus(
            edition=st.effective_edition,
            licence_state=st.state.value,
            reason=self._keys.describe(st),
            features=sorted(st.effective_features),
        )
        if st.licence is not None:
            out.licensee = st.licence.licensee
            out.licence_id = st.licence.licence_id
            out.expires_at.FromDatetime(st.licence.expires_at)
        return out

    def poll(self) -> None:
        change = self.watcher.check()
        if change is not None:
            self._changed(change[1])

    def reload(self) -> None:
        """SIGHUP: re-read the key ring, then the licence. A broken development key file
        keeps the previous ring (logged) rather than dropping every development key."""
        keyring = None
        try:
            keys = load_trusted_keys(self._dev_dir)
        except KeyRingError as exc:
            log.error("licence.keys_reload_failed", error=str(exc))
        else:
            self._keys = keys
            keyring = keys.ring
            self._log_dev_keys()
        old, new = self.watcher.reload(keyring)
        if old.state is not new.state or old.licence != new.licence:
            self._changed(new)
        else:
            self._log(new, "licence.reloaded")

    async def watch(self, interval: float = 1.0) -> None:
        while True:
            await asyncio.sleep(interval)
            try:
                self.poll()
            except Exception as exc:  # noqa: BLE001 - the watcher never takes the server down
                log.error("licence.poll_failed", error_type=type(exc).__name__)


def make_embedder(config: Config) -> Embedder:
    """The embedder named in the config; its identity is part of the code revision fingerprint."""
    if config.embedder == "openai":
        return OpenAIEmbedder(
            config.embedder_url,
            config.embedder_model,
            config.embedder_dim,
            api_key_env=config.embedder_key_env or None,
            batch_size=config.embedder_batch,
            # A query is embedded inside the code lane's deadline.
            query_timeout_s=config.lane_timeout_ms / 1000,
        )
    if config.embedder == "e5":
        try:
            return E5Embedder()
        except ImportError:
            raise ConfigError(
                "embedder=e5 needs the optional extra: pip install 'knowledge-service[e5]'"
            ) from None
    return HashingEmbedder()


def own_source_tree() -> str:
    """The service's own source tree: the default workspace, so a first search has real hits."""
    package = Path(__file__).resolve().parent
    checkout = package.parents[1]
    if (checkout / "pyproject.toml").is_file() and (checkout / "proto").is_dir():
        return str(checkout)
    return str(package)


def build_authenticator(config: Config) -> Callable[[str], Principal | None] | None:
    """The token check when authentication is required, else None (local principal)."""
    if not config.auth_required:
        return None
    store = TokenStore(config.tokens_file)
    if not store.list():
        raise ConfigError(
            f"listening on {config.listen} requires authentication, but {config.tokens_file} holds no tokens; "
            "create one with `knowledge token create --id NAME --org ORG --role agent --workspace PATH`"
        )
    return store.authenticate


def kb_index_settings(config: Config) -> IndexSettings:
    """The retrieval index the configuration names; a Milvus token comes from the
    environment variable ``kb_milvus_token_env`` names."""
    token = os.environ.get(config.kb_milvus_token_env, "") if config.kb_milvus_token_env else ""
    return IndexSettings(
        backend=config.kb_index,
        milvus_uri=config.kb_milvus_uri,
        milvus_token=token,
        milvus_collection=config.kb_milvus_collection,
    )


def kb_converter(config: Config) -> Converter:
    """The knowledge base's converters: the local ones, and Docling Serve when
    ``kb_docling_url`` names one (its key from the variable ``kb_docling_key_env`` names).
    They take sources as large as an upload may be (``kb_max_source_mib``): a file the
    upload accepted is not refused by its conversion."""
    limits = ConvertLimits(max_bytes=config.kb_max_source_mib * 1024 * 1024)
    if not config.kb_docling_url:
        return Converter(limits=limits)
    key = os.environ.get(config.kb_docling_key_env, "") if config.kb_docling_key_env else ""
    return Converter(
        docling=DoclingServeClient(
            config.kb_docling_url, api_key=key, timeout_s=config.kb_docling_timeout_s
        ),
        docling_for=frozenset(t.lower() for t in config.kb_docling_for),
        limits=limits,
    )


def build_app(config: Config, *, clock: Callable[[], datetime] | None = None) -> KnowledgeApp:
    """The app a real `serve` runs; ``clock`` lets tests move licence time."""
    licence = WatchedLicence(config, clock)
    config.data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)  # as check_data_dir
    set_mmap_mib(config.sqlite_mmap_mib)  # before any store is opened
    embedder = make_embedder(config)
    code = CodeLane(
        config.data_dir,
        embedder=embedder,
        options=IndexOptions(workers=1, max_file_bytes=config.max_file_bytes),
    )
    # The knowledge base's metadata and queue, and its retrieval index (docs/kb-index.md).
    kb = KnowledgeBase(
        config.data_dir,
        index=open_index(config.data_dir, embedder.dim, kb_index_settings(config)),
        embedder=embedder,
        max_source_bytes=config.kb_max_source_mib * 1024 * 1024,
        converter=kb_converter(config),
    )
    lanes = Lanes(
        episodes=EpisodesLane(
            config.data_dir, session_paths=config.session_paths, workspaces=config.workspaces
        ),
        code=code,
        skills=DerivedLane(
            config.data_dir, skill_roots=config.skill_roots, workspaces=config.workspaces
        ),
        # Not a search lane: the coordinator never queries the document graph. It reads
        # its input documents through the code lane.
        docgraph=DocGraphLane(config.data_dir, llm_settings_from_config(config), code=code),
    )
    app = KnowledgeApp(config, licence=licence, lanes=lanes, kb=kb)

    def audit_licence(status: LicenceStatus) -> None:
        lic = status.licence
        app.audit.append(
            principal="server",
            org=lic.licensee if lic else "",
            operation="licence.change",
            targets=[lic.licence_id] if lic else [],
            input={"state": status.state.value, "edition": status.effective_edition},
            outcome=status.state.value,
        )

    licence.on_change = audit_licence
    return app


async def start_background(app: KnowledgeApp) -> None:
    """Background work of a serving process: licence polling, first-run bootstrap and
    live ingest of the session logs (the first process of a group only, see ``workers``)."""
    tasks = []
    licence = app.licence
    if isinstance(licence, WatchedLicence):
        tasks.append(asyncio.create_task(licence.watch()))
    if app.kb is not None:
        app.kb.worker.start()  # resumes the queue (tasks a dead process left) at start
        if app.kb.index is not None:
            # What retrieval holds in memory is read now, in the background.
            await asyncio.to_thread(app.kb.index.warm)
    if app.config.bootstrap:
        tasks.append(asyncio.create_task(app.bootstrap()))
    # Follow what the server ingests from: its configured session paths, else the standard
    # log folders the start-up ingest read (none without it: a server started with
    # --no-bootstrap and no session paths takes in no logs by itself).
    config = app.config
    if (
        config.watch_sessions
        and (config.session_paths or config.bootstrap)
        and app.lanes.episodes is not None
    ):
        tasks.append(asyncio.create_task(app.lanes.episodes.follow(on_change=app.ingested)))
    try:
        await asyncio.gather(*tasks)
    finally:
        for t in tasks:
            t.cancel()
