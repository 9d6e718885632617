"""Shared CLI plumbing: connection settings, output, error mapping."""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import betterproto2
import click
from knowledge_sdk import ConnectionSettings, KnowledgeClient
from knowledge_sdk import errors as sdk_errors
from knowledge_sdk.client import DEFAULT_ADDRESS
from knowledge_sdk.recorded import recorded_address
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from knowledge_server.config import default_data_dir
from knowledge_server.plain import printable

F = TypeVar("F", bound=Callable[..., Any])

SERVER_FILE = "server.json"


err_console = Console(stderr=True)
out_console = Console()


def code_refs_text(refs: Iterable[Any]) -> list[str]:
    """``code path:start-end`` per code reference, followed by ``in <workspace>`` when they
    come from more than one workspace (two checkouts may hold the same path)."""
    refs = list(refs)
    several = len({r.workspace for r in refs}) > 1
    return [
        f"code {r.path}:{r.start_line}-{r.end_line}" + (f" in {r.workspace}" if several else "")
        for r in refs
    ]


def data_dir(ctx: click.Context) -> Path:
    value = (ctx.obj or {}).get("data_dir")
    return Path(value) if value else default_data_dir()


def record_address(directory: Path, address: str) -> None:
    """Written by `serve`, so other commands find the running service without flags."""
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = directory / (SERVER_FILE + ".tmp")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    # Owner-only whatever the umask: readers follow only a file no other user may write
    # (knowledge_sdk.recorded).
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(json.dumps({"address": address, "pid": os.getpid()}))
    tmp.replace(directory / SERVER_FILE)


def clear_address(directory: Path) -> None:
    """Remove the address `serve` recorded, only when this process recorded it: a server
    that failed to start must not remove the file of another one still serving."""
    path = directory / SERVER_FILE
    try:
        owner = json.loads(path.read_text()).get("pid")
    except (OSError, ValueError, AttributeError):
        return
    if owner != os.getpid():
        return
    try:
        path.unlink()
    except FileNotFoundError:
        pass


def resolve_address(ctx: click.Context) -> str:
    obj = ctx.obj or {}
    if obj.get("address"):
        return str(obj["address"])
    if os.environ.get("KNOWLEDGE_ADDRESS"):
        return os.environ["KNOWLEDGE_ADDRESS"]
    # Only a file this user wrote, naming this machine (knowledge_sdk.recorded): a data
    # directory others may write could otherwise send the commands and the token elsewhere.
    return recorded_address(data_dir(ctx).resolve()) or DEFAULT_ADDRESS


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


def emit_json(data: Any, *, line: bool = False) -> None:
    """``data`` as JSON on stdout; ``line``: one compact line (JSON Lines, for a command
    that prints one document per round, such as ``ingest --watch``)."""
    if isinstance(data, betterproto2.Message):
        data = to_json_dict(data)
    click.echo(json.dumps(data, ensure_ascii=False, indent=None if line else 2, default=str))


def fail(message: str, code: int = 1) -> NoReturn:
    click.echo(f"error: {message}", err=True)
    sys.exit(code)


def _rpc_line(exc: sdk_errors.RPCError) -> str:
    """The service's message, its reason code and, when the error carries one, the trace
    id to quote when asking about the call."""
    reason = f" [{exc.reason}]" if exc.reason else ""
    trace = exc.metadata.get("trace_id", "")
    return f"{exc.message}{reason}" + (f" (trace id {trace})" if trace else "")


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
        except sdk_errors.Unavailable as exc:
            if exc.reason:
                # The service answered: something it needs (e.g. the knowledge base's
                # embedder or reranker) is down or too slow; retrying later may work.
                fail(_rpc_line(exc), 4)
            fail(
                f"cannot reach the service at {resolve_address(ctx)}; is `knowledge serve` running? (--address / KNOWLEDGE_ADDRESS)",
                4,
            )
        except sdk_errors.Unauthenticated as exc:
            fail(f"{exc.message} (set --token or KNOWLEDGE_TOKEN)", 5)
        except sdk_errors.DeadlineExceeded as exc:
            if exc.reason:  # the service answered: its own deadline for the call passed
                fail(_rpc_line(exc), 1)
            fail(
                f"no answer from the service at {resolve_address(ctx)} within the deadline;"
                " is it the service, and is it overloaded? (--timeout, --address)",
                4,
            )
        except sdk_errors.RPCError as exc:
            fail(_rpc_line(exc), 1)
        except sdk_errors.ConnectionConfigError as exc:
            # The connection settings (a TLS file, the token) are the caller's input.
            fail(str(exc), 2)
        except sdk_errors.KnowledgeError as exc:
            fail(str(exc), 1)
        except OSError as exc:
            # A file the command reads (an upload that changed or cannot be read): one
            # line, the file's fault, not a traceback. Other failures (a broken pipe to
            # `head`, a full disk under the output) are not the caller's input: left to
            # click, as before.
            if exc.filename is None or isinstance(exc, BrokenPipeError):
                raise
            fail(f"{exc.filename}: {exc.strerror or exc}", 2)
        return None

    return wrapper  # type: ignore[return-value]


def run_stream(events: Iterable[Any], as_json: bool, title: str, *, lines: bool = False) -> None:
    """Show a progress bar for a streaming operation, then its summary (``lines``: the
    JSON summary on one line, one per round)."""
    summary = None
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.fields[current]}", markup=False),  # a file's path: text
        console=err_console,
        disable=as_json or not err_console.is_terminal,
    ) as bar:
        task = bar.add_task(title, total=None, current="")
        for ev in events:
            if ev.progress is not None:
                p = ev.progress
                bar.update(
                    task,
                    description=f"{title}: {p.phase}",
                    completed=p.done,
                    total=p.total or None,
                    current=printable((p.current or "")[-50:]),
                )
            elif ev.summary is not None:
                summary = ev.summary
    if summary is None:
        fail("the operation ended without a summary")
        return
    if as_json:
        emit_json(summary, line=lines)
        return
    counters = ", ".join(f"{k}={v}" for k, v in sorted(summary.counters.items()))
    stopped = (
        f" (stopped by {summary.stopped_by}; run again to resume)" if summary.stopped_by else ""
    )
    out_console.print(
        f"{title} done in {summary.ms / 1000:.1f}s: rev={summary.index_rev} {counters}{stopped}",
        markup=False,
        highlight=False,
    )
    for p in summary.problems[:20]:  # they name files: printed as text, never as markup
        err_console.print(f"  {p.code}: {printable(p.message)}", markup=False, highlight=False)
    if len(summary.problems) > 20:
        err_console.print(f"  ... and {len(summary.problems) - 20} more")
