"""A deterministic, rule-driven OpenAI-compatible chat server for tests and demos.

It is a real HTTP server (``http.server`` in a thread), so the production client path runs end
to end. It answers the three prompts of :mod:`knowledge_server.docgraph.prompts` by simple rules over the framed text:

* entities: ``EIP-n``/``ERC-n`` (standard), upper-case opcode-like words (operation),
  back-ticked ``snake_case``/``camelCase`` identifiers (parameter), capitalised multi-word terms
  (concept);
* relations: entities co-occurring in one sentence that contains a verb cue
  (``requires``, ``extends``, ``replaces``, ``defines``, ``uses``...), evidence = the sentence;
* keywords: identifier-like words are low level, other content words high level;
* summaries: the member names, citing the first listed chunks.

Failures are simulated either for every request (``mode``) or for one chunk by a marker inside
its text (``FAKE_LLM:<mode>``): ``http_503``, ``http_429``, ``malformed_json``,
``invent_entity``, ``unknown_kind``, ``bad_evidence``, ``no_citations``.

``python -m knowledge_server.testing.fake_llm --port 0`` prints its base URL and serves.
"""

from __future__ import annotations

import argparse
import json
import re
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self

from knowledge_server.docgraph.prompts import (
    CHUNK_CLOSE,
    CHUNK_OPEN,
    MEMBERS_CLOSE,
    MEMBERS_OPEN,
    QUERY_CLOSE,
    QUERY_OPEN,
    QUOTE_PREFIX,
    between,
)
from knowledge_server.textlang import REQUEST_WORDS, STOP_WORDS

__all__ = ["FakeLLMServer", "fake_extract", "fake_keywords", "main"]

MODES = frozenset(
    {
        "ok",
        "http_503",
        "http_429",
        "malformed_json",
        "invent_entity",
        "unknown_kind",
        "bad_evidence",
        "no_citations",
    }
)
_MARKER = re.compile(r"FAKE_LLM:([a-z0-9_]+)")

_STANDARD = re.compile(r"\b(?:EIP|ERC)-\d+\b")
_OPCODE = re.compile(r"\b[A-Z][A-Z0-9_]{3,}\b")
_CODE_IDENT = re.compile(r"`([A-Za-z_][A-Za-z0-9]*_[A-Za-z0-9_]+|[a-z]+[A-Z][A-Za-z0-9]*)`")
_CAPS_TERM = re.compile(r"\b[A-Z][a-z]+(?:[ ][A-Z][a-z]+){1,3}\b")
_SENTENCE = re.compile(r"[^.!?\n]+[.!?]?")
_NOT_OPCODES = frozenset(
    {
        "MUST",
        "SHOULD",
        "SHALL",
        "REQUIRED",
        "RECOMMENDED",
        "OPTIONAL",
        "NOT",
        "MAY",
        "TODO",
        "NOTE",
        "WARNING",
        "THIS",
        "THAT",
        "WITH",
        "FROM",
        "NONE",
        "TRUE",
        "FALSE",
        "NULL",
        "FAKE_LLM",
    }
)
_LEADING_STOP = frozenset(
    {
        "The",
        "This",
        "That",
        "These",
        "Those",
        "A",
        "An",
        "In",
        "If",
        "For",
        "When",
        "It",
        "We",
        "Our",
        "As",
        "On",
        "To",
        "By",
        "Of",
        "And",
        "Or",
        "But",
        "With",
        "All",
        "Any",
        "Each",
    }
)
_CUES: tuple[tuple[str, str], ...] = (
    ("requires", "requires"),
    ("require", "requires"),
    ("depends on", "requires"),
    ("extends", "extends"),
    ("modifies", "extends"),
    ("builds on", "extends"),
    ("replaces", "replaces"),
    ("supersedes", "replaces"),
    ("deprecates", "replaces"),
    ("defines", "defines"),
    ("introduces", "defines"),
    ("specifies", "defines"),
    ("uses", "uses"),
    ("using", "uses"),
    ("similar to", "related_to"),
    ("compatible with", "related_to"),
)
# Keywords leave out what the service's own lexical fallback leaves out.
_STOPWORDS = STOP_WORDS | REQUEST_WORDS
MAX_ENTITIES = 15
MAX_RELATIONS = 10


