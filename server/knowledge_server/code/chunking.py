"""Cut a file into chunks: symbols (tree-sitter), markdown sections, or line windows.

Every chunk covers whole lines (1-based, inclusive). Lines of a file not covered by
a symbol (imports, module-level statements) become window chunks so that every
non-blank line of a file can be found.
"""

from __future__ import annotations

import hashlib
import importlib
import io
import os
import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from identify import identify

from ._redact_gate import redact_lines, redact_text
from .model import Chunk, IndexOptions, SourceKind

__all__ = [
    "CHUNKER_VERSION",
    "chunk_file",
    "chunk_id_for",
    "generated_header",
    "grammar_available",
    "language_for",
]

# Bump when chunk boundaries, the languages given, what is read from a file's text
# (generated_header, cli_options) or what redaction keeps of it change: it is part of every revision
# fingerprint, so the next index run reads and cuts every file again.
CHUNKER_VERSION = "code-chunker-11"

_EXT_LANG = {
    ".py": "python",
    ".pyi": "python",
    ".js": "javascript",
    ".mjs": "javascript",
    ".cjs": "javascript",
    ".jsx": "javascript",
    ".ts": "typescript",
    ".mts": "typescript",
    ".cts": "typescript",
    ".tsx": "tsx",
    ".go": "go",
    ".rs": "rust",
    ".java": "java",
    ".c": "c",
    ".h": "c",
    ".cc": "cpp",
    ".cpp": "cpp",
    ".cxx": "cpp",
    ".hpp": "cpp",
    ".hh": "cpp",
    ".hxx": "cpp",
    ".cs": "csharp",
    ".rb": "ruby",
    ".php": "php",
    ".md": "markdown",
    ".markdown": "markdown",
}

# language -> (module, function returning the grammar pointer)
_GRAMMARS = {
    "python": ("tree_sitter_python", "language"),
    "javascript": ("tree_sitter_javascript", "language"),
    "typescript": ("tree_sitter_typescript", "language_typescript"),
    "tsx": ("tree_sitter_typescript", "language_tsx"),
    "go": ("tree_sitter_go", "language"),
    "rust": ("tree_sitter_rust", "language"),
    "java": ("tree_sitter_java", "language"),
    "c": ("tree_sitter_c", "language"),
    "cpp": ("tree_sitter_cpp", "language"),
    "csharp": ("tree_sitter_c_sharp", "language"),
    "ruby": ("tree_sitter_ruby", "language"),
    "php": ("tree_sitter_php", "language_php"),
}


@dataclass(frozen=True, slots=True)
class _Rules:
    # Leaf symbols: emitted whole (split into windows only when enormous).
    defs: frozenset[str]
    # Class-like symbols: whole when small, else split into members + header.
    classes: frozenset[str]
    # Scopes that only add a name prefix (namespaces, modules of Rust).
    scopes: frozenset[str] = frozenset()
    # Wrappers whose inner definition names the chunk but whose range is kept.
    wrappers: frozenset[str] = frozenset()


