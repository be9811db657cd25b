"""The proof over the whole schema: after an opt-out and after an erasure (alone, or racing the
user's turn-saves), no row of the user is left beyond what the operation promises, the user's
canary (seeded into every text the user can write) is in no column it should not be, and a
second user's data is untouched.

The tables are discovered from `information_schema`, so a table added later is covered without a
line here: a row of the user in it after an erasure fails the test until the erasure handles it
(or the row is allowed below, on purpose).
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass
from typing import Any, Final

import httpx
import pytest
from fastapi import FastAPI

from app.enablement.decision import FLAG_CONTEXT_MEMORY
from app.quotas.maintenance import quota_check_step
from tests.helpers.apps import OPERATOR, SPACE_ADMIN, AuthFactory
from tests.helpers.db import database_of, rows, scalar
from tests.helpers.settings import memory_policy_body, patch_user_settings
from tests.helpers.sweep import every_count, schema_columns
from tests.helpers.worker import make_handler, make_worker

COMPANY: Final = "acme"

# Columns that hold a user id, by name: the owner, an actor, an audit target, an ACL principal,
# and whoever last changed a row (`*_by`). Any other column naming the user is caught by the
# row-text search below.
USER_COLUMN_NAMES: Final = frozenset({"user_id", "actor_id", "target_id", "principal_id"})

# What each operation leaves of the user, per table, as a predicate on the user's rows; a table
# not named keeps none. The opt-out (SPEC 6, `app/profiles/switch.py`) deletes the memory, its
# folder and the pending jobs; history, finished jobs, idempotency records, the setting (now
# off), the audit trail and the company settings the user last changed stay.
KEPT_BY_OPT_OUT: Final = {
    "turns": "true",
    "chat_messages": "true",
    "idempotency_keys": "true",
    "jobs": "status IN ('succeeded', 'dead')",
    "user_settings": "context_memory = false",
    "audit_events": "true",
    "company_feature_flags": "true",
    "space_settings": "true",
    "company_memory_policies": "true",
    "company_rate_limits": "true",
    "user_quota_marks": "true",  # counted from the history, which stays
    "platform_events": "true",  # the company registered on its operator's first use, as audited
}
# The erasure (`app/erasure/service.py`) keeps one audit event: who was erased, with counts.
KEPT_BY_ERASURE: Final = {
    "audit_events": "action = 'user.erased' AND coalesce(old, 'null') = 'null'"  # JSON or SQL null
}

# After an erasure racing turn-saves, the rows of the turns written after it: the turn, its
# messages, its job and idempotency record, the memory folder the first of them made again (its
# ACL, its memory.md) and the versions consolidating them. `{kept}`: the ids of those turns,
# `{keys}`: their Idempotency-Keys, `{folder}`: the user's folder path.
KEPT_AFTER_RACING_ERASURE: Final = KEPT_BY_ERASURE | {
    "turns": "id::text IN ({kept})",
    "chat_messages": "turn_id::text IN ({kept})",
    "jobs": "payload->>'turn_id' IN ({kept})",
    "idempotency_keys": "key IN ({keys})",
    "folders": "path = {folder}",
    "folder_acl": "folder_id IN (SELECT id FROM folders WHERE path = {folder})",
    "memory_files": "folder_id IN (SELECT id FROM folders WHERE path = {folder})",
    "memory_versions": "reason = 'consolidation'"
    " AND source_turn_ids <@ (SELECT jsonb_agg(t) FROM unnest(ARRAY[{kept}]) t)",
}

# Every table the seed below writes a row of the user into (the proof is not vacuous for them).
SEEDED_TABLES: Final = frozenset(
    {
        "turns",
        "chat_messages",
        "idempotency_keys",
        "jobs",
        "memory_files",
        "memory_versions",
        "folders",
        "folder_acl",
        "user_settings",
        "audit_events",
        "company_feature_flags",
        "space_settings",
        "company_memory_policies",
        "company_rate_limits",
        "memory_policy_actions",
        "user_quota_marks",
        "platform_events",
    }
)
# Where text the user writes lands (memory, messages, chat and space ids, keys, job payloads).
CANARY_TABLES: Final = frozenset(
    {"turns", "chat_messages", "idempotency_keys", "jobs", "memory_versions"}
)


@dataclass(frozen=True)
class Table:
    name: str
    columns: tuple[tuple[str, str], ...]  # (name, data type)

    @property
    def user_columns(self) -> tuple[str, ...]:
        return tuple(
            name for name, _ in self.columns if name in USER_COLUMN_NAMES or name.endswith("_by")
        )

    @property
    def as_text(self) -> str:
        """The whole row as text: every column, bytea decoded, so a needle is found anywhere."""
        parts = [
            f"encode(\"{name}\", 'escape')" if kind == "bytea" else f'"{name}"::text'
            for name, kind in self.columns
        ]
        return f"concat_ws(chr(31), {', '.join(parts)})"

    def naming(self, needle: str) -> str:
        return f"position('{needle}' IN {self.as_text}) > 0"

    def owned_by(self, user_id: str) -> str:
        """The user's rows by their user columns (in the company, where rows have one)."""
        named = " OR ".join(f"\"{column}\" = '{user_id}'" for column in self.user_columns)
        company = any(name == "company_id" for name, _ in self.columns)
        return f"({named})" + (f" AND company_id = '{COMPANY}'" if company else "")


