"""`python -m app serve` writes no credential to its output: with a real JWT_SECRET and
ENVIRONMENT left at its default, nothing it prints or logs (start-up, worker, access log of an
authenticated request, shutdown) holds a token or the secret; only a run on the built-in
development secret prints its development token (which works), and only on a loopback address:
on any other it refuses to start."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import pytest

from app.kit.config import DEV_JWT_SECRET, PROJECT_ROOT
from tests.helpers.apps import TEST_JWT_SECRET, TokenFactory
from tests.helpers.polling import wait_until_sync

START_TIMEOUT_SECONDS = 60.0
REFUSAL_TIMEOUT_SECONDS = 30.0  # the interpreter and the app's imports, nothing more
JWT_SHAPE = re.compile(r"eyJ[\w-]+\.[\w-]+\.[\w-]*")


def serve_env(env: dict[str, str]) -> dict[str, str]:
    """Exactly `env`, with what it takes to run `python -m app` from another directory."""
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(PROJECT_ROOT)} | env


@contextmanager
def serving(
    env: dict[str, str], workdir: Path, host: str = "127.0.0.1"
) -> Iterator[tuple[int, Path]]:
    """`python -m app serve --host host` with exactly `env` (no ENVIRONMENT unless given, no
    .env: it runs in `workdir`); its stdout and stderr in one file; stopped with SIGTERM on
    exit."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    output = workdir / "serve.out"
    with output.open("wb") as sink:
        process = subprocess.Popen(
            [sys.executable, "-m", "app", "serve", "--host", host, "--port", str(port)],
            cwd=workdir,
            env=serve_env(env),
            stdin=subprocess.DEVNULL,
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    try:
        _wait_until_ready(process, port, output)
        yield port, output
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _wait_until_ready(process: subprocess.Popen[bytes], port: int, output: Path) -> None:
    def ready() -> bool:
        assert process.poll() is None, f"serve exited early:\n{output.read_text()[-3000:]}"
        with suppress(OSError):
            return get(port, "/readyz")[0] == 200
        return False

    wait_until_sync(
        ready,
        START_TIMEOUT_SECONDS,
        what=lambda: f"serve ready:\n{output.read_text()[-3000:]}",
        every=0.1,
    )


def get(port: int, path: str, token: str | None = None) -> tuple[int, str]:
    """(status, body) of a GET on the served port."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers=headers)
    with urllib.request.urlopen(request, timeout=5) as answer:  # noqa: S310 - our own server
        return int(answer.status), answer.read().decode()


def run_env(database_url: str, tmp_path: Path, **settings: str) -> dict[str, str]:
    return {
        "DATABASE_URL": database_url,
        "LLM_PROVIDER": "rules",
        "LOG_LEVEL": "INFO",
        "WORKER_HEARTBEAT_FILE": str(tmp_path / "heartbeat"),
        **settings,
    }


@pytest.mark.slow
def test_serve_with_a_real_secret_and_the_default_environment_prints_no_credential(
    database_url: str, make_token: TokenFactory, tmp_path: Path
) -> None:
    token = make_token("alice", "acme", ("operator",))  # signed with TEST_JWT_SECRET
    env = run_env(database_url, tmp_path, JWT_SECRET=TEST_JWT_SECRET)  # ENVIRONMENT unset
    with serving(env, tmp_path) as (port, output):
        assert get(port, "/v1/me", token)[0] == 200  # the access log sees a bearer token
        started = output.read_text()
    everything = output.read_text()

    assert "Swagger UI" in started  # the start-up banner was printed, without the token
    assert "Development token" not in everything
    assert JWT_SHAPE.findall(everything) == []
    assert TEST_JWT_SECRET not in everything
    assert token not in everything


@pytest.mark.slow
def test_serve_on_loopback_with_the_development_secret_prints_a_working_development_token(
    database_url: str, tmp_path: Path
) -> None:
    env = run_env(database_url, tmp_path)  # no ENVIRONMENT, no JWT_SECRET: the built-in one
    with serving(env, tmp_path, host="127.0.0.1") as (port, output):
        printed = JWT_SHAPE.findall(output.read_text())
        # one token, printed on its own line and in the link that opens alice's memory page
        assert len(set(printed)) == 1, output.read_text()[-3000:]
        assert f"/ui/memory#token={printed[0]}" in output.read_text()
        status, me = get(port, "/v1/me", printed[0])
    assert status == 200
    assert '"user_id":"alice"' in me
    assert '"operator"' in me
    assert '"space_admin"' in me
    assert DEV_JWT_SECRET not in output.read_text()


@pytest.mark.parametrize("host", ["0.0.0.0", "::"])  # noqa: S104 - the binds it refuses
def test_serve_off_loopback_with_the_development_secret_refuses_to_start(
    host: str, tmp_path: Path
) -> None:
    # A database nobody listens on: the refusal comes before any connection is tried.
    env = run_env("postgresql://postgres@127.0.0.1:9/none", tmp_path)  # the built-in secret
    finished = subprocess.run(
        [sys.executable, "-m", "app", "serve", "--host", host, "--port", "0"],
        cwd=tmp_path,
        env=serve_env(env),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=REFUSAL_TIMEOUT_SECONDS,
        check=False,
    )
    everything = finished.stdout + finished.stderr

    assert finished.returncode != 0, everything
    assert "JWT_SECRET" in finished.stderr
    assert "Development token" not in everything
    assert JWT_SHAPE.findall(everything) == []
    assert DEV_JWT_SECRET not in everything
