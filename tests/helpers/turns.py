"""The orchestrator's two calls over HTTP: messages, loading a chat's context, saving a turn, and
reading the chat's stored messages back."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

import httpx

from tests.helpers.apps import COMPANY, SPACE, USER, AuthFactory

Msg = dict[str, str]


def user(content: str) -> Msg:
    return {"role": "user", "content": content}


def assistant(content: str) -> Msg:
    return {"role": "assistant", "content": content}


def system(content: str) -> Msg:
    return {"role": "system", "content": content}


def pairs(messages: Sequence[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(m["role"], m["content"]) for m in messages]


def new_chat() -> str:
    return f"chat-{uuid.uuid4().hex[:8]}"


async def context(
    client: httpx.AsyncClient,
    auth: AuthFactory,
    chat: str,
    messages: Sequence[Msg],
    *,
    sub: str = USER,
    company: str = COMPANY,
    expect: int = 200,
    **fields: Any,
) -> dict[str, Any]:
    body = {"space_id": SPACE, "messages": list(messages)} | fields
    response = await client.post(f"/v1/chats/{chat}/context", json=body, headers=auth(sub, company))
    assert response.status_code == expect, response.text
    result: dict[str, Any] = response.json()
    return result


def turn_body(messages: Sequence[Msg], answer: str, **fields: Any) -> dict[str, Any]:
    return {
        "space_id": SPACE,
        "messages": list(messages),
        "response": assistant(answer),
    } | fields


async def save_turn(
    client: httpx.AsyncClient,
    auth: AuthFactory,
    chat: str,
    messages: Sequence[Msg],
    answer: str,
    *,
    sub: str = USER,
    company: str = COMPANY,
    **fields: Any,
) -> httpx.Response:
    response = await client.post(
        f"/v1/chats/{chat}/turns",
        json=turn_body(messages, answer, **fields),
        headers=auth(sub, company),
    )
    assert response.status_code in (201, 202), response.text
    return response


async def queue_turn(
    client: httpx.AsyncClient,
    auth: AuthFactory,
    user_text: str,
    *,
    answer: str = "Noted.",
    chat_id: str = "chat-1",
    user: str = USER,
    model: str | None = "gpt-4o-mini",
) -> uuid.UUID:
    """Save one exchange whose consolidation is queued (202); the id of the job it queued."""
    fields = {} if model is None else {"language_model": model}
    response = await save_turn(
        client, auth, chat_id, [{"role": "user", "content": user_text}], answer, sub=user, **fields
    )
    assert response.status_code == 202, response.text
    return uuid.UUID(response.json()["consolidation"]["job_id"])


async def stored(
    client: httpx.AsyncClient, auth: AuthFactory, chat: str, *, sub: str = USER
) -> list[dict[str, Any]]:
    """Every stored message of the chat, following the cursor to the end; none for a chat the
    caller has nothing in (which the service answers 404)."""
    items: list[dict[str, Any]] = []
    cursor: str | None = None
    while True:
        params = {"limit": "100"} | ({"cursor": cursor} if cursor else {})
        response = await client.get(
            f"/v1/chats/{chat}/messages", params=params, headers=auth(sub, COMPANY)
        )
        if response.status_code == 404 and cursor is None:
            assert response.headers["content-type"] == "application/problem+json"
            return []
        assert response.status_code == 200, response.text
        page = response.json()
        items += page["items"]
        cursor = page["next_cursor"]
        if cursor is None:
            return items
