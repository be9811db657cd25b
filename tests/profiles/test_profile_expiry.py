"""Which Recent Topics the retention drops: those dated before the cutoff, a whole minute
`days` days before now; nothing else in the profile."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from app.profiles.document import Section
from app.profiles.expiry import expire_topics, retention_cutoff
from tests.helpers.profiles import profile_of

NOW = datetime(2026, 12, 1, 12, 30, 45, tzinfo=UTC)
CUTOFF = datetime(2026, 9, 2, 12, 30, tzinfo=UTC)  # 90 days before NOW, to the minute


@pytest.mark.parametrize(
    ("days", "cutoff"),
    [
        (90, CUTOFF),
        (1, datetime(2026, 11, 30, 12, 30, tzinfo=UTC)),
        (0, None),
    ],
)
def test_the_cutoff_is_days_before_now_to_the_minute_and_none_for_zero_days(
    days: int, cutoff: datetime | None
) -> None:
    assert retention_cutoff(NOW, days) == cutoff


@pytest.mark.parametrize(
    ("topic", "kept"),
    [
        ("2026-09-02 12:29 UTC: a minute before the cutoff", False),
        ("2026-09-02 12:30 UTC: at the cutoff", True),
        ("2026-09-02 12:31 UTC: a minute after the cutoff", True),
        ("2020-01-01 00:00 UTC: years ago", False),
        ("2026-11-30 09:00 UTC: yesterday", True),
        ("no date: no age", True),
        ("2026-02-30 10:00 UTC: not a date", True),
        ("2026-09-02 12:29 UTC dated without the colon", True),
    ],
)
def test_a_topic_is_dropped_only_when_dated_before_the_cutoff(topic: str, kept: bool) -> None:
    profile = profile_of({Section.RECENT: [topic]})

    expired, dropped = expire_topics(profile, CUTOFF)

    assert expired.bullets(Section.RECENT) == ((topic,) if kept else ())
    assert dropped == (0 if kept else 1)


def test_only_recent_topics_expire_and_everything_else_is_kept() -> None:
    old = "2020-01-01 00:00 UTC: "
    profile = profile_of(
        {
            Section.WORK: [old + "written like a topic, but work context"],
            Section.RECENT: [old + "first", "2026-11-30 09:00 UTC: young", old + "second"],
            Section.FOLLOWUPS: ["revisit the budget"],
        },
        truncated=True,
    )

    expired, dropped = expire_topics(profile, CUTOFF)

    assert dropped == 2
    assert expired.bullets(Section.RECENT) == ("2026-11-30 09:00 UTC: young",)
    for section in (Section.WORK, Section.FOLLOWUPS):
        assert expired.bullets(section) == profile.bullets(section)
    assert (expired.frontmatter, expired.truncated) == (profile.frontmatter, True)


def test_a_profile_with_nothing_expired_is_returned_as_it_is() -> None:
    profile = profile_of({Section.RECENT: ["2026-11-30 09:00 UTC: young"]})

    assert expire_topics(profile, CUTOFF) == (profile, 0)
