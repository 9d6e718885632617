"""`knowledge license install`: verify a licence file and put it where `knowledge serve` reads it.

Lives with the server's CLI (not in knowledge_licensing) because the destination and the
trusted keys come from the server's configuration: DATA_DIR/licence.json (or
``licence_file``), verified with the shipped vendor keys plus, only when configured, the
development keys of ``licence_dev_keys_dir``.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import click
from knowledge_licensing import (
    MAX_LICENCE_BYTES,
    KeyRingError,
    LicenceState,
    install_licence,
    load_trusted_keys,
)

from knowledge_server.audit import cli_recorder, input_hash
from knowledge_server.cli.common import fail
from knowledge_server.config import ConfigError, load_config

# Exit codes, as in the other `license` commands: 1 the licence is not valid, 2 environment.
EXIT_INVALID = 1
EXIT_ERROR = 2


@click.command("install")
@click.argument("licence_file", type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "--config",
    "config_file",
    type=click.Path(dir_okay=False, path_type=Path),
    envvar="KNOWLEDGE_CONFIG",
    help="TOML configuration file of the server (for data_dir, licence_file and "
    "licence_dev_keys_dir). Env: KNOWLEDGE_CONFIG.",
)
@click.pass_context
def install_command(ctx: click.Context, licence_file: Path, config_file: Path | None) -> None:
    """Verify LICENCE_FILE and install it as the server's licence.

    The file must verify now with the vendor keys shipped with the service (or a
    development key when licence_dev_keys_dir is set); anything else is refused and
    nothing is written. It is placed atomically at DATA_DIR/licence.json (or the
    configured licence_file); a running server picks it up within a second.
    """
    root = ctx.find_root().obj or {}
    try:
        cfg = load_config(config_file, overrides={"data_dir": root.get("data_dir")})
        keys = load_trusted_keys(cfg.licence_dev_keys_dir)
    except (ConfigError, KeyRingError) as exc:
        fail(f"configuration: {exc}", EXIT_ERROR)
        return
    try:
        with open(licence_file, "rb") as handle:
            data = handle.read(MAX_LICENCE_BYTES + 1)
    except OSError as exc:
        fail(f"cannot read {licence_file}: {exc.strerror or exc}", EXIT_ERROR)
        return
    dest = cfg.effective_licence_file
    with contextlib.ExitStack() as stack:
        try:
            # Opened before the licence file changes: a log that cannot be written stops
            # the install instead of leaving it unrecorded.
            record = stack.enter_context(cli_recorder(cfg.data_dir))
        except Exception as exc:  # noqa: BLE001 - any failure of the log is told the same way
            fail(
                f"the audit log cannot be written ({type(exc).__name__}): nothing was installed",
                EXIT_ERROR,
            )
            return
        try:
            status = install_licence(data, dest, keys.ring)
        except OSError as exc:
            fail(f"cannot write {dest}: {exc.strerror or exc}", EXIT_ERROR)
            return
        if status.state is not LicenceState.VALID or status.licence is None:
            record(
                "licence.install",
                org="local",
                input={"sha256": input_hash(data.hex())},
                outcome=f"refused:{status.state.name}",
            )
            fail(
                f"refused {licence_file}: the licence is not valid "
                f"({status.state.name}: {keys.describe(status)}); nothing was installed. "
                "Licence files come from the vendor; see docs/licensing.md",
                EXIT_INVALID,
            )
            return
        lic = status.licence
        record(
            "licence.install",
            org=lic.licensee,
            targets=[lic.licence_id],
            input={"licence_id": lic.licence_id, "edition": lic.edition},
        )
    click.echo(f"installed {lic.licence_id} ({keys.describe(status)}) -> {dest}")
    click.echo("a running server picks it up within a second (or on SIGHUP)")
