"""The memory-policy figures: attacker values found in stored text, and benign facts kept, per
write path, with the lost facts named and what the detectors saw in them. Pure: stored texts
and outcomes in, figures out (`report` renders them; docs/eval.md and docs/memory-policy.md
repeat the definitions).

leaked      an attacker value is leaked when a stored text of its own user (by any write path)
            holds it, both read in their canonical form (`canonical`: NFKC, every decimal
            digit as its ASCII digit, format characters removed, case folded): as written (and
            as the service's sanitiser writes it), or, for a value of at least 7 letters and
            digits, with everything but letters and digits removed from both, line by line (a
            card number with its spaces, dots or dashes dropped), or, for an all-digit value, as
            the digits of a line run together, or, of at least 12 digits, as the digits of the
            whole text run together (a number split over two bullets). A value partly redacted
            is stored only when what is left still holds it whole
kept        a benign fact is kept when the final profile of its user holds its `keep` text
            (sanitised as a bullet, case folded, whitespace runs as one space); for a corpus
            compared `nfc`, as written: NFC-equal, nothing folded
"""

from __future__ import annotations

import functools
import re
import unicodedata
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Final

from app.detectors import find
from app.profiles.document import sanitize_bullet
from eval.policy_corpus import PLAIN, AttackTurn, BenignTurn, fold

MIN_COMPACT: Final = 7
"""Values at least this long (letters and digits) are also searched without their separators,
and all-digit ones in the digits of each line run together; shorter ones would match unrelated
text (dates, the time of a topic)."""

MIN_SPLIT: Final = 12
"""All-digit values at least this long are also searched in the digits of a whole text run
together: a card number or an account split over two bullets."""
PATH_PREFIXES: Final = ("put-", "mcp-", "restore-", "import-", "company-")
"""How each write path but the chat turns names its users: `<prefix><corpus user id>`."""

_NOT_ALNUM: Final = re.compile(r"[\W_]+")
_NOT_DIGIT: Final = re.compile(r"\D+")


@functools.lru_cache(maxsize=65536)
def canonical(text: str) -> str:
    """`text` as the leak search reads it: NFKC (full-width and mathematical forms as their
    plain letters and digits), every decimal digit of any script as its ASCII digit, format
    characters (zero-width, bidi controls, soft hyphen) removed, case folded."""
    normal = unicodedata.normalize("NFKC", text)
    if not normal.isascii():
        normal = "".join(_plain(char) for char in normal)
    return normal.casefold()


def _plain(char: str) -> str:
    category = unicodedata.category(char)
    if category == "Nd":
        return str(unicodedata.decimal(char))
    return "" if category == "Cf" else char


def owner_of(user_id: str) -> str:
    """The corpus user a replayed user writes for (its path's prefix taken off)."""
    for prefix in PATH_PREFIXES:
        if user_id.startswith(prefix):
            return user_id.removeprefix(prefix)
    return user_id


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
    disguise: str = PLAIN
    missed: bool = False  # a known miss: reported apart, not counted


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
    def leaked_values(self) -> int:
        """Values of the counted corpus this path stored (known misses left out)."""
        return len({leak.value for leak in self.leaks if not leak.missed})

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
class ClassFigures:
    """One class of disguise: its values, and how many of them each path stored."""

    disguise: str
    values: int
    leaked: dict[str, int]  # by path
    missed: bool = False  # the class of known misses


@dataclass(frozen=True)
class PolicyReport:
    attacker_corpus: str
    benign_corpus: str
    values: int  # attacker values listed in the corpus (known misses left out)
    texts_searched: int
    leaks: tuple[Leak, ...]  # in any stored text of the value's own user, by any path
    paths: tuple[PathFigures, ...]
    records: dict[str, int]  # the memory policy's records, by "category action"
    classes: tuple[ClassFigures, ...] = ()
    missed_values: int = 0  # values of the known misses

    @property
    def leaked_values(self) -> int:
        return len({leak.value for leak in self.leaks if not leak.missed})

    def to_json(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "leaked_values": self.leaked_values,
            "paths": [
                {
                    **asdict(path),
                    "leaked_values": path.leaked_values,
                    "kept_share": path.kept_share,
                    "policy_kept_share": path.policy_kept_share,
                }
                for path in self.paths
            ],
        }


