"""File-level ranking of code-search candidates.

A question such as "Handle empty zstd responses" is answered by a file: the one the
change touches. Chunk BM25 alone ranks the one chunk that repeats a word most; the
signals here look at the file:

* the file as a whole (BM25 over all its chunks: several chunks matching different
  words is strong evidence);
* its best chunk (BM25 over chunk text, with symbol name and path weighted up);
* its path: the share of the question's weight found in the path's words
  (``_urls.py`` for "URL"), and whether the question names the file outright
  (``command.rs``, ``doc/util.go``, the module ``click.core``);
* what kind of file it is, by the question's intent: for finding code, source files
  come ahead of shell scripts, tests, documents, changelogs, lock files and generated or
  vendored files (demoted, never dropped; a question that names the kind lifts its
  demotion).

Each signal is divided by its best value in the question's candidates, so score gaps
carry over (a clear winner stays clear). Weights and priors were chosen on the
labelled sets of ``bench/bench_relevance.py`` (figures in bench/RESULTS.md).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import lru_cache

import snowballstemmer
from identify import extensions as identify_extensions

from .. import fts
from .tokenize import index_tokens, split_uncached

__all__ = [
    "FileEvidence",
    "NamedFiles",
    "OpaqueIds",
    "about_code",
    "about_command_line",
    "defines_cli",
    "evidence_share",
    "file_kind",
    "judged_terms",
    "judged_weights",
    "least_weight",
    "name_parts",
    "named_files",
    "opaque_ids",
    "path_share",
    "priors_for",
    "score_files",
    "split_change_type",
    "telling",
    "with_stems",
    "without_line_marks",
    "without_roots",
    "written_identifiers",
]

# Weights of the three signals (each scaled to 0..1 within the question).
FILE_WEIGHT = 1.0
CHUNK_WEIGHT = 0.5
PATH_WEIGHT = 0.3
# A file the question names (``named_files``) gains NAMED_WEIGHT, about what the best
# BM25 file gets, in a question of up to NAMED_WORDS telling words, the name counting as
# one ("Use full names in command.rs", where "command" is in most of fd's files, so the
# path signal alone gives the file little); in a longer one, that share of it: a long
# commit-style question that names a document among many places is not about that
# document alone. Measured on the labelled sets and this repository's own
# (bench/RESULTS.md).
NAMED_WEIGHT = 1.0
NAMED_WORDS = 6.0
# Larger files are more often the ones a change touches (bug-localisation work weighs
# file length the same way, e.g. BugLocator's rVSM): a file's score is raised by up to
# this share, by its chunk count on a log scale relative to the largest candidate.
# Measured on all four relevance sets (bench/RESULTS.md).
SIZE_WEIGHT = 0.2
# The two BM25 signals enter as (score / best) ** BM25_EXPONENT: compressed, so a file
# whose BM25 is a little lower (a long file, a word repeated elsewhere) is not far behind
# on that signal alone and the other signals can decide. Measured on the labelled sets
# against 1.0 (bench/RESULTS.md).
BM25_EXPONENT = 0.75
# How much a file's second, third ... chunk weighs against its best one.
NEXT_CHUNK_DECAY = 0.5
# A question about the command line (``about_command_line``: options, flags, help, usage,
# a written ``--flag``) raises the score of a source file that defines at least
# CLI_MIN_OPTIONS command-line options (chunking.cli_options) by CLI_WEIGHT: that file
# holds the options' names and help texts, which such a question is usually about.
# Measured on the labelled sets and this repository's own (bench/RESULTS.md).
CLI_WEIGHT = 0.2
CLI_MIN_OPTIONS = 10
# A question that writes an identifier as code (``written_identifiers``: `quoted`,
# CamelCase, snake_case, Dotted.name) raises by DEFINED_WEIGHT the one candidate file that
# defines a symbol of that name (a chunk's symbol, or its first or last part): "Add generic
# type parameters to FormData" is about the file that defines FormData. Only when a single
# candidate defines one: a name several files define tells none of them apart. Measured on
# the labelled sets and this repository's own (bench/RESULTS.md).
DEFINED_WEIGHT = 0.1
# In the relevance floor (``evidence_share``), a word of the question that the files hold
# weighs at least SHARE_MIN_FRACTION of a word that none holds (the highest idf there is),
# and at most SHARE_MIN_WEIGHT (``least_weight``): in a repository of a few dozen files, the
# words it is about ("flag", "completion" in a command-line library) are in most of them
# and their idf is near 0, so one word of the question that no file holds ("getters") made
# up all of the question, and a question about the repository's own subject got no answer.
# A fraction, so that in a store of a few files, where a made-up word's idf is small too,
# made-up words still outweigh a common one. Measured with each labelled set alone in a
# store, and on made-up, mixed and random questions (bench/RESULTS.md).
SHARE_MIN_FRACTION = 0.2
SHARE_MIN_WEIGHT = 1.0
_IDENTIFIER = re.compile(
    r"`([^`]+)`|\b([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+|[a-z]+[A-Z]\w*|[A-Z][a-z0-9]+[A-Z]\w*"
    r"|[A-Z]{2,}[a-z]\w*|[a-z0-9]+_\w+)\b"
)
_DOTTED_NAME = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*")
# Letters each followed by a dot, "e.g.", "i.e.", "U.S.", "a.k.a.": an abbreviation,
# neither a name nor a file ("a.h", without the last dot, is a file).
_ABBREVIATION = re.compile(r"(?:[A-Za-z]\.){2,}")
_COMMAND_LINE = re.compile(
    r"(?i)\b(?:help|options?|flags?|arguments?|usage|cli|command[- ]line)\b"
    r"|(?<![\w-])--?[A-Za-z]"
)

# The languages of code, by the names code.chunking gives them (identify's names for those
# without a grammar here). Build files (makefile, cmake, dockerfile, bazel) and data
# formats are configuration.
SOURCE_LANGUAGES = frozenset(
    {
        "python",
        "cython",
        "go",
        "rust",
        "javascript",
        "typescript",
        "tsx",
        "jsx",
        "coffee",
        "vue",
        "svelte",
        "astro",
        "elm",
        "purescript",
        "java",
        "kotlin",
        "scala",
        "groovy",
        "clojure",
        "c",
        "cpp",
        "cuda",
        "objc",
        "objcpp",
        "csharp",
        "fsharp",
        "swift",
        "dart",
        "ruby",
        "php",
        "perl",
        "lua",
        "r",
        "julia",
        "fortran",
        "pascal",
        "elixir",
        "erlang",
        "haskell",
        "ocaml",
        "nim",
        "crystal",
        "zig",
        "solidity",
        "verilog",
        "system-verilog",
        "vhdl",
        "sql",
        "proto",
        "thrift",
        "graphql",
        "prisma",
        "vb",
        "vala",
        "gleam",
        "scheme",
        "racket",
        "lisp",
        "elisp",
        "literate-haskell",
        "idris",
        "lean",
        "sml",
        "reason",
        "rescript",
        "haxe",
        "ada",
        "tcl",
        "raku",
        "gdscript",
        "asm",
        "ino",
        "inl",
        "hlsl",
        "glsl",
    }
)
# Shell (and awk) scripts: in most repositories they build, test, release or install the
# code rather than being it (starlette's scripts/test, fd's scripts/create-deb.sh); where
# they are the code (a repository of shell tools), priors_for weighs them as source.
SCRIPT_LANGUAGES = frozenset(
    {
        "sh",
        "bash",
        "zsh",
        "fish",
        "ksh",
        "csh",
        "tcsh",
        "dash",
        "ash",
        "nushell",
        "powershell",
        "batch",
        "awk",  # text-processing helpers, like fd's scripts/update-help.awk
    }
)

_CHANGELOG = re.compile(
    r"(^|/)(changelog|changes|history|news|release[-_ ]?notes?|releases?)([.-][^/]*)?$"
)
_LOCK_NAMES = frozenset(
    {
        "cartfile.resolved",
        ".terraform.lock.hcl",
        "manifest.toml",  # Julia's
        "go.sum",
        "package-lock.json",
        "yarn.lock",
        "pnpm-lock.yaml",
        "poetry.lock",
        "cargo.lock",
        "uv.lock",
        "pipfile.lock",
        "composer.lock",
        "gemfile.lock",
        "requirements.lock",
        "npm-shrinkwrap.json",
        "packages.lock.json",
        "package.resolved",
        "go.work.sum",
        "cabal.project.freeze",
    }
)
_GENERATED_DIRS = frozenset(
    {
        "vendor",
        "node_modules",
        "third_party",
        "thirdparty",
        "dist",
        "_gen",
        "generated",
        "__generated__",
    }
)
# Generated code by the names its generators give: protobuf and gRPC (foo.pb.go, foo_pb.js,
# foo_grpc_pb.d.ts; foo_pb2.py is caught earlier, with the vendored folders), Dart's
# build_runner (foo.g.dart, foo.freezed.dart), .NET (Form1.Designer.cs, Foo.g.cs),
# Kubernetes' zz_generated.deepcopy.go and generated.proto, and names that say so
# (schema.generated.ts). Read after the test names: test_generated.py is a test.
_GENERATED_NAME = re.compile(
    r"(\.pb\.|_pb\.|\.g\.(dart|cs)$|\.freezed\.|\.designer\.|(^|\.)generated\.|^zz_generated)"
)
_TEST_DIRS = frozenset(
    {
        "test",
        "tests",
        "t",  # Perl, git
        "testing",
        "__tests__",
        "spec",
        "specs",
        "testdata",
        "e2e",
        "fixtures",
        "__mocks__",
        "__snapshots__",
        "unittest",
        "unittests",
        # Gradle and Android source sets
        "androidtest",
        "testfixtures",
        "integrationtest",
        "functionaltest",
        "sharedtest",
        "testdebug",
        "testrelease",
    }
)
# Test folders named for what they test: integration-tests, e2e_tests, MyLib.Tests (.NET),
# MyAppUITests (Xcode); plural only, since ab_test/ and tokio-test/ hold code.
_TEST_DIR_NAME = re.compile(r"(.+[._-](?i:tests|specs|unittests)|.*[A-Za-z0-9](Tests|Specs))$")
_TEST_NAME = re.compile(
    r"(^test_.*|.*_test\.\w+|.*_(unit|browser|perf|integration|fuzz)test\.\w+"
    r"|.*\.(test|spec|e2e-spec)\.\w+|.*_spec\.\w+|conftest\.py|tests\.(py|rs))$"
)
# JUnit, NUnit, XCTest and PHPUnit name test classes FooTest, FooTests, HTTPTest and FooIT
# (integration); read with the name's own capitals, so Latest.java is not one. (FooSpec is
# as often a model, javapoet's TypeSpec; ScalaTest's specs sit in test folders.)
_TEST_CLASS = re.compile(r"((^|[A-Za-z0-9])Tests?|[a-z0-9]IT)\.\w+$")
# Build files and tool settings written in a language of code: configuration.
_BUILD_NAMES = frozenset(
    {
        "build.gradle",
        "build.gradle.kts",
        "settings.gradle",
        "settings.gradle.kts",
        "package.swift",
        "mix.exs",
        ".formatter.exs",
        "gemfile",
        "rakefile",
        "config.ru",
        "podfile",
        "brewfile",
        "vagrantfile",
        "jenkinsfile",
        "rebar.config",
        "setup.py",
        "conanfile.py",
        "gulpfile.js",
        "gruntfile.js",
    }
)
_BUILD_NAME = re.compile(
    r"(\.(gemspec|podspec)|\.config\.(js|cjs|mjs|ts|cts|mts)|^\.\w+rc\.(js|cjs|mjs|ts))$"
)
# Text files that are settings, not documents: extensionless dotfiles (.npmrc, .nvmrc,
# .ruby-version), pip's requirements files, and these names.
_CONFIG_TEXT_NAMES = frozenset(
    {"procfile", "cartfile", "owners", "codeowners", "dune", "dune-project", "rust-toolchain"}
)
_REQUIREMENTS = re.compile(r"^(requirements|constraints)([-_.]\w+)*\.(txt|in)$")
_DOC_DIRS = frozenset({"doc", "docs", "documentation", "site", "man"})
# Languages of documents, by the chunker's names (identify's, or the bare extension):
# Markdown and its variants (MDX pages of documentation sites, R Markdown, Quarto), markup
# of wikis and other languages' documentation (RDoc, Perl's POD, Textile), TeX and
# BibTeX, Org, HTML, RTF and plain text.
_DOC_LANGUAGES = frozenset(
    {
        "markdown",
        "mkd",
        "mkdn",
        "mdx",
        "rmd",
        "quarto",
        "text",
        "txt",
        "rst",
        "rest",
        "asciidoc",
        "org",
        "textile",
        "rdoc",
        "pod",
        "wiki",
        "mediawiki",
        "creole",
        "tex",
        "bib",
        "html",
        "rtf",
    }
)


# Bounded caches per serving process: one entry per path (kinds, path words) or per
# question word (stems); every question brings new words, so the stem cache stays small
# (the soak's memory figures are in bench/RESULTS.md).
def file_kind(path: str, language: str, generated: bool = False) -> str:
    """source | script | test | docs | changelog | lock | generated | config, from the
    path, the language the chunker gave the file and whether the comments at its top say
    a tool generated it (code.chunking.generated_header): code, scripts and settings that
    say so are generated; tests, documents, changelogs and lock files keep their kinds."""
    kind = _path_kind(path, language)
    return "generated" if generated and kind in ("source", "script", "config") else kind


@lru_cache(maxsize=16_384)
def _path_kind(path: str, language: str) -> str:
    low = path.lower()
    parts = low.split("/")
    name, dirs = parts[-1], parts[:-1]
    code = language in SOURCE_LANGUAGES or language in SCRIPT_LANGUAGES
    if _CHANGELOG.search(low) and not code:  # history.py, release.go are code
        return "changelog"
    if name in _LOCK_NAMES or name.endswith((".lock", ".lockb", ".lockfile")):
        return "lock"
    if any(d in _GENERATED_DIRS for d in dirs) or ".min." in name or "_pb2" in name:
        return "generated"
    given = path.split("/")  # the names with their capitals
    if (
        any(d in _TEST_DIRS for d in dirs)
        or any(_TEST_DIR_NAME.match(d) for d in given[:-1])
        or _TEST_NAME.match(name)
        or _TEST_CLASS.search(given[-1])
    ):
        return "test"
    if _GENERATED_NAME.search(name):
        return "generated"
    if name in _BUILD_NAMES or _BUILD_NAME.search(name):
        return "config"
    if language in SOURCE_LANGUAGES:
        return "source"  # code under docs/ is code (cobra's doc/ generates documentation)
    if language in SCRIPT_LANGUAGES:
        return "script"
    if language in ("text", "txt", "in") and (
        name.startswith(".") or name in _CONFIG_TEXT_NAMES or _REQUIREMENTS.match(name)
    ):
        return "config"
    if language in _DOC_LANGUAGES or any(d in _DOC_DIRS for d in dirs):
        return "docs"
    return "config"


# Score multipliers by kind when the question is about code (find_code, or the code lane
# without a stated intent) and when it asks for knowledge (documents weigh as much as code).
_CODE_PRIORS = {
    "source": 1.0,
    "script": 0.5,
    "config": 0.5,
    "test": 0.5,
    "docs": 0.4,
    "changelog": 0.2,
    "generated": 0.2,
    "lock": 0.1,
}
_KNOWLEDGE_PRIORS = {**_CODE_PRIORS, "docs": 1.0, "changelog": 0.5, "config": 0.7}
# The intents weighed with _KNOWLEDGE_PRIORS: find_knowledge, the router's, and "knowledge",
# a knowledge question as the caller stated it (mode=find_knowledge, or documents only:
# mode=docs, mode=themes), which code.search does not weigh as code (rank.about_code).
_KNOWLEDGE_INTENTS = frozenset({"find_knowledge", "knowledge"})
# A question with one of these words asks for that kind: its demotion is lifted, to just
# below source files ("add tests for X" is mostly answered by X).
LIFTED = 0.7
_KIND_WORDS = {
    "test": ("test", "tests", "testing", "fixture", "fixtures", "pytest", "spec"),
    "script": ("script", "scripts", "shell", "bash", "sh", "zsh", "powershell"),
    "docs": ("doc", "docs", "documentation", "readme", "guide", "tutorial", "manual"),
    "changelog": ("changelog", "changes", "release", "releases", "news", "history"),
    "lock": ("lock", "lockfile", "pinned", "pin"),
    "config": ("config", "configuration", "settings", "ci", "workflow", "yaml", "toml"),
    "generated": ("generated", "vendor", "vendored"),
}


def priors_for(
    intent: str, terms: Iterable[str], kinds: Mapping[str, int] | None = None
) -> Mapping[str, float]:
    """The kind multipliers for a question with ``terms`` routed to ``intent``, whose
    candidate files are of ``kinds`` (kind -> how many). Where shell scripts outnumber
    the source files among them (a repository of shell tools such as nvm or pyenv),
    scripts are the code and weigh as source: ahead of their tests."""
    base = _KNOWLEDGE_PRIORS if intent in _KNOWLEDGE_INTENTS else _CODE_PRIORS
    words = set(terms)
    lifted = {kind for kind, cues in _KIND_WORDS.items() if words.intersection(cues)}
    priors = {kind: (LIFTED if kind in lifted else prior) for kind, prior in base.items()}
    if kinds and kinds.get("script", 0) > kinds.get("source", 0):
        priors["script"] = priors["source"]
    return priors


# The change types of the Conventional Commits convention ("fix: ...", "feat(cli)!: ..."),
# with which questions copied from commit subjects and issue titles often begin. Such a
# leading type says what kind of change it was, not where: as a word of the question it
# is rare in code, so BM25 gave it the most weight of all ("feat" outweighed "cwd").
CHANGE_TYPES = frozenset(
    {
        "fix",
        "feat",
        "feature",
        "docs",
        "doc",
        "chore",
        "refactor",
        "perf",
        "style",
        "test",
        "tests",
        "build",
        "ci",
        "revert",
        "maint",
        "deps",
    }
)
# Change types that say the change was to code (``about_code``; a "docs:" change is to
# documents, and a "test:", "ci:" or "chore:" one may be to anything).
CODE_CHANGE_TYPES = frozenset(
    {"fix", "feat", "feature", "refactor", "perf", "style", "revert", "maint"}
)
# Verbs that open a change written as a task or a commit subject ("Add ...", "Fix ...",
# "Don't ..."): such a question asks where the code to change is (``about_code``).
CHANGE_VERBS = frozenset(
    """
    accept add adjust allow apply attempt avoid bump call catch change check clean close
    convert correct create deduplicate deprecate disable don downgrade drop enable
    ensure expose extract fix handle hide ignore implement improve include introduce
    keep limit make mark match merge migrate move optimise optimize parse pass pin
    prevent print provide raise reduce refactor reject remove rename reorder replace
    resolve restore return reuse revert rework rewrite send set show simplify skip split
    stop support swap treat tweak unify update upgrade use validate warn wrap
    """.split()
)
_CHANGE_PREFIX = re.compile(r"^\s*([A-Za-z]+)(?:\(([^()]*)\))?!?:\s+(?=\S)")


def split_change_type(query: str) -> tuple[str, str]:
    """(the change type, the rest of the question) of ``feat(scope): text``; the scope
    stays in the question (it names the place). ("", query) without such a prefix."""
    m = _CHANGE_PREFIX.match(query)
    if m is None or m.group(1).lower() not in CHANGE_TYPES:
        return "", query
    scope = m.group(2) or ""
    return m.group(1).lower(), (scope + " " + query[m.end() :]).strip()


_stemmer = snowballstemmer.stemmer("porter")


@lru_cache(maxsize=2_048)
def _stem(word: str) -> str:
    return str(_stemmer.stemWord(word))


def with_stems(terms: list[str]) -> list[str]:
    """``terms`` followed by those of their stems that differ from every term."""
    out = list(terms)
    for t in terms:
        st = _stem(t)
        if st not in out and len(st) > 2:
            out.append(st)
    return out


@lru_cache(maxsize=16_384)
def _path_words(path: str) -> frozenset[str]:
    return frozenset(_stem(t) for t in index_tokens(path).split())


def path_share(path: str, weights: Mapping[str, float]) -> float:
    """The share (0..1) of the question's term weight whose words are in ``path``."""
    total = sum(weights.values())
    if total <= 0:
        return 0.0
    words = _path_words(path)
    return sum(w for t, w in weights.items() if _stem(t) in words) / total


