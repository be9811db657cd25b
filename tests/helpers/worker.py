"""The consolidation worker in a test: its handler and worker built on the test app (with metrics
of their own), and polling until something the worker does has happened."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from fastapi import FastAPI

from app.config import Settings
from app.consolidation.kinds import COALESCING, KINDS
from app.consolidation.pipeline import make_consolidation_handler
from app.jobs.worker import JobHandler, Worker, WorkerConfig
from app.llm import ChatModel
from app.observability import Metrics
from tests.helpers.apps import make_settings
from tests.helpers.db import database_of


def make_handler(
    app: FastAPI, chat_model: ChatModel | None = None, **overrides: Any
) -> tuple[JobHandler, Metrics, Settings]:
    """The consolidation handler on the app's database, with the app's settings or, given
    `overrides`, settings built from them."""
    settings: Settings = app.state.settings
    if overrides:
        settings = make_settings(str(settings.database_url), **overrides)
    metrics = Metrics()
    tokens = app.state.tokens
    handler = make_consolidation_handler(database_of(app), settings, chat_model, metrics, tokens)
    return handler, metrics, settings


def make_worker(
    app: FastAPI,
    handler: JobHandler,
    metrics: Metrics,
    *,
    concurrency: int = 1,
    batch_size: int = 10,
    lease_seconds: float = 30,
) -> Worker:
    config = WorkerConfig(
        concurrency=concurrency,
        poll_seconds=0.05,
        lease_seconds=lease_seconds,
        batch_size=batch_size,
        shutdown_grace_seconds=5,
        coalesce=COALESCING,
        worker_id="test-worker",
    )
    return Worker(database_of(app).engine, dict.fromkeys(KINDS, handler), config, metrics)


async def wait_for(condition: Callable[[], Awaitable[bool]], seconds: float = 30.0) -> None:
    """Poll an async predicate until it holds."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if await condition():
            return
        await asyncio.sleep(0.05)
    pytest.fail("condition not met in time")
