"""Hard size control: drop whole bullets until the profile body fits a token budget.

Pure: the token counter is passed in. This is the last resort after condensation, and what the
load path injects when a stored profile exceeds a (since lowered) budget.
"""

from collections.abc import Callable
from datetime import UTC, datetime

from app.profiles.document import TRUNCATION_MARKER, render_body
from app.profiles.profile import SECTIONS, Profile, Section, topic_time

__all__ = ["DROP_ORDER", "TRUNCATION_MARKER", "truncate_to_budget"]

DROP_ORDER: tuple[Section, ...] = (
    Section.FOLLOWUPS,
    Section.RECENT,
    Section.SKILLS,
    Section.WORK,
    Section.COMMUNICATION,
    Section.IDENTITY,
)
"""Sections whose bullets are dropped first come first."""

_UNDATED = datetime.min.replace(tzinfo=UTC)


def truncate_to_budget(profile: Profile, budget: int, count: Callable[[str], int]) -> Profile:
    """Return ``profile`` if ``count(render_body(profile)) <= budget``, else a truncated copy.

    The copy drops whole bullets in ``DROP_ORDER``: within a section the last bullet first,
    except Recent Topics, where the oldest by date prefix goes first (undated bullets count as
    oldest; equal dates go top-down). It has ``truncated=True``, so the marker line is part of
    what is counted, and emptied sections render ``_(empty)_``. The number of dropped bullets is
    found by bisection; it is the fewest that fit, up to the odd token by which ``_(empty)_`` can
    outweigh a section's last tiny bullet. If even the empty skeleton with the marker does not
    fit (a budget far below the allowed 500), that skeleton is returned anyway: the headings are
    never dropped.
    """
    if count(render_body(profile)) <= budget:
        return profile
    drops = _drop_sequence(profile)

    def fits(dropped: int) -> bool:
        return count(render_body(_without(profile, drops[:dropped]))) <= budget

    low, high = 0, len(drops)
    if not fits(high):
        return _without(profile, drops)
    while low < high:
        middle = (low + high) // 2
        if fits(middle):
            high = middle
        else:
            low = middle + 1
    return _without(profile, drops[:low])


def _drop_sequence(profile: Profile) -> list[tuple[Section, int]]:
    sequence: list[tuple[Section, int]] = []
    for section in DROP_ORDER:
        positions = range(len(profile.bullets(section)))
        if section is Section.RECENT:
            bullets = profile.bullets(section)
            ordered = sorted(positions, key=lambda i: (topic_time(bullets[i]) or _UNDATED, i))
        else:
            ordered = list(reversed(positions))
        sequence.extend((section, index) for index in ordered)
    return sequence


def _without(profile: Profile, drops: list[tuple[Section, int]]) -> Profile:
    dropped = set(drops)
    sections = tuple(
        (
            section,
            tuple(b for i, b in enumerate(profile.bullets(section)) if (section, i) not in dropped),
        )
        for section in SECTIONS
    )
    return Profile(frontmatter=profile.frontmatter, sections=sections, truncated=True)
