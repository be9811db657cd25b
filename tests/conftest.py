"""Shared fixtures: a real PostgreSQL database built by the migrations, the app with its
lifespan run, an HTTP client over ASGI, and a token factory.

The database is `TEST_DATABASE_URL` or `DATABASE_URL` when set, otherwise the embedded
PostgreSQL in `var/test-pg`. Each test run gets a fresh database; each test starts from empty
tables (truncated after every test), so tests can commit for real and run concurrently.

Under pytest-xdist (`make test` runs `-n auto`) each worker is a process of its own with a
database of its own, named after the run and the worker (`cms_test_<run>_gw0`), on the one
server: the embedded PostgreSQL is shared by the workers (pgserver lets several processes use
one data directory; the last one out stops it). What a test makes beyond its database is named
at random or bound to a port the kernel picks, and what it reads of the server (pg_locks,
pg_stat_activity) it filters by its own database, so two workers never meet.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from asgi_lifespan import LifespanManager
from fastapi import FastAPI
from sqlalchemy import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from app.kit.auth.mint import issue_token
from app.kit.config import PROJECT_ROOT, Settings, to_asyncpg_url
from app.kit.db.migrations import run_migrations
from app.kit.embedded_pg import EmbeddedPostgres
from app.kit.principal import Principal
from app.main import create_app
from app.models import metadata
from tests.helpers import db
from tests.helpers.apps import AuthFactory, TokenFactory, client_of, make_settings
from tests.helpers.citus import cluster_database
from tests.helpers.db import admin_execute
from tests.helpers.llm_stub import (  # noqa: F401 - the `llm_stub` and `chat_model` fixtures
    chat_model_fixture,
    llm_stub_fixture,
)
from tests.helpers.on_citus import ON_CITUS

# records the service's SQL statements for tests/test_statement_routing.py (run last)
pytest_plugins = ("tests.helpers.statement_log",)

# Under pytest-xdist each test file runs whole on one worker, the files handed out in the order
# collected (`make test` passes --no-loadscope-reorder): these, the longest, go first (longest
# first), so that no worker is left with one of them while the other has nothing to do. Any
# other file keeps its place after them. Measured on the 2-core machine with both workers busy:
# the API fuzzed by schemathesis ~5 min (one file per principal, so ~100 s each), each of the
# others 15 to 65 s.
LONGEST_FILES = (
    "tests/openapi_fuzz/test_fuzz_as_user.py",
    "tests/openapi_fuzz/test_fuzz_as_space_admin.py",
    "tests/openapi_fuzz/test_fuzz_as_operator.py",
    "tests/test_serve_slow_clients.py",
    "tests/test_eval_policy.py",
    "tests/profiles/test_disguised_values.py",
    "tests/test_serve_workers.py",
    "tests/browser/test_memory_page.py",
    "tests/consolidation/test_worker_faults.py",
    "tests/consolidation/test_worker_runs.py",
    "tests/rate_limits/test_flood.py",
    "tests/test_serve_export_flood.py",
    "tests/client/test_typescript_client.py",
    "tests/test_failover.py",
    "tests/test_eval.py",
    "tests/test_serve_credentials.py",
    "tests/consolidation/test_pipeline_model.py",
    "tests/test_serve_logs.py",
    "tests/profiles/test_memory_export_load.py",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On a Citus cluster (TEST_CITUS=1): only the tests that use the database (the
    `database_url` fixture, directly or through `app`, `client`, `engine`, ...); the others,
    parsers and rules, run alike anywhere, and `make test` ran them already. On an xdist
    worker: the longest files first (a stable sort: each file's tests, and the files not
    named, keep their order). Every worker selects and sorts alike, as xdist requires."""
    if ON_CITUS:
        apart = [item for item in items if "database_url" not in _fixtures_of(item)]
        if apart:
            config.hook.pytest_deselected(items=apart)
            items[:] = [item for item in items if "database_url" in _fixtures_of(item)]
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    rank = {path: n for n, path in enumerate(LONGEST_FILES)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(rank)))


CITUS_SHARDS = 4
"""Shards a table on the suites' cluster (TEST_CITUS=1): two on each worker, so a statement
that reads every company still reaches several shards (and fails as the service's role) on
either node, while the TRUNCATE after every test locks 88 shards, not the 704 of Citus's
default 32 (~0.15 s a test against ~0.8 s, most of the run's time)."""


def _fixtures_of(item: pytest.Item) -> tuple[str, ...]:
    return tuple(getattr(item, "fixturenames", ()))