_WORDS = re.compile(r"\w+")
# The question's words as written: what lies between spaces, quotes, brackets, commas and
# "=" ("file=src/main.rs").
_WRITTEN = re.compile(r"[^\s`'\"()\[\]{}<>,;|=]+")
# Before a path: "./", "../", "~/", "$HOME/", "/" (the rest is a path in the workspace).
_PATH_START = re.compile(r"^(?:\.\.?/|~/|\$\w+/|/)+")
# After one: a line or range ("main.rs:12", "lib.rs#L10-L20"), then punctuation
# (``_without_path_end``).
_PATH_LINE = re.compile(r"(?::\d+(?:[:-]\d+)?|#L\d+(?:-L?\d+)?)$")
_PATH_PUNCTUATION = ".,:;!?"
_TRACEBACK_LINE = re.compile(r'File "([^"\n]{1,1000})", line (\d{1,9})')
# The lines of that line or range ("config.py:445", "main.rs:12:5" with a column,
# "lib.rs#L10-L20").
_LINE_OF = re.compile(r"(?::(\d{1,9})(?:-(\d{1,9})|:\d+)?|#L(\d{1,9})(?:-L?(\d{1,9}))?)$")


def _without_path_end(word: str) -> str:
    """``word`` without the punctuation and the line or range after a path. Stripped in two
    steps: one pattern of both ended in ``[.,:;!?]*$``, which a regular expression engine
    tries from every position of a long run of them, quadratic in its length (timed in
    bench/RESULTS.md)."""
    return _PATH_LINE.sub("", word.rstrip(_PATH_PUNCTUATION))


