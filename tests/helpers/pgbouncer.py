"""A PgBouncer of the test's own in transaction pooling mode, in front of the test PostgreSQL:
its config in a temporary directory, its own port, trust authentication, a small server pool.

`.ci/run` installs PgBouncer (Debian's `pgbouncer`) when it is missing; where it is absent and
could not be installed, the tests that need it are skipped with that reason.
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

import pytest
from sqlalchemy import URL, make_url

from tests.helpers.polling import wait_until_sync

START_TIMEOUT_SECONDS = 15.0
# Debian installs it in /usr/sbin, which is not on an ordinary user's PATH
SEARCH_PATH = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/usr/local/sbin"])


@dataclass(frozen=True)
class PgBouncer:
    url: str  # the database through PgBouncer, in the form the app's settings take
    version: str
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def pgbouncer_binary() -> str:
    """The `pgbouncer` executable, or a skip that says why the test cannot run."""
    found = shutil.which("pgbouncer", path=SEARCH_PATH)
    if found is None:
        pytest.skip(
            "pgbouncer is not installed and could not be installed "
            "(.ci/run runs `apt-get install pgbouncer` where it can)"
        )
    return found


@contextmanager
def running_pgbouncer(
    database_url: str, *, pool_size: int, ignore_startup_parameters: tuple[str, ...] = ()
) -> Iterator[PgBouncer]:
    """PgBouncer in transaction mode serving the database of `database_url` with at most
    `pool_size` server connections (and accepting, without passing them on, the startup
    parameters named); stopped on exit."""
    binary = pgbouncer_binary()
    target = make_url(database_url)
    port = _free_port()
    with tempfile.TemporaryDirectory(prefix="pgbouncer-") as tmp:
        workdir = Path(tmp)
        workdir.chmod(0o755)  # readable by the unprivileged user it runs as under root
        config = workdir / "pgbouncer.ini"
        userlist = workdir / "userlist.txt"
        config.write_text(_config(target, port, pool_size, userlist, ignore_startup_parameters))
        userlist.write_text(f'"{target.username or "postgres"}" ""\n')
        for path in workdir.iterdir():
            path.chmod(0o644)
        log_path = workdir / "pgbouncer.log"
        command = [binary, *_as_unprivileged_user(target), str(config)]
        with log_path.open("wb") as log:
            process = subprocess.Popen(
                command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT
            )
        try:
            _wait_until_listening(process, port, log_path)
            url = target.set(host="127.0.0.1", port=port, query={})
            yield PgBouncer(url.render_as_string(hide_password=False), _version(binary), log_path)
        finally:
            process.terminate()
            with suppress(subprocess.TimeoutExpired):
                process.wait(timeout=10)
            if process.poll() is None:
                process.kill()
                process.wait()


def _socket_dir(url: URL) -> str | None:
    """The server's Unix socket directory (`?host=/dir`, as the embedded PostgreSQL's URL)."""
    host = url.query.get("host")
    return host if isinstance(host, str) else None


def _config(
    target: URL, port: int, pool_size: int, userlist: Path, ignored: tuple[str, ...]
) -> str:
    host = _socket_dir(target) or target.host or "127.0.0.1"
    return f"""\
[databases]
{target.database} = host={host} port={target.port or 5432} dbname={target.database}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {port}
unix_socket_dir =
auth_type = trust
auth_file = {userlist}
pool_mode = transaction
default_pool_size = {pool_size}
min_pool_size = 0
reserve_pool_size = 0
max_client_conn = 200
server_reset_query =
ignore_startup_parameters = {", ".join(ignored)}
"""


def _as_unprivileged_user(target: URL) -> list[str]:
    """PgBouncer refuses to run as root: under root it runs as the owner of the server's socket
    directory (it must reach the socket) or as `nobody`."""
    if os.geteuid() != 0:
        return []
    socket_dir = _socket_dir(target)
    if socket_dir is not None:
        return ["-u", pwd.getpwuid(Path(socket_dir).stat().st_uid).pw_name]
    return ["-u", "nobody"]


def _wait_until_listening(process: subprocess.Popen[bytes], port: int, log_path: Path) -> None:
    def listening() -> bool:
        if process.poll() is not None:
            pytest.fail(f"pgbouncer exited at start:\n{log_path.read_text(errors='replace')}")
        with suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
        return False

    wait_until_sync(
        listening,
        START_TIMEOUT_SECONDS,
        what=lambda: f"pgbouncer listening:\n{log_path.read_text(errors='replace')}",
        every=0.05,
    )


def _version(binary: str) -> str:
    answer = subprocess.run(
        [binary, "--version"], capture_output=True, text=True, check=False, timeout=10
    )
    return answer.stdout.splitlines()[0] if answer.stdout else "unknown"


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
