"""The evidence policy without a reranker (docs/kb-retrieve.md, step 5): a source must
contain enough of the question's terms, each found by the part of its stem the word
shares, so a word whose stem ends differently (y -> i) still finds itself; and only as a
whole word of the text, never as letters inside another word."""

from __future__ import annotations

import pytest
from knowledge_server.kb.retrieve import QuestionTerms, RetrieveSettings


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


@pytest.mark.parametrize(
    ("question", "text", "answerable"),
    [
        (
            "What is the Wi-Fi password?",
            "Guest WiFi password: welcome123 (valid for 24 hours).",
            True,
        ),
        ("Can I update my e-mail?", "Update your email in Settings > Profile.", True),
        (
            "How do I set up the add-on?",
            "Installing the addon: open Extensions and click Install.",
            False,
        ),
        ("What's the CEO's e-mail?", "CEO contact email: ceo@example.com", True),
        ("Where's the manager's office?", "Manager office: building B, room 4.", True),
        ("Why won't my card work?", "If your card does not work, call the bank.", True),
        ("How do I upload a résumé?", "Upload résumés as PDF files.", True),
        ("Wann kommt die Rückerstattung?", "Rückerstattungen kommen nach 5 Tagen.", False),
        ("organization settings", "Organisation settings are under Admin.", True),
        ("Is API v2 supported?", "The APIv2 endpoint is supported until 2027.", True),
        ("What is the 2FA setup?", "Two-factor (2-FA) setup: scan the QR code.", True),
        ("Где мой e-mail?", "Ваш email указан в профиле.", True),
        ("iPhone 15の返品方法は？", "iPhone15の返品は30日以内です。", True),
    ],
)
def test_compounds_contractions_and_glued_digits_answer_as_the_substring_rule_did(
    question: str, text: str, answerable: bool
) -> None:
    """KR-2: the whole-word rule answers these questions as the substring rule before it
    did: a compound of the question ("Wi-Fi", "e-mail") is found by its joined form
    ("wifi", "email"), what follows an apostrophe ("s" of "what's", "t" of "won't") is no
    term, and letters and digits glued together ("APIv2", "iPhone15") are read as their
    runs, in the text and in the question."""
    share = QuestionTerms(question).coverage(text.lower())
    assert (share >= RetrieveSettings().min_term_coverage) is answerable


@pytest.mark.parametrize(
    ("question", "text", "share"),
    [
        ("wi-fi", "the wifi password", 1.0),
        ("wi-fi", "the wi-fi password", 1.0),
        ("wi-fi", "wifis and wireless", 1.0),
        ("wi-fi", "the wireless fidelity", 0.0),
        ("e-mail", "send a mail", 0.5),
        ("what's new", "whats new", 1.0),
        ("we'll ship", "we ship", 1.0),
        ("iphone15", "the iphone 15 case", 1.0),
        ("iphone15", "the iphone 16 case", 0.0),
        ("v2 endpoint", "the apiv2 endpoint", 0.5),
        ("api v2 endpoint", "the apiv2 endpoint", 1.0),
        ("v2", "the v3 endpoint", 0.0),
        ("15", "iphone15の返品", 1.0),
        ("15", "the model 115", 0.0),
        ("3 days", "within 13 working days", 0.5),
        ("tall-ish mars", "to install the market application", 0.0),
        ("mars", "the mars2 rover", 1.0),
        ("how tall", "install2 tall", 1.0),
        ("how tall", "install2", 0.0),
    ],
)
def test_joined_forms_and_runs_are_whole_words_too(question: str, text: str, share: float) -> None:
    """KR-2: a compound's joined form and a word's letter and digit runs count only as
    whole words of the text: "tall" is still not in "install", nor "15" in "115"."""
    assert QuestionTerms(question).coverage(text.lower()) == share


@pytest.mark.parametrize(
    ("term", "text"),
    [
        ("s3", "upload mp3 files up to 20 mb."),
        ("p99", "search returns at most 99 results per page."),
        ("h2", "backups run every 2 hours."),
        ("k8s", "the installer needs 8 gb of ram."),
        ("s3", "хранилище использует 3 диска."),
        ("db", "commit 9f2db3e4 back out the retry change"),
    ],
)
def test_an_identifier_of_one_letter_and_digits_is_found_only_whole(term: str, text: str) -> None:
    """KR-2: "s3", "p99", "h2", "k8s" name a thing only whole: a "3" or "99" alone in the
    text is not them; and the runs of a word of many letter and digit runs (a hash) are no
    words ("db" is not in "9f2db3e4"). Read by their runs, each was found, and a two-word
    question about one reached half its words, the default evidence threshold, on
    unrelated text."""
    assert QuestionTerms(term).coverage(text) == 0.0
    assert QuestionTerms(term).coverage(f"see the {term} docs") == 1.0


@pytest.mark.parametrize(
    ("question", "text", "share"),
    [
        ("60 fps", "records 4k60fps video", 1.0),
        ("1080 resolution", "supported resolution: 1920x1080", 1.0),
        ("iphone 15 pro case", "official iphone15pro case in black", 1.0),
        ("1.2.3 changelog", "changelog of version 4.5.6: 12 fixes and 23 new checks", 0.25),
        ("10.0.0.1", "the plan allows 100 users", 0.0),
        ("what changed in 2.0", "release 20 adds dark mode", 0.0),
    ],
)
def test_runs_of_glued_names_are_words_and_numbers_are_never_glued(
    question: str, text: str, share: float
) -> None:
    """KR-2: a word of several letter and digit runs that is no hash ("4k60fps",
    "1920x1080", "iphone15pro") holds each run as a word (only a word of exactly two runs
    did); two numbers side by side in the question are not one ("1.2.3" is not "12" and
    "23", "10.0.0.1" not "100"), so a number of the text no longer answers for two."""
    assert QuestionTerms(question).coverage(text) == pytest.approx(share, abs=0.01)