# A file name with or without its directories: "command.rs", "doc/util.go",
# "archive.tar.gz", ".gitignore", ".github/workflows/ci.yml" (an extension: a letter and up
# to seven more).
_FILE_PATH = re.compile(
    r"(?:[\w.-]+/)*(?:\.?[\w-]+(?:\.[\w-]+)*\.[A-Za-z][A-Za-z0-9]{0,7}|\.[A-Za-z][\w-]*)"
)
# Well-known names of files without an extension, matched as written (Makefile,
# Dockerfile, Jenkinsfile, Gemfile): from identify's table of names.
_EXTENSIONLESS_NAMES = frozenset(name for name in identify_extensions.NAMES if "." not in name)
_EXTENSIONLESS_PATH = re.compile(r"(?:[\w.-]+/)*[\w-]+")
# A qualified name: `click.core`, `exec::command`, `crate::exec::command::run`.
_QUALIFIED = re.compile(r"[A-Za-z_]\w+(?:(?:\.|::)[A-Za-z_]\w+)+")
# A lower-case name alone in backticks, as commit subjects quote a module
# ("Add type annotations for instance attributes in `formatting`"): the module of that
# name, when a code file has it (a class, `HTTPException`, is no module).
_QUOTED_MODULE = re.compile(r"`([a-z_][a-z0-9_]{2,})`")
_QUALIFIER_ROOTS = frozenset({"crate", "self", "super"})
# The file that stands for a directory's module.
_MODULE_FILES = ("__init__", "mod", "index")
# Documents are not modules ("click.core" is not docs/click/core.md).
_DOCUMENT_EXTENSIONS = frozenset({"md", "markdown", "rst", "txt", "html", "htm", "adoc"})
# A qualified name ending in one of these is a file name only ("main.rs" is no module).
_FILE_EXTENSIONS = _DOCUMENT_EXTENSIONS | frozenset(
    "py pyi js mjs cjs jsx ts mts tsx go rs java kt kts scala swift c h cc cpp hpp cs rb php"
    " sh bash zsh ps1 sql proto css scss json toml yaml yml xml ini cfg lock gz tar zip".split()
)