def _concept_terms(text: str) -> list[str]:
    out = []
    for m in _CAPS_TERM.finditer(text):
        words = m.group(0).split(" ")
        while words and words[0] in _LEADING_STOP:
            words = words[1:]
        if len(words) >= 2:
            out.append(" ".join(words))
    return out


def fake_extract(text: str, mode: str = "ok") -> dict[str, Any]:  # noqa: C901 - one rule per entity and relation pattern the fake recognises
    """The rule-based extraction answer for ``text`` (before failure simulation of the JSON)."""
    found: list[tuple[str, str]] = []
    seen: set[str] = set()

    def add(name: str, kind: str) -> None:
        key = name.lower()
        if key not in seen and len(found) < MAX_ENTITIES:
            seen.add(key)
            found.append((name, kind))

    for m in _STANDARD.finditer(text):
        add(m.group(0), "standard")
    for m in _OPCODE.finditer(text):
        word = m.group(0)
        if word not in _NOT_OPCODES and not _STANDARD.fullmatch(word):
            add(word, "operation")
    for m in _CODE_IDENT.finditer(text):
        add(m.group(1), "parameter")
    for term in _concept_terms(text):
        add(term, "concept")

    entities: list[dict[str, str]] = [{"name": n, "kind": k, "mention": n} for n, k in found]
    relations: list[dict[str, str]] = []
    for sm in _SENTENCE.finditer(text):
        sentence = sm.group(0).strip()
        low = sentence.lower()
        rel_kind = next((kind for cue, kind in _CUES if re.search(rf"\b{cue}\b", low)), None)
        if rel_kind is None:
            continue
        present = [n for n, _ in found if n in sentence]
        for other in present[1:]:
            if len(relations) < MAX_RELATIONS:
                relations.append(
                    {"src": present[0], "dst": other, "kind": rel_kind, "evidence": sentence}
                )
    if mode == "invent_entity":
        entities.append(
            {"name": "Quantum Ledger Oracle", "kind": "concept", "mention": "Quantum Ledger Oracle"}
        )
    elif mode == "unknown_kind":
        for e in entities:
            e["kind"] = "galaxy"
    elif mode == "bad_evidence":
        for r in relations:
            r["evidence"] = "this sentence is nowhere in the fragment"
    return {"entities": entities, "relations": relations}


def fake_keywords(query: str) -> dict[str, list[str]]:
    low_level: list[str] = []
    high_level: list[str] = []
    for term in [m.group(0) for m in _STANDARD.finditer(query)] + _concept_terms(query):
        if term not in low_level:
            low_level.append(term)
    taken = " ".join(low_level).lower()
    for word in re.findall(r"[A-Za-z_][A-Za-z0-9_\-]*", query):
        lw = word.lower()
        if lw in _STOPWORDS or lw in taken or len(lw) < 3:
            continue
        identifier_like = bool(re.search(r"[0-9_]|[a-z][A-Z]", word)) or word.isupper()
        bucket = low_level if identifier_like else high_level
        if word not in bucket and lw not in [b.lower() for b in bucket]:
            bucket.append(word if identifier_like else lw)
    return {"high_level": high_level, "low_level": low_level}


