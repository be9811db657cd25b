"""The corpus: scripted conversations and the profile each should end with, read from YAML and
checked on load, so a typo in a section title or a fact id fails before anything runs."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from app.profiles.document import SECTIONS, Section

DEFAULT_CORPUS = Path(__file__).resolve().parent / "corpus.yaml"
DURABLE_SECTIONS: tuple[Section, ...] = tuple(s for s in SECTIONS if s is not Section.RECENT)
"""Every section but Recent Topics, a dated log of what was discussed rather than facts."""


class CorpusError(ValueError):
    """The corpus file is malformed; the message names the user and the field."""


@dataclass(frozen=True)
class Turn:
    user: str
    assistant: str
    fact: bool = False
    burst: bool = False


@dataclass(frozen=True)
class Matcher:
    """Bullets of `sections` that contain every term; a term is a tuple of accepted spellings,
    matched case-insensitively as whole words."""

    sections: tuple[Section, ...]
    terms: tuple[tuple[str, ...], ...]

    def matches(self, section: Section, bullet: str) -> bool:
        if section not in self.sections:
            return False
        return all(any(_contains(bullet, word) for word in term) for term in self.terms)

    def describe(self) -> str:
        return " + ".join("|".join(term) for term in self.terms)


@dataclass(frozen=True)
class ExpectedFact:
    id: str
    matcher: Matcher


@dataclass(frozen=True)
class Contradiction:
    old: Matcher
    new: str  # the id of the expected fact that replaced it


@dataclass(frozen=True)
class Expectation:
    facts: tuple[ExpectedFact, ...]
    contradictions: tuple[Contradiction, ...] = ()
    forgotten: tuple[Matcher, ...] = ()
    never_stored: tuple[Matcher, ...] = ()


@dataclass(frozen=True)
class UserScript:
    id: str
    about: str
    turns: tuple[Turn, ...]
    expect: Expectation

    @property
    def fact_turns(self) -> int:
        return sum(turn.fact for turn in self.turns)


@dataclass(frozen=True)
class Corpus:
    users: tuple[UserScript, ...]

    @property
    def turns(self) -> int:
        return sum(len(user.turns) for user in self.users)


def load_corpus(path: Path = DEFAULT_CORPUS) -> Corpus:
    """The corpus at `path`, validated (`CorpusError` names what is wrong)."""
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as error:
        raise CorpusError(f"{path}: not valid YAML ({error})") from None
    return parse_corpus(data)


def parse_corpus(data: object) -> Corpus:
    users = _mapping(data, "corpus").get("users")
    if not isinstance(users, list) or not users:
        raise CorpusError("corpus: `users` must be a non-empty list")
    scripts = tuple(_user(item, n) for n, item in enumerate(users, 1))
    ids = [user.id for user in scripts]
    if len(set(ids)) != len(ids):
        raise CorpusError("corpus: user ids must be unique")
    return Corpus(scripts)


# --- parsing ------------------------------------------------------------------------------------

_USER_ID = re.compile(r"[a-z0-9][a-z0-9_-]{0,40}")


def _user(item: object, number: int) -> UserScript:
    raw = _mapping(item, f"user {number}")
    user_id = raw.get("id")
    if not isinstance(user_id, str) or not _USER_ID.fullmatch(user_id):
        raise CorpusError(f"user {number}: `id` must be lower-case letters, digits, - or _")
    where = f"user {user_id}"
    turns = raw.get("turns")
    if not isinstance(turns, list) or not turns:
        raise CorpusError(f"{where}: `turns` must be a non-empty list")
    parsed = tuple(_turn(turn, f"{where} turn {n}") for n, turn in enumerate(turns, 1))
    if parsed[0].burst:
        raise CorpusError(f"{where} turn 1: a first turn cannot be part of a burst")
    expect = _expectation(_mapping(raw.get("expect"), f"{where} expect"), where)
    return UserScript(user_id, str(raw.get("about", "")), parsed, expect)


def _turn(item: object, where: str) -> Turn:
    raw = _mapping(item, where)
    unknown = set(raw) - {"user", "assistant", "fact", "burst"}
    if unknown:
        raise CorpusError(f"{where}: unknown keys {sorted(unknown)}")
    user, assistant = raw.get("user"), raw.get("assistant")
    if not isinstance(user, str) or not user.strip():
        raise CorpusError(f"{where}: `user` must be non-empty text")
    if not isinstance(assistant, str) or not assistant.strip():
        raise CorpusError(f"{where}: `assistant` must be non-empty text")
    fact, burst = raw.get("fact", False), raw.get("burst", False)
    if not isinstance(fact, bool) or not isinstance(burst, bool):
        raise CorpusError(f"{where}: `fact` and `burst` are true or false")
    return Turn(user, assistant, fact, burst)


def _expectation(raw: Mapping[str, Any], where: str) -> Expectation:
    unknown = set(raw) - {"facts", "contradictions", "forgotten", "never_stored"}
    if unknown:
        raise CorpusError(f"{where} expect: unknown keys {sorted(unknown)}")
    facts = []
    for n, item in enumerate(_list(raw.get("facts"), f"{where} expect.facts"), 1):
        fact = _mapping(item, f"{where} fact {n}")
        fact_id = fact.get("id")
        if not isinstance(fact_id, str) or not fact_id:
            raise CorpusError(f"{where} fact {n}: `id` is required")
        facts.append(ExpectedFact(fact_id, _matcher(fact, f"{where} fact {fact_id}", None)))
    ids = [fact.id for fact in facts]
    if not facts or len(set(ids)) != len(ids):
        raise CorpusError(f"{where} expect.facts: a non-empty list with unique ids")
    contradictions = []
    for n, item in enumerate(_list(raw.get("contradictions"), f"{where} contradictions"), 1):
        entry = _mapping(item, f"{where} contradiction {n}")
        new = entry.get("new")
        if new not in ids:
            raise CorpusError(f"{where} contradiction {n}: `new` must name an expected fact")
        old = _matcher(_mapping(entry.get("old"), f"{where} contradiction {n} old"), where, None)
        contradictions.append(Contradiction(old, str(new)))
    forgotten = tuple(
        _matcher(_mapping(item, f"{where} forgotten {n}"), where, SECTIONS)
        for n, item in enumerate(_list(raw.get("forgotten"), f"{where} forgotten"), 1)
    )
    never = tuple(
        _matcher(_mapping(item, f"{where} never_stored {n}"), where, SECTIONS)
        for n, item in enumerate(_list(raw.get("never_stored"), f"{where} never_stored"), 1)
    )
    return Expectation(tuple(facts), tuple(contradictions), forgotten, never)


def _matcher(raw: Mapping[str, Any], where: str, default: Sequence[Section] | None) -> Matcher:
    section = raw.get("section")
    if section is None:
        if default is None:
            raise CorpusError(f"{where}: `section` is required")
        sections = tuple(default)
    else:
        names = section if isinstance(section, list) else [section]
        titles = {s.value: s for s in SECTIONS}
        if not names or any(name not in titles for name in names):
            raise CorpusError(f"{where}: `section` must be one or more of {sorted(titles)}")
        sections = tuple(titles[name] for name in names)
    match = raw.get("match")
    if not isinstance(match, list) or not match or not all(isinstance(t, str) for t in match):
        raise CorpusError(f"{where}: `match` must be a non-empty list of terms")
    terms = tuple(tuple(word.strip() for word in term.split("|") if word.strip()) for term in match)
    if not all(terms):
        raise CorpusError(f"{where}: empty term in `match`")
    return Matcher(sections, terms)


def _mapping(value: object, where: str) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise CorpusError(f"{where}: expected a mapping")
    return value


def _list(value: object, where: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise CorpusError(f"{where}: expected a list")
    return value


def _contains(text: str, word: str) -> bool:
    pattern = r"(?<!\w)" + re.escape(word) + r"(?!\w)"
    return re.search(pattern, text, re.IGNORECASE) is not None
