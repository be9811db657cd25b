"""The consolidation pipeline end to end with the offline rule engine, on real PostgreSQL: turns
saved over HTTP, jobs run by the worker, versions read back over HTTP and SQL."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import httpx
import pytest
from fastapi import FastAPI

from app.consolidation.kinds import COALESCING
from app.jobs.queue import ClaimPolicy, claim_next_job
from app.profiles.document import parse
from tests.helpers.apps import SPACE, USER, AuthFactory
from tests.helpers.db import database_of, rows
from tests.helpers.jobs import job_row
from tests.helpers.memory import put_memory, versions
from tests.helpers.metrics import sample
from tests.helpers.profiles import bullets
from tests.helpers.settings import enable_company, patch_space
from tests.helpers.turns import queue_turn
from tests.helpers.worker import make_handler, make_worker


@pytest.fixture
async def memory_on(client: httpx.AsyncClient, auth: AuthFactory) -> None:
    await enable_company(client, auth)


@pytest.mark.usefixtures("memory_on")
async def test_a_self_statement_becomes_a_new_version_with_identity_bullets(
    app: FastAPI, client: httpx.AsyncClient, auth: AuthFactory
) -> None:
    job_id = await queue_turn(client, auth, "I work as a data engineer at Acme")
    handler, metrics, _ = make_handler(app)

    claimed = await make_worker(app, handler, metrics).run_once()

    assert claimed is not None
    assert claimed.job_ids == [job_id]
    job = await job_row(app, job_id)
    assert (job.status, job.outcome, job.version) == ("succeeded", "updated", 1)
    (version,) = await versions(app)
    assert version.reason == "consolidation"
    assert version.model == "offline-rules"
    assert version.job_id == job_id
    assert len(version.source_turn_ids) == 1
    assert bullets(version.content, "Identity") == ["Works as a data engineer.", "Works at Acme."]
    assert len(bullets(version.content, "Recent Topics")) == 1
    assert [op["op"] for op in version.operations] == ["ADD", "ADD", "ADD"]
    profile = parse(version.content)
    assert profile.frontmatter.user_id == USER
    assert profile.frontmatter.turn_count == 1
    response = await client.get("/v1/me/memory", headers=auth(USER))
    assert response.status_code == 200
    assert response.json()["version"] == 1
    assert sample(metrics, "consolidations_total", result="updated") == 1


@pytest.mark.usefixtures("memory_on")
async def test_small_talk_is_a_noop_without_a_version(
    app: FastAPI, client: httpx.AsyncClient, auth: AuthFactory
) -> None:
    job_id = await queue_turn(client, auth, "thanks, that's all for today!")
    handler, metrics, _ = make_handler(app)

    await make_worker(app, handler, metrics).run_once()

    job = await job_row(app, job_id)
    assert (job.status, job.outcome, job.version) == ("succeeded", "noop", None)
    assert await versions(app) == []
    assert sample(metrics, "consolidations_total", result="noop") == 1


@pytest.mark.usefixtures("memory_on")
async def test_turns_queued_while_one_runs_are_consolidated_together_in_order(
    app: FastAPI, client: httpx.AsyncClient, auth: AuthFactory
) -> None:
    first = await queue_turn(client, auth, "I work as a data engineer at Acme")
    second = await queue_turn(client, auth, "Actually I work as a platform engineer at Acme now")
    handler, metrics, _ = make_handler(app)

    claimed = await make_worker(app, handler, metrics).run_once()

    assert claimed is not None
    assert claimed.job_ids == [first, second]
    (version,) = await versions(app)  # one version for both turns
    assert len(version.source_turn_ids) == 2
    identity = " ".join(bullets(version.content, "Identity")).lower()
    assert "platform engineer" in identity  # the newest statement wins
    assert "data engineer" not in identity
    for job_id in (first, second):
        assert (await job_row(app, job_id)).version == 1


@pytest.mark.usefixtures("memory_on")
async def test_memory_switched_off_for_the_space_after_queueing_writes_nothing(
    app: FastAPI, client: httpx.AsyncClient, auth: AuthFactory
) -> None:
    job_id = await queue_turn(client, auth, "I work as a data engineer at Acme")
    response = await patch_space(client, auth, SPACE, {"context_memory": False})
    assert response.status_code == 200, response.text
    handler, metrics, _ = make_handler(app)

    await make_worker(app, handler, metrics).run_once()

    job = await job_row(app, job_id)
    assert (job.status, job.outcome) == ("succeeded", "noop")
    assert await versions(app) == []


@pytest.mark.usefixtures("memory_on")
async def test_a_user_who_opted_out_meanwhile_gets_nothing_written(
    app: FastAPI, client: httpx.AsyncClient, auth: AuthFactory
) -> None:
    await queue_turn(client, auth, "I work as a data engineer at Acme")
    engine = database_of(app).engine
    claimed = await claim_next_job(engine, "w", ClaimPolicy(30, 10, frozenset(COALESCING)))
    assert claimed is not None
    response = await client.patch(
        "/v1/me/settings", json={"context_memory": False}, headers=auth(USER)
    )
    assert response.status_code == 200, response.text
    handler, _, _ = make_handler(app)

    outcome = await handler(claimed, asyncio.Event())

    assert outcome == "lease_lost"  # the opt-out deleted the running job: fenced out
    assert await versions(app) == []
    assert await rows(app, "SELECT 1 FROM memory_files WHERE user_id = :u", u=USER) == []


@pytest.mark.usefixtures("memory_on")
async def test_a_claim_whose_lease_was_taken_over_writes_nothing(
    app: FastAPI, client: httpx.AsyncClient, auth: AuthFactory
) -> None:
    job_id = await queue_turn(client, auth, "I work as a data engineer at Acme")
    engine = database_of(app).engine
    stale = await claim_next_job(engine, "a", ClaimPolicy(5, 10, frozenset(COALESCING)))
    later = datetime.now(UTC) + timedelta(seconds=30)
    taken_over = await claim_next_job(
        engine, "b", ClaimPolicy(60, 10, frozenset(COALESCING)), now=later
    )
    assert stale is not None
    assert taken_over is not None
    assert taken_over.job_ids == stale.job_ids
    handler, _, _ = make_handler(app)

    assert await handler(stale, asyncio.Event()) == "lease_lost"
    assert await versions(app) == []

    assert await handler(taken_over, asyncio.Event()) == "updated"
    assert [v.version for v in await versions(app)] == [1]
    assert (await job_row(app, job_id)).status == "succeeded"


FULL_PROFILE = """# User Memory