async def discover(app: FastAPI) -> list[Table]:
    return [Table(name, columns) for name, columns in (await schema_columns(app)).items()]


async def count(app: FastAPI, table: Table, where: str) -> int:
    # a sweep of the whole table: every shard on a Citus cluster
    value: int = await every_count(app, f'SELECT count(*) FROM "{table.name}" WHERE {where}')  # noqa: S608
    return value


@dataclass(frozen=True)
class Person:
    user_id: str
    canary: str  # in every text the user writes
    memory_canary: str  # only in the memory profile the user writes


def person(name: str) -> Person:
    tag = uuid.uuid4().hex[:10]
    return Person(f"{name}-{tag}", f"cnry{tag}x", f"mcnry{tag}x")


def profile_of(who: Person) -> str:
    return f"""# User Memory

## Identity
- Goes by {who.canary}.
- Reach me at someone@example.com.

## Communication Preferences
- Likes {who.memory_canary}.

## Work Context

## Skills & Expertise

## Recent Topics

## Open Questions / Follow-ups
"""


async def seed(
    app: FastAPI, client: httpx.AsyncClient, auth: AuthFactory, who: Person, *, admin: bool
) -> None:
    """Everything the user can leave: a company flag, the memory policy, the rate limits and a
    space changed (as operator and space admin, with `admin`), the stored setting, a profile
    (with a value the memory policy redacts), two keyed turns with the canary in the chat id,
    space id, model name, key and messages, an explicit consolidation, and a job that the
    worker ran (the others stay queued)."""
    me = auth(who.user_id, COMPANY)
    if admin:
        operator = auth(who.user_id, COMPANY, OPERATOR)
        flag = f"/v1/companies/{COMPANY}/feature-flags/{FLAG_CONTEXT_MEMORY}"
        response = await client.put(flag, json={"enabled": True}, headers=operator)
        assert response.status_code == 200, response.text
        policy = memory_policy_body(phone_numbers="allow")
        response = await client.put(
            f"/v1/companies/{COMPANY}/memory-policy", json=policy, headers=operator
        )
        assert response.status_code == 200, response.text
        limits = {"turns": {"user": {"quota": 500, "window_seconds": 60}}}
        response = await client.put(
            f"/v1/companies/{COMPANY}/rate-limits", json=limits, headers=operator
        )
        assert response.status_code == 200, response.text
        space_admin = auth(who.user_id, COMPANY, SPACE_ADMIN)
        response = await client.patch(
            "/v1/spaces/space-admin", json={"context_memory": True}, headers=space_admin
        )
        assert response.status_code == 200, response.text
    await patch_user_settings(client, auth, {"context_memory": False}, who.user_id, expect=200)
    await patch_user_settings(client, auth, {"context_memory": True}, who.user_id, expect=200)
    response = await client.put(
        "/v1/me/memory", json={"content": profile_of(who)}, headers=me | {"If-None-Match": "*"}
    )
    assert response.status_code == 201, response.text
    for n in (1, 2):
        body = {
            "space_id": f"space-{who.canary}",
            "messages": [{"role": "user", "content": f"I work at {who.canary} Labs ({n})."}],
            "response": {"role": "assistant", "content": f"Noted, {who.canary}."},
            "language_model": f"model-{who.canary}",
        }
        response = await client.post(
            f"/v1/chats/chat-{who.canary}/turns",
            json=body,
            headers=me | {"Idempotency-Key": f"key-{who.canary}-{n}"},
        )
        assert response.status_code == 202, response.text
    response = await client.post(
        "/v1/me/memory/consolidations",
        json={
            "space_id": f"space-{who.canary}",
            "user": f"Remind me about {who.canary}.",
            "assistant": "Will do.",
        },
        headers=me,
    )
    assert response.status_code == 202, response.text
    handler, metrics, _ = make_handler(app)
    assert await make_worker(app, handler, metrics).run_once() is not None
    # the quota check, at a limit this user's history is over: a mark naming the user
    check = quota_check_step(user_history_messages=1, company_storage_bytes=0, interval_seconds=300)
    assert await check(database_of(app).engine) > 0


