"""A local scripted model server speaking just enough of three model APIs for one tool call,
so the real harness CLIs run offline (L2 tests, ``tests/test_integrations_l2.py``).

Turn 1 (no tool result in the request): answer with a call to the tool whose name ends with
``knowledge_search`` (taken from the request's tool list) and ``{"query": QUERY}``. Turn 2
(the request carries the tool's result): answer with text quoting that result. A request
without our tool (a client's side request, e.g. a title) gets a short text. Every request
body is kept in ``requests`` so a test can check what the client sent (hooks' evidence).

* Anthropic Messages (Claude Code): ``POST /v1/messages`` (SSE when ``stream``),
  ``POST /v1/messages/count_tokens``.
* OpenAI Responses (Codex CLI): ``POST /v1/responses`` (SSE).
* OpenAI Chat Completions (OpenCode): ``POST /v1/chat/completions`` (SSE when ``stream``).
"""

from __future__ import annotations

import json
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

QUOTE_PREFIX = "Knowledge evidence:"


def _tool_name(names: list[str]) -> str | None:
    for n in names:
        if n.endswith("knowledge_search"):
            return n
    return None


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            _text_of(c.get("text", c.get("content", ""))) for c in content if isinstance(c, dict)
        )
    return ""


class ScriptedModels:
    def __init__(self, query: str) -> None:
        self.query = query
        self.requests: list[tuple[str, dict[str, Any]]] = []
        models = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                models.requests.append((f"GET {self.path}", {}))
                self._json(404, {"error": {"type": "not_found", "message": "scripted"}})

            def do_HEAD(self) -> None:
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def do_POST(self) -> None:
                n = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(n) if n else b""
                try:
                    body = json.loads(raw or b"{}")
                except ValueError:
                    body = {}
                path = self.path.split("?")[0]
                models.requests.append((f"POST {path}", body))
                if path.endswith("/messages/count_tokens"):
                    self._json(200, {"input_tokens": 100})
                elif path.endswith("/messages"):
                    models._anthropic(self, body)
                elif path.endswith("/responses"):
                    models._responses(self, body)
                elif path.endswith("/chat/completions"):
                    models._chat(self, body)
                else:
                    self._json(404, {"error": {"message": "scripted: unknown path"}})

            def _json(self, code: int, obj: Any) -> None:
                data = json.dumps(obj).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def sse(self, events: list[tuple[str | None, Any]]) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Cache-Control", "no-cache")
                self.send_header("Connection", "close")
                self.end_headers()
                for name, data in events:
                    chunk = ""
                    if name:
                        chunk += f"event: {name}\n"
                    chunk += f"data: {data if isinstance(data, str) else json.dumps(data)}\n\n"
                    self.wfile.write(chunk.encode())
                    self.wfile.flush()
                self.close_connection = True

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> ScriptedModels:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def answer_text(self, result: str) -> str:
        """What a model writes from the tool's result: its citations. A client hands the
        model the bridge's text rendering (``path:start-end`` lines) or its structured JSON
        (Claude Code and Codex pass the latter); from JSON the citations are formed the way
        the tool's description asks, ``path:start_line-end_line`` and ``session_id#seq``."""
        lines = [QUOTE_PREFIX]
        start = result.find("{")
        data = None
        if start >= 0:
            try:
                data = json.loads(result[start:])
            except ValueError:
                data = None
        if isinstance(data, dict) and isinstance(data.get("lanes"), dict):
            for name, lane in data["lanes"].items():
                if not isinstance(lane, dict):
                    continue
                lines.append(f"{name} index_rev {lane.get('index_rev') or '-'}")
                for it in lane.get("items") or []:
                    if "path" in it:
                        lines.append(f"{it['path']}:{it.get('start_line')}-{it.get('end_line')}")
                    elif "session_id" in it:
                        lines.append(f"{it['session_id']}#{it.get('seq')}")
        else:
            lines.append(result[:4000])
        return "\n".join(lines)

    # -- Anthropic Messages ---------------------------------------------------------------
    def _anthropic(self, h: Any, body: dict[str, Any]) -> None:
        tool = _tool_name([t.get("name", "") for t in body.get("tools") or []])
        result = None
        for m in body.get("messages") or []:
            if isinstance(m.get("content"), list):
                for block in m["content"]:
                    if isinstance(block, dict) and block.get("type") == "tool_result":
                        result = _text_of(block.get("content"))
        mid = f"msg_{uuid.uuid4().hex[:20]}"
        usage = {"input_tokens": 10, "output_tokens": 10}
        start = {
            "type": "message_start",
            "message": {
                "id": mid,
                "type": "message",
                "role": "assistant",
                "model": body.get("model", "scripted"),
                "content": [],
                "stop_reason": None,
                "stop_sequence": None,
                "usage": usage,
            },
        }
        if result is None and tool is not None:
            args = json.dumps({"query": self.query})
            block = {
                "type": "tool_use",
                "id": f"toolu_{uuid.uuid4().hex[:20]}",
                "name": tool,
                "input": {},
            }
            delta = {"type": "input_json_delta", "partial_json": args}
            stop = "tool_use"
            final_content = [{**block, "input": {"query": self.query}}]
        else:
            text = self.answer_text(result) if result is not None else "ok"
            block = {"type": "text", "text": ""}
            delta = {"type": "text_delta", "text": text}
            stop = "end_turn"
            final_content = [{"type": "text", "text": text}]
        if not body.get("stream"):
            h._json(
                200,
                {
                    "id": mid,
                    "type": "message",
                    "role": "assistant",
                    "model": body.get("model", "scripted"),
                    "content": final_content,
                    "stop_reason": stop,
                    "stop_sequence": None,
                    "usage": usage,
                },
            )
            return
        h.sse(
            [
                ("message_start", start),
                (
                    "content_block_start",
                    {"type": "content_block_start", "index": 0, "content_block": block},
                ),
                (
                    "content_block_delta",
                    {"type": "content_block_delta", "index": 0, "delta": delta},
                ),
                ("content_block_stop", {"type": "content_block_stop", "index": 0}),
                (
                    "message_delta",
                    {
                        "type": "message_delta",
                        "delta": {"stop_reason": stop, "stop_sequence": None},
                        "usage": {"output_tokens": 10},
                    },
                ),
                ("message_stop", {"type": "message_stop"}),
            ]
        )

    # -- OpenAI Responses -----------------------------------------------------------------
    def _responses(self, h: Any, body: dict[str, Any]) -> None:
        # Codex lists an MCP server's tools in a namespace ("mcp__knowledge"); a call names
        # the tool and its namespace.
        namespace = None
        tool = _tool_name([t.get("name", "") for t in body.get("tools") or []])
        for t in body.get("tools") or []:
            if tool is None and t.get("type") == "namespace":
                inner = _tool_name([x.get("name", "") for x in t.get("tools") or []])
                if inner is not None:
                    tool, namespace = inner, t.get("name")
        result = None
        for item in body.get("input") or []:
            if isinstance(item, dict) and item.get("type") == "function_call_output":
                out = item.get("output")
                result = (
                    out
                    if isinstance(out, str)
                    else _text_of(
                        out
                        if isinstance(out, list)
                        else out.get("content")
                        if isinstance(out, dict)
                        else ""
                    )
                )
        rid = f"resp_{uuid.uuid4().hex[:20]}"
        if result is None and tool is not None:
            item = {
                "type": "function_call",
                "id": f"fc_{uuid.uuid4().hex[:16]}",
                "call_id": f"call_{uuid.uuid4().hex[:16]}",
                "name": tool,
                "arguments": json.dumps({"query": self.query}),
                "status": "completed",
            }
            if namespace:
                item["namespace"] = namespace
        else:
            text = self.answer_text(result) if result is not None else "ok"
            item = {
                "type": "message",
                "id": f"msg_{uuid.uuid4().hex[:16]}",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": text, "annotations": []}],
            }
        usage = {
            "input_tokens": 10,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": 10,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": 20,
        }
        h.sse(
            [
                (
                    "response.created",
                    {"type": "response.created", "response": {"id": rid, "status": "in_progress"}},
                ),
                (
                    "response.output_item.done",
                    {"type": "response.output_item.done", "output_index": 0, "item": item},
                ),
                (
                    "response.completed",
                    {
                        "type": "response.completed",
                        "response": {
                            "id": rid,
                            "status": "completed",
                            "output": [item],
                            "usage": usage,
                        },
                    },
                ),
            ]
        )

    # -- OpenAI Chat Completions ----------------------------------------------------------
    def _chat(self, h: Any, body: dict[str, Any]) -> None:
        tool = _tool_name(
            [(t.get("function") or {}).get("name", "") for t in body.get("tools") or []]
        )
        result = None
        for m in body.get("messages") or []:
            if m.get("role") == "tool":
                result = _text_of(m.get("content"))
        cid = f"chatcmpl-{uuid.uuid4().hex[:20]}"
        model = body.get("model", "scripted")

        def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
            return {
                "id": cid,
                "object": "chat.completion.chunk",
                "created": 0,
                "model": model,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
            }

        if result is None and tool is not None:
            call = {
                "index": 0,
                "id": f"call_{uuid.uuid4().hex[:16]}",
                "type": "function",
                "function": {"name": tool, "arguments": json.dumps({"query": self.query})},
            }
            events = [chunk({"role": "assistant", "tool_calls": [call]}), chunk({}, "tool_calls")]
        else:
            text = self.answer_text(result) if result is not None else "ok"
            events = [chunk({"role": "assistant", "content": text}), chunk({}, "stop")]
        usage_chunk = {
            **chunk({}),
            "choices": [],
            "usage": {"prompt_tokens": 10, "completion_tokens": 10, "total_tokens": 20},
        }
        if not body.get("stream"):
            msg: dict[str, Any] = {"role": "assistant"}
            d = events[0]["choices"][0]["delta"]
            msg.update({k: v for k, v in d.items() if k != "role"})
            h._json(
                200,
                {
                    "id": cid,
                    "object": "chat.completion",
                    "created": 0,
                    "model": model,
                    "choices": [
                        {
                            "index": 0,
                            "message": msg,
                            "finish_reason": events[1]["choices"][0]["finish_reason"],
                        }
                    ],
                    "usage": usage_chunk["usage"],
                },
            )
            return
        h.sse([(None, e) for e in [*events, usage_chunk]] + [(None, "[DONE]")])
