"""The memory policy gate: what of a profile write may be kept, bullet by bullet (SPEC §13).

Pure: two profiles and a company's policy in, the screened profile and the actions taken out.
Every write path calls `screen` before its compare-and-set write.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Final

from app.detectors import Category, Finding, find
from app.enablement.memory_policy import Action, MemoryPolicy
from app.profiles.document import SECTIONS, Profile, Section, sanitize_bullet
from app.profiles.profile import strip_topic_prefix, topic_time

_STRICTNESS: Final = (Action.ALLOW, Action.REDACT, Action.DROP)

_DESCRIPTIONS: Final[Mapping[Category, str]] = MappingProxyType(
    {
        Category.SECRETS: "looked like a password or key",
        Category.PAYMENT_CARDS: "looked like a card number",
        Category.BANK_ACCOUNTS: "looked like a bank account number",
        Category.NATIONAL_IDS: "looked like a national id number",
        Category.EMAIL_ADDRESSES: "looked like an e-mail address",
        Category.PHONE_NUMBERS: "looked like a phone number",
        Category.INSTRUCTIONS: "looked like an instruction to the assistant",
    }
)


@dataclass(frozen=True, slots=True)
class PolicyAction:
    """What the gate did about one kind of finding in one bullet. Never holds the value, nor
    the bullet: this record is stored with the version and shown to the user."""

    category: Category
    kind: str
    action: Action
    section: Section


@dataclass(frozen=True, slots=True)
class Screened:
    """The profile as it may be written, and what the gate did to get it (in section and
    bullet order; empty when nothing was found)."""

    profile: Profile
    actions: tuple[PolicyAction, ...]

    @property
    def dropped(self) -> tuple[PolicyAction, ...]:
        """The actions that removed a bullet."""
        return tuple(action for action in self.actions if action.action is Action.DROP)


def describe(category: Category) -> str:
    """What a refused bullet looked like, in the words shown to the user."""
    return _DESCRIPTIONS[category]


def redaction(kind: str) -> str:
    """The text that replaces a redacted value of `kind`: ``[redacted: email]``."""
    return f"[redacted: {kind}]"


def screen(before: Profile | None, after: Profile, policy: MemoryPolicy) -> Screened:
    """`after` with the company's policy applied to each bullet that is new or changed
    relative to `before` (`None` for a first write: every bullet is new).

    A bullet identical to one in the same section of `before` passes unchecked: the policy
    applies at write time, so a bullet written under an older policy (or by an older detector)
    is not judged again on every later write that leaves it alone; a bullet moved to another
    section, or edited, is judged again.

    Each finding in a judged bullet gets its category's action; the strictest among a bullet's
    findings decides (drop > redact > allow). A dropped bullet is removed (an emptied section is
    an empty section); a redacted bullet keeps its text with each value whose category is
    redacted replaced by ``[redacted: <kind>]`` (an instruction spans the whole bullet). A
    redacted bullet that equals one already in its section is not repeated. Frontmatter and the
    truncation flag are `after`'s.

    The actions name, per judged bullet, each category and kind found with the action applied:
    for a dropped bullet only the findings that dropped it, for a kept one the redacted and the
    allowed findings (callers that show refusals keep those that are not `allow`).
    """
    sections: list[tuple[Section, tuple[str, ...]]] = []
    actions: list[PolicyAction] = []
    for section in SECTIONS:
        known = set(before.bullets(section)) if before is not None else set()
        kept: list[str] = []
        for bullet in after.bullets(section):
            text = bullet if bullet in known else _judge(bullet, section, policy, actions)
            if text is not None and (text == bullet or text not in kept):
                kept.append(text)
        sections.append((section, tuple(kept)))
    if not actions:
        return Screened(after, ())
    profile = Profile(
        frontmatter=after.frontmatter, sections=tuple(sections), truncated=after.truncated
    )
    return Screened(profile, tuple(actions))


def _judge(
    bullet: str, section: Section, policy: MemoryPolicy, actions: list[PolicyAction]
) -> str | None:
    """The bullet as it may be kept (None: dropped); appends what was done to `actions`."""
    findings = find(bullet)
    if not findings:
        return bullet
    decided = [(finding, policy.action(finding.category)) for finding in findings]
    strictest = max((action for _, action in decided), key=_STRICTNESS.index)
    if strictest is Action.DROP:
        decided = [(finding, action) for finding, action in decided if action is Action.DROP]
    seen: set[tuple[Category, str, Action]] = set()
    for finding, action in decided:
        key = (finding.category, finding.kind, action)
        if key not in seen:
            seen.add(key)
            actions.append(PolicyAction(finding.category, finding.kind, action, section))
    if strictest is Action.DROP:
        return None
    redacted = [finding for finding, action in decided if action is Action.REDACT]
    return _redact(bullet, redacted, section) or None


def _redact(bullet: str, findings: list[Finding], section: Section) -> str:
    """`bullet` with each finding's span replaced by its redaction marker, sanitised again. A
    Recent Topics bullet keeps its date prefix even when the whole text is redacted."""
    if not findings:
        return bullet
    parts: list[str] = []
    position = 0
    if section is Section.RECENT and topic_time(bullet) is not None:
        position = len(bullet) - len(strip_topic_prefix(bullet))
        parts.append(bullet[:position])
        findings = [replace(f, start=max(f.start, position)) for f in findings if f.end > position]
    for finding in sorted(findings, key=lambda f: (f.start, -f.end)):
        if finding.start < position:  # an instruction spans values found inside it
            continue
        parts += [bullet[position : finding.start], redaction(finding.kind)]
        position = finding.end
    parts.append(bullet[position:])
    return sanitize_bullet("".join(parts))
