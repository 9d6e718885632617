"""Chunker: symbols per language, class splitting, markdown sections, windows, fallbacks."""

from __future__ import annotations

import pytest
from knowledge_server.code import chunking
from knowledge_server.code.chunking import chunk_file
from knowledge_server.code.model import IndexOptions

WS = "/ws"

SOURCES: dict[str, tuple[str, set[str]]] = {
    "m.py": (
        "import os\n\n@dec\ndef top(a):\n    return a\n\nclass K:\n    def m(self):\n        pass\n",
        {"top", "K"},
    ),
    "m.js": (
        (
            "function greet(n) {\n  return n;\n}\nclass Box {\n  get() { return 1; }\n}\n"
            "const add = (a, b) => a + b;\n"
        ),
        {"greet", "Box", "add"},
    ),
    "m.ts": (
        (
            "interface User { name: string }\nexport function getUserName(u: User): string {\n"
            "  return u.name;\n}\n"
        ),
        {"User", "getUserName"},
    ),
    "m.tsx": (
        "export const App = () => <div>hi</div>;\nfunction Card() { return <p/>; }\n",
        {"App", "Card"},
    ),
    "m.go": (
        (
            "package main\n\ntype Server struct { port int }\n\nfunc (s *Server) Start() error {\n"
            "\treturn nil\n}\n"
        ),
        {"Server", "Server.Start"},
    ),
    "m.rs": (
        (
            "struct Point { x: i32 }\nimpl Point {\n    fn norm(&self) -> i32 { self.x }\n}\n"
            "mod inner { pub fn helper() {} }\n"
        ),
        {"Point", "inner.helper"},
    ),
    "M.java": ("package p;\npublic class A {\n  public int getX() { return 1; }\n}\n", {"A"}),
    "m.c": ("#include <stdio.h>\nstatic int add(int a, int b) { return a + b; }\n", {"add"}),
    "m.cpp": (
        "namespace geo {\nclass Shape {\n public:\n  double area() const { return 0; }\n};\n}\n",
        {"geo.Shape"},
    ),
    "m.cs": (
        "namespace App {\n  public class Service {\n    public void Run() { }\n  }\n}\n",
        {"App.Service"},
    ),
    "m.rb": ("class Invoice\n  def total\n    1\n  end\nend\n", {"Invoice"}),
    "m.php": (
        (
            "<?php\nfunction helper() { return 1; }\nclass Controller {\n"
            "  public function index() { return 2; }\n}\n"
        ),
        {"helper", "Controller"},
    ),
}


@pytest.mark.parametrize("path", sorted(SOURCES))
def test_symbols_per_language(path: str) -> None:
    src, expected = SOURCES[path]
    chunks, language, method = chunk_file(WS, path, src)
    assert method == "symbols", (language, method)
    symbols = {c.symbol for c in chunks if c.source_kind == "symbol"}
    assert expected <= symbols
    for c in chunks:
        assert 1 <= c.start_line <= c.end_line <= src.count("\n")
        lines = src.split("\n")[c.start_line - 1 : c.end_line]
        assert c.text == "\n".join(lines)


@pytest.mark.parametrize(
    ("path", "methods"),
    [
        ("m.py", {"K.m"}),
        ("m.js", {"Box.get"}),
        ("M.java", {"A.getX"}),
        ("m.cpp", {"geo.Shape.area"}),
        ("m.cs", {"App.Service.Run"}),
        ("m.rb", {"Invoice.total"}),
        ("m.php", {"Controller.index"}),
        ("m.rs", {"Point.norm"}),
    ],
)
def test_large_class_splits_into_methods_and_header(path: str, methods: set[str]) -> None:
    src, _ = SOURCES[path]
    chunks, _, _ = chunk_file(WS, path, src, IndexOptions(max_symbol_lines=1))
    symbols = {c.symbol for c in chunks}
    assert methods <= symbols
    parent = next(iter(methods)).rsplit(".", 1)[0]
    header = [c for c in chunks if c.symbol == parent and c.source_kind == "symbol"]
    assert header, "a split class keeps a header chunk"


def test_python_big_class_by_line_budget() -> None:
    body = "".join(f"    def m{i}(self):\n        return {i}\n\n" for i in range(80))
    src = "class Big:\n    x = 1\n\n" + body
    chunks, _, _ = chunk_file(WS, "big.py", src)
    kinds = {(c.symbol, c.start_line) for c in chunks}
    assert ("Big", 1) in kinds
    assert ("Big.m0", 4) in kinds and ("Big.m79", 4 + 79 * 3) in kinds


