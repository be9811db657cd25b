"""`python -m app serve --workers N`: N processes answer on one port, the embedded database is
started and migrated once by the supervisor, and a signal stops every process and the database."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import psutil  # type: ignore[import-untyped]  # installed with pgserver; used here only
import pytest

from app.kit.config import PROJECT_ROOT
from tests.helpers.apps import TEST_JWT_SECRET
from tests.helpers.db import scratch_database
from tests.helpers.polling import wait_until_sync

START_TIMEOUT_SECONDS = 90.0
STOP_TIMEOUT_SECONDS = 30.0


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def serve_env(**settings: str) -> dict[str, str]:
    """A clean environment (no DATABASE_URL of the caller's shell) plus `settings`."""
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "PYTHONPATH": str(PROJECT_ROOT),
        "ENVIRONMENT": "test",
        "JWT_SECRET": TEST_JWT_SECRET,
        "JWT_PLATFORM": "true",  # operators act with static tokens (the TypeScript demo)
        "LLM_PROVIDER": "rules",
        "LOG_LEVEL": "INFO",
        **settings,
    }


@contextmanager
def serving(
    workers: int, env: dict[str, str], workdir: Path
) -> Iterator[tuple[subprocess.Popen[bytes], int, Path]]:
    """`python -m app serve --workers N` in its own session (so a signal to its process group
    is what Ctrl-C in a terminal does); killed with its whole tree if a test leaves it up."""
    port = free_port()
    log_path = workdir / "serve.log"
    command = [sys.executable, "-m", "app", "serve", "--workers", str(workers)]
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [*command, "--port", str(port)],
            cwd=workdir,  # no .env of the project is read
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        yield process, port, log_path
    finally:
        if process.poll() is None:
            with suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=STOP_TIMEOUT_SECONDS)


def wait_until_answering(process: subprocess.Popen[bytes], url: str, log_path: Path) -> None:
    def answering() -> bool:
        assert process.poll() is None, f"serve exited early:\n{log_path.read_text()[-3000:]}"
        with suppress(OSError), urllib.request.urlopen(url, timeout=2) as answer:  # noqa: S310
            return bool(answer.status == 200)
        return False

    wait_until_sync(
        answering,
        START_TIMEOUT_SECONDS,
        what=lambda: f"{url} answering 200:\n{log_path.read_text()[-3000:]}",
        every=0.2,
    )


def api_processes(supervisor: psutil.Process, port: int) -> set[int]:
    """The supervisor's children that listen on the port (not multiprocessing's helpers)."""
    return {
        child.pid
        for child in supervisor.children()
        if any(
            conn.status == psutil.CONN_LISTEN and conn.laddr.port == port
            for conn in child.net_connections(kind="tcp")
        )
    }


