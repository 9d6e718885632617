"""Each ranking signal of the code lane (code.rank) on its own, and together on small
real snippets indexed through the real indexer."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from knowledge_server import fts
from knowledge_server.code import chunking, indexer, memory, rank, search
from knowledge_server.code.chunking import language_for
from knowledge_server.code.embed import HashingEmbedder
from knowledge_server.code.index import CodeIndex
from knowledge_server.code.model import IndexOptions
from knowledge_server.code.store import vec_table_for

from tests.code_memory_paths import answers, both_ways


@pytest.mark.parametrize(
    ("path", "language", "kind"),
    [
        ("src/click/core.py", "python", "source"),
        ("tests/test_core.py", "python", "test"),
        ("command_test.go", "go", "test"),
        ("web/app.spec.ts", "typescript", "test"),
        ("conftest.py", "python", "test"),
        ("CHANGELOG.md", "markdown", "changelog"),
        ("docs/changes.rst", "rst", "changelog"),
        ("Cargo.lock", "lock", "lock"),
        ("go.sum", "sum", "lock"),
        ("vendor/github.com/x/y.go", "go", "generated"),
        ("server/_gen/knowledge/v1/search_pb2.py", "python", "generated"),
        ("docs/guide.md", "markdown", "docs"),
        ("README.md", "markdown", "docs"),
        ("doc/md_docs.go", "go", "source"),  # code under docs/ is code
        ("pyproject.toml", "toml", "config"),
        # Conventions of ecosystems the labelled sets do not have.
        ("app/src/main/kotlin/Parser.kt", "kotlin", "source"),
        ("app/src/test/kotlin/ParserTest.kt", "kotlin", "test"),
        ("src/main/java/org/x/Latest.java", "java", "source"),  # not a test class
        ("src/main/java/org/x/ParserTests.java", "java", "test"),
        ("src/it/java/org/x/ParserIT.java", "java", "test"),
        ("Tests/AppTests/ViewTests.swift", "swift", "test"),
        ("src/MyLib.Tests/ParserFacts.cs", "csharp", "test"),  # .NET test project
        ("integration-tests/run.py", "python", "test"),
        ("web/e2e/login.py", "python", "test"),
        ("src/app.e2e-spec.ts", "typescript", "test"),
        ("polls/tests.py", "python", "test"),  # Django
        ("src/walk/tests.rs", "rust", "test"),
        ("tests/test_generated.py", "python", "test"),  # a test, whatever it tests
        ("src/_pytest/python.py", "python", "source"),
        ("api/v1/service.pb.go", "go", "generated"),
        ("src/gen/knowledge/v1/search_pb.ts", "typescript", "generated"),
        ("lib/models/user.g.dart", "dart", "generated"),
        ("Forms/Main.Designer.cs", "csharp", "generated"),
        ("pkg/apis/v1/zz_generated.deepcopy.go", "go", "generated"),
        ("web/__generated__/schema.ts", "typescript", "generated"),
        ("buf.gen.yaml", "yaml", "config"),
        ("Package.resolved", "json", "lock"),
        ("gradle.lockfile", "lockfile", "lock"),
        ("npm-shrinkwrap.json", "json", "lock"),
        ("scripts/test", "sh", "script"),  # shell scripts: tooling
        ("bin/deploy", "bash", "script"),
        ("bin/tool", "python", "source"),
        ("lib/app/router.ex", "elixir", "source"),
        ("Makefile", "makefile", "config"),
        ("CMakeLists.txt", "cmake", "config"),
        ("README", "text", "docs"),
        ("guide/intro.adoc", "asciidoc", "docs"),
        ("website/pages/intro.mdx", "mdx", "docs"),  # a documentation site's page
        ("vignettes/intro.Rmd", "rmd", "docs"),
        ("lib/Parser.pod", "pod", "docs"),
        # Names that look like a convention but are code.
        ("src/main/java/com/squareup/javapoet/TypeSpec.java", "java", "source"),
        ("app/services/ab_test/assign.rb", "ruby", "source"),
        ("spring-test/src/main/java/org/x/MockMvc.java", "java", "source"),
        ("tokio-test/src/io.rs", "rust", "source"),
        ("IPython/core/history.py", "python", "source"),  # not a changelog
        ("pkg/release/release.go", "go", "source"),
        ("HISTORY.md", "markdown", "changelog"),
        ("packages/core/src/is_generated.ts", "typescript", "source"),
        # More test conventions.
        ("src/MyLib.IntegrationTests/ApiFactory.cs", "csharp", "test"),
        ("MyAppUITests/LaunchTests.swift", "swift", "test"),
        ("src/main/java/org/x/HTTPTest.java", "java", "test"),
        ("lib/src/testFixtures/java/org/x/Fakes.java", "java", "test"),
        ("base/strings/string_util_unittest.cc", "cpp", "test"),
        ("t/basic.t", "t", "test"),
        # Generated, lock, build and settings files.
        ("staging/src/k8s.io/api/core/v1/generated.proto", "proto", "generated"),
        ("bun.lockb", "lockb", "lock"),
        (".terraform.lock.hcl", "hcl", "lock"),
        ("Package.swift", "swift", "config"),
        ("build.gradle.kts", "kotlin", "config"),
        ("mix.exs", "elixir", "config"),
        ("Gemfile", "ruby", "config"),
        ("knowledge.gemspec", "ruby", "config"),
        ("web/jest.config.js", "javascript", "config"),
        ("web/.eslintrc.cjs", "javascript", "config"),
        ("setup.py", "python", "config"),
        (".npmrc", "text", "config"),
        ("requirements-dev.txt", "text", "config"),
        ("Procfile", "text", "config"),
    ],
)
def test_file_kind(path: str, language: str, kind: str) -> None:
    assert rank.file_kind(path, language) == kind


def test_a_file_that_says_a_tool_generated_it_is_generated_code() -> None:
    assert rank.file_kind("pkg/mocks/mock_store.go", "go", generated=True) == "generated"
    assert rank.file_kind("pkg/kind/kind_string.go", "go", generated=True) == "generated"
    assert rank.file_kind("pkg/kind/kind_string.go", "go") == "source"
    assert rank.file_kind("config/app.yaml", "yaml", generated=True) == "generated"
    # Tests, documents, lock files and changelogs keep their kinds.
    assert rank.file_kind("pkg/store/store_test.go", "go", generated=True) == "test"
    assert rank.file_kind("proto/README.md", "markdown", generated=True) == "docs"
    assert rank.file_kind("Cargo.lock", "cargo-lock", generated=True) == "lock"


@pytest.mark.parametrize(
    ("path", "head", "kind"),
    [
        ("app/src/main/kotlin/Parser.kt", "", "source"),
        ("lib/parser.ex", "", "source"),
        ("src/parser.erl", "", "source"),
        ("Sources/Parser/Parser.swift", "", "source"),
        ("src/Parser.hs", "", "source"),
        ("src/parser.ml", "", "source"),
        ("src/Parser.fs", "", "source"),
        ("src/parser.clj", "", "source"),
        ("src/Parser.scala", "", "source"),
        ("src/Parser.vb", "", "source"),
        ("src/parser.scm", "", "source"),
        ("src/parser.rkt", "", "source"),
        ("lisp/parser.el", "", "source"),
        ("src/parser.gleam", "", "source"),
        ("src/parser.jl", "", "source"),
        ("R/parser.R", "", "source"),
        ("lib/Parser.pm", "", "source"),
        ("src/parser.lua", "", "source"),
        ("src/parser.zig", "", "source"),
        ("src/parser.nim", "", "source"),
        ("src/parser.tcl", "", "source"),
        ("src/parser.dart", "", "source"),
        ("src/Parser.vue", "", "source"),
        ("src/Parser.svelte", "", "source"),
        ("Classes/Parser.m", "", "source"),
        ("Classes/Parser.mm", "", "source"),
        ("kernels/parse.cu", "", "source"),
        ("shaders/light.glsl", "", "source"),
        ("boot/start.s", "", "source"),
        ("contracts/Token.sol", "", "source"),
        ("db/parse.sql", "", "source"),
        ("bin/parse", "#!/usr/bin/env python3\n", "source"),
        ("bin/plot", "#!/usr/bin/env Rscript\n", "source"),
        ("scripts/release.sh", "", "script"),
        ("scripts/setup.zsh", "", "script"),
        ("scripts/env.fish", "", "script"),
        ("scripts/build.ps1", "", "script"),
        ("scripts/build.bat", "", "script"),
        ("scripts/old.ksh", "", "script"),
        ("bin/deploy", "#!/bin/bash\n", "script"),
        ("bin/sync", "#!/bin/dash\n", "script"),
        ("bin/win", "#!/usr/bin/env pwsh\n", "script"),
    ],
)
def test_the_kinds_read_the_chunkers_language_names(path: str, head: str, kind: str) -> None:
    """Every code language the chunker names is source, every shell a script: the
    lists of the two modules must agree."""
    assert rank.file_kind(path, language_for(path, head)) == kind


def test_shell_scripts_weigh_as_source_where_they_outnumber_it() -> None:
    """A repository of shell tools (nvm, pyenv): its scripts are the code."""
    mixed = rank.priors_for("find_code", ["list"], {"source": 30, "script": 4, "test": 6})
    assert mixed["script"] < mixed["source"]
    shell = rank.priors_for("find_code", ["list"], {"script": 12, "test": 9, "docs": 2})
    assert shell["script"] == shell["source"] > shell["test"]


def test_find_code_demotes_but_a_question_naming_the_kind_lifts_it() -> None:
    code = rank.priors_for("find_code", ["parse", "headers"])
    assert code["source"] == 1.0
    assert code["lock"] < code["changelog"] < code["docs"] < code["test"] < 1.0
    tests = rank.priors_for("find_code", ["tests", "for", "parse"])
    assert code["test"] < tests["test"] < tests["source"]  # lifted, still below the code
    assert tests["changelog"] == code["changelog"]
    knowledge = rank.priors_for("find_knowledge", ["parse"])
    assert knowledge["docs"] == 1.0 and knowledge["test"] == code["test"]
    assert code["script"] < 1.0  # shell scripts build, test and release the code
    scripts = rank.priors_for("find_code", ["release", "script"])
    assert code["script"] < scripts["script"] < scripts["source"]


def test_path_share_counts_the_question_weight_in_the_path_words() -> None:
    weights = {"url": 3.0, "parse": 1.0}
    assert rank.path_share("httpx/_urls.py", weights) == pytest.approx(0.75)  # stem: urls -> url
    assert rank.path_share("httpx/_client.py", weights) == 0.0
    assert rank.path_share("src/url_parse.rs", weights) == pytest.approx(1.0)
    assert rank.path_share("a.py", {}) == 0.0


def test_evidence_share_ignores_short_and_numeric_parts() -> None:
    weights = {"zstd": 4.0, "empty": 2.0, "05": 5.0, "c": 5.0}
    assert rank.evidence_share(weights, ["zstd"]) == pytest.approx(4 / 6)
    assert rank.evidence_share(weights, ["05", "c"]) == 0.0  # a UUID's parts show nothing
    # Nothing telling ("io", "x y z"): every term is judged, so a file holding none of them
    # shows nothing and one holding some answers their share of it.
    assert rank.evidence_share({"05": 1.0, "io": 2.0}, []) == 0.0
    assert rank.evidence_share({"05": 1.0, "io": 2.0}, ["io"]) == pytest.approx(2 / 3)
    assert rank.evidence_share({}, []) == 1.0  # no term at all: not judged


def test_evidence_share_weighs_a_held_word_at_least_its_least_weight() -> None:
    """A word in most files of a small repository (idf near 0) still shows the question is
    about it: cobra's "add getters for flag completions", where only "getters" is in no
    file, is not made up of that one word (SHARE_MIN_WEIGHT, SHARE_MIN_FRACTION)."""
    made_up = fts.bm25_idf(66, 0)  # cobra's 65 files: 4.89
    weights = {"add": 0.18, "getters": made_up, "flag": 0.12, "completions": 0.3}
    least = rank.least_weight(66)
    assert least == pytest.approx(rank.SHARE_MIN_FRACTION * made_up)
    assert rank.evidence_share(weights, ["add", "flag", "completions"]) < 0.12  # none
    share = rank.evidence_share(weights, ["add", "flag", "completions"], least=least)
    assert share == pytest.approx(3 * least / (3 * least + made_up))
    assert share > 0.3
    # In a larger store the least weight is SHARE_MIN_WEIGHT; an idf above it counts as it is.
    assert rank.least_weight(5000) == rank.SHARE_MIN_WEIGHT
    assert rank.judged_weights({"zstd": 4.0, "flag": 0.2, "io": 0.1}, 1.0) == {
        "zstd": 4.0,
        "flag": 1.0,
    }
    # Two made-up words outweigh a common one in a store of any size: in one of two files
    # a made-up word's idf is 1.61 only, and the least weight a fifth of it.
    for n_files in (2, 66, 5000):
        least = rank.least_weight(n_files)
        made_up = fts.bm25_idf(n_files, 0)
        weights = {"zentrik": made_up, "pexlith": made_up, "flag": 0.01}
        assert rank.evidence_share(weights, ["flag"], least=least) < 0.12, n_files


def test_a_uuids_or_hashs_parts_are_evidence_only_together() -> None:
    q = rank.opaque_ids("session 7F3C9A2E-1b4d-4e5f-9a8b-123456789abc failed")
    ((segments, slack),) = q.ids
    assert segments == ({"7f3c9a2e"}, {"1b4d"}, {"4e5f"}, {"9a8b"}, {"123456789abc", "abc"})
    assert slack == 1 and {"session", "failed"} <= q.free
    q = rank.opaque_ids("revert 9add3def7bad1fed, fixed in afb4669 (not 0x5f3759df)")
    assert [s for s, _ in q.ids] == [
        ({"9add3def7bad1fed", "add", "def", "bad", "fed"},),
        ({"afb4669", "afb"},),  # git's abbreviation
    ]
    # Names and short hex words are words; a UUID glued to a word is not a UUID (its last
    # group, a hash-like word of its own, is judged as one).
    assert rank.opaque_ids("getUserName dec2bcd sha256 abc123 deadbeef 0123456789").ids == ()
    glued = rank.opaque_ids("user_9b1e4c2d-3a5f-4e6b-8c7d-1f2e3d4c5b6a")
    assert glued.ids == (((frozenset({"1f2e3d4c5b6a"}),), 0),) and "3a5f" in glued.free
    uuid_terms = {"7f3c9a2e", "1b4d", "4e5f", "9a8b", "123456789abc", "abc"}
    weights = {"session": 1.0, **dict.fromkeys(uuid_terms, 2.0)}
    total = 1.0 + 2.0 * len(uuid_terms)
    ids = rank.opaque_ids("session 7f3c9a2e-1b4d-4e5f-9a8b-123456789abc")
    assert rank.evidence_share(weights, ["session", "1b4d", "4e5f"], ids) == 1.0 / total
    assert rank.evidence_share(weights, ["session", *uuid_terms], ids) == 1.0
    # A file with the UUID glued to a word ("session_7f3c9a2e-...") lacks its first group.
    assert (
        rank.evidence_share(weights, ["session", *uuid_terms - {"7f3c9a2e"}], ids)
        == (1.0 + 2.0 * 5) / total
    )
    assert rank.evidence_share(weights, ["1b4d"]) == 2.0 / total  # without the grouping


def test_a_term_an_id_shares_with_the_question_or_a_shown_id_keeps_its_credit() -> None:
    """A hash not shown takes away only its own terms: not a term another hash the file
    shows has too, in either order, nor a word the question also asks."""
    weights = {"good": 1.0, "bad": 1.0, "abc": 2.0, "abc1234": 3.0, "abc5678": 3.0}
    for text in ("good abc1234 bad abc5678", "bad abc5678 good abc1234"):
        ids = rank.opaque_ids(text)
        share = rank.evidence_share(weights, ["good", "bad", "abc", "abc1234"], ids)
        assert share == (1 + 1 + 2 + 3) / 10, text
    weights = {"revert": 1.0, "3fade12": 4.0, "fade": 2.0, "broke": 1.0}
    ids = rank.opaque_ids("revert 3fade12 which broke fade")
    assert rank.evidence_share(weights, ["fade"], ids) == 2.0 / 8


def test_score_files_divides_each_signal_by_its_best_and_applies_the_prior() -> None:
    files = [
        rank.FileEvidence(1, "src/decoders.py", "python", file_bm25=10.0, chunk_bm25=4.0),
        rank.FileEvidence(2, "tests/test_decoders.py", "python", file_bm25=12.0, chunk_bm25=5.0),
        rank.FileEvidence(3, "CHANGELOG.md", "markdown", file_bm25=6.0, chunk_bm25=5.0),
    ]
    weights = {"decoders": 1.0, "zstd": 1.0}
    s = rank.score_files(files, weights, rank.priors_for("find_code", weights))
    # The test file has more of the words, but the source file comes first for find_code.
    assert s[1] > s[2] > s[3]
    e = rank.BM25_EXPONENT
    both = rank.FILE_WEIGHT * (10 / 12) ** e + rank.CHUNK_WEIGHT * (4 / 5) ** e + rank.PATH_WEIGHT
    # (all three files are of one size: each gets the largest file's size factor)
    assert s[1] == pytest.approx(both * (1 + rank.SIZE_WEIGHT))
    # With a vote, vectors add to the evidence: a file only they found still ranks.
    files.append(rank.FileEvidence(4, "src/zstd.py", "python", vector=0.5))
    v = rank.score_files(files, weights, rank.priors_for("find_code", weights), 0.5)
    assert v[4] > 0 and v[1] > v[4]


def test_a_larger_file_with_the_same_evidence_ranks_first_but_size_never_outweighs_it() -> None:
    """The size signal: equal evidence, the file with more chunks first; on a log scale
    relative to the largest candidate, so a much better match still wins."""
    weights = {"walk": 1.0, "ignore": 1.0}
    priors = rank.priors_for("find_code", weights)
    big = rank.FileEvidence(1, "src/big.rs", "rust", file_bm25=8.0, chunk_bm25=4.0, n_chunks=60)
    small = rank.FileEvidence(2, "src/small.rs", "rust", file_bm25=8.0, chunk_bm25=4.0, n_chunks=3)
    s = rank.score_files([big, small], weights, priors)
    assert s[1] > s[2]
    assert s[1] / s[2] <= 1 + rank.SIZE_WEIGHT
    better = rank.FileEvidence(
        2, "src/small.rs", "rust", file_bm25=10.0, chunk_bm25=5.0, n_chunks=3
    )
    s = rank.score_files([big, better], weights, priors)
    assert s[2] > s[1]


def test_bm25_signals_are_compressed_so_a_path_match_can_decide() -> None:
    """BM25 enters as (score / best) ** BM25_EXPONENT: a file a quarter behind on BM25 but
    named after the question's word comes first (linearly it would stay behind)."""
    weights = {"hyperlink": 1.0}
    priors = rank.priors_for("find_code", weights)
    cli = rank.FileEvidence(1, "src/cli.rs", "rust", file_bm25=10.0, chunk_bm25=10.0)
    named = rank.FileEvidence(2, "src/hyperlink.rs", "rust", file_bm25=7.5, chunk_bm25=7.5)
    s = rank.score_files([cli, named], weights, priors)
    assert rank.BM25_EXPONENT < 1.0
    assert s[2] > s[1]
    linear = rank.FILE_WEIGHT * 0.75 + rank.CHUNK_WEIGHT * 0.75 + rank.PATH_WEIGHT
    assert linear < rank.FILE_WEIGHT + rank.CHUNK_WEIGHT  # what the exponent changes