def _full_path(path: str, workspace: str) -> str:
    """``path`` ("/" and lower case) from its workspace's root when the workspace is known."""
    root = workspace.rstrip("/").lower()
    return root + path if root.startswith("/") else path


@dataclass(frozen=True, slots=True)
class NamedFiles:
    """The files a question names (``named_files``): path suffixes, lower case."""

    files: tuple[str, ...] = ()  # "/doc/util.go": a path that ends so
    modules: tuple[str, ...] = ()  # "/click/core": a code file whose path without its
    # extension ends so, or the module file of a directory that does
    terms: frozenset[str] = frozenset()  # the question's terms that are parts of the names
    # ("/src/config.py", 445, 445): a file named with a line, or a range of lines
    lines: tuple[tuple[str, int, int], ...] = ()

    def __bool__(self) -> bool:
        return bool(self.files or self.modules)

    def line(self, path: str, workspace: str = "") -> tuple[int, int] | None:
        """The first and last line the question writes after ``path``'s name
        ("config.py:445", "config.py#L300-L310"), if any (``workspace`` as for ``names``)."""
        p = _full_path("/" + path.lower(), workspace)
        # "config.py:1 app/config.py:21": the longest name that ends the path says where.
        at = [(len(suffix), a, b) for suffix, a, b in self.lines if p.endswith(suffix)]
        return max(at)[1:] if at else None

    def names(self, path: str, workspace: str = "") -> bool:
        """Whether ``path`` (relative to its ``workspace``, or absolute) is one of them. With
        the workspace, a name written from the root ("/home/ana/shop/src/app.py", as in a
        traceback) names that workspace's "src/app.py" and no other's."""
        p = "/" + path.lower()
        if _full_path(p, workspace).endswith(self.files):
            return True
        if not self.modules:
            return False
        head, _, name = p.rpartition("/")
        stem, dot, ext = name.rpartition(".")
        if not dot:
            stem, ext = name, ""
        if ext in _DOCUMENT_EXTENSIONS:
            return False
        if (head + "/" + stem).endswith(self.modules):
            return True
        return stem in _MODULE_FILES and head.endswith(self.modules)


