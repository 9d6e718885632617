"""Configuration: precedence, validation with clear errors."""

from __future__ import annotations

from pathlib import Path

import pytest
from knowledge_server.config import ConfigError, load_config


def test_precedence_file_env_flags(tmp_path: Path) -> None:
    cfg_file = tmp_path / "k.toml"
    cfg_file.write_text('[server]\nlisten = "127.0.0.1:7001"\nlane_timeout_ms = 300\n')
    env = {"KNOWLEDGE_LANE_TIMEOUT_MS": "400", "KNOWLEDGE_DATA_DIR": str(tmp_path / "d")}
    cfg = load_config(cfg_file, env=env, overrides={"listen": "127.0.0.1:0"})
    assert cfg.listen == "127.0.0.1:0"
    assert cfg.lane_timeout_ms == 400
    assert cfg.data_dir == (tmp_path / "d").resolve()


@pytest.mark.parametrize(
    ("env", "needle"),
    [
        ({"KNOWLEDGE_LANE_TIMEOUT_MS": "abc"}, "KNOWLEDGE_LANE_TIMEOUT_MS"),
        ({"KNOWLEDGE_LANE_TIMEOUT_MS": "5"}, "lane_timeout_ms"),
        ({"KNOWLEDGE_LISTEN": "nowhere"}, "listen"),
        ({"KNOWLEDGE_AUTH": "maybe"}, "auth"),
        (
            {"KNOWLEDGE_TLS_CERT": "/nonexistent.pem", "KNOWLEDGE_TLS_KEY": "/nonexistent.key"},
            "tls_cert",
        ),
        ({"KNOWLEDGE_AUTH": "off", "KNOWLEDGE_LISTEN": "0.0.0.0:5000"}, "loopback"),
        ({"KNOWLEDGE_SQLITE_MMAP_MIB": "-1"}, "sqlite_mmap_mib"),
        ({"KNOWLEDGE_SQLITE_MMAP_MIB": "lots"}, "KNOWLEDGE_SQLITE_MMAP_MIB"),
    ],
)
def test_invalid_values_name_the_setting(env: dict[str, str], needle: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(env=env)
    assert needle in str(info.value)


def test_unknown_key_in_file_is_refused(tmp_path: Path) -> None:
    f = tmp_path / "k.toml"
    f.write_text("lane_timeout = 3\n")
    with pytest.raises(ConfigError, match="unknown setting"):
        load_config(f, env={})


def test_non_loopback_requires_auth() -> None:
    cfg = load_config(env={}, overrides={"listen": "0.0.0.0:0"})
    assert cfg.auth_required
    assert not load_config(env={}, overrides={"listen": "127.0.0.1:0"}).auth_required


def test_retrieve_http_listen_forms_and_its_authentication() -> None:
    """HTTP-9: the HTTP face of Retrieve / Answer is off unless set; PORT alone is on
    loopback (also from KNOWLEDGE_RETRIEVE_HTTP_LISTEN); reachable from other hosts it
    needs authentication on (the token rules follow `listen`), else it is refused."""
    assert load_config(env={}).retrieve_http_listen == ""
    env = {"KNOWLEDGE_RETRIEVE_HTTP_LISTEN": "8089"}
    assert load_config(env=env).retrieve_http_listen == "127.0.0.1:8089"
    cfg = load_config(env={}, overrides={"retrieve_http_listen": ":0"})
    assert cfg.retrieve_http_listen == "127.0.0.1:0" and not cfg.auth_required
    with pytest.raises(ConfigError, match="retrieve_http_listen: port"):
        load_config(env={}, overrides={"retrieve_http_listen": "127.0.0.1:99999"})
    for auth in ("auto", "off"):
        with pytest.raises(
            ConfigError, match=r"retrieve_http_listen: 0\.0\.0\.0:8089 is reachable"
        ):
            load_config(env={}, overrides={"retrieve_http_listen": "0.0.0.0:8089", "auth": auth})
    public = load_config(env={}, overrides={"retrieve_http_listen": "0.0.0.0:8089", "auth": "on"})
    assert public.auth_required and public.retrieve_http_listen == "0.0.0.0:8089"
    both = load_config(
        env={}, overrides={"listen": "0.0.0.0:0", "retrieve_http_listen": "0.0.0.0:8089"}
    )
    assert both.auth_required


def test_llm_identity_and_transport_bounds_reach_the_llm_port(tmp_path: Path) -> None:
    """A local model can be named (provider, version) and its timeout and retries set; the
    identity is what the document graph fingerprints."""
    from knowledge_server.lanes.docgraph import llm_settings_from_config

    env = {
        "KNOWLEDGE_LLM_URL": "http://127.0.0.1:9",
        "KNOWLEDGE_LLM_MODEL": "qwen",
        "KNOWLEDGE_LLM_PROVIDER": "local",
        "KNOWLEDGE_LLM_MODEL_VERSION": "2.5-q4",
        "KNOWLEDGE_LLM_TIMEOUT_SECONDS": "7.5",
        "KNOWLEDGE_LLM_MAX_RETRIES": "0",
        "KNOWLEDGE_DATA_DIR": str(tmp_path),
    }
    llm = llm_settings_from_config(load_config(env=env))
    assert llm is not None and llm.identity == "local:qwen:2.5-q4"
    assert llm.timeout_seconds == 7.5 and llm.max_retries == 0
    for key, value in (
        ("KNOWLEDGE_LLM_PROVIDER", "cloud"),
        ("KNOWLEDGE_LLM_MAX_RETRIES", "11"),
        ("KNOWLEDGE_LLM_TIMEOUT_SECONDS", "0"),
    ):
        with pytest.raises(ConfigError) as info:
            load_config(env={**env, key: value})
        assert key.removeprefix("KNOWLEDGE_").lower() in str(info.value)


@pytest.mark.parametrize(
    ("setting", "value"),
    [
        ("grace_seconds", "-3"),
        ("grace_seconds", "nan"),
        ("grace_seconds", "inf"),
        ("kb_docling_timeout_s", "nan"),
        ("lane_timeout_ms", "250.9"),
    ],
)
def test_a_number_that_would_misbehave_later_is_refused(
    tmp_path: Path, setting: str, value: str
) -> None:
    """A negative grace cancelled the calls in flight at once when the server stopped;
    ``nan`` passed every range check (every comparison with it is false) and was logged as
    bare NaN; 250.9 became 250 without a word. Each is refused, naming the setting."""
    with pytest.raises(ConfigError, match=setting):
        load_config(
            env={f"KNOWLEDGE_{setting.upper()}": value}, overrides={"data_dir": str(tmp_path)}
        )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[sever]\nlane_timeout_ms = 5\n", "unknown table"),
        ("[server]\n[server.lanes]\nlane_timeout_ms = 5\n", "unknown table"),
        ("lane_timeout_ms = 300\n[server]\nlane_timeout_ms = 400\n", "top level and under"),
    ],
)
def test_a_config_file_never_ignores_a_setting(tmp_path: Path, text: str, message: str) -> None:
    """docs/configuration.md: unknown keys in the file are refused, not ignored. A mistyped
    table, a table inside [server], and top-level keys beside a [server] table were all
    ignored without a word."""
    path = tmp_path / "knowledge.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message):
        load_config(path, env={}, overrides={"data_dir": str(tmp_path)})
    path.write_text("lane_timeout_ms = 300\n[server]\nworkers = 2\n")
    cfg = load_config(path, env={}, overrides={"data_dir": str(tmp_path)})
    assert (cfg.lane_timeout_ms, cfg.workers) == (300, 2)  # read from both places