@pytest.mark.parametrize(
    ("query", "kind", "rest"),
    [
        ("fix: handle empty zstd responses", "fix", "handle empty zstd responses"),
        ("feat(cli)!: add --cwd prefix", "feat", "cli add --cwd prefix"),
        ("Docs: clarify the exec option", "docs", "clarify the exec option"),
        ("walk: add a cache", "", "walk: add a cache"),  # a place, not a change type
        ("fix:nospace", "", "fix:nospace"),
        ("fix the parser: it drops a byte", "", "fix the parser: it drops a byte"),
        ("fix: ", "", "fix: "),  # nothing after it: the question stays as it is
    ],
)
def test_split_change_type(query: str, kind: str, rest: str) -> None:
    assert rank.split_change_type(query) == (kind, rest)


def test_a_leading_change_type_is_not_a_word_of_the_question(tmp_path: Path) -> None:
    """A leading "feat: " or "fix(scope): ": the type is rare in code, so as a word it would
    outweigh the question's real words; the scope stays a word."""
    root = tmp_path / "proj"
    _write(root, "src/flags.py", "FEAT = 'feat'\n\ndef feat_enabled(feat):\n    return feat\n")
    _write(root, "src/paths.py", "def strip_cwd_prefix(path):\n    return path.lstrip('./')\n")
    for noun in ("cookie", "session", "header", "proxy", "socket", "stream"):
        _write(root, f"src/{noun}s.py", f"def prefix_{noun}(path):\n    return path + '{noun}'\n")
    with CodeIndex(str(tmp_path / "data" / "code.sqlite")) as idx:
        idx.index_workspace(str(root))
        res = idx.search("feat(paths): strip cwd prefix", intent="find_code")
        assert "feat" not in res.terms and "paths" in res.terms
        assert res.hits[0].path == "src/paths.py"
        # As a word, "feat" would have put the file that only says "feat" second.
        paths = list(dict.fromkeys(h.path for h in res.hits))
        assert "src/flags.py" not in paths[:3]