def healthz_on_a_new_connection(port: int, processes: set[int]) -> int:
    """GET /healthz on a fresh keep-alive connection; the PID of the process that answered."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: test\r\n\r\n")
        answer = sock.recv(65536)
        assert answer.startswith(b"HTTP/1.1 200"), answer[:200]
        client_port = sock.getsockname()[1]
        for pid in processes:  # the connection is still open: its server end has an owner
            for conn in psutil.Process(pid).net_connections(kind="tcp"):
                if conn.raddr and conn.raddr.port == client_port and conn.laddr.port == port:
                    return pid
    raise AssertionError(f"no API process holds the connection from port {client_port}")


def pids_answering(port: int, processes: set[int]) -> set[int]:
    """Open connections until every process has answered one (the kernel decides who accepts;
    a process still starting answers none), or the time is up."""
    answered: set[int] = set()
    deadline = time.monotonic() + START_TIMEOUT_SECONDS
    while answered != processes and time.monotonic() < deadline:
        answered.add(healthz_on_a_new_connection(port, processes))
    return answered


def log_messages(log_path: Path) -> list[str]:
    messages = []
    for line in log_path.read_text(errors="replace").splitlines():
        with suppress(ValueError):
            record = json.loads(line)
            if isinstance(record, dict):
                messages.append(str(record.get("msg", "")))
    return messages


def assert_all_gone(processes: list[psutil.Process]) -> None:
    def gone() -> bool:
        return not any(_running(p) for p in processes)

    wait_until_sync(
        gone,
        STOP_TIMEOUT_SECONDS,
        what=lambda: f"all gone; still running: {[p for p in processes if _running(p)]}",
        every=0.1,
    )


def _running(process: psutil.Process) -> bool:
    try:
        return bool(process.status() != psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return False


@pytest.fixture
async def scratch_database_url(server_url: str) -> AsyncIterator[str]:
    """A database of its own, migrated to head (the served processes do not migrate it)."""
    async with scratch_database(server_url, "cms_serve") as url:
        yield url


@pytest.mark.slow
def test_two_processes_answer_on_one_port_and_sigterm_stops_them_all(
    scratch_database_url: str, tmp_path: Path
) -> None:
    env = serve_env(
        DATABASE_URL=scratch_database_url,
        WORKER_HEARTBEAT_FILE=str(tmp_path / "heartbeat"),
    )
    with serving(2, env, tmp_path) as (process, port, log_path):
        wait_until_answering(process, f"http://127.0.0.1:{port}/healthz", log_path)
        supervisor = psutil.Process(process.pid)
        workers = api_processes(supervisor, port)
        assert len(workers) == 2
        assert pids_answering(port, workers) == workers
        tree = supervisor.children(recursive=True)

        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=STOP_TIMEOUT_SECONDS) == 0
        assert_all_gone(tree)
    messages = log_messages(log_path)
    # WORKER_ENABLED (the default): each process ran, and stopped, a consolidation worker
    assert sum(m.startswith("consolidation worker started") for m in messages) == 2
    assert sum(m == "consolidation worker stopped" for m in messages) == 2


@pytest.mark.slow
def test_one_worker_is_a_single_process_without_a_supervisor(
    scratch_database_url: str, tmp_path: Path
) -> None:
    env = serve_env(
        DATABASE_URL=scratch_database_url,
        WORKER_HEARTBEAT_FILE=str(tmp_path / "heartbeat"),
    )
    with serving(1, env, tmp_path) as (process, port, log_path):
        wait_until_answering(process, f"http://127.0.0.1:{port}/healthz", log_path)
        assert psutil.Process(process.pid).children(recursive=True) == []
        assert healthz_on_a_new_connection(port, {process.pid}) == process.pid
        process.send_signal(signal.SIGTERM)
        # uvicorn shuts down gracefully, then re-raises the signal to end as it asked
        assert process.wait(timeout=STOP_TIMEOUT_SECONDS) == -signal.SIGTERM
    messages = log_messages(log_path)
    assert sum(m.startswith("consolidation worker started") for m in messages) == 1
    assert sum(m == "consolidation worker stopped" for m in messages) == 1
    assert not any(m.startswith("Started parent process") for m in messages)


@pytest.mark.slow
def test_the_embedded_database_is_started_once_and_stopped_on_ctrl_c() -> None:
    (PROJECT_ROOT / "var").mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(dir=PROJECT_ROOT / "var", prefix="serve-") as tmp:
        workdir = Path(tmp)
        data_dir = workdir / "pg"
        env = serve_env(
            EMBEDDED_PG_DIR=str(data_dir),
            WORKER_ENABLED="false",
        )
        with serving(2, env, workdir) as (process, port, log_path):
            # /readyz: the database answers and its migrations are at head
            wait_until_answering(process, f"http://127.0.0.1:{port}/readyz", log_path)
            supervisor = psutil.Process(process.pid)
            workers = api_processes(supervisor, port)
            assert len(workers) == 2
            for pid in workers:  # handed the supervisor's server, so they start none
                handed = psutil.Process(pid).environ().get("DATABASE_URL", "")
                assert str(data_dir) in handed
            assert (data_dir / "postmaster.pid").exists()
            tree = supervisor.children(recursive=True)

            os.killpg(process.pid, signal.SIGINT)  # what Ctrl-C in a terminal sends
            assert process.wait(timeout=STOP_TIMEOUT_SECONDS) == 0
            assert_all_gone(tree)
        assert not (data_dir / "postmaster.pid").exists()  # the embedded server stopped
        messages = log_messages(log_path)
        assert sum(m.startswith("embedded PostgreSQL running") for m in messages) == 1


@pytest.mark.slow  # uvicorn's supervisor notices a dead process at its next health check (5 s)
def test_serve_fails_when_its_processes_cannot_start(tmp_path: Path) -> None:
    env = serve_env(DATABASE_URL="mysql://nowhere/db", WORKER_ENABLED="false")
    with serving(2, env, tmp_path) as (process, _port, log_path):
        code = process.wait(timeout=START_TIMEOUT_SECONDS)
    assert code == 3, log_path.read_text()[-3000:]  # uvicorn's start-up failure, as with one
    assert "failed to start" in log_path.read_text()
