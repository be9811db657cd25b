"""The change guard as a table: how many bullets one consolidation may delete."""

from __future__ import annotations

import pytest

from app.consolidation.guard import TooManyDeletions, guard_change
from app.profiles.document import Frontmatter, Operation, OpKind, Profile, Section, empty_profile

WORK = Section.WORK


def profile_of(bullets: int) -> Profile:
    if bullets == 0:
        return empty_profile("alice")
    facts = [f"fact {n}" for n in range(bullets)]
    return Profile.from_sections(Frontmatter("alice"), {WORK: facts})


def deleting(count: int) -> list[Operation]:
    return [Operation(OpKind.DELETE, WORK, target=f"fact {n}") for n in range(count)]


ADD_AND_UPDATE = [
    Operation(OpKind.ADD, WORK, text="new fact"),
    Operation(OpKind.UPDATE, WORK, text="fact zero, revised", target="fact 0"),
]


@pytest.mark.parametrize(
    ("bullets", "operations", "forget_requested", "share", "deleted"),
    [
        pytest.param(4, ADD_AND_UPDATE, False, 0.5, 0, id="no deletions"),
        pytest.param(1, deleting(1), False, 0.5, 1, id="one deletion is always allowed"),
        pytest.param(10, deleting(1), False, 0.01, 1, id="one deletion under a tiny share"),
        pytest.param(10, deleting(5), False, 0.5, 5, id="exactly at the share"),
        pytest.param(10, deleting(3), False, 0.3, 3, id="exactly at a share float rounds"),
        pytest.param(7, deleting(3), False, 0.5, 3, id="the share rounds down"),
        pytest.param(10, deleting(10), True, 0.5, 10, id="forget requested lifts the limit"),
        pytest.param(0, deleting(1), False, 0.5, 1, id="empty profile, one deletion"),
    ],
)
def test_a_change_within_the_guard_passes_and_counts_its_deletions(
    bullets: int,
    operations: list[Operation],
    forget_requested: bool,
    share: float,
    deleted: int,
) -> None:
    assert guard_change(profile_of(bullets), operations, forget_requested, share) == deleted


@pytest.mark.parametrize(
    ("bullets", "operations", "share", "allowed"),
    [
        pytest.param(10, deleting(6), 0.5, 5, id="one over the share"),
        pytest.param(7, deleting(4), 0.5, 3, id="over the rounded-down share"),
        pytest.param(3, deleting(2), 0.1, 1, id="two deletions when only the one is allowed"),
        pytest.param(0, deleting(2), 0.5, 1, id="empty profile, two deletions"),
    ],
)
def test_a_change_past_the_guard_is_refused_naming_the_limit(
    bullets: int, operations: list[Operation], share: float, allowed: int
) -> None:
    with pytest.raises(TooManyDeletions) as refused:
        guard_change(profile_of(bullets), operations, False, share)

    assert (refused.value.deleted, refused.value.allowed) == (len(operations), allowed)