def test_a_file_found_by_its_name_alone_with_no_chunk_is_no_error(tmp_path: Path) -> None:
    """An empty file is a file version without chunks; its path still matches a question
    ("zebra" finds ``src/zebra.py``). The search answers (with the files that have
    chunks) instead of failing while looking up the empty file's first chunk."""
    root = tmp_path / "proj"
    _write(root, "src/zebra.py", "")
    _write(root, "src/other.py", "def other():\n    return 1\n")
    with CodeIndex(str(tmp_path / "data" / "code.sqlite")) as idx:
        idx.index_workspace(str(root))
        for mode in ("hybrid", "lexical"):
            hits = idx.search("zebra", intent="find_code", mode=mode).hits
            assert all(h.path != "src/zebra.py" for h in hits)


@pytest.mark.parametrize(
    ("question", "named", "not_named"),
    [
        (
            "Use full names in command.rs",
            ["src/exec/command.rs", "command.rs"],
            ["src/mycommand.rs"],
        ),
        (
            "Correct a typo in doc/util.go",
            ["doc/util.go", "x/doc/util.go"],
            ["util.go", "src/util.go"],
        ),
        (
            "Add `pragma: no branch` in `middleware/exceptions.py`",
            ["starlette/middleware/exceptions.py"],
            ["starlette/exceptions.py"],
        ),
        (
            "annotations in `click.core`",
            ["src/click/core.py", "click/core/__init__.py"],
            ["src/core.py", "click/core_x.py"],
        ),
        (
            "rename exec::command",
            ["src/exec/command.rs", "src/exec/command/mod.rs"],
            ["src/command.rs"],
        ),
        # As a commit subject writes them: a module before ":", a path from "./" or the
        # root, with a line, or in Windows style; a module with a name after it.
        ("click.core: fix typo", ["src/click/core.py"], ["docs/click/core.md"]),
        ("exec::command: use full names", ["src/exec/command.rs"], ["src/command.rs"]),
        ("crate::exec::command::run", ["src/exec/command.rs"], ["src/run.rs"]),
        ("`click.core.Context`", ["src/click/core.py"], ["src/click/context.py"]),
        # A lower-case name alone in backticks is a module; a class or a path is not.
        (
            "Add type annotations for instance attributes in `formatting`",
            ["src/click/formatting.py", "pkg/formatting/__init__.py"],
            ["docs/formatting.md", "tests/test_formatting.py", "src/click/formatting_x.py"],
        ),
        ("Replace `dict` in `HTTPException`", [], ["starlette/httpexception.py", "dict.md"]),
        ("fix: formatting in `src/` and `tests/`", [], ["src/lib.rs", "tests/tests.rs"]),
        ("Avoid heavy imports in `__init__`", [], ["pkg/__init__.py", "pkg/a/__init__.py"]),
        ("the `main` loop", [], ["cmd/fd/main.go", "src/main.rs"]),
        ("edit ./src/main.rs:12 and ../lib/util.go", ["src/main.rs", "lib/util.go"], ["main.py"]),
        ("see /src/main.rs.", ["src/main.rs"], ["src/main.py"]),
        ("src\\exec\\command.rs", ["src/exec/command.rs"], ["tests/command.rs"]),
        (".gitignore, config/.env.example", [".gitignore", "config/.env.example"], [".env"]),
        ("archive.tar.gz", ["dist/archive.tar.gz"], ["archive/tar.py"]),
        # Well-known names without an extension, as written.
        ("Fix the Makefile's test target", ["Makefile", "docs/Makefile"], ["Makefile.am"]),
        ("base image in docker/Dockerfile", ["docker/Dockerfile"], ["Dockerfile", "x.docker"]),
        ("make the build faster", [], ["make", "build", "Makefile"]),
        # Not file names: a version, an abbreviation, a URL's path, an address, two words.
        (
            "bump to v1.2.3, e.g. for https://example.org/a/b.py, me@mail.org, client/server",
            [],
            ["v1.2.3", "v1/2/3.py", "a/b.py", "b.py", "mail.org", "client/server.py"],
        ),
    ],
)
def test_named_files_are_whole_names_from_a_directory_boundary(
    question: str, named: list[str], not_named: list[str]
) -> None:
    found = rank.named_files(question)
    for path in named:
        assert found.names(path), (question, path)
    for path in not_named:
        assert not found.names(path), (question, path)