_JS_DEFS = frozenset(
    {"function_declaration", "generator_function_declaration", "method_definition"}
)
_RULES: dict[str, _Rules] = {
    "python": _Rules(
        frozenset({"function_definition"}),
        frozenset({"class_definition"}),
        wrappers=frozenset({"decorated_definition"}),
    ),
    "javascript": _Rules(
        _JS_DEFS | {"lexical_declaration", "variable_declaration"},
        frozenset({"class_declaration"}),
        wrappers=frozenset({"export_statement"}),
    ),
    "typescript": _Rules(
        _JS_DEFS | {"lexical_declaration", "function_signature", "type_alias_declaration"},
        frozenset(
            {
                "class_declaration",
                "abstract_class_declaration",
                "interface_declaration",
                "enum_declaration",
            }
        ),
        scopes=frozenset({"internal_module", "module"}),
        wrappers=frozenset({"export_statement"}),
    ),
    "go": _Rules(
        frozenset({"function_declaration", "method_declaration", "type_declaration"}),
        frozenset(),
    ),
    "rust": _Rules(
        frozenset(
            {
                "function_item",
                "struct_item",
                "enum_item",
                "macro_definition",
                "type_item",
                "const_item",
                "static_item",
            }
        ),
        frozenset({"impl_item", "trait_item"}),
        scopes=frozenset({"mod_item"}),
    ),
    "java": _Rules(
        frozenset({"method_declaration", "constructor_declaration"}),
        frozenset(
            {
                "class_declaration",
                "interface_declaration",
                "enum_declaration",
                "record_declaration",
                "annotation_type_declaration",
            }
        ),
    ),
    "c": _Rules(
        frozenset({"function_definition", "struct_specifier", "enum_specifier", "type_definition"}),
        frozenset(),
    ),
    "cpp": _Rules(
        frozenset({"function_definition", "enum_specifier", "type_definition"}),
        frozenset({"class_specifier", "struct_specifier"}),
        scopes=frozenset({"namespace_definition"}),
        wrappers=frozenset({"template_declaration"}),
    ),
    "csharp": _Rules(
        frozenset(
            {
                "method_declaration",
                "constructor_declaration",
                "property_declaration",
                "enum_declaration",
                "delegate_declaration",
            }
        ),
        frozenset(
            {
                "class_declaration",
                "struct_declaration",
                "interface_declaration",
                "record_declaration",
            }
        ),
        scopes=frozenset({"namespace_declaration", "file_scoped_namespace_declaration"}),
    ),
    "ruby": _Rules(
        frozenset({"method", "singleton_method"}),
        frozenset({"class", "module"}),
    ),
    "php": _Rules(
        frozenset({"function_definition", "method_declaration"}),
        frozenset(
            {"class_declaration", "interface_declaration", "trait_declaration", "enum_declaration"}
        ),
        scopes=frozenset({"namespace_definition"}),
    ),
}
_RULES["tsx"] = _RULES["typescript"]
_JS_VALUE_FUNCS = frozenset(
    {"arrow_function", "function_expression", "function", "class", "generator_function"}
)

_BODY_SUFFIXES = ("body", "block", "declaration_list", "body_statement", "statement_block")

_parsers: dict[str, Any] = {}
_missing: set[str] = set()


# identify's tags that say what form a file has rather than its language, and those that
# name a family when a more precise tag comes with them (.bash: bash and shell; .mm:
# objective-c++ and c++; Jenkinsfile: groovy and jenkins).
_FORM_TAGS = frozenset({"text", "binary", "header", "image", "executable", "non-executable"})
_FAMILY_TAGS = frozenset({"shell", "c", "c++", "xml", "json", "jenkins", "plain-text"})
# identify's names that differ from the ones this package gives (the grammars' names).
_TAG_NAMES = {
    "c#": "csharp",
    "c++": "cpp",
    "f#": "fsharp",
    "objective-c": "objc",
    "objective-c++": "objcpp",
    "plain-text": "text",
    "pyi": "python",
    "shell": "sh",
    "ts": "typescript",
}
# Extensions of code that identify's tables lack.
_MORE_EXT_LANG = {
    ".rkt": "racket",
    ".el": "elisp",
    ".lisp": "lisp",
    ".tcl": "tcl",
    ".hx": "haxe",
    ".adb": "ada",
    ".ads": "ada",
    ".res": "rescript",
    ".resi": "rescript",
    ".re": "reason",
    ".sml": "sml",
    ".glsl": "glsl",
    ".mll": "ocaml",
    ".mly": "ocaml",
    ".ksh": "ksh",
    ".tcsh": "tcsh",
}
# Interpreters of #! lines that identify's table lacks (lower case).
_MORE_INTERPRETERS = {
    "pwsh": "powershell",
    "deno": "typescript",
    "bun": "typescript",
    "ts-node": "typescript",
    "tsx": "typescript",
    "zx": "javascript",
    "rscript": "r",
    "lua": "lua",
    "luajit": "lua",
    "tclsh": "tcl",
    "wish": "tcl",
    "elixir": "elixir",
    "swift": "swift",
    "kotlin": "kotlin",
    "runhaskell": "haskell",
    "runghc": "haskell",
    "uv": "python",  # uv run --script (inline script metadata)
    "julia": "julia",
    "crystal": "crystal",
    "groovy": "groovy",
    "scala": "scala",
    "fish": "fish",
    "mksh": "ksh",
    "gawk": "awk",
}


def _language_of(tags: set[str]) -> str:
    """One language name from identify's tags ("" when they name none)."""
    named = tags - _FORM_TAGS
    precise = (named - _FAMILY_TAGS) or named
    if not precise:
        return ""
    tag = min(precise)  # one name, the same every time, when several fit
    return _TAG_NAMES.get(tag, tag)