def test_module_level_code_becomes_windows() -> None:
    src = "import os\nX = 1\n\ndef f():\n    pass\n\nprint(X)\n"
    chunks, _, _ = chunk_file(WS, "m.py", src)
    spans = [(c.start_line, c.end_line, c.source_kind) for c in chunks]
    assert spans == [(1, 2, "window"), (4, 5, "symbol"), (7, 7, "window")]


def test_markdown_sections_and_big_section_windows() -> None:
    src = "intro\n# Title\ntext\n## Install\npip install x\n```\n# not a heading\n```\n"
    chunks, language, method = chunk_file(WS, "README.md", src)
    assert (language, method) == ("markdown", "sections")
    assert [(c.symbol, c.start_line, c.end_line) for c in chunks] == [
        ("", 1, 1),
        ("Title", 2, 3),
        ("Title > Install", 4, 8),
    ]
    big = "# Big\n" + "line\n" * 300
    chunks, _, _ = chunk_file(WS, "b.md", big)
    assert len(chunks) > 1 and all(c.source_kind == "section" and c.symbol == "Big" for c in chunks)


def test_text_windows_with_overlap() -> None:
    src = "".join(f"line {i}\n" for i in range(1, 131))
    chunks, _, method = chunk_file(WS, "notes.txt", src)
    assert method == "windows"
    assert [(c.start_line, c.end_line) for c in chunks] == [(1, 60), (51, 110), (101, 130)]


@pytest.mark.parametrize(
    ("path", "head", "language"),
    [
        ("src/m.py", "", "python"),  # the grammars' own names first
        ("src/view.jsx", "", "javascript"),
        ("include/m.h", "", "c"),
        ("app/src/main/kotlin/Parser.kt", "", "kotlin"),  # identify's tables
        ("build.gradle.kts", "", "kotlin"),
        ("lib/app/router.ex", "", "elixir"),
        ("Sources/App/View.swift", "", "swift"),
        ("src/Lib.fs", "", "fsharp"),
        ("Classes/Thing.mm", "", "objcpp"),
        ("src/App.vue", "", "vue"),
        ("scripts/release.sh", "", "sh"),
        ("Makefile", "", "makefile"),  # well-known names
        ("CMakeLists.txt", "", "cmake"),
        ("docker/Dockerfile.dev", "", "dockerfile"),
        ("README", "", "text"),
        ("notes.txt", "", "text"),
        ("bin/deploy", "#!/usr/bin/env bash\nset -e\n", "bash"),  # the #! line
        ("scripts/sync", "#!/bin/sh -e\n", "sh"),
        ("tools/report", "#! /usr/bin/env python3\nprint(1)\n", "python"),
        ("bin/serve", "#!/usr/bin/env -S node --no-warnings\n", "javascript"),
        ("contrib/_fd", "#compdef fd\n", "text"),  # not a #! line
        ("README", "#!/bin/sh\n", "text"),  # the name says what it is
        ("bin/sync", "#!/usr/bin/env -S uv run --script\n", "python"),  # the first word naming one
        ("bin/gen", "#!/usr/bin/env -S npx tsx\n", "typescript"),
        ("bin/plot", "#!/usr/bin/env Rscript\n", "r"),
        ("bin/x", "#!/usr/bin/env\n", "text"),  # no interpreter
        ("lib/parse.rkt", "", "racket"),  # extensions identify lacks
        ("setup.cfg", "", "ini"),
        ("data.weird", "", "weird"),  # unknown: the extension itself
        ("LICENSE", "", "text"),
    ],
)
def test_language_by_extension_name_or_interpreter(path: str, head: str, language: str) -> None:
    assert chunking.language_for(path, head) == language


def test_an_extensionless_python_script_is_cut_by_its_symbols() -> None:
    src = "#!/usr/bin/env python3\nimport sys\n\n\ndef main():\n    return 0\n"
    chunks, language, method = chunk_file(WS, "bin/tool", src)
    assert (language, method) == ("python", "symbols")
    assert "main" in {c.symbol for c in chunks}
    _, language, method = chunk_file(WS, "bin/tool", "import sys\n\ndef main():\n    pass\n")
    assert (language, method) == ("text", "windows")  # without the #! line: plain text


_APACHE = "".join(f"// Licensed under the Apache License, line {i}.\n" for i in range(15))


