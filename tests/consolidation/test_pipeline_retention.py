"""Retention in the worker's write: a consolidation that stores a version prunes the versions
beyond `memory_max_versions` in the same transaction, as a user's edit does."""

from __future__ import annotations

import httpx
from fastapi import FastAPI

from tests.helpers.apps import AuthFactory
from tests.helpers.jobs import job_row
from tests.helpers.memory import versions
from tests.helpers.settings import enable_company
from tests.helpers.turns import queue_turn
from tests.helpers.worker import make_handler, make_worker

STATEMENTS = ("I work at Acme Corp.", "My name is Anna Müller.", "I'm an actuary.")


async def test_each_consolidation_keeps_only_the_newest_versions(
    app: FastAPI, client: httpx.AsyncClient, auth: AuthFactory
) -> None:
    await enable_company(client, auth)
    handler, metrics, _ = make_handler(app, memory_max_versions=2)
    jobs = []
    for statement in STATEMENTS:
        jobs.append(await queue_turn(client, auth, statement))
        await make_worker(app, handler, metrics).run_once()

    assert [(await job_row(app, job)).version for job in jobs] == [1, 2, 3]
    assert [version.version for version in await versions(app)] == [2, 3]
    response = await client.get("/v1/me/memory", headers=auth())
    assert response.json()["version"] == 3