@lru_cache(maxsize=4_096)
def _language_by_name(name: str) -> str:
    language = _language_of(identify.tags_from_filename(name))
    return language or _MORE_EXT_LANG.get(os.path.splitext(name)[1].lower(), "")


def _language_by_interpreter(text: str) -> str:
    """The language of a ``#!`` line's interpreter: the first of its words that names one,
    so ``env -S uv run --script`` is python and ``npx tsx`` typescript ("" for none)."""
    words = identify.parse_shebang(io.BytesIO(text[:512].encode("utf-8", "replace")))
    for word in words[:4]:
        if word.startswith("-"):
            continue
        command = word.rpartition("/")[2]
        language = _language_of(identify.tags_from_interpreter(command)) or _MORE_INTERPRETERS.get(
            command.lower(), ""
        )
        if language:
            return language
    return ""


def language_for(path: str, text: str = "") -> str:
    """The file's language: by extension for the languages with grammars, else by
    identify's tables of extensions and well-known names (``build.gradle.kts``: kotlin,
    ``Makefile``: makefile, ``CMakeLists.txt``: cmake) and a few more extensions of code,
    else, for a file its name says nothing about (``README`` says text), by the interpreter
    of its ``#!`` line (``bin/deploy``: bash), else the extension itself, or "text" without one. Callers that
    classify files as the index does pass the file's first bytes as ``text``."""
    name = os.path.basename(path)
    ext = os.path.splitext(name)[1].lower()
    if ext in _EXT_LANG:
        return _EXT_LANG[ext]
    language = _language_by_name(name)
    if not language and text.startswith("#!"):
        language = _language_by_interpreter(text) or language
    return language or (ext[1:] if ext else "text")


# How generators mark their output, in the comments at the top of a file (the first ten
# lines, and on while comment lines go on: Go allows the mark anywhere before "package",
# after a licence block). One comment that names its generator by a mark of its own: Go's
# "Code generated by stringer; DO NOT EDIT." (as Go's tools check it), "@generated"
# (protoc-gen-es, mypy-protobuf, Cargo, rust-bindgen, Meta's tools), .NET's
# "<auto-generated>", "made by GNU Bison", "generated by GNU Autoconf" (and automake, flex,
# SWIG); or one that says it was generated and one (the same or another) that says not
# to edit, modify or change it (protoc, flatc, OpenAPI Generator, Android's R.java,
# Dart's build_runner). Only comment lines count: a line of code holding "DO NOT EDIT"
# (tomli's __version__, a generator's own template string) does not, nor a docstring
# that says "generated by betterproto2" without forbidding edits, nor Java's @Generated.
_GENERATOR_MARK = re.compile(
    r"Code generated .*DO NOT EDIT|@generated\b|(?i:<auto-?generated"
    r"|made by GNU Bison|generated by (GNU Autoconf|automake|flex|SWIG)\b)"
)
_SAYS_GENERATED = re.compile(r"(?i)\b(auto-?generated|generated)\b")
_SAYS_DO_NOT_EDIT = re.compile(r"(?i)\bdo not (edit|modify|make changes|change)\b")
_COMMENT_START = ("//", "#", "/*", "*", "<!--", "--", ";", "%", "(*", "{-", '"""', "'''")
_HEADER_LINES = 10
_HEADER_MAX_LINES = 80


def _header_comments(text: str) -> list[str]:
    """The comment lines among the first ten lines; past them, those of a file that has
    had only comments (and blank lines) so far, up to its first line of code."""
    out = []
    code_seen = False
    for i, line in enumerate(text[:8_000].split("\n", _HEADER_MAX_LINES)[:_HEADER_MAX_LINES]):
        stripped = line.strip()
        if i >= _HEADER_LINES and code_seen:
            break
        if stripped.startswith(_COMMENT_START):
            out.append(stripped)
        elif stripped:
            code_seen = True
    return out


def generated_header(text: str) -> bool:
    """Whether the comments at the top of the file say a tool generated it."""
    comments = _header_comments(text)
    if any(_GENERATOR_MARK.search(c) for c in comments):
        return True
    return any(_SAYS_GENERATED.search(c) for c in comments) and any(
        _SAYS_DO_NOT_EDIT.search(c) for c in comments
    )


