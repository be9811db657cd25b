"""The app schemathesis serves in this directory's runs: one per test, the worker on."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from fastapi import FastAPI

from tests.helpers.openapi_fuzz import served_app


@pytest.fixture
async def fuzzed_app(database_url: str, tmp_path: Path) -> AsyncIterator[FastAPI]:
    async for app in served_app(database_url, tmp_path):
        yield app