def test_a_line_after_a_named_file_is_a_place_not_words() -> None:
    """ "config.py:445", "main.rs:12:5" (a column), "lib.rs#L10-L20": the file is named and
    the lines are where in it; they are cut from the words to look for ("L10" is in no
    file). A number after what is no file name stays a word."""
    named = rank.named_files("see ./src/main.rs:12:5, lib.rs#L10-L20 and config.py:445.")
    assert named.line("src/main.rs") == (12, 12)
    assert named.line("crates/x/lib.rs") == (10, 20)
    assert named.line("app/config.py") == (445, 445)
    assert named.line("src/other.rs") is None
    assert rank.named_files("config.py:0").line("config.py") is None
    assert rank.named_files("x.py:20-10").line("x.py") == (20, 20)
    assert rank.without_line_marks("why does config.py:100 fail?") == "why does config.py fail?"
    assert rank.without_line_marks("lib.rs#L10-L20, main.rs:3:1") == "lib.rs, main.rs"
    assert rank.without_line_marks("port:8080, ratio 3:2") == "port:8080, ratio 3:2"
    assert rank.without_line_marks("Makefile#L3-L4, Dockerfile:7") == "Makefile, Dockerfile"
    # Two names of one path: the longer says where, in whichever order they are written.
    for q in ("config.py:1 app/config.py:21", "app/config.py:21 config.py:1"):
        assert rank.named_files(q).line("app/config.py") == (21, 21), q
        assert rank.named_files(q).line("lib/config.py") == (1, 1), q


def test_a_path_written_from_the_root_names_that_workspaces_file_alone() -> None:
    """ "/home/ana/shop/src/app.py" (a traceback's path) is "src/app.py" of the workspace
    /home/ana/shop and of no other; a relative name matches in any workspace. A Python
    traceback's ``File "...", line N`` gives the line."""
    named = rank.named_files(
        'Traceback:\n  File "/home/ana/shop/src/app.py", line 12, in run\nand lib/util.py'
    )
    assert named.names("src/app.py", "/home/ana/shop")
    assert named.names("src/app.py", "/home/ana/shop/")
    assert not named.names("src/app.py", "/home/ana/other")
    assert named.line("src/app.py", "/home/ana/shop") == (12, 12)
    assert named.line("src/app.py", "/home/ana/other") is None
    assert named.names("lib/util.py", "/anywhere") and named.names("lib/util.py")
    assert rank.named_files("src/app.py:3").line("src/app.py", "/home/ana/shop") == (3, 3)
    # Of several frames in one file, the last (the call that failed) gives the line; a
    # quoted path is read whole, spaces and all.
    frames = (
        'File "/home/ana/my shop/app/config.py", line 9, in save\n'
        '  File "/home/ana/my shop/app/config.py", line 4, in load\n'
    )
    assert rank.named_files(frames).line("app/config.py", "/home/ana/my shop") == (4, 4)
    assert not rank.named_files(frames).names("app/config.py", "/home/ana/shop")
    assert rank.without_roots("in /home/ana/shop/src/app.py:3", ["/home/ana/shop/"]) == (
        "in /src/app.py:3"
    )


def test_a_named_file_gains_the_bonus_in_full_only_in_a_short_question() -> None:
    """rank.NAMED_WEIGHT: a short question naming a file is about it; in a question of more
    than NAMED_WORDS telling words the bonus is that share of it."""
    files = [
        rank.FileEvidence(1, "src/main.rs", "rust", file_bm25=10.0, chunk_bm25=5.0),
        rank.FileEvidence(2, "src/exec/command.rs", "rust", file_bm25=5.0, chunk_bm25=2.0),
    ]
    priors = rank.priors_for("find_code", [])
    short = {"full": 1.0, "names": 1.0, "command": 1.0}
    named = rank.named_files("full names in command.rs")
    plain = rank.score_files(files, short, priors)
    s = rank.score_files(files, short, priors, named=named)
    assert plain[1] > plain[2] and s[2] > s[1]
    assert s[2] - plain[2] == pytest.approx(rank.NAMED_WEIGHT * (1 + rank.SIZE_WEIGHT))
    assert s[1] == plain[1]
    # The name counts as one word: the parts of a long path do not make the question long.
    path = rank.named_files("fix the typo in the error message of src/exec/command.rs")
    parts = {t: 1.0 for t in ("fix", "typo", "error", "message", "src", "exec", "command", "rs")}
    assert rank.score_files(files, parts, priors, named=path)[2] - rank.score_files(
        files, parts, priors
    )[2] == pytest.approx(rank.NAMED_WEIGHT * (1 + rank.SIZE_WEIGHT))
    long = {f"word{i}": 1.0 for i in range(int(rank.NAMED_WORDS) * 2 - 1)}
    bonus = (
        rank.score_files(files, long, priors, named=named)[2]
        - rank.score_files(files, long, priors)[2]
    )
    assert bonus == pytest.approx(rank.NAMED_WEIGHT * (1 + rank.SIZE_WEIGHT) / 2)