## Identity
- Works as a data engineer.
- Works at Acme.

## Communication Preferences
- Prefers concise answers.

## Work Context
- Migrating billing to Kafka.

## Skills & Expertise
- Knows Python.

## Recent Topics

## Open Questions / Follow-ups
"""


@pytest.mark.usefixtures("memory_on")
async def test_asking_to_forget_everything_may_empty_the_profile(
    app: FastAPI, client: httpx.AsyncClient, auth: AuthFactory
) -> None:
    await put_memory(client, auth, FULL_PROFILE)
    await queue_turn(client, auth, "Please forget everything you know about me")
    handler, metrics, _ = make_handler(app)

    await make_worker(app, handler, metrics).run_once()

    stored = await versions(app)
    assert [v.reason for v in stored] == ["user_edit", "consolidation"]
    assert all(not items for _, items in parse(stored[-1].content).sections)
    assert [op["op"] for op in stored[-1].operations] == ["DELETE"] * 5


@pytest.mark.usefixtures("memory_on")
async def test_a_turn_whose_chat_was_deleted_meanwhile_is_a_noop(
    app: FastAPI, client: httpx.AsyncClient, auth: AuthFactory
) -> None:
    job_id = await queue_turn(client, auth, "I work as a data engineer at Acme", chat_id="gone")
    response = await client.delete("/v1/chats/gone", headers=auth(USER))
    assert response.status_code == 204, response.text
    handler, metrics, _ = make_handler(app)

    await make_worker(app, handler, metrics).run_once()

    assert (await job_row(app, job_id)).outcome == "noop"
    assert await versions(app) == []


@pytest.mark.usefixtures("memory_on")
async def test_a_handler_told_its_lease_is_lost_writes_nothing(
    app: FastAPI, client: httpx.AsyncClient, auth: AuthFactory
) -> None:
    job_id = await queue_turn(client, auth, "I work as a data engineer at Acme")
    engine = database_of(app).engine
    claimed = await claim_next_job(engine, "w", ClaimPolicy(30, 10, frozenset(COALESCING)))
    assert claimed is not None
    lease_lost = asyncio.Event()
    lease_lost.set()  # what the worker's heartbeat does when the lease is gone
    handler, _, _ = make_handler(app)

    assert await handler(claimed, lease_lost) == "lease_lost"

    assert await versions(app) == []
    assert (await job_row(app, job_id)).status == "running"  # left for the lease to expire
