"""The outbox: one ``knowledge.handoff/v1`` package per recorded assignment.

``DATA_DIR/outbox/<assignment_id>.json`` holds the package as JSON with proto field
names. Files appear atomically (written to a temporary name in the same folder, then
linked into place) and are written once: the first recorded package for an
assignment stays, so a repeated or concurrent commit never changes what the lead
harness may already have reviewed. Nothing here executes a package.

A committed package also records who committed it (``Committer``), in top-level keys that
are not fields of the package message (readers of the package ignore them):
``committed_by`` (the principal id), ``committed_org`` (its organisation) and
``committed_scope`` (a digest of the workspaces its plan could see). The per-principal
outbox quota counts the pending packages by id and organisation; a repeated commit is
answered with the recorded package only when all three are the caller's.
"""

from __future__ import annotations

import hashlib
import json
import os
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from google.protobuf import json_format

from knowledge_server._gen.knowledge.v1 import dispatch_pb2

OUTBOX_DIR = "outbox"
SUFFIX = ".json"
COMMITTED_BY = "committed_by"
COMMITTED_ORG = "committed_org"
COMMITTED_SCOPE = "committed_scope"


@dataclass(frozen=True)
class Committer:
    """Who commits a package: the principal's id and organisation (two tokens may share an
    id across organisations), and a digest of the workspaces its plan could see ("*" for
    every workspace)."""

    id: str
    org: str = ""
    scope: str = "*"

    @classmethod
    def of(cls, principal_id: str, org: str, workspaces: Sequence[str] | None) -> Committer:
        if workspaces is None:
            return cls(principal_id, org, "*")
        seen = "\n".join(sorted(set(workspaces))).encode()
        return cls(principal_id, org, hashlib.sha256(seen).hexdigest()[:32])

    def keys(self) -> dict[str, str]:
        return {COMMITTED_BY: self.id, COMMITTED_ORG: self.org, COMMITTED_SCOPE: self.scope}

    def same_principal(self, data: dict[str, Any]) -> bool:
        return data.get(COMMITTED_BY) == self.id and data.get(COMMITTED_ORG, "") == self.org


def outbox_dir(data_dir: Path | str) -> Path:
    return Path(data_dir) / OUTBOX_DIR


def package_path(directory: Path, assignment_id: str) -> Path:
    if (
        not assignment_id
        or "/" in assignment_id
        or "\x00" in assignment_id
        or assignment_id.startswith(".")
    ):
        raise ValueError("not an assignment id")
    return directory / f"{assignment_id}{SUFFIX}"


def package_json(package: dispatch_pb2.HandoffPackage) -> str:
    """Stable text of a package: same package, same bytes."""
    data = json_format.MessageToDict(package, preserving_proto_field_name=True)
    return json.dumps(data, ensure_ascii=False, sort_keys=True, indent=2) + "\n"


def parse_package(text: str) -> dispatch_pb2.HandoffPackage:
    package = dispatch_pb2.HandoffPackage()
    json_format.ParseDict(json.loads(text), package, ignore_unknown_fields=True)
    return package


def _file_text(package: dispatch_pb2.HandoffPackage, committer: Committer | None) -> str:
    if committer is None:
        return package_json(package)
    data = json_format.MessageToDict(package, preserving_proto_field_name=True)
    data.update(committer.keys())
    return json.dumps(data, ensure_ascii=False, sort_keys=True, indent=2) + "\n"


def is_recorded(directory: Path, assignment_id: str) -> bool:
    """A readable package is already recorded for this assignment."""
    return _read(package_path(directory, assignment_id)) is not None


