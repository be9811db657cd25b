"""The stored chat history over HTTP: paging, per-user isolation, deleting a chat, and the
input limits of the chat routes (bad ids, NUL, counts, lengths, unknown fields, no token)."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from tests.helpers.apps import AuthFactory, client_with
from tests.helpers.db import rows
from tests.helpers.turns import assistant, context, save_turn, stored, turn_body, user


async def test_messages_are_paged_oldest_first(
    client: httpx.AsyncClient, auth: AuthFactory
) -> None:
    for n in range(3):
        await save_turn(client, auth, "paged", [user(f"Q{n}")], f"R{n}")

    first = await client.get("/v1/chats/paged/messages", params={"limit": 4}, headers=auth("alice"))
    page = first.json()
    rest = await client.get(
        "/v1/chats/paged/messages",
        params={"limit": 4, "cursor": page["next_cursor"]},
        headers=auth("alice"),
    )

    assert first.status_code == rest.status_code == 200
    items = page["items"] + rest.json()["items"]
    assert [(m["role"], m["content"]) for m in items] == [
        ("user", "Q0"),
        ("assistant", "R0"),
        ("user", "Q1"),
        ("assistant", "R1"),
        ("user", "Q2"),
        ("assistant", "R2"),
    ]
    assert len(page["items"]) == 4
    assert rest.json()["next_cursor"] is None
    assert set(items[0]) == {"id", "role", "content", "source", "turn_id", "created_at"}
    assert [m["source"] for m in items[:2]] == ["request", "response"]


async def test_a_tampered_cursor_is_422(client: httpx.AsyncClient, auth: AuthFactory) -> None:
    response = await client.get(
        "/v1/chats/c1/messages", params={"cursor": "not-a-cursor"}, headers=auth("alice")
    )
    assert response.status_code == 422


async def test_users_with_the_same_chat_id_never_meet(
    client: httpx.AsyncClient, auth: AuthFactory
) -> None:
    await save_turn(client, auth, "same", [user("alice's secret")], "ok", sub="alice")

    assert await stored(client, auth, "same", sub="bob") == []
    loaded = await context(client, auth, "same", [user("Q")], sub="bob")
    assert [m["content"] for m in loaded["messages"]] == ["Q"]
    other_company = await client.get("/v1/chats/same/messages", headers=auth("alice", "globex"))
    assert other_company.status_code == 404


async def test_delete_chat_removes_only_the_callers_chat(
    app: FastAPI, client: httpx.AsyncClient, auth: AuthFactory
) -> None:
    await save_turn(client, auth, "doomed", [user("Q")], "R", sub="alice")
    await save_turn(client, auth, "doomed", [user("Q")], "R", sub="bob")
    await save_turn(client, auth, "kept", [user("Q")], "R", sub="alice")

    deleted = await client.delete("/v1/chats/doomed", headers=auth("alice"))
    again = await client.delete("/v1/chats/doomed", headers=auth("alice"))

    assert deleted.status_code == 204
    assert deleted.content == b""
    assert again.status_code == 404
    assert again.headers["content-type"] == "application/problem+json"
    assert await stored(client, auth, "doomed", sub="alice") == []
    assert len(await stored(client, auth, "doomed", sub="bob")) == 2
    assert len(await stored(client, auth, "kept", sub="alice")) == 2
    turns = await rows(app, "SELECT user_id, chat_id FROM turns ORDER BY user_id, chat_id")
    assert [tuple(t) for t in turns] == [("alice", "kept"), ("bob", "doomed")]


async def test_a_chat_that_never_existed_is_404_to_read_and_to_delete(
    client: httpx.AsyncClient, auth: AuthFactory
) -> None:
    read = await client.get("/v1/chats/never/messages", headers=auth("alice"))
    deleted = await client.delete("/v1/chats/never", headers=auth("alice"))

    assert read.status_code == deleted.status_code == 404
    assert read.json()["detail"] == deleted.json()["detail"] == "No such chat."


async def test_a_deleted_chat_reads_as_gone(client: httpx.AsyncClient, auth: AuthFactory) -> None:
    await save_turn(client, auth, "gone", [user("Q")], "R", sub="alice")
    before = await client.get("/v1/chats/gone/messages", headers=auth("alice"))
    await client.delete("/v1/chats/gone", headers=auth("alice"))
    after = await client.get("/v1/chats/gone/messages", headers=auth("alice"))

    assert before.status_code == 200
    assert len(before.json()["items"]) == 2
    assert after.status_code == 404


# --- bad input ------------------------------------------------------------------------------------

CONTEXT_BODY: dict[str, Any] = {"space_id": "space-1", "messages": [user("Hi")]}
TURN_BODY = turn_body([user("Hi")], "Hello")
BAD_CHAT_IDS = ["a" * 129, "has space", "semi;colon", "ünïcode"]


@pytest.mark.parametrize("chat_id", BAD_CHAT_IDS)
@pytest.mark.parametrize(
    ("method", "suffix", "body"),
    [
        ("POST", "/context", CONTEXT_BODY),
        ("POST", "/turns", TURN_BODY),
        ("GET", "/messages", None),
        ("DELETE", "", None),
    ],
)
async def test_bad_chat_ids_are_422(
    *,
    client: httpx.AsyncClient,
    auth: AuthFactory,
    chat_id: str,
    method: str,
    suffix: str,
    body: dict[str, Any] | None,
) -> None:
    response = await client.request(
        method, f"/v1/chats/{chat_id}{suffix}", json=body, headers=auth("alice")
    )
    assert response.status_code == 422
    assert response.json()["errors"][0]["field"] == "path.chat_id"


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        (
            "/context",
            CONTEXT_BODY | {"messages": [user("nul\x00here")]},
            "body.messages.0.content",
        ),
        ("/turns", TURN_BODY | {"response": assistant("a\x00b")}, "body.response.content"),
        ("/context", CONTEXT_BODY | {"system_prompt": "x\x00"}, "body.system_prompt"),
        ("/context", CONTEXT_BODY | {"user_id": "mallory"}, "body.user_id"),
        ("/turns", TURN_BODY | {"version": 3}, "body.version"),
        ("/context", CONTEXT_BODY | {"messages": []}, "body.messages"),
        ("/context", CONTEXT_BODY | {"space_id": "bad space"}, "body.space_id"),
        ("/context", CONTEXT_BODY | {"history_mode": "sometimes"}, "body.history_mode"),
        ("/turns", TURN_BODY | {"response": user("Hi")}, "body.response.role"),
        (
            "/context",
            CONTEXT_BODY | {"messages": [{"role": "tool", "content": "x"}]},
            "body.messages.0.role",
        ),
        (
            "/context",
            CONTEXT_BODY | {"messages": [{"role": "user", "content": "x", "name": "n"}]},
            "body.messages.0.name",
        ),
        ("/turns", TURN_BODY | {"language_model": "has space"}, "body.language_model"),
    ],
)
async def test_bad_bodies_are_422_naming_the_field(
    client: httpx.AsyncClient, auth: AuthFactory, path: str, body: dict[str, Any], field: str
) -> None:
    response = await client.post(f"/v1/chats/c1{path}", json=body, headers=auth("alice"))
    assert response.status_code == 422, response.text
    assert response.headers["content-type"] == "application/problem+json"
    assert field in [error["field"] for error in response.json()["errors"]]
    assert await stored(client, auth, "c1") == []


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (
            CONTEXT_BODY | {"messages": [user("1"), user("2"), user("3"), user("4")]},
            "body.messages",
        ),
        (
            CONTEXT_BODY | {"placeholder_history": [user("1")] * 4},
            "body.placeholder_history",
        ),
        (CONTEXT_BODY | {"messages": [user("x" * 51)]}, "body.messages.0.content"),
        (CONTEXT_BODY | {"system_prompt": "x" * 51}, "body.system_prompt"),
    ],
)
async def test_configured_limits_are_422_naming_the_field(
    database_url: str, auth: AuthFactory, body: dict[str, Any], field: str
) -> None:
    limits = {"max_messages_per_request": 3, "max_message_chars": 50}
    async with client_with(database_url, **limits) as small:
        loaded = await small.post("/v1/chats/c1/context", json=body, headers=auth("alice"))
        saved = await small.post(
            "/v1/chats/c1/turns",
            json={k: v for k, v in body.items() if k not in {"system_prompt", "debug"}}
            | {"response": assistant("ok")},
            headers=auth("alice"),
        )
    assert loaded.status_code == 422
    assert loaded.json()["errors"][0]["field"] == field
    if field != "body.system_prompt":
        assert saved.status_code == 422
        assert saved.json()["errors"][0]["field"] == field


async def test_response_longer_than_the_limit_is_422(database_url: str, auth: AuthFactory) -> None:
    async with client_with(database_url, max_message_chars=50) as small:
        response = await small.post(
            "/v1/chats/c1/turns", json=turn_body([user("Hi")], "y" * 51), headers=auth("alice")
        )
    assert response.status_code == 422
    assert response.json()["errors"][0]["field"] == "body.response.content"


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("POST", "/v1/chats/c1/context", CONTEXT_BODY),
        ("POST", "/v1/chats/c1/turns", TURN_BODY),
        ("GET", "/v1/chats/c1/messages", None),
        ("DELETE", "/v1/chats/c1", None),
    ],
)
async def test_no_token_is_401(
    client: httpx.AsyncClient, method: str, path: str, body: dict[str, Any] | None
) -> None:
    response = await client.request(method, path, json=body)
    assert response.status_code == 401
    assert response.headers["www-authenticate"] == "Bearer"
