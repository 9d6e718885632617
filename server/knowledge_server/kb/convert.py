"""Sources of a knowledge-base revision -> structured documents.

A ``Document`` is a title and an ordered list of ``Block`` values: headings (with their
level), text blocks (with the page they sit on, for paged formats) and FAQ entries
(question and answer together). ``kb.chunk`` turns it into chunks with a section path.

Local converters: Markdown (markdown-it-py, CommonMark plus tables), plain text, HTML
(selectolax), PDF (pypdfium2, one text block list per page, numbered from 1). Other media
types go to a Docling Serve instance when one is configured (``DoclingServeClient``).

Untrusted text stays data: nothing in a source is executed, fetched or followed. HTML
scripts, styles and embedded frames are dropped, links and images keep only their text,
Markdown's raw HTML blocks are kept as literal text, YAML front matter is read with the
safe loader for its ``title`` only, and a Docling answer is read as JSON values of the
expected types (anything else is ``ConversionMalformed``).

Every failure is a ``ConversionError`` with a ``category``: ``unsupported`` (media type),
``too_large`` (source over the limit), ``malformed`` (bytes or an answer that do not parse
as what they claim), and for the Docling port ``timeout``, ``unavailable`` (connection
refused, 5xx, 429) and ``rejected`` (4xx, or Docling reports the conversion failed).
"""

from __future__ import annotations

import json
import posixpath
import re
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import httpx
import pypdfium2
import yaml
from markdown_it import MarkdownIt
from markdown_it.token import Token
from selectolax.lexbor import LexborHTMLParser, LexborNode

__all__ = [
    "MEDIA_TYPES",
    "Block",
    "ConversionError",
    "ConversionMalformed",
    "ConversionRejected",
    "ConversionTimeout",
    "ConvertLimits",
    "Converter",
    "ConverterUnavailable",
    "DoclingServeClient",
    "Document",
    "FaqEntry",
    "Source",
    "SourceTooLarge",
    "UnsupportedMediaType",
    "convert_faq",
    "convert_html",
    "convert_markdown",
    "convert_pdf",
    "convert_text",
    "media_type_of",
]

MARKDOWN: Final = "text/markdown"
PLAIN: Final = "text/plain"
HTML: Final = "text/html"
PDF: Final = "application/pdf"
FAQ: Final = "application/x-knowledge-faq"
# Media types the local converters read; others need Docling Serve.
MEDIA_TYPES: Final = frozenset({MARKDOWN, PLAIN, HTML, PDF})
_EXTENSIONS: Final = {
    ".md": MARKDOWN,
    ".markdown": MARKDOWN,
    ".txt": PLAIN,
    ".text": PLAIN,
    ".html": HTML,
    ".htm": HTML,
    ".pdf": PDF,
    ".docx": "application/vnd.openxmlformats-officedocument.wordprocessingml.document",
    ".pptx": "application/vnd.openxmlformats-officedocument.presentationml.presentation",
    ".xlsx": "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet",
}


# --------------------------------------------------------------------------- errors


class ConversionError(Exception):
    """A source could not be converted. ``category`` is one of ``unsupported``,
    ``too_large``, ``malformed``, ``timeout``, ``unavailable``, ``rejected``; the message
    names the source and the cause, never its text."""

    category: str = "malformed"
    # Whether trying again later may succeed (the converter, not the source, failed).
    retryable: bool = False


class UnsupportedMediaType(ConversionError):
    category = "unsupported"


class SourceTooLarge(ConversionError):
    category = "too_large"


class ConversionMalformed(ConversionError):
    category = "malformed"


class ConversionTimeout(ConversionError):
    category = "timeout"
    retryable = True


class ConverterUnavailable(ConversionError):
    category = "unavailable"
    retryable = True


class ConversionRejected(ConversionError):
    category = "rejected"


# --------------------------------------------------------------------------- model


@dataclass(frozen=True)
class Block:
    """One unit of a document, in reading order.

    ``kind`` is ``heading`` (``level`` 1-6, ``text`` is the heading), ``text`` (a
    paragraph, list item, table row or code block) or ``faq`` (``question`` and its
    answer in ``text``). ``page`` is the 1-based page of paged formats, else None."""

    kind: str
    text: str
    level: int = 0
    page: int | None = None
    question: str = ""


