"""The memory policy: the seed's TOML keys in the server's configuration file, environment
overrides, ranges; ``reclaim_target`` is the one formula."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner
from knowledge_server.cli import main as cli_main
from knowledge_server.config import ConfigError, load_config
from knowledge_server.memory.policy import MemoryPolicy, reclaim_target

SEED_EXAMPLE = """
[memory.knowledge]
max_facts = 200
max_patterns = 50
max_history = 100
contradiction_threshold = 0.5
recall_facts_limit = 10
rooms_limit = 25
timeline_limit = 25
relations_limit = 40

[memory.lifecycle]
decay_rate = 0.01
low_confidence_threshold = 0.3
stale_days = 30
similarity_threshold = 0.85
reclaim_headroom_pct = 0.25
reclaim_enabled = true
"""


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "knowledge.toml"
    path.write_text(text)
    return path


def test_the_seed_example_loads_as_the_defaults(tmp_path: Path) -> None:
    cfg = load_config(_write(tmp_path, SEED_EXAMPLE), env={})
    assert cfg.memory == MemoryPolicy()
    with_server = _write(tmp_path, '[server]\nlisten = "127.0.0.1:0"\n' + SEED_EXAMPLE)
    assert load_config(with_server, env={}).memory == MemoryPolicy()


def test_file_then_environment(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        "[memory.knowledge]\nmax_facts = 500\n[memory.lifecycle]\nreclaim_enabled = false\n",
    )
    cfg = load_config(path, env={"KNOWLEDGE_MEMORY_MAX_FACTS": "900"})
    assert cfg.memory.max_facts == 900 and cfg.memory.reclaim_enabled is False
    assert load_config(path, env={}).memory.max_facts == 500


@pytest.mark.parametrize(
    ("text", "env", "needle"),
    [
        ("[memory.knowledge]\nmax_facts = 0\n", {}, "memory.max_facts"),
        ("[memory.lifecycle]\nsimilarity_threshold = 1.5\n", {}, "similarity_threshold"),
        ("[memory.lifecycle]\nreclaim_headroom_pct = 0\n", {}, "reclaim_headroom_pct"),
        ("[memory.knowledge]\nmax_factz = 3\n", {}, "unknown key 'max_factz'"),
        ('[memory.knowledge]\nmax_facts = "many"\n', {}, "memory.max_facts"),
        ("[memory.knowledge]\nmax_facts = true\n", {}, "memory.max_facts"),
        ("[memory.other]\nx = 1\n", {}, "unknown table 'other'"),
        ("", {"KNOWLEDGE_MEMORY_RECALL_FACTS_LIMIT": "0"}, "KNOWLEDGE_MEMORY_RECALL_FACTS_LIMIT"),
        ("", {"KNOWLEDGE_MEMORY_RECLAIM_ENABLED": "maybe"}, "reclaim_enabled"),
    ],
)
def test_bad_values_are_refused_naming_the_key(
    tmp_path: Path, text: str, env: dict[str, str], needle: str
) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(_write(tmp_path, text), env=env)
    assert needle in str(info.value)


def test_reclaim_target_is_one_formula() -> None:
    assert reclaim_target(200, 0.25) == 150
    assert reclaim_target(100, 0.01) == 99
    assert reclaim_target(1, 0.25) == 0  # always makes room
    assert reclaim_target(3, 0.1) == 2


def test_cli_policy_validate_reads_a_file(tmp_path: Path) -> None:
    runner = CliRunner()
    good = runner.invoke(
        cli_main, ["memory", "policy", "validate", "--config", str(_write(tmp_path, SEED_EXAMPLE))]
    )
    assert good.exit_code == 0 and "memory.knowledge.max_facts = 200" in good.output
    bad = _write(tmp_path, "[memory.knowledge]\nrooms_limit = 100000\n")
    out = runner.invoke(cli_main, ["memory", "policy", "validate", "--config", str(bad)])
    assert out.exit_code == 1 and "rooms_limit" in out.output and "out of range" in out.output


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ('[memory.knowledge]\nmax_facts = "200"\n', "memory.max_facts"),
        ('[memory.knowledge]\ncontradiction_threshold = "0.5"\n', "contradiction_threshold"),
        ('[memory.lifecycle]\nreclaim_enabled = "yes"\n', "memory.reclaim_enabled"),
        ("[memory.lifecycle]\nreclaim_enabled = 1\n", "memory.reclaim_enabled"),
        ("[memory.lifecycle]\nstale_days = 30.0\n", "memory.stale_days"),
        ("memory = 5\n", "memory"),
        ("[memory]\nknowledge = 3\n", "memory.knowledge"),
    ],
)
def test_a_wrong_type_in_the_file_is_refused_naming_the_key_never_converted(
    tmp_path: Path, text: str, needle: str
) -> None:
    """The policy's types are the file's own: a string, a fraction for an integer or a
    number for a switch is refused naming the key, by the server's configuration and by
    ``memory policy validate --config`` (exit code 2 for input that is no policy, one
    line, no traceback); a value out of range stays the verdict "invalid" (exit code 1)."""
    path = _write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_config(path, env={})
    assert needle in str(info.value)
    out = CliRunner().invoke(cli_main, ["memory", "policy", "validate", "--config", str(path)])
    assert out.exit_code == 2 and isinstance(out.exception, SystemExit), out.output
    assert needle in out.output and "Traceback" not in out.output
    assert len(out.output.strip().splitlines()) == 1
    # the environment is text: it is read as the key's type
    env = {"KNOWLEDGE_MEMORY_MAX_FACTS": "300", "KNOWLEDGE_MEMORY_RECLAIM_ENABLED": "false"}
    policy = load_config(_write(tmp_path, ""), env=env).memory
    assert policy.max_facts == 300 and policy.reclaim_enabled is False
