"""Profile update operations: apply ADD / UPDATE / DELETE to a profile, and derive them from two.

Pure rules: no clock (``now`` is passed in), no storage. Every text is sanitised on the way in.
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from difflib import SequenceMatcher
from enum import StrEnum

from app.profiles.profile import (
    SECTIONS,
    Profile,
    Section,
    preview,
    strip_topic_prefix,
    topic_prefix,
    topic_time,
)
from app.profiles.sanitize import sanitize_bullet

_JSON_KEYS = frozenset({"op", "section", "old", "new"})


class OperationError(ValueError):
    """An operation is malformed or does not fit the profile; ``detail`` says which and why."""

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


class OpKind(StrEnum):
    ADD = "ADD"
    UPDATE = "UPDATE"
    DELETE = "DELETE"


@dataclass(frozen=True)
class Operation:
    """One change to one section. ``text`` is the new bullet, ``target`` the existing one."""

    kind: OpKind
    section: Section
    text: str | None = None
    target: str | None = None

    def __post_init__(self) -> None:
        if (self.text is None) == (self.kind in (OpKind.ADD, OpKind.UPDATE)):
            raise OperationError(f"{self.kind} {'needs' if self.text is None else 'takes no'} text")
        if (self.target is None) == (self.kind in (OpKind.UPDATE, OpKind.DELETE)):
            raise OperationError(
                f"{self.kind} {'needs' if self.target is None else 'takes no'} target"
            )

    def to_json(self) -> dict[str, str | None]:
        """The versions-table form: ``{"op", "section", "old", "new"}``."""
        return {
            "op": self.kind.value,
            "section": self.section.value,
            "old": self.target,
            "new": self.text,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, object]) -> "Operation":
        """Read the ``to_json`` form back; ``op`` is case-insensitive, ``section`` exact."""
        unexpected = sorted(set(data) - _JSON_KEYS)
        if unexpected:
            raise OperationError(f"unexpected keys {unexpected}")
        op, section = data.get("op"), data.get("section")
        old, new = data.get("old"), data.get("new")
        if not isinstance(op, str) or op.upper() not in OpKind.__members__:
            raise OperationError(f"op must be one of {[kind.value for kind in OpKind]}")
        if not isinstance(section, str) or section not in tuple(SECTIONS):
            raise OperationError(f"section must be one of {[s.value for s in SECTIONS]}")
        if not (old is None or isinstance(old, str)) or not (new is None or isinstance(new, str)):
            raise OperationError("old and new must be strings or null")
        return cls(kind=OpKind(op.upper()), section=Section(section), text=new, target=old)


def apply(profile: Profile, ops: Sequence[Operation], now: datetime) -> Profile:
    """Apply ``ops`` in order and return the new profile.

    ADD appends a sanitised bullet unless the section already holds it (compared case- and
    whitespace-insensitively); in Recent Topics, ADD and UPDATE texts without a valid
    ``YYYY-MM-DD HH:MM UTC:`` prefix get one from ``now``. UPDATE and DELETE find their target
    exactly first, then case- and whitespace-insensitively (in Recent Topics also ignoring the
    date prefix); a missing target raises ``OperationError``, as does an UPDATE whose text
    sanitises to nothing. An ADD that sanitises to nothing is skipped.

    If the sections end up unchanged the input profile is returned as is. Otherwise the result
    has ``last_updated=now``, ``turn_count + 1`` and ``truncated=False`` (whether the new version
    must be truncated again is the budget step's decision); ``user_id`` never changes.
    """
    if now.utcoffset() is None:
        raise ValueError("now must be timezone-aware")
    working = {section: list(bullets) for section, bullets in profile.sections}
    for position, op in enumerate(ops, start=1):
        _apply_one(working[op.section], op, now, position)
    sections = tuple((section, tuple(working[section])) for section in SECTIONS)
    if sections == profile.sections:
        return profile
    frontmatter = replace(
        profile.frontmatter, last_updated=now, turn_count=profile.frontmatter.turn_count + 1
    )
    return Profile(frontmatter=frontmatter, sections=sections)


def _apply_one(bullets: list[str], op: Operation, now: datetime, position: int) -> None:
    if op.kind is OpKind.ADD:
        text = _new_text(op, now)
        if text and all(_fold(text) != _fold(bullet) for bullet in bullets):
            bullets.append(text)
        return
    index = _find_target(bullets, op, position)
    if op.kind is OpKind.DELETE:
        del bullets[index]
        return
    text = _new_text(op, now)
    if not text:
        raise OperationError(f"operation {position} (UPDATE): the new text is empty")
    bullets[index] = text


def _new_text(op: Operation, now: datetime) -> str:
    text = sanitize_bullet(op.text or "")
    if text and op.section is Section.RECENT and topic_time(text) is None:
        # Sanitising again re-applies the length limit to the prefixed text.
        return sanitize_bullet(topic_prefix(now) + text)
    return text


def _find_target(bullets: list[str], op: Operation, position: int) -> int:
    target = op.target or ""
    for candidate in (target, sanitize_bullet(target)):
        if candidate in bullets:
            return bullets.index(candidate)
    keys = [_fold]
    if op.section is Section.RECENT:
        keys.append(lambda text: _fold(strip_topic_prefix(sanitize_bullet(text))))
    for key in keys:
        wanted = key(target)
        for index, bullet in enumerate(bullets):
            if key(bullet) == wanted:
                return index
    raise OperationError(
        f"operation {position} ({op.kind} in {op.section.value!r}): "
        f"no bullet matches {preview(target)}"
    )


def _fold(text: str) -> str:
    return sanitize_bullet(text).casefold()


def diff_operations(old: Profile, new: Profile) -> list[Operation]:
    """The operations that turn ``old``'s sections into ``new``'s, section by section.

    Within a section, bullets removed and added at the same place are paired as UPDATE, other
    removals are DELETE and additions at the end are ADD. Because ADD appends, an insertion
    before surviving bullets is expressed by updating the bullets from there on in place.
    UPDATE/DELETE come last-position first, so each target is still the first bullet with its
    text when applied. ``apply(old, diff_operations(old, new), now)`` reproduces ``new``'s
    sections exactly when each section of ``old`` has no repeated bullet and each section of
    ``new`` has no two bullets equal up to case and whitespace (ADD would drop the second), and
    its Recent Topics bullets carry their date prefix.
    """
    ops: list[Operation] = []
    for section in SECTIONS:
        ops.extend(_diff_section(section, old.bullets(section), new.bullets(section)))
    return ops


def _diff_section(section: Section, old: tuple[str, ...], new: tuple[str, ...]) -> list[Operation]:
    edits: dict[int, Operation] = {}  # keyed by position in ``old``
    additions: list[str] = []

    def pair(old_part: range, new_part: range) -> None:
        for offset in range(max(len(old_part), len(new_part))):
            if offset >= len(new_part):
                edits[old_part[offset]] = Operation(
                    OpKind.DELETE, section, target=old[old_part[offset]]
                )
            elif offset >= len(old_part):
                additions.append(new[new_part[offset]])
            elif old[old_part[offset]] != new[new_part[offset]]:
                edits[old_part[offset]] = Operation(
                    OpKind.UPDATE, section, text=new[new_part[offset]], target=old[old_part[offset]]
                )

    opcodes = SequenceMatcher(None, old, new, autojunk=False).get_opcodes()
    for number, (tag, i1, i2, j1, j2) in enumerate(opcodes):
        if tag == "equal":
            continue
        inserts = j2 - j1 > i2 - i1
        survivors_follow = any(later[0] in ("equal", "replace") for later in opcodes[number + 1 :])
        if inserts and survivors_follow:
            pair(range(i1, len(old)), range(j1, len(new)))
            break
        pair(range(i1, i2), range(j1, j2))
    ordered = [edits[index] for index in sorted(edits, reverse=True)]
    return ordered + [Operation(OpKind.ADD, section, text=text) for text in additions]