@pytest.mark.parametrize(
    ("head", "generated"),
    [
        ("// Code generated by MockGen. DO NOT EDIT.\n// Source: store.go\npackage mocks\n", True),
        ('// Code generated by "stringer -type=Kind"; DO NOT EDIT.\n\npackage kind\n', True),
        (
            "/*\n"
            + _APACHE
            + "*/\n\n// Code generated by lister-gen. DO NOT EDIT.\n\npackage v1\n",
            True,
        ),
        ("# Generated by the protocol buffer compiler.  DO NOT EDIT!\n", True),
        ("# Generated by scripts/gen_protos.py from proto/. Do not edit.\n", True),
        ('// @generated by protoc-gen-es v2 with parameter "target=ts"\n', True),
        ("/* automatically generated by rust-bindgen 0.69.4 */\n// @generated\n", True),
        ("//------\n// <auto-generated>\n//     This code was generated by a tool.\n", True),
        ("#!/bin/sh\n# This file is automatically generated; do not edit it.\n", True),
        ("// GENERATED CODE - DO NOT MODIFY BY HAND\n\npart of 'user.dart';\n", True),
        (
            "/* AUTO-GENERATED FILE.  DO NOT MODIFY.\n *\n * This class was automatically generated\n",
            True,
        ),
        (
            "/*\n * Petstore\n * NOTE: This class is auto generated by OpenAPI Generator.\n"
            " * https://openapi-generator.tech\n * Do not edit the class manually.\n */\n",
            True,
        ),
        ("/* A Bison parser, made by GNU Bison 3.8.2.  */\n", True),
        ('"""The typed messages (generated by betterproto2; see _gen/)."""\n', False),
        ("# Please do not edit the list below by hand.\nITEMS = []\n", False),
        ("# DO NOT EDIT the list below by hand.\nITEMS = []\n", False),
        (
            '__version__ = "2.4.0"  # DO NOT EDIT THIS LINE MANUALLY. LET bump2version DO IT\n',
            False,
        ),
        ('HEADER = "// Code generated by gen.py. DO NOT EDIT.\\n"\n', False),  # a template
        ('@Generated("coverage")\npublic class Order {}\n', False),  # Java's annotation
        ("// @generatedAt is set by the build\n", False),
        ("x = 1\n" * 10 + "// Code generated by a tool. DO NOT EDIT.\n", False),  # after code
        ("", False),
    ],
)
def test_a_files_first_lines_say_whether_a_tool_generated_it(head: str, generated: bool) -> None:
    assert chunking.generated_header(head) is generated


@pytest.mark.parametrize(
    ("text", "options"),
    [
        # clap: derive attributes (fd's src/cli.rs) and the builder.
        ("#[arg(long, short = 'H')]\npub hidden: bool,\n#[clap(long)]\npub follow: bool,\n", 2),
        ('Command::new("x").arg(Arg::new("depth").long("max-depth"))\n', 1),
        # argparse, click, typer.
        ('p.add_argument("--verbose", action="store_true")\np.add_argument("path")\n', 2),
        ('@click.option("--name")\n@click.argument("src")\n@option("-v", count=True)\n', 3),
        ('def main(name: str = typer.Option("x"), n: int = typer.Argument(1)): ...\n', 2),
        # cobra / pflag and Go's flag package.
        (
            'cmd.Flags().BoolVarP(&v, "verbose", "v", false, "")\n'
            'root.PersistentFlags().String("config", "", "")\nport := flag.Int("port", 80, "")\n',
            3,
        ),
        # commander / yargs, picocli.
        (
            'program.option("-d, --debug", "output extra debugging").requiredOption("-c <path>")\n',
            2,
        ),
        (
            '@Option(names = {"-v"}) boolean verbose;\n@CommandLine.Parameters(index = "0") String file;\n',
            2,
        ),
        # Words about options are no definitions; nor is a method named option.
        ("# Options: --verbose prints more. See the help for every flag.\n", 0),
        ("settings.option(name)\nparser.parse_args()\n", 0),
    ],
)
def test_cli_options_counts_the_command_line_options_a_file_defines(
    text: str, options: int
) -> None:
    assert chunking.cli_options(text) == options


