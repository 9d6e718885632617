"""`knowledge audit verify|tail|export|hash`: the audit log of the data directory, read on
the server's machine (docs/audit.md)."""

from __future__ import annotations

import json
from typing import TextIO

import click

from knowledge_server.audit import AUDIT_FILE, AuditLog
from knowledge_server.cli.common import data_dir, fail


def _open(ctx: click.Context) -> AuditLog:
    path = data_dir(ctx) / AUDIT_FILE
    if not path.is_file():
        fail(f"no audit log at {path}")
    return AuditLog(path)


@click.group("audit")
def audit() -> None:
    """Verify, read and export the audit log (<data dir>/audit.sqlite)."""


def _head(value: str | None) -> tuple[int, str] | None:
    if not value:
        return None
    seq, sep, digest = value.partition(":")
    if not sep or not seq.isdigit() or len(digest) != 64:
        raise click.BadParameter("expected SEQ:HASH (the head `verify` printed)")
    return int(seq), digest.lower()


@audit.command("verify")
@click.option(
    "--expect",
    help="A head recorded earlier (SEQ:HASH): also detects events removed from the end.",
)
@click.pass_context
def verify(ctx: click.Context, expect: str | None) -> None:
    """Walk the hash chain; exit 1 and name the first event that does not fit."""
    head = _head(expect)
    log = _open(ctx)
    try:
        result = log.verify(expect=head)
        pending = log.pending()
    finally:
        log.close()
    if not result.ok:
        fail(
            f"audit log broken at seq {result.first_bad_seq}: {result.reason}"
            f" ({result.checked} events read)"
        )
    waiting = f"; {pending} pending (they join the chain at the next write)" if pending else ""
    click.echo(f"ok: {result.checked} events; head {result.head_seq}:{result.head_hash}{waiting}")


@audit.command("tail")
@click.option("-n", "count", default=20, show_default=True, help="Newest events to print.")
@click.pass_context
def tail(ctx: click.Context, count: int) -> None:
    """The newest events, oldest first, one JSON object per line."""
    log = _open(ctx)
    try:
        for event in log.tail(count):
            click.echo(event.to_json())
    finally:
        log.close()


@audit.command("export")
@click.option("--after", default=0, show_default=True, help="Only events after this seq.")
@click.pass_context
def export(ctx: click.Context, after: int) -> None:
    """Every event (after --after) as JSON lines, in chain order."""
    log = _open(ctx)
    try:
        for event in log.events(after_seq=after):
            click.echo(event.to_json())
    finally:
        log.close()


@audit.command("hash")
@click.argument("input_file", type=click.File("r", encoding="utf-8"))
@click.pass_context
def hash_input(ctx: click.Context, input_file: TextIO) -> None:
    """Print the input_hash an event has for the JSON input in INPUT_FILE (- for standard
    input): the request as the service received it, with proto field names. Needs this
    data directory's key (audit.key); a log exported elsewhere cannot be checked."""
    try:
        value = json.load(input_file)
    except ValueError as exc:
        fail(f"{input_file.name}: not JSON ({exc})")
    log = _open(ctx)
    try:
        click.echo(log.input_hash(value))
    finally:
        log.close()