@dataclass(frozen=True)
class Document:
    title: str
    media_type: str
    blocks: tuple[Block, ...]
    pages: int | None = None


@dataclass(frozen=True)
class Source:
    """An uploaded file: ``name`` is its file name (for the title and the media type when
    ``media_type`` is empty), ``data`` its bytes."""

    name: str
    data: bytes
    media_type: str = ""
    title: str = ""


@dataclass(frozen=True)
class FaqEntry:
    question: str
    answer: str


@dataclass(frozen=True)
class ConvertLimits:
    # Largest source accepted, in bytes (uploads are bounded again by the admin service).
    max_bytes: int = 32 * 1024 * 1024
    # Largest PDF, in pages: a small file can declare an enormous page tree.
    max_pages: int = 2_000
    # Largest FAQ entry (question + answer, in characters): an entry is one chunk.
    max_faq_chars: int = 8_000


def media_type_of(source: Source) -> str:
    """The declared media type (parameters such as ``; charset=`` dropped), or the one
    the file name's extension names; ``application/octet-stream`` when neither says."""
    declared = source.media_type.split(";", 1)[0].strip().lower()
    if declared and declared != "application/octet-stream":
        return "text/markdown" if declared == "text/x-markdown" else declared
    ext = posixpath.splitext(source.name.lower())[1]
    return _EXTENSIONS.get(ext, "application/octet-stream")


def _stem(name: str) -> str:
    base = posixpath.basename(name.replace("\\", "/"))
    return posixpath.splitext(base)[0] or base


def _decode(source: Source) -> str:
    try:
        return source.data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ConversionMalformed(
            f"source {source.name!r} is not UTF-8 text (byte {exc.start})"
        ) from None


def _clean(text: str) -> str:
    """Whitespace runs (newlines included) folded to one space; NULs dropped."""
    return " ".join(text.replace("\x00", "").split())


# --------------------------------------------------------------------------- plain text

_PARAGRAPH_BREAK = re.compile(r"\n[ \t]*\n+")


def convert_text(source: Source) -> Document:
    """Paragraphs separated by blank lines; line breaks inside one are kept."""
    text = _decode(source).replace("\r\n", "\n").replace("\r", "\n").replace("\x00", "")
    blocks = tuple(
        Block("text", para.strip()) for para in _PARAGRAPH_BREAK.split(text) if para.strip()
    )
    return Document(source.title or _stem(source.name), PLAIN, blocks)


# --------------------------------------------------------------------------- markdown

_FRONT_MATTER = re.compile(r"\A---[ \t]*\n(.*?)\n---[ \t]*(?:\n|\Z)", re.DOTALL)
_MD = MarkdownIt("commonmark", {"html": False}).enable("table")


def _front_matter(text: str) -> tuple[dict[str, Any], str]:
    m = _FRONT_MATTER.match(text)
    if not m:
        return {}, text
    try:
        meta = yaml.safe_load(m.group(1))
    except yaml.YAMLError:
        return {}, text  # not front matter after all: keep it as text
    if not isinstance(meta, dict):
        return {}, text
    return meta, text[m.end() :]


def _inline_text(token: Token) -> str:
    """The plain text of an inline token: link and emphasis marks dropped, images
    replaced by their alt text, breaks by spaces."""
    parts: list[str] = []
    for child in token.children or ():
        if child.type in ("text", "code_inline", "html_inline"):
            parts.append(child.content)
        elif child.type in ("softbreak", "hardbreak"):
            parts.append(" ")
        elif child.type == "image":
            parts.append(_inline_text(child))
    return _clean("".join(parts))


