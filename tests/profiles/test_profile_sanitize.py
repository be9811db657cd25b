"""Hostile text from users and models can never change the document's structure or owner."""

import re
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
from app.profiles.sanitize import is_legacy_bullet

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
    "Works as a <svg onload=alert(1)> engineer",
    "x</li><img src=x onerror=alert(1)>",
    "<?php system('id') ?>",
    "<https://evil.example/autolink>",
    "[click](javascript:alert(1))",
    "![](https://tracker.example/pixel.png?who=me)",
    "[ref]: javascript:alert(1)",
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
    assert not re.search(r"<[A-Za-z/!?]|\]\(", text)


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


# Hostile texts that are not already inert once flattened onto one line (bullets stored before
# markup was neutralised are read in their sanitised form instead: tested below).
FLATTENED = [text.replace("\n", " ") for text in NASTY]
UNSAFE_AS_IS = [
    text for text in FLATTENED if sanitize_bullet(text) != text and not is_legacy_bullet(text)
]


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


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "Works as a <svg onload=alert(1)> engineer",
            "Works as a &lt;svg onload=alert(1)> engineer",
        ),
        ("<b>bold</b> claims", "&lt;b>bold&lt;/b> claims"),
        ("Prefers List<T> generics", "Prefers List&lt;T> generics"),
        ("Map<String, List<Integer>>", "Map&lt;String, List&lt;Integer>>"),
        ("Latency < 5 ms, x<3 and a <= b", "Latency < 5 ms, x<3 and a <= b"),
        ("<!DOCTYPE html> and <?xml?>", "&lt;!DOCTYPE html> and &lt;?xml?>"),
        ("Reads [the docs](https://docs.example)", "Reads [the docs]\\(https://docs.example)"),
        ("![](https://tracker.example/p.png)", "![]\\(https://tracker.example/p.png)"),
        ("[ref]: javascript:alert(1)", "\\[ref]: javascript:alert(1)"),
        ("[redacted: email] at work", "[redacted: email] at work"),
        ("Uses &lt;T> already escaped", "Uses &lt;T> already escaped"),
    ],
)
def test_markup_is_neutralised_and_text_stays_readable(text: str, expected: str) -> None:
    assert sanitize_bullet(text) == expected
    assert sanitize_bullet(expected) == expected


MARKUP = [
    "Works as a <svg onload=alert(1)> engineer",
    "Prefers List<T> generics",
    "</li></ul><script>alert(1)</script>",
    "<img src=x onerror=alert(1)>",
    "<a href='javascript:alert(1)'>x</a>",
    "[click](javascript:alert(1))",
    "![](https://tracker.example/pixel.png)",
    "<https://evil.example>",
]


@pytest.mark.parametrize("text", MARKUP)
def test_a_markdown_renderer_with_html_enabled_runs_nothing_from_a_bullet(text: str) -> None:
    markdown_it = pytest.importorskip("markdown_it")
    profile = apply(empty_profile(OWNER), [Operation(OpKind.ADD, Section.WORK, text=text)], NOW)

    html = markdown_it.MarkdownIt("commonmark", {"html": True}).render(render(profile))

    tags = set(re.findall(r"<(/?[A-Za-z][\w-]*)", html))
    assert tags <= {
        "hr",
        "h1",
        "/h1",
        "h2",
        "/h2",
        "ul",
        "/ul",
        "li",
        "/li",
        "p",
        "/p",
        "em",
        "/em",
    }


def test_generic_types_read_the_same_once_rendered() -> None:
    markdown_it = pytest.importorskip("markdown_it")
    html = markdown_it.MarkdownIt("commonmark", {"html": True}).render(
        "- " + sanitize_bullet("Prefers List<T> generics") + "\n"
    )

    assert "List&lt;T&gt; generics" in html  # the browser shows List<T>


def test_a_bullet_stored_before_markup_was_neutralised_is_read_in_its_sanitised_form() -> None:
    legacy = "Works as a <svg onload=alert(1)> engineer"
    document = render(empty_profile(OWNER)).replace(
        "## Work Context\n_(empty)_", f"## Work Context\n- {legacy}\n- Prefers List<T> generics"
    )

    profile = parse(document)

    assert profile.bullets(Section.WORK) == (
        "Works as a &lt;svg onload=alert(1)> engineer",
        "Prefers List&lt;T> generics",
    )
    assert parse(render(profile)) == profile
