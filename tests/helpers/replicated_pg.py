"""A primary and a synchronous streaming standby of the test's own: two real PostgreSQL 15
servers (Debian's binaries in /usr/lib/postgresql/15/bin) in a temporary directory, on free
loopback ports, trust authentication.

The standby is a `pg_basebackup -R` copy of the primary; once it streams, the primary names it
in `synchronous_standby_names` (with `synchronous_commit = on`), so a commit is acknowledged
only after the standby has flushed it: what a client saw committed survives the primary.

initdb and postgres refuse to run as root: under root they run as the `postgres` system user
that Debian's packages create, which owns the data directories.
"""

from __future__ import annotations

import asyncio
import os
import pwd
import socket
import subprocess
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

import asyncpg
import pytest

PG_BIN = Path("/usr/lib/postgresql/15/bin")
SERVER_USER = "postgres"  # the unprivileged owner of the servers when the test runs as root
STANDBY_NAME = "standby"  # its cluster_name, hence the application_name it streams under
COMMAND_TIMEOUT_SECONDS = 60
SYNC_TIMEOUT_SECONDS = 30.0


def pg_binary(name: str) -> str:
    """A PostgreSQL 15 server binary, or a skip that says why the test cannot run."""
    path = PG_BIN / name
    if not path.exists():
        pytest.skip(f"{path} is missing: the PostgreSQL 15 server package is not installed")
    return str(path)


def server_user() -> str | None:
    """Whom the servers run as: None (this user) unless the test runs as root."""
    if os.geteuid() != 0:
        return None
    try:
        pwd.getpwnam(SERVER_USER)
    except KeyError:
        pytest.skip(f"running as root and there is no {SERVER_USER!r} user to run PostgreSQL as")
    return SERVER_USER


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def run_as(user: str | None, *command: str, cwd: Path | None = None) -> str:
    """Run `command` as `user` (None: as this process); its output, or a failure that shows it."""
    done = subprocess.run(
        command,
        user=user,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        check=False,
        timeout=COMMAND_TIMEOUT_SECONDS,
    )
    if done.returncode != 0:
        pytest.fail(f"{' '.join(command)} exited {done.returncode}:\n{done.stdout}{done.stderr}")
    return done.stdout


def owned_directory(path: Path, user: str | None, mode: int = 0o700) -> Path:
    """`path` (created when missing) owned by `user`: PostgreSQL wants its data directory 0700,
    and writes its log beside it."""
    path.mkdir(mode=mode, exist_ok=True)
    path.chmod(mode)
    if user is not None:
        entry = pwd.getpwnam(user)
        os.chown(path, entry.pw_uid, entry.pw_gid)
    return path


@dataclass(frozen=True)
class Server:
    """One PostgreSQL server: its data directory, loopback port and server log."""

    data_dir: Path
    port: int
    user: str | None

    @property
    def log(self) -> Path:
        return self.data_dir.with_suffix(".log")

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def configure(self, **settings: str) -> None:
        """Append `settings` to postgresql.conf (later lines win over earlier ones)."""
        lines = "".join(f"{name} = '{value}'\n" for name, value in settings.items())
        with (self.data_dir / "postgresql.conf").open("a", encoding="utf-8") as conf:
            conf.write(lines)

    def pg_ctl(self, *args: str) -> str:
        return run_as(self.user, pg_binary("pg_ctl"), "-D", str(self.data_dir), *args)

    def start(self) -> None:
        self.pg_ctl("-w", "-l", str(self.log), "start")

    def stop_immediately(self) -> None:
        """`pg_ctl stop -m immediate`: every backend killed at once, as by a crash."""
        self.pg_ctl("-m", "immediate", "-w", "stop")

    def promote(self) -> None:
        """`pg_ctl promote`, returning once the server accepts writes."""
        self.pg_ctl("-w", "promote")

    def running(self) -> bool:
        return (self.data_dir / "postmaster.pid").exists()

    async def connect(self) -> asyncpg.Connection:
        return await asyncpg.connect(
            user="postgres", database="postgres", host="127.0.0.1", port=self.port, timeout=10
        )

    def log_tail(self) -> str:
        with suppress(OSError):
            return self.log.read_text(errors="replace")[-3000:]
        return ""


