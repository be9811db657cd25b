"""The memory-policy corpora: attacker turns with the values that must never be stored, and
benign facts with the text that must survive, read from YAML and checked on load (formats at the
top of eval/corpus-attacker.yaml, eval/corpus-disguises.yaml, eval/corpus-benign.yaml and
eval/corpus-benign-scripts.yaml)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import yaml

from app.detectors import Category
from app.profiles.document import SECTIONS, Section
from eval.corpus import CorpusError, Expectation, Turn, UserScript

EVAL_DIR = Path(__file__).resolve().parent
DEFAULT_ATTACKER = EVAL_DIR / "corpus-attacker.yaml"
DEFAULT_BENIGN = EVAL_DIR / "corpus-benign.yaml"
DISGUISES = EVAL_DIR / "corpus-disguises.yaml"
BENIGN_SCRIPTS = EVAL_DIR / "corpus-benign-scripts.yaml"
DEFAULT_ATTACKERS = (DEFAULT_ATTACKER, DISGUISES)
DEFAULT_BENIGNS = (DEFAULT_BENIGN, BENIGN_SCRIPTS)
PLAIN: Final = "plain"
"""The class of an attacker turn that names none: a value written as it is."""
_USER_ID = re.compile(r"[a-z0-9][a-z0-9_-]{0,40}")
_CLASS = re.compile(r"[a-z0-9][a-z0-9-]{0,40}")
_SPACES = re.compile(r"\s+")
_NOT_ALNUM = re.compile(r"[\W_]+")


@dataclass(frozen=True)
class AttackTurn:
    user: str
    assistant: str
    categories: tuple[Category, ...]
    values: tuple[str, ...]
    disguise: str = PLAIN
    """The turn's `class`: how its values are disguised (`plain`: not at all)."""
    owner: str = ""
    """The corpus user whose turn it is: its values are searched in that user's texts alone,
    whichever path wrote them (`owner_of`); empty: in every text."""
    reason: str = ""
    """Why the memory policy misses it, for a turn of `known_misses`."""


@dataclass(frozen=True)
class BenignTurn:
    user: str
    assistant: str
    bullet: str
    section: Section
    keep: str
    exact: bool = False
    """`keep` must be stored as written (NFC-equal), not merely case-insensitively."""


@dataclass(frozen=True)
class AttackUser:
    id: str
    about: str
    turns: tuple[AttackTurn, ...]


@dataclass(frozen=True)
class BenignUser:
    id: str
    about: str
    turns: tuple[BenignTurn, ...]


@dataclass(frozen=True)
class PolicyCorpus:
    attacker: tuple[AttackUser, ...]
    benign: tuple[BenignUser, ...]
    known_misses: tuple[AttackUser, ...] = ()
    """Attacker users whose disguises the policy is known to miss: replayed and reported
    apart, never counted as kept out."""

    @property
    def attack_turns(self) -> tuple[AttackTurn, ...]:
        return tuple(turn for user in self.attacker for turn in user.turns)

    @property
    def missed_turns(self) -> tuple[AttackTurn, ...]:
        return tuple(turn for user in self.known_misses for turn in user.turns)

    @property
    def attackers(self) -> tuple[AttackUser, ...]:
        """Every attacker user replayed, the known misses last."""
        return (*self.attacker, *self.known_misses)

    @property
    def benign_turns(self) -> tuple[BenignTurn, ...]:
        return tuple(turn for user in self.benign for turn in user.turns)

    def scripts(self, *, burst: bool = False) -> tuple[UserScript, ...]:
        """Every user as a corpus script the replay sends turn by turn: each turn paced (it
        waits for the consolidation of the one before), or, `burst`, every turn after the first
        saved straight after the one before, so the worker may consolidate several at once."""
        users: list[AttackUser | BenignUser] = [*self.attackers, *self.benign]
        scripts = []
        for user in users:
            turns: Sequence[AttackTurn | BenignTurn] = user.turns
            replayed = tuple(
                Turn(turn.user, turn.assistant, fact=True, burst=burst and n > 0)
                for n, turn in enumerate(turns)
            )
            scripts.append(UserScript(user.id, user.about, replayed, Expectation(facts=())))
        return tuple(scripts)

    def subset(self, users_per_corpus: int, turns_per_user: int) -> PolicyCorpus:
        """The first users of each corpus with their first turns: a smaller run that still
        covers every attacker category the first users hold."""
        return PolicyCorpus(
            tuple(
                AttackUser(u.id, u.about, u.turns[:turns_per_user])
                for u in self.attacker[:users_per_corpus]
            ),
            tuple(
                BenignUser(u.id, u.about, u.turns[:turns_per_user])
                for u in self.benign[:users_per_corpus]
            ),
            self.known_misses[:users_per_corpus],
        )


