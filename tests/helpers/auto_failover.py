"""A pg_auto_failover formation of the test's own: a monitor and two PostgreSQL 15 data nodes
on free loopback ports in a temporary directory, each run by its `pg_autoctl` keeper; the
monitor promotes the secondary when the primary fails.

pg_auto_failover makes the secondary synchronous (`synchronous_standby_names = 'ANY 1 (...)'`,
`synchronous_commit = on`), so a commit is acknowledged only once the secondary has it. The
monitor's health checks are shortened (its defaults take about 30 s to fail over, and then
keep the new primary read-only for `primary_demote_timeout`, 30 s) so that a failover takes
seconds.

`.ci/install-pg-auto-failover` (which `make test-long` runs) installs Debian's
`postgresql-15-auto-failover`; without it the test skips and says so. Like initdb, pg_autoctl
refuses to run as root: under root it runs as the `postgres` system user.
"""

from __future__ import annotations

import asyncio
import subprocess
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

import asyncpg
import pytest

from tests.helpers.replicated_pg import PG_BIN, free_port, owned_directory, pg_binary, server_user

PG_AUTOCTL = Path("/usr/bin/pg_autoctl")
START_TIMEOUT_SECONDS = 60.0
STOP_TIMEOUT_SECONDS = 30.0
# the monitor's failure detection, in milliseconds: a primary that answers no health check for
# about two seconds is failed over, and the new primary waits 2 s for the old one to demote
MONITOR_SETTINGS = {
    "pgautofailover.health_check_period": "500",
    "pgautofailover.health_check_timeout": "500",
    "pgautofailover.health_check_max_retries": "1",
    "pgautofailover.health_check_retry_delay": "250",
    "pgautofailover.node_considered_unhealthy_timeout": "2000",
    "pgautofailover.primary_demote_timeout": "2000",
}


def pg_autoctl_binary() -> str:
    if not PG_AUTOCTL.exists():
        pytest.skip(
            "pg_autoctl is not installed and could not be installed "
            "(.ci/install-pg-auto-failover installs postgresql-15-auto-failover where it can)"
        )
    pg_binary("pg_ctl")  # the PostgreSQL 15 server it runs
    return str(PG_AUTOCTL)


@dataclass
class Keeper:
    """One `pg_autoctl` process and the PostgreSQL it keeps."""

    name: str
    data_dir: Path
    port: int
    log: Path
    process: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def log_tail(self) -> str:
        with suppress(OSError):
            return self.log.read_text(errors="replace")[-3000:]
        return ""

    async def connect(self) -> asyncpg.Connection:
        return await asyncpg.connect(
            user="postgres", database="postgres", host="127.0.0.1", port=self.port, timeout=10
        )

    async def writable(self) -> bool:
        """A fresh session on this node can write (a session takes a new read-only setting only
        after its next command, so a pooled one would answer late)."""
        try:
            conn = await self.connect()
        except (OSError, asyncpg.PostgresError, TimeoutError):
            return False
        try:
            read_only = await conn.fetchval(
                "SELECT pg_is_in_recovery() OR current_setting('transaction_read_only')::bool"
            )
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError):
            return False
        finally:
            conn.terminate()
        return read_only is False


