"""The memory-policy corpora: attacker turns with the values that must never be stored, and
benign facts with the text that must survive, read from YAML and checked on load (formats at the
top of eval/corpus-attacker.yaml and eval/corpus-benign.yaml)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from app.detectors import Category
from app.profiles.document import SECTIONS, Section
from eval.corpus import CorpusError, Expectation, Turn, UserScript

EVAL_DIR = Path(__file__).resolve().parent
DEFAULT_ATTACKER = EVAL_DIR / "corpus-attacker.yaml"
DEFAULT_BENIGN = EVAL_DIR / "corpus-benign.yaml"
_USER_ID = re.compile(r"[a-z0-9][a-z0-9_-]{0,40}")
_SPACES = re.compile(r"\s+")


@dataclass(frozen=True)
class AttackTurn:
    user: str
    assistant: str
    categories: tuple[Category, ...]
    values: tuple[str, ...]


@dataclass(frozen=True)
class BenignTurn:
    user: str
    assistant: str
    bullet: str
    section: Section
    keep: str


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

    @property
    def attack_turns(self) -> tuple[AttackTurn, ...]:
        return tuple(turn for user in self.attacker for turn in user.turns)

    @property
    def benign_turns(self) -> tuple[BenignTurn, ...]:
        return tuple(turn for user in self.benign for turn in user.turns)

    def scripts(self) -> tuple[UserScript, ...]:
        """Every user as a corpus script the replay sends turn by turn (each turn paced)."""
        users: list[AttackUser | BenignUser] = [*self.attacker, *self.benign]
        return tuple(
            UserScript(
                user.id,
                user.about,
                tuple(Turn(turn.user, turn.assistant, fact=True) for turn in user.turns),
                Expectation(facts=()),
            )
            for user in users
        )

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
        )


def fold(text: str) -> str:
    """Case folded, whitespace runs as one space: how `keep` texts are compared."""
    return _SPACES.sub(" ", text).strip().casefold()


def load_policy_corpus(
    attacker: Path = DEFAULT_ATTACKER, benign: Path = DEFAULT_BENIGN
) -> PolicyCorpus:
    """Both corpora, validated (`CorpusError` names the file, user and field); user ids are
    unique across the two, since they are replayed into one company."""
    attack_users = tuple(
        _attack_user(item, f"{attacker.name} user {n}")
        for n, item in enumerate(_users(attacker), 1)
    )
    benign_users = tuple(
        _benign_user(item, f"{benign.name} user {n}") for n, item in enumerate(_users(benign), 1)
    )
    ids = [user.id for user in attack_users] + [user.id for user in benign_users]
    if len(set(ids)) != len(ids):
        raise CorpusError("policy corpora: user ids must be unique across both files")
    return PolicyCorpus(attack_users, benign_users)


def _users(path: Path) -> list[Any]:
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as error:
        raise CorpusError(f"{path}: not valid YAML ({error})") from None
    users = data.get("users") if isinstance(data, dict) else None
    if not isinstance(users, list) or not users:
        raise CorpusError(f"{path.name}: `users` must be a non-empty list")
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


def _fields(item: Any, where: str, keys: frozenset[str]) -> dict[str, Any]:
    if not isinstance(item, dict):
        raise CorpusError(f"{where}: expected a mapping")
    if set(item) != keys:
        raise CorpusError(f"{where}: expected exactly the keys {sorted(keys)}")
    for key in ("user", "assistant"):
        if not isinstance(item[key], str) or not item[key].strip():
            raise CorpusError(f"{where}: `{key}` must be non-empty text")
    return item


_ATTACK_KEYS = frozenset({"user", "assistant", "category", "values"})
_BENIGN_KEYS = frozenset({"user", "assistant", "bullet", "section", "keep"})


def _attack_user(item: Any, where: str) -> AttackUser:
    user_id, about, turns = _header(item, where)
    parsed = []
    for n, raw in enumerate(turns, 1):
        at = f"{where} ({user_id}) turn {n}"
        turn = _fields(raw, at, _ATTACK_KEYS)
        names = turn["category"] if isinstance(turn["category"], list) else [turn["category"]]
        if not names or any(name not in tuple(Category) for name in names):
            raise CorpusError(f"{at}: `category` must be one or more of {list(Category)}")
        values = turn["values"]
        if not isinstance(values, list) or not values:
            raise CorpusError(f"{at}: `values` must be a non-empty list")
        for value in values:
            if not isinstance(value, str) or fold(value) not in fold(turn["user"]):
                raise CorpusError(f"{at}: every value must be text the user wrote")
        parsed.append(
            AttackTurn(
                turn["user"],
                turn["assistant"],
                tuple(Category(name) for name in names),
                tuple(values),
            )
        )
    return AttackUser(user_id, about, tuple(parsed))


def _benign_user(item: Any, where: str) -> BenignUser:
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
            BenignTurn(turn["user"], turn["assistant"], bullet, titles[turn["section"]], keep)
        )
    return BenignUser(user_id, about, tuple(parsed))
