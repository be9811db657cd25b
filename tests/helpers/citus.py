"""A Citus cluster of the test's own: a coordinator and two workers, three real PostgreSQL 15
servers (Debian's binaries in /usr/lib/postgresql/15/bin) with the Citus extension preloaded,
in a temporary directory, on free loopback ports, trust authentication.

Each node runs the settings of docs/scaling.md's runbook (`shared_preload_libraries = 'citus'`,
`wal_level = logical`: what an online shard move needs), read from its block. A database is
created on every node with the extension in it, the coordinator is told its own address, and the
workers are added to it (`citus_add_node`): the runbook's blocks, run with psql
(`tests/helpers/runbook.py`). A test may start and add one more worker (`add_worker`), stopped
with the others. Without Citus built into PostgreSQL's library directory (`.ci/install-citus`)
the tests skip with the reason.

initdb and postgres refuse to run as root: under root they run as the `postgres` system user that
Debian's packages create, as in `tests/helpers/replicated_pg.py`.
"""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path

import asyncpg
import pytest

from tests.helpers import runbook
from tests.helpers.replicated_pg import (
    PG_BIN,
    Server,
    free_port,
    owned_directory,
    pg_binary,
    run_as,
    server_user,
)

WORKERS = 2
SERVICE_ROLE = "cms_service"
"""The role the service connects as on the cluster: its sessions turn every statement that
reaches more than one shard into an error (`citus.multi_task_query_log_level = 'error'`), while
the tests' own statements (as `postgres`) may reach any shard."""


def citus_missing() -> str | None:
    """Why the cluster cannot run here, or None when the extension is installed."""
    pg_config = PG_BIN / "pg_config"
    if not (PG_BIN / "postgres").exists():
        return f"{PG_BIN / 'postgres'} is missing: the PostgreSQL 15 server is not installed"
    libdir = Path("/usr/lib/postgresql/15/lib")
    if pg_config.exists():
        done = subprocess.run(
            [str(pg_config), "--pkglibdir"], capture_output=True, text=True, check=False
        )
        if done.returncode == 0 and done.stdout.strip():
            libdir = Path(done.stdout.strip())
    if not (libdir / "citus.so").exists():
        return f"citus.so is not in {libdir}: run .ci/install-citus to build Citus"
    return None


