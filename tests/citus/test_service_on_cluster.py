"""The service on the Citus cluster, through its real routes: each statement it sends must be
router-planned to one company's shard (the service's role turns a multi-shard statement into an
error, tests/citus/conftest.py), except the cross-company statements that lower that level
themselves, with their reason."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from app.consolidation.kinds import CONSOLIDATION, consolidation_payload
from app.conversations.modes import Role
from app.conversations.repository import NewMessage, NewTurn
from app.enablement.decision import FLAG_CONTEXT_MEMORY
from app.jobs.enqueue import NewJob
from app.kit.citus import runs_citus
from app.kit.llm import OpenAIChatModel
from app.portability.export import open_snapshot
from app.profiles.profile import Section
from app.quotas.rule import QuotaLimits
from app.turns import batching, repository
from app.turns.repository import save_common_turns
from tests.helpers.apps import COMPANY, SPACE, USER, AuthFactory
from tests.helpers.db import admin_fetchval, database_of
from tests.helpers.llm_stub import StubLLMServer, reply
from tests.helpers.memory import ME, head_content, put_memory
from tests.helpers.portability import export_of, records
from tests.helpers.profiles import memory_md
from tests.helpers.settings import (
    enable_company,
    patch_user_settings,
    set_flag,
    set_memory_policy,
)
from tests.helpers.turns import context, new_chat, queue_turn, save_turn, stored, turn_body, user
from tests.helpers.worker import add_bullet_answer, make_handler, make_worker

GATED_TEXT = "These days the data platform at Acme is where I spend my time."
"""Read by no rule of the offline engine: the model is asked."""

pytestmark = pytest.mark.slow


async def test_a_saved_turn_is_loaded_back_as_context(
    client: httpx.AsyncClient, auth: AuthFactory, admin_url: str
) -> None:
    await enable_company(client, auth)
    chat = new_chat()
    saved = await save_turn(client, auth, chat, [user("I live in Lisbon.")], "Noted.")
    assert saved.status_code == 202, saved.text
    loaded = await context(client, auth, chat, [user("Where do I live?")])
    assert [m["content"] for m in loaded["messages"]][:2] == ["I live in Lisbon.", "Noted."]
    assert [m["content"] for m in await stored(client, auth, chat)] == [
        "I live in Lisbon.",
        "Noted.",
    ]
    count = "SELECT count(*) FROM turns WHERE company_id = $1"
    assert await admin_fetchval(admin_url, count, COMPANY) == 1


async def test_concurrent_turn_saves_are_each_stored_once(
    client: httpx.AsyncClient,
    auth: AuthFactory,
    admin_url: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Saved at once by several users in several chats, through the group commit of
    app/turns/batching.py: batches form, none fails (a failed batch would be written again
    turn by turn), and every turn is stored once with its two messages."""
    batches: list[int | BaseException] = []

    async def recorded(*args: Any, **kwargs: Any) -> list[repository.CommonTurnSave]:
        try:
            done = await save_common_turns(*args, **kwargs)
        except BaseException as error:
            batches.append(error)
            raise
        batches.append(len(done))
        return done

    monkeypatch.setattr(batching, "save_common_turns", recorded)
    await enable_company(client, auth)
    chats = [new_chat() for _ in range(4)]

    async def one(n: int) -> httpx.Response:
        return await save_turn(
            client, auth, chats[n % 4], [user(f"fact {n}")], f"ok {n}", sub=f"user-{n % 3}"
        )

    answers = await asyncio.gather(*(one(n) for n in range(24)))
    assert {a.status_code for a in answers} <= {201, 202}
    assert batches, "no batch formed"
    assert all(isinstance(size, int) for size in batches), batches
    count = "SELECT count(*) FROM chat_messages WHERE company_id = $1"
    assert await admin_fetchval(admin_url, count, COMPANY) == 48
    turns = "SELECT count(DISTINCT id) FROM turns WHERE company_id = $1"
    assert await admin_fetchval(admin_url, turns, COMPANY) == 24


def _common_turn(user_id: str, chat_id: str) -> repository.CommonTurn:
    turn = NewTurn(uuid.uuid4(), COMPANY, user_id, chat_id, SPACE, "auto", None)
    messages = [
        NewMessage(Role.USER, f"{user_id} says hi in {chat_id}", "request"),
        NewMessage(Role.ASSISTANT, f"hello {user_id}", "response"),
    ]
    job = NewJob(CONSOLIDATION, consolidation_payload(str(turn.id), SPACE, None), 3)
    return repository.CommonTurn(turn, messages, job, None, False)


