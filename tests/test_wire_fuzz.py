"""Wire fuzzing over a real server: every method of every knowledge.v1 service receives
random well-formed messages (built from the descriptors), mutated serialized messages (bit
flips, truncation, appended garbage, stray fields of random number and wire type) and raw
random bytes, without a token, with a wrong one, and with scoped agent and operator tokens.

The only outcomes allowed are OK and the documented refusals:

- INVALID_ARGUMENT: the bytes are not the request message, or a field breaks its rules;
- UNAUTHENTICATED: no token, a wrong one, or two;
- PERMISSION_DENIED: the role or the workspace scope does not allow the call;
- NOT_FOUND: an id that names nothing;
- FAILED_PRECONDITION: the edition, the licence or the state of an index refuses the call;
- UNIMPLEMENTED: a declared operation this server does not build;
- RESOURCE_EXHAUSTED: a request or response over a size limit, or the server is busy;
- DEADLINE_EXCEEDED: only because every call here carries a deadline.

Never INTERNAL or UNKNOWN, and no details that leak an exception name, a Python type name
or a message type name. The server stays up: health is SERVING at the end and a normal
search still answers.

The seed is ``KNOWLEDGE_WIRE_FUZZ_SEED`` (else the CI run id, else a fixed one) and is
printed; ``KNOWLEDGE_WIRE_FUZZ_REQUESTS`` sets the number of requests (default 10,000).
Operator streams stay cheap: the server's workspaces, session logs and skill roots are tiny
temporary folders, and the operator token is scoped to them, so no path a mutation produces
can make the server walk anything else."""

from __future__ import annotations

import asyncio
import os
import random
import re
import struct
import time
from dataclasses import dataclass
from pathlib import Path

import grpc
from google.protobuf import descriptor
from google.protobuf.message import Message
from google.protobuf.message_factory import GetMessageClass
from google.rpc import error_details_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_status import rpc_status
from knowledge_server._gen.knowledge.v1 import (
    docgraph_pb2,
    index_service_pb2,
    knowledge_service_pb2,
    search_pb2,
)
from knowledge_server.auth import TokenStore

from tests.conftest import ServerThread, make_vendor

FILES = (docgraph_pb2, index_service_pb2, knowledge_service_pb2)

ALLOWED = {
    grpc.StatusCode.OK,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.UNAUTHENTICATED,
    grpc.StatusCode.PERMISSION_DENIED,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.UNIMPLEMENTED,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.DEADLINE_EXCEEDED,
}
DEADLINE_S = 20.0
CHANNELS = 4
IN_FLIGHT = 8

# Words that only internals put into a message: exception and Python type names, reprs,
# tracebacks, protobuf's own parse errors.
LEAK = re.compile(
    r"Traceback|[A-Z][A-Za-z]*(?:Error|Exception)\b|\bNoneType\b|<class |object at 0x"
    r"|\bbuiltins\.|google\.protobuf|File \"|Error parsing|\b(?:str|int|bytes|dict|list)\(\)"
)


def _seed() -> int:
    for name in ("KNOWLEDGE_WIRE_FUZZ_SEED", "GITHUB_RUN_ID", "CI_PIPELINE_ID"):
        value = os.environ.get(name, "")
        if value.isdigit():
            return int(value)
    return 20


def _count() -> int:
    return int(os.environ.get("KNOWLEDGE_WIRE_FUZZ_REQUESTS", "10000"))


@dataclass(frozen=True)
class Method:
    path: str
    streaming: bool
    request: type[Message]
    response: type[Message]


def _methods() -> list[Method]:
    out = []
    for module in FILES:
        for service in module.DESCRIPTOR.services_by_name.values():
            for m in service.methods:
                out.append(
                    Method(
                        f"/{service.full_name}/{m.name}",
                        m.server_streaming,
                        GetMessageClass(m.input_type),
                        GetMessageClass(m.output_type),
                    )
                )
    return out


def _type_names() -> set[str]:
    """Full and CamelCase short names of every knowledge.v1 message and enum."""
    names: set[str] = set()

    def walk(messages, enums) -> None:  # type: ignore[no-untyped-def]
        for d in (*messages, *enums):
            names.add(d.full_name)
            if sum(c.isupper() for c in d.name) >= 2:
                names.add(d.name)
        for m in messages:
            walk(m.nested_types, m.enum_types)

    for module in FILES:
        fd = module.DESCRIPTOR
        for dep in (fd, *fd.dependencies):
            if dep.package == "knowledge.v1":
                walk(dep.message_types_by_name.values(), dep.enum_types_by_name.values())
    return names


