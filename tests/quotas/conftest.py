"""What the quota tests share: an app of their own with the quotas under test and no rate
limits (a flood must reach the quotas, not the limiter), memory on for the company, and the
jobs and payloads read back."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from tests.helpers.apps import COMPANY, AuthFactory, app_with, client_of
from tests.helpers.db import rows
from tests.helpers.settings import enable_company

NO_RATE_LIMITS = {
    f"rate_limit_{route}_{scope}": "off"
    for route in ("turns", "consolidations", "memory_writes", "context")
    for scope in ("user", "company")
}

QuotaApp = tuple[FastAPI, httpx.AsyncClient]
QuotaAppFactory = Callable[..., AbstractAsyncContextManager[QuotaApp]]


@pytest.fixture
def quota_app(database_url: str, auth: AuthFactory) -> QuotaAppFactory:
    """`async with quota_app(quota_user_queued_jobs=3) as (app, client)`: an app with those
    settings, no rate limits, the worker stopped, memory on for `COMPANY`."""

    @asynccontextmanager
    async def factory(**settings: Any) -> AsyncIterator[QuotaApp]:
        async with (
            app_with(database_url, **NO_RATE_LIMITS, **settings) as app,
            client_of(app) as client,
        ):
            await enable_company(client, auth, COMPANY)
            yield app, client

    return factory


def job_turn_ids(payload: dict[str, Any]) -> list[str]:
    """Every turn id a consolidation job's payload names (`turn_id`, then `turn_ids`)."""
    first = [payload["turn_id"]] if payload.get("turn_id") else []
    return first + list(payload.get("turn_ids") or [])


async def consolidation_jobs(app: FastAPI, user: str, company: str = COMPANY) -> list[Any]:
    """The user's consolidation jobs, oldest first: id, status, payload."""
    return await rows(
        app,
        "SELECT id, status, payload FROM jobs WHERE company_id = :c AND user_id = :u"
        " AND kind = 'consolidation' ORDER BY created_at, id",
        c=company,
        u=user,
    )


def turn_to_job(jobs: list[Any]) -> dict[str, uuid.UUID]:
    """Each turn id to the one job naming it; fails when a turn is in two jobs."""
    found: dict[str, uuid.UUID] = {}
    for job in jobs:
        for turn_id in job_turn_ids(job.payload):
            assert turn_id not in found, f"turn {turn_id} is in two jobs"
            found[turn_id] = job.id
    return found
