"""Every proto file carries the per-language options, with pinned values (they name the
packages generated code lives in, so changing one breaks every client of that language:
buf's FILE_SAME_* rules are replaced by this test, see buf.yaml); and `buf generate`
with buf.gen.yaml gives the committed TypeScript."""

from __future__ import annotations

import filecmp
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from google.protobuf import descriptor_pb2
from knowledge_server._gen.knowledge.v1 import (
    dispatch_pb2,
    docgraph_pb2,
    errors_pb2,
    index_service_pb2,
    kb_admin_pb2,
    kb_retrieve_pb2,
    knowledge_service_pb2,
    memory_pb2,
    options_pb2,
    search_pb2,
)

from tests.conftest import REPO_ROOT

PROTO = REPO_ROOT / "proto" / "knowledge" / "v1"

PINNED = {
    "csharp_namespace": "Knowledge.V1",
    "go_package": "knowledgeservice/gen/go/knowledge/v1;knowledgev1",
    "java_multiple_files": True,
    "java_package": "com.knowledgeservice.knowledge.v1",
    "objc_class_prefix": "KXX",
    "php_namespace": "Knowledge\\V1",
    "ruby_package": "Knowledge::V1",
}


def test_every_proto_file_has_the_pinned_language_options() -> None:
    """Proto contract: the language options of each file are exactly the published ones."""
    modules = [
        dispatch_pb2,
        docgraph_pb2,
        errors_pb2,
        index_service_pb2,
        kb_admin_pb2,
        kb_retrieve_pb2,
        knowledge_service_pb2,
        memory_pb2,
        options_pb2,
        search_pb2,
    ]
    assert {Path(m.DESCRIPTOR.name).name for m in modules} == {
        p.name for p in PROTO.glob("*.proto")
    }
    for module in modules:
        proto = descriptor_pb2.FileDescriptorProto()
        module.DESCRIPTOR.CopyToProto(proto)
        opts = proto.options
        for name, value in PINNED.items():
            assert opts.HasField(name), f"{proto.name}: {name} is not set"
            assert getattr(opts, name) == value, f"{proto.name}: {name}"
        stem = Path(proto.name).stem
        outer = "".join(w.capitalize() for w in stem.split("_")) + "Proto"
        assert opts.java_outer_classname == outer, proto.name


def test_buf_generate_gives_the_committed_typescript(tmp_path: Path) -> None:
    """buf.gen.yaml (local plugins only) and scripts/gen_protos.py write the same
    TypeScript for knowledge/v1."""
    plugin = REPO_ROOT / "clients" / "typescript" / "node_modules" / ".bin" / "protoc-gen-es"
    buf = shutil.which("buf") or str(REPO_ROOT / ".venv" / "bin" / "buf")
    if not plugin.exists() or not shutil.which(buf):
        if os.environ.get("CI"):
            pytest.fail("buf and clients/typescript/node_modules (npm ci) are needed")
        pytest.skip("buf or clients/typescript/node_modules (npm ci there) is missing")
    # Only the TypeScript plugin of the template, written into tmp_path.
    template = yaml.safe_load((REPO_ROOT / "buf.gen.yaml").read_text())
    ts = [p for p in template["plugins"] if str(p.get("local", "")).endswith("protoc-gen-es")]
    assert len(ts) == 1
    ts[0]["local"] = str(plugin)
    ts[0]["out"] = str(tmp_path / "ts")
    template["plugins"] = ts
    template["inputs"] = [{"directory": str(REPO_ROOT / "proto")}]
    (tmp_path / "buf.gen.yaml").write_text(yaml.safe_dump(template))
    result = subprocess.run(
        [buf, "generate", "--template", str(tmp_path / "buf.gen.yaml")],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    generated = tmp_path / "ts" / "knowledge" / "v1"
    committed = REPO_ROOT / "clients" / "typescript" / "src" / "gen" / "knowledge" / "v1"
    names = sorted(p.name for p in generated.iterdir())
    assert names == sorted(p.name for p in committed.glob("*_pb.ts"))
    _, mismatch, errors = filecmp.cmpfiles(generated, committed, names, shallow=False)
    assert not mismatch and not errors, (mismatch, errors)
