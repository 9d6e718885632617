"""Knowledge-base converters and the structured chunker, on real files: the EIP Markdown
corpus, a PDF made here, HTML and text, and a Docling Serve port against a real local
HTTP server speaking its API (sync, async with polling, errors, slowness, bad JSON)."""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest
from knowledge_server.kb.chunk import ChunkSettings, chunk_document
from knowledge_server.kb.convert import (
    Block,
    ConversionMalformed,
    ConversionRejected,
    ConversionTimeout,
    Converter,
    ConverterUnavailable,
    ConvertLimits,
    DoclingServeClient,
    Document,
    FaqEntry,
    Source,
    SourceTooLarge,
    UnsupportedMediaType,
    convert_faq,
)
from knowledge_server.search.coordinator import count_tokens

from tests.pdfs import make_pdf

# --------------------------------------------------------------------------- Markdown corpus


def _eips(shared_data: Path) -> list[Path]:
    files = sorted((shared_data / "docs" / "eips").glob("eip-*.md"))
    if not files:
        pytest.skip("no EIP documents in the shared data folder")
    return files


def test_eip_corpus_converts_and_chunks_with_structure(shared_data: Path) -> None:
    """Every EIP converts; the title is its front matter's; chunks carry the headings
    above them, stay within the token bound and are numbered in order."""
    converter = Converter()
    settings = ChunkSettings(max_tokens=300, overlap_tokens=30)
    sections_seen: set[str] = set()
    total = 0
    for path in _eips(shared_data):
        data = path.read_bytes()
        doc = converter.convert(Source(path.name, data))
        front = data.decode().split("\n---", 1)[0]
        title_line = next(line for line in front.splitlines() if line.startswith("title:"))
        assert doc.title == title_line.split(":", 1)[1].strip().strip("'\""), path.name
        chunks = chunk_document(doc, settings)
        assert chunks, path.name
        assert [c.ordinal for c in chunks] == list(range(len(chunks)))
        for c in chunks:
            assert c.kind == "text" and c.title == doc.title and c.page is None
            assert c.text.strip()
            assert count_tokens(c.text) <= settings.max_tokens, (path.name, c.ordinal)
            sections_seen.update(c.section_path[:1])
        total += len(chunks)
    assert {"Abstract", "Specification", "Motivation", "Rationale"} <= sections_seen
    assert total > 500


def test_eip_chunking_is_deterministic_and_keeps_nested_sections(shared_data: Path) -> None:
    """The same document chunks the same way twice; the text under a sub-heading is in a
    chunk whose section path names the heading above it too, outermost first."""
    path = shared_data / "docs" / "eips" / "eip-1014.md"
    if not path.is_file():
        pytest.skip("eip-1014.md is not in the shared data folder")
    doc = Converter().convert(Source(path.name, path.read_bytes()))
    assert chunk_document(doc) == chunk_document(doc)
    blocks = list(doc.blocks)
    # This EIP's sections are level-3 headings with level-4 ones inside ("Address formula").
    under_sub = [
        (h.text, nxt.text)
        for h, nxt in itertools.pairwise(blocks)
        if h.kind == "heading" and h.level == 4 and nxt.kind == "text"
    ]
    assert len(under_sub) >= 2
    chunks = chunk_document(doc)
    for heading, text in under_sub:
        holder = next(c for c in chunks if c.section_path[-1:] == (heading,))
        assert holder.section_path == ("Rationale", heading)
        assert holder.text.startswith(text)


def test_markdown_structure_tables_code_and_raw_html_stay_text() -> None:
    """Headings nest, tables become rows, code blocks are kept verbatim, and raw HTML and
    link targets are data: nothing is rendered or followed."""
    md = (
        "---\ntitle: Refund policy\n---\n"
        "# Refund policy\n\nIntro [see](http://example.invalid/x) **bold**.\n\n"
        "## Timing\n\n| Case | Days |\n|---|---|\n| card | 3 |\n\n"
        "### Cards\n\n- first\n- second\n\n```\nrm -rf /\n```\n\n"
        "<script>alert(1)</script>\n"
    )
    doc = Converter().convert(Source("policy.md", md.encode()))
    assert doc.title == "Refund policy"
    texts = [b.text for b in doc.blocks if b.kind == "text"]
    assert "Intro see bold." in texts
    assert "card | 3" in texts
    assert "- first" in texts and "rm -rf /" in texts
    assert "<script>alert(1)</script>" in texts
    chunks = chunk_document(doc)
    by_text = {c.text.split("\n\n")[0]: c.section_path for c in chunks}
    assert by_text["Intro see bold."] == ()
    assert by_text["Case | Days"] == ("Timing",)
    assert by_text["- first"] == ("Timing", "Cards")


