"""Server configuration: one TOML file, environment overrides, CLI flags.

Precedence (last wins): built-in defaults < TOML file < ``KNOWLEDGE_*`` environment
variables < explicit CLI flags. Everything is validated once, at start, and a bad
value stops the server with a message that names the setting and the source it
came from.
"""

from __future__ import annotations

import ipaddress
import math
import os
import tempfile
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import platformdirs

from knowledge_server.memory.policy import MemoryPolicy, PolicyError, load_policy

__all__ = [
    "Config",
    "ConfigError",
    "check_workspaces",
    "default_data_dir",
    "load_config",
    "parse_listen",
]

ENV_PREFIX = "KNOWLEDGE_"


class ConfigError(ValueError):
    """A configuration value is invalid; the message names the setting and its source."""


def default_data_dir() -> Path:
    env = os.environ.get("KNOWLEDGE_DATA_DIR")
    if env:
        return Path(env).expanduser()
    return Path(platformdirs.user_data_dir("knowledge-service", appauthor=False))


@dataclass(frozen=True)
class Config:
    """Validated server settings. See docs/configuration.md for each field."""

    listen: str = "127.0.0.1:50151"
    data_dir: Path = field(default_factory=default_data_dir)
    # Workspace roots for the code lane (absolute). Empty = the service's own tree
    # on first run (see knowledge_server.bootstrap).
    workspaces: tuple[str, ...] = ()
    # Session log files/folders; empty = the standard harness locations.
    session_paths: tuple[str, ...] = ()
    # SKILL.md roots; empty = ~/.claude/skills and each workspace's .claude/skills.
    skill_roots: tuple[str, ...] = ()
    # Index the workspaces and ingest logs when the server starts.
    bootstrap: bool = True
    # While serving, follow the session-log folders and ingest appended records (live ingest).
    watch_sessions: bool = True
    licence_file: Path | None = None
    # Development only: a directory of extra vendor public keys (<key_id>.pub) to trust.
    # Off by default; production licences verify with the keys shipped in the package.
    licence_dev_keys_dir: Path | None = None
    # Authentication: "auto" = off on loopback, required elsewhere; "on"; "off" (loopback only).
    auth: str = "auto"
    tls_cert: Path | None = None
    tls_key: Path | None = None
    tls_client_ca: Path | None = None
    lane_timeout_ms: int = 250
    log_format: str = "auto"  # auto | json | console
    log_level: str = "info"
    embedder: str = "hash"  # hash | openai | e5
    embedder_url: str = ""
    embedder_model: str = ""
    embedder_key_env: str = ""
    embedder_dim: int = 0
    # Chunk texts per embeddings call while indexing (embedder=openai).
    embedder_batch: int = 64
    llm_url: str = ""
    llm_model: str = ""
    llm_key_env: str = ""
    llm_key_file: Path | None = None
    # Who runs the model ("openai": any compatible endpoint; "local": a model served here) and
    # its version: provider:model:version enters the document graph's cache keys and
    # fingerprints, so a new local model version rebuilds instead of reusing old answers.
    llm_provider: str = "openai"
    llm_model_version: str = ""
    llm_timeout_seconds: float = 60.0
    llm_max_retries: int = 2
    max_file_bytes: int = 1_048_576
    grace_seconds: float = 5.0
    # Serving processes sharing the listening port (SO_REUSEPORT). The first one runs the
    # background work (bootstrap, licence polling happens in each); more use more cores.
    workers: int = 1
    # Bytes of each store file read through memory mapping, in MiB (0 = plain reads).
    sqlite_mmap_mib: int = 256
    # Outbox packages one principal may have pending (committed Dispatch calls).
    outbox_quota_per_principal: int = 100
    # Largest source file the knowledge base takes in an upload, in MiB.
    kb_max_source_mib: int = 32
    # The knowledge base's retrieval index: "sqlite" (embedded, DATA_DIR/kb_index.sqlite) or
    # "milvus" (kb_milvus_uri: a server or cluster URI; empty = a Milvus Lite file in the
    # data directory). The token, if the server needs one, is read from the environment
    # variable kb_milvus_token_env names, never from this file.
    kb_index: str = "sqlite"
    kb_milvus_uri: str = ""
    kb_milvus_token_env: str = ""
    kb_milvus_collection: str = "kb_chunks"
    # Docling Serve (docs/kb-index.md): its base URL turns it on for the media types the
    # local converters do not read, and for those listed in kb_docling_for (e.g.
    # "application/pdf" for layout analysis); its API key comes from kb_docling_key_env.
    kb_docling_url: str = ""
    kb_docling_key_env: str = ""
    kb_docling_for: tuple[str, ...] = ()
    kb_docling_timeout_s: float = 120.0
    # Retrieve / Answer (docs/kb-retrieve.md): the end-to-end budget of one call, top_k's
    # default and maximum, the longest question, retries of a transient dependency failure.
    retrieve_total_timeout_ms: int = 3000
    retrieve_default_top_k: int = 5
    retrieve_max_top_k: int = 20
    retrieve_max_query_chars: int = 1000
    retrieve_max_retries: int = 2
    # Evidence policy: the reranker's minimum relevance; without a reranker, the minimum
    # share of the question's terms a chunk must contain.
    retrieve_min_rerank_score: float = 0.3
    retrieve_min_term_coverage: float = 0.5
    # The rerank port: "v1" (POST URL/v1/rerank, Cohere/Jina style) or "tei" (POST URL/rerank);
    # empty URL = no reranker. The API key from the variable rerank_key_env names.
    rerank_url: str = ""
    rerank_model: str = ""
    rerank_api: str = "v1"
    rerank_key_env: str = ""
    # The reranker's input limit per document, in characters (longer ones are cut, counted).
    rerank_max_chars: int = 2000
    # What Answer replies when no evidence qualifies (no model call).
    answer_no_evidence_reply: str = "No published knowledge answers this question."
    # The HTTP face of Retrieve / Answer (HOST:PORT, or PORT for 127.0.0.1); empty = off.
    retrieve_http_listen: str = ""
    # The memory policy: [memory.knowledge] and [memory.lifecycle] (docs/memory.md).
    memory: MemoryPolicy = field(default_factory=MemoryPolicy)
    # Prometheus endpoint (HOST:PORT, or PORT for 127.0.0.1); empty = no metrics.
    metrics_listen: str = ""
    # OpenTelemetry traces exported by OTLP/gRPC to this collector URL; empty = no tracing.
    tracing_otlp_endpoint: str = ""
    # Share of calls traced (0..1), when tracing is on; a call's lane spans follow it.
    # A tenth by default: tracing every call costs a search more CPU than the service's
    # telemetry budget allows (docs/configuration.md, "Traces").
    tracing_sample_ratio: float = 0.1

    @property
    def listen_host(self) -> str:
        return parse_listen(self.listen)[0]

    @property
    def is_loopback(self) -> bool:
        return is_loopback_host(self.listen_host)

    @property
    def auth_required(self) -> bool:
        if self.auth == "on":
            return True
        if self.auth == "off":
            return False
        return not self.is_loopback

    @property
    def tokens_file(self) -> Path:
        return self.data_dir / "tokens.json"

    @property
    def effective_licence_file(self) -> Path:
        return self.licence_file or (self.data_dir / "licence.json")