def test_a_question_naming_a_file_finds_it_though_its_words_are_everywhere(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """fd's "Use full names in command.rs": "command" is in most files, so the path signal
    is small; the file the question names still comes first (and did not without it)."""
    root = tmp_path / "proj"
    _write(
        root,
        "src/exec/command.rs",
        "use std::process::Command;\n\n/// Runs the command with its full argument list.\n"
        "pub fn execute(cmd: &mut Command) -> Output {\n    cmd.output()\n}\n",
    )
    for name in ("main", "cli", "walk", "config", "output"):
        _write(
            root,
            f"src/{name}.rs",
            f"// use full command names for {name}\npub fn {name}_command(names: &[String]) -> Command {{\n"
            f'    let command = Command::new(names.join(" "));\n    command // full names\n}}\n',
        )
    with CodeIndex(str(tmp_path / "data" / "code.sqlite")) as idx:
        idx.index_workspace(str(root))
        assert _paths(idx, "Use full names in command.rs")[0] == "src/exec/command.rs"
        monkeypatch.setattr(rank, "NAMED_WEIGHT", 0.0)
        assert _paths(idx, "Use full names in command.rs")[0] != "src/exec/command.rs"


def test_kotlin_source_comes_ahead_of_its_test_docs_and_scripts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A language the labelled sets do not have: the Kotlin class comes first, ahead of its
    test (which repeats the words more), the document and the shell script; it did not
    while the chunker's language for .kt was no source language."""
    root = tmp_path / "proj"
    _write(
        root,
        "src/main/kotlin/org/acme/RetryPolicy.kt",
        "package org.acme\n\n/** Exponential backoff between retries. */\n"
        "class RetryPolicy(private val base: Long) {\n"
        "    fun delay(attempt: Int): Long = base shl attempt\n}\n",
    )
    _write(
        root,
        "src/test/kotlin/org/acme/RetryPolicyTest.kt",
        "package org.acme\n\n/** The retry policy's exponential backoff delay. */\n"
        "class RetryPolicyTest {\n"
        "    // exponential backoff: the delay doubles with each retry\n"
        "    fun exponentialBackoffDelayDoubles() = check(RetryPolicy(1).delay(1) == 2L)\n"
        "    // the first retry's backoff delay is the base delay of the policy\n"
        "    fun retryPolicyFirstDelay() = check(RetryPolicy(1).delay(0) == 1L)\n}\n",
    )
    _write(root, "docs/retries.md", "# Retries\n\nThe retry policy's backoff delay doubles.\n")
    _write(
        root,
        "scripts/retry-tests.sh",
        "#!/bin/sh\n# retry flaky tests with a backoff delay\nsleep 1 && ./gradlew test\n",
    )
    with CodeIndex(str(tmp_path / "data" / "code.sqlite")) as idx:
        idx.index_workspace(str(root))
        question = "exponential backoff delay of the retry policy"
        assert _paths(idx, question)[0] == "src/main/kotlin/org/acme/RetryPolicy.kt"
        monkeypatch.setattr(rank, "SOURCE_LANGUAGES", rank.SOURCE_LANGUAGES - {"kotlin"})
        rank._path_kind.cache_clear()  # kinds are remembered per path
        try:
            assert _paths(idx, question)[0] != "src/main/kotlin/org/acme/RetryPolicy.kt"
        finally:
            monkeypatch.undo()
            rank._path_kind.cache_clear()


def test_in_a_repository_of_shell_tools_the_script_comes_ahead_of_its_test(
    tmp_path: Path,
) -> None:
    """nvm: the code is nvm.sh; its tests are shell scripts too, and say the words more."""
    root = tmp_path / "nvm"
    _write(
        root,
        "nvm.sh",
        "#!/usr/bin/env bash\n# Node Version Manager\n\n"
        "nvm_ls_remote() {\n  # list the remote versions from the mirror's index\n"
        '  nvm_download -L -s "$(nvm_get_mirror)/index.tab" -o -\n}\n',
    )
    _write(
        root,
        "test/fast/nvm_ls_remote.sh",
        "#!/bin/sh\n# nvm_ls_remote lists the remote versions from the mirror index\n"
        ". ../../nvm.sh\n# remote versions: the mirror index lists them\n"
        'nvm_ls_remote | grep -q "v0.1" || die "remote versions missing from the mirror index"\n',
    )
    _write(root, "README.md", "# nvm\n\nList the remote versions with `nvm ls-remote`.\n")
    with CodeIndex(str(tmp_path / "data" / "code.sqlite")) as idx:
        idx.index_workspace(str(root))
        assert _paths(idx, "list remote versions from the mirror index")[0] == "nvm.sh"


def _find_code_both_ways(idx: CodeIndex, *questions: str) -> list[list[Any]]:
    """Each question asked as find_code through SQL and from the copy in memory (built
    here): both give the same hits. SQL's hits, a list per question."""
    memory.warm(idx.conn, wait=True)
    out = []
    try:
        for question in questions:
            by_sql, from_copy, used = both_ways(idx, question, intent="find_code")
            assert used and by_sql == from_copy, question
            out.append(by_sql)
    finally:
        memory.forget(idx.conn.filename)
    return out


def test_a_mock_that_says_it_was_generated_comes_after_the_code_it_mocks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """MockGen's mock repeats every method name of the interface, more often than the
    code does; its "Code generated ... DO NOT EDIT." line demotes it (SQL and the copy in
    memory alike). Without the check, the mock came first."""
    root = tmp_path / "svc"
    _write(
        root,
        "pkg/store/store.go",
        "package store\n\n// SaveOrder writes the order and its lines in one transaction.\n"
        "func (s *Store) SaveOrder(o Order) error {\n\treturn s.tx(func() error { return nil })\n}\n",
    )
    mock = "".join(
        f"// SaveOrder mocks base method {i}.\nfunc (m *MockStore{i}) SaveOrder(o Order) error {{\n"
        f'\tret := m.ctrl.Call(m, "SaveOrder", o) // order\n\treturn ret[0].(error)\n}}\n\n'
        for i in range(3)
    )
    _write(
        root,
        "pkg/mocks/mock_store.go",
        "// Code generated by MockGen. DO NOT EDIT.\n// Source: store.go\n\npackage mocks\n\n"
        + mock,
    )
    question = "where is the order saved (SaveOrder)"
    with CodeIndex(str(tmp_path / "data" / "code.sqlite")) as idx:
        idx.index_workspace(str(root))
        (by_sql,) = _find_code_both_ways(idx, question)
        assert by_sql[0][1] == "pkg/store/store.go"
        assert any("generated file: weighs" in w for h in by_sql for w in h[4])
    monkeypatch.setattr(indexer, "generated_header", lambda text: False)
    with CodeIndex(str(tmp_path / "data2" / "code.sqlite")) as idx:
        idx.index_workspace(str(root))
        assert _paths(idx, question)[0] == "pkg/mocks/mock_store.go"


# A command line defined with clap's derive attributes, as fd's src/cli.rs does.
_CLAP = "".join(
    f"    /// {doc}\n    #[arg(long = \"{name}\", short = '{name[0]}')]\n    pub {name.replace('-', '_')}: bool,\n\n"
    for name, doc in (
        ("hidden", "Include hidden directories and files in the search results."),
        ("no-ignore", "Show search results from files and directories that would be ignored."),
        ("follow", "Follow symbolic links."),
        ("full-path", "Match the pattern against the full path instead of the file name."),
        ("absolute-path", "Show the absolute instead of the relative path."),
        ("list-details", "Use a long listing format with file metadata."),
        ("null", "Separate search results by the null character."),
        ("max-depth", "Set the maximum search depth."),
        ("exclude", "Exclude entries that match the given glob pattern."),
        ("color", "Declare when to use color for the pattern match output."),
    )
)


def test_a_question_about_options_lifts_the_file_that_defines_the_command_line(
    tmp_path: Path,
) -> None:
    """CLI_WEIGHT: the source file that declares a program's options (chunking.cli_options)
    comes first for a question about an option's help, ahead of the code that reads the
    option more often; a question without a word of the command line keeps the order of
    its words (SQL and the copy in memory alike)."""
    root = tmp_path / "finder"
    _write(
        root,
        "src/cli.rs",
        "use clap::Parser;\n\n#[derive(Parser)]\npub struct Opts {\n" + _CLAP + "}\n",
    )
    steps = "".join(
        f"fn step_{i}(queue: &mut Vec<DirEntry>, depth: usize) -> usize {{\n"
        f"    queue.truncate(depth + {i});\n    queue.len()\n}}\n\n"
        for i in range(12)
    )
    _write(
        root,
        "src/walk.rs",
        "pub fn walk(opts: &Opts, queue: &mut Vec<DirEntry>) {\n"
        "    for entry in queue.drain(..) {\n        // skip dot entries unless asked for\n"
        "        if !opts.hidden && entry.is_dot() {\n            continue;\n        }\n"
        "        send(entry);\n    }\n}\n\n" + steps,
    )
    _fillers(root, 8)
    assert chunking.cli_options((root / "src/cli.rs").read_text()) == 10
    with CodeIndex(str(tmp_path / "data" / "code.sqlite")) as idx:
        idx.index_workspace(str(root))
        about, other = _find_code_both_ways(
            idx, "clarify the help of --hidden", "skip hidden entries"
        )
        assert about[0][1] == "src/cli.rs", about[:3]
        assert "defines 10 command-line options" in about[0][4]
        assert other[0][1] == "src/walk.rs", other[:3]


@pytest.mark.parametrize(
    ("question", "names"),
    [
        ("Add generic type parameters to FormData", {"FormData"}),
        (
            "Fix `HelpFormatter.write_usage` producing spurious characters",
            {"HelpFormatter.write_usage", "HelpFormatter", "write_usage"},
        ),
        ("Use `ParamSpec` for `run_in_threadpool`", {"ParamSpec", "run_in_threadpool"}),
        (
            "Replace `dict` by `Mapping` on `HTTPException.headers`",
            {"dict", "Mapping", "HTTPException.headers", "HTTPException", "headers"},
        ),
        ("handle empty bytes in echo", set()),  # prose
        ("Fix `a b` and `x`", set()),  # not names, too short
    ],
)
def test_written_identifiers_are_the_names_a_question_writes_as_code(
    question: str, names: set[str]
) -> None:
    assert rank.written_identifiers(question) == names


def test_the_one_file_that_defines_a_written_name_is_raised(tmp_path: Path) -> None:
    """DEFINED_WEIGHT: "Touch up types in MutableHeaders" is about the file that defines
    MutableHeaders, not the one that uses it as much (SQL and the copy in memory alike;
    without the weight, web/responses.py came first); a name two files define raises
    neither."""
    root = tmp_path / "web"
    _write(
        root,
        "web/datastructures.py",
        "class Headers:\n    def get(self, key):\n        return self._list.get(key)\n\n\n"
        "class MutableHeaders(Headers):\n    def __setitem__(self, key, value: str) -> None:\n"
        "        self._list[key] = value\n",
    )
    _write(
        root,
        "web/responses.py",
        "def init_headers(self, headers):\n    self.headers = MutableHeaders(raw=headers)\n"
        "    return self.headers\n",
    )
    _fillers(root, 8)
    question = "Touch up types in MutableHeaders"
    with CodeIndex(str(tmp_path / "data" / "code.sqlite")) as idx:
        idx.index_workspace(str(root))
        (by_sql,) = _find_code_both_ways(idx, question)
        assert by_sql[0][1] == "web/datastructures.py", by_sql[:2]
        assert "defines a name the question writes" in by_sql[0][4]
        # A second file defining the name: neither is raised.
        _write(root, "web/compat.py", "class MutableHeaders(dict):\n    pass\n")
        idx.index_workspace(str(root))
        hits = idx.search(question, intent="find_code").hits
        assert hits and not any("defines a name the question writes" in h.why for h in hits)


def test_with_stems_adds_the_stems_that_differ() -> None:
    assert rank.with_stems(["loaded", "config"]) == ["loaded", "config", "load"]
    assert rank.with_stems(["timestamps"]) == ["timestamps", "timestamp"]


def _write(root: Path, rel: str, text: str) -> None:
    p = root / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)


