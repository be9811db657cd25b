"""The user's own edit refused by the company's memory policy: which lines of the text they sent
hold a new or changed bullet the policy drops, and the 422 that names each line and category.

A user's edit is strict where the worker's writes are not: the user is there to fix it, so
nothing of the edit is stored rather than some of it silently. The value is never echoed.
Pure: the text, the head profile and the policy in, the refused lines out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from app.detectors import Category
from app.enablement.memory_policy import MemoryPolicy
from app.profiles.document import SECTIONS, Frontmatter, Profile, Section, sanitize_bullet
from app.profiles.errors import MemoryPolicyRefusal
from app.profiles.policy import PolicyAction, describe, screen
from app.profiles.versions import CONTENT_FIELD

_HEADINGS: Final = {f"## {section.value}": section for section in SECTIONS}
_FRONTMATTER_DELIMITER: Final = "---"


@dataclass(frozen=True)
class RefusedLine:
    """A line of the submitted text (1-based) whose bullet the policy drops, and why."""

    line: int
    section: Section
    category: Category

    @property
    def message(self) -> str:
        return f"line {self.line}: {describe(self.category)} ({self.category.value})"


def refused_lines(
    submitted: str, before: Profile | None, policy: MemoryPolicy, user_id: str
) -> list[RefusedLine]:
    """The lines of `submitted` (a memory.md as `parse_body` reads it: frontmatter skipped, line
    ends normalised, bullets sanitised) holding a bullet that is new or changed relative to
    `before` and that `policy` drops, judged one bullet at a time by the gate itself."""
    lines = [line.rstrip() for line in _normalised(submitted).split("\n")]
    refused: list[RefusedLine] = []
    section: Section | None = None
    for index in range(_body_start(lines), len(lines)):
        line = lines[index]
        if line in _HEADINGS:
            section = _HEADINGS[line]
            continue
        if section is None or not line.startswith("- "):
            continue
        bullet = sanitize_bullet(line[2:])
        if not bullet or (before is not None and bullet in before.bullets(section)):
            continue
        alone = Profile.from_sections(Frontmatter(user_id=user_id), {section: [bullet]})
        dropped = screen(None, alone, policy).dropped
        if dropped:
            refused.append(RefusedLine(index + 1, section, dropped[0].category))
    return refused


def refusal(lines: Sequence[RefusedLine], dropped: Sequence[PolicyAction]) -> MemoryPolicyRefusal:
    """The 422 naming each refused line and its category (`dropped`: the gate's drops, named
    without a line should the text not show where they are)."""
    if lines:
        where = "; ".join(line.message for line in lines)
        errors = [
            {"field": CONTENT_FIELD, "message": line.message, "type": _type(line.category)}
            for line in lines
        ]
    else:
        categories = dict.fromkeys(action.category for action in dropped)
        where = "; ".join(f"{describe(c)} ({c.value})" for c in categories)
        errors = [
            {"field": CONTENT_FIELD, "message": describe(c), "type": _type(c)} for c in categories
        ]
    detail = (
        f"Your company does not allow this in memory: {where}. Remove it or say it without "
        "the value, and save again; nothing was saved."
    )
    return MemoryPolicyRefusal(detail, errors=errors)


def _type(category: Category) -> str:
    return f"memory_policy.{category.value}"


def _normalised(text: str) -> str:
    return text.removeprefix("\ufeff").replace("\r\n", "\n").replace("\r", "\n")


def _body_start(lines: list[str]) -> int:
    """The first line after a frontmatter block (as `parse_body` skips it), else 0."""
    first = next((i for i, line in enumerate(lines) if line), len(lines))
    if first < len(lines) and lines[first] == _FRONTMATTER_DELIMITER:
        for index in range(first + 1, len(lines)):
            if lines[index] == _FRONTMATTER_DELIMITER:
                return index + 1
    return 0