def test_missing_grammar_falls_back_to_windows(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(chunking, "_parser", lambda language: None)
    chunks, _, method = chunk_file(WS, "m.go", SOURCES["m.go"][0])
    assert method == "fallback:no-grammar"
    assert chunks and all(c.source_kind == "window" for c in chunks)


def test_parse_failure_falls_back_to_windows(monkeypatch: pytest.MonkeyPatch) -> None:
    class Broken:
        def parse(self, data: bytes) -> None:
            raise RuntimeError("boom")

    monkeypatch.setattr(chunking, "_parser", lambda language: Broken())
    chunks, _, method = chunk_file(WS, "m.py", SOURCES["m.py"][0])
    assert method == "fallback:parse-error"
    assert all(c.source_kind == "window" for c in chunks)


def test_chunk_ids_are_deterministic_and_text_redacted() -> None:
    src = 'def f():\n    api_key = "Zq9vLmX2pR7tK4wB"\n    return api_key\n'
    a, _, _ = chunk_file(WS, "s.py", src)
    b, _, _ = chunk_file(WS, "s.py", src)
    assert [c.chunk_id for c in a] == [c.chunk_id for c in b]
    assert "Zq9vLmX2pR7tK4wB" not in a[0].text and "[REDACTED:" in a[0].text
    other, _, _ = chunk_file("/other", "s.py", src)
    assert other[0].chunk_id != a[0].chunk_id


@pytest.mark.parametrize(
    "src",
    [
        # Lower-casing makes each "İ" two characters: the secret two lines down must
        # still be found on its own line.
        "# " + "İ" * 200 + "\nx = 1\npassword = 'Zq9vLmX2pR7tK4wB'\n",
        # Letters the rules' (?i) matches but lower-casing does not turn into ASCII.
        "tokenİ = 'Zq9vLmX2pR7tK4wB'\n",
        "ſecret = 'Zq9vLmX2pR7tK4wB'\n",
        # A key word that is not assigned, then a real assignment.
        "for key in d:\n    pass\napi_key = 'Zq9vLmX2pR7tK4wB'\n",
        # Key, "=" and value on lines of their own (the line path must reach the value).
        "[default]\naws_secret_access_key\n=\nZq9vLmX2pR7tK4wBZq9vLmX2pR7tK4wBabcdEFGH\n",
    ],
)
def test_secrets_redacted_next_to_unicode_and_unassigned_key_words(src: str) -> None:
    for path in ("s.py", "s.txt"):
        chunks, _, _ = chunk_file(WS, path, src)
        assert chunks and not any("Zq9vLmX2pR7tK4wB" in c.text for c in chunks), chunks
        assert any("[REDACTED:" in c.text for c in chunks)


def _fake_key_body(lines: int) -> list[str]:
    """Base64-shaped lines, each unique, as a PEM key's body has them."""
    return [
        f"MIIJ{i:04d}" + "QUJDREVGR0hJSktMTU5PUFFSU1RVVldYWVphYmNkZWZnaGlqa2xtbm9w"[:56]
        for i in range(lines)
    ]


@pytest.mark.parametrize("path", ["deploy-notes.txt", "RUNBOOK.md", "setup.py"])
def test_a_private_key_crossing_a_chunk_boundary_is_redacted_in_every_chunk(path: str) -> None:
    """Secrets are never indexed: a key block longer than a window leaves no line of its
    body in the chunk that starts after its BEGIN line, and every later line keeps its
    number (the block's replacement keeps its line breaks)."""
    body = _fake_key_body(50)
    prefix = "# notes\n" if path.endswith(".md") else ""
    head = "".join(f"setup note line {i}\n" for i in range(1, 31))
    if path.endswith(".py"):
        head = "".join(f"NOTE_{i} = {i}\n" for i in range(1, 31))
        key = 'KEY = """-----BEGIN RSA PRIVATE KEY-----\n' + "\n".join(body)
        key += '\n-----END RSA PRIVATE KEY-----"""\n'
    else:
        key = "-----BEGIN RSA PRIVATE KEY-----\n" + "\n".join(body)
        key += "\n-----END RSA PRIVATE KEY-----\n"
    src = prefix + head + key + "".join(f"after_{i} = {i}\n" for i in range(200))
    chunks, _, _ = chunk_file(WS, path, src)
    assert len(chunks) > 1
    lines = src.split("\n")
    for c in chunks:
        assert not any(b in c.text for b in body), (c.start_line, c.end_line)
        assert c.text.count("\n") == c.end_line - c.start_line
        for no, line in enumerate(c.text.split("\n"), c.start_line):
            if line.startswith("after_"):
                assert line == lines[no - 1]
    assert any("[REDACTED:private-key]" in c.text for c in chunks)


def test_a_heading_that_holds_a_secret_is_redacted_in_the_symbol() -> None:
    """Secrets are never indexed: a Markdown heading is a chunk's symbol (searched, shown
    with every hit and embedded), so it is redacted like the text."""
    token = "ghp_" + "Zq8Lw3Rt9Yx2Vb7Nm4Kp1Hs6Dj0Fg5Ac3Ee7"
    src = f"# Runbook\n\n## Deploy token {token}\n\nUse it to push.\n"
    chunks, _, _ = chunk_file(WS, "RUNBOOK.md", src)
    assert chunks and not any(token in c.symbol or token in c.text for c in chunks)
    assert any("[REDACTED:github-token]" in c.symbol for c in chunks)


def test_form_feed_does_not_shift_line_numbers() -> None:
    src = "x = 1\n\x0c\ndef f():\n    pass\n"
    chunks, _, _ = chunk_file(WS, "ff.py", src)
    assert any(c.symbol == "f" and c.start_line == 3 for c in chunks)