def _is_file_name(word: str) -> bool:
    """Whether ``word`` (its start and end stripped) is a file's name, with or without its
    directories: one with an extension, or a well-known one without (Makefile)."""
    return bool(
        _FILE_PATH.fullmatch(word)
        or (word.rpartition("/")[2] in _EXTENSIONLESS_NAMES and _EXTENSIONLESS_PATH.fullmatch(word))
    )


def without_roots(text: str, roots: Iterable[str]) -> str:
    """``text`` without the workspace ``roots`` written before a path
    ("/home/ana/shop/src/app.py" -> "/src/app.py"): the root says which workspace, its
    folder names are no words to look for (in no file, they were most of the question)."""
    for root in sorted((r.rstrip("/") for r in roots), key=len, reverse=True):
        if root:
            text = text.replace(root + "/", "/")
    return text


def without_line_marks(text: str) -> str:
    """``text`` without the line or range written after a file's name ("config.py:445",
    "lib.rs#L10-L20"): a place in the file (``NamedFiles.line``), not words to look for
    ("L10" is in no file, so as a word it was most of the question)."""
    out, last = [], 0
    for m in _WRITTEN.finditer(text):
        word = m.group(0).replace("\\", "/").rstrip(_PATH_PUNCTUATION)
        at = _LINE_OF.search(word)
        if at is None or not _is_file_name(_PATH_START.sub("", word[: at.start()])):
            continue
        out.append(text[last : m.start() + at.start()])
        last = m.start() + at.end()
    return "".join(out) + text[last:]


