"""What a company's memory retention expires: Recent Topics bullets dated before a cutoff, and
memories idle since before one (SPEC §13).

Pure: `now` and the days arrive as arguments; the worker's retention steps apply the result.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from app.profiles.profile import SECTIONS, Profile, Section, topic_time


def retention_cutoff(now: datetime, days: int) -> datetime | None:
    """`days` days before `now`, to the whole minute (the resolution of a Recent Topics prefix,
    so that a bullet is either before it or not); None when `days` is 0: kept forever."""
    if days <= 0:
        return None
    return (now - timedelta(days=days)).replace(second=0, microsecond=0)


def expire_topics(profile: Profile, cutoff: datetime) -> tuple[Profile, int]:
    """`profile` without its Recent Topics bullets dated before `cutoff`, and how many went.

    Only Recent Topics bullets carry a date, so the other sections are never touched. A bullet
    without a valid `YYYY-MM-DD HH:MM UTC:` prefix has no age and stays (the user's own edit
    may write one). The frontmatter and the truncation flag are kept.
    """
    topics = profile.bullets(Section.RECENT)
    kept = tuple(b for b in topics if (moment := topic_time(b)) is None or moment >= cutoff)
    if len(kept) == len(topics):
        return profile, 0
    sections = tuple(
        (section, kept if section is Section.RECENT else profile.bullets(section))
        for section in SECTIONS
    )
    expired = Profile(profile.frontmatter, sections, truncated=profile.truncated)
    return expired, len(topics) - len(kept)