class Generator:
    """Random requests from a seed: messages built from descriptors, their mutations, and
    raw bytes."""

    INTS = (0, 1, -1, 2, 7, 50, 51, 1000, 2**31 - 1, -(2**31), 2**63 - 1, -(2**63))
    UINTS = (0, 1, 2, 255, 2**32 - 1, 2**64 - 1)
    FLOATS = (0.0, -0.0, 1.0, -1.0, 0.5, 1e308, -1e308, float("inf"), float("-inf"), float("nan"))

    def __init__(self, rng: random.Random, words: list[str]) -> None:
        self.rng = rng
        self.words = words

    def text(self) -> str:
        r = self.rng
        pick = r.random()
        if pick < 0.45:
            return r.choice(self.words)
        if pick < 0.6:
            return ""
        if pick < 0.65:
            return r.choice(self.words) + "\x00" + r.choice(self.words)
        if pick < 0.7:
            return "x" * r.choice((4097, 10_000, 70_000))
        alphabet = "ab /.:_-~*?%\\\n\t'\"ёж中🙂\u202e\ufeff"
        return "".join(r.choice(alphabet) for _ in range(r.randint(1, 40)))

    def scalar(self, field: descriptor.FieldDescriptor) -> object:
        r, t = self.rng, field.type
        fd = descriptor.FieldDescriptor
        if t == fd.TYPE_STRING:
            return self.text()
        if t == fd.TYPE_BYTES:
            return r.randbytes(r.randint(0, 64))
        if t == fd.TYPE_BOOL:
            return r.random() < 0.5
        if t in (fd.TYPE_FLOAT, fd.TYPE_DOUBLE):
            value = r.choice(self.FLOATS) if r.random() < 0.5 else r.uniform(-1e6, 1e6)
            return value if t == fd.TYPE_DOUBLE or abs(value) < 3e38 else float("inf")
        if t == fd.TYPE_ENUM:
            numbers = [v.number for v in field.enum_type.values]
            return r.choice(numbers) if r.random() < 0.8 else r.randint(-5, 1000)
        bits = 32 if t in (fd.TYPE_INT32, fd.TYPE_SINT32, fd.TYPE_SFIXED32) else 64
        if t in (fd.TYPE_UINT32, fd.TYPE_FIXED32, fd.TYPE_UINT64, fd.TYPE_FIXED64):
            ubits = 32 if t in (fd.TYPE_UINT32, fd.TYPE_FIXED32) else 64
            value = r.choice(self.UINTS) if r.random() < 0.5 else r.randint(0, 10_000)
            return value % (2**ubits)
        value = r.choice(self.INTS) if r.random() < 0.5 else r.randint(-100, 10_000)
        low, high = -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
        return min(max(value, low), high)

    def fill(self, msg: Message, depth: int = 0) -> Message:
        r = self.rng
        for field in msg.DESCRIPTOR.fields:
            if r.random() < 0.4:
                continue
            fd = descriptor.FieldDescriptor
            is_message = field.type == fd.TYPE_MESSAGE
            if is_message and field.message_type.GetOptions().map_entry:
                key_f = field.message_type.fields_by_name["key"]
                val_f = field.message_type.fields_by_name["value"]
                target = getattr(msg, field.name)
                for _ in range(r.randint(0, 4)):
                    key = self.scalar(key_f)
                    if val_f.type == fd.TYPE_MESSAGE:
                        if depth < 3:
                            self.fill(target[key], depth + 1)
                    else:
                        target[key] = self.scalar(val_f)
                continue
            if field.is_repeated:
                n = r.choice((0, 1, 2, 3, 5)) if r.random() < 0.97 else 1001
                target = getattr(msg, field.name)
                for _ in range(n):
                    if is_message:
                        if depth < 3:
                            self.fill(target.add(), depth + 1)
                    else:
                        target.append(self.scalar(field))
                continue
            if is_message:
                if depth < 3:
                    sub = getattr(msg, field.name)
                    sub.SetInParent()
                    self.fill(sub, depth + 1)
                continue
            setattr(msg, field.name, self.scalar(field))
        return msg

    def message(self, method: Method) -> bytes:
        return self.fill(method.request()).SerializeToString()

    def varint(self, value: int) -> bytes:
        out = bytearray()
        while True:
            byte, value = value & 0x7F, value >> 7
            out.append(byte | (0x80 if value else 0))
            if not value:
                return bytes(out)

    def stray_field(self) -> bytes:
        r = self.rng
        number = r.choice((1, 2, 3, 15, 16, 19000, 536_870_911, r.randint(1, 2**29 - 1)))
        wire = r.randint(0, 7)
        tag = self.varint((number << 3) | wire)
        if wire == 0:
            return tag + self.varint(r.randint(0, 2**64 - 1))
        if wire == 1:
            return tag + r.randbytes(8)
        if wire == 2:
            body = r.randbytes(r.randint(0, 20))
            declared = len(body) if r.random() < 0.7 else r.randint(0, 2**32)
            return tag + self.varint(declared) + body
        if wire == 5:
            return tag + r.randbytes(4)
        return tag + r.randbytes(r.randint(0, 6))  # groups and invalid wire types

    def mutate(self, method: Method) -> bytes:
        r = self.rng
        data = bytearray(self.message(method))
        for _ in range(r.randint(1, 3)):
            kind = r.randrange(5)
            if kind == 0 and data:
                for _ in range(r.randint(1, 8)):
                    i = r.randrange(len(data))
                    data[i] ^= 1 << r.randrange(8)
            elif kind == 1 and data:
                del data[r.randrange(len(data)) :]
            elif kind == 2:
                data += r.randbytes(r.randint(1, 32))
            elif kind == 3:
                i = r.randint(0, len(data))
                data[i:i] = self.stray_field()
            else:
                data += self.stray_field()
        return bytes(data)

    def raw(self) -> bytes:
        r = self.rng
        pick = r.random()
        if pick < 0.1:
            return b""
        if pick < 0.2:
            return struct.pack("<Q", r.getrandbits(64)) * r.randint(1, 8)
        return r.randbytes(r.randint(1, 256))


