"""Shared CLI plumbing: connection settings, output, error mapping."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import betterproto2
import click
from knowledge_sdk import ConnectionSettings, KnowledgeClient
from knowledge_sdk import errors as sdk_errors

F = TypeVar("F", bound=Callable[..., Any])

SERVER_FILE = "server.json"


def data_dir(ctx: click.Context) -> Path:
    from knowledge_server.config import default_data_dir

    value = (ctx.obj or {}).get("data_dir")
    return Path(value) if value else default_data_dir()


def record_address(directory: Path, address: str) -> None:
    """Written by `serve`, so other commands find the running service without flags."""
    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory / (SERVER_FILE + ".tmp")
    tmp.write_text(json.dumps({"address": address, "pid": os.getpid()}))
    tmp.replace(directory / SERVER_FILE)


def clear_address(directory: Path) -> None:
    try:
        (directory / SERVER_FILE).unlink()
    except FileNotFoundError:
        pass


def resolve_address(ctx: click.Context) -> str:
    obj = ctx.obj or {}
    if obj.get("address"):
        return str(obj["address"])
    if os.environ.get("KNOWLEDGE_ADDRESS"):
        return os.environ["KNOWLEDGE_ADDRESS"]
    recorded = data_dir(ctx) / SERVER_FILE
    try:
        return str(json.loads(recorded.read_text())["address"])
    except (OSError, ValueError, KeyError):
        return "127.0.0.1:50151"


@contextmanager
def client(ctx: click.Context) -> Iterator[KnowledgeClient]:
    obj = ctx.obj or {}
    settings = ConnectionSettings.from_env(
        address=resolve_address(ctx), token=obj.get("token"), timeout=obj.get("timeout")
    )
    kc = KnowledgeClient(settings=settings)
    try:
        yield kc
    finally:
        kc.close()


def to_json_dict(msg: betterproto2.Message) -> dict[str, Any]:
    """JSON form with proto field names (the seed's names), defaults included."""
    return msg.to_dict(casing=betterproto2.Casing.SNAKE, include_default_values=True)


def emit_json(data: Any) -> None:
    if isinstance(data, betterproto2.Message):
        data = to_json_dict(data)
    click.echo(json.dumps(data, ensure_ascii=False, indent=2, default=str))


def fail(message: str, code: int = 1) -> None:
    click.echo(f"error: {message}", err=True)
    sys.exit(code)


def handle_errors(fn: F) -> F:
    """Turn SDK errors into one clear line on stderr and a non-zero exit code."""
    import functools

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        ctx = click.get_current_context()
        try:
            return fn(*args, **kwargs)
        except sdk_errors.EditionRefused as exc:
            fail(f"{exc.message} [needs edition: {exc.required_edition}]", 3)
        except sdk_errors.Unavailable:
            fail(
                f"cannot reach the service at {resolve_address(ctx)}; is `knowledge serve` running? (--address / KNOWLEDGE_ADDRESS)",
                4,
            )
        except sdk_errors.Unauthenticated as exc:
            fail(f"{exc.message} (set --token or KNOWLEDGE_TOKEN)", 5)
        except sdk_errors.RPCError as exc:
            reason = f" [{exc.reason}]" if exc.reason else ""
            fail(f"{exc.message}{reason}", 1)
        except sdk_errors.KnowledgeError as exc:
            fail(str(exc), 1)
        return None

    return wrapper  # type: ignore[return-value]