@pytest.fixture
def project(tmp_path: Path) -> tuple[CodeIndex, Path]:
    """A small project: source, its tests, a changelog and docs that repeat its words."""
    root = tmp_path / "proj"
    _write(
        root,
        "httpkit/decoders.py",
        "class ZstdDecoder:\n    def decode(self, data: bytes) -> bytes:\n"
        "        if not data:  # an empty response body\n            return b''\n        return self._zstd.decompress(data)\n\n"
        "def get_decoder(encoding: str):\n    return DECODERS[encoding]()\n",
    )
    _write(
        root,
        "httpkit/_urls.py",
        "def join_url(base: str, path: str) -> str:\n    return base.rstrip('/') + '/' + path\n",
    )
    _write(
        root,
        "httpkit/config.py",
        "import tomllib\n\ndef load_config(path):\n    with open(path, 'rb') as f:\n"
        "        return tomllib.load(f)\n",
    )
    _write(
        root,
        "tests/test_decoders.py",
        "from httpkit.decoders import ZstdDecoder\n\ndef test_empty_zstd_response():\n"
        "    assert ZstdDecoder().decode(b'') == b''  # empty zstd response\n\n"
        "def test_zstd_response():\n    assert ZstdDecoder().decode(ZSTD) == b'x'  # zstd response\n",
    )
    _write(
        root,
        "CHANGELOG.md",
        "# Changes\n\n- Handle empty zstd responses (empty zstd body).\n- Fix zstd decoder response.\n",
    )
    _write(root, "docs/urls.md", "# URLs\n\nHow a URL is joined: join_url joins base and path.\n")
    # The rest of the project: BM25 weighs a word by how few files have it, and in a
    # project of six files every word is in half of them.
    _fillers(root, 8)
    idx = CodeIndex(str(tmp_path / "data" / "code.sqlite"))
    idx.index_workspace(str(root))
    return idx, root


def _fillers(root: Path, n: int) -> None:
    """``n`` small modules of other words (up to 8)."""
    nouns = ("cookie", "session", "header", "timeout", "proxy", "retry", "socket", "stream")
    verbs = ("store", "expire", "merge", "raise", "route", "count", "close", "read")
    for i, (noun, verb) in enumerate(zip(nouns[:n], verbs[:n], strict=True)):
        _write(
            root,
            f"httpkit/_{noun}s.py",
            f"def {verb}_{noun}(value):\n    return {verb}({noun}, value)  # {i}\n",
        )


def _paths(idx: CodeIndex, query: str, **kw: object) -> list[str]:
    out: list[str] = []
    for h in idx.search(query, intent="find_code", **kw).hits:  # type: ignore[arg-type]
        if h.path not in out:
            out.append(h.path)
    return out


def test_source_file_ahead_of_its_tests_and_the_changelog(project: tuple[CodeIndex, Path]) -> None:
    idx, _ = project
    paths = _paths(idx, "Handle empty zstd responses")
    assert paths[0] == "httpkit/decoders.py"
    # Demoted, never hidden.
    assert {"tests/test_decoders.py", "CHANGELOG.md"} <= set(paths)
    # A question naming the tests finds them ahead of the changelog.
    named = _paths(idx, "tests for empty zstd responses")
    assert named.index("tests/test_decoders.py") < named.index("CHANGELOG.md")


def test_path_words_and_stems(project: tuple[CodeIndex, Path]) -> None:
    idx, _ = project
    assert _paths(idx, "URL")[0] == "httpkit/_urls.py"  # the file name, stemmed
    hits = idx.search("where is the config loaded", intent="find_code").hits
    assert (hits[0].path, hits[0].symbol) == ("httpkit/config.py", "load_config")
    assert any(w.startswith("lex: ") and "load" in w for w in hits[0].why)


def test_a_question_with_no_answer_in_the_code_gets_no_items(
    project: tuple[CodeIndex, Path],
) -> None:
    """The relevance floor: made-up words and a UUID return nothing, in every mode that
    ranks files (the offline vectors alone would always return something)."""
    idx, _ = project
    for query in ("qzxvbn florbix", str(uuid.UUID(int=7 << 100 | 12345)), "0x5f3759df"):
        for mode in ("hybrid", "lexical"):
            assert idx.search(query, mode=mode).hits == [], (query, mode)
    # A real question just above the floor still answers.
    assert idx.search("zstd decoder").hits