def _markdown_blocks(tokens: Sequence[Token]) -> Iterator[Block]:
    heading_level = 0
    row: list[str] | None = None
    list_depth = 0
    for tok in tokens:
        t = tok.type
        if t == "heading_open":
            heading_level = int(tok.tag[1])
        elif t == "heading_close":
            heading_level = 0
        elif t in ("bullet_list_open", "ordered_list_open"):
            list_depth += 1
        elif t in ("bullet_list_close", "ordered_list_close"):
            list_depth -= 1
        elif t == "tr_open":
            row = []
        elif t == "tr_close":
            if row and any(row):
                yield Block("text", " | ".join(row))
            row = None
        elif t == "inline":
            text = _inline_text(tok)
            if row is not None:
                row.append(text)
            elif heading_level:
                yield Block("heading", text, level=heading_level)
            elif text:
                yield Block("text", ("- " + text) if list_depth else text)
        elif t in ("fence", "code_block", "html_block"):
            body = tok.content.replace("\x00", "").strip("\n")
            if body.strip():
                yield Block("text", body)


def convert_markdown(source: Source, *, text: str | None = None) -> Document:
    """Headings, paragraphs, list items, table rows (cells joined by `` | ``) and code
    blocks, in order. The title is the front matter's ``title``, else the first level-1
    heading, else the file name."""
    raw = _decode(source) if text is None else text
    meta, body = _front_matter(raw.replace("\r\n", "\n"))
    blocks = list(_markdown_blocks(_MD.parse(body)))
    title = source.title
    if not title and isinstance(meta.get("title"), str):
        title = _clean(meta["title"])
    if not title:
        title = next((b.text for b in blocks if b.kind == "heading" and b.level == 1), "")
    description = meta.get("description")
    if isinstance(description, str) and description.strip():
        blocks.insert(0, Block("text", _clean(description)))
    return Document(title or _stem(source.name), MARKDOWN, tuple(blocks))


# --------------------------------------------------------------------------- HTML
# selectolax (lexbor) over BeautifulSoup: the same text, many times faster on the EIP
# corpus (measured, docs/kb-index.md "Why these libraries").

_DROPPED = "script, style, noscript, template, iframe, object, embed, svg, head"
_BLOCKS = "h1, h2, h3, h4, h5, h6, p, li, pre, tr, dt, dd, blockquote, figcaption, caption"
_BLOCK_TAGS = frozenset(t.strip() for t in _BLOCKS.split(","))
# Containers whose own text (outside the block elements in them) is kept as a paragraph.
_CONTAINERS = "div, section, article, main, td, th, body"
_CONTAINER_TAGS = frozenset(t.strip() for t in _CONTAINERS.split(","))


def _loose_text(node: LexborNode) -> str:
    """A container's text outside the block elements and containers inside it (those
    are paragraphs of their own), and outside anything holding one (a list, a table)."""
    parts = []
    for child in node.iter(include_text=True):
        tag = child.tag or ""
        if tag in _BLOCK_TAGS or tag in _CONTAINER_TAGS:
            continue
        if tag != "-text" and child.css_first(f"{_BLOCKS}, {_CONTAINERS}") is not None:
            continue
        parts.append(child.text() or "")
    return _clean(" ".join(parts))


def _inside_block(node: LexborNode) -> bool:
    parent = node.parent
    while parent is not None and parent.tag not in ("body", "html"):
        if parent.tag in _BLOCK_TAGS:
            return True
        parent = parent.parent
    return False


def convert_html(source: Source) -> Document:
    """Block elements in document order (an element inside another block element is
    part of that one's text); the title is ``<title>``, else the first ``<h1>``."""
    tree = LexborHTMLParser(_decode(source))
    title_node = tree.css_first("title")
    title = source.title or (_clean(title_node.text()) if title_node is not None else "")
    for node in tree.css(_DROPPED):
        node.decompose()
    blocks: list[Block] = []
    for node in tree.css(f"{_BLOCKS}, {_CONTAINERS}"):
        if _inside_block(node):
            continue
        tag = node.tag or ""
        if tag not in _BLOCK_TAGS:
            loose = _loose_text(node)
            if loose:
                blocks.append(Block("text", loose))
            continue
        if tag == "tr":
            cells = [_clean(c.text()) for c in node.css("th, td")]
            text = " | ".join(cells) if any(cells) else ""
        elif tag == "pre":
            text = (node.text() or "").replace("\x00", "").strip("\n")
        else:
            text = _clean(node.text())
        if not text.strip():
            continue
        if len(tag) == 2 and tag[0] == "h" and tag[1].isdigit():
            blocks.append(Block("heading", text, level=int(tag[1])))
        else:
            blocks.append(Block("text", ("- " + text) if tag == "li" else text))
    if not title:
        title = next((b.text for b in blocks if b.kind == "heading" and b.level == 1), "")
    return Document(title or _stem(source.name), HTML, tuple(blocks))


