"""The per-user quota of waiting consolidation jobs (`QUOTA_USER_QUEUED_JOBS`): past it, a
turn is still saved and answered 202, its id coalesced into the user's newest queued job, which
the answer names; a turn is never lost from consolidation, not to a claim racing the write, and
a flood stays within the quota. Real PostgreSQL, real worker, the model a local HTTP stub."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import httpx
from fastapi import FastAPI
from sqlalchemy import text

from app.kit.llm import OpenAIChatModel
from tests.helpers.apps import COMPANY, AuthFactory
from tests.helpers.db import database_of, rows, scalar
from tests.helpers.llm_stub import StubLLMServer, reply
from tests.helpers.turns import turn_body, user
from tests.helpers.worker import make_handler, make_worker, wait_for
from tests.quotas.conftest import (
    QuotaAppFactory,
    consolidation_jobs,
    job_turn_ids,
    turn_to_job,
)

NOOP = '{"decision": "NOOP"}'


async def post_turn(
    client: httpx.AsyncClient,
    auth: AuthFactory,
    text: str,
    *,
    sub: str = "alice",
    chat: str = "chat-1",
    key: str | None = None,
) -> httpx.Response:
    headers = auth(sub, COMPANY) | ({"Idempotency-Key": key} if key else {})
    return await client.post(
        f"/v1/chats/{chat}/turns",
        json=turn_body([user(text)], f"Answer to {text}"),
        headers=headers,
    )


async def queued(client: httpx.AsyncClient, auth: AuthFactory, text: str, **kw: Any) -> Any:
    response = await post_turn(client, auth, text, **kw)
    assert response.status_code == 202, response.text
    body = response.json()
    assert body["consolidation"]["status"] == "queued"
    return body


async def waiting_count(app: FastAPI, sub: str = "alice") -> int:
    count: int = await scalar(
        app,
        "SELECT count(*) FROM jobs WHERE company_id = :c AND user_id = :u"
        " AND kind = 'consolidation' AND status IN ('queued', 'retrying')",
        c=COMPANY,
        u=sub,
    )
    return count


async def test_a_flood_of_200_turns_stays_within_20_jobs_and_every_turn_is_consolidated(
    quota_app: QuotaAppFactory,
    auth: AuthFactory,
    chat_model: OpenAIChatModel,
    llm_stub: StubLLMServer,
) -> None:
    async with quota_app(quota_user_queued_jobs=20, quota_job_max_turns=25) as (app, client):
        answers = [await queued(client, auth, f"flood message {n:03d}.") for n in range(200)]

        jobs = await consolidation_jobs(app, "alice")
        assert len(jobs) == 20
        assert await waiting_count(app) == 20
        where = turn_to_job(jobs)  # no turn in two jobs
        assert sorted(where) == sorted(a["turn_id"] for a in answers)  # every turn in one job
        for answer in answers:  # the answer names the job that holds its turn
            assert uuid.UUID(answer["consolidation"]["job_id"]) == where[answer["turn_id"]]
        assert max(len(job_turn_ids(job.payload)) for job in jobs) == 25
        # a new job each for the first 20 turns, then coalesced into the newest with room
        assert [len(job_turn_ids(job.payload)) for job in jobs[:12]] == [1] * 12

        llm_stub.script(*[reply(NOOP) for _ in range(len(jobs))])
        handler, metrics, _ = make_handler(
            app, chat_model, consolidation_gate=False, consolidation_prefilter=False
        )
        worker = make_worker(app, handler, metrics, batch_size=10)
        while await worker.run_once() is not None:
            pass

        statuses = await rows(
            app, "SELECT status, count(*) AS n FROM jobs GROUP BY status ORDER BY status"
        )
        assert [(s.status, s.n) for s in statuses] == [("succeeded", 20)]
        prompts = "\n".join(
            message["content"] for request in llm_stub.requests for message in request.messages
        )
        # the model saw every exchange: each user message and each answer
        assert {n for n in range(200) if f"flood message {n:03d}." in prompts} == set(range(200))
        answered = {n for n in range(200) if f"Answer to flood message {n:03d}." in prompts}
        assert answered == set(range(200))


async def test_a_concurrent_flood_puts_every_turn_in_exactly_one_job(
    quota_app: QuotaAppFactory, auth: AuthFactory
) -> None:
    """Turn-saves of one user in flight together may all read the count below the quota
    before any of them has written: each of those adds a job, so the user's waiting jobs reach
    at most the quota plus the turn-saves in flight (here 8 lanes); every other turn is
    coalesced, and every turn is in exactly one job."""
    lanes, turns = 8, 160
    gate = asyncio.Semaphore(lanes)

    async def one(n: int) -> Any:
        async with gate:
            return await queued(client, auth, f"turn {n}", chat=f"chat-{n % lanes}")

    async with quota_app(quota_user_queued_jobs=10, quota_job_max_turns=40) as (app, client):
        answers = await asyncio.gather(*(one(n) for n in range(turns)))

        jobs = await consolidation_jobs(app, "alice")
        assert 10 <= len(jobs) <= 10 + lanes - 1
        where = turn_to_job(jobs)
        assert sorted(where) == sorted(a["turn_id"] for a in answers)
        for answer in answers:
            assert uuid.UUID(answer["consolidation"]["job_id"]) == where[answer["turn_id"]]


async def test_when_every_waiting_job_is_full_the_turn_is_refused_and_nothing_is_saved(
    quota_app: QuotaAppFactory, auth: AuthFactory
) -> None:
    async with quota_app(quota_user_queued_jobs=2, quota_job_max_turns=2) as (app, client):
        for n in range(4):
            await queued(client, auth, f"turn {n}")

        response = await post_turn(client, auth, "one too many", key="k-full")

        assert response.status_code == 409
        assert response.headers["content-type"] == "application/problem+json"
        assert response.headers["retry-after"] == "60"
        problem = response.json()
        assert problem["type"].endswith("quota-exceeded")
        assert "user_queued_jobs" in problem["detail"]
        assert await scalar(app, "SELECT count(*) FROM turns") == 4
        assert await scalar(app, "SELECT count(*) FROM chat_messages") == 8
        assert await scalar(app, "SELECT count(*) FROM idempotency_keys") == 0
        # another user of the company is not affected
        bob = await queued(client, auth, "bob's first", sub="bob")
        bob_jobs = await consolidation_jobs(app, "bob")
        assert [job.id for job in bob_jobs] == [uuid.UUID(bob["consolidation"]["job_id"])]


async def test_a_replayed_coalesced_turn_answers_the_same_and_saves_nothing_twice(
    quota_app: QuotaAppFactory, auth: AuthFactory
) -> None:
    async with quota_app(quota_user_queued_jobs=1) as (app, client):
        first = await queued(client, auth, "first")
        second = await queued(client, auth, "second", key="k-2")
        replay = await post_turn(client, auth, "second", key="k-2")

        assert second["consolidation"]["job_id"] == first["consolidation"]["job_id"]
        assert replay.status_code == 202
        assert replay.json() == second
        (job,) = await consolidation_jobs(app, "alice")
        assert job_turn_ids(job.payload) == [first["turn_id"], second["turn_id"]]
        assert await scalar(app, "SELECT count(*) FROM turns") == 2


async def test_a_turn_whose_job_is_claimed_during_its_write_gets_a_job_of_its_own(
    quota_app: QuotaAppFactory, auth: AuthFactory, database_url: str
) -> None:
    """The claim holds the chosen job's row when the turn's write reaches it; once the claim
    commits the job runs, so the write appends nothing, writes nothing, and the turn is
    planned again: the quota is no longer reached, and it gets a job of its own."""
    async with quota_app(quota_user_queued_jobs=1) as (app, client):
        first = await queued(client, auth, "first")
        target = uuid.UUID(first["consolidation"]["job_id"])
        engine = database_of(app).engine
        async with engine.connect() as claim:
            transaction = await claim.begin()
            await claim.execute(  # what a claim does to the job, not yet committed
                text(
                    "UPDATE jobs SET status = 'running', attempts = attempts + 1,"
                    " lease_expires_at = now() + interval '1 minute' WHERE id = :id"
                ),
                {"id": target},
            )
            saving = asyncio.create_task(post_turn(client, auth, "second"))

            async def write_waits_for_the_claim() -> bool:
                waiting: int = await scalar(
                    app,
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                    " AND wait_event_type = 'Lock' AND query LIKE '%UPDATE jobs cj%'",
                )
                return waiting == 1

            await wait_for(write_waits_for_the_claim, seconds=10)
            await transaction.commit()
        response = await saving

        assert response.status_code == 202, response.text
        second = response.json()
        own = uuid.UUID(second["consolidation"]["job_id"])
        assert own != target
        jobs = {job.id: job for job in await consolidation_jobs(app, "alice")}
        assert job_turn_ids(jobs[target].payload) == [first["turn_id"]]
        assert job_turn_ids(jobs[own].payload) == [second["turn_id"]]
        assert await scalar(app, "SELECT count(*) FROM turns") == 2
        assert await scalar(app, "SELECT count(*) FROM chat_messages") == 4
