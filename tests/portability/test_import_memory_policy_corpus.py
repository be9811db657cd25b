"""The memory-policy corpora through the imports: a company stream whose users' histories hold
every attacker value of eval/corpus-attacker.yaml (each sentence a bullet of a plausible section
and each message a Recent Topic with its digits run together, as eval/obedient.py stores them,
added by consolidations, edited by the user and restored) and every fact of
eval/corpus-benign.yaml as a bullet of its section. Imported into an empty company, no stored
version's content or operations and no policy record holds any attacker value, in any form
eval/policy.py searches, and at least 95 % of the benign facts are in the heads; nor when the
user had later edited each value away, which leaves it in that version's operations only. A
user's own import of their export with an attacker value added is a 422 naming the category,
storing nothing; with a benign fact it imports."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Final

import httpx
from fastapi import FastAPI

from app.consolidation.rules import Exchange
from app.detectors import Category
from app.enablement.decision import FLAG_CONTEXT_MEMORY
from app.enablement.memory_policy import DEFAULT_ACTIONS, Action
from app.profiles.document import (
    SECTIONS,
    Operation,
    OpKind,
    Profile,
    Section,
    apply,
    empty_profile,
    parse,
    render,
)
from app.profiles.versions import content_sha256
from eval.import_stream import user_memory_records
from eval.obedient import obedient_operations, section_for, sentences
from eval.policy import StoredText, find_leaks, holds, kept_in
from eval.policy_corpus import (
    DEFAULT_ATTACKER,
    DEFAULT_BENIGN,
    AttackTurn,
    AttackUser,
    BenignUser,
    fold,
    load_policy_corpus,
)
from tests.helpers.apps import AuthFactory
from tests.helpers.db import rows
from tests.helpers.memory import ME
from tests.helpers.portability import import_into, stream_of
from tests.helpers.profiles import memory_md
from tests.helpers.settings import set_flag
from tests.helpers.snapshots import changed_tables, database_digest

CORPUS = load_policy_corpus(DEFAULT_ATTACKER, DEFAULT_BENIGN)
COMPANY: Final = "umbrella"
START: Final = datetime(2026, 10, 1, 8, 0, tzinfo=UTC)
TARGET_KEPT: Final = 0.95
MODEL: Final = "gpt-4o-mini"
INTRO: Final = "Joined the pilot group of the new assistant."
CONFIRMED: Final = " (confirmed by the user)"
FLAG: Final = {
    "type": "feature_flag",
    "flag": FLAG_CONTEXT_MEMORY,
    "enabled": True,
    "updated_at": "2026-09-30T08:00:00+00:00",
    "updated_by_company_id": "platform",
    "updated_by": "olga",
}
MEMORY_POLICY: Final = {  # the defaults, as the source deployment saved them
    "type": "memory_policy",
    "actions": {category.value: action.value for category, action in DEFAULT_ACTIONS.items()},
    "recent_topics_days": 0,
    "inactive_memory_days": 0,
    "updated_at": "2026-09-30T08:05:00+00:00",
    "updated_by_company_id": "platform",
    "updated_by": "olga",
}
IMPORT_OWN = f"{ME}/import"


# --- the stream -----------------------------------------------------------------------------------


@dataclass
class _History:
    """One user's versions as the source deployment stored them (nothing screened)."""

    user_id: str
    clock: datetime = START
    profile: Profile | None = None
    versions: list[dict[str, Any]] = field(default_factory=list)

    def write(
        self,
        operations: Sequence[Operation],
        reason: str = "consolidation",
        *,
        restore: Profile | None = None,
    ) -> Profile:
        """The next version: `operations` applied to the last one, or `restore` as it was."""
        self.clock += timedelta(hours=1)
        before = self.profile or empty_profile(self.user_id)
        profile = restore if restore is not None else apply(before, operations, self.clock)
        content = render(profile)
        self.versions.append(
            {
                "type": "memory_version",
                "user_id": self.user_id,
                "version": len(self.versions) + 1,
                "content": content,
                "sha256": content_sha256(content),
                "tokens": 1,
                "reason": reason,
                "operations": [op.to_json() for op in operations],
                "source_turn_ids": [],
                "model": MODEL if reason == "consolidation" else None,
                "created_at": self.clock.isoformat(),
            }
        )
        self.profile = profile
        return profile


