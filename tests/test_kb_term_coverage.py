"""The evidence policy without a reranker (docs/kb-retrieve.md, step 5): a source must
contain enough of the question's terms, each found by the part of its stem the word
shares, so a word whose stem ends differently (y -> i) still finds itself."""

from __future__ import annotations

import pytest
from knowledge_server.kb.retrieve import QuestionTerms


@pytest.mark.parametrize(
    ("question", "text", "share"),
    [
        ("zebrafinchcanary", "the zebrafinchcanary parcel service", 1.0),
        ("delivery policies", "our delivery policy, in short", 1.0),
        ("refunds", "a refund is returned", 1.0),
        ("policy", "the policies of the shop", 1.0),
        ("dying stars", "a dying star", 1.0),
        ("refund policy", "shipping times and parcels", 0.0),
        ("canary vault", "the canary sings", 0.5),
    ],
)
def test_a_question_term_is_found_by_its_stem_even_when_the_stem_ends_differently(
    question: str, text: str, share: float
) -> None:
    assert QuestionTerms(question).coverage(text.lower()) == share