async def test_the_batch_statement_writes_each_turn_on_the_cluster(
    app: FastAPI, client: httpx.AsyncClient, auth: AuthFactory, admin_url: str
) -> None:
    """The group commit's one statement for several turns (`save_common_turns`), as the
    batcher sends it: not a fallback to one statement per turn."""
    await enable_company(client, auth)
    await save_turn(client, auth, new_chat(), [user("Hello.")], "Hi.")  # the user's folder
    turns = [_common_turn(USER, new_chat()) for _ in range(3)]
    assert await runs_citus(database_of(app).engine)
    async with database_of(app).driver.connection() as conn:
        done = await repository.save_common_turns(conn, turns, limits=QuotaLimits(), citus=True)
    assert [(d.written, d.queued) for d in done] == [(True, True)] * 3
    ids = [t.turn.id for t in turns]
    stored = "SELECT count(*) FROM chat_messages WHERE company_id = $1 AND turn_id = ANY($2)"
    assert await admin_fetchval(admin_url, stored, COMPANY, ids) == 6
    jobs = "SELECT count(*) FROM jobs WHERE company_id = $1 AND payload->>'turn_id' = ANY($2)"
    assert await admin_fetchval(admin_url, jobs, COMPANY, [str(i) for i in ids]) == 3


async def test_a_keyed_turn_save_is_replayed_not_written_twice(
    client: httpx.AsyncClient, auth: AuthFactory, admin_url: str
) -> None:
    await enable_company(client, auth)
    chat = new_chat()
    body = turn_body([user("I work at Initech.")], "Noted.")
    headers = auth() | {"Idempotency-Key": "key-1"}
    first = await client.post(f"/v1/chats/{chat}/turns", json=body, headers=headers)
    again = await client.post(f"/v1/chats/{chat}/turns", json=body, headers=headers)
    assert first.status_code == 202, first.text
    assert (again.status_code, again.content) == (first.status_code, first.content)
    count = "SELECT count(*) FROM turns WHERE company_id = $1"
    assert await admin_fetchval(admin_url, count, COMPANY) == 1


async def test_memory_edits_settings_and_policy_round_trip(
    client: httpx.AsyncClient, auth: AuthFactory
) -> None:
    await enable_company(client, auth)
    saved = await set_memory_policy(client, auth, recent_topics_days=30)
    assert saved["recent_topics_days"] == 30
    again = await set_memory_policy(client, auth, recent_topics_days=45)
    assert again["recent_topics_days"] == 45
    version = await put_memory(client, auth, memory_md({Section.IDENTITY: ["Lives in Lisbon."]}))
    version = await put_memory(
        client, auth, memory_md({Section.IDENTITY: ["Lives in Porto."]}), version=version
    )
    read = await client.get(ME, headers=auth())
    assert read.status_code == 200, read.text
    assert "Porto" in read.text
    history = await client.get(f"{ME}/versions", headers=auth())
    assert history.status_code == 200, history.text
    await patch_user_settings(client, auth, {"context_memory": False}, expect=200)


async def test_the_worker_consolidates_a_turn_with_the_model(
    app: FastAPI,
    client: httpx.AsyncClient,
    auth: AuthFactory,
    llm_stub: StubLLMServer,
    chat_model: OpenAIChatModel,
) -> None:
    await enable_company(client, auth)
    llm_stub.script(reply("UPDATE"), reply(add_bullet_answer("Identity", "Works at Acme.")))
    job = await queue_turn(client, auth, GATED_TEXT)
    handler, metrics, _ = make_handler(app, chat_model)
    claimed = await make_worker(app, handler, metrics).run_once()
    assert claimed is not None
    assert claimed.jobs[0].id == job
    content = await head_content(app)
    assert content is not None
    assert "Works at Acme." in content


async def test_erasure_and_export_of_a_company(
    client: httpx.AsyncClient, auth: AuthFactory, admin_url: str
) -> None:
    await enable_company(client, auth)
    await save_turn(client, auth, new_chat(), [user("I live in Lisbon.")], "Noted.")
    await put_memory(client, auth, memory_md({Section.IDENTITY: ["Lives in Lisbon."]}))
    exported = await export_of(client, auth, COMPANY)
    assert b"Lives in Lisbon." in exported
    erased = await client.delete("/v1/me", headers=auth())
    assert erased.status_code == 200, erased.text
    count = "SELECT count(*) FROM chat_messages WHERE company_id = $1 AND user_id = $2"
    assert await admin_fetchval(admin_url, count, COMPANY, USER) == 0


async def test_a_company_export_is_one_snapshot_on_the_cluster(
    app: FastAPI, client: httpx.AsyncClient, auth: AuthFactory
) -> None:
    """The export's snapshot starts on the company's node with its first statement: what is
    written after it opened (a turn, a flag, the export's own audit event) is not in it."""
    await enable_company(client, auth)
    await save_turn(client, auth, new_chat(), [user("before the export")], "ok")
    snapshot = await open_snapshot(database_of(app), COMPANY)
    try:
        await save_turn(client, auth, new_chat(), [user("during the export")], "ok")
        await set_flag(client, auth, FLAG_CONTEXT_MEMORY, False, COMPANY)
        stream = b"".join([chunk async for chunk in snapshot.lines()])
    finally:
        await snapshot.close()
    assert b"before the export" in stream
    assert b"during the export" not in stream
    flags = [r for r in records(stream) if r["type"] == "feature_flag"]
    assert [flag["enabled"] for flag in flags] == [True]
