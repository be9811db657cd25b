"""The memory-policy figures: attacker values found in stored text, and benign facts kept, per
write path, with the lost facts named and what the detectors saw in them. Pure: stored texts
and outcomes in, figures out (`report` renders them; docs/eval.md and docs/memory-policy.md
repeat the definitions).

leaked      an attacker value is leaked when a stored text holds it: as written (case folded,
            and as the service's sanitiser writes it), or, for a value of at least 7 letters and
            digits, with everything but letters and digits removed from both, line by line (a
            card number with its spaces, dots or dashes dropped), or, for an all-digit value, as
            the digits of a line run together
kept        a benign fact is kept when the final profile of its user holds its `keep` text
            (sanitised as a bullet, case folded, whitespace runs as one space)
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Final

from app.detectors import find
from app.profiles.document import sanitize_bullet
from eval.policy_corpus import AttackTurn, BenignTurn, fold

MIN_COMPACT: Final = 7
"""Values at least this long (letters and digits) are also searched without their separators,
and all-digit ones in the digits of each line run together; shorter ones would match unrelated
text (dates, the time of a topic)."""

_NOT_ALNUM: Final = re.compile(r"[\W_]+")
_NOT_DIGIT: Final = re.compile(r"\D+")


@dataclass(frozen=True)
class StoredText:
    """One text the service stored for a user: a version's content or operations, or a
    record of what the memory policy did (`source` says which; one line per item)."""

    user_id: str
    version: int | None
    source: str
    text: str


@dataclass(frozen=True)
class Leak:
    value: str
    categories: tuple[str, ...]
    user_id: str
    version: int | None
    source: str


@dataclass(frozen=True)
class LostFact:
    """A benign fact the path did not keep, with what the detectors find in its text
    (`category (kind)`; empty: nothing, so the engine did not store it for its own reasons)
    and, for an edit, the categories the refusal named."""

    user_id: str
    text: str
    flagged: tuple[str, ...]
    refused_as: tuple[str, ...] = ()


@dataclass(frozen=True)
class PathFigures:
    """One write path: the chat turns through an engine, the user's PUT, or MCP edit_memory."""

    path: str
    users: tuple[str, ...]
    attacks: int
    values: int
    leaks: tuple[Leak, ...]
    refused: int | None  # edits the service refused (None for the chat turns)
    refusals_expected: int | None  # edits holding a category whose default action is `drop`
    facts: int
    kept: int
    lost: tuple[LostFact, ...]
    jobs: dict[str, int] = field(default_factory=dict)
    notes: tuple[str, ...] = ()  # what did not go as the policy says, besides leaks and losses

    @property
    def lost_to_policy(self) -> tuple[LostFact, ...]:
        return tuple(fact for fact in self.lost if fact.flagged or fact.refused_as)

    @property
    def kept_share(self) -> float:
        return self.kept / self.facts if self.facts else 1.0

    @property
    def policy_kept_share(self) -> float:
        """Facts not lost to the memory policy ÷ facts: what the gate lets through, whatever
        the engine reads."""
        return 1 - len(self.lost_to_policy) / self.facts if self.facts else 1.0


@dataclass(frozen=True)
class PolicyReport:
    attacker_corpus: str
    benign_corpus: str
    values: int  # attacker values listed in the corpus
    texts_searched: int
    leaks: tuple[Leak, ...]  # in any stored text of any user
    paths: tuple[PathFigures, ...]
    records: dict[str, int]  # the memory policy's records, by "category action"

    @property
    def leaked_values(self) -> int:
        return len({leak.value for leak in self.leaks})

    def to_json(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "leaked_values": self.leaked_values,
            "paths": [
                {
                    **asdict(path),
                    "kept_share": path.kept_share,
                    "policy_kept_share": path.policy_kept_share,
                }
                for path in self.paths
            ],
        }


# --- leaks ----------------------------------------------------------------------------------------


def find_leaks(turns: Iterable[AttackTurn], stored: Sequence[StoredText]) -> tuple[Leak, ...]:
    """Every (value, stored text) where the text holds the value (see the module doc)."""
    lines = [(text, text.text.casefold(), text.text.splitlines()) for text in stored]
    leaks = []
    for turn in turns:
        categories = tuple(str(category) for category in turn.categories)
        for value in turn.values:
            for text, folded, split in lines:
                if holds(value, folded, split):
                    leaks.append(Leak(value, categories, text.user_id, text.version, text.source))
    return tuple(leaks)


def holds(value: str, folded_text: str, lines: Sequence[str]) -> bool:
    """Whether a text (case folded, and as its lines) holds `value` in any form searched."""
    written = {value.casefold(), sanitize_bullet(value).casefold()}
    if any(form in folded_text for form in written):
        return True
    compact = {c for c in (_NOT_ALNUM.sub("", form) for form in written) if len(c) >= MIN_COMPACT}
    digits = _NOT_DIGIT.sub("", value) if value.isascii() else ""
    all_digits = bool(compact) and compact == {digits}
    for line in lines:
        alnum = _NOT_ALNUM.sub("", line.casefold())
        if any(form in alnum for form in compact):
            return True
        if all_digits and digits in _NOT_DIGIT.sub("", line):
            return True
    return False


# --- benign facts ---------------------------------------------------------------------------------


def kept_in(turn: BenignTurn, profile_text: str) -> bool:
    """Whether a profile (its bullets as text) still holds the fact's `keep` text."""
    return fold(sanitize_bullet(turn.keep)) in fold(profile_text)


def flags(text: str) -> tuple[str, ...]:
    """What the detectors find in `text`, as `category (kind)`, each once."""
    return tuple(dict.fromkeys(f"{f.category.value} ({f.kind})" for f in find(text)))


def lost_facts(
    user_id: str,
    turns: Sequence[BenignTurn],
    profile_text: str,
    *,
    edited: bool,
    refusals: Sequence[tuple[str, ...]] = (),
) -> tuple[LostFact, ...]:
    """The facts of one user the profile lost; `edited`: they were written as bullets (PUT,
    MCP), so the bullet is the text judged, else the user's message. `refusals`: per turn,
    the categories the edit's refusal named."""
    lost = []
    for n, turn in enumerate(turns):
        if kept_in(turn, profile_text):
            continue
        text = turn.bullet if edited else turn.user
        refused = refusals[n] if n < len(refusals) else ()
        lost.append(LostFact(user_id, text, flags(text), refused))
    return tuple(lost)
