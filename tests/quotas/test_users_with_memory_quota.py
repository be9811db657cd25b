"""The per-company quota of users with memory (`QUOTA_COMPANY_USERS_WITH_MEMORY`): the user
whose first enabled turn would create the company's (N+1)-th memory folder has the turn saved
and its consolidation skipped with the reason; their PUT, import and explicit consolidation
are a 409 with nothing written. Exact under concurrency; a place freed by an opt-out is taken
again; another company is unaffected."""

from __future__ import annotations

import asyncio

import httpx
from fastapi import FastAPI

from app.quotas.rule import Quota
from tests.helpers.apps import COMPANY, SPACE, AuthFactory
from tests.helpers.db import scalar
from tests.helpers.settings import enable_company, patch_user_settings
from tests.helpers.turns import turn_body, user
from tests.quotas.conftest import QuotaAppFactory
from tests.quotas.test_stored_quotas import PROFILE


async def first_turn(
    client: httpx.AsyncClient, auth: AuthFactory, sub: str, company: str = COMPANY
) -> httpx.Response:
    return await client.post(
        "/v1/chats/chat-1/turns",
        json=turn_body([user(f"I am {sub}.")], "Nice to meet you."),
        headers=auth(sub, company),
    )


async def user_folders(app: FastAPI, company: str = COMPANY) -> int:
    count: int = await scalar(
        app,
        "SELECT count(*) FROM folders WHERE company_id = :c AND parent_id IS NOT NULL",
        c=company,
    )
    return count


async def test_the_user_past_the_quota_has_turns_saved_but_no_memory_and_writes_refused(
    quota_app: QuotaAppFactory, auth: AuthFactory
) -> None:
    async with quota_app(quota_company_users_with_memory=2) as (app, client):
        for sub in ("alice", "bob"):
            assert (await first_turn(client, auth, sub)).status_code == 202

        carol = await first_turn(client, auth, "carol")

        assert carol.status_code == 201, carol.text
        consolidation = carol.json()["consolidation"]
        assert consolidation["status"] == "skipped"
        assert consolidation["job_id"] is None
        assert Quota.COMPANY_USERS_WITH_MEMORY in consolidation["reason"]
        assert "2" in consolidation["reason"]
        assert carol.json()["saved_messages"] == 2  # the history is kept
        stored = "SELECT count(*) FROM chat_messages WHERE user_id = 'carol'"
        assert await scalar(app, stored) == 2
        assert await user_folders(app) == 2
        assert await scalar(app, "SELECT count(*) FROM jobs WHERE user_id = 'carol'") == 0

        headers = auth("carol", COMPANY)
        put = await client.put(
            "/v1/me/memory", json={"content": PROFILE}, headers=headers | {"If-None-Match": "*"}
        )
        imported = await client.post(
            "/v1/me/memory/import", json={"profile": {"content": PROFILE}}, headers=headers
        )
        explicit = await client.post(
            "/v1/me/memory/consolidations",
            json={"space_id": SPACE, "user": "I like tea.", "assistant": "Noted."},
            headers=headers,
        )
        for refused in (put, imported, explicit):
            assert refused.status_code == 409, refused.text
            assert refused.json()["type"].endswith("quota-exceeded")
            assert Quota.COMPANY_USERS_WITH_MEMORY in refused.json()["detail"]
        assert await user_folders(app) == 2
        assert await scalar(app, "SELECT count(*) FROM memory_files") == 0
        assert await scalar(app, stored) == 2  # the explicit consolidation wrote nothing

        # users who have memory keep it; another company has its own count
        assert (await first_turn(client, auth, "alice")).status_code == 202
        await enable_company(client, auth, "globex")
        assert (await first_turn(client, auth, "gina", "globex")).status_code == 202


async def test_a_place_freed_by_an_opt_out_is_taken_by_the_next_first_turn(
    quota_app: QuotaAppFactory, auth: AuthFactory
) -> None:
    async with quota_app(quota_company_users_with_memory=1) as (app, client):
        assert (await first_turn(client, auth, "alice")).status_code == 202
        assert (await first_turn(client, auth, "carol")).status_code == 201

        await patch_user_settings(client, auth, {"context_memory": False}, "alice", expect=200)

        assert (await first_turn(client, auth, "carol")).status_code == 202
        assert await user_folders(app) == 1


async def test_concurrent_first_turns_create_exactly_the_quota_of_memories(
    quota_app: QuotaAppFactory, auth: AuthFactory
) -> None:
    async with quota_app(quota_company_users_with_memory=3) as (app, client):
        answers = await asyncio.gather(*(first_turn(client, auth, f"user-{n}") for n in range(12)))

        statuses = sorted(answer.status_code for answer in answers)
        assert statuses == [201] * 9 + [202] * 3
        assert await user_folders(app) == 3
        assert await scalar(app, "SELECT count(*) FROM chat_messages") == 24