@dataclass(frozen=True)
class CitusCluster:
    coordinator: Server
    workers: tuple[Server, ...]
    workdir: Path
    added: list[Server] = field(default_factory=list)
    """Workers started by `add_worker`, in order."""

    @property
    def nodes(self) -> tuple[Server, ...]:
        return (self.coordinator, *self.workers, *self.added)

    async def add_worker(self, database: str) -> Server:
        """One more worker, started with the runbook's settings, with `database` and the
        extension in it, added on the coordinator (`citus_add_node`): no shard on it until a
        rebalance moves some there. Stopped with the cluster."""
        user = server_user()
        worker = Server(
            self.workdir / f"worker{len(self.workers) + len(self.added)}", free_port(), user
        )
        self.added.append(worker)
        await asyncio.to_thread(_start, worker, self.workdir / "sockets", worker.data_dir.name)
        await _execute(worker, "postgres", f'CREATE DATABASE "{database}"')
        await runbook.psql(worker, database, "every-node")
        await runbook.psql(
            self.coordinator, database, "add-node", worker_host="127.0.0.1", worker_port=worker.port
        )
        return worker

    def url(self, database: str, user: str = "postgres") -> str:
        """A `postgresql+asyncpg://` URL of `database` on the coordinator."""
        return f"postgresql+asyncpg://{user}@{self.coordinator.address}/{database}"

    async def create_database(self, name: str) -> None:
        """`name` on every node, with the Citus extension, and the coordinator's metadata:
        itself and the workers. The service's role is created (Citus propagates roles to the
        workers) with multi-shard statements turned into errors."""
        for node in self.nodes:
            await _execute(node, "postgres", f'CREATE DATABASE "{name}"')
            await runbook.psql(node, name, "every-node")
        await runbook.psql(
            self.coordinator,
            name,
            "set-coordinator",
            coordinator_host="127.0.0.1",
            coordinator_port=self.coordinator.port,
        )
        for worker in self.workers:
            await runbook.psql(
                self.coordinator, name, "add-node", worker_host="127.0.0.1", worker_port=worker.port
            )
        conn = await _connect(self.coordinator, name)
        try:
            exists = await conn.fetchval("SELECT 1 FROM pg_roles WHERE rolname = $1", SERVICE_ROLE)
            if not exists:
                await conn.execute(f"CREATE ROLE {SERVICE_ROLE} SUPERUSER LOGIN")
            await conn.execute(
                f'ALTER ROLE {SERVICE_ROLE} IN DATABASE "{name}"'
                " SET citus.multi_task_query_log_level = 'error'"
            )
        finally:
            await conn.close()

    async def drop_database(self, name: str) -> None:
        for node in self.nodes:
            with suppress(asyncpg.PostgresError, OSError):
                await _execute(node, "postgres", f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


async def _connect(node: Server, database: str) -> asyncpg.Connection:
    return await asyncpg.connect(
        user="postgres", database=database, host="127.0.0.1", port=node.port, timeout=10
    )


async def _execute(node: Server, database: str, *statements: str) -> None:
    conn = await _connect(node, database)
    try:
        for statement in statements:
            await conn.execute(statement)
    finally:
        await conn.close()


def _settings(server: Server, sockets: Path, name: str) -> dict[str, str]:
    """The runbook's node settings (docs/scaling.md), and the test's own around them."""
    return {
        "port": str(server.port),
        "listen_addresses": "127.0.0.1",
        "unix_socket_directories": str(sockets),
        "cluster_name": name,
        **runbook.settings("node-settings"),
        "max_connections": "120",
        "shared_buffers": "32MB",
        # fsync protects against the machine's crash, not the server's: off for a quicker test;
        # synchronous_commit stays on (the runbook's line): off, a shard move may switch over
        # before an acknowledged commit reached the target (docs/scaling.md, step 2)
        "fsync": "off",
        "full_page_writes": "off",
        # the cluster is a test's: no telemetry call, no background rebalance surprises
        "citus.enable_statistics_collection": "off",
    }


def _start(server: Server, sockets: Path, name: str) -> None:
    owned_directory(server.data_dir, server.user)
    run_as(
        server.user,
        pg_binary("initdb"),
        "-D",
        str(server.data_dir),
        "-U",
        "postgres",
        "--auth=trust",
        "--no-sync",
        "--encoding=UTF8",
        "--locale=C",
    )
    server.configure(**_settings(server, sockets, name))
    server.start()


@asynccontextmanager
async def citus_cluster(workdir: Path) -> AsyncIterator[CitusCluster]:
    """A coordinator and `WORKERS` workers in `workdir`, all stopped on leaving whatever
    happened. Skips when Citus is not installed."""
    missing = citus_missing()
    if missing:
        pytest.skip(missing)
    user = server_user()
    await asyncio.to_thread(owned_directory, workdir, user, 0o755)
    sockets = owned_directory(workdir / "sockets", user)
    coordinator = Server(workdir / "coordinator", free_port(), user)
    workers = tuple(Server(workdir / f"worker{n}", free_port(), user) for n in range(WORKERS))
    cluster = CitusCluster(coordinator, workers, workdir)
    try:
        await asyncio.gather(
            *(
                asyncio.to_thread(_start, node, sockets, node.data_dir.name)
                for node in cluster.nodes
            )
        )
        yield cluster
    finally:
        for node in cluster.nodes:
            if node.running():
                with suppress(BaseException):
                    await asyncio.to_thread(node.pg_ctl, "-m", "fast", "-w", "stop")


@dataclass(frozen=True)
class ClusterDatabase:
    """A database on the cluster, migrated and distributed: `admin_url` as `postgres` (the
    tests' own statements, which may read across companies), `url` as the service's role."""

    cluster: CitusCluster
    admin_url: str
    url: str


@asynccontextmanager
async def cluster_database(
    workdir: Path, name: str, *, shard_count: int | None = None
) -> AsyncIterator[ClusterDatabase]:
    """A cluster in `workdir` with the database `name` on it, migrated by Alembic and
    distributed as `python -m app migrate` does; all gone on leaving. `shard_count`: the shards
    of each distributed table (`citus.shard_count` of the database; Citus's default is 32)."""
    from app.kit.citus import distribute  # noqa: PLC0415 - the app only once the cluster runs
    from app.kit.db.migrations import run_migrations  # noqa: PLC0415
    from app.models import metadata  # noqa: PLC0415

    async with citus_cluster(workdir) as cluster:
        await cluster.create_database(name)
        if shard_count is not None:
            await _execute(
                cluster.coordinator,
                name,
                f'ALTER DATABASE "{name}" SET citus.shard_count = {int(shard_count)}',
            )
        admin_url = cluster.url(name)
        try:
            await asyncio.to_thread(run_migrations, admin_url)
            await distribute(admin_url, metadata)
            yield ClusterDatabase(cluster, admin_url, cluster.url(name, SERVICE_ROLE))
        finally:
            await cluster.drop_database(name)