@dataclass
class Outcome:
    method: str
    kind: str
    caller: str
    data: bytes
    code: grpc.StatusCode
    details: str


def _leaks(text: str, type_names: set[str]) -> list[str]:
    found = [m.group(0) for m in LEAK.finditer(text)]
    found += [name for name in type_names if re.search(rf"\b{re.escape(name)}\b", text)]
    return found


async def _call(
    channel: grpc.aio.Channel, method: Method, data: bytes, metadata: tuple[tuple[str, str], ...]
) -> tuple[grpc.StatusCode, str, list[str]]:
    """The status code, its details and the text of its rich details; OK answers must
    decode as the response message."""
    try:
        if method.streaming:
            call = channel.unary_stream(method.path)(data, metadata=metadata, timeout=DEADLINE_S)
            async for chunk in call:
                method.response.FromString(chunk)
        else:
            answer = await channel.unary_unary(method.path)(
                data, metadata=metadata, timeout=DEADLINE_S
            )
            method.response.FromString(answer)
    except grpc.aio.AioRpcError as err:
        extra: list[str] = []
        status = rpc_status.from_call(err)
        if status is not None:
            extra.append(status.message)
            for any_ in status.details:
                info = error_details_pb2.ErrorInfo()
                if any_.Unpack(info):
                    extra += [info.reason, *info.metadata.values()]
        return err.code(), err.details() or "", extra
    return grpc.StatusCode.OK, "", []


def _token_store(data_dir: Path, scope: Path) -> tuple[TokenStore, str, str]:
    store = TokenStore(data_dir / "tokens.json")
    _, agent = store.create("fuzz-agent", "org-a", [str(scope)], "agent")
    _, operator = store.create("fuzz-ops", "org-a", [str(scope)], "operator")
    return store, agent, operator


def _workspace(tmp_path: Path) -> dict[str, Path]:
    root = tmp_path / "scope"
    ws = root / "ws"
    (ws / "src").mkdir(parents=True)
    (ws / "src" / "config.py").write_text(
        'def load_config(path):\n    """Read the service config."""\n    return open(path).read()\n'
    )
    (ws / "README.md").write_text("# Tiny\n\nThe config lives in src/config.py.\n")
    (ws / "docs").mkdir()
    (ws / "docs" / "guide.md").write_text("# Guide\n\n## Setup\n\nRun the config loader.\n")
    sessions = root / "sessions"
    sessions.mkdir()
    skills = root / "skills"
    skills.mkdir()
    return {"root": root, "ws": ws, "sessions": sessions, "skills": skills}