# One command-line option (or positional argument) defined, in the libraries that define
# them most: clap (derive attributes and the builder), argparse, click and typer, cobra /
# pflag and Go's flag package, commander and yargs, picocli.
_CLI_OPTION = re.compile(
    r"#\[(?:arg|clap)\(|\bArg::(?:new|with_name)\("
    r"|\.add_argument\(|@(?:click\.)?(?:option|argument)\(|\btyper\.(?:Option|Argument)\("
    r"|\.(?:Persistent)?Flags\(\)\.\w+\(|\bflag\.(?:String|Bool|Int|Uint|Float64|Duration|Var)\w*\("
    r"|\.(?:required)?[oO]ption\(\s*['\"`]-"
    r"|@(?:CommandLine\.)?(?:Option|Parameters)\("
)


def cli_options(text: str) -> int:
    """How many command-line options the file defines (``_CLI_OPTION``): the file that
    declares a program's options holds its help texts, and questions about options, flags
    and help are about it (code.rank.CLI_WEIGHT)."""
    return len(_CLI_OPTION.findall(text))


def _parser(language: str) -> Any | None:
    if language in _parsers:
        return _parsers[language]
    if language in _missing or language not in _GRAMMARS:
        return None
    try:
        import tree_sitter

        mod_name, fn = _GRAMMARS[language]
        mod = importlib.import_module(mod_name)
        parser = tree_sitter.Parser(tree_sitter.Language(getattr(mod, fn)()))
    except Exception:  # noqa: BLE001 - any import/ABI failure means "no grammar": fall back
        _missing.add(language)
        return None
    _parsers[language] = parser
    return parser


def grammar_available(language: str) -> bool:
    return _parser(language) is not None


def chunk_id_for(workspace: str, path: str, start: int, end: int, content_hash: str) -> str:
    key = f"{workspace}|{path}|{start}|{end}|{content_hash}".encode()
    return hashlib.sha1(key, usedforsecurity=False).hexdigest()[:20]


# ---------------------------------------------------------------- symbol discovery


@dataclass(slots=True)
class _Span:
    start: int  # 0-based line, inclusive
    end: int  # 0-based line, inclusive
    kind: SourceKind
    symbol: str


def _text(node: Any) -> str:
    return node.text.decode("utf-8", "replace") if node is not None and node.text else ""


def _declarator_name(node: Any) -> str:
    # C/C++: function_definition -> declarator -> ... -> identifier / qualified name.
    cur = node
    for _ in range(8):
        nxt = cur.child_by_field_name("declarator")
        if nxt is None:
            break
        cur = nxt
        if cur.type in (
            "identifier",
            "field_identifier",
            "qualified_identifier",
            "destructor_name",
            "operator_name",
            "type_identifier",
        ):
            return _text(cur)
    return _text(cur) if cur is not node and cur.named_child_count == 0 else ""


def _name(node: Any, language: str) -> str:  # noqa: C901 - one branch per grammar's way of naming a symbol
    t = node.type
    if language in ("c", "cpp") and t == "function_definition":
        return _declarator_name(node)
    if t in ("lexical_declaration", "variable_declaration"):
        for d in node.named_children:
            if d.type == "variable_declarator":
                return _text(d.child_by_field_name("name"))
        return ""
    if t == "type_declaration":  # Go: type X struct {...}
        for d in node.named_children:
            if d.type in ("type_spec", "type_alias"):
                return _text(d.child_by_field_name("name"))
    if t == "method_declaration" and language == "go":
        recv = node.child_by_field_name("receiver")
        rtype = ""
        if recv is not None:
            for d in recv.named_children:
                ty = d.child_by_field_name("type")
                if ty is not None:
                    rtype = _text(ty).lstrip("*").split("[")[0]
        name = _text(node.child_by_field_name("name"))
        return f"{rtype}.{name}" if rtype else name
    if t == "impl_item":
        ty = _text(node.child_by_field_name("type"))
        tr = _text(node.child_by_field_name("trait"))
        return f"{ty}" if not tr else f"{ty}<{tr}>"
    if t == "type_definition":  # C typedef: last declarator
        d = node.child_by_field_name("declarator")
        return _text(d)
    n = node.child_by_field_name("name")
    if n is not None:
        return _text(n)
    for c in node.named_children:
        if c.type in ("identifier", "type_identifier", "constant", "name"):
            return _text(c)
    return ""


def _is_js_value_def(node: Any) -> bool:
    # `const f = () => ...` is a function; `const x = 3` is module-level code.
    for d in node.named_children:
        if d.type == "variable_declarator":
            v = d.child_by_field_name("value")
            if v is not None and v.type in _JS_VALUE_FUNCS:
                return True
    return False


