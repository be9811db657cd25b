"""Retention of stored chat history: with `CHAT_RETENTION_DAYS` set, the worker's housekeeping
deletes messages older than that, then the turns left empty; 0 keeps everything."""

from __future__ import annotations

import httpx
from fastapi import FastAPI
from sqlalchemy.ext.asyncio import AsyncEngine

from app.conversations.retention import chat_retention_steps
from tests.helpers.apps import AuthFactory, app_with
from tests.helpers.db import admin_execute, rows
from tests.helpers.turns import save_turn, user
from tests.helpers.worker import wait_for


async def backdate(database_url: str, chat: str, days: int, *, user_id: str = "alice") -> None:
    """Move a chat's turns and messages `days` days into the past."""
    for table in ("turns", "chat_messages"):
        await admin_execute(
            database_url,
            f"UPDATE {table} SET created_at = created_at - make_interval(days => {days})"  # noqa: S608
            f" WHERE user_id = '{user_id}' AND chat_id = '{chat}'",
        )


async def stored(app: FastAPI) -> list[tuple[str, str]]:
    """(chat, content) of every stored message, and (chat, "turn") for every turn."""
    messages = await rows(app, "SELECT chat_id, content FROM chat_messages ORDER BY id")
    turns = await rows(app, "SELECT chat_id FROM turns ORDER BY chat_id, created_at")
    return [(m.chat_id, m.content) for m in messages] + [(t.chat_id, "turn") for t in turns]


async def seed(client: httpx.AsyncClient, auth: AuthFactory, database_url: str) -> None:
    """`old` (10 days), `young` (3 days), `mixed` (an old turn whose last message is young)."""
    for chat in ("old", "young", "mixed"):
        await save_turn(client, auth, chat, [user(f"{chat} question")], f"{chat} answer")
    await backdate(database_url, "old", 10)
    await backdate(database_url, "young", 3)
    await backdate(database_url, "mixed", 10)
    await admin_execute(
        database_url,
        "UPDATE chat_messages SET created_at = now()"
        " WHERE chat_id = 'mixed' AND role = 'assistant'",
    )


async def test_history_older_than_the_retention_is_deleted_and_younger_history_kept(
    app: FastAPI,
    engine: AsyncEngine,
    client: httpx.AsyncClient,
    auth: AuthFactory,
    database_url: str,
) -> None:
    await seed(client, auth, database_url)
    (step,) = chat_retention_steps(7, batch=1)  # one message per transaction: the batches loop

    assert await step(engine) == 4  # old: 2 messages and the turn; mixed: its old question

    assert await stored(app) == [
        ("young", "young question"),
        ("young", "young answer"),
        ("mixed", "mixed answer"),
        ("mixed", "turn"),
        ("young", "turn"),
    ]
    assert await step(engine) == 0


async def test_a_retention_of_zero_keeps_history_forever() -> None:
    assert chat_retention_steps(0) == ()


async def test_the_service_worker_applies_the_configured_retention(
    app: FastAPI, client: httpx.AsyncClient, auth: AuthFactory, database_url: str
) -> None:
    await seed(client, auth, database_url)

    async with app_with(database_url, worker_enabled=True, chat_retention_days=7):

        async def old_history_gone() -> bool:
            return ("old", "turn") not in await stored(app)

        await wait_for(old_history_gone, seconds=10)

    assert [chat for chat, _ in await stored(app)] == ["young", "young", "mixed", "mixed", "young"]
