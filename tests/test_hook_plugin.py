"""The plugin's hook wiring (``plugins/knowledge/hooks/hooks.json`` and its ``bin/knowledge-hook``
wrapper) run as a harness runs it: the command through a shell, from wherever the plugin folder
is (a checkout's path may hold a space)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT

PLUGIN = REPO_ROOT / "plugins" / "knowledge"
EVENT = '{"hook_event_name": "SessionStart", "cwd": "/w/shop"}'


def _hook_commands() -> list[str]:
    hooks = json.loads((PLUGIN / "hooks" / "hooks.json").read_text())["hooks"]
    return [h["command"] for groups in hooks.values() for group in groups for h in group["hooks"]]


def _installed_hook(bindir: Path) -> None:
    """A stand-in for the installed `knowledge-hook` on PATH: answers with what it read."""
    bindir.mkdir(parents=True, exist_ok=True)
    hook = bindir / "knowledge-hook"
    hook.write_text('#!/bin/sh\necho "installed hook read: $(cat)"\n')
    hook.chmod(0o755)


@pytest.mark.parametrize("substituted", [False, True], ids=["root-from-env", "root-in-text"])
def test_hook_commands_run_from_a_plugin_folder_whose_path_holds_a_space(
    tmp_path: Path, substituted: bool
) -> None:
    # Claude Code and Codex set CLAUDE_PLUGIN_ROOT for the shell; a harness may also put the
    # path into the command text. Either way the command must stay one word.
    root = tmp_path / "My Projects" / "knowledge"
    shutil.copytree(PLUGIN, root)
    _installed_hook(tmp_path / "bin")
    env = {"PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin", "CLAUDE_PLUGIN_ROOT": str(root)}
    commands = _hook_commands()
    assert len(commands) == 2  # SessionStart, UserPromptSubmit
    for command in commands:
        if substituted:
            command = command.replace("${CLAUDE_PLUGIN_ROOT}", str(root))
        done = subprocess.run(
            ["sh", "-c", command], input=EVENT, env=env, capture_output=True, text=True, timeout=60
        )
        assert (done.returncode, done.stdout) == (0, f"installed hook read: {EVENT}\n"), (
            command,
            done.stderr,
        )


def _run_wrapper(wrapper: Path, path: list[Path]) -> subprocess.CompletedProcess[str]:
    env = {"PATH": ":".join([*(str(p) for p in path), "/usr/bin", "/bin"])}
    # (A wrapper that runs itself again never ends: the timeout turns that into a failure.)
    return subprocess.run(
        [str(wrapper)], input=EVENT, env=env, capture_output=True, text=True, timeout=60
    )


def test_the_wrapper_skips_itself_and_its_copies_on_path(tmp_path: Path) -> None:
    """Claude Code puts the plugin's bin/ on PATH: the wrapper's own folder first (and another
    install's copy of the plugin, or a link to the folder) must not make it run itself, or the
    other copy, forever; it runs the installed `knowledge-hook` after them."""
    wrapper = PLUGIN / "bin" / "knowledge-hook"
    copy = tmp_path / "other-install" / "bin"
    shutil.copytree(PLUGIN / "bin", copy)
    link = tmp_path / "linked-bin"
    link.symlink_to(PLUGIN / "bin")
    installed = tmp_path / "installed"
    _installed_hook(installed)
    for path in (
        [wrapper.parent, installed],
        [wrapper.parent, copy, installed],
        [copy, link, installed],
    ):
        done = _run_wrapper(wrapper, path)
        assert (done.returncode, done.stdout) == (0, f"installed hook read: {EVENT}\n"), (
            path,
            done.stderr,
        )


def test_the_wrapper_is_silent_when_only_it_is_on_path(tmp_path: Path) -> None:
    """No installed `knowledge-hook` besides the wrapper (and a copy of it): nothing to run,
    so silence and exit 0, as when the hook is not installed (never a blocked prompt)."""
    wrapper = PLUGIN / "bin" / "knowledge-hook"
    copy = tmp_path / "other-install" / "bin"
    shutil.copytree(PLUGIN / "bin", copy)
    for path in ([wrapper.parent], [wrapper.parent, copy], [tmp_path / "nowhere"]):
        done = _run_wrapper(wrapper, path)
        assert (done.returncode, done.stdout, done.stderr) == (0, "", ""), path


def test_the_wrapper_stops_when_an_earlier_wrapper_runs_it_again(tmp_path: Path) -> None:
    """An earlier release's wrapper (no marker line; it runs whatever `knowledge-hook` comes
    first on PATH) later on PATH, with no installed hook: the two ran each other forever,
    holding every prompt for the hook's timeout. The wrapper now stops when entered again,
    silent with exit 0; an installed hook after both still runs."""
    wrapper = PLUGIN / "bin" / "knowledge-hook"
    old = tmp_path / "old-release" / "bin"
    old.mkdir(parents=True)
    (old / "knowledge-hook").write_text(
        '#!/bin/sh\ncommand -v knowledge-hook >/dev/null 2>&1 || exit 0\nexec knowledge-hook "$@"\n'
    )
    (old / "knowledge-hook").chmod(0o755)
    done = _run_wrapper(wrapper, [wrapper.parent, old])
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")
    installed = tmp_path / "installed"
    _installed_hook(installed)
    done = _run_wrapper(wrapper, [wrapper.parent, old, installed])
    assert (done.returncode, done.stdout) == (0, f"installed hook read: {EVENT}\n"), done.stderr
