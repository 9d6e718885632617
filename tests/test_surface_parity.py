"""Single surface (seed 003 §1): every RPC appears in the SDK, the CLI and the docs."""

from __future__ import annotations

import inspect
import re

from knowledge_sdk import AsyncKnowledgeClient, KnowledgeClient
from knowledge_sdk.client import RPC_METHODS
from knowledge_server.cli import iter_commands
from knowledge_server.transport.policy import service_methods

from tests.conftest import REPO_ROOT

# RPC -> CLI command path.
CLI_COMMANDS = {
    "knowledge.v1.KnowledgeService/Search": "search",
    "knowledge.v1.KnowledgeService/Dispatch": "dispatch",
    "knowledge.v1.KnowledgeService/GetEpisode": "get-episode",
    "knowledge.v1.KnowledgeService/GetChunk": "get-chunk",
    "knowledge.v1.DocGraphService/Themes": "docgraph themes",
    "knowledge.v1.DocGraphService/EntityNeighbors": "docgraph neighbors",
    "knowledge.v1.DocGraphService/DocRelations": "docgraph relations",
    "knowledge.v1.DocGraphService/GlobalOverview": "docgraph overview",
    "knowledge.v1.DocGraphService/SearchLevels": "docgraph search-levels",
    "knowledge.v1.IndexService/IndexWorkspace": "index",
    "knowledge.v1.IndexService/IngestSessions": "ingest",
    "knowledge.v1.IndexService/RebuildDerived": "rebuild",
    "knowledge.v1.IndexService/BuildDocGraph": "docgraph build",
    "knowledge.v1.IndexService/GetStatus": "status",
    "knowledge.v1.KnowledgeBaseService/Retrieve": "kb retrieve",
    "knowledge.v1.KnowledgeBaseService/Answer": "kb answer",
    "knowledge.v1.KnowledgeBaseAdminService/CreateTopic": "kb topic create",
    "knowledge.v1.KnowledgeBaseAdminService/ListTopics": "kb topic list",
    "knowledge.v1.KnowledgeBaseAdminService/GetTopic": "kb topic show",
    "knowledge.v1.KnowledgeBaseAdminService/CreateRevision": "kb revision create",
    "knowledge.v1.KnowledgeBaseAdminService/GetRevision": "kb revision show",
    "knowledge.v1.KnowledgeBaseAdminService/UpdateRevision": "kb revision update",
    "knowledge.v1.KnowledgeBaseAdminService/UploadSource": "kb source upload",
    "knowledge.v1.KnowledgeBaseAdminService/PutFaq": "kb faq put",
    "knowledge.v1.KnowledgeBaseAdminService/RemoveSource": "kb source remove",
    "knowledge.v1.KnowledgeBaseAdminService/SubmitRevision": "kb revision submit",
    "knowledge.v1.KnowledgeBaseAdminService/ApproveRevision": "kb revision approve",
    "knowledge.v1.KnowledgeBaseAdminService/ReturnRevision": "kb revision return",
    "knowledge.v1.KnowledgeBaseAdminService/ProcessRevision": "kb revision process",
    "knowledge.v1.KnowledgeBaseAdminService/RetryTask": "kb task retry",
    "knowledge.v1.KnowledgeBaseAdminService/CancelTask": "kb task cancel",
    "knowledge.v1.KnowledgeBaseAdminService/WatchTask": "kb task watch",
    "knowledge.v1.KnowledgeBaseAdminService/PublishRevision": "kb revision publish",
    "knowledge.v1.KnowledgeBaseAdminService/RollbackTopic": "kb topic rollback",
    "knowledge.v1.KnowledgeBaseAdminService/OfflineTopic": "kb topic offline",
    "knowledge.v1.KnowledgeBaseAdminService/Reconcile": "kb reconcile",
    "knowledge.v1.KnowledgeBaseAdminService/CreateTag": "kb tag create",
    "knowledge.v1.KnowledgeBaseAdminService/UpdateTag": "kb tag update",
    "knowledge.v1.KnowledgeBaseAdminService/ListTags": "kb tag list",
    "knowledge.v1.KnowledgeBaseAdminService/PutTemplate": "kb template put",
    "knowledge.v1.KnowledgeBaseAdminService/ListTemplates": "kb template list",
    "knowledge.v1.KnowledgeBaseAdminService/CreateFeedback": "kb feedback create",
    "knowledge.v1.KnowledgeBaseAdminService/ListFeedback": "kb feedback list",
    "knowledge.v1.KnowledgeBaseAdminService/ResolveFeedback": "kb feedback resolve",
    "knowledge.v1.KnowledgeBaseAdminService/GetPolicy": "kb policy show",
    "knowledge.v1.KnowledgeBaseAdminService/SetPolicy": "kb policy set",
    "knowledge.v1.MemoryService/Remember": "memory remember",
    "knowledge.v1.MemoryService/Recall": "memory recall",
    "knowledge.v1.MemoryService/Timeline": "memory timeline",
    "knowledge.v1.MemoryService/Rooms": "memory rooms",
    "knowledge.v1.MemoryService/Relations": "memory relations",
    "knowledge.v1.MemoryService/Policy": "memory policy",
    "knowledge.v1.MemoryService/Consolidate": "memory consolidate",
    "knowledge.v1.MemoryService/Restore": "memory restore",
}