# --------------------------------------------------------------------------- PDF, HTML, text


def test_pdf_pages_are_numbered_from_one() -> None:
    """Each PDF page's text carries its page number into the chunks, which never span
    two pages; the title comes from the metadata."""
    data = make_pdf(
        [
            "Refunds are processed by the payments team.",
            "Card refunds arrive within three working days.",
            "Bank transfers take up to ten days.",
        ],
        title="Refund handbook",
    )
    doc = Converter().convert(Source("handbook.pdf", data))
    assert doc.title == "Refund handbook" and doc.pages == 3
    chunks = chunk_document(doc)
    pages = {c.page: c.text for c in chunks}
    assert set(pages) == {1, 2, 3}
    assert "three working days" in pages[2]
    assert "ten days" in pages[3] and "three" not in pages[3]


def test_pdf_over_the_page_limit_and_fake_pdf_are_refused() -> None:
    data = make_pdf(["one", "two", "three"])
    with pytest.raises(SourceTooLarge):
        Converter(ConvertLimits(max_pages=2)).convert(Source("big.pdf", data))
    with pytest.raises(ConversionMalformed):
        Converter().convert(Source("fake.pdf", b"not a pdf at all"))
    with pytest.raises(ConversionMalformed):
        Converter().convert(Source("cut.pdf", data[:200]))


def test_html_blocks_in_order_without_scripts() -> None:
    html = (
        "<html><head><title>Refund policy</title><style>p{}</style></head><body>"
        "<script>steal()</script><h1>Refund policy</h1><p>Intro <b>text</b>.</p>"
        "<h2>Timing</h2><ul><li><p>Cards: 3 days</p></li></ul>"
        "<table><tr><th>Case</th><th>Days</th></tr><tr><td>bank</td><td>10</td></tr></table>"
        "<iframe src='http://example.invalid'>frame text</iframe>"
        "<div>Loose <i>text</i> in a div<p>and its paragraph</p></div></body></html>"
    )
    doc = Converter().convert(Source("p.html", html.encode()))
    assert doc.title == "Refund policy"
    assert [(b.kind, b.text) for b in doc.blocks] == [
        ("heading", "Refund policy"),
        ("text", "Intro text."),
        ("heading", "Timing"),
        ("text", "- Cards: 3 days"),
        ("text", "Case | Days"),
        ("text", "bank | 10"),
        ("text", "Loose text in a div"),
        ("text", "and its paragraph"),
    ]


def test_plain_text_paragraphs_and_media_types() -> None:
    doc = Converter().convert(Source("notes.txt", b"first line\nsame para\n\n\nsecond para\n"))
    assert doc.title == "notes"
    assert [b.text for b in doc.blocks] == ["first line\nsame para", "second para"]
    # The declared media type wins over the file name.
    md = Converter().convert(Source("upload.bin", b"# T\n\nbody", media_type="text/markdown"))
    assert md.title == "T"
    with pytest.raises(UnsupportedMediaType):
        Converter().convert(Source("slides.pptx", b"PK\x03\x04"))
    with pytest.raises(UnsupportedMediaType):
        Converter().convert(Source("x", b"data", media_type="image/png"))
    with pytest.raises(SourceTooLarge):
        Converter(ConvertLimits(max_bytes=10)).convert(Source("a.txt", b"x" * 11))
    with pytest.raises(ConversionMalformed):
        Converter().convert(Source("latin1.txt", "café".encode("latin-1")))


# --------------------------------------------------------------------------- FAQ and chunker


def test_faq_entry_is_never_split() -> None:
    answer = "Refunds go back to the original card. " * 200
    doc = convert_faq("FAQ", [FaqEntry("When?", "Soon."), FaqEntry("How  long\n is it?", answer)])
    chunks = chunk_document(doc, ChunkSettings(max_tokens=50, overlap_tokens=5))
    assert [(c.kind, c.text) for c in chunks] == [
        ("faq", "When?\nSoon."),
        ("faq", "How long is it?\n" + answer.strip()),
    ]
    with pytest.raises(ConversionMalformed):
        convert_faq("FAQ", [FaqEntry(" ", "answer")])
    with pytest.raises(SourceTooLarge):
        convert_faq("FAQ", [FaqEntry("q", "a" * 50)], max_chars=20)