def _traceback_lines(text: str, files: dict[str, None], lines: dict[str, tuple[int, int]]) -> None:
    """Adds a Python traceback's files to ``files`` and their lines to ``lines``:
    ``File "/srv/my app/x.py", line 12`` names the quoted path as written (spaces and all);
    of several frames in one file, the last, where the call that failed is, gives the line."""
    for m in _TRACEBACK_LINE.finditer(text):
        written = m.group(1).replace("\\", "/")
        name = "/" + _PATH_START.sub("", written).lower()
        if _is_file_name(name.rpartition("/")[2]) and int(m.group(2)) > 0:
            files[name] = None
            lines[name] = (int(m.group(2)), int(m.group(2)))
            # Read word by word, "/home/ana/my shop/app.py" also gave "shop/app.py".
            tail = "/" + _PATH_START.sub("", written.split()[-1]).lower()
            if tail != name:
                files.pop(tail, None)
                lines.pop(tail, None)


def named_files(text: str) -> NamedFiles:
    """The files ``text`` names: written-out file names ("fix a typo in doc/util.go",
    "./src/main.rs:12", "docker/Dockerfile"), qualified module names ("`click.core`: annotations",
    "crate::exec::command"; with a name after the module, "click.core.Context", the module
    too) and a lower-case name alone in backticks ("in `formatting`": a module of that name). A name that no file has names nothing; a name is matched whole, from a directory
    boundary ("util.go" is not "myutil.go"). URLs and e-mail addresses name no file."""
    files: dict[str, None] = {}
    modules: dict[str, None] = {}
    terms: set[str] = set()
    lines: dict[str, tuple[int, int]] = {}
    for m in _WRITTEN.finditer(text):
        word = m.group(0)
        if "://" in word or "@" in word:
            continue
        if _ABBREVIATION.fullmatch(word.rstrip(",:;!?")):
            continue
        word = word.replace("\\", "/")
        at = _LINE_OF.search(word.rstrip(_PATH_PUNCTUATION))
        word = _PATH_START.sub("", _without_path_end(word))
        found = False
        if _is_file_name(word):
            files["/" + word.lower()] = None
            found = True
            if at is not None and int(at.group(1) or at.group(3)) > 0:
                first = int(at.group(1) or at.group(3))
                last = int(at.group(2) or at.group(4) or first)
                lines.setdefault("/" + word.lower(), (first, max(first, last)))
        if _QUALIFIED.fullmatch(word) and not (
            "::" not in word and word.rpartition(".")[2].lower() in _FILE_EXTENSIONS
        ):
            parts = re.split(r"\.|::", word.lower())
            while parts and parts[0] in _QUALIFIER_ROOTS:
                parts.pop(0)
            for n in (len(parts), len(parts) - 1) if len(parts) > 2 else (len(parts),):
                if n >= 2:
                    modules["/" + "/".join(parts[:n])] = None
                    found = True
        if found:
            for part in _WORDS.findall(word):
                terms.update(split_uncached(part))
    for m in _QUOTED_MODULE.finditer(text):
        # `__init__`, `mod`, `index`, `main`: a name many directories' files share.
        if m.group(1) in _MODULE_FILES or m.group(1) == "main":
            continue
        modules["/" + m.group(1)] = None
        terms.update(split_uncached(m.group(1)))
    _traceback_lines(text, files, lines)
    return NamedFiles(
        tuple(files),
        tuple(modules),
        frozenset(terms),
        tuple((f, *ab) for f, ab in lines.items()),
    )


def telling(term: str) -> bool:
    """Whether a term can show that a file answers a question: not a part of one or two
    characters or digits only (a UUID or hash splits into many such parts, and each is
    in some file)."""
    return len(term) > 2 and not term.isdigit()


# A UUID as a word of its own (one glued to a word by "_" or a letter is that word's part).
_UUID = re.compile(
    r"(?<!\w)[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}(?!\w)", re.IGNORECASE
)
_HEX = re.compile(r"[0-9a-f]{7,}", re.IGNORECASE)