@dataclass(frozen=True)
class Formation:
    workdir: Path
    monitor: Keeper
    nodes: tuple[Keeper, Keeper]
    user: str | None

    @property
    def url(self) -> str:
        hosts = ",".join(node.address for node in self.nodes)
        return f"postgresql://postgres@{hosts}/postgres?target_session_attrs=read-write"

    @property
    def monitor_uri(self) -> str:
        return f"postgres://autoctl_node@{self.monitor.address}/pg_auto_failover?sslmode=disable"

    def env(self) -> dict[str, str]:
        """pg_autoctl's environment: the PostgreSQL 15 binaries, its files in the workdir."""
        return {
            "PATH": f"{PG_BIN}:/usr/bin:/bin",
            "PG_CONFIG": str(PG_BIN / "pg_config"),
            "HOME": str(self.workdir),
            "XDG_CONFIG_HOME": str(self.workdir / "config"),
            "XDG_DATA_HOME": str(self.workdir / "data"),
            "XDG_RUNTIME_DIR": str(self.workdir / "run"),
        }

    def autoctl(self, *args: str) -> None:
        """A `pg_autoctl` command that returns when done; its output goes to the formation's log."""
        with (self.workdir / "pg_autoctl.log").open("ab") as log:
            done = subprocess.run(
                [pg_autoctl_binary(), *args],
                user=self.user,
                env=self.env(),
                cwd=self.workdir,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                check=False,
                timeout=START_TIMEOUT_SECONDS,
            )
        if done.returncode != 0:
            tail = (self.workdir / "pg_autoctl.log").read_text(errors="replace")[-3000:]
            pytest.fail(f"pg_autoctl {' '.join(args)} exited {done.returncode}:\n{tail}")

    def launch(self, keeper: Keeper, *args: str) -> None:
        """Start `pg_autoctl *args` as `keeper`'s long-running process."""
        with keeper.log.open("ab") as log:
            keeper.process = subprocess.Popen(
                [pg_autoctl_binary(), *args],
                user=self.user,
                env=self.env(),
                cwd=self.workdir,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    def run_node(self, node: Keeper) -> None:
        """Create the node (first time) or start it again: it joins as primary or secondary,
        whichever the monitor assigns (a former primary is rewound and follows)."""
        if (node.data_dir / "PG_VERSION").exists():
            self.launch(node, "run", "--pgdata", str(node.data_dir))
            return
        self.launch(
            node,
            *("create", "postgres", "--pgdata", str(node.data_dir), "--name", node.name),
            *("--pgport", str(node.port), "--hostname", "127.0.0.1", "--listen", "127.0.0.1"),
            *("--auth", "trust", "--no-ssl", "--monitor", self.monitor_uri, "--run"),
        )

    def crash(self, node: Keeper) -> None:
        """`pg_autoctl stop --immediate`: the keeper and its PostgreSQL gone at once, as when
        the node's machine fails; returns once they have."""
        self.autoctl("stop", "--immediate", "--pgdata", str(node.data_dir))
        assert node.process is not None
        node.process.wait(timeout=STOP_TIMEOUT_SECONDS)

    async def states(self) -> dict[str, tuple[str, str]]:
        """Each node's (reported, assigned) state, as the monitor has them."""
        conn = await asyncpg.connect(
            user="postgres",
            database="pg_auto_failover",
            host="127.0.0.1",
            port=self.monitor.port,
            timeout=5,
        )
        try:
            rows = await conn.fetch(
                "SELECT nodename, reportedstate::text, goalstate::text FROM pgautofailover.node"
            )
        finally:
            await conn.close()
        return {row["nodename"]: (row["reportedstate"], row["goalstate"]) for row in rows}

    async def wait_for_states(self, expected: dict[str, str], seconds: float) -> None:
        """Until each node named has reported and been assigned the state given."""
        deadline = time.monotonic() + seconds
        states: dict[str, tuple[str, str]] = {}
        while True:
            with suppress(OSError, asyncpg.PostgresError):
                states = await self.states()
                if all(states.get(name) == (state, state) for name, state in expected.items()):
                    return
            if time.monotonic() > deadline:
                logs = "\n".join(f"{k.name}:\n{k.log_tail()}" for k in (self.monitor, *self.nodes))
                pytest.fail(f"not {expected} within {seconds} s: {states}\n{logs}")
            await asyncio.sleep(0.1)

    def log_tails(self) -> str:
        return "\n".join(f"{k.name}:\n{k.log_tail()}" for k in (self.monitor, *self.nodes))


@asynccontextmanager
async def formation(workdir: Path) -> AsyncIterator[Formation]:
    """A monitor, a primary and its synchronous secondary in `workdir` (handed to the server
    user), every keeper stopped on leaving whatever happened."""
    pg_autoctl_binary()
    user = server_user()
    await asyncio.to_thread(owned_directory, workdir, user, 0o755)
    for name in ("config", "data", "run"):
        await asyncio.to_thread(owned_directory, workdir / name, user)
    monitor = Keeper("monitor", workdir / "monitor", free_port(), workdir / "monitor.log")
    nodes = tuple(
        Keeper(f"node{n}", workdir / f"node{n}", free_port(), workdir / f"node{n}.log")
        for n in (1, 2)
    )
    assert len(nodes) == 2
    made = Formation(workdir, monitor, (nodes[0], nodes[1]), user)
    try:
        await asyncio.to_thread(_start_monitor, made)
        await made.wait_for_states({}, START_TIMEOUT_SECONDS)  # the monitor answers
        await asyncio.to_thread(made.run_node, made.nodes[0])
        await made.wait_for_states({"node1": "single"}, START_TIMEOUT_SECONDS)
        await asyncio.to_thread(made.run_node, made.nodes[1])
        await made.wait_for_states(
            {"node1": "primary", "node2": "secondary"}, START_TIMEOUT_SECONDS
        )
        yield made
    finally:
        await asyncio.to_thread(_stop_all, made)


def _start_monitor(made: Formation) -> None:
    monitor = made.monitor
    made.autoctl(
        *("create", "monitor", "--pgdata", str(monitor.data_dir), "--pgport", str(monitor.port)),
        *("--hostname", "127.0.0.1", "--listen", "127.0.0.1", "--auth", "trust", "--no-ssl"),
    )
    with (monitor.data_dir / "postgresql.conf").open("a", encoding="utf-8") as conf:
        conf.writelines(f"{name} = {value}\n" for name, value in MONITOR_SETTINGS.items())
    made.launch(monitor, "run", "--pgdata", str(monitor.data_dir))


def _stop_all(made: Formation) -> None:
    for keeper in (*made.nodes, made.monitor):
        if not keeper.running():
            continue
        assert keeper.process is not None
        with suppress(BaseException):
            made.autoctl("stop", "--immediate", "--pgdata", str(keeper.data_dir))
        try:
            keeper.process.wait(timeout=STOP_TIMEOUT_SECONDS)
        except subprocess.TimeoutExpired:
            keeper.process.kill()
            keeper.process.wait()
