"""The memory page's copies of the profile format say what app/profiles/document.py says: the
section titles in order, the title line a new profile starts with, the truncation marker, the
empty-section placeholder and the number of lines the frontmatter (and the blank line after it)
takes in a rendered profile. The page needs them before any profile is loaded (to offer a new
one, to number a diff's lines), so it keeps them as constants in app/ui/memory.js, read here
from its source."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from typing import Any

import pytest

from app.kit.config import PROJECT_ROOT
from app.profiles.document import (
    EMPTY_PLACEHOLDER,
    SECTIONS,
    TITLE_LINE,
    TRUNCATION_MARKER,
    Profile,
    empty_profile,
    render,
)
from app.profiles.profile import Frontmatter

SCRIPT = PROJECT_ROOT / "app" / "ui" / "memory.js"
# a JSON-compatible literal: a double-quoted string, an integer, or an array of strings
LITERAL = r'("(?:[^"\\\n]|\\.)*"|-?\d+|\[[^\]]*\])'


def js_constant(source: str, name: str) -> Any:
    """The value of `const NAME = <literal>;` in memory.js (declared exactly once)."""
    declarations = re.findall(rf"\bconst {name}\s*=\s*{LITERAL}\s*;", source)
    assert len(declarations) == 1, f"memory.js must declare `const {name} = <literal>;` once"
    return json.loads(re.sub(r",\s*\]$", "]", declarations[0]))


def frontmatter_lines(profile: Profile) -> int:
    """How many lines of the rendered profile come before its title: the page numbers a diff's
    lines and leaves these out."""
    return render(profile).split("\n").index(TITLE_LINE)


def test_the_page_knows_the_sections_of_the_profile_in_their_order() -> None:
    source = SCRIPT.read_text("utf-8")
    assert js_constant(source, "SECTIONS") == [section.value for section in SECTIONS]


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("TITLE_LINE", TITLE_LINE),
        ("TRUNCATION_MARKER", TRUNCATION_MARKER),
        ("EMPTY_PLACEHOLDER", EMPTY_PLACEHOLDER),
    ],
)
def test_the_page_knows_the_marker_lines_of_the_profile(name: str, value: str) -> None:
    assert js_constant(SCRIPT.read_text("utf-8"), name) == value


def test_the_page_knows_how_many_lines_the_frontmatter_takes() -> None:
    updated = Frontmatter(
        user_id='a"quoted"id:with:colons',
        last_updated=datetime(2026, 1, 2, 3, 4, tzinfo=UTC),
        turn_count=12,
    )
    counts = {frontmatter_lines(empty_profile("alice")), frontmatter_lines(Profile(updated))}
    assert len(counts) == 1, "the frontmatter takes the same number of lines in every profile"
    assert js_constant(SCRIPT.read_text("utf-8"), "FRONTMATTER_LINES") == counts.pop()


@pytest.mark.parametrize(
    ("source", "value"),
    [
        ('const SECTIONS = [\n  "A",\n  "B & C",\n];', ["A", "B & C"]),
        ('  const EMPTY_PLACEHOLDER = "_(empty)_";', "_(empty)_"),
        ('const M = "<!-- \\"x\\" -->";', '<!-- "x" -->'),
        ("const FRONTMATTER_LINES = 7; // a comment", 7),
    ],
)
def test_the_reader_reads_each_kind_of_literal(source: str, value: Any) -> None:
    name = re.findall(r"const (\w+)", source)[0]
    assert js_constant(source, name) == value


@pytest.mark.parametrize(
    "source",
    [
        "const SECTIONS = Object.freeze(makeSections());",  # not a literal: cannot be compared
        'const SECTIONS = ["A"];\nconst SECTIONS = ["B"];',  # two declarations
        "",
    ],
)
def test_a_constant_the_reader_cannot_compare_fails(source: str) -> None:
    with pytest.raises(AssertionError, match="must declare"):
        js_constant(source, "SECTIONS")