def _base_settings(server: Server, socket_dir: Path, cluster_name: str) -> dict[str, str]:
    return {
        "port": str(server.port),
        "listen_addresses": "127.0.0.1",
        "unix_socket_directories": str(socket_dir),
        "cluster_name": cluster_name,
        "max_connections": "80",
        "shared_buffers": "16MB",
        "synchronous_commit": "on",
        # fsync protects against the machine's crash, not the server's: off for a quicker test
        "fsync": "off",
    }


@dataclass(frozen=True)
class ReplicatedPair:
    primary: Server
    standby: Server

    @property
    def url(self) -> str:
        """Both servers in libpq's multi-host form, writes only to the primary."""
        return (
            f"postgresql://postgres@{self.primary.address},{self.standby.address}/postgres"
            "?target_session_attrs=read-write"
        )


@asynccontextmanager
async def replicated_pair(workdir: Path) -> AsyncIterator[ReplicatedPair]:
    """A primary and its synchronous standby in `workdir` (handed to the server user, whose
    servers write their logs there), both stopped on leaving whatever happened."""
    user = server_user()
    await asyncio.to_thread(owned_directory, workdir, user, 0o755)
    sockets = owned_directory(workdir / "sockets", user)
    primary = Server(workdir / "primary", free_port(), user)
    standby = Server(workdir / "standby", free_port(), user)
    try:
        await asyncio.to_thread(_start_primary, primary, sockets)
        await asyncio.to_thread(_start_standby, primary, standby, sockets)
        await _make_synchronous(primary)
        yield ReplicatedPair(primary, standby)
    finally:
        for server in (primary, standby):
            if server.running():
                with suppress(BaseException):
                    await asyncio.to_thread(server.stop_immediately)


def _start_primary(primary: Server, sockets: Path) -> None:
    owned_directory(primary.data_dir, primary.user)
    run_as(
        primary.user,
        pg_binary("initdb"),
        "-D",
        str(primary.data_dir),
        "-U",
        "postgres",
        "--auth=trust",  # its pg_hba.conf lets loopback replicate too
        "--no-sync",
        "--encoding=UTF8",
        "--locale=C",
    )
    primary.configure(**_base_settings(primary, sockets, "primary"))
    primary.start()


def _start_standby(primary: Server, standby: Server, sockets: Path) -> None:
    owned_directory(standby.data_dir, standby.user)
    run_as(
        standby.user,
        pg_binary("pg_basebackup"),
        "-D",
        str(standby.data_dir),
        "-h",
        "127.0.0.1",
        "-p",
        str(primary.port),
        "-U",
        "postgres",
        "-X",
        "stream",
        "-R",  # standby.signal and primary_conninfo: it starts as a streaming standby
        "--no-sync",
    )
    standby.configure(**_base_settings(standby, sockets, STANDBY_NAME))
    standby.start()


async def _make_synchronous(primary: Server) -> None:
    """Name the standby synchronous on the primary (not in the copied configuration, so that
    the standby promoted has no standby to wait for) and wait until it is."""
    conn = await primary.connect()
    try:
        await conn.execute(f"ALTER SYSTEM SET synchronous_standby_names = '{STANDBY_NAME}'")
        await conn.execute("SELECT pg_reload_conf()")
        deadline = time.monotonic() + SYNC_TIMEOUT_SECONDS
        while True:
            state = await conn.fetchval(
                "SELECT sync_state FROM pg_stat_replication WHERE application_name = $1",
                STANDBY_NAME,
            )
            if state == "sync":
                return
            if time.monotonic() > deadline:
                pytest.fail(f"the standby is not synchronous ({state}):\n{primary.log_tail()}")
            await asyncio.sleep(0.05)
    finally:
        await conn.close()