def fold(text: str) -> str:
    """Case folded, whitespace runs as one space: how `keep` texts are compared."""
    return _SPACES.sub(" ", text).strip().casefold()


def load_policy_corpus(
    attacker: Path | Sequence[Path] = DEFAULT_ATTACKERS,
    benign: Path | Sequence[Path] = DEFAULT_BENIGNS,
) -> PolicyCorpus:
    """The corpora of the files given, validated (`CorpusError` names the file, user and
    field); user ids are unique across all of them, since they are replayed into one company."""
    attack_users: list[AttackUser] = []
    misses: list[AttackUser] = []
    for path in _paths(attacker):
        data = _document(path, ("users", "known_misses"))
        attack_users += (
            _attack_user(item, f"{path.name} user {n}")
            for n, item in enumerate(_users(data, path, "users"), 1)
        )
        if "known_misses" in data:
            misses += (
                _attack_user(item, f"{path.name} known miss {n}", missed=True)
                for n, item in enumerate(_users(data, path, "known_misses"), 1)
            )
    benign_users: list[BenignUser] = []
    for path in _paths(benign):
        data = _document(path, ("users", "compare"))
        compare = data.get("compare", "folded")
        if compare not in ("folded", "nfc"):
            raise CorpusError(f"{path.name}: `compare` must be `folded` or `nfc`")
        benign_users += (
            _benign_user(item, f"{path.name} user {n}", exact=compare == "nfc")
            for n, item in enumerate(_users(data, path, "users"), 1)
        )
    ids = [user.id for user in (*attack_users, *misses)] + [user.id for user in benign_users]
    if len(set(ids)) != len(ids):
        raise CorpusError("policy corpora: user ids must be unique across all files")
    return PolicyCorpus(tuple(attack_users), tuple(benign_users), tuple(misses))


def _paths(given: Path | Sequence[Path]) -> tuple[Path, ...]:
    return (given,) if isinstance(given, Path) else tuple(given)


def _document(path: Path, keys: tuple[str, ...]) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as error:
        raise CorpusError(f"{path}: not valid YAML ({error})") from None
    if not isinstance(data, dict):
        raise CorpusError(f"{path.name}: expected a mapping with `users`")
    unknown = set(data) - set(keys)
    if unknown:
        raise CorpusError(f"{path.name}: unknown keys {sorted(unknown)} (expected {list(keys)})")
    return data


def _users(data: dict[str, Any], path: Path, key: str) -> list[Any]:
    users = data.get(key)
    if not isinstance(users, list) or not users:
        raise CorpusError(f"{path.name}: `{key}` must be a non-empty list")
    return users


def _header(item: Any, where: str) -> tuple[str, str, list[Any]]:
    if not isinstance(item, dict):
        raise CorpusError(f"{where}: expected a mapping")
    user_id, turns = item.get("id"), item.get("turns")
    if not isinstance(user_id, str) or not _USER_ID.fullmatch(user_id):
        raise CorpusError(f"{where}: `id` must be lower-case letters, digits, - or _")
    if not isinstance(turns, list) or not turns:
        raise CorpusError(f"{where} ({user_id}): `turns` must be a non-empty list")
    return user_id, str(item.get("about", "")), turns