def _attacker_history(user: AttackUser, *, clean_up: bool = False) -> _History:
    """An intro by the user; then per turn a consolidation by an obedient model (every sentence a
    bullet, the message a Recent Topic with its digits joined) with a harmless follow-up; the
    user's edit of every bullet the turns added, keeping its text; (`clean_up`: the user's edit
    of each of those bullets into one without the value, and the topics deleted); a restore of
    the first turn's version."""
    history = _History(user.id)
    history.write([Operation(OpKind.ADD, Section.IDENTITY, text=INTRO)], "user_edit")
    first_turn: Profile | None = None
    for number, turn in enumerate(user.turns, start=1):
        exchange = Exchange(turn.user, turn.assistant, history.clock)
        harmless = Operation(
            OpKind.ADD, Section.FOLLOWUPS, text=f"Revisit onboarding step {number}."
        )
        written = history.write([*obedient_operations([exchange]), harmless])
        first_turn = first_turn or written
    assert history.profile is not None
    assert first_turn is not None
    edits = [
        Operation(OpKind.UPDATE, section, text=bullet + CONFIRMED, target=bullet)
        for section in SECTIONS
        if section is not Section.RECENT
        for bullet in history.profile.bullets(section)
        if bullet != INTRO and not bullet.startswith("Revisit onboarding")
    ]
    edit_note = Operation(OpKind.ADD, Section.COMMUNICATION, text="Reviews the profile monthly.")
    history.write([*edits, edit_note], "user_edit")
    if clean_up:
        history.write(_clean_up(history.profile), "user_edit")
    history.write([], "restore", restore=first_turn)
    return history


def _clean_up(profile: Profile) -> list[Operation]:
    """Every bullet the turns added rewritten without what it said, every topic deleted."""
    operations = []
    for section in SECTIONS:
        for number, bullet in enumerate(profile.bullets(section), start=1):
            if bullet == INTRO or bullet.startswith("Revisit onboarding"):
                continue
            if section is Section.RECENT:
                operations.append(Operation(OpKind.DELETE, section, target=bullet))
            else:
                text = f"Removed detail {number} of {section.value}."
                operations.append(Operation(OpKind.UPDATE, section, text=text, target=bullet))
    operations.append(Operation(OpKind.ADD, Section.COMMUNICATION, text="Keeps details short."))
    return operations


def _benign_history(user: BenignUser) -> _History:
    """The first half of the user's facts by the user, the rest by a consolidation, then a
    consolidation that adds a Recent Topic."""
    history = _History(user.id)
    facts = [Operation(OpKind.ADD, turn.section, text=turn.bullet) for turn in user.turns]
    half = len(facts) // 2
    history.write(facts[:half], "user_edit")
    history.write(facts[half:])
    history.write([Operation(OpKind.ADD, Section.RECENT, text="Quarterly planning.")])
    return history


def _memory_records(histories: Sequence[_History]) -> list[dict[str, Any]]:
    """The user-memory root, each user's folder with its ACL, memory.md and versions, grouped
    by type in stream order."""
    return user_memory_records(COMPANY, [(h.user_id, h.versions) for h in histories])


# --- what is searched -----------------------------------------------------------------------------


def _leaves(value: object) -> list[str]:
    """The strings (and numbers) inside a JSON value, one per item."""
    if isinstance(value, dict):
        return [leaf for item in value.values() for leaf in _leaves(item)]
    if isinstance(value, list):
        return [leaf for item in value for leaf in _leaves(item)]
    return [] if value is None else [str(value)]


def _texts_of(versions: Sequence[dict[str, Any]]) -> list[StoredText]:
    """Each version's content and the texts of its operations, one line per item."""
    found = []
    for version in versions:
        user_id, number = str(version["user_id"]), int(version["version"])
        operations = version["operations"]
        if isinstance(operations, str):
            operations = json.loads(operations)
        found.append(StoredText(user_id, number, "content", str(version["content"])))
        found.append(StoredText(user_id, number, "operations", "\n".join(_leaves(operations))))
    return found


