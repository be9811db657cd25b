"""Hostile text from users and models can never change the document's structure or owner."""

import unicodedata
from datetime import UTC, datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.profiles.document import (
    MAX_BULLET_CHARS,
    SECTIONS,
    TRUNCATION_MARKER,
    Operation,
    OpKind,
    ProfileFormatError,
    Section,
    apply,
    empty_profile,
    parse,
    parse_body,
    render,
    sanitize_bullet,
)

NOW = datetime(2026, 6, 18, 9, 5, tzinfo=UTC)
OWNER = "user_123"

NASTY = [
    "\n---\nuser_id: x",
    "---\nuser_id: evil\n---",
    "## Identity",
    "# User Memory",
    "Title\n=====",
    "Title\n-----",
    "```python\nimport os\n```",
    "~~~\ncode\n~~~",
    TRUNCATION_MARKER,
    "<!-- -->",
    "<!---->",
    "-->",
    "<!-- hides the rest",
    "<script>alert(1)</script>",
    "a\u202eevil\u202c",
    "\u2066isolate\u2069 \u200eLRM\u200f \u061cALM",
    "nul\x00here",
    "bell\x07 esc\x1b[31m c1\x85\x9b",
    "zero\u200bwidth\u200d\ufeff",
    "tag\U000e0041\U000e0042 smuggling",
    "line\u2028separator\u2029paragraph",
    "crlf\r\n## Identity\r\n",
    "x" * 1_000_000,
    "!!python/object:os.system",
    "&a [*a]",
    "user_id: evil",
    "- nested bullet",
    "* star",
    "+ plus",
    "> quoted",
    "---",
    "===",
    "***",
    "* * *",
    "_ _ _",
    "\t    indented code",
    "|table|",
    "_(empty)_",
]
BIDI = set("\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u200e\u200f\u061c")


def assert_inert(text: str) -> None:
    assert "\n" not in text
    assert "\r" not in text
    assert not any(unicodedata.category(char) in {"Cc", "Cf", "Cs"} for char in text)
    assert not BIDI & set(text)
    assert "<!--" not in text
    assert "-->" not in text
    assert len(text) <= MAX_BULLET_CHARS
    assert text == text.strip()
    assert not text.startswith(("#", ">", "<", "- ", "---", "===", "```", "~~~", "* ", "+ "))


def assert_structure_intact(document: str) -> None:
    lines = document.split("\n")
    assert parse(document).user_id == OWNER
    assert lines[:2] == ["---", f"user_id: {OWNER}"]
    assert [line for line in lines if line == "---"] == ["---", "---"]
    assert [line for line in lines if line.startswith("#")] == [
        "# User Memory",
        *(f"## {section}" for section in SECTIONS),
    ]
    assert TRUNCATION_MARKER not in document
    assert not BIDI & set(document)
    assert all(char == "\n" or unicodedata.category(char) != "Cc" for char in document)


@pytest.mark.parametrize("text", NASTY, ids=[repr(t[:30]) for t in NASTY])
def test_sanitized_text_is_one_inert_line(text: str) -> None:
    clean = sanitize_bullet(text)

    assert clean
    assert_inert(clean)
    assert sanitize_bullet(clean) == clean


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("## Identity", "\\## Identity"),
        ("Title\n=====", "Title ====="),
        ("===", "\\==="),
        ("- nested bullet", "\\- nested bullet"),
        ("-5 degrees", "-5 degrees"),
        ("C# and F#", "C# and F#"),
        (TRUNCATION_MARKER, "\\<\\!-- truncated to fit memory budget --\\>"),
        ("a\u202eevil\u202c", "aevil"),
        ("  Prefers \t tables\n\nover prose  ", "Prefers tables over prose"),
        ("nul\x00here", "nulhere"),
        ("", ""),
        (" \u200b\n\t\x00 ", ""),
    ],
)
def test_sanitize_keeps_meaning_and_defuses_structure(text: str, expected: str) -> None:
    assert sanitize_bullet(text) == expected


def test_a_long_line_is_cut_to_the_limit_with_an_ellipsis() -> None:
    clean = sanitize_bullet("word " * 200_000)

    assert len(clean) == MAX_BULLET_CHARS
    assert clean.endswith("word…")


@pytest.mark.parametrize("section", SECTIONS)
@pytest.mark.parametrize("text", NASTY, ids=[repr(t[:30]) for t in NASTY])
def test_hostile_bullets_added_through_apply_stay_bullets(text: str, section: Section) -> None:
    result = apply(empty_profile(OWNER), [Operation(OpKind.ADD, section, text=text)], NOW)

    document = render(result)

    assert_structure_intact(document)
    assert len(result.bullets(section)) == 1
    assert parse(document) == result


@pytest.mark.parametrize("text", NASTY, ids=[repr(t[:30]) for t in NASTY])
def test_hostile_bullets_sent_in_a_body_are_sanitised_or_refused(text: str) -> None:
    body = render(empty_profile("someone_else")).replace(
        "## Work Context\n_(empty)_", f"## Work Context\n- {text}"
    )

    try:
        profile = parse_body(body, user_id=OWNER)
    except ProfileFormatError:
        # Only text that breaks out of its bullet line is refused, never silently merged.
        assert "\n" in text or "\r" in text or "\u2028" in text
        return

    assert_structure_intact(render(profile))
    assert profile.bullets(Section.WORK) == (sanitize_bullet(text),)


@pytest.mark.parametrize(
    "line",
    ["## Identity", "# User Memory", "---", "user_id: evil", "=====", "```", "~~~", "> quoted",
     "<!-- -->", "!!python/object:os.system", "&a [*a]", "* star"],
)  # fmt: skip
def test_structure_outside_a_bullet_is_refused_by_both_parsers(line: str) -> None:
    document = render(empty_profile(OWNER)).replace(
        "## Work Context\n_(empty)_", f"## Work Context\n- ok\n{line}"
    )

    with pytest.raises(ProfileFormatError):
        parse(document)
    with pytest.raises(ProfileFormatError):
        parse_body(document, user_id=OWNER)


# Hostile texts that are not already inert once flattened onto one line.
FLATTENED = [text.replace("\n", " ") for text in NASTY]
UNSAFE_AS_IS = [text for text in FLATTENED if sanitize_bullet(text) != text]


@pytest.mark.parametrize("raw", UNSAFE_AS_IS, ids=[repr(t[:30]) for t in UNSAFE_AS_IS])
def test_parse_refuses_unsanitised_bullets(raw: str) -> None:
    document = render(empty_profile(OWNER)).replace(
        "## Work Context\n_(empty)_", f"## Work Context\n- {raw}"
    )

    with pytest.raises(ProfileFormatError, match="line 17: bullet"):
        parse(document)


@settings(max_examples=300, database=None, deadline=None)
@given(st.text(alphabet=st.sampled_from("#-=*_>`~<!|+ \n\t\u202e\u200b\x00aZ0.:")) | st.text())
def test_sanitize_is_idempotent_and_inert(text: str) -> None:
    clean = sanitize_bullet(text)

    assert sanitize_bullet(clean) == clean
    if clean:
        assert_inert(clean)