def test_each_returned_file_holds_a_telling_word_or_stands_out_by_its_vectors(
    tmp_path: Path,
) -> None:
    """The floor per hit (search.HIT_FLOOR, HIT_VEC_Z): a file that only a two-letter word
    of the question brought is not returned once the question has a telling word, nor is one
    whose similarity is about that of any chunk; a question of short words only ("io") is
    judged by them and finds the file that holds them."""
    root = tmp_path / "p"
    _write(
        root,
        "httpkit/decoders.py",
        "class ZstdDecoder:\n    def decode(self, data):\n        return self._zstd.decompress(data)\n",
    )
    _write(root, "httpkit/_io.py", "import io\n\ndef wrap(fp):\n    return io.BufferedReader(fp)\n")
    _fillers(root, 6)
    with CodeIndex(str(tmp_path / "data" / "code.sqlite")) as idx:
        idx.index_workspace(str(root))
        assert _paths(idx, "decompress zstd io", mode="lexical") == ["httpkit/decoders.py"]
        hybrid = _paths(idx, "decompress zstd io", mode="hybrid")
        assert hybrid[0] == "httpkit/decoders.py" and "httpkit/_sessions.py" not in hybrid
        assert _paths(idx, "io", mode="lexical") == ["httpkit/_io.py"]


def test_a_made_up_uuid_gets_no_items_though_its_groups_are_in_files(
    project: tuple[CodeIndex, Path],
) -> None:
    """The relevance floor with UUIDs and hashes: a made-up UUID whose four-digit groups each
    occur in some file (in a repository of IDs and hashes they often do), or a made-up hash
    whose letter runs are words of the code, returns nothing; an ID a file holds whole finds
    that file. The same through SQL and from the copy in memory."""
    idx, root = project
    _write(root, "httpkit/ids.py", 'KNOWN = ["1b4d", "4e5f", "9a8b"]  # parts of other ids\n')
    _write(root, "httpkit/cafe.py", "def add(bad, fed):\n    return bad + fed  # cafe\n")
    _write(root, "httpkit/anim.py", "def fade(frames):\n    return frames[::-1]\n")
    _write(root, "httpkit/store.py", 'KEY = "session_0a9b8c7d-1111-4e2f-9abc-00ff00ff00ff"\n')
    _write(
        root,
        "httpkit/fixture.py",
        'SESSION_ID = "5d0c2a1e-77aa-4b3c-8e21-0f9e8d7c6b5a"\nBASE = "4679e48e9ebd443d3d9a"\n',
    )
    idx.index_workspace(str(root))
    memory.warm(idx.conn, wait=True)
    try:
        by_sql, from_copy, used = both_ways(idx, "7f3c9a2e-1b4d-4e5f-9a8b-123456789abc")
        assert used and by_sql == from_copy == []
        by_sql, from_copy, used = both_ways(idx, "revert 9add3def7bad1fed00cafe")
        assert used and by_sql == from_copy == []
        for q, where in (
            ("where is 5d0c2a1e-77aa-4b3c-8e21-0f9e8d7c6b5a", "httpkit/fixture.py"),
            ("4679e48e9ebd443d3d9a", "httpkit/fixture.py"),
            ("0a9b8c7d-1111-4e2f-9abc-00ff00ff00ff", "httpkit/store.py"),  # glued in the file
            ("revert 3fade12 which broke fade", "httpkit/anim.py"),  # "fade" is asked too
        ):
            by_sql, from_copy, used = both_ways(idx, q)
            assert used and by_sql == from_copy and by_sql[0][1] == where, q
    finally:
        memory.forget(idx.conn.filename)


def test_a_question_of_stopwords_alone_gets_no_items(project: tuple[CodeIndex, Path]) -> None:
    """A question of stopwords alone ("what is this") names nothing to look for. Its
    words are in every file, so each file held all of the question and the offline
    vectors' nearest chunks were returned; now it gets no items, through SQL and from the
    copy in memory, for find_code and find_knowledge alike. A word written as code still
    counts, even a stopword."""
    idx, root = project
    _write(root, "httpkit/notes.py", "# what is this for? it is where this is done\nthis = 1\n")
    idx.index_workspace(str(root))
    memory.warm(idx.conn, wait=True)
    try:
        for q in (
            "what is this",
            "where is it",
            "what is this for?",
            "what's this",
            "`whatIsThis`",
        ):
            for intent in ("find_code", "find_knowledge"):
                by_sql, from_copy, _ = both_ways(idx, q, intent=intent)
                assert by_sql == from_copy == [], (q, intent)
        by_sql, from_copy, _ = both_ways(idx, "where is `this` set")
        assert by_sql == from_copy and by_sql[0][1] == "httpkit/notes.py"
    finally:
        memory.forget(idx.conn.filename)


def test_a_file_named_with_a_line_answers_first_with_the_chunk_there(
    project: tuple[CodeIndex, Path],
) -> None:
    """ "routes.py:12" is a place: the named file's chunk holding line 12 comes first, whatever
    its words; a line between two chunks gets the nearest within search.LINE_SLACK; a
    range written "#L12-L13" is found though "L12" is in no file; a line past the file's end
    leaves the ranking as it was. The same through SQL and from the copy in memory."""
    idx, root = project
    funcs = ["def add_route(app, path):\n    app.routes.append(path)\n"]
    funcs.append("def remove_route(app, path):\n    app.routes.remove(path)\n")
    funcs.append("\n\n\n\n# routes that\n# match nothing\n")
    funcs.append("def match_route(app, path):\n    return path in app.routes\n")
    _write(root, "httpkit/routes.py", "\n\n".join(funcs))
    lines = (root / "httpkit" / "routes.py").read_text().splitlines()
    match = lines.index("def match_route(app, path):") + 1
    idx.index_workspace(str(root))
    memory.warm(idx.conn, wait=True)
    try:
        for q in (f"httpkit/routes.py:{match + 1}", f"routes.py#L{match}-L{match + 1} path"):
            by_sql, from_copy, used = both_ways(idx, q)
            assert used and by_sql == from_copy, q
            assert by_sql[0][1:3] == ("httpkit/routes.py", match), q
            assert "at the line the question names" in by_sql[0][4], q
        # Blank lines between chunks: the nearest one (remove_route ends at 6, the
        # comment starts at 13).
        comment = lines.index("# routes that") + 1
        remove = lines.index("def remove_route(app, path):") + 1
        for gap, start in ((remove + 4, remove), (comment - 2, comment)):
            by_sql, from_copy, _ = both_ways(idx, f"routes.py:{gap}")
            assert by_sql == from_copy and by_sql[0][1:3] == ("httpkit/routes.py", start), gap
        # A range over several chunks: the one holding most of it, not the smallest
        # that touches it.
        body = "def long_route(app):\n" + "".join(f"    step_{i}(app)\n" for i in range(28))
        _write(root, "httpkit/long.py", body + "\n\ndef tiny():\n    pass\n")
        idx.index_workspace(str(root))
        memory.warm(idx.conn, wait=True)
        tiny = (root / "httpkit" / "long.py").read_text().splitlines().index("def tiny():") + 1
        by_sql, from_copy, _ = both_ways(idx, f"httpkit/long.py#L2-L{tiny + 1}")
        assert by_sql == from_copy and by_sql[0][1:3] == ("httpkit/long.py", 1)
        past, plain = answers(idx, "routes.py:9999"), answers(idx, "routes.py")
        assert [a[:4] for a in past] == [a[:4] for a in plain]
        assert not any("at the line" in w for a in past for w in a[4])
    finally:
        memory.forget(idx.conn.filename)


def test_a_traceback_path_names_the_file_of_its_workspace_at_its_line(
    project: tuple[CodeIndex, Path], tmp_path: Path
) -> None:
    """Two workspaces hold httpkit/config.py. A traceback's absolute path names the one in
    the workspace it lies under: that file answers first, with the chunk at the traceback's
    line; the other workspace's copy gets no bonus and no line. The same through SQL and
    from the copy in memory."""
    idx, root = project
    other = tmp_path / "copy"
    _write(other, "httpkit/config.py", (root / "httpkit" / "config.py").read_text())
    _write(other, "httpkit/_pad.py", "def pad(x):\n    return x\n")
    idx.index_workspace(str(other))
    memory.warm(idx.conn, wait=True)
    q = f'File "{root.resolve()}/httpkit/config.py", line 4, in load_config'
    try:
        # The root's folder names are in no file: not words of the question, or they would
        # sink it below the relevance floor in a small workspace.
        placed = answers(idx, f"KeyError in {root.resolve()}/httpkit/config.py:4")
        assert placed and placed[0][1] == "httpkit/config.py"
        by_sql, from_copy, used = both_ways(idx, q)
        assert used and by_sql == from_copy
        res = idx.search(q, check_fresh=False, intent="find_code")
        first = res.hits[0]
        assert (first.workspace, first.path) == (str(root.resolve()), "httpkit/config.py")
        assert first.start_line <= 4 <= first.end_line
        assert "at the line the question names" in first.why
        assert not any(
            "at the line" in w
            for h in res.hits
            if h.workspace != str(root.resolve())
            for w in h.why
        )
    finally:
        memory.forget(idx.conn.filename)