def is_loopback_host(host: str) -> bool:
    """Whether ``host`` (of a listen address) is reachable from this host only."""
    if host in ("localhost",):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def parse_listen(value: str) -> tuple[str, int]:
    """Split ``HOST:PORT`` (``[::1]:PORT`` for IPv6); port 0 picks a free port."""
    host, sep, port = value.rpartition(":")
    if not sep or not host:
        raise ConfigError(f"listen: expected HOST:PORT, got {value!r}")
    try:
        port_n = int(port)
    except ValueError:
        raise ConfigError(f"listen: port must be a number, got {port!r}") from None
    if not 0 <= port_n <= 65535:
        raise ConfigError(f"listen: port {port_n} is out of range 0..65535")
    return host, port_n


_PATH_FIELDS = {
    "data_dir",
    "licence_file",
    "licence_dev_keys_dir",
    "tls_cert",
    "tls_key",
    "tls_client_ca",
    "llm_key_file",
}
_TUPLE_FIELDS = {"workspaces", "session_paths", "skill_roots", "kb_docling_for"}
_INT_FIELDS = {
    "lane_timeout_ms",
    "max_file_bytes",
    "embedder_dim",
    "embedder_batch",
    "workers",
    "sqlite_mmap_mib",
    "outbox_quota_per_principal",
    "llm_max_retries",
    "kb_max_source_mib",
    "retrieve_total_timeout_ms",
    "retrieve_default_top_k",
    "retrieve_max_top_k",
    "retrieve_max_query_chars",
    "retrieve_max_retries",
    "rerank_max_chars",
}
_FLOAT_FIELDS = {
    "grace_seconds",
    "kb_docling_timeout_s",
    "llm_timeout_seconds",
    "tracing_sample_ratio",
    "retrieve_min_rerank_score",
    "retrieve_min_term_coverage",
}
_BOOL_FIELDS = {"bootstrap", "watch_sessions"}
_CHOICES = {
    "auth": ("auto", "on", "off"),
    "log_format": ("auto", "json", "console"),
    "log_level": ("debug", "info", "warning", "error"),
    "embedder": ("hash", "openai", "e5"),
    "llm_provider": ("openai", "local"),
    "kb_index": ("sqlite", "milvus"),
    "rerank_api": ("v1", "tei"),
}


