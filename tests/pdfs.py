"""Real PDFs for the knowledge-base tests, made with fpdf2: one page per text."""

from __future__ import annotations

from fpdf import FPDF


def make_pdf(pages: list[str], title: str = "") -> bytes:
    pdf = FPDF()
    if title:
        pdf.set_title(title)
    pdf.set_font("helvetica", size=12)
    for text in pages:
        pdf.add_page()
        pdf.multi_cell(0, 8, text)
    return bytes(pdf.output())
