"""Idempotency-Key on turn-save (Stripe semantics), over HTTP: replay, mismatch, in flight,
concurrent duplicates, per-user scope, expiry and pruning."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from sqlalchemy import text

from app.turns.idempotency import REPLAYED_HEADER
from app.turns.repository import idempotency_lock_key, prune_idempotency_keys
from tests.helpers.apps import COMPANY, AuthFactory
from tests.helpers.db import execute, rows
from tests.helpers.settings import enable_company
from tests.helpers.turns import context, new_chat, save_turn, stored, turn_body, user

BODY = turn_body([user("Please remember I use Vim.")], "Noted.")


async def post(
    client: httpx.AsyncClient,
    auth: AuthFactory,
    chat: str,
    key: str,
    *,
    body: dict[str, Any] = BODY,
    sub: str = "alice",
) -> httpx.Response:
    return await client.post(
        f"/v1/chats/{chat}/turns", json=body, headers=auth(sub) | {"Idempotency-Key": key}
    )


async def count(app: FastAPI, table: str) -> int:
    [(n,)] = await rows(app, f"SELECT count(*) FROM {table}")  # noqa: S608 - test constants
    return int(n)


async def test_same_key_and_body_replays_the_stored_response(
    app: FastAPI, client: httpx.AsyncClient, auth: AuthFactory
) -> None:
    await enable_company(client, auth)
    chat, key = new_chat(), str(uuid.uuid4())

    first = await post(client, auth, chat, key)
    again = await post(client, auth, chat, key)

    assert first.status_code == again.status_code == 202
    assert again.content == first.content
    assert REPLAYED_HEADER.lower() not in first.headers
    assert again.headers[REPLAYED_HEADER] == "true"
    assert len(await stored(client, auth, chat)) == 2
    assert await count(app, "jobs") == 1
    assert await count(app, "turns") == 1


async def test_replay_keeps_a_201(client: httpx.AsyncClient, auth: AuthFactory) -> None:
    chat, key = new_chat(), "key-201"
    first = await post(client, auth, chat, key)
    again = await post(client, auth, chat, key)
    assert first.status_code == again.status_code == 201
    assert again.json() == first.json()


@pytest.mark.parametrize("change", ["body", "chat"])
async def test_same_key_with_a_different_request_is_422(
    client: httpx.AsyncClient, auth: AuthFactory, change: str
) -> None:
    chat, key = new_chat(), str(uuid.uuid4())
    await post(client, auth, chat, key)

    other_body = turn_body([user("Something else")], "Sure.") if change == "body" else BODY
    other_chat = new_chat() if change == "chat" else chat
    response = await post(client, auth, other_chat, key, body=other_body)

    assert response.status_code == 422
    assert response.json()["errors"][0]["field"] == "header.Idempotency-Key"
    assert len(await stored(client, auth, chat)) == 2


async def test_same_key_while_the_first_is_in_flight_is_409(
    app: FastAPI, client: httpx.AsyncClient, auth: AuthFactory
) -> None:
    chat, key = new_chat(), "in-flight-key"
    lock = text("SELECT pg_advisory_xact_lock(hashtextextended(:k, 0))")
    async with app.state.database.engine.connect() as conn, conn.begin():
        # another request holding the key: its transaction has not committed yet
        await conn.execute(lock, {"k": idempotency_lock_key(COMPANY, "alice", key)})
        blocked = await post(client, auth, chat, key)
        other_user = await post(client, auth, chat, key, sub="bob")

    assert blocked.status_code == 409
    assert blocked.headers["retry-after"] == "1"
    problem = blocked.json()
    assert (problem["type"], problem["retryable"]) == (
        "urn:context-memory:problem:conflict-retry",
        True,
    )
    assert other_user.status_code == 201  # keys are scoped per user
    assert await stored(client, auth, chat) == []
    assert (await post(client, auth, chat, key)).status_code == 201


async def test_concurrent_duplicates_save_exactly_once(
    app: FastAPI, client: httpx.AsyncClient, auth: AuthFactory
) -> None:
    await enable_company(client, auth)
    chat, key = new_chat(), str(uuid.uuid4())

    responses = await asyncio.gather(*(post(client, auth, chat, key) for _ in range(10)))

    statuses = sorted(r.status_code for r in responses)
    assert set(statuses) <= {202, 409}, statuses
    done = [r for r in responses if r.status_code == 202]
    assert done, statuses
    assert len({r.content for r in done}) == 1  # the original and its replays are identical
    assert sum(1 for r in done if REPLAYED_HEADER.lower() not in r.headers) == 1
    assert len(await stored(client, auth, chat)) == 2
    assert await count(app, "jobs") == 1


async def test_keys_are_scoped_per_user(client: httpx.AsyncClient, auth: AuthFactory) -> None:
    chat, key = "same-chat", "shared-key"
    alice = await post(client, auth, chat, key, sub="alice")
    bob = await post(client, auth, chat, key, sub="bob")

    assert alice.status_code == bob.status_code == 201
    assert REPLAYED_HEADER.lower() not in bob.headers
    assert alice.json()["turn_id"] != bob.json()["turn_id"]
    assert len(await stored(client, auth, chat, sub="alice")) == 2
    assert len(await stored(client, auth, chat, sub="bob")) == 2


async def test_an_expired_key_is_treated_as_new(
    app: FastAPI, client: httpx.AsyncClient, auth: AuthFactory
) -> None:
    chat, key = new_chat(), "old-key"
    first = await post(client, auth, chat, key)
    await execute(app, "UPDATE idempotency_keys SET expires_at = now() - interval '1s'")

    other = turn_body([user("A new question")], "A new answer.")
    fresh = await post(client, auth, chat, key, body=other)
    replay = await post(client, auth, chat, key, body=other)

    assert fresh.status_code == 201
    assert REPLAYED_HEADER.lower() not in fresh.headers
    assert fresh.json()["turn_id"] != first.json()["turn_id"]
    assert replay.headers[REPLAYED_HEADER] == "true"
    assert replay.json() == fresh.json()
    assert len(await stored(client, auth, chat)) == 4


async def test_prune_deletes_only_expired_keys(
    app: FastAPI, client: httpx.AsyncClient, auth: AuthFactory
) -> None:
    chat = new_chat()
    for key in ("a", "b", "c"):
        await post(client, auth, chat, f"key-{key}", body=turn_body([user(key)], key))
    await execute(
        app,
        "UPDATE idempotency_keys SET expires_at = now() - interval '1 hour'"
        " WHERE key IN ('key-a', 'key-b')",
    )

    assert await prune_idempotency_keys(app.state.database.engine) == 2
    assert await prune_idempotency_keys(app.state.database.engine) == 0
    remaining = await rows(app, "SELECT key FROM idempotency_keys")
    assert [r.key for r in remaining] == ["key-c"]


@pytest.mark.parametrize("key", ["", "x" * 256, "tab\there", "del\x7f"])
async def test_malformed_keys_are_422(
    client: httpx.AsyncClient, auth: AuthFactory, key: str
) -> None:
    chat = new_chat()
    response = await post(client, auth, chat, key)
    assert response.status_code == 422
    assert response.json()["errors"][0]["field"] == "header.Idempotency-Key"
    assert await stored(client, auth, chat) == []


async def test_a_chat_saved_with_and_without_keys_reads_back_in_order(
    client: httpx.AsyncClient, auth: AuthFactory
) -> None:
    """A keyed turn between two turns without a key: the messages listed and the history loaded
    as context come back in the order they were saved. On a Citus cluster both kinds of write
    take their message ids on the company's node (docs/scaling.md); from two nodes' ranges a
    chat read back out of order."""
    await enable_company(client, auth)
    chat = new_chat()
    assert (await save_turn(client, auth, chat, [user("first")], "one")).status_code == 202
    keyed = await client.post(
        f"/v1/chats/{chat}/turns",
        json=turn_body([user("second")], "two"),
        headers=auth() | {"Idempotency-Key": str(uuid.uuid4())},
    )
    assert keyed.status_code == 202, keyed.text
    assert (await save_turn(client, auth, chat, [user("third")], "three")).status_code == 202

    saved = ["first", "one", "second", "two", "third", "three"]
    assert [m["content"] for m in await stored(client, auth, chat)] == saved
    loaded = await context(client, auth, chat, [user("and now?")])
    assert [m["content"] for m in loaded["messages"]] == [*saved, "and now?"]