def test_long_sections_split_with_overlap_within_their_section() -> None:
    """A section over the bound becomes several chunks, each starting with the end of the
    previous one; a new section starts fresh; a block without spaces is cut too."""
    words = [f"word{i}" for i in range(400)]
    blocks = (
        Block("heading", "Long", level=2),
        *(Block("text", " ".join(words[i : i + 20])) for i in range(0, 400, 20)),
        Block("heading", "Other", level=2),
        Block("text", "fresh start"),
        Block("heading", "CJK", level=2),
        Block("text", "退款" * 500),
    )
    settings = ChunkSettings(max_tokens=100, overlap_tokens=10)
    chunks = chunk_document(Document("T", "text/plain", blocks), settings)
    long = [c for c in chunks if c.section_path == ("Long",)]
    assert len(long) > 3
    for prev, nxt in itertools.pairwise(long):
        assert nxt.text.split()[0] in prev.text.split()[-10:]
    assert all(count_tokens(c.text) <= 100 for c in chunks)
    joined = " ".join(c.text for c in long)
    assert all(w in joined.split() for w in words)
    other = [c for c in chunks if c.section_path == ("Other",)]
    assert [c.text for c in other] == ["fresh start"]
    cjk = [c for c in chunks if c.section_path == ("CJK",)]
    assert len(cjk) > 1 and "".join(c.text for c in cjk).count("退款") >= 500


# --------------------------------------------------------------------------- Docling Serve


class _Docling(BaseHTTPRequestHandler):
    """Speaks the part of Docling Serve's v1 API the port uses. ``mode`` picks the
    behaviour: ok, async, fail500, slow, badjson, reject415, failure, taskfail."""

    mode: ClassVar[str] = "ok"
    polls: ClassVar[list[str]] = []
    uploads: ClassVar[list[bytes]] = []

    def log_message(self, format: str, *args: Any) -> None:
        return

    def _json(self, body: object, code: int = 200) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    @staticmethod
    def _result() -> dict[str, Any]:
        texts = [
            {"label": "page_header", "text": "ACME confidential", "prov": [{"page_no": 1}]},
            {"label": "title", "text": "Refund handbook", "prov": [{"page_no": 1}]},
            {"label": "section_header", "level": 1, "text": "Timing", "prov": [{"page_no": 1}]},
            {"label": "text", "text": "Cards take three days.", "prov": [{"page_no": 1}]},
            {"label": "list_item", "text": "Bank: ten days", "prov": [{"page_no": 2}]},
        ]
        return {
            "document": {"filename": "h.docx", "json_content": {"texts": texts}, "md_content": "x"},
            "status": "success",
            "errors": [],
            "processing_time": 0.1,
        }

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        ctype = self.headers.get("Content-Type", "")
        if not ctype.startswith("multipart/form-data") or b'name="files"' not in body:
            self._json({"detail": "files required"}, 422)
            return
        type(self).uploads.append(body)
        mode = type(self).mode
        if self.path == "/v1/convert/file/async":
            self._json({"task_id": "task-1", "task_status": "pending", "task_position": 1})
        elif mode == "fail500":
            self._json({"detail": "boom"}, 500)
        elif mode == "slow":
            time.sleep(1.0)
            self._json(self._result())
        elif mode == "badjson":
            data = b'{"document": {"md_'
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        elif mode == "reject415":
            self._json({"detail": "unsupported"}, 415)
        elif mode == "failure":
            self._json({"document": {}, "status": "failure", "errors": [{"error_message": "x"}]})
        else:
            self._json(self._result())

    def do_GET(self) -> None:
        cls = type(self)
        if self.path.startswith("/v1/status/poll/task-1"):
            cls.polls.append(self.path)
            if cls.mode == "taskfail":
                self._json({"task_id": "task-1", "task_status": "failure"})
            elif len(cls.polls) < 3:
                self._json({"task_id": "task-1", "task_status": "started"})
            else:
                self._json({"task_id": "task-1", "task_status": "success"})
        elif self.path == "/v1/result/task-1":
            self._json(self._result())
        else:
            self._json({"detail": "not found"}, 404)


@pytest.fixture
def docling() -> Iterator[str]:
    _Docling.mode, _Docling.polls, _Docling.uploads = "ok", [], []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Docling)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


DOCX = Source("handbook.docx", b"PK\x03\x04 not really a docx")


def _expect_handbook(doc: Document) -> None:
    assert doc.title == "Refund handbook" and doc.pages == 2
    chunks = chunk_document(doc)
    assert [(c.section_path, c.page, c.text) for c in chunks] == [
        (("Timing",), 1, "Cards take three days."),
        (("Timing",), 2, "- Bank: ten days"),
    ]


def test_docling_sync_conversion_keeps_structure_and_pages(docling: str) -> None:
    doc = Converter(docling=DoclingServeClient(docling)).convert(DOCX)
    _expect_handbook(doc)
    assert _Docling.uploads and DOCX.data in _Docling.uploads[0]


