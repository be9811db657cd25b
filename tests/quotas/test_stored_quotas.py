"""The stored-amount quotas, checked periodically by the worker's housekeeping step: stored chat
messages per user (`QUOTA_USER_HISTORY_MESSAGES`) and stored bytes per company
(`QUOTA_COMPANY_STORAGE_BYTES`). Past a check that found a subject over, its turn-saves are a
409 with nothing written, replays of earlier answers still replay, others are unaffected, and
a subject back under is let through at the next check. The erasure of a user takes their marks;
a check racing the erasure never writes one back."""

from __future__ import annotations

from typing import Any

import httpx
from fastapi import FastAPI

from app.quotas import repository
from app.quotas.maintenance import quota_check_step
from app.quotas.rule import Quota
from tests.helpers.apps import COMPANY, AuthFactory
from tests.helpers.db import database_of, rows, scalar
from tests.helpers.settings import enable_company
from tests.helpers.turns import turn_body, user
from tests.quotas.conftest import QuotaAppFactory

PROFILE = """# User Memory

## Identity
- Works on the storage quota tests.

## Communication Preferences

## Work Context

## Skills & Expertise

## Recent Topics

## Open Questions / Follow-ups
"""


class Clock:
    """The step's monotonic clock, stepped by the test."""

    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


async def post_turn(
    client: httpx.AsyncClient,
    auth: AuthFactory,
    text: str,
    *,
    sub: str = "alice",
    company: str = COMPANY,
    chat: str = "chat-1",
    key: str | None = None,
) -> httpx.Response:
    headers = auth(sub, company) | ({"Idempotency-Key": key} if key else {})
    return await client.post(
        f"/v1/chats/{chat}/turns", json=turn_body([user(text)], f"Re: {text}"), headers=headers
    )


async def saved(client: httpx.AsyncClient, auth: AuthFactory, text: str, **kw: Any) -> Any:
    response = await post_turn(client, auth, text, **kw)
    assert response.status_code in (201, 202), response.text
    return response


def assert_quota_exceeded(response: httpx.Response, quota: Quota, limit: str) -> None:
    assert response.status_code == 409, response.text
    assert response.headers["content-type"] == "application/problem+json"
    problem = response.json()
    assert problem["type"].endswith("quota-exceeded")
    assert quota in problem["detail"]
    assert limit in problem["detail"]


async def marks(app: FastAPI) -> list[tuple[str, ...]]:
    users = await rows(app, "SELECT company_id, user_id, quota, used FROM user_quota_marks")
    companies = await rows(app, "SELECT company_id, quota, used FROM company_quota_marks")
    return sorted(
        [(r.company_id, r.user_id, r.quota, str(r.used)) for r in users]
        + [(r.company_id, "", r.quota, str(r.used)) for r in companies]
    )


async def test_past_the_check_a_user_over_their_history_quota_is_refused_until_under_again(
    quota_app: QuotaAppFactory, auth: AuthFactory
) -> None:
    clock = Clock()
    step = quota_check_step(
        user_history_messages=6, company_storage_bytes=0, interval_seconds=300, clock=clock
    )
    async with quota_app(quota_user_history_messages=6) as (app, client):
        engine = database_of(app).engine
        first = await saved(client, auth, "one", key="k-1")
        for n in range(9):  # between two checks nothing stops the user: the overshoot
            await saved(client, auth, f"turn {n}", chat=f"chat-{n % 2}")
        await saved(client, auth, "bob's turn", sub="bob")

        assert await step(engine) == 1
        assert await marks(app) == [(COMPANY, "alice", Quota.USER_HISTORY_MESSAGES, "20")]

        refused = await post_turn(client, auth, "one more", key="k-2")
        assert_quota_exceeded(refused, Quota.USER_HISTORY_MESSAGES, "6")
        assert "DELETE /v1/chats/{chat_id}" in refused.json()["detail"]
        assert await scalar(app, "SELECT count(*) FROM chat_messages WHERE user_id = 'alice'") == 20
        assert await scalar(app, "SELECT count(*) FROM idempotency_keys WHERE key = 'k-2'") == 0
        replay = await post_turn(client, auth, "one", key="k-1")  # an answer given stays given
        assert (replay.status_code, replay.json()) == (first.status_code, first.json())
        await saved(client, auth, "bob is under his quota", sub="bob")

        for chat in ("chat-0", "chat-1"):
            deleted = await client.delete(f"/v1/chats/{chat}", headers=auth("alice", COMPANY))
            assert deleted.status_code == 204, deleted.text
        assert await step(engine) == 0  # not due: the mark stays until the next check
        assert (await post_turn(client, auth, "still refused")).status_code == 409
        clock.now += 300
        await step(engine)

        assert await marks(app) == []
        await saved(client, auth, "accepted again")


