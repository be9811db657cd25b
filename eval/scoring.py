"""Scoring a final profile against its expectation: pure, no I/O.

recall      expected facts matched by at least one bullet of their sections ÷ expected facts
precision   bullets of the durable sections (all but Recent Topics) that match an expected
            fact ÷ all bullets of the durable sections (None when there are none)
contradictions resolved: the old value is in no durable bullet and the new fact is matched
forgotten honoured: no bullet of any section matches the forgotten fact
never stored: no bullet of any section matches the secret, health datum or third party's fact
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from app.profiles.document import SECTIONS, Section
from eval.corpus import DURABLE_SECTIONS, Expectation, Matcher

SectionBullets = Mapping[Section, Sequence[str]]


@dataclass(frozen=True)
class Quality:
    """One user's final profile scored; the counts add up across users."""

    facts_expected: int
    facts_found: int
    bullets: int  # in the durable sections
    bullets_matching: int
    contradictions: int
    contradictions_resolved: int
    forgotten: int
    forgotten_honoured: int
    never_stored: int
    never_stored_kept_out: int
    missing: tuple[str, ...] = ()  # ids of expected facts not found
    unexpected: tuple[str, ...] = ()  # durable bullets that match no expected fact
    violations: tuple[str, ...] = ()  # bullets that hold an old, forgotten or secret value

    @property
    def recall(self) -> float:
        return self.facts_found / self.facts_expected if self.facts_expected else 1.0

    @property
    def precision(self) -> float | None:
        return self.bullets_matching / self.bullets if self.bullets else None


def score_profile(expect: Expectation, profile: SectionBullets) -> Quality:
    """The quality of `profile` (its bullets by section) against `expect`."""
    found = {
        fact.id for fact in expect.facts if _any_match(fact.matcher, _bullets(profile, SECTIONS))
    }
    durable = list(_bullets(profile, DURABLE_SECTIONS))
    matching = [
        (section, bullet)
        for section, bullet in durable
        if any(fact.matcher.matches(section, bullet) for fact in expect.facts)
    ]
    violations: list[str] = []
    resolved = 0
    for contradiction in expect.contradictions:
        stale = [b for s, b in durable if contradiction.old.matches(s, b)]
        violations += [f"still holds an old value: {b}" for b in stale]
        if not stale and contradiction.new in found:
            resolved += 1
    honoured = _absent(expect.forgotten, profile, "still holds a forgotten fact", violations)
    kept_out = _absent(expect.never_stored, profile, "stored what it never may", violations)
    return Quality(
        facts_expected=len(expect.facts),
        facts_found=len(found),
        bullets=len(durable),
        bullets_matching=len(matching),
        contradictions=len(expect.contradictions),
        contradictions_resolved=resolved,
        forgotten=len(expect.forgotten),
        forgotten_honoured=honoured,
        never_stored=len(expect.never_stored),
        never_stored_kept_out=kept_out,
        missing=tuple(fact.id for fact in expect.facts if fact.id not in found),
        unexpected=tuple(b for s, b in durable if (s, b) not in matching),
        violations=tuple(violations),
    )


def combine(qualities: Iterable[Quality]) -> Quality:
    """The counts of several users added up (so recall and precision are pooled, not averaged)."""
    items = list(qualities)
    return Quality(
        facts_expected=sum(q.facts_expected for q in items),
        facts_found=sum(q.facts_found for q in items),
        bullets=sum(q.bullets for q in items),
        bullets_matching=sum(q.bullets_matching for q in items),
        contradictions=sum(q.contradictions for q in items),
        contradictions_resolved=sum(q.contradictions_resolved for q in items),
        forgotten=sum(q.forgotten for q in items),
        forgotten_honoured=sum(q.forgotten_honoured for q in items),
        never_stored=sum(q.never_stored for q in items),
        never_stored_kept_out=sum(q.never_stored_kept_out for q in items),
    )


def _bullets(profile: SectionBullets, sections: Sequence[Section]) -> Iterable[tuple[Section, str]]:
    for section in sections:
        for bullet in profile.get(section, ()):
            yield section, bullet


def _any_match(matcher: Matcher, bullets: Iterable[tuple[Section, str]]) -> bool:
    return any(matcher.matches(section, bullet) for section, bullet in bullets)


def _absent(
    matchers: Sequence[Matcher], profile: SectionBullets, why: str, violations: list[str]
) -> int:
    kept_out = 0
    for matcher in matchers:
        hits = [b for s, b in _bullets(profile, SECTIONS) if matcher.matches(s, b)]
        violations += [f"{why}: {b}" for b in hits]
        kept_out += not hits
    return kept_out