def _coerce(name: str, value: Any, source: str) -> Any:
    try:
        if name in _PATH_FIELDS:
            return None if value in (None, "") else Path(str(value)).expanduser()
        if name in _TUPLE_FIELDS:
            if isinstance(value, str):
                items = [v for v in value.split(os.pathsep) if v]
            elif isinstance(value, (list, tuple)):
                items = [str(v) for v in value]
            else:
                raise TypeError("expected a list of paths")
            return tuple(items)
        if name in _INT_FIELDS:
            if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
                raise TypeError("expected an integer")
            return int(value)
        if name in _FLOAT_FIELDS:
            number = float(value)
            if not math.isfinite(number):
                raise ValueError(f"expected a finite number, not {value!r}")
            return number
        if name in _BOOL_FIELDS:
            if isinstance(value, bool):
                return value
            text = str(value).strip().lower()
            if text in ("1", "true", "yes", "on"):
                return True
            if text in ("0", "false", "no", "off"):
                return False
            raise TypeError("expected true or false")
        if not isinstance(value, str):
            raise TypeError("expected a string")
        return value
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{name} (from {source}): {exc}") from None


# Integer settings with an inclusive range.
_INT_RANGES = {
    "lane_timeout_ms": (10, 60_000),
    "workers": (1, 64),
    "embedder_batch": (1, 2048),
    "sqlite_mmap_mib": (0, 1_048_576),
    "outbox_quota_per_principal": (1, 1_000_000),
    "llm_max_retries": (0, 10),
    "kb_max_source_mib": (1, 4096),
    "retrieve_total_timeout_ms": (50, 120_000),
    "retrieve_default_top_k": (1, 100),
    "retrieve_max_top_k": (1, 100),
    "retrieve_max_query_chars": (1, 4000),
    "retrieve_max_retries": (0, 10),
    "rerank_max_chars": (64, 1_000_000),
}


# Number settings with an inclusive range (a negative grace would cancel the calls in
# flight at once when the server stops).
_FLOAT_RANGES = {"grace_seconds": (0, 3600)}


def _validate_llm(cfg: Config) -> None:
    if not 0.1 <= cfg.llm_timeout_seconds <= 3600:
        raise ConfigError(
            f"llm_timeout_seconds: {cfg.llm_timeout_seconds} is out of range 0.1..3600"
        )
    if len(cfg.llm_model_version) > 200:
        raise ConfigError("llm_model_version: at most 200 characters")


def _validate_kb(cfg: Config) -> None:
    if cfg.kb_docling_url and not cfg.kb_docling_url.startswith(("http://", "https://")):
        raise ConfigError(f"kb_docling_url: {cfg.kb_docling_url!r} is not an http(s) URL")
    if not 0 < cfg.kb_docling_timeout_s <= 86_400:
        raise ConfigError(
            f"kb_docling_timeout_s: {cfg.kb_docling_timeout_s} is out of range (0, 86400]"
        )
    if cfg.retrieve_default_top_k > cfg.retrieve_max_top_k:
        raise ConfigError(
            f"retrieve_default_top_k: {cfg.retrieve_default_top_k} is above "
            f"retrieve_max_top_k ({cfg.retrieve_max_top_k})"
        )
    for name in ("retrieve_min_rerank_score", "retrieve_min_term_coverage"):
        value = getattr(cfg, name)
        if not 0.0 <= value <= 1.0:
            raise ConfigError(f"{name}: {value} is out of range 0..1")
    if cfg.rerank_url and not cfg.rerank_url.startswith(("http://", "https://")):
        raise ConfigError(f"rerank_url: {cfg.rerank_url!r} is not an http(s) URL")
    if cfg.rerank_url and not cfg.rerank_model and cfg.rerank_api == "v1":
        raise ConfigError("rerank_model: required with rerank_url when rerank_api is v1")
    if not cfg.answer_no_evidence_reply.strip():
        raise ConfigError("answer_no_evidence_reply: must not be empty")


