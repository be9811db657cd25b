"""Turn-save over HTTP: the exchange is stored per mode before the answer; 202 with a queued
consolidation (payload of ids only, model chosen per space) when memory is active, 201 with
the reason otherwise; two statements on the common path."""

from __future__ import annotations

import uuid
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from sqlalchemy import text

from app.enablement.models import DEFAULT_LANGUAGE_MODEL
from app.folders import service as folders
from app.kit.citus import FUNCTION_PREFIX
from app.turns.save import FOLDER_REFUSED_REASON
from tests.helpers.apps import COMPANY, SPACE, AuthFactory
from tests.helpers.db import rows, sessions, statements
from tests.helpers.memory import seed_profile
from tests.helpers.on_citus import ON_CITUS
from tests.helpers.settings import enable_company, patch_space
from tests.helpers.turns import new_chat, save_turn, stored, turn_body, user

QUESTION = "My favourite colour is teal, remember that."
ANSWER = "Noted: teal."


async def jobs_of(app: FastAPI, user_id: str = "alice") -> list[Any]:
    return await rows(
        app,
        "SELECT id, kind, status, payload::text AS raw, payload FROM jobs"
        " WHERE company_id = :c AND user_id = :u ORDER BY created_at",
        c=COMPANY,
        u=user_id,
    )


async def test_enabled_turn_is_saved_and_queues_a_consolidation_of_ids_only(
    app: FastAPI, client: httpx.AsyncClient, auth: AuthFactory
) -> None:
    await enable_company(client, auth)
    chat = new_chat()

    response = await save_turn(
        client, auth, chat, [user(QUESTION)], ANSWER, language_model="gpt-4o-mini"
    )

    assert response.status_code == 202
    body = response.json()
    assert body["saved_messages"] == 2
    assert body["consolidation"]["status"] == "queued"
    assert body["consolidation"]["reason"] is None
    [job] = await jobs_of(app)
    assert str(job.id) == body["consolidation"]["job_id"]
    assert (job.kind, job.status) == ("consolidation", "queued")
    assert job.payload == {"turn_id": body["turn_id"], "space_id": SPACE, "model": "gpt-4o-mini"}
    assert "teal" not in job.raw
    seen = await client.get(f"/v1/jobs/{job.id}", headers=auth("alice"))
    assert seen.status_code == 200
    assert seen.json()["status"] == "queued"
    messages = await stored(client, auth, chat)
    assert [(m["role"], m["content"], m["source"]) for m in messages] == [
        ("user", QUESTION, "request"),
        ("assistant", ANSWER, "response"),
    ]
    assert {m["turn_id"] for m in messages} == {body["turn_id"]}


async def test_first_enabled_turn_creates_the_private_user_folder(
    app: FastAPI, client: httpx.AsyncClient, auth: AuthFactory
) -> None:
    await enable_company(client, auth)

    await save_turn(client, auth, new_chat(), [user("Hi")], "Hello")

    acl = await rows(
        app,
        "SELECT f.inherit_access, a.principal_kind, a.principal_id, a.permission"
        " FROM folders f JOIN folder_acl a ON a.company_id = f.company_id AND a.folder_id = f.id"
        " WHERE f.company_id = :c AND f.path = 'user-memory/alice' ORDER BY a.permission",
        c=COMPANY,
    )
    assert [tuple(row) for row in acl] == [
        (False, "user", "alice", "READ"),
        (False, "user", "alice", "WRITE"),
    ]


async def test_disabled_turn_is_saved_and_says_why_nothing_was_queued(
    app: FastAPI, client: httpx.AsyncClient, auth: AuthFactory
) -> None:
    chat = new_chat()

    response = await save_turn(client, auth, chat, [user(QUESTION)], ANSWER)

    assert response.status_code == 201
    consolidation = response.json()["consolidation"]
    assert consolidation["status"] == "skipped"
    assert consolidation["job_id"] is None
    assert "FEATURE_FLAG_ENABLE_CONTEXT_MEMORY_UN_22033" in consolidation["reason"]
    assert await jobs_of(app) == []
    assert len(await stored(client, auth, chat)) == 2


