"""`POST /v1/companies/{id}/import`: all of a stream or none of it, into an empty company only.

A line that cannot be loaded is a 422 naming it (and its field), with nothing written, however
far the import had got; a company that holds data is a 409, except for the very stream imported
into it before, which answers that import's outcome again; the body has a limit of its own; and
every profile version passes the company's memory policy on its way in.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import orjson
import pytest
from fastapi import FastAPI

from app.enablement.decision import FLAG_CONTEXT_MEMORY
from app.portability.format import MEDIA_TYPE
from app.profiles.document import Section
from tests.helpers.apps import AuthFactory, client_with
from tests.helpers.db import rows, scalar
from tests.helpers.memory import ME
from tests.helpers.portability import (
    import_into,
    memory_records,
    operator,
    stream_of,
)
from tests.helpers.profiles import memory_md
from tests.helpers.settings import set_flag
from tests.helpers.snapshots import changed_tables, database_digest

INITECH = "initech"
FLAG = {
    "type": "feature_flag",
    "flag": FLAG_CONTEXT_MEMORY,
    "enabled": True,
    "updated_at": "2026-11-30T08:00:00+00:00",
    "updated_by_company_id": "platform",
    "updated_by": "olga",
}
CARD = "4111 1111 1111 1111"


def _turn(turn_id: str, user_id: str = "dan") -> dict[str, Any]:
    return {
        "type": "turn",
        "id": turn_id,
        "user_id": user_id,
        "chat_id": "chat-1",
        "space_id": "space-1",
        "history_mode": "auto",
        "language_model": None,
        "created_at": "2026-11-30T09:00:00+00:00",
    }


def _problem_line(response: httpx.Response) -> str:
    assert response.status_code == 422, response.text
    assert response.headers["content-type"] == "application/problem+json"
    errors = response.json()["errors"]
    assert len(errors) == 1
    field: str = errors[0]["field"]
    return field


async def test_an_import_loads_the_stream_and_says_what_it_loaded(
    app: FastAPI, client: httpx.AsyncClient, auth: AuthFactory
) -> None:
    user_memory = memory_records(
        INITECH, "dan", [memory_md({Section.WORK: ["Initech"]}, user_id="dan")]
    )
    stream = stream_of(INITECH, FLAG, *user_memory, _turn(str(uuid.uuid4())))

    response = await import_into(client, auth, INITECH, stream)

    assert response.status_code == 201, response.text
    body = response.json()
    assert body["records"]["memory_version"] == 1
    assert body["records"]["turn"] == 1
    assert body["replayed"] is False
    memory = await client.get(ME, headers=auth("dan", INITECH))
    assert memory.status_code == 200, memory.text
    assert "- Initech" in memory.json()["content"]
    flags = await client.get(f"/v1/companies/{INITECH}/feature-flags", headers=operator(auth))
    assert any(flag["enabled"] for flag in flags.json()["flags"])


async def test_a_company_that_holds_data_is_refused_and_nothing_changes(
    app: FastAPI, client: httpx.AsyncClient, auth: AuthFactory
) -> None:
    await set_flag(client, auth, FLAG_CONTEXT_MEMORY, True, INITECH)
    before = await database_digest(app)

    response = await import_into(client, auth, INITECH, stream_of(INITECH, FLAG))

    assert response.status_code == 409, response.text
    assert changed_tables(before, await database_digest(app)) == []


async def test_the_same_stream_again_answers_the_first_import_and_writes_nothing(
    app: FastAPI, client: httpx.AsyncClient, auth: AuthFactory
) -> None:
    stream = stream_of(INITECH, FLAG, _turn(str(uuid.uuid4())))
    first = await import_into(client, auth, INITECH, stream)
    assert first.status_code == 201, first.text
    before = await database_digest(app)

    again = await import_into(client, auth, INITECH, stream)
    other = await import_into(client, auth, INITECH, stream_of(INITECH, FLAG))

    assert again.status_code == 200, again.text
    assert again.headers["idempotent-replayed"] == "true"
    assert again.json() == {**first.json(), "replayed": True}
    assert other.status_code == 409, other.text
    assert changed_tables(before, await database_digest(app)) == []


def _broken(records: list[dict[str, Any]], at: int, line: bytes) -> bytes:
    """The stream of `records` with line number `at` replaced by `line`."""
    lines = stream_of(INITECH, *records).splitlines()
    lines[at - 1] = line
    return b"\n".join(lines) + b"\n"


async def test_a_malformed_line_is_a_422_naming_it_and_nothing_is_written(
    app: FastAPI, client: httpx.AsyncClient, auth: AuthFactory
) -> None:
    """Everything before the line was loaded already (the folders, the flag): it all goes."""
    user_memory = memory_records(INITECH, "dan", [memory_md(user_id="dan")])
    turns = [_turn(str(uuid.uuid4())) for _ in range(3)]
    bad = 2 + len(user_memory) + 2  # the header, the flag, the memory, then the second turn
    stream = _broken([FLAG, *user_memory, *turns], bad, b'{"type": "turn", "id": ')
    before = await database_digest(app)

    response = await import_into(client, auth, INITECH, stream)

    assert _problem_line(response) == f"body.lines.{bad}"
    assert f"Line {bad}" in response.json()["detail"]
    assert changed_tables(before, await database_digest(app)) == []


def _cases() -> list[tuple[str, bytes, str]]:
    """(what is wrong, the stream, the field the 422 names)."""
    folder_records = memory_records(INITECH, "dan", [memory_md(user_id="dan")])
    turn_id = str(uuid.uuid4())
    skipping = memory_records(INITECH, "dan", [memory_md(user_id="dan")] * 2)
    skipping[-1] = {**skipping[-1], "version": 3}
    skipping[-3] = {**skipping[-3], "head_version": 3}
    tampered = memory_records(INITECH, "dan", [memory_md(user_id="dan")])
    tampered[-1] = {**tampered[-1], "sha256": "0" * 64}
    foreign = memory_records(INITECH, "dan", [memory_md(user_id="eve")])
    orphan_acl = {
        "type": "folder_acl",
        "folder_id": str(uuid.uuid4()),
        "principal_kind": "user",
        "principal_id": "dan",
        "permission": "READ",
    }
    return [
        ("the stream names another company", stream_of("globex", FLAG), "body.lines.1.company_id"),
        ("a turn id twice", stream_of(INITECH, _turn(turn_id), _turn(turn_id)), "body.lines.3"),
        (
            "an ACL entry of a folder the stream does not hold",
            stream_of(INITECH, *folder_records[:2], orphan_acl),
            "body.lines.4",
        ),
        (
            "a version skipped",
            stream_of(INITECH, *skipping),
            f"body.lines.{len(skipping) + 1}.version",
        ),
        (
            "a sha256 not of its content",
            stream_of(INITECH, *tampered),
            f"body.lines.{len(tampered) + 1}.sha256",
        ),
        (
            "a profile of another user",
            stream_of(INITECH, *foreign),
            f"body.lines.{len(foreign) + 1}.content",
        ),
        ("cut short", stream_of(INITECH, FLAG, trailer=False), "body.lines.3"),
        (
            "an id the target assigns",
            stream_of(INITECH, {**_turn(turn_id), "type": "message", "id": 7}),
            "body.lines.2.id",
        ),
    ]


@pytest.mark.parametrize(
    ("stream", "field"), [c[1:] for c in _cases()], ids=[c[0] for c in _cases()]
)
async def test_a_stream_that_cannot_be_loaded_is_refused_at_its_line(
    app: FastAPI, client: httpx.AsyncClient, auth: AuthFactory, stream: bytes, field: str
) -> None:
    before = await database_digest(app)

    response = await import_into(client, auth, INITECH, stream)

    assert _problem_line(response) == field
    assert changed_tables(before, await database_digest(app)) == []


async def test_a_profile_carrying_a_card_number_is_screened_by_the_memory_policy(
    app: FastAPI, client: httpx.AsyncClient, auth: AuthFactory
) -> None:
    """The default policy drops card numbers: in no stored version (content or operations),
    each drop recorded; a version whose only change was a card is not written, and the head
    is the last version kept."""
    work = {Section.WORK: ["Works at Initech"]}
    card = {Section.IDENTITY: [f"Card {CARD}"]}
    history = memory_records(
        INITECH,
        "dan",
        [
            memory_md({**work, **card}, user_id="dan"),
            memory_md({**work, **card, Section.SKILLS: ["Python"]}, user_id="dan"),
            memory_md(
                {**work, Section.IDENTITY: [f"Card {CARD} (debit)"], Section.SKILLS: ["Python"]},
                user_id="dan",
            ),
        ],
    )
    history[-1] = {
        **history[-1],
        "operations": [
            {
                "op": "UPDATE",
                "section": "Identity",
                "old": f"Card {CARD}",
                "new": f"Card {CARD} (debit)",
            }
        ],
    }

    response = await import_into(client, auth, INITECH, stream_of(INITECH, *history))

    assert response.status_code == 201, response.text
    stored = await rows(
        app,
        "SELECT version, content, operations::text AS operations FROM memory_versions"
        " WHERE company_id = :c ORDER BY version",
        c=INITECH,
    )
    assert [row.version for row in stored] == [1, 2]
    assert all(CARD not in row.content + row.operations for row in stored)
    assert "- Python" in stored[-1].content
    actions = await rows(
        app,
        "SELECT version, category, action FROM memory_policy_actions WHERE company_id = :c"
        " ORDER BY id",
        c=INITECH,
    )
    assert [(a.version, a.category, a.action) for a in actions] == [
        (1, "payment_cards", "drop"),
        (2, "payment_cards", "drop"),
        (None, "payment_cards", "drop"),
    ]
    memory = await client.get(ME, headers=auth("dan", INITECH))
    assert memory.json()["version"] == 2
    assert memory.json()["content"] == stored[-1].content


# --- the body's limit ----------------------------------------------------------------------------


@pytest.fixture
async def small_limits(database_url: str) -> AsyncIterator[httpx.AsyncClient]:
    async with client_with(database_url, max_body_bytes=2048, import_max_bytes=8192) as http:
        yield http


def _sized(size: int) -> bytes:
    """A valid stream of about `size` bytes (turns)."""
    turns: list[dict[str, Any]] = []
    while len(stream_of(INITECH, *turns)) < size:
        turns.append(_turn(str(uuid.uuid4())))
    return stream_of(INITECH, *turns[:-1])


async def test_an_import_has_a_body_limit_of_its_own(
    app: FastAPI, small_limits: httpx.AsyncClient, auth: AuthFactory
) -> None:
    """Larger than MAX_BODY_BYTES is fine for an import (and only there), up to
    IMPORT_MAX_BYTES."""
    stream = _sized(6000)
    assert 2048 < len(stream) <= 8192

    imported = await import_into(small_limits, auth, INITECH, stream)
    other_route = await small_limits.put(
        ME, json={"content": "x" * 3000}, headers={**auth("dan"), "If-None-Match": "*"}
    )

    assert imported.status_code == 201, imported.text
    assert other_route.status_code == 413


async def _flood(lines: int) -> AsyncIterator[bytes]:
    yield stream_of(INITECH, trailer=False)
    for _ in range(lines):
        yield orjson.dumps(_turn(str(uuid.uuid4()))) + b"\n"


async def test_a_stream_over_the_limit_is_a_413_and_nothing_is_written(
    app: FastAPI, small_limits: httpx.AsyncClient, auth: AuthFactory
) -> None:
    before = await database_digest(app)
    headers = {**operator(auth), "Content-Type": MEDIA_TYPE}
    url = f"/v1/companies/{INITECH}/import"

    declared = await small_limits.post(url, content=_sized(20_000), headers=headers)
    flooded = await small_limits.post(url, content=_flood(10_000), headers=headers)

    for response in (declared, flooded):
        assert response.status_code == 413, response.text
        assert response.headers["content-type"] == "application/problem+json"
    assert await scalar(app, "SELECT count(*) FROM turns") == 0
    assert changed_tables(before, await database_digest(app)) == []


async def test_a_slow_sender_holds_no_connection_until_its_stream_has_arrived(
    app: FastAPI, client: httpx.AsyncClient, auth: AuthFactory
) -> None:
    """The body is received whole before the import's transaction opens: while the rest of the
    stream has not arrived, no session of the service is busy or inside a transaction on the
    database (a company's slow uploads cannot take the pool that serves every company); then
    the stream loads as usual."""
    user_memory = memory_records(
        INITECH, "dan", [memory_md({Section.WORK: ["Initech"]}, user_id="dan")]
    )
    stream = stream_of(INITECH, FLAG, *user_memory)
    asked_for_more, go_on = asyncio.Event(), asyncio.Event()

    async def slowly() -> AsyncIterator[bytes]:
        yield stream[:100]
        asked_for_more.set()  # the route has the first piece and waits for the next
        await go_on.wait()
        yield stream[100:]

    headers = {**operator(auth), "Content-Type": MEDIA_TYPE}
    sending = asyncio.create_task(
        client.post(f"/v1/companies/{INITECH}/import", content=slowly(), headers=headers)
    )
    await asyncio.wait_for(asked_for_more.wait(), timeout=10)
    held = [
        await scalar(
            app,
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            " AND pid <> pg_backend_pid() AND application_name = 'context-memory'"
            " AND state <> 'idle'",
        )
        for _ in range(5)
    ]
    go_on.set()
    response = await sending

    assert held == [0] * 5
    assert response.status_code == 201, response.text
    assert response.json()["records"]["memory_version"] == 1