def _validate(cfg: Config) -> Config:
    parse_listen(cfg.listen)
    for name, choices in _CHOICES.items():
        value = getattr(cfg, name)
        if value not in choices:
            raise ConfigError(f"{name}: {value!r} is not one of {', '.join(choices)}")
    _validate_llm(cfg)
    _validate_kb(cfg)
    if cfg.max_file_bytes < 1024:
        raise ConfigError("max_file_bytes: must be at least 1024")
    for name, (low, high) in (_INT_RANGES | _FLOAT_RANGES).items():
        value = getattr(cfg, name)
        if not low <= value <= high:
            raise ConfigError(f"{name}: {value} is out of range {low}..{high}")
    workspaces = []
    for ws in cfg.workspaces:
        p = Path(ws).expanduser()
        if not p.is_absolute():
            p = p.resolve()
        workspaces.append(str(p.resolve()))
    cfg = replace(
        cfg,
        workspaces=tuple(dict.fromkeys(workspaces)),
        data_dir=cfg.data_dir.expanduser().resolve(),
    )
    if bool(cfg.tls_cert) != bool(cfg.tls_key):
        raise ConfigError("tls_cert and tls_key must be given together")
    for name in ("tls_cert", "tls_key", "tls_client_ca"):
        p = getattr(cfg, name)
        if p is not None and not p.is_file():
            raise ConfigError(f"{name}: file {p} does not exist")
    if cfg.tls_client_ca and not cfg.tls_cert:
        raise ConfigError("tls_client_ca (mutual TLS) needs tls_cert and tls_key")
    if cfg.auth == "off" and not cfg.is_loopback:
        raise ConfigError(
            f"auth=off is only allowed on a loopback address; {cfg.listen} is reachable from other hosts"
        )
    cfg = _telemetry(cfg)
    http = cfg.retrieve_http_listen
    if http and not cfg.auth_required and not is_loopback_host(parse_listen(http)[0]):
        # Authentication follows `listen`: off there, the HTTP face would serve anyone
        # who reaches it as the local operator.
        raise ConfigError(
            f"retrieve_http_listen: {http} is reachable from other hosts, but authentication "
            f'is off (auth={cfg.auth}, listen {cfg.listen}); set auth = "on" or serve the '
            "HTTP face on a loopback address"
        )
    if cfg.embedder == "openai" and not (
        cfg.embedder_url and cfg.embedder_model and cfg.embedder_dim > 0
    ):
        raise ConfigError("embedder=openai needs embedder_url, embedder_model and embedder_dim")
    return cfg


def _telemetry(cfg: Config) -> Config:
    """``metrics_listen``: ``HOST:PORT`` as given, ``PORT`` or ``:PORT`` on loopback;
    ``tracing_otlp_endpoint``: an http(s) URL."""
    if not 0.0 <= cfg.tracing_sample_ratio <= 1.0:
        raise ConfigError(f"tracing_sample_ratio: {cfg.tracing_sample_ratio} is out of range 0..1")
    endpoint = cfg.tracing_otlp_endpoint
    if endpoint and not endpoint.startswith(("http://", "https://")):
        raise ConfigError(
            "tracing_otlp_endpoint: expected the http:// or https:// URL of an OTLP/gRPC "
            f"collector, got {endpoint!r}"
        )
    return replace(
        cfg,
        metrics_listen=_loopback_listen("metrics_listen", cfg.metrics_listen),
        retrieve_http_listen=_loopback_listen("retrieve_http_listen", cfg.retrieve_http_listen),
    )


def _loopback_listen(name: str, value: str) -> str:
    """An optional listen address: ``HOST:PORT`` as given, ``PORT`` or ``:PORT`` on
    loopback, empty = off."""
    text = value.strip()
    if not text:
        return ""
    if text.isdigit():
        text = f"127.0.0.1:{text}"
    elif text.startswith(":"):
        text = f"127.0.0.1{text}"
    try:
        parse_listen(text)
    except ConfigError as exc:
        raise ConfigError(f"{name}: {str(exc).removeprefix('listen: ')}") from None
    return text