def test_hits_are_lines_that_exist_in_the_indexed_file(project: tuple[CodeIndex, Path]) -> None:
    """Every returned path:start_line-end_line exists in the indexed revision."""
    idx, root = project
    for query in ("Handle empty zstd responses", "join url", "load config", "changes"):
        for h in idx.search(query, limit=20).hits:
            lines = (root / h.path).read_text().splitlines()
            assert 1 <= h.start_line <= h.end_line <= len(lines)
            rec = idx.get_chunk(h.id)
            assert rec is not None and rec.text.splitlines() == lines[h.start_line - 1 : h.end_line]


def test_the_readme_question_finds_load_config(tmp_path: Path) -> None:
    """The README's example question, on the service's own tree (its default workspace),
    answers with ``load_config`` first or second."""
    idx = CodeIndex(str(tmp_path / "code.sqlite"))
    try:
        idx.index_workspace(str(Path(__file__).resolve().parent.parent))
        hits = idx.search("where is the config loaded", intent="find_code").hits
        assert "load_config" in [h.symbol for h in hits[:2]], [(h.path, h.symbol) for h in hits[:5]]
    finally:
        idx.close()


def test_the_vectors_baseline_follows_vectors_filled_in_later(tmp_path: Path) -> None:
    """search._vec_baseline's sample is read again when vectors are filled in for chunks
    indexed before (their ids lie below the table's highest): the revisions' count of
    chunks without vectors is part of its key."""
    emb = HashingEmbedder()
    a, b = tmp_path / "a", tmp_path / "b"
    _fillers(a, 8)
    _fillers(b, 4)
    with CodeIndex(str(tmp_path / "data" / "code.sqlite"), embedder=emb) as idx:
        idx.index_workspace(str(a), options=IndexOptions(fill_vectors=False))
        idx.index_workspace(str(b))
        vtbl = vec_table_for(idx.conn, emb.identity, emb.dim, create=False)
        assert vtbl is not None
        qv = emb.embed_query(["store cookie"])[0]
        search._vec_baseline(idx.conn, vtbl, qv)
        before = len(search._baselines[(idx.conn.filename, vtbl, None)][1])
        assert idx.fill_vectors(str(a)) > 0
        search._vec_baseline(idx.conn, vtbl, qv)
        after = len(search._baselines[(idx.conn.filename, vtbl, None)][1])
        assert (before, after) == (4, 12)


@pytest.mark.parametrize(
    ("question", "code"),
    [
        ("Fix Windows hyperlinks for paths with spaces", True),  # a verb that opens a change
        ("Don't color each path component separately", True),
        ("fix: handle invalid working directories", True),  # a change type of code
        ("refactor(exec): Get io error from method", True),
        ("How is `load_config` called", True),  # a name written as code
        ("what does HelpFormatter print", True),
        ("what is in src/cli.rs", True),  # a file it names
        ("how is the config loaded", False),
        ("docs: mention the new option", False),  # a change type that may be to anything
        ("deployment process for the staging cluster", False),
        ("", False),
        # Other forms of the verb, and a scope before it.
        ("Added explicit documentation about dir", True),
        ("Using faccess lib to detect executable files", True),
        ("walk: Add a cache for DirEntry metadata", True),
        ("zsh-completions: implemented argument completion.", True),
        ("status of the deployment", False),
        # A scope is in lower case; a "docs:" change is about documents.
        ("Note: use the staging cluster", False),
        ("TODO: fix the release checklist", False),
        ("docs: update the install guide", False),
        ("Process for onboarding new hires", False),
        # Not a task: a question, a verb that is not first, a noun use, an abbreviation.
        ("Do we have a deployment guide?", False),
        ("Do we have a deployment guide", False),
        ("Do not strip paths for -X/x", True),  # "Do not" as "Don't"
        ("Note: Do not merge on Fridays", False),
        ("Use cases for the staging cluster?", False),
        ("как работает use flag", False),
        ("如何 use 缓存", False),
        ("how does the floor work, e.g. for made-up words", False),
    ],
)
def test_about_code(question: str, code: bool) -> None:
    change, body = rank.split_change_type(question)
    written = rank.written_identifiers(body)
    assert rank.about_code(change, body, written, rank.named_files(body)) is code


def test_a_find_knowledge_question_about_code_weighs_files_as_find_code(
    project: tuple[CodeIndex, Path],
) -> None:
    """find_knowledge weighs documents like code, so a question in words finds the page that
    explains them first; one that reads as a change ("Fix ..."), writes a name as code or
    has a change type of code has its files weighed as find_code weighs them (the router
    sends most commit-style questions to find_knowledge: no cue words)."""
    idx, _ = project

    def paths(query: str, intent: str) -> list[str]:
        return list(dict.fromkeys(h.path for h in idx.search(query, intent=intent).hits))

    assert paths("how a URL is joined", "find_knowledge")[0] == "docs/urls.md"
    assert paths("how a URL is joined", "find_code")[0] == "httpkit/_urls.py"
    for query in ("Fix how a URL is joined", "how `join_url` joins a URL", "fix: URL joined"):
        assert paths(query, "find_knowledge") == paths(query, "find_code"), query
        assert paths(query, "find_knowledge")[0] == "httpkit/_urls.py", query


def test_an_abbreviation_is_neither_a_name_nor_a_file() -> None:
    """ "e.g.", "i.e.", "U.S.", "a.k.a." are letters with dots, not dotted names written as
    code nor file names; a name with a one-letter part still is one (`a.py`, `os.path`)."""
    for text in ("how it works, e.g. for made-up words", "i.e. this", "the U.S. office", "a.k.a."):
        assert rank.written_identifiers(text) == frozenset(), text
        assert not rank.named_files(text), text
    assert "a.py" in rank.written_identifiers("fix a.py") and rank.named_files("fix a.py")
    assert "os.path" in rank.written_identifiers("use os.path here")
    # One letter each, without a dot after the last: a file ("a.h"), named as written.
    for text in ("see a.h for details", "see `a.h` for details"):
        assert "a.h" in rank.written_identifiers(text), text
        assert rank.named_files(text).names("include/a.h"), text


def test_in_a_store_of_two_files_made_up_words_still_outweigh_a_common_one(
    tmp_path: Path,
) -> None:
    """The relevance floor in the smallest store (a made-up word's idf is 1.61 there): two
    made-up words and a word of both files get no items, as in a large store; one made-up
    word among words of the code is a question about it (rank.least_weight)."""
    root = tmp_path / "tiny"
    _write(root, "cli.py", "def parse_flag(flag):\n    return flag.strip('-')  # a flag\n")
    _write(root, "main.py", "from cli import parse_flag\n\ndef main(flag):\n    parse_flag(flag)\n")
    with CodeIndex(str(tmp_path / "data" / "code.sqlite")) as idx:
        idx.index_workspace(str(root))
        for query in ("zentrik pexlith flag", "zentrik pexlith graptel flag"):
            assert idx.search(query, intent="find_code").hits == [], query
        hits = idx.search("strip the dashes of a flag", intent="find_code").hits
        assert hits and hits[0].path == "cli.py"
        # Indexed again and again: old file versions go, their ids stay used. The floor
        # counts the rows held (as bm25() does), not the highest id.
        for i in range(12):
            _write(root, "main.py", f"from cli import parse_flag\n\ndef main(flag):  # {i}\n")
            idx.index_workspace(str(root))
        for query in ("zentrik pexlith flag", "zentrik pexlith graptel flag"):
            assert idx.search(query, intent="find_code").hits == [], query
