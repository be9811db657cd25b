"""The job routes over HTTP: a user sees only their own jobs; operators list a company's jobs
(filtered, paged, without payloads) and send dead jobs back to the queue."""

from __future__ import annotations

import uuid

import httpx
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from app.jobs.lifecycle import AttemptFailure, complete_jobs, fail_jobs
from tests.helpers.apps import OPERATOR, AuthFactory
from tests.helpers.jobs import claim_one, enqueue

SECRET_PAYLOAD = {"turn_ids": ["turn-secret-id"], "space_id": "space-1"}  # never listed


async def kill(engine: AsyncEngine) -> uuid.UUID:
    """Claim the next job and dead-letter it."""
    claimed = await claim_one(engine, batch_size=1, coalesce=())
    result = await fail_jobs(
        engine,
        claimed,
        AttemptFailure("MalformedOutput", "The model output was not valid JSON.", False),
    )
    assert result == "dead"
    return claimed.jobs[0].id


async def test_a_user_polls_their_own_job(
    client: httpx.AsyncClient,
    auth: AuthFactory,
    engine: AsyncEngine,
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    [job_id] = await enqueue(sessions, max_attempts=3, payload=SECRET_PAYLOAD)
    response = await client.get(f"/v1/jobs/{job_id}", headers=auth("alice"))
    assert response.status_code == 200
    assert response.json() == {
        "id": str(job_id),
        "status": "queued",
        "outcome": None,
        "version": None,
        "attempts": 0,
        "error": None,
    }

    claimed = await claim_one(engine, batch_size=1, coalesce=())
    async with engine.begin() as conn:
        assert await complete_jobs(conn, claimed, outcome="updated", version=4)
    done = (await client.get(f"/v1/jobs/{job_id}", headers=auth("alice"))).json()
    assert (done["status"], done["outcome"], done["version"], done["attempts"]) == (
        "succeeded",
        "updated",
        4,
        1,
    )


async def test_a_dead_job_shows_its_error_class_and_message(
    client: httpx.AsyncClient,
    auth: AuthFactory,
    engine: AsyncEngine,
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    await enqueue(sessions, max_attempts=3, payload=SECRET_PAYLOAD)
    job_id = await kill(engine)
    body = (await client.get(f"/v1/jobs/{job_id}", headers=auth("alice"))).json()
    assert body["status"] == "dead"
    assert body["error"] == {
        "class": "MalformedOutput",
        "message": "The model output was not valid JSON.",
    }


@pytest.mark.parametrize(
    "caller",
    [("bob", "acme", ()), ("alice", "other-co", ()), ("olga", "acme", OPERATOR)],
    ids=["another user", "same name in another company", "an operator"],
)
async def test_nobody_else_sees_a_users_job(
    client: httpx.AsyncClient,
    auth: AuthFactory,
    sessions: async_sessionmaker[AsyncSession],
    caller: tuple[str, str, tuple[str, ...]],
) -> None:
    [job_id] = await enqueue(sessions, max_attempts=3, payload=SECRET_PAYLOAD)
    response = await client.get(f"/v1/jobs/{job_id}", headers=auth(*caller))
    assert response.status_code == 404
    assert response.headers["content-type"] == "application/problem+json"


@pytest.mark.parametrize("job_id", ["not-a-uuid", "5b0c9a53-3a4e-4d39-9a43-0c3f3f9e27d1"])
async def test_an_invalid_or_unknown_job_id_is_404(
    client: httpx.AsyncClient, auth: AuthFactory, job_id: str
) -> None:
    response = await client.get(f"/v1/jobs/{job_id}", headers=auth("alice"))
    assert response.status_code == 404


async def test_operators_list_one_companys_jobs_without_payloads(
    client: httpx.AsyncClient,
    auth: AuthFactory,
    engine: AsyncEngine,
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    [alice_job] = await enqueue(sessions, "alice", max_attempts=3, payload=SECRET_PAYLOAD)
    [bob_job] = await enqueue(sessions, "bob", max_attempts=3, payload=SECRET_PAYLOAD)
    [foreign] = await enqueue(
        sessions, "alice", company="other-co", max_attempts=3, payload=SECRET_PAYLOAD
    )

    response = await client.get("/v1/companies/acme/jobs", headers=auth("olga", "ops", OPERATOR))
    assert response.status_code == 200
    body = response.json()
    assert body["next_cursor"] is None
    assert [item["id"] for item in body["items"]] == [str(bob_job), str(alice_job)]
    assert str(foreign) not in response.text
    assert "turn-secret-id" not in response.text  # no payload
    assert set(body["items"][0]) == {
        "id",
        "user_id",
        "kind",
        "status",
        "attempts",
        "max_attempts",
        "error",
        "created_at",
        "updated_at",
    }
    other = await client.get("/v1/companies/other-co/jobs", headers=auth("olga", "ops", OPERATOR))
    assert [item["id"] for item in other.json()["items"]] == [str(foreign)]


async def test_the_status_filter_shows_the_dead_letters(
    client: httpx.AsyncClient,
    auth: AuthFactory,
    engine: AsyncEngine,
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    await enqueue(sessions, "alice", max_attempts=3, payload=SECRET_PAYLOAD)
    dead = await kill(engine)
    [queued] = await enqueue(sessions, "bob", max_attempts=3, payload=SECRET_PAYLOAD)
    headers = auth("olga", "ops", OPERATOR)

    dead_only = await client.get("/v1/companies/acme/jobs?status=dead", headers=headers)
    [item] = dead_only.json()["items"]
    assert (item["id"], item["status"], item["attempts"], item["max_attempts"]) == (
        str(dead),
        "dead",
        1,
        3,
    )
    assert item["error"]["class"] == "MalformedOutput"
    queued_only = await client.get("/v1/companies/acme/jobs?status=queued", headers=headers)
    assert [i["id"] for i in queued_only.json()["items"]] == [str(queued)]

    invalid = await client.get("/v1/companies/acme/jobs?status=lost", headers=headers)
    assert invalid.status_code == 422
    assert invalid.json()["errors"][0]["field"] == "query.status"


async def test_the_listing_pages_newest_first(
    client: httpx.AsyncClient, auth: AuthFactory, sessions: async_sessionmaker[AsyncSession]
) -> None:
    created = [
        job_id
        for n in range(5)
        for job_id in await enqueue(sessions, f"user-{n}", max_attempts=3, payload=SECRET_PAYLOAD)
    ]
    headers = auth("olga", "ops", OPERATOR)
    seen: list[str] = []
    pages = 0
    cursor: str | None = None
    while True:
        params = {"limit": "2"} | ({"cursor": cursor} if cursor else {})
        response = await client.get("/v1/companies/acme/jobs", params=params, headers=headers)
        assert response.status_code == 200
        body = response.json()
        pages += 1
        seen += [item["id"] for item in body["items"]]
        cursor = body["next_cursor"]
        if cursor is None:
            break
    assert pages == 3
    assert seen == [str(job_id) for job_id in reversed(created)]

    tampered = await client.get(
        "/v1/companies/acme/jobs", params={"cursor": "e30"}, headers=headers
    )  # "{}"
    assert tampered.status_code == 422


async def test_an_operator_retries_a_dead_job(
    client: httpx.AsyncClient,
    auth: AuthFactory,
    engine: AsyncEngine,
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    await enqueue(sessions, "alice", max_attempts=3, payload=SECRET_PAYLOAD)
    dead = await kill(engine)
    [queued] = await enqueue(sessions, "bob", max_attempts=3, payload=SECRET_PAYLOAD)
    headers = auth("olga", "ops", OPERATOR)

    response = await client.post(f"/v1/companies/acme/jobs/{dead}/retry", headers=headers)
    assert response.status_code == 200
    body = response.json()
    assert (body["id"], body["status"], body["attempts"], body["error"]) == (
        str(dead),
        "queued",
        0,
        None,
    )
    again = await claim_one(engine, batch_size=1, coalesce=())
    assert again.jobs[0].id == dead

    # queued after that claim: a company never served would be claimed first
    [foreign] = await enqueue(
        sessions, "carol", company="other-co", max_attempts=3, payload=SECRET_PAYLOAD
    )
    not_dead = await client.post(f"/v1/companies/acme/jobs/{queued}/retry", headers=headers)
    assert not_dead.status_code == 409
    assert not_dead.json()["type"] == "urn:context-memory:problem:conflict"
    assert not_dead.json()["retryable"] is False
    assert "retry-after" not in not_dead.headers
    for path in (
        f"/v1/companies/acme/jobs/{foreign}/retry",
        f"/v1/companies/acme/jobs/{uuid.uuid4()}/retry",
        "/v1/companies/acme/jobs/not-a-uuid/retry",
    ):
        assert (await client.post(path, headers=headers)).status_code == 404


async def test_a_plain_user_may_not_retry(
    client: httpx.AsyncClient,
    auth: AuthFactory,
    engine: AsyncEngine,
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    await enqueue(sessions, "alice", max_attempts=3, payload=SECRET_PAYLOAD)
    dead = await kill(engine)
    response = await client.post(f"/v1/companies/acme/jobs/{dead}/retry", headers=auth("alice"))
    assert response.status_code == 403


@pytest.mark.parametrize(
    "route", ["GET /jobs", "POST /jobs/00000000-0000-4000-8000-000000000000/retry"]
)
async def test_an_overlong_company_id_is_a_422_naming_it_and_changes_nothing(
    client: httpx.AsyncClient,
    auth: AuthFactory,
    engine: AsyncEngine,
    sessions: async_sessionmaker[AsyncSession],
    route: str,
) -> None:
    """The jobs routes take `company_id` with the limits of every operator route (1–128)."""
    await enqueue(sessions, "alice", max_attempts=3, payload=SECRET_PAYLOAD)
    dead = await kill(engine)
    headers = auth("olga", "ops", OPERATOR)
    method, suffix = route.split()
    response = await client.request(method, f"/v1/companies/{'a' * 129}{suffix}", headers=headers)
    assert response.status_code == 422
    assert response.json()["errors"][0]["field"] == "path.company_id"
    listed = await client.get("/v1/companies/acme/jobs?status=dead", headers=headers)
    assert [item["id"] for item in listed.json()["items"]] == [str(dead)]
