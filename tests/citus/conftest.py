"""The service on a real Citus cluster: a coordinator and two workers of the test run's own
(`tests/helpers/citus.py`), a database on it migrated and distributed as `python -m app migrate`
does, and the app connected to it as the service's role, whose sessions turn every statement that
reaches more than one shard into an error (`citus.multi_task_query_log_level = 'error'`).

One cluster per test process (under pytest-xdist, per worker that runs a file of this folder;
it takes a few seconds to start, three servers on two cores); the tests truncate the tables
after each test as everywhere else. Without Citus installed
(`.ci/install-citus`) every test here skips with the reason.

The fixtures below override the root conftest's `database_url`, `settings` and `app`, so that
every fixture built on them (`client`, `engine`, `sessions`, the table cleaning) works on the
cluster. `admin_url` is the same database as `postgres`, for the tests' own statements that read
across companies.
"""

from __future__ import annotations

import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from asgi_lifespan import LifespanManager
from fastapi import FastAPI

from app.kit.config import PROJECT_ROOT, Settings
from app.main import create_app
from tests.helpers.apps import make_settings
from tests.helpers.citus import CitusCluster, ClusterDatabase, cluster_database

DATABASE = "cms_citus"


@pytest.fixture(scope="session")
def cluster_dir() -> Iterator[Path]:
    (PROJECT_ROOT / "var").mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(dir=PROJECT_ROOT / "var", prefix="citus-") as tmp:
        yield Path(tmp)


@pytest.fixture(scope="session")
async def cluster_db(cluster_dir: Path) -> AsyncIterator[ClusterDatabase]:
    async with cluster_database(cluster_dir, DATABASE) as running:
        yield running


@pytest.fixture(scope="session")
def cluster(cluster_db: ClusterDatabase) -> CitusCluster:
    return cluster_db.cluster


@pytest.fixture(scope="session")
def admin_url(cluster_db: ClusterDatabase) -> str:
    """The test database on the coordinator, as `postgres`: migrated and distributed."""
    return cluster_db.admin_url


@pytest.fixture(scope="session")
def database_url(cluster_db: ClusterDatabase) -> str:
    """The service's URL: the same database as the service's role."""
    return cluster_db.url


@pytest.fixture(scope="session")
def settings(database_url: str) -> Settings:
    return make_settings(database_url)


@pytest.fixture(scope="session")
async def app(settings: Settings) -> AsyncIterator[FastAPI]:
    application = create_app(settings)
    async with LifespanManager(application):
        yield application