async def drain(app: FastAPI) -> None:
    """Run the worker until no job is left to claim."""
    handler, metrics, _ = make_handler(app)
    worker = make_worker(app, handler, metrics)
    while await worker.run_once() is not None:
        pass


async def footprint(app: FastAPI, tables: list[Table], who: Person) -> dict[str, tuple[int, int]]:
    """Per table: rows naming the user anywhere, rows holding the user's canary."""
    return {
        table.name: (
            await count(app, table, table.naming(who.user_id)),
            await count(app, table, table.naming(who.canary)),
        )
        for table in tables
    }


async def left_over(
    app: FastAPI, tables: list[Table], who: Person, kept: dict[str, str]
) -> dict[str, dict[str, int]]:
    """Per table, the rows of the user the operation does not promise to keep: by user column,
    by the user's id anywhere in the row, by canary; and rows holding the memory-only canary."""
    found: dict[str, dict[str, int]] = {}
    for table in tables:
        allowed = kept.get(table.name, "false")
        checks = {
            "by user column": (
                await count(app, table, f"({table.owned_by(who.user_id)}) AND NOT ({allowed})")
                if table.user_columns
                else 0
            ),
            "naming the user": await count(
                app, table, f"{table.naming(who.user_id)} AND NOT ({allowed})"
            ),
            "holding the canary": await count(
                app, table, f"{table.naming(who.canary)} AND NOT ({allowed})"
            ),
            "holding the memory canary": await count(app, table, table.naming(who.memory_canary)),
        }
        if any(checks.values()):
            found[table.name] = {check: n for check, n in checks.items() if n}
    return found


@pytest.fixture
async def schema(app: FastAPI) -> list[Table]:
    tables = await discover(app)
    with_user_columns = {table.name for table in tables if table.user_columns}
    # the discovery sees what the schema has today (and more, later)
    assert {table.name for table in tables} >= SEEDED_TABLES
    assert with_user_columns >= {"turns", "jobs", "memory_versions", "audit_events", "folder_acl"}
    return tables


async def seeded_pair(
    app: FastAPI, client: httpx.AsyncClient, auth: AuthFactory, tables: list[Table]
) -> tuple[Person, Person, dict[str, tuple[int, int]]]:
    """The subject (with admin actions) and a bystander in the same company, both seeded; the
    bystander's footprint before anything happens."""
    subject, bystander = person("subject"), person("bystander")
    await seed(app, client, auth, subject, admin=True)
    await seed(app, client, auth, bystander, admin=False)
    before = await footprint(app, tables, subject)
    assert {name for name, (named, _) in before.items() if named} >= SEEDED_TABLES
    assert {name for name, (_, canaries) in before.items() if canaries} >= CANARY_TABLES
    assert await left_over(app, tables, subject, {}) != {}  # the seed is visible to the proof
    return subject, bystander, await footprint(app, tables, bystander)


async def test_after_an_erasure_only_the_erasure_record_names_the_user(
    app: FastAPI, client: httpx.AsyncClient, auth: AuthFactory, schema: list[Table]
) -> None:
    subject, bystander, bystander_before = await seeded_pair(app, client, auth, schema)

    response = await client.delete("/v1/me", headers=auth(subject.user_id, COMPANY))
    assert response.status_code == 200, response.text

    assert await left_over(app, schema, subject, KEPT_BY_ERASURE) == {}
    (record,) = await rows(
        app,
        "SELECT actor_id, target_kind, target_id, old, new FROM audit_events"
        " WHERE position(:u IN actor_id || target_id) > 0",
        u=subject.user_id,
    )
    assert (record.actor_id, record.target_kind, record.target_id) == (
        subject.user_id,
        "user",
        subject.user_id,
    )
    assert record.new == response.json()
    assert set(record.new) == {"deleted", "anonymised"}
    assert all(isinstance(value, int) for part in record.new.values() for value in part.values())
    assert await footprint(app, schema, bystander) == bystander_before
    assert all(bystander_before[name][1] > 0 for name in CANARY_TABLES)


async def test_after_an_opt_out_only_history_settings_and_audit_name_the_user(
    app: FastAPI, client: httpx.AsyncClient, auth: AuthFactory, schema: list[Table]
) -> None:
    subject, bystander, bystander_before = await seeded_pair(app, client, auth, schema)

    await patch_user_settings(client, auth, {"context_memory": False}, subject.user_id, expect=200)

    assert await left_over(app, schema, subject, KEPT_BY_OPT_OUT) == {}
    kept: dict[str, Any] = await footprint(app, schema, subject)
    assert kept["chat_messages"][1] > 0  # the history stays, as the opt-out promises
    assert await footprint(app, schema, bystander) == bystander_before


RACES: Final = 5


@dataclass(frozen=True)
class RacedTurn:
    turn_id: str
    key: str | None