def fake_summary(payload: str, mode: str) -> dict[str, Any]:
    """Names the members and quotes the first words of the first chunk's quote (if any)."""
    members = [ln[len("- entity: ") :] for ln in payload.split("\n") if ln.startswith("- entity: ")]
    quoted = [ln[len(QUOTE_PREFIX) :] for ln in payload.split("\n") if ln.startswith(QUOTE_PREFIX)]
    first_words = " ".join(" ".join(q for q in quoted if q.strip()).split()[:8])
    chunks = [
        ln[len("- chunk: ") :].split(" ", 1)[0]
        for ln in payload.split("\n")
        if ln.startswith("- chunk: ")
    ]
    summary = (
        "Theme linking "
        + ", ".join(members[:5])
        + (f" and {len(members) - 5} more." if len(members) > 5 else ".")
        + (f' Quoted: "{first_words}"' if first_words else "")
    )
    citations = [] if mode == "no_citations" else chunks[:3]
    return {"summary": summary, "citations": citations}


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        return  # keep test output clean; the fake never logs request bodies

    def _send(self, status: int, body: bytes, ctype: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        if self.path.rstrip("/") == "/stats":
            owner = self.server.owner
            with owner.lock:
                data = {"calls": owner.calls, "by_task": dict(owner.by_task), "mode": owner.mode}
            self._send(200, json.dumps(data, sort_keys=True).encode())
        else:
            self._send(404, b'{"error":"not found"}')

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length)
        owner = self.server.owner
        if self.path.rstrip("/") != "/v1/chat/completions":
            self._send(404, b'{"error":"not found"}')
            return
        try:
            req = json.loads(raw)
            messages = req["messages"]
            system = next(m["content"] for m in messages if m["role"] == "system")
            user = next(m["content"] for m in messages if m["role"] == "user")
        except (ValueError, KeyError, StopIteration, TypeError):
            self._send(400, b'{"error":"bad request"}')
            return
        task = system.split("\n", 1)[0].removeprefix("TASK:").split(" ", 1)[0]
        # Quoted document text (summary prompts) never switches the mode: only a chunk under
        # extraction, or the request's own lines, may carry a marker.
        own = "\n".join(ln for ln in user.split("\n") if not ln.startswith(QUOTE_PREFIX))
        marker = _MARKER.search(own)
        mode = marker.group(1) if marker else owner.mode
        with owner.lock:
            owner.calls += 1
            owner.by_task[task] += 1
        if mode in ("http_503", "http_429"):
            self._send(int(mode[-3:]), b'{"error":"simulated"}')
            return
        if task == "extract_graph":
            answer: Any = fake_extract(between(user, CHUNK_OPEN, CHUNK_CLOSE) or "", mode)
        elif task == "query_keywords":
            answer = fake_keywords(between(user, QUERY_OPEN, QUERY_CLOSE) or "")
        elif task == "theme_summary":
            payload = between(user, MEMBERS_OPEN, MEMBERS_CLOSE) or ""
            with owner.lock:
                owner.summary_payloads.append(payload)
            answer = fake_summary(payload, mode)
        else:
            answer = {}
        content = json.dumps(answer, sort_keys=True)
        if mode == "malformed_json":
            content = content[: max(1, len(content) // 2)]  # cut mid-object: not valid JSON
        body = {
            "id": "fake-1",
            "object": "chat.completion",
            "model": req.get("model"),
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": content},
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
        }
        self._send(200, json.dumps(body).encode())


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    owner: FakeLLMServer


class FakeLLMServer:
    """``with FakeLLMServer() as fake: fake.url`` -> ``http://127.0.0.1:<port>``."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, mode: str = "ok") -> None:
        if mode not in MODES:
            raise ValueError(f"unknown mode {mode!r}")
        self.mode = mode
        self.calls = 0
        self.by_task: Counter[str] = Counter()
        # What each theme_summary request was given (members, chunk lines, quotes).
        self.summary_payloads: list[str] = []
        self.lock = threading.Lock()
        self._httpd = _Server((host, port), _Handler)
        self._httpd.owner = self
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> Self:
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def reset_stats(self) -> None:
        with self.lock:
            self.calls = 0
            self.by_task.clear()
            self.summary_payloads.clear()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Deterministic fake OpenAI-compatible chat server")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--mode", default="ok", choices=sorted(MODES))
    args = parser.parse_args(argv)
    server = FakeLLMServer(args.host, args.port, args.mode)
    print(server.url, flush=True)
    try:
        server._httpd.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server._httpd.server_close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