@pytest.mark.parametrize(
    ("space", "orchestrator_model", "expected"),
    [
        (None, "gpt-4o", "gpt-4o"),
        (None, None, DEFAULT_LANGUAGE_MODEL),
        ({"use_orchestrator_language_model": True}, "claude-x", "claude-x"),
        (
            {"use_orchestrator_language_model": False, "language_model": "AZURE_GPT_4o_mini"},
            "gpt-4o",
            "AZURE_GPT_4o_mini",
        ),
    ],
)
async def test_payload_model_follows_the_space_configuration(
    *,
    app: FastAPI,
    client: httpx.AsyncClient,
    auth: AuthFactory,
    space: dict[str, Any] | None,
    orchestrator_model: str | None,
    expected: str,
) -> None:
    await enable_company(client, auth)
    if space is not None:
        await patch_space(client, auth, SPACE, {"user_memory": space}, expect=200)
    extra = {} if orchestrator_model is None else {"language_model": orchestrator_model}

    await save_turn(client, auth, new_chat(), [user("Hi")], "Hello", **extra)

    [job] = await jobs_of(app)
    assert job.payload["model"] == expected


CALL = f"SELECT * FROM {FUNCTION_PREFIX}"  # noqa: S608 - a constant prefix
"""How a statement sent as its company function starts (app/kit/citus.py)."""


async def test_turn_save_common_path_is_one_statement(
    app: FastAPI, client: httpx.AsyncClient, auth: AuthFactory
) -> None:
    """The settings read and the write of turn + messages + job in one statement, without a
    transaction of its own; a key adds the transaction, its lock and a read of its own."""
    await enable_company(client, auth)
    await seed_profile(app, "alice", {})  # the per-user folder exists already
    chat = new_chat()

    with statements(app) as plain:
        assert (await save_turn(client, auth, chat, [user("Q1")], "R1")).status_code == 202
    with statements(app) as keyed:
        response = await client.post(
            f"/v1/chats/{chat}/turns",
            json=turn_body([user("Q2")], "R2"),
            headers=auth("alice") | {"Idempotency-Key": str(uuid.uuid4())},
        )
        assert response.status_code == 202

    if ON_CITUS:  # each write in its company function; the keyed one holds the shards first
        assert [s.lstrip()[: len(CALL)] for s in plain] == [CALL]
        assert [s.lstrip().split()[0].upper().rstrip(";") for s in keyed] == [
            "BEGIN",
            "SELECT",
            "SELECT",
            "SELECT",
            "SELECT",
            "COMMIT",
        ]
        assert keyed[-2].lstrip().startswith(CALL)
        return
    assert [s.lstrip().split()[0].upper() for s in plain] == ["WITH"]
    assert [s.lstrip().split()[0].upper().rstrip(";") for s in keyed] == [
        "BEGIN",
        "SELECT",
        "SELECT",
        "WITH",
        "COMMIT",
    ]


async def test_turn_ids_are_distinct_and_messages_belong_to_their_turn(
    client: httpx.AsyncClient, auth: AuthFactory
) -> None:
    chat = new_chat()
    first = (await save_turn(client, auth, chat, [user("Q1")], "R1")).json()["turn_id"]
    second = (await save_turn(client, auth, chat, [user("Q2")], "R2")).json()["turn_id"]

    messages = await stored(client, auth, chat)

    assert first != second
    assert [m["turn_id"] for m in messages] == [first, first, second, second]


async def test_a_refused_memory_folder_skips_consolidation_but_keeps_the_exchange(
    app: FastAPI, client: httpx.AsyncClient, auth: AuthFactory
) -> None:
    await enable_company(client, auth)
    async with sessions(app)() as session, session.begin():
        await folders.ensure_root_folder(session, COMPANY)
        await session.execute(
            text("DELETE FROM folder_acl WHERE company_id = :c AND permission = 'WRITE'"),
            {"c": COMPANY},
        )
    chat = new_chat()

    response = await save_turn(client, auth, chat, [user("Hi")], "Hello")

    assert response.status_code == 201
    assert response.json()["consolidation"] == {
        "status": "skipped",
        "job_id": None,
        "reason": FOLDER_REFUSED_REASON,
    }
    assert len(await stored(client, auth, chat)) == 2
    assert await jobs_of(app) == []