async def test_a_company_over_its_storage_quota_is_refused_and_other_companies_are_not(
    quota_app: QuotaAppFactory, auth: AuthFactory
) -> None:
    clock = Clock()
    step = quota_check_step(
        user_history_messages=0, company_storage_bytes=3_000, interval_seconds=300, clock=clock
    )
    async with quota_app(quota_company_storage_bytes=3_000) as (app, client):
        engine = database_of(app).engine
        await enable_company(client, auth, "globex")
        await saved(client, auth, "x" * 500)  # 500 + 504 bytes of messages
        await saved(client, auth, "y" * 10, company="globex", sub="gina")
        await step(engine)
        assert await marks(app) == []  # 1,004 bytes: under

        created = await client.put(
            "/v1/me/memory",
            json={"content": PROFILE},
            headers=auth("alice", COMPANY) | {"If-None-Match": "*"},
        )
        assert created.status_code == 201, created.text
        for n in range(4):  # 3,420 bytes of messages and 329 of the memory version
            await saved(client, auth, f"{n}" * 300, sub="bob")
        clock.now += 300
        await step(engine)

        (mark,) = await marks(app)
        assert mark[:3] == (COMPANY, "", Quota.COMPANY_STORAGE_BYTES)
        assert int(mark[3]) >= 3_000
        for sub in ("alice", "bob", "carol"):  # every user of the company, even a new one
            response = await post_turn(client, auth, "refused", sub=sub)
            assert_quota_exceeded(response, Quota.COMPANY_STORAGE_BYTES, "3,000")
        await saved(client, auth, "globex is under its quota", company="globex", sub="gina")


async def test_a_quota_turned_off_takes_its_marks_away_at_the_next_check(
    quota_app: QuotaAppFactory, auth: AuthFactory
) -> None:
    async with quota_app(quota_user_history_messages=2) as (app, client):
        engine = database_of(app).engine
        await saved(client, auth, "two messages")
        await quota_check_step(
            user_history_messages=2, company_storage_bytes=0, interval_seconds=300
        )(engine)
        assert len(await marks(app)) == 1

        await quota_check_step(
            user_history_messages=0, company_storage_bytes=0, interval_seconds=300
        )(engine)

        assert await marks(app) == []


async def test_the_erasure_of_a_user_takes_their_marks_and_a_late_check_writes_none_back(
    quota_app: QuotaAppFactory, auth: AuthFactory
) -> None:
    async with quota_app(quota_user_history_messages=2) as (app, client):
        engine = database_of(app).engine
        await saved(client, auth, "two messages")
        await saved(client, auth, "two messages of bob", sub="bob")
        step = quota_check_step(
            user_history_messages=2, company_storage_bytes=0, interval_seconds=300
        )
        await step(engine)
        assert [m[1] for m in await marks(app)] == ["alice", "bob"]
        async with engine.connect() as conn:
            over = await repository.users_over_history(conn, 2)

        erased = await client.delete("/v1/me", headers=auth("alice", COMPANY))
        assert erased.status_code == 200, erased.text
        assert [m[1] for m in await marks(app)] == ["bob"]

        # the check counted alice before the erasure and marks after it: nothing comes back
        await repository.mark_users(engine, Quota.USER_HISTORY_MESSAGES, 2, over)

        assert [m[1] for m in await marks(app)] == ["bob"]