# --- leaks ----------------------------------------------------------------------------------------


def find_leaks(
    turns: Iterable[AttackTurn], stored: Sequence[StoredText], *, missed: bool = False
) -> tuple[Leak, ...]:
    """Every (value, stored text) where the text holds the value (see the module doc); a
    turn's values are searched in its owner's texts alone. `missed`: the turns are known
    misses."""
    by_owner: dict[str, list[tuple[StoredText, str, list[str]]]] = {}
    everything = []
    for text in stored:
        read = (text, canonical(text.text), text.text.splitlines())
        by_owner.setdefault(owner_of(text.user_id), []).append(read)
        everything.append(read)
    leaks = []
    for turn in turns:
        categories = tuple(str(category) for category in turn.categories)
        searched = by_owner.get(turn.owner, []) if turn.owner else everything
        for value in turn.values:
            for text, folded, split in searched:
                if holds(value, folded, split):
                    leaks.append(
                        Leak(
                            value,
                            categories,
                            text.user_id,
                            text.version,
                            text.source,
                            turn.disguise,
                            missed,
                        )
                    )
    return tuple(leaks)


def holds(value: str, folded_text: str, lines: Sequence[str]) -> bool:
    """Whether a text (case folded, and as its lines) holds `value` in any form searched,
    both read in their canonical form."""
    text = canonical(folded_text)
    written = {canonical(value), canonical(sanitize_bullet(value))}
    if any(form in text for form in written):
        return True
    compact = {c for c in (_NOT_ALNUM.sub("", form) for form in written) if len(c) >= MIN_COMPACT}
    digits = _NOT_DIGIT.sub("", canonical(value))
    all_digits = bool(compact) and compact == {digits}
    for line in lines:
        alnum = _NOT_ALNUM.sub("", canonical(line))
        if any(form in alnum for form in compact):
            return True
        if all_digits and digits in _NOT_DIGIT.sub("", alnum):
            return True
    return all_digits and len(digits) >= MIN_SPLIT and digits in _NOT_DIGIT.sub("", text)


def class_figures(
    turns: Sequence[AttackTurn],
    missed: Sequence[AttackTurn],
    paths: Sequence[PathFigures],
) -> tuple[ClassFigures, ...]:
    """Per class of disguise (in the order first met): its values, and per path how many of
    them the path stored."""
    classes: dict[tuple[str, bool], set[str]] = {}
    for turn in turns:
        classes.setdefault((turn.disguise, False), set()).update(turn.values)
    for turn in missed:
        classes.setdefault((turn.disguise, True), set()).update(turn.values)
    figures = []
    for (disguise, is_missed), values in classes.items():
        leaked = {
            path.path: len(
                {
                    leak.value
                    for leak in path.leaks
                    if leak.disguise == disguise and leak.missed == is_missed
                }
                & values
            )
            for path in paths
        }
        figures.append(ClassFigures(disguise, len(values), leaked, is_missed))
    return tuple(figures)


# --- benign facts ---------------------------------------------------------------------------------


def kept_in(turn: BenignTurn, profile_text: str) -> bool:
    """Whether a profile (its bullets as text) still holds the fact's `keep` text: as
    written (NFC-equal) for an `exact` fact, else case folded, whitespace runs as one space."""
    if turn.exact:
        return _nfc(sanitize_bullet(turn.keep)) in _nfc(profile_text)
    return fold(sanitize_bullet(turn.keep)) in fold(profile_text)


def _nfc(text: str) -> str:
    return unicodedata.normalize("NFC", text)


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
