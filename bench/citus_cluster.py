"""A Citus cluster for `run_bench.py --citus`: the test suite's own (tests/helpers/citus.py), a
coordinator and two workers on this machine, with the bench's database on it migrated and
distributed as `python -m app migrate` does. Held open across the bench's synchronous steps by
an `asyncio.Runner` of its own; `stop` stops the three servers and removes their directory."""

from __future__ import annotations

import asyncio
import tempfile
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import make_url

from tests.helpers.citus import SERVICE_ROLE, ClusterDatabase, citus_missing, cluster_database


@dataclass
class BenchCluster:
    """The running cluster: `admin_dsn` as `postgres` (seeding, the jobs finished between
    runs), `service_dsn` as the service's role, whose sessions turn a statement reaching more
    than one shard into an error (so the bench also proves every request single-shard)."""

    admin_dsn: str
    service_dsn: str
    _runner: asyncio.Runner
    _context: AbstractAsyncContextManager[ClusterDatabase]
    _directory: tempfile.TemporaryDirectory[str]

    @classmethod
    def start(cls, parent: Path, database: str) -> BenchCluster:
        """Start it in a directory under `parent`; raises RuntimeError without Citus."""
        missing = citus_missing()
        if missing:
            raise RuntimeError(missing)
        parent.mkdir(parents=True, exist_ok=True)
        directory = tempfile.TemporaryDirectory(dir=parent, prefix="citus-")
        runner = asyncio.Runner()
        context = cluster_database(Path(directory.name), database)
        try:
            running = runner.run(context.__aenter__())
        except BaseException:
            runner.close()
            directory.cleanup()
            raise
        admin = _plain(running.admin_url)
        service = _plain(running.url)
        if SERVICE_ROLE not in service:
            raise RuntimeError(f"the service's URL {service} is not as {SERVICE_ROLE}")
        return cls(admin, service, runner, context, directory)

    def stop(self) -> None:
        try:
            self._runner.run(self._context.__aexit__(None, None, None))
        finally:
            self._runner.close()
            self._directory.cleanup()


def _plain(url: str) -> str:
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
