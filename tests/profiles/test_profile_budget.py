"""Hard truncation drops whole bullets, Follow-ups and the oldest Recent Topics first, to fit."""

from datetime import UTC, datetime, timedelta

import pytest

from app.kit.tokens import TokenCounter
from app.profiles.budget import DROP_ORDER, TRUNCATION_MARKER, truncate_to_budget
from app.profiles.document import (
    SECTIONS,
    Profile,
    Section,
    empty_profile,
    parse,
    render,
    render_body,
    sanitize_bullet,
)
from app.profiles.profile import topic_prefix
from tests.helpers.profiles import profile_of

COUNTER = TokenCounter()
START = datetime(2026, 1, 1, tzinfo=UTC)


def chars(text: str) -> int:
    return len(text)


def long_profile(per_section: int, words: int = 70) -> Profile:
    def bullet(section: Section, n: int) -> str:
        text = f"{section.value} fact {n}: " + " ".join(f"detail{i}" for i in range(words))
        if section is Section.RECENT:
            text = topic_prefix(START + timedelta(days=n)) + text
        return sanitize_bullet(text[:480])

    return profile_of({s: [bullet(s, n) for n in range(per_section)] for s in SECTIONS})


def assert_dropped_in_order(original: Profile, result: Profile) -> None:
    """Sections in DROP_ORDER are emptied one after another; at most one is partially cut."""
    states = []
    for section in DROP_ORDER:
        kept, before = result.bullets(section), original.bullets(section)
        assert set(kept) <= set(before)
        states.append("full" if kept == before else "empty" if not kept else "partial")
    assert states == sorted(states, key=["empty", "partial", "full"].index)
    assert states.count("partial") <= 1


def test_a_profile_within_budget_is_returned_unchanged() -> None:
    small = long_profile(per_section=2)

    assert truncate_to_budget(small, 2000, COUNTER.count) is small


@pytest.mark.parametrize("budget", [500, 2000, 8000])
def test_a_long_profile_is_cut_to_fit_with_real_tokens(budget: int) -> None:
    original = long_profile(per_section=25)
    assert COUNTER.count(render_body(original)) > 8000

    result = truncate_to_budget(original, budget, COUNTER.count)

    assert COUNTER.count(render_body(result)) <= budget
    assert result.truncated
    assert render(result).endswith("\n\n" + TRUNCATION_MARKER + "\n")
    assert parse(render(result)) == result
    assert result.frontmatter == original.frontmatter
    assert_dropped_in_order(original, result)


def test_identity_outlives_everything_else() -> None:
    original = long_profile(per_section=25)

    result = truncate_to_budget(original, 2000, COUNTER.count)

    identity = result.bullets(Section.IDENTITY)
    assert 0 < len(identity) < 25
    assert identity == original.bullets(Section.IDENTITY)[: len(identity)]
    assert all(not result.bullets(s) for s in SECTIONS if s is not Section.IDENTITY)
    assert "## Skills & Expertise\n_(empty)_" in render_body(result)


@pytest.mark.parametrize("budget", [500, 2000, 8000])
def test_huge_single_bullets_are_dropped_whole(budget: int) -> None:
    dense = "😀🧪" * 249  # ~500 characters, well over a thousand tokens each
    original = profile_of({s: [f"{s.value} {dense}"[:500]] for s in SECTIONS})

    result = truncate_to_budget(original, budget, COUNTER.count)

    assert COUNTER.count(render_body(result)) <= budget
    for section in SECTIONS:
        assert result.bullets(section) in ((), original.bullets(section))
    kept = sum(bool(result.bullets(section)) for section in SECTIONS)
    assert kept == {500: 0, 2000: 1, 8000: 6}[budget]


def test_recent_topics_lose_their_oldest_dates_first() -> None:
    dated = [
        topic_prefix(START + timedelta(days=offset)) + f"topic {offset}" for offset in (3, 0, 5, 1)
    ]
    original = profile_of(
        {Section.RECENT: ["undated topic", *dated], Section.FOLLOWUPS: ["revisit"]}
    )
    without_two = profile_of({Section.RECENT: [dated[0], dated[2], dated[3]]})
    budget = len(render_body(Profile(without_two.frontmatter, without_two.sections, True)))

    result = truncate_to_budget(original, budget, chars)

    assert result.bullets(Section.FOLLOWUPS) == ()
    assert result.bullets(Section.RECENT) == (dated[0], dated[2], dated[3])


def test_no_more_bullets_are_dropped_than_needed() -> None:
    original = long_profile(per_section=10, words=20)
    budget = len(render_body(original)) // 2

    result = truncate_to_budget(original, budget, chars)

    assert len(render_body(result)) <= budget
    kept = {(s, b) for s, bullets in result.sections for b in bullets}
    dropped = [(s, b) for s, bullets in original.sections for b in bullets if (s, b) not in kept]
    for section, bullet in dropped:
        restored = {s: list(result.bullets(s)) for s in SECTIONS}
        restored[section].append(bullet)
        bigger = Profile.from_sections(original.frontmatter, restored, truncated=True)
        assert len(render_body(bigger)) > budget


def test_a_budget_below_the_skeleton_returns_the_marked_skeleton() -> None:
    original = long_profile(per_section=3)

    result = truncate_to_budget(original, 10, COUNTER.count)

    assert result == Profile(original.frontmatter, empty_profile("user_1").sections, True)
    assert render_body(result).count("_(empty)_") == 6
    assert COUNTER.count(render_body(result)) < 500