class _SymbolCollector:
    def __init__(self, language: str, rules: _Rules, lines: list[str], opts: IndexOptions):
        self.language = language
        self.rules = rules
        self.lines = lines
        self.opts = opts
        self.spans: list[_Span] = []

    def _size_ok(self, start: int, end: int) -> bool:
        if end - start + 1 > self.opts.max_symbol_lines:
            return False
        return sum(len(self.lines[i]) for i in range(start, min(end + 1, len(self.lines)))) <= (
            self.opts.max_symbol_chars
        )

    def _classify(self, node: Any) -> tuple[str, Any] | None:
        """('def'|'class'|'scope', definition node) or None for plain code."""
        r = self.rules
        inner = node
        if node.type in r.wrappers:
            inner = None
            for c in node.named_children:
                if c.type in r.defs or c.type in r.classes or c.type in r.scopes:
                    inner = c
                    break
            if inner is None:
                return None
        t = inner.type
        if t in ("lexical_declaration", "variable_declaration") and not _is_js_value_def(inner):
            return None
        if t in r.classes:
            return "class", inner
        if t in r.defs:
            return "def", inner
        if t in r.scopes:
            return "scope", inner
        return None

    def collect(self, node: Any, prefix: str, depth: int = 0) -> None:
        for child in node.named_children:
            cls = self._classify(child)
            if cls is None:
                # Bodies (block, class_body, declaration_list ...) are searched a few levels
                # deep; statements inside functions are never reached because defs stop there.
                if depth < 3 and child.named_child_count and child.type.endswith(_BODY_SUFFIXES):
                    self.collect(child, prefix, depth + 1)
                continue
            kind, inner = cls
            name = _name(inner, self.language) or inner.type
            full = f"{prefix}.{name}" if prefix else name
            start, end = child.start_point[0], child.end_point[0]
            if child.end_point[1] == 0 and end > start:
                end -= 1
            if kind == "scope":
                self.collect(inner, full, 0)
                continue
            if kind == "def" or self._size_ok(start, end):
                self.spans.append(_Span(start, end, "symbol", full))
                continue
            before = len(self.spans)
            self.collect(inner, full, 0)
            members = self.spans[before:]
            # Header: the class line(s) up to its first member (signature, fields, docstring).
            first = min((m.start for m in members), default=end + 1)
            hdr_end = min(first - 1, end)
            if hdr_end >= start:
                self.spans.append(_Span(start, hdr_end, "symbol", full))
            self._class_ranges.append((start, end, full))

    _class_ranges: list[tuple[int, int, str]]


def _windows(
    start: int, end: int, size: int, overlap: int, kind: SourceKind = "window", symbol: str = ""
) -> list[_Span]:
    out: list[_Span] = []
    step = max(1, size - overlap)
    s = start
    while s <= end:
        e = min(end, s + size - 1)
        out.append(_Span(s, e, kind, symbol))
        if e >= end:
            break
        s += step
    return out


_CLOSER = re.compile(r"^\s*(?:[\}\)\];,]+|end|fi|done|esac)?\s*$")


def _insignificant(line: str) -> bool:
    """Blank lines and lone closers (``}``, ``end``) never form a chunk of their own."""
    return _CLOSER.match(line) is not None


def _fill_gaps(
    covered: list[bool], lines: list[str], lo: int, hi: int, opts: IndexOptions, symbol: str
) -> list[_Span]:
    out: list[_Span] = []
    i = lo
    while i <= hi:
        if covered[i] or _insignificant(lines[i]):
            i += 1
            continue
        j = i
        while j + 1 <= hi and not covered[j + 1]:
            j += 1
        while j > i and _insignificant(lines[j]):
            j -= 1
        out.extend(_windows(i, j, opts.window_lines, opts.window_overlap, "window", symbol))
        for k in range(i, j + 1):
            covered[k] = True
        i = j + 1
    return out