def test_serve_with_a_data_dir_it_cannot_create_is_one_line(tmp_path: Path) -> None:
    """A data directory that cannot be created (a path under a file) crashed `serve` with
    a traceback (exit 1); it is a configuration error: one line, exit 2."""
    import subprocess
    import sys

    blocker = tmp_path / "afile"
    blocker.write_text("x")
    env = {
        "PATH": "/usr/bin:/bin",
        "KNOWLEDGE_DATA_DIR": str(blocker / "data"),
        "KNOWLEDGE_CONFIG": "",
        "PYTHONPATH": ":".join(sys.path),
    }
    out = subprocess.run(
        [sys.executable, "-m", "knowledge_server.cli", "serve", "--listen", "127.0.0.1:0"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2, out.stderr
    assert "data_dir" in out.stderr and "Traceback" not in out.stderr


def test_serve_on_a_busy_port_creates_no_data_directory(tmp_path: Path) -> None:
    """A refused start changes nothing: `serve` on a port in use checked the data
    directory first, creating it (and its parents) before it refused."""
    import socket
    import subprocess
    import sys

    data = tmp_path / "new" / "data"
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        env = {
            "PATH": "/usr/bin:/bin",
            "KNOWLEDGE_DATA_DIR": str(data),
            "KNOWLEDGE_CONFIG": "",
            "PYTHONPATH": ":".join(sys.path),
        }
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "knowledge_server.cli",
                "serve",
                "--listen",
                f"127.0.0.1:{port}",
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert out.returncode == 2, out.stderr
    assert not (tmp_path / "new").exists()