async def race_turn_saves_with_an_erasure(
    client: httpx.AsyncClient, auth: AuthFactory, who: Person, *, lanes: int, race: int
) -> tuple[list[RacedTurn], httpx.Response]:
    """The user's erasure, with `lanes` clients saving the user's turns one after another (every
    other one keyed) from before it is sent (one turn is saved first) until it has answered, and
    once more after."""
    me = auth(who.user_id, COMPANY)
    begun, erased = asyncio.Event(), asyncio.Event()

    async def save(lane: int, n: int, *, keyed: bool) -> RacedTurn:
        tag = f"{race}x{lane}x{n}"  # unique over the races: a key is never replayed
        key = f"key-{who.canary}-{tag}" if keyed else None
        body = {
            "space_id": f"space-{who.canary}",
            "messages": [{"role": "user", "content": f"I know Zig{tag} at {who.canary}."}],
            "response": {"role": "assistant", "content": f"Noted, {who.canary}."},
            "language_model": f"model-{who.canary}",
        }
        response = await client.post(
            f"/v1/chats/chat-{who.canary}-{lane}/turns",
            json=body,
            headers=me | ({"Idempotency-Key": key} if key else {}),
        )
        assert response.status_code == 202, response.text
        return RacedTurn(response.json()["turn_id"], key)

    async def one_lane(lane: int) -> list[RacedTurn]:
        saved: list[RacedTurn] = []
        while not erased.is_set():
            saved.append(await save(lane, len(saved), keyed=len(saved) % 2 == 1))
            begun.set()
        return [*saved, await save(lane, len(saved), keyed=False)]

    async def erase() -> httpx.Response:
        await begun.wait()
        response = await client.delete("/v1/me", headers=me)
        erased.set()
        return response

    erasing = asyncio.create_task(erase())
    saved = await asyncio.gather(*(one_lane(n) for n in range(lanes)))
    erasure = await erasing
    assert erasure.status_code == 200, erasure.text
    return [turn for turns in saved for turn in turns], erasure


async def count_turns(app: FastAPI, who: Person) -> int:
    found: int = await scalar(app, "SELECT count(*) FROM turns WHERE user_id = :u", u=who.user_id)
    return found


def quoted(values: list[str]) -> str:
    """SQL string literals (of ids and keys this test made), or NULL for none."""
    return ", ".join(f"'{value}'" for value in values) or "NULL"


async def test_after_an_erasure_racing_turn_saves_only_later_turns_and_the_record_name_the_user(
    app: FastAPI, client: httpx.AsyncClient, auth: AuthFactory, schema: list[Table]
) -> None:
    """Turn-saves racing the erasure, `RACES` times in a row: each turn is deleted with
    everything of the user, or written after the erasure committed, as a fresh start whose
    rows, once the worker consolidated it, are all that names the user besides the erasure
    record (and the next race erases them in turn)."""
    subject, bystander, _ = await seeded_pair(app, client, auth, schema)
    await drain(app)  # the bystander's jobs too, so the worker below runs the subject's only
    bystander_before = await footprint(app, schema, bystander)

    for race in range(RACES):
        before = await count_turns(app, subject)
        raced, erasure = await race_turn_saves_with_an_erasure(
            client, auth, subject, lanes=4, race=race
        )
        await drain(app)

        left = {
            str(r.id)
            for r in await rows(app, "SELECT id FROM turns WHERE user_id = :u", u=subject.user_id)
        }
        kept = [turn for turn in raced if turn.turn_id in left]
        assert 0 < len(kept) < len(raced)  # the first turn is gone, those after the answer kept
        assert left == {turn.turn_id for turn in kept}
        assert erasure.json()["deleted"]["turns"] == before + len(raced) - len(kept)
        allowed = {
            table: predicate.format(
                kept=quoted([turn.turn_id for turn in kept]),
                keys=quoted([turn.key for turn in kept if turn.key]),
                folder=f"'user-memory/{subject.user_id}'",
            )
            for table, predicate in KEPT_AFTER_RACING_ERASURE.items()
        }
        assert await left_over(app, schema, subject, allowed) == {}
        consolidated = await rows(
            app,
            "SELECT DISTINCT jsonb_array_elements_text(source_turn_ids) AS turn_id"
            " FROM memory_versions WHERE user_id = :u",
            u=subject.user_id,
        )
        assert {r.turn_id for r in consolidated} == left
        records = await rows(
            app,
            "SELECT action, new FROM audit_events WHERE position(:u IN actor_id || target_id) > 0"
            " ORDER BY id",
            u=subject.user_id,
        )
        assert [r.action for r in records] == ["user.erased"] * (race + 1)  # one per erasure
        assert records[-1].new == erasure.json()
    assert await footprint(app, schema, bystander) == bystander_before