def _symbol_spans(
    text: str, lines: list[str], language: str, opts: IndexOptions
) -> list[_Span] | None:
    parser = _parser(language)
    rules = _RULES.get(language)
    if parser is None or rules is None:
        return None
    try:
        tree = parser.parse(text.encode("utf-8"))
    except Exception:  # noqa: BLE001 - a parser crash must not lose the file: use windows
        return None
    col = _SymbolCollector(language, rules, lines, opts)
    col._class_ranges = []
    col.collect(tree.root_node, "")
    spans: list[_Span] = []
    covered = [False] * len(lines)
    for sp in col.spans:
        sp.end = min(sp.end, len(lines) - 1)
        if sp.end - sp.start + 1 > opts.max_symbol_lines * 3:
            # An enormous function: windows that keep its name.
            spans.extend(
                _windows(
                    sp.start, sp.end, opts.window_lines, opts.window_overlap, "symbol", sp.symbol
                )
            )
        else:
            spans.append(sp)
        for k in range(sp.start, sp.end + 1):
            covered[k] = True
    # Code between members of a split class keeps the class name.
    for s, e, name in col._class_ranges:
        spans.extend(_fill_gaps(covered, lines, s, min(e, len(lines) - 1), opts, name))
    spans.extend(_fill_gaps(covered, lines, 0, len(lines) - 1, opts, ""))
    return spans


_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
_FENCE = re.compile(r"^\s*(```|~~~)")


def _markdown_spans(lines: list[str], opts: IndexOptions) -> list[_Span]:
    heads: list[tuple[int, int, str]] = []
    in_fence = False
    for i, ln in enumerate(lines):
        if _FENCE.match(ln):
            in_fence = not in_fence
            continue
        if not in_fence:
            m = _HEADING.match(ln)
            if m:
                heads.append((i, len(m.group(1)), m.group(2)))
    spans: list[_Span] = []
    stack: list[tuple[int, str]] = []
    bounds = [(0, 0, "")] if not heads or heads[0][0] > 0 else []
    bounds += heads
    for idx, (start, level, title) in enumerate(bounds):
        end = (bounds[idx + 1][0] - 1) if idx + 1 < len(bounds) else len(lines) - 1
        if level:
            while stack and stack[-1][0] >= level:
                stack.pop()
            stack.append((level, title))
        path = " > ".join(t for _, t in stack)
        while end > start and not lines[end].strip():
            end -= 1
        if not any(lines[k].strip() for k in range(start, end + 1)):
            continue
        if end - start + 1 > opts.max_section_lines:
            spans.extend(
                _windows(start, end, opts.window_lines, opts.window_overlap, "section", path)
            )
        else:
            spans.append(_Span(start, end, "section", path))
    return spans


def split_lines(text: str) -> list[str]:
    """Lines as editors and ``path:line`` references count them: split on ``\\n`` only
    (``str.splitlines`` also splits on form feeds and other separators)."""
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    if "\r" not in text:
        return lines
    return [ln.removesuffix("\r") for ln in lines]


def chunk_file(
    workspace: str, path: str, text: str, opts: IndexOptions | None = None
) -> tuple[list[Chunk], str, str]:
    """Chunks of one file, the language, and how it was cut ("symbols", "sections",
    "windows", or "fallback:<why>" when a grammar was missing or parsing failed)."""
    opts = opts or IndexOptions()
    language = language_for(path, text)
    lines = split_lines(text)
    if not lines:
        return [], language, "empty"
    method = "windows"
    spans: list[_Span] | None = None
    if language == "markdown":
        spans, method = _markdown_spans(lines, opts), "sections"
    elif language in _GRAMMARS:
        spans = _symbol_spans(text, lines, language, opts)
        method = (
            "symbols"
            if spans is not None
            else (
                "fallback:no-grammar" if not grammar_available(language) else "fallback:parse-error"
            )
        )
    if spans is None:
        covered = [False] * len(lines)
        spans = _fill_gaps(covered, lines, 0, len(lines) - 1, opts, "")
    spans.sort(key=lambda s: (s.start, s.end))
    chunks: list[Chunk] = []
    seen: set[str] = set()
    # Redact once per file (line count kept) rather than once per overlapping chunk.
    # In a grammar language's source an unquoted value is code, not a secret (redact).
    code = language in _GRAMMARS
    red_lines = redact_lines(lines, code)
    for sp in spans:
        body = "\n".join(red_lines[sp.start : sp.end + 1])
        content_hash = hashlib.sha1(
            body.encode("utf-8", "surrogatepass"), usedforsecurity=False
        ).hexdigest()
        cid = chunk_id_for(workspace, path, sp.start + 1, sp.end + 1, content_hash)
        if cid in seen:
            continue
        seen.add(cid)
        chunks.append(
            Chunk(
                cid,
                path,
                sp.start + 1,
                sp.end + 1,
                sp.kind,
                # A symbol is written text (a Markdown heading), redacted like the body.
                redact_text(sp.symbol, code)[:200],
                language,
                content_hash,
                body,
            )
        )
    return chunks, language, method