async def _stored_texts(app: FastAPI) -> tuple[list[StoredText], list[Any], list[Any]]:
    """Every stored version (content and operations) and policy record of the company; the
    version rows; the policy records."""
    versions = await rows(
        app,
        "SELECT user_id, version, reason, content, operations::text AS operations"
        " FROM memory_versions WHERE company_id = :c ORDER BY user_id, version",
        c=COMPANY,
    )
    records = await rows(
        app,
        "SELECT user_id, version, category, action, row_to_json(a)::text AS record"
        " FROM memory_policy_actions a WHERE company_id = :c",
        c=COMPANY,
    )
    stored = _texts_of([row._asdict() for row in versions])
    stored += [
        StoredText(
            str(row.user_id),
            row.version,
            "policy record",
            "\n".join(_leaves(json.loads(row.record))),
        )
        for row in records
    ]
    return stored, versions, records


async def _heads(app: FastAPI) -> dict[str, str]:
    found = await rows(
        app,
        "SELECT v.user_id, v.content FROM memory_versions v JOIN memory_files f"
        " ON f.company_id = v.company_id AND f.user_id = v.user_id"
        " AND f.head_version = v.version WHERE v.company_id = :c",
        c=COMPANY,
    )
    return {str(row.user_id): str(row.content) for row in found}


def _values() -> set[str]:
    return {value for turn in CORPUS.attack_turns for value in turn.values}


# --- the company import ---------------------------------------------------------------------------


async def test_no_attacker_value_of_the_corpus_survives_a_company_import(
    app: FastAPI, client: httpx.AsyncClient, auth: AuthFactory
) -> None:
    attackers = [_attacker_history(user) for user in CORPUS.attacker]
    benign = [_benign_history(user) for user in CORPUS.benign]
    histories = [*attackers, *benign]
    sent = [version for history in histories for version in history.versions]
    in_stream = {leak.value for leak in find_leaks(CORPUS.attack_turns, _texts_of(sent))}
    assert in_stream == _values()  # the stream carries every value, so the search can find it
    assert len(_values()) >= 90
    stream = stream_of(COMPANY, FLAG, MEMORY_POLICY, *_memory_records(histories))

    response = await import_into(client, auth, COMPANY, stream)

    assert response.status_code == 201, response.text
    assert response.json()["records"]["memory_version"] == len(sent)
    stored, versions, records = await _stored_texts(app)
    leaks = find_leaks(CORPUS.attack_turns, stored)
    assert sorted({(leak.value, leak.user_id, leak.version, leak.source) for leak in leaks}) == []
    # Every version changed something harmless, so every one was written, screened.
    assert len(versions) == len(sent)
    numbers = {(row.user_id, row.version): row.reason for row in versions}
    assert numbers == {(v["user_id"], v["version"]): v["reason"] for v in sent}
    drops = {row.category for row in records if row.action == Action.DROP}
    assert drops == {c.value for c, a in DEFAULT_ACTIONS.items() if a is Action.DROP}
    redacted = {row.category for row in records if row.action == Action.REDACT}
    assert redacted == {Category.EMAIL_ADDRESSES.value, Category.PHONE_NUMBERS.value}

    heads = await _heads(app)
    assert set(heads) == {history.user_id for history in histories}
    for history in attackers:  # what the turns added that is harmless stays
        assert INTRO in heads[history.user_id]
    facts = [(user.id, turn) for user in CORPUS.benign for turn in user.turns]
    lost = [(user_id, turn.keep) for user_id, turn in facts if not kept_in(turn, heads[user_id])]
    kept = len(facts) - len(lost)
    assert len(facts) >= 70
    assert kept / len(facts) >= TARGET_KEPT, lost
    memory = await client.get(ME, headers=auth(CORPUS.benign[0].id, COMPANY))
    assert memory.status_code == 200, memory.text
    assert memory.json()["content"] == heads[CORPUS.benign[0].id]