@pytest.fixture(scope="session")
def server_url() -> Iterator[str]:
    """A `postgresql+asyncpg://` URL of a server we may create databases on."""
    configured = os.environ.get("TEST_DATABASE_URL") or os.environ.get("DATABASE_URL")
    if configured:
        yield to_asyncpg_url(configured)
        return
    embedded = EmbeddedPostgres(PROJECT_ROOT / "var" / "test-pg")
    try:
        yield to_asyncpg_url(embedded.start())
    finally:
        embedded.stop()


@pytest.fixture(scope="session")
async def database_url(server_url: str) -> AsyncIterator[str]:
    """A fresh database for this test run (for this worker of it), migrated to head by Alembic.
    With TEST_CITUS=1, on a Citus cluster of the run's own instead, distributed, as the
    service's role that turns multi-shard statements into errors (tests/helpers/citus.py): how
    a suite is tried on the cluster (`TEST_CITUS=1 pytest tests/turns`)."""
    name = _database_name()
    if ON_CITUS:
        (PROJECT_ROOT / "var").mkdir(exist_ok=True)
        with tempfile.TemporaryDirectory(dir=PROJECT_ROOT / "var", prefix="citus-") as tmp:
            async with _cluster_of_the_run(Path(tmp), name) as url:
                yield url
        return
    await admin_execute(server_url, f'CREATE DATABASE "{name}"')
    url = make_url(server_url).set(database=name).render_as_string(hide_password=False)
    await asyncio.to_thread(run_migrations, url)
    try:
        yield url
    finally:
        await admin_execute(server_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@asynccontextmanager
async def _cluster_of_the_run(workdir: Path, name: str) -> AsyncIterator[str]:
    """The database `name` on a cluster in `workdir`; a cluster that fails to start fails with
    the end of each node's log (the directory is gone after)."""
    started = False
    try:
        async with cluster_database(workdir, name, shard_count=CITUS_SHARDS) as on_cluster:
            started = True
            yield on_cluster.url
    except pytest.fail.Exception as failure:
        if started:
            raise
        pytest.fail(f"{failure}{await asyncio.to_thread(_log_ends, workdir)}")


def _log_ends(workdir: Path) -> str:
    return "".join(
        f"\n--- {log.name}\n{log.read_text(errors='replace')[-2000:]}"
        for log in sorted(workdir.glob("*.log"))
    )


def _database_name() -> str:
    """`cms_test_<run>`, and under pytest-xdist `cms_test_<run>_<worker>`: the workers of one
    run share its id, so their databases are told apart by the worker's (`gw0`, `gw1`, ...)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID") if worker else None
    base = f"cms_test_{(run or uuid.uuid4().hex)[:12]}"
    return f"{base}_{worker}" if worker else base


@pytest.fixture(scope="session")
def settings(database_url: str) -> Settings:
    return make_settings(database_url)


@pytest.fixture(scope="session")
async def app(settings: Settings) -> AsyncIterator[FastAPI]:
    application = create_app(settings)
    async with LifespanManager(application):
        yield application


@pytest.fixture(autouse=True)
async def _clean_tables(request: pytest.FixtureRequest) -> AsyncIterator[None]:
    """Every test that touched the database leaves it empty for the next one."""
    yield
    if "database_url" not in request.fixturenames:
        return
    url: str = request.getfixturevalue("database_url")
    tables = ", ".join(f'"{table.name}"' for table in metadata.sorted_tables)
    await admin_execute(url, f"TRUNCATE {tables} RESTART IDENTITY CASCADE")
    if "app" in request.fixturenames:  # the shared app's rate-limit buckets start full again
        application: FastAPI = request.getfixturevalue("app")
        application.state.rate_limiter.reset()


@pytest.fixture
def engine(app: FastAPI) -> AsyncEngine:
    """The app's engine, for tests that work below HTTP (queue, repositories)."""
    return db.database_of(app).engine


@pytest.fixture(name="sessions")
def sessions_fixture(app: FastAPI) -> async_sessionmaker[AsyncSession]:
    """The app's sessionmaker, for tests that work below HTTP."""
    return db.sessions(app)


@pytest.fixture
async def client(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    async with client_of(app) as http:
        yield http


@pytest.fixture(scope="session")
def make_token(settings: Settings) -> TokenFactory:
    def factory(
        sub: str = "alice", company: str = "acme", roles: tuple[str, ...] = (), **claims: Any
    ) -> str:
        return issue_token(settings, Principal(sub, company, frozenset(roles)), extra_claims=claims)

    return factory


@pytest.fixture(scope="session")
def auth(make_token: TokenFactory) -> AuthFactory:
    """Authorization headers for a user: `auth("bob", "acme", ("space_admin",))`."""

    def factory(
        sub: str = "alice", company: str = "acme", roles: tuple[str, ...] = ()
    ) -> dict[str, str]:
        return {"Authorization": f"Bearer {make_token(sub, company, roles)}"}

    return factory
