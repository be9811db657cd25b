"""Turn-saves racing an erasure: once `DELETE /v1/me` has committed, every turn the orchestrator
saved is either gone whole (turn, messages, job) or there whole, and a turn that is there is a
fresh start that the worker consolidates like any other."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from tests.helpers.apps import COMPANY, USER, AuthFactory
from tests.helpers.db import rows
from tests.helpers.settings import enable_company
from tests.helpers.turns import queue_turn, save_turn, user
from tests.helpers.worker import make_handler, make_worker

ROUNDS = 10
TURNS = 24
CHATS = 4


@dataclass(frozen=True)
class Saved:
    turn_id: str
    job_id: str
    fact: str  # the bullet the offline rules make of the turn


@dataclass(frozen=True)
class Race:
    saved: tuple[Saved, ...]
    erasure: dict[str, Any]


async def race_turn_saves_with_an_erasure(
    client: httpx.AsyncClient, auth: AuthFactory, turns: int = TURNS
) -> Race:
    """`turns` queued turn-saves over `CHATS` chats, all in flight, and one erasure of their
    user sent while the first of them are being written."""

    async def save(n: int) -> Saved:
        await asyncio.sleep(n * 0.001)  # spread the writes over the erasure's statements
        response = await save_turn(
            client, auth, f"chat-{n % CHATS}", [user(f"I know Zig{n}.")], "Noted."
        )
        assert response.status_code == 202, response.text
        body = response.json()
        return Saved(body["turn_id"], body["consolidation"]["job_id"], f"Knows Zig{n}.")

    async def erase() -> dict[str, Any]:
        await asyncio.sleep(0.004)
        response = await client.delete("/v1/me", headers=auth())
        assert response.status_code == 200, response.text
        erasure: dict[str, Any] = response.json()
        return erasure

    erasure = asyncio.create_task(erase())
    saved = await asyncio.gather(*(save(n) for n in range(turns)))
    return Race(tuple(saved), await erasure)


async def stored_turns(app: FastAPI) -> dict[str, Any]:
    """What is stored of the user: turns, messages per turn, jobs with each turn they name (past
    the quota of waiting jobs, turns are coalesced into a job's `turn_ids`), keyed by both."""
    params = {"c": COMPANY, "u": USER}
    where = "company_id = :c AND user_id = :u"
    turns = {str(r.id) for r in await rows(app, f"SELECT id FROM turns WHERE {where}", **params)}  # noqa: S608
    messages = {
        str(r.turn_id): r.n
        for r in await rows(
            app,
            f"SELECT turn_id, count(*) AS n FROM chat_messages WHERE {where} GROUP BY turn_id",  # noqa: S608
            **params,
        )
    }
    jobs = {
        f"{r.id}:{r.turn_id}": r
        for r in await rows(
            app,
            "SELECT id, named.turn_id, status, outcome, error_class FROM jobs"  # noqa: S608
            " CROSS JOIN LATERAL (SELECT payload->>'turn_id' UNION ALL SELECT"
            " jsonb_array_elements_text(coalesce(payload->'turn_ids', '[]'))) named(turn_id)"
            f" WHERE {where} AND named.turn_id IS NOT NULL",
            **params,
        )
    }
    return {"turns": turns, "messages": messages, "jobs": jobs}


async def drain(app: FastAPI) -> None:
    """Run the worker (offline rules) until no job is left to claim."""
    handler, metrics, _ = make_handler(app)
    worker = make_worker(app, handler, metrics)
    while await worker.run_once() is not None:
        pass


async def assert_each_turn_whole(app: FastAPI, race: Race, before: int) -> set[str]:
    """Each saved turn gone whole or there whole; nothing left that names a missing turn; the
    erasure's counts say what went. Returns the ids of the turns that are there."""
    found = await stored_turns(app)
    kept = {s.turn_id for s in race.saved if s.turn_id in found["turns"]}
    gone = [s for s in race.saved if s.turn_id not in kept]
    assert found["turns"] == kept, "a turn the erasure should have deleted (or nobody saved)"
    assert set(found["messages"]) == kept, "messages without their turn, or a turn without them"
    assert all(n == 2 for n in found["messages"].values())
    jobs_by_turn = {job.turn_id: str(job.id) for job in found["jobs"].values()}
    assert set(jobs_by_turn) == kept, (
        f"{len(set(jobs_by_turn) - kept)} jobs of deleted turns left, "
        f"{len(kept - set(jobs_by_turn))} kept turns without their job"
    )
    for s in race.saved:
        if s.turn_id in kept:
            assert jobs_by_turn[s.turn_id] == s.job_id
    deleted = race.erasure["deleted"]
    assert deleted["turns"] == before + len(gone)
    assert deleted["messages"] == 2 * (before + len(gone))
    assert deleted["jobs"] == before + len({s.job_id for s in gone})
    return kept


async def assert_consolidated(app: FastAPI, race: Race, kept: set[str]) -> None:
    """Every kept turn's job ran to a version that names the turn and holds its fact."""
    await drain(app)
    jobs = (await stored_turns(app))["jobs"]
    assert {(job.status, job.error_class) for job in jobs.values()} <= {("succeeded", None)}
    versions = await rows(
        app,
        "SELECT source_turn_ids, content FROM memory_versions"
        " WHERE company_id = :c AND user_id = :u ORDER BY version",
        c=COMPANY,
        u=USER,
    )
    sources = {turn for v in versions for turn in v.source_turn_ids}
    assert kept <= sources, f"{len(kept - sources)} turns saved after the erasure not consolidated"
    head = versions[-1].content if versions else ""
    assert all(s.fact in head for s in race.saved if s.turn_id in kept)


@pytest.mark.parametrize("round_", range(ROUNDS))
async def test_turn_saves_racing_an_erasure_are_gone_whole_or_kept_and_consolidated(
    app: FastAPI, client: httpx.AsyncClient, auth: AuthFactory, round_: int
) -> None:
    """After the erasure commits: no job, message or turn of a deleted turn, every kept turn
    with its messages and its job, and the worker consolidates the kept turns (their user starts
    from nothing: the first of them makes the memory folder again)."""
    await enable_company(client, auth)
    await queue_turn(client, auth, "I work as a data engineer.")

    race = await race_turn_saves_with_an_erasure(client, auth)

    kept = await assert_each_turn_whole(app, race, before=1)
    await assert_consolidated(app, race, kept)