async def test_a_version_that_edited_a_value_away_does_not_keep_it_in_its_operations(
    app: FastAPI, client: httpx.AsyncClient, auth: AuthFactory
) -> None:
    """The source stored the values (a laxer policy, an older detector) and the user later
    edited each bullet into one without it: that version's content is clean, and its
    operations, which name the old bullet, must not carry the value into the target either."""
    histories = [_attacker_history(user, clean_up=True) for user in CORPUS.attacker]
    sent = [version for history in histories for version in history.versions]
    stream = stream_of(COMPANY, FLAG, MEMORY_POLICY, *_memory_records(histories))

    response = await import_into(client, auth, COMPANY, stream)

    assert response.status_code == 201, response.text
    stored, versions, _ = await _stored_texts(app)
    assert len(versions) == len(sent)
    leaks = find_leaks(CORPUS.attack_turns, stored)
    assert sorted({(leak.source, leak.user_id, leak.version, leak.value) for leak in leaks}) == []


# --- a user's own import --------------------------------------------------------------------------


def _dropped(turn: AttackTurn) -> bool:
    return all(DEFAULT_ACTIONS[category] is Action.DROP for category in turn.categories)


def _sample(count: int) -> list[tuple[AttackTurn, str, str]]:
    """`count` attacker values spread over the corpus, of categories the policy drops, each with
    the sentence (as the obedient model would store it) that carries it."""
    turns = [turn for turn in CORPUS.attack_turns if _dropped(turn)]
    chosen = turns[:: max(1, len(turns) // count)][:count]
    sample = []
    for turn in chosen:
        value = turn.values[0]
        carrying = [s for s in sentences(turn.user) if fold(value) in fold(s)]
        sample.append((turn, value, carrying[0] if carrying else " ".join(turn.user.split())))
    return sample


def _with_bullet(content: str, section: Section, bullet: str) -> str:
    profile = parse(content)
    bullets = {s: [*profile.bullets(s), *([bullet] if s is section else [])] for s in SECTIONS}
    return render(Profile.from_sections(profile.frontmatter, bullets))


async def test_a_users_own_import_carrying_an_attacker_value_is_refused_naming_it(
    app: FastAPI, client: httpx.AsyncClient, auth: AuthFactory
) -> None:
    """Mia's export, with one sentence of an attacker turn added as a bullet where the obedient
    model would put it: 422 naming the turn's category, without the value, nothing stored; with
    a benign fact added instead, the import is her next version."""
    await set_flag(client, auth, FLAG_CONTEXT_MEMORY, True, COMPANY)
    headers = auth("mia", COMPANY)
    start = memory_md({Section.IDENTITY: ["Works in the Basel office."]}, user_id="mia")
    created = await client.put(
        ME, json={"content": start}, headers={**headers, "If-None-Match": "*"}
    )
    assert created.status_code == 201, created.text
    exported = await client.get(f"{ME}/export", headers=headers)
    assert exported.status_code == 200, exported.text
    document: dict[str, Any] = exported.json()
    content = str(document["profile"]["content"])
    sample = _sample(10)
    assert len({value for _, value, _ in sample}) == 10
    assert {c for turn, _, _ in sample for c in turn.categories} == {
        c for c, a in DEFAULT_ACTIONS.items() if a is Action.DROP
    }
    before = await database_digest(app)

    for turn, value, sentence in sample:
        added = _with_bullet(content, section_for(sentence), sentence)
        body = {**document, "profile": {**document["profile"], "content": added}}
        response = await client.post(IMPORT_OWN, json=body, headers=headers)

        assert response.status_code == 422, (value, response.text)
        errors = response.json()["errors"]
        named = {f"memory_policy.{category.value}" for category in turn.categories}
        assert errors, value
        assert all(error["type"] in named for error in errors), (value, errors)
        assert all(error["field"] == "body.profile.content" for error in errors), errors
        assert not holds(value, response.text.casefold(), response.text.splitlines()), value
    assert changed_tables(before, await database_digest(app)) == []

    fact = CORPUS.benign_turns[0]
    added = _with_bullet(content, fact.section, fact.bullet)
    body = {**document, "profile": {**document["profile"], "content": added}}
    response = await client.post(IMPORT_OWN, json=body, headers=headers)
    assert response.status_code == 200, response.text
    assert response.json()["version"] == 2
    assert kept_in(fact, response.json()["content"])