def _is_hash(word: str) -> bool:
    """A hash written out (a commit, abbreviated as git does, or a digest): 7 or more hex
    digits, at least three of them digits and one a letter (``dec2bcd`` is a name)."""
    if not _HEX.fullmatch(word):
        return False
    digits = sum(c.isdigit() for c in word)
    return digits >= 3 and digits < len(word)


@dataclass(frozen=True, slots=True)
class OpaqueIds:
    """The UUIDs and hashes of a question (``opaque_ids``)."""

    # Per ID: the telling terms of each of its segments, and how many segments a file may
    # lack (a UUID glued to a word in the file loses its first or last segment's tokens).
    ids: tuple[tuple[tuple[frozenset[str], ...], int], ...] = ()
    # The terms of the question's other words.
    free: frozenset[str] = frozenset()


def opaque_ids(text: str) -> OpaqueIds:
    """The UUIDs and written-out hashes in ``text``. Such an ID is one token of meaning,
    and its parts are noise: a UUID's four-digit groups, or a hash's letter runs such as
    ``add``, ``bad`` or ``cafe``, are often in some file of a repository. So a file shows
    the ID only when it holds all its segments (a UUID with four or five telling groups:
    all but one)."""
    ids: list[tuple[tuple[frozenset[str], ...], int]] = []
    spans = []
    for m in _UUID.finditer(text):
        segs = tuple(
            seg
            for g in m.group(0).split("-")
            if (seg := frozenset(t for t in split_uncached(g) if telling(t)))
        )
        if segs:
            ids.append((segs, 1 if len(segs) >= 4 else 0))
            spans.append(m.span())
    free: set[str] = set()
    for m in _WORDS.finditer(text):
        if any(a <= m.start() < b for a, b in spans):
            continue
        parts = split_uncached(m.group(0))
        hashed = frozenset(t for t in parts if telling(t)) if _is_hash(m.group(0)) else None
        if hashed:
            ids.append(((hashed,), 0))
        else:
            free.update(parts)
    return OpaqueIds(tuple(ids), frozenset(free))


def evidence_share(
    weights: Mapping[str, float],
    present: Iterable[str],
    ids: OpaqueIds | None = None,
    least: float = 0.0,
) -> float:
    """The share (0..1) of the question's telling terms' weight that a file contains
    (``present``): how much of the question the file answers. Terms absent from the
    index count with the highest idf (a made-up word is most of a question), the others
    with at least ``least`` (least_weight; judged_weights). A question without a telling
    term is judged by all its terms (judged_terms). The terms of an ID of ``ids`` count only
    when the file shows the ID, unless another ID it shows or another word of the question
    has them too."""
    judged = judged_weights(weights, least)
    total = sum(judged.values())
    if total <= 0:
        return 1.0
    held = set(present)
    if ids is not None and ids.ids:
        shown: set[str] = set()
        unshown: set[str] = set()
        for segments, slack in ids.ids:
            segs = [g for seg in segments if (g := seg & weights.keys())]
            if segs:
                whole = sum(g <= held for g in segs) >= len(segs) - slack
                (shown if whole else unshown).update(*segs)
        held -= unshown - shown - ids.free
    return sum(w for t, w in judged.items() if t in held) / total


def judged_terms(weights: Mapping[str, float]) -> list[str]:
    """The terms whose presence evidence_share weighs: the telling ones, or every term of a
    question that has none ("io", "x y z": short words are names in code too)."""
    return [t for t in weights if telling(t)] or list(weights)


def judged_weights(weights: Mapping[str, float], least: float = 0.0) -> dict[str, float]:
    """{judged term: its weight in evidence_share}: its idf, at least ``least``."""
    return {t: max(weights[t], least) for t in judged_terms(weights)}


def least_weight(n_files: int) -> float:
    """The least weight of a word in the relevance floor (SHARE_MIN_FRACTION) in a store of
    ``n_files`` file versions."""
    return min(SHARE_MIN_WEIGHT, SHARE_MIN_FRACTION * fts.bm25_idf(n_files, 0))


@dataclass(slots=True)
class FileEvidence:
    """What the candidates say about one file version."""

    file_id: int
    path: str
    language: str
    file_bm25: float = 0.0  # positive: higher is better
    chunk_bm25: float = 0.0  # its best chunk's
    vector: float = 0.0  # its best chunk's cosine similarity (semantic embedders only)
    n_chunks: int = 1  # the file version's chunk count (its size)
    generated: bool = False  # its first lines say a tool generated it
    cli_options: int = 0  # the command-line options it defines (chunking.cli_options)
    workspace: str = ""  # the root of the workspace it is in


def name_parts(name: str) -> tuple[str, str, str]:
    """A dotted name, its first part and its last part (``HelpFormatter.write_usage``:
    itself, ``HelpFormatter``, ``write_usage``): the names a question's identifier and a
    chunk's symbol are matched by (DEFINED_WEIGHT)."""
    return name, name.partition(".")[0], name.rpartition(".")[2]


def written_identifiers(question: str) -> frozenset[str]:
    """The names a question writes as code (DEFINED_WEIGHT), and the first and last parts
    of a dotted one (``HelpFormatter.write_usage``: both names, and the whole)."""
    out: set[str] = set()
    for m in _IDENTIFIER.finditer(question):
        word = (m.group(1) or m.group(2)).strip("()")
        if not _DOTTED_NAME.fullmatch(word) or _ABBREVIATION.fullmatch(
            question[m.start() : m.end() + 1]
        ):
            continue
        out.update(name_parts(word))
    return frozenset(w for w in out if len(w) > 2)