def check_workspaces(cfg: Config) -> None:
    """Raise ConfigError naming the first configured workspace that is not a directory
    (``serve`` checks this at start: the index of such a root could only fail later)."""
    for ws in cfg.workspaces:
        p = Path(ws)
        if not p.exists():
            raise ConfigError(f"workspaces: {ws} does not exist")
        if not p.is_dir():
            raise ConfigError(f"workspaces: {ws} is not a directory")


def check_data_dir(cfg: Config) -> None:
    """Raise ConfigError when the data directory cannot be created or written (``serve``
    checks this at start, for a one-line error instead of a traceback)."""
    try:
        # Owner-only, whatever the umask: clients follow the address recorded here only
        # from a folder no other user may write (knowledge_sdk.recorded).
        cfg.data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=cfg.data_dir, prefix=".write-check-"):
            pass
    except OSError as exc:
        raise ConfigError(
            f"data_dir: {cfg.data_dir} cannot be created or written ({exc.strerror or exc})"
        ) from None


# Settings that no longer exist, with what replaced them: naming them is an error rather
# than silently ignored, since the old meaning (trust these keys) no longer holds.
_REMOVED = {
    "licence_keys_dir": "vendor keys ship with the package; for development keys set "
    "licence_dev_keys_dir (env KNOWLEDGE_LICENCE_DEV_KEYS_DIR)",
}


def _refuse_removed(key: str, source: str) -> None:
    if key in _REMOVED:
        raise ConfigError(f"{key} (from {source}) is no longer supported: {_REMOVED[key]}")


def load_config(
    path: Path | None = None,
    *,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> Config:
    """Build a validated Config from a TOML file, the environment and CLI overrides."""
    env = os.environ if env is None else env
    names = {f.name for f in fields(Config)} - {"memory"}
    values: dict[str, Any] = {}
    memory_tables: Any = None
    if path is None and env.get("KNOWLEDGE_CONFIG"):
        path = Path(env["KNOWLEDGE_CONFIG"])
    if path is not None:
        try:
            raw = tomllib.loads(Path(path).read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ConfigError(f"config file {path} does not exist") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config file {path}: {exc}") from None
        table = _server_table(raw, path)
        memory_tables = raw.get("memory")
        for key, value in table.items():
            _refuse_removed(key, f"config file {path}")
            if key not in names:
                raise ConfigError(f"config file {path}: unknown setting {key!r}")
            values[key] = _coerce(key, value, f"config file {path}")
    for name in _REMOVED:
        env_name = ENV_PREFIX + name.upper()
        if env.get(env_name):
            _refuse_removed(name, f"environment {env_name}")
    for name in names:
        env_name = ENV_PREFIX + name.upper()
        if env_name in env and env[env_name] != "":
            values[name] = _coerce(name, env[env_name], f"environment {env_name}")
    for key, value in (overrides or {}).items():
        if value is None:
            continue
        if key not in names:
            raise ConfigError(f"unknown setting {key!r}")
        values[key] = _coerce(key, value, "command line")
    values["memory"] = _memory_policy(memory_tables, env, path)
    return _validate(Config(**values))


def _server_table(raw: Mapping[str, Any], path: Path) -> dict[str, Any]:
    """The server's settings of a TOML file: its top-level keys and those of ``[server]``
    together. A table other than ``[server]`` and ``[memory]`` (a typo such as
    ``[sever]``), a table inside ``[server]``, or a key given at both places is refused:
    a setting the file holds is never silently ignored."""
    out: dict[str, Any] = {}
    for key, value in raw.items():
        if isinstance(value, dict):
            if key not in ("server", "memory"):
                raise ConfigError(f"config file {path}: unknown table [{key}]")
            continue
        out[key] = value
    server = raw.get("server", {})
    if not isinstance(server, dict):
        raise ConfigError(f"config file {path}: server must be a table")
    for key, value in server.items():
        if isinstance(value, dict):
            raise ConfigError(f"config file {path}: unknown table [server.{key}]")
        if key in out:
            raise ConfigError(
                f"config file {path}: {key!r} is given at the top level and under [server]"
            )
        out[key] = value
    return out


def _memory_policy(tables: Any, env: Mapping[str, str], path: Path | None) -> MemoryPolicy:
    """The ``[memory]`` tables of the file with ``KNOWLEDGE_MEMORY_*`` overrides."""
    try:
        return load_policy(tables, env, f"config file {path}" if path else "defaults")
    except PolicyError as exc:
        raise ConfigError(str(exc)) from None