def _rpcs() -> set[str]:
    return {f"{svc}/{m}" for svc, methods in service_methods().items() for m in methods}


def test_every_rpc_has_an_sdk_method_sync_and_async() -> None:
    assert set(RPC_METHODS) == _rpcs()
    for rpc, name in RPC_METHODS.items():
        assert callable(getattr(KnowledgeClient, name, None)), rpc
        assert callable(getattr(AsyncKnowledgeClient, name, None)), rpc
    public = {
        n
        for n, _ in inspect.getmembers(KnowledgeClient, inspect.isfunction)
        if not n.startswith("_")
    }
    assert public - {"close"} == set(RPC_METHODS.values())


def test_every_rpc_has_a_cli_command() -> None:
    assert set(CLI_COMMANDS) == _rpcs()
    commands = set(iter_commands())
    for rpc, cmd in CLI_COMMANDS.items():
        assert cmd in commands, rpc


def test_readme_operation_table_lists_every_rpc() -> None:
    readme = (REPO_ROOT / "README.md").read_text()
    for rpc, cmd in CLI_COMMANDS.items():
        short = rpc.removeprefix("knowledge.v1.")
        assert f"`{short}`" in readme, short
        assert f"`{RPC_METHODS[rpc]}`" in readme
        assert f"knowledge {cmd}" in readme


def test_every_cli_command_is_documented() -> None:
    doc = (REPO_ROOT / "docs" / "cli.md").read_text()
    documented = set(re.findall(r"^## `knowledge ([a-z\- ]+)`", doc, re.MULTILINE))
    assert set(iter_commands()) <= documented, set(iter_commands()) - documented


def test_every_rpc_has_an_mcp_tool_or_a_reasoned_exclusion() -> None:
    from knowledge_mcp import ACTION_TOOLS, EXCLUDED_RPCS, TOOLS

    tool_rpcs = {t.rpc for t in TOOLS} | {rpc for t in ACTION_TOOLS for rpc in t.rpcs}
    assert tool_rpcs | set(EXCLUDED_RPCS) == _rpcs()
    assert not tool_rpcs & set(EXCLUDED_RPCS)
    for rpc in EXCLUDED_RPCS:
        assert EXCLUDED_RPCS[rpc], rpc  # a reason is given


def test_every_rpc_has_a_typescript_client_method() -> None:
    """The TypeScript client (clients/typescript/src/client.ts) has one method per RPC,
    named as protoc-gen-es names the RPC (lower camel case). Its own node:test suite
    checks the same against the generated descriptors at run time."""
    source = (REPO_ROOT / "clients" / "typescript" / "src" / "client.ts").read_text()
    methods = set(re.findall(r"^  (?:async \*?)?([a-z]\w*)\(", source, re.MULTILINE))
    for rpc in _rpcs():
        name = rpc.rsplit("/", 1)[1]
        camel = name[0].lower() + name[1:]
        assert camel in methods, f"{rpc}: no method {camel}() in the TypeScript client"