# The question's first word, when it is one of Latin letters, after a scope in lower case
# such as "walk: " or "zsh-completions: " (a change type is taken off before:
# split_change_type; "Note: ", "TODO: " are no scopes), and a "not" after it.
_FIRST_WORD = re.compile(
    r"(?:\s*[a-z0-9_./-]+(?:\([^()]*\))?:\s+)?\W*([A-Za-z]+)\b(?:\s+([Nn][Oo][Tt])\b)?"
)
# Endings of a verb's other forms ("Fixes", "Added", "Uses"), and what may replace them
# ("Using": "use").
_VERB_ENDINGS = (("es", ""), ("s", ""), ("ed", ""), ("d", ""), ("ing", ""), ("ing", "e"))


def _change_verb(word: str) -> bool:
    """Whether ``word`` (lower case) is a form of one of CHANGE_VERBS."""
    return word in CHANGE_VERBS or any(
        word.endswith(end) and len(word) > len(end) + 1 and word[: -len(end)] + add in CHANGE_VERBS
        for end, add in _VERB_ENDINGS
    )


def about_code(change: str, body: str, written: frozenset[str], named: NamedFiles | None) -> bool:
    """Whether a question reads as being about code, whatever the router made of it: its
    change type of code (CODE_CHANGE_TYPES; a "docs:" change is not), a name written as
    code (``written``: written_identifiers), a file it names (``named``:
    named_files), or a first word that opens a change (a form of one of CHANGE_VERBS:
    "Fix ...", "Added ...", "walk: Use ...") in a question that does not end with a
    question mark ("Use cases?" asks; "Use a guard" is a task). The code lane then weighs
    the kinds of file as for find_code in a find_knowledge question."""
    if change in ("docs", "doc"):
        return False  # "docs: update the install guide" is about documents
    if change in CODE_CHANGE_TYPES or written or named:
        return True
    first = _FIRST_WORD.match(body)
    if first is None or body.rstrip().endswith("?"):
        return False
    word = first.group(1).lower()
    # "Do not ..." as "Don't ...": "Do we have ..." is no change.
    return _change_verb(word) or (word == "do" and first.group(2) is not None)


def about_command_line(question: str) -> bool:
    """Whether a question is about a program's command line (CLI_WEIGHT)."""
    return _COMMAND_LINE.search(question) is not None


def defines_cli(f: FileEvidence, kind: str) -> bool:
    """Whether ``f`` is a source file that defines a command line (CLI_MIN_OPTIONS)."""
    return kind == "source" and f.cli_options >= CLI_MIN_OPTIONS


def score_files(
    files: Iterable[FileEvidence],
    weights: Mapping[str, float],
    priors: Mapping[str, float],
    vector_weight: float = 0.0,
    named: NamedFiles | None = None,
    command_line: bool = False,
    defining: int | None = None,
) -> dict[int, float]:
    """file_id -> score: the signals, each divided by its best value among ``files``,
    weighted, summed, times the kind's prior. A file of ``named`` gains NAMED_WEIGHT
    (a share of it in a question of more than NAMED_WORDS telling words); with
    ``command_line`` (about_command_line), a file that defines a command line is raised
    by CLI_WEIGHT; the file ``defining`` (the one that defines a name the question writes)
    by DEFINED_WEIGHT."""
    files = list(files)
    best_file = max((f.file_bm25 for f in files), default=0.0) or 1.0
    best_chunk = max((f.chunk_bm25 for f in files), default=0.0) or 1.0
    best_vec = max((f.vector for f in files), default=0.0) or 1.0
    stems: dict[str, float] = {}
    for t, w in weights.items():
        stems[_stem(t)] = stems.get(_stem(t), 0.0) + w
    total = sum(weights.values())
    paths = {
        f.file_id: (
            sum(w for st, w in stems.items() if st in _path_words(f.path)) / total
            if total > 0
            else 0.0
        )
        for f in files
    }
    best_path = max(paths.values(), default=0.0) or 1.0
    log_largest = math.log1p(max((f.n_chunks for f in files), default=1)) or 1.0
    named_bonus = 0.0
    if named:
        # The name counts as one word, however many parts it has.
        n_telling = 1 + sum(1 for t in weights if telling(t) and t not in named.terms)
        named_bonus = NAMED_WEIGHT * min(1.0, NAMED_WORDS / n_telling)
    out = {}
    for f in files:
        s = (
            FILE_WEIGHT * (f.file_bm25 / best_file) ** BM25_EXPONENT
            + CHUNK_WEIGHT * (f.chunk_bm25 / best_chunk) ** BM25_EXPONENT
            + PATH_WEIGHT * paths[f.file_id] / best_path
        )
        if vector_weight and f.vector > 0:
            s += vector_weight * f.vector / best_vec
        if named and named.names(f.path, f.workspace):
            s += named_bonus
        size = 1.0 + SIZE_WEIGHT * math.log1p(max(f.n_chunks, 0)) / log_largest
        kind = file_kind(f.path, f.language, f.generated)
        if command_line and defines_cli(f, kind):
            size *= 1.0 + CLI_WEIGHT
        if f.file_id == defining:
            size *= 1.0 + DEFINED_WEIGHT
        out[f.file_id] = s * size * priors[kind]
    return out