def committer_of(path: Path) -> Committer | None:
    """Who committed the package recorded at ``path`` (None when unknown or unreadable)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    who, org, scope = (data.get(k) for k in (COMMITTED_BY, COMMITTED_ORG, COMMITTED_SCOPE))
    if not (isinstance(who, str) and isinstance(org, str) and isinstance(scope, str)):
        return None  # a package recorded before all three were (or by hand): nobody's
    return Committer(who, org, scope)


def pending_for(directory: Path, committer: Committer) -> int:
    """How many packages in the outbox were committed by the committer's principal (its id
    in its organisation, whatever the workspaces)."""
    if not directory.is_dir():
        return 0
    n = 0
    for path in directory.iterdir():
        if path.name.startswith(".") or not path.name.endswith(SUFFIX):
            continue
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(data, dict) and committer.same_principal(data):
            n += 1
    return n


def write_once(
    directory: Path,
    assignment_id: str,
    package: dispatch_pb2.HandoffPackage,
    *,
    committer: Committer | None = None,
) -> tuple[Path, dispatch_pb2.HandoffPackage]:
    """Write the package unless one is already recorded; return its path and the recorded package.

    The temporary file is fsynced and then hard-linked to the final name, which fails
    when the name exists: of concurrent writers exactly one wins and nobody ever sees a
    partial file. A recorded file that cannot be parsed (damaged by hand) is replaced.
    """
    directory.mkdir(parents=True, exist_ok=True)
    final = package_path(directory, assignment_id)
    existing = _read(final)
    if existing is not None:
        return final, existing
    text = _file_text(package, committer)
    tmp = directory / f".{assignment_id}.{uuid.uuid4().hex}.tmp"
    try:
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        try:
            os.link(tmp, final)
        except FileExistsError:
            existing = _read(final)
            if existing is not None:
                return final, existing
            os.replace(tmp, final)
        except OSError:
            # A filesystem without hard links: rename is still atomic.
            os.replace(tmp, final)
    finally:
        try:
            tmp.unlink()
        except FileNotFoundError:
            pass
    _fsync_dir(directory)
    return final, package


def _read(path: Path) -> dispatch_pb2.HandoffPackage | None:
    try:
        return parse_package(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, json_format.ParseError):
        return None


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@dataclass(frozen=True)
class OutboxEntry:
    assignment_id: str
    path: Path
    modified: float
    package: dispatch_pb2.HandoffPackage | None
    problem: str = ""

    def summary(self) -> dict[str, Any]:
        p = self.package
        return {
            "assignment_id": self.assignment_id,
            "path": str(self.path),
            "modified": self.modified,
            "actor_id": p.target.actor_id if p is not None else "",
            "actor_name": p.target.name if p is not None else "",
            "mode": p.target.dispatch.mode if p is not None else "",
            "task": p.task.text if p is not None else "",
            "tool_calls": len(p.tool_calls) if p is not None else 0,
            "execution": p.execution if p is not None else "",
            "problem": self.problem,
        }


def list_entries(directory: Path) -> list[OutboxEntry]:
    """Every package in the outbox, oldest first (temporary files are skipped)."""
    if not directory.is_dir():
        return []
    out = []
    for path in directory.iterdir():
        if path.name.startswith(".") or not path.name.endswith(SUFFIX) or not path.is_file():
            continue
        out.append(read_entry(path))
    out.sort(key=lambda e: (e.modified, e.assignment_id))
    return out


def read_entry(path: Path) -> OutboxEntry:
    assignment_id = path.name[: -len(SUFFIX)]
    try:
        modified = path.stat().st_mtime
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        return OutboxEntry(assignment_id, path, 0.0, None, f"unreadable ({type(exc).__name__})")
    try:
        return OutboxEntry(assignment_id, path, modified, parse_package(text))
    except (ValueError, json_format.ParseError):
        return OutboxEntry(
            assignment_id, path, modified, None, "not a knowledge.handoff/v1 package"
        )


def find_entry(directory: Path, assignment_id: str) -> OutboxEntry | None:
    try:
        path = package_path(directory, assignment_id)
    except ValueError:
        return None
    if not path.is_file():
        return None
    return read_entry(path)