def _fields(
    item: Any, where: str, keys: frozenset[str], optional: frozenset[str] = frozenset()
) -> dict[str, Any]:
    if not isinstance(item, dict):
        raise CorpusError(f"{where}: expected a mapping")
    if not keys <= set(item) <= keys | optional:
        extra = f" (and optionally {sorted(optional)})" if optional else ""
        raise CorpusError(f"{where}: expected exactly the keys {sorted(keys)}{extra}")
    for key in ("user", "assistant"):
        if not isinstance(item[key], str) or not item[key].strip():
            raise CorpusError(f"{where}: `{key}` must be non-empty text")
    return item


_ATTACK_KEYS = frozenset({"user", "assistant", "category", "values"})
_BENIGN_KEYS = frozenset({"user", "assistant", "bullet", "section", "keep"})


def _attack_user(item: Any, where: str, *, missed: bool = False) -> AttackUser:
    """One attacker user; `missed`: of `known_misses`, where each turn names its `reason`,
    may list no value (the first half of a split one), and a value may be spread over the
    user's turns so far (its letters and digits must all be there, in order)."""
    user_id, about, turns = _header(item, where)
    parsed = []
    written = ""
    for n, raw in enumerate(turns, 1):
        at = f"{where} ({user_id}) turn {n}"
        keys = _ATTACK_KEYS | {"reason"} if missed else _ATTACK_KEYS
        turn = _fields(raw, at, keys, frozenset({"class"}))
        names = turn["category"] if isinstance(turn["category"], list) else [turn["category"]]
        if not names or any(name not in tuple(Category) for name in names):
            raise CorpusError(f"{at}: `category` must be one or more of {list(Category)}")
        disguise = turn.get("class", PLAIN)
        if not isinstance(disguise, str) or not _CLASS.fullmatch(disguise):
            raise CorpusError(f"{at}: `class` must be lower-case letters, digits or -")
        reason = turn.get("reason", "")
        if missed and (not isinstance(reason, str) or not reason.strip()):
            raise CorpusError(f"{at}: a known miss must say why (`reason`)")
        values = turn["values"]
        if not isinstance(values, list) or not (values or missed):
            raise CorpusError(f"{at}: `values` must be a non-empty list")
        written += " " + turn["user"]
        for value in values:
            if not isinstance(value, str) or not _wrote(value, turn["user"], written, missed):
                raise CorpusError(f"{at}: every value must be text the user wrote")
        parsed.append(
            AttackTurn(
                turn["user"],
                turn["assistant"],
                tuple(Category(name) for name in names),
                tuple(values),
                disguise,
                user_id,
                reason,
            )
        )
    return AttackUser(user_id, about, tuple(parsed))


def _wrote(value: str, message: str, so_far: str, spread: bool) -> bool:
    if fold(value) in fold(message):
        return True
    if not spread:
        return False
    remaining = iter(_NOT_ALNUM.sub("", so_far.casefold()))
    compact = _NOT_ALNUM.sub("", value.casefold())
    return bool(compact) and all(char in remaining for char in compact)  # in order


def _benign_user(item: Any, where: str, *, exact: bool = False) -> BenignUser:
    user_id, about, turns = _header(item, where)
    titles = {section.value: section for section in SECTIONS}
    parsed = []
    for n, raw in enumerate(turns, 1):
        at = f"{where} ({user_id}) turn {n}"
        turn = _fields(raw, at, _BENIGN_KEYS)
        if turn["section"] not in titles:
            raise CorpusError(f"{at}: `section` must be one of {sorted(titles)}")
        bullet, keep = turn["bullet"], turn["keep"]
        if not isinstance(bullet, str) or not isinstance(keep, str) or not keep.strip():
            raise CorpusError(f"{at}: `bullet` and `keep` must be text")
        if fold(keep) not in fold(turn["user"]) or fold(keep) not in fold(bullet):
            raise CorpusError(f"{at}: `keep` must be part of both `user` and `bullet`")
        parsed.append(
            BenignTurn(
                turn["user"], turn["assistant"], bullet, titles[turn["section"]], keep, exact
            )
        )
    return BenignUser(user_id, about, tuple(parsed))
