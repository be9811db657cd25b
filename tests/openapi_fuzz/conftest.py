"""The app schemathesis serves in this directory's runs: one per test, the worker on."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from fastapi import FastAPI
from schemathesis.python import asgi

from app.main import create_app
from tests.helpers.apps import make_settings


@pytest.fixture
async def fuzzed_app(database_url: str, tmp_path: Path) -> AsyncIterator[FastAPI]:
    """An app of its own with the worker on (so `wait=true` finishes): schemathesis serves it,
    lifespan included, from its own event loop thread. The fuzzer soon meets the rate limits:
    a refused request is answered at once (the 429 is what is checked, not the pause that
    slows a retrying client, tests/rate_limits), and the worker looks for jobs every 50 ms
    rather than every second, so that `wait=true` does not wait for its poll. Both waits were
    most of the run's time: ~100 s of wall time per principal for ~30 s of CPU."""
    settings = make_settings(
        database_url,
        worker_enabled=True,
        worker_heartbeat_file=tmp_path / "heartbeat",
        worker_poll_seconds=0.05,
        rate_limit_refusal_delay_seconds=0,
    )
    try:
        yield create_app(settings)
    finally:
        asgi.shutdown_lifespans()
