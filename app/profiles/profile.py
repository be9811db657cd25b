"""The user memory profile as a value: six fixed sections of bullets plus service-owned metadata.

A ``Profile`` can only hold sanitised bullets in the six sections, in order; constructing one
that breaks this raises ``ProfileFormatError``, so every profile can be rendered safely.
"""

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum

from app.profiles.sanitize import sanitize_bullet

SCHEMA_VERSION = 1


class ProfileFormatError(ValueError):
    """A memory document or profile value breaks the format; ``detail`` says what and where."""

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


class Section(StrEnum):
    IDENTITY = "Identity"
    COMMUNICATION = "Communication Preferences"
    WORK = "Work Context"
    SKILLS = "Skills & Expertise"
    RECENT = "Recent Topics"
    FOLLOWUPS = "Open Questions / Follow-ups"


SECTIONS: tuple[Section, ...] = (
    Section.IDENTITY,
    Section.COMMUNICATION,
    Section.WORK,
    Section.SKILLS,
    Section.RECENT,
    Section.FOLLOWUPS,
)

SectionBullets = tuple[tuple[Section, tuple[str, ...]], ...]

TOPIC_TIME_FORMAT = "%Y-%m-%d %H:%M"
_TOPIC_PREFIX = re.compile(r"(\d{4}-\d{2}-\d{2} \d{2}:\d{2}) UTC: ")


@dataclass(frozen=True)
class Frontmatter:
    """Metadata written by the service only; ``last_updated`` is normalised to whole UTC seconds."""

    user_id: str
    schema_version: int = SCHEMA_VERSION
    last_updated: datetime | None = None
    turn_count: int = 0

    def __post_init__(self) -> None:
        if not self.user_id or not self.user_id.isprintable() or " " in self.user_id:
            raise ProfileFormatError(
                f"user_id {preview(self.user_id)} must be non-empty, printable, without spaces"
            )
        if _not_int(self.schema_version) or self.schema_version != SCHEMA_VERSION:
            raise ProfileFormatError(f"schema_version must be {SCHEMA_VERSION}")
        if _not_int(self.turn_count) or self.turn_count < 0:
            raise ProfileFormatError("turn_count must be a non-negative integer")
        if self.last_updated is not None:
            if self.last_updated.utcoffset() is None:
                raise ProfileFormatError("last_updated must be timezone-aware")
            utc = self.last_updated.astimezone(UTC).replace(microsecond=0)
            object.__setattr__(self, "last_updated", utc)


@dataclass(frozen=True)
class Profile:
    """A memory profile: frontmatter, the six sections in order, and the truncation flag.

    ``truncated`` means the document ends with the truncation marker line, i.e. whole bullets
    were dropped to fit a token budget.
    """

    frontmatter: Frontmatter
    sections: SectionBullets = field(default_factory=lambda: tuple((s, ()) for s in SECTIONS))
    truncated: bool = False

    def __post_init__(self) -> None:
        titles = tuple(section for section, _ in self.sections)
        if titles != SECTIONS:
            raise ProfileFormatError("a profile holds exactly the six sections, in order")
        for section, bullets in self.sections:
            for bullet in bullets:
                if not bullet or sanitize_bullet(bullet) != bullet:
                    raise ProfileFormatError(
                        f"bullet {preview(bullet)} in {section.value!r} is not sanitised"
                    )

    @classmethod
    def from_sections(
        cls,
        frontmatter: Frontmatter,
        bullets: Mapping[Section, Sequence[str]],
        *,
        truncated: bool = False,
    ) -> "Profile":
        """Build a profile from a partial mapping; missing sections are empty."""
        sections = tuple((s, tuple(bullets.get(s, ()))) for s in SECTIONS)
        return cls(frontmatter=frontmatter, sections=sections, truncated=truncated)

    def bullets(self, section: Section) -> tuple[str, ...]:
        return self.sections[SECTIONS.index(section)][1]

    @property
    def user_id(self) -> str:
        return self.frontmatter.user_id


def empty_profile(user_id: str) -> Profile:
    """A first-use profile: every section empty, never updated."""
    return Profile(frontmatter=Frontmatter(user_id=user_id))


def bullet_count(profile: Profile) -> int:
    return sum(len(bullets) for _, bullets in profile.sections)


def topic_prefix(moment: datetime) -> str:
    """The Recent Topics prefix for ``moment``: ``YYYY-MM-DD HH:MM UTC: ``."""
    return f"{moment.astimezone(UTC).strftime(TOPIC_TIME_FORMAT)} UTC: "


def topic_time(bullet: str) -> datetime | None:
    """The UTC time of a bullet's valid Recent Topics prefix, or None if it has none."""
    match = _TOPIC_PREFIX.match(bullet)
    if match is None:
        return None
    try:
        return datetime.strptime(match.group(1), TOPIC_TIME_FORMAT).replace(tzinfo=UTC)
    except ValueError:
        return None


def strip_topic_prefix(bullet: str) -> str:
    """The bullet without its Recent Topics prefix (unchanged if it has no valid one)."""
    match = _TOPIC_PREFIX.match(bullet)
    return bullet[match.end() :] if match and topic_time(bullet) else bullet


def _not_int(value: object) -> bool:
    return isinstance(value, bool) or not isinstance(value, int)


def preview(text: str, limit: int = 60) -> str:
    """Short repr of possibly huge user text, for error details."""
    return repr(text if len(text) <= limit else text[:limit] + "…")