# --------------------------------------------------------------------------- PDF
# pypdfium2 (PDFium) over pypdf: the same text, several times faster (measured,
# docs/kb-index.md "Why these libraries"). PDFium is not thread-safe, so one document is read at a
# time in this process.

_PDFIUM = threading.Lock()


def convert_pdf(source: Source, *, max_pages: int = ConvertLimits.max_pages) -> Document:
    """The text of each page as paragraphs (blank-line separated) tagged with its page
    number, from 1. The title is the document's ``Title`` metadata, else the file name."""
    if not source.data.startswith(b"%PDF-"):
        raise ConversionMalformed(f"source {source.name!r} is not a PDF (no %PDF- header)")
    blocks: list[Block] = []
    with _PDFIUM:
        try:
            pdf = pypdfium2.PdfDocument(source.data)
        except pypdfium2.PdfiumError as exc:
            raise ConversionMalformed(f"source {source.name!r}: unreadable PDF ({exc})") from None
        try:
            pages = len(pdf)
            if pages > max_pages:
                raise SourceTooLarge(
                    f"source {source.name!r} has {pages} pages; the limit is {max_pages}"
                )
            meta_title = str(pdf.get_metadata_dict().get("Title") or "")
            for number in range(pages):
                page = pdf[number]
                try:
                    textpage = page.get_textpage()
                    try:
                        text = textpage.get_text_range()
                    finally:
                        textpage.close()
                finally:
                    page.close()
                text = text.replace("\r\n", "\n").replace("\r", "\n").replace("\x00", "")
                for para in _PARAGRAPH_BREAK.split(text):
                    if para.strip():
                        blocks.append(Block("text", para.strip(), page=number + 1))
        finally:
            pdf.close()
    title = source.title or _clean(meta_title) or _stem(source.name)
    return Document(title, PDF, tuple(blocks), pages=pages)


# --------------------------------------------------------------------------- FAQ


def convert_faq(
    title: str, entries: Sequence[FaqEntry], *, max_chars: int = ConvertLimits.max_faq_chars
) -> Document:
    """One ``faq`` block per entry (whitespace folded); an entry with an empty question
    or answer, or longer than ``max_chars``, is refused."""
    blocks = []
    for n, entry in enumerate(entries, 1):
        q, a = _clean(entry.question), entry.answer.replace("\x00", "").strip()
        if not q or not a:
            raise ConversionMalformed(f"FAQ entry {n} has an empty question or answer")
        if len(q) + len(a) > max_chars:
            raise SourceTooLarge(
                f"FAQ entry {n} has {len(q) + len(a)} characters; the limit is {max_chars}"
            )
        blocks.append(Block("faq", a, question=q))
    return Document(title, FAQ, tuple(blocks))


# --------------------------------------------------------------------------- Docling Serve


