"""What `serve` prints: a few lines saying what started where, then one line per request; the
embedded PostgreSQL's initdb/pg_ctl chatter goes to its own file, and when it cannot start the
error carries the tail of the server's log."""

from __future__ import annotations

import io
import logging
import os
import re
import signal
import tempfile
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import pytest

from app.kit.config import PROJECT_ROOT
from app.kit.embedded_pg import chatter_log_path
from app.kit.observability import JsonFormatter, TextFormatter, configure_logging
from tests.test_serve_workers import (
    START_TIMEOUT_SECONDS,
    STOP_TIMEOUT_SECONDS,
    serve_env,
    serving,
    wait_until_answering,
)

REQUEST_LINE = re.compile(r"^\d\d:\d\d:\d\d GET /v1/me 401 [\d.]+ ms$")
CHATTER = ("initdb", "pg_ctl", "Running commandline", "postmaster", "PG_VERSION")


@contextmanager
def scratch_dir() -> Iterator[Path]:
    (PROJECT_ROOT / "var").mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(dir=PROJECT_ROOT / "var", prefix="logs-") as tmp:
        yield Path(tmp)


def get(url: str) -> None:
    with suppress(OSError), urllib.request.urlopen(url, timeout=5):  # noqa: S310
        pass


@pytest.mark.slow
def test_serve_on_the_embedded_database_prints_a_few_lines_then_requests() -> None:
    with scratch_dir() as workdir:
        data_dir = workdir / "pg"
        # what `make run` does: the development secret, so the banner carries a token
        env = serve_env(EMBEDDED_PG_DIR=str(data_dir), LOG_FORMAT="text", ENVIRONMENT="development")
        del env["JWT_SECRET"]
        with serving(1, env, workdir) as (process, port, log_path):
            wait_until_answering(process, f"http://127.0.0.1:{port}/healthz", log_path)
            get(f"http://127.0.0.1:{port}/v1/me")  # 401: no token
            os.killpg(process.pid, signal.SIGINT)
            assert process.wait(timeout=STOP_TIMEOUT_SECONDS) == 0
        lines = log_path.read_text().splitlines()
        chatter = chatter_log_path(data_dir).read_text()

    text = "\n".join(lines)
    assert not any(word in text for word in CHATTER), text
    assert "initdb" in chatter  # it went to its own file
    assert "pg_ctl" in chatter
    assert f"embedded PostgreSQL running in {data_dir} (its messages: {data_dir}.log)" in text
    assert any(line.endswith("Running upgrade  -> 0001, initial schema") for line in lines)
    request_lines = [n for n, line in enumerate(lines) if REQUEST_LINE.match(line)]
    assert request_lines, text
    # banner (3 lines + the token) and the start-up lines, one per migration applied: a
    # screenful, not a wall
    upgrades = sum("Running upgrade" in line for line in lines)
    assert request_lines[0] - upgrades <= 12, text
    # the banner says where the pages are, and the development token opens alice's page
    assert f"memory page: http://127.0.0.1:{port}/ui/memory" in text
    token = lines[lines.index(next(x for x in lines if x.startswith("Development token"))) + 1]
    assert f"alice's memory page: http://127.0.0.1:{port}/ui/memory#token={token}" in lines
    assert all(not line.startswith("{") for line in lines), text  # text, not JSON


@pytest.mark.slow
def test_an_embedded_database_that_cannot_start_shows_the_tail_of_its_log() -> None:
    with scratch_dir() as workdir:
        data_dir = workdir / "pg"
        env = serve_env(EMBEDDED_PG_DIR=str(data_dir), LOG_FORMAT="text")
        with serving(1, env, workdir) as (process, port, log_path):  # creates the cluster
            wait_until_answering(process, f"http://127.0.0.1:{port}/healthz", log_path)
            os.killpg(process.pid, signal.SIGINT)
            assert process.wait(timeout=STOP_TIMEOUT_SECONDS) == 0
        (data_dir / "PG_VERSION").write_text("9.6\n")  # a cluster this server cannot open
        with serving(1, env, workdir) as (process, _port, log_path):
            assert process.wait(timeout=START_TIMEOUT_SECONDS) == 3
            output = log_path.read_text()

    assert f"ERROR embedded PostgreSQL failed to start in {data_dir}" in output
    assert f"last lines of {data_dir}/log:" in output
    assert "database files are incompatible with server" in output  # the server's own reason


def test_text_lines_for_requests_and_messages() -> None:
    access = logging.LogRecord("app.access", logging.INFO, __file__, 1, "request", None, None)
    access.__dict__.update(method="GET", path="/v1/me", status=200, duration_ms=3.5)
    assert re.fullmatch(r"\d\d:\d\d:\d\d GET /v1/me 200 3.5 ms", TextFormatter().format(access))
    warning = logging.LogRecord("app.x", logging.WARNING, __file__, 1, "slow %s", ("db",), None)
    assert re.fullmatch(r"\d\d:\d\d:\d\d WARNING slow db", TextFormatter().format(warning))


def test_auto_is_json_when_stderr_is_not_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    try:
        monkeypatch.setattr("sys.stderr", io.StringIO())
        configure_logging("INFO", "auto")
        assert isinstance(root.handlers[0].formatter, JsonFormatter)
        configure_logging("INFO", "text")
        assert isinstance(root.handlers[0].formatter, TextFormatter)
        # Alembic's preamble is dropped, its "Running upgrade" lines are kept
        migration = logging.getLogger("alembic.runtime.migration")
        assert not migration.filter(
            logging.LogRecord(migration.name, logging.INFO, "", 1, "Context impl X.", None, None)
        )
        assert migration.filter(
            logging.LogRecord(migration.name, logging.INFO, "", 1, "Running upgrade", None, None)
        )
    finally:
        root.handlers[:], level = saved
        root.setLevel(level)
