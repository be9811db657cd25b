"""Profiles built in memory: a profile from its bullets, the canonical memory.md a client would
send back, and the bullets of one section of a document."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from app.kit.tokens import TokenCounters
from app.profiles.document import Frontmatter, Profile, Section, parse, render

STORED_COUNTER = TokenCounters().stored
"""What the service counts stored tokens with (the app's `TokenCounters.stored`)."""

USER_1 = Frontmatter("user_1")


def profile_of(
    bullets: Mapping[Section, Sequence[str]],
    frontmatter: Frontmatter = USER_1,
    *,
    truncated: bool = False,
) -> Profile:
    return Profile.from_sections(frontmatter, bullets, truncated=truncated)


def memory_md(
    bullets: Mapping[Section, Sequence[str]] | None = None, *, user_id: str = "alice"
) -> str:
    """A canonical memory.md (as a client would send back what it read)."""
    sections = {section: list(texts) for section, texts in (bullets or {}).items()}
    return render(Profile.from_sections(Frontmatter(user_id=user_id), sections))


def bullets(content: str, section: str) -> list[str]:
    """The bullets of the section named `section` in a memory.md document."""
    profile = parse(content)
    return [b for s, items in profile.sections if s.value == section for b in items]