@dataclass(frozen=True)
class DoclingServeClient:
    """A Docling Serve instance (``/v1`` API), called synchronously from a worker thread.

    Sources up to ``async_from_bytes`` go to ``POST /v1/convert/file`` (the answer comes
    with the response, within ``timeout_s``). Larger ones are submitted to
    ``POST /v1/convert/file/async``, polled with ``GET /v1/status/poll/{task_id}`` every
    ``poll_interval_s`` until ``success`` or ``failure``, and read with
    ``GET /v1/result/{task_id}``; past ``max_wait_s`` in all the conversion is a timeout.
    Both ask for the JSON document (structure and page numbers) and Markdown (used when
    the JSON has no text items)."""

    base_url: str
    api_key: str = ""
    timeout_s: float = 120.0
    connect_timeout_s: float = 5.0
    async_from_bytes: int = 4 * 1024 * 1024
    poll_interval_s: float = 2.0
    max_wait_s: float = 900.0
    transport: httpx.BaseTransport | None = field(default=None, compare=False)

    def convert(self, source: Source, media_type: str) -> Document:
        with httpx.Client(
            base_url=self.base_url.rstrip("/"),
            timeout=httpx.Timeout(self.timeout_s, connect=self.connect_timeout_s),
            headers={"X-Api-Key": self.api_key} if self.api_key else {},
            transport=self.transport,
            follow_redirects=False,
        ) as http:
            if len(source.data) <= self.async_from_bytes:
                answer = self._call(http, "POST", "/v1/convert/file", source, media_type)
            else:
                answer = self._convert_async(http, source, media_type)
        return _docling_document(source, answer)

    def _form(self) -> dict[str, Any]:
        return {"to_formats": ["json", "md"], "image_export_mode": "placeholder"}

    def _call(
        self,
        http: httpx.Client,
        method: str,
        path: str,
        source: Source,
        media_type: str = "",
        *,
        params: Mapping[str, str] | None = None,
    ) -> dict[str, Any]:
        name = source.name
        try:
            if method == "POST":
                files = {"files": (posixpath.basename(name) or "source", source.data, media_type)}
                resp = http.post(path, data=self._form(), files=files)
            else:
                resp = http.get(path, params=params)
        except httpx.TimeoutException:
            raise ConversionTimeout(
                f"Docling Serve did not answer {path.split('/')[2]} for {name!r} within "
                f"{self.timeout_s:g} s"
            ) from None
        except httpx.TransportError as exc:
            raise ConverterUnavailable(
                f"Docling Serve at {self.base_url} is unreachable ({type(exc).__name__})"
            ) from None
        return _answer(resp, name)

    def _convert_async(self, http: httpx.Client, source: Source, media_type: str) -> dict[str, Any]:
        started = time.monotonic()
        task = self._call(http, "POST", "/v1/convert/file/async", source, media_type)
        task_id = task.get("task_id")
        if not isinstance(task_id, str) or not re.fullmatch(r"[A-Za-z0-9._-]{1,200}", task_id):
            raise ConversionMalformed(
                "Docling Serve answered the async submission without a task id"
            )
        status = str(task.get("task_status", ""))
        while status not in ("success", "failure"):
            if time.monotonic() - started > self.max_wait_s:
                raise ConversionTimeout(
                    f"Docling Serve task for {source.name!r} did not finish within "
                    f"{self.max_wait_s:g} s (last status {status or 'unknown'!r})"
                )
            time.sleep(self.poll_interval_s)
            polled = self._call(http, "GET", f"/v1/status/poll/{task_id}", source)
            polled_status = polled.get("task_status")
            if not isinstance(polled_status, str):
                raise ConversionMalformed("Docling Serve's task status has no task_status")
            status = polled_status
        if status == "failure":
            raise ConversionRejected(f"Docling Serve could not convert {source.name!r}")
        return self._call(http, "GET", f"/v1/result/{task_id}", source)


def _answer(resp: httpx.Response, name: str) -> dict[str, Any]:
    code = resp.status_code
    if code == 429 or code >= 500:
        raise ConverterUnavailable(f"Docling Serve answered HTTP {code} for {name!r}")
    if code >= 400:
        raise ConversionRejected(f"Docling Serve refused {name!r} with HTTP {code}")
    if code != 200:
        raise ConversionMalformed(f"Docling Serve answered HTTP {code} for {name!r}")
    try:
        body = json.loads(resp.content)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise ConversionMalformed(f"Docling Serve's answer for {name!r} is not JSON") from None
    if not isinstance(body, dict):
        raise ConversionMalformed(f"Docling Serve's answer for {name!r} is not a JSON object")
    return body


# Docling's item labels that carry no content of the document itself.
_DOCLING_SKIPPED = frozenset({"page_header", "page_footer", "picture", "caption_placeholder"})


