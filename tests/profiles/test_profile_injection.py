"""The "What I know about you" system-prompt section and how it joins the caller's prompt."""

import pytest

from app.profiles.document import Frontmatter, Profile, Section, render_body
from app.profiles.injection import (
    MEMORY_SECTION_TITLE,
    compose_system_prompt,
    render_memory_section,
)

PROFILE = Profile.from_sections(
    Frontmatter("user_123", turn_count=4),
    {Section.COMMUNICATION: ["Prefers concise answers with concrete examples."]},
)


def test_memory_section_is_heading_instructions_then_the_body() -> None:
    section = render_memory_section(PROFILE)

    heading, instructions, body = section.split("\n\n", 2)
    assert heading == "## What I know about you"
    assert MEMORY_SECTION_TITLE == "What I know about you"
    assert body == render_body(PROFILE)
    for phrase in ("durable", "tone", "examples", "depth", "not the world", "cannot edit"):
        assert phrase in instructions


def test_memory_section_never_shows_the_frontmatter() -> None:
    section = render_memory_section(PROFILE)

    assert "user_id" not in section
    assert "turn_count" not in section
    assert "---" not in section.split("\n")


@pytest.mark.parametrize(
    ("base", "memory", "expected"),
    [
        (None, None, None),
        ("", "  \n", None),
        ("You are helpful.", None, "You are helpful."),
        (None, "## Memory\n", "## Memory\n"),
        ("You are helpful.", "## Memory\n", "You are helpful.\n\n## Memory\n"),
        ("You are helpful.\n\n\n", "## Memory\n", "You are helpful.\n\n## Memory\n"),
        ("", "## Memory\n", "## Memory\n"),
    ],
)
def test_compose_puts_one_blank_line_between_base_and_memory(
    base: str | None, memory: str | None, expected: str | None
) -> None:
    assert compose_system_prompt(base, memory) == expected