async def test_wire_fuzz_every_rpc(tmp_path: Path) -> None:
    seed, count = _seed(), _count()
    print(f"wire fuzz: seed={seed} requests={count}")
    dirs = _workspace(tmp_path)
    data_dir = tmp_path / "data"
    make_vendor(tmp_path / "vendor").install(data_dir)  # Enterprise: doc-graph RPCs run too
    store, agent, operator = _token_store(data_dir, dirs["root"])
    server = ServerThread(
        tmp_path,
        authenticate=store.authenticate,
        auth="on",
        workspaces=[str(dirs["ws"])],
        session_paths=[str(dirs["sessions"])],
        skill_roots=[str(dirs["skills"])],
    )
    methods = _methods()
    type_names = _type_names()
    ws = str(dirs["ws"])
    words = [
        ws,
        ws + "/",
        ws + "/src",
        ws + "/src/config.py",
        ws + "/../ws",
        str(dirs["sessions"]),
        str(dirs["root"] / "missing"),
        str(tmp_path / "elsewhere"),
        "/nonexistent/fuzz",
        "relative/path",
        "~",
        "knowledge.search/v1",
        "knowledge.dispatch/v1",
        "knowledge.handoff/v1",
        "config",
        "where is the config loaded",
        "episodes",
        "code",
        "skills",
        "docgraph",
        "auto",
        "hybrid",
        "ep:x:1",
        "ep:x:9223372036854775808",
        "chunk:1",
        "1",
        "-1",
        "success",
        "failure",
    ]
    who = {
        "none": (),
        "wrong": (("authorization", "Bearer kn_" + "x" * 43),),
        "agent": (("authorization", f"Bearer {agent}"),),
        "operator": (("authorization", f"Bearer {operator}"),),
    }
    rng = random.Random(seed)
    gen = Generator(rng, words)
    plan: list[tuple[Method, str, str, bytes]] = []
    for i in range(count):
        method = methods[i % len(methods)]
        kind = rng.choice(("message", "message", "mutated", "mutated", "raw"))
        data = {"message": gen.message, "mutated": gen.mutate}.get(kind, lambda _m: gen.raw())(
            method
        )
        # Mostly authorised callers, so that the handlers behind authentication run too.
        caller = rng.choices(list(who), weights=(1, 1, 3, 4))[0]
        plan.append((method, kind, caller, data))

    bad: list[Outcome] = []
    codes: dict[grpc.StatusCode, int] = {}
    started = time.monotonic()
    try:
        channels = [grpc.aio.insecure_channel(server.address) for _ in range(CHANNELS)]
        gate = asyncio.Semaphore(IN_FLIGHT)
        index = channels[0].unary_stream("/knowledge.v1.IndexService/IndexWorkspace")
        request = index_service_pb2.IndexWorkspaceRequest(root=ws).SerializeToString()
        events = [
            index_service_pb2.IndexWorkspaceResponse.FromString(e)
            async for e in index(request, metadata=who["operator"], timeout=60)
        ]
        assert events[-1].summary.counters["files_indexed"] >= 1, events[-1]

        async def one(i: int, method: Method, kind: str, caller: str, data: bytes) -> None:
            async with gate:
                code, details, extra = await _call(
                    channels[i % CHANNELS], method, data, who[caller]
                )
            codes[code] = codes.get(code, 0) + 1
            leaked = _leaks(" | ".join((details, *extra)), type_names)
            if code not in ALLOWED or leaked:
                bad.append(Outcome(method.path, kind, caller, data, code, details))

        await asyncio.gather(*(one(i, *item) for i, item in enumerate(plan)))

        # Still up: health SERVING, and a normal search answers.
        health = health_pb2_grpc.HealthStub(channels[0])
        reply = await health.Check(health_pb2.HealthCheckRequest(), timeout=5)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
        search = channels[0].unary_unary("/knowledge.v1.KnowledgeService/Search")
        good = search_pb2.SearchRequest(schema="knowledge.search/v1", query="where is the config")
        answer = search_pb2.SearchResponse.FromString(
            await search(good.SerializeToString(), metadata=who["operator"], timeout=10)
        )
        assert answer.schema == "knowledge.search/v1"
        for channel in channels:
            await channel.close()
    finally:
        server.stop()
    elapsed = time.monotonic() - started
    summary = ", ".join(f"{code.name}={n}" for code, n in sorted(codes.items(), key=str))
    print(f"wire fuzz: {count} requests in {elapsed:.1f}s: {summary}")
    assert sum(codes.values()) == count
    report = "\n".join(
        f"{o.method} [{o.kind}, {o.caller}] -> {o.code.name}: {o.details[:200]!r} "
        f"request={o.data[:120].hex()}"
        for o in bad[:20]
    )
    assert not bad, f"seed {seed}: {len(bad)} bad outcomes, first ones:\n{report}"