def _docling_document(source: Source, answer: dict[str, Any]) -> Document:
    status = answer.get("status")
    if status not in ("success", "partial_success"):
        raise ConversionRejected(
            f"Docling Serve reports status {str(status)[:40]!r} for {source.name!r}"
        )
    doc = answer.get("document")
    if not isinstance(doc, dict):
        raise ConversionMalformed(f"Docling Serve's answer for {source.name!r} has no document")
    content = doc.get("json_content")
    if isinstance(content, dict) and isinstance(content.get("texts"), list) and content["texts"]:
        return _from_docling_json(source, content)
    md = doc.get("md_content")
    if isinstance(md, str):
        converted = convert_markdown(source, text=md)
        return Document(converted.title, media_type_of(source), converted.blocks)
    raise ConversionMalformed(
        f"Docling Serve's answer for {source.name!r} has neither json_content nor md_content"
    )


def _from_docling_json(source: Source, content: dict[str, Any]) -> Document:
    """A DoclingDocument's text items in order: ``title`` sets the title,
    ``section_header`` is a heading at its ``level`` (one below the title), the rest is
    text on the page of its first provenance."""
    title = source.title
    blocks: list[Block] = []
    pages: set[int] = set()
    for item in content["texts"]:
        if not isinstance(item, dict):
            raise ConversionMalformed(
                "Docling Serve's document has a text item that is not an object"
            )
        label, text = item.get("label"), item.get("text")
        if not isinstance(label, str) or not isinstance(text, str):
            raise ConversionMalformed(
                "Docling Serve's document has a text item without label or text"
            )
        if label in _DOCLING_SKIPPED or not text.strip():
            continue
        page = _docling_page(item.get("prov"))
        if page is not None:
            pages.add(page)
        if label == "title":
            title = title or _clean(text)
            blocks.append(Block("heading", _clean(text), level=1, page=page))
        elif label == "section_header":
            level = item.get("level", 1)
            level = level if isinstance(level, int) and 1 <= level <= 5 else 1
            blocks.append(Block("heading", _clean(text), level=level + 1, page=page))
        elif label == "list_item":
            blocks.append(Block("text", "- " + _clean(text), page=page))
        else:
            blocks.append(Block("text", text.replace("\x00", "").strip(), page=page))
    return Document(
        title or _stem(source.name),
        media_type_of(source),
        tuple(blocks),
        pages=max(pages, default=None),
    )


def _docling_page(prov: object) -> int | None:
    if not isinstance(prov, list) or not prov or not isinstance(prov[0], dict):
        return None
    page = prov[0].get("page_no")
    return page if isinstance(page, int) and page >= 1 else None


# --------------------------------------------------------------------------- routing


@dataclass(frozen=True)
class Converter:
    """Converts a source by its media type: the local converters first, Docling Serve
    for the media types they do not read (and for those in ``docling_for``, e.g. PDF
    when layout analysis is wanted). Without a Docling client those are refused."""

    limits: ConvertLimits = ConvertLimits()
    docling: DoclingServeClient | None = None
    docling_for: frozenset[str] = frozenset()

    def convert(self, source: Source) -> Document:
        if len(source.data) > self.limits.max_bytes:
            raise SourceTooLarge(
                f"source {source.name!r} has {len(source.data)} bytes; the limit is "
                f"{self.limits.max_bytes}"
            )
        media_type = media_type_of(source)
        if self.docling is not None and (
            media_type in self.docling_for or media_type not in MEDIA_TYPES
        ):
            return self.docling.convert(source, media_type)
        if media_type == MARKDOWN:
            return convert_markdown(source)
        if media_type == PLAIN:
            return convert_text(source)
        if media_type == HTML:
            return convert_html(source)
        if media_type == PDF:
            return convert_pdf(source, max_pages=self.limits.max_pages)
        raise UnsupportedMediaType(
            f"source {source.name!r} has media type {media_type!r}, which this server does not "
            "convert" + ("" if self.docling else " (no Docling Serve is configured)")
        )

    def convert_faq(self, title: str, entries: Sequence[FaqEntry]) -> Document:
        return convert_faq(title, entries, max_chars=self.limits.max_faq_chars)
