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
