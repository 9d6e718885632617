"""The evidence policy without a reranker (docs/kb-retrieve.md, step 5): a source must
contain enough of the question's terms, each found by the part of its stem the word
shares, so a word whose stem ends differently (y -> i) still finds itself; and only as a
whole word of the text, never as letters inside another word."""

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


@pytest.mark.parametrize(
    ("question", "text", "share"),
    [
        ("how tall is mars", "to install the market application", 0.0),
        ("is a cat a mammal", "choose the communication tab of the application", 0.0),
        ("how old is the moon", "open the folder of the bold moonlight theme", 0.0),
        ("refund arrive", "the refunded amount arrives", 1.0),
        ("installing applications", "to install the market application", 1.0),
        ("refund_policy", "the refund policy", 1.0),
        ("refund policy", "see refund_policy.md", 1.0),
        ("3 days", "within 1-3 working days", 1.0),
        ("3 days", "within 13 working days", 0.5),
        ("ёлка", "ёлки и ели", 1.0),
        ("работа", "заработать деньги", 0.0),
    ],
)
def test_a_question_term_is_found_as_a_whole_word_never_inside_another(
    question: str, text: str, share: float
) -> None:
    """KR-2: the letters of a term inside another word ("tall" in "install", "mar" of
    "mars" in "market") are not the term: a text holding only those does not answer."""
    assert QuestionTerms(question).coverage(text.lower()) == share
