"""MCP bridge for the Knowledge Service: a stdio MCP server whose tools call a running
service through the SDK (``knowledge_sdk``).

A client package: it imports the SDK, ``mcp`` and ``protobuf`` (descriptors and
``json_format``), never the server. Tool schemas are generated from the API's descriptor set
(``_gen/knowledge_v1.binpb``, written by ``scripts/gen_protos.py``).

Run it with ``knowledge-mcp`` or ``python -m knowledge_mcp`` (``knowledge mcp`` starts the
same program); ``knowledge_mcp.server.build_server`` builds the server in-process.
"""

from knowledge_mcp.arguments import BridgeError, build_request
from knowledge_mcp.memory_tool import ACTION_TOOLS, MEMORY_TOOL, ActionToolSpec
from knowledge_mcp.tools import EXCLUDED_RPCS, TOOLS, TOOLS_BY_NAME, ToolSpec

__all__ = [
    "ACTION_TOOLS",
    "EXCLUDED_RPCS",
    "MEMORY_TOOL",
    "TOOLS",
    "TOOLS_BY_NAME",
    "ActionToolSpec",
    "BridgeError",
    "ToolSpec",
    "build_request",
]