def test_docling_async_conversion_polls_until_done(docling: str) -> None:
    _Docling.mode = "async"
    client = DoclingServeClient(docling, async_from_bytes=4, poll_interval_s=0.01)
    _expect_handbook(Converter(docling=client).convert(DOCX))
    assert len(_Docling.polls) == 3


def test_docling_pdf_only_when_asked(docling: str) -> None:
    pdf = Source("h.pdf", make_pdf(["local text"]))
    local = Converter(docling=DoclingServeClient(docling)).convert(pdf)
    assert [b.text for b in local.blocks] == ["local text"] and not _Docling.uploads
    remote = Converter(
        docling=DoclingServeClient(docling), docling_for=frozenset({"application/pdf"})
    )
    _expect_handbook(remote.convert(pdf))


@pytest.mark.parametrize(
    ("mode", "error", "category"),
    [
        ("fail500", ConverterUnavailable, "unavailable"),
        ("slow", ConversionTimeout, "timeout"),
        ("badjson", ConversionMalformed, "malformed"),
        ("reject415", ConversionRejected, "rejected"),
        ("failure", ConversionRejected, "rejected"),
    ],
)
def test_docling_errors_are_typed(docling: str, mode: str, error: type, category: str) -> None:
    _Docling.mode = mode
    client = DoclingServeClient(docling, timeout_s=0.3)
    with pytest.raises(error) as info:
        Converter(docling=client).convert(DOCX)
    assert info.value.category == category


def test_docling_async_failure_and_deadline(docling: str) -> None:
    _Docling.mode = "taskfail"
    client = DoclingServeClient(docling, async_from_bytes=4, poll_interval_s=0.01)
    with pytest.raises(ConversionRejected):
        Converter(docling=client).convert(DOCX)
    _Docling.mode, _Docling.polls = "async", []
    slow = DoclingServeClient(docling, async_from_bytes=4, poll_interval_s=0.05, max_wait_s=0.01)
    with pytest.raises(ConversionTimeout) as info:
        Converter(docling=slow).convert(DOCX)
    assert info.value.retryable


def test_docling_unreachable_is_unavailable() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Docling)
    port = server.server_address[1]
    server.server_close()  # nothing listens there now
    with pytest.raises(ConverterUnavailable):
        Converter(docling=DoclingServeClient(f"http://127.0.0.1:{port}")).convert(DOCX)


def test_the_configured_docling_serve_converts_what_the_local_converters_do_not(
    docling: str, tmp_path: Path
) -> None:
    """kb_docling_url turns Docling Serve on for Office files (and the types in
    kb_docling_for); without it they are refused at upload, with the supported list."""
    from knowledge_server.config import ConfigError, load_config
    from knowledge_server.kb import pipeline
    from knowledge_server.runtime import kb_converter

    local = kb_converter(load_config(env={}, overrides={"data_dir": str(tmp_path)}))
    assert local.docling is None and pipeline.media_type_of("a.docx") is None
    cfg = load_config(
        env={},
        overrides={
            "data_dir": str(tmp_path),
            "kb_docling_url": docling,
            "kb_docling_for": ["application/pdf"],
        },
    )
    conv = kb_converter(cfg)
    assert conv.docling is not None and conv.docling_for == frozenset({"application/pdf"})
    assert pipeline.media_type_of("a.docx", docling=True) is not None
    doc = conv.convert(Source(name="report.docx", data=b"PK\x03\x04 office bytes"))
    assert doc.blocks and _Docling.uploads  # the server received the file
    with pytest.raises(ConfigError, match="kb_docling_url"):
        load_config(env={}, overrides={"data_dir": str(tmp_path), "kb_docling_url": "ftp://x"})


def test_the_converter_takes_what_the_upload_limit_admits(tmp_path: Path) -> None:
    """``kb_max_source_mib`` above 32 was accepted by uploads, but the converter kept its
    own 32 MiB limit, so every such file failed processing (``too_large``)."""
    from knowledge_server.config import load_config
    from knowledge_server.runtime import kb_converter

    cfg = load_config(env={}, overrides={"data_dir": str(tmp_path), "kb_max_source_mib": 64})
    conv = kb_converter(cfg)
    assert conv.limits.max_bytes == 64 * 1024 * 1024  # what Converter.convert checks
    small = load_config(env={}, overrides={"data_dir": str(tmp_path), "kb_max_source_mib": 1})
    with pytest.raises(SourceTooLarge):
        kb_converter(small).convert(Source(name="a.md", data=b"x" * (1024 * 1024 + 1)))
