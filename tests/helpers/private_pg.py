"""A private embedded PostgreSQL a test may crash and start again, and whose client connections
it may cut: the server the shared test database must never be.

`crash()` is `pg_ctl stop -m immediate` (every backend killed at once, no checkpoint, so the
next start runs crash recovery) and `start_again()` starts the server on the same data
directory and socket with pgserver's own `pg_ctl`, run as the user who owns the data (pgserver
runs PostgreSQL as an unprivileged `pgserver` user when it is started as root).
"""

from __future__ import annotations

import asyncio
import pwd
import subprocess
from pathlib import Path
from types import TracebackType
from typing import Self

import asyncpg
from sqlalchemy import make_url

from app.kit.config import to_asyncpg_url
from app.kit.db.migrations import run_migrations
from app.kit.embedded_pg import EmbeddedPostgres
from tests.helpers.db import admin_execute

PG_CTL_TIMEOUT_SECONDS = 60


class PrivatePostgres:
    """Started (and migrated to head) on entering, stopped on leaving, whatever happened."""

    def __init__(self, data_dir: Path) -> None:
        self._embedded = EmbeddedPostgres(data_dir)
        self.data_dir = self._embedded.data_dir
        self.url = ""  # postgresql+asyncpg://, set by start()

    async def __aenter__(self) -> Self:
        self.url = to_asyncpg_url(await asyncio.to_thread(self._embedded.start))
        await asyncio.to_thread(run_migrations, self.url)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await asyncio.to_thread(self._close)

    @property
    def socket_dir(self) -> str:
        host = make_url(self.url).query.get("host")
        assert isinstance(host, str), self.url
        return host

    async def crash(self) -> None:
        """Stop in immediate mode: connections drop, nothing is flushed or checkpointed."""
        await asyncio.to_thread(self._pg_ctl, "-m", "immediate", "-w", "stop")

    async def start_again(self) -> None:
        """Start on the same socket (crash recovery first); returns once it accepts clients."""
        await asyncio.to_thread(
            self._pg_ctl,
            "-w",
            "-o",
            '-h ""',
            "-o",
            f"-k {self.socket_dir}",
            "-l",
            str(self.data_dir / "log"),
            "start",
        )

    async def connect(self) -> asyncpg.Connection:
        """A superuser connection of the test's own, over the server's socket."""
        return await asyncpg.connect(
            user="postgres", database="postgres", host=self.socket_dir, timeout=10
        )

    async def terminate_backends(self, application_name: str) -> int:
        """`pg_terminate_backend` on every connection of `application_name`; how many."""
        conn = await self.connect()
        try:
            killed = await conn.fetchval(
                "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity"
                " WHERE application_name = $1 AND pid <> pg_backend_pid()",
                application_name,
            )
        finally:
            await conn.close()
        return int(killed)

    async def execute(self, *statements: str) -> None:
        await admin_execute(self.url, *statements)

    def _pg_ctl(self, *args: str) -> None:
        import pgserver._commands as pgserver_bin  # noqa: PLC0415 - its binaries, only here

        owner = pwd.getpwuid(self.data_dir.stat().st_uid).pw_name
        subprocess.run(
            [str(pgserver_bin.POSTGRES_BIN_PATH / "pg_ctl"), "-D", str(self.data_dir), *args],
            user=owner,
            check=True,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=PG_CTL_TIMEOUT_SECONDS,
        )

    def _running(self) -> bool:
        return (self.data_dir / "postmaster.pid").exists()

    def _close(self) -> None:
        # pgserver stops the server it started; a server started again by `start_again` it may
        # take for the one that crashed (already gone), so whatever still runs is stopped here
        self._embedded.stop()
        if self._running():
            self._pg_ctl("-m", "fast", "-w", "stop")
