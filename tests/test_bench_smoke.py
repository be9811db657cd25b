"""`make bench`'s harness at toy scale, so it cannot silently rot: the set-based seed writes what
the app reads (the pre-flight's expectations: memory injected with the stored tokens, the 20
stored messages loaded), and bench/explain.py plans the app's own hot statements. No wrk: the
timed part needs it and runs only in `make bench`."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator

import asyncpg
import httpx
import pytest
from asgi_lifespan import LifespanManager
from pydantic import SecretStr
from sqlalchemy import make_url

from app.kit.auth.mint import issue_token
from app.kit.config import PROJECT_ROOT, Settings
from app.kit.principal import Principal
from app.main import create_app
from bench import explain
from bench.run_bench import CONTEXT_QUESTION, JWT_SECRET, plain_dsn
from bench.seed import COMPANY, HISTORY_MESSAGES, SPACE, context_chat, seed_ours, user_id
from tests.helpers.db import admin_execute

USERS = 3


@pytest.fixture
async def bench_database(server_url: str) -> AsyncIterator[str]:
    name = f"cms_bench_smoke_{uuid.uuid4().hex[:8]}"
    await admin_execute(server_url, f'CREATE DATABASE "{name}"')
    try:
        yield make_url(server_url).set(database=name).render_as_string(hide_password=False)
    finally:
        await admin_execute(server_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


async def test_the_seed_is_what_the_app_reads_and_the_plans_are_the_apps(
    bench_database: str,
) -> None:
    settings = Settings(
        _env_file=None,
        database_url=bench_database,
        environment="test",
        jwt_secret=SecretStr(JWT_SECRET),
        worker_enabled=False,
    )
    dsn = plain_dsn(bench_database)
    stored_tokens = await seed_ours(dsn, settings, USERS)

    app = create_app(settings)
    async with LifespanManager(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://bench") as client:
            token = issue_token(settings, Principal(user_id(1), COMPANY, frozenset()))
            response = await client.post(
                f"/v1/chats/{context_chat(1)}/context",
                json={
                    "space_id": SPACE,
                    "messages": [{"role": "user", "content": CONTEXT_QUESTION}],
                },
                headers={"Authorization": f"Bearer {token}"},
            )
    assert response.status_code == 200, response.text
    answer = response.json()
    assert answer["memory"]["injected"] is True
    assert answer["memory"]["tokens"] == stored_tokens
    assert answer["history"]["loaded_messages"] == HISTORY_MESSAGES

    plans = await explain.hot_plans(dsn, COMPANY, user_id(1), context_chat(1), SPACE)
    by_name = {plan.name: plan for plan in plans}
    assert by_name["/context: the one SELECT, no seqscan"].sequential_scans == []
    assert by_name["/turns: the settings read, no seqscan"].sequential_scans == []
    write = next(plan for name, plan in by_name.items() if name.startswith("/turns: the write"))
    assert by_name[f"{write.name}, no seqscan"].sequential_scans == []
    assert "Insert on chat_messages" in write.text
    conn = await asyncpg.connect(dsn)
    try:  # the write was explained in a transaction that was rolled back
        assert (
            await conn.fetchval("SELECT count(*) FROM chat_messages WHERE chat_id LIKE '%-explain'")
            == 0
        )
    finally:
        await conn.close()


def test_the_cost_of_tracing_harness_measures_and_exports(server_url: str) -> None:
    """bench/tracing_cost.py at toy scale: all four settings answer, the table has both calls
    with a ratio per setting, and the traced apps exported to the sink in its own process."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    environ["DATABASE_URL"] = server_url
    script = str(PROJECT_ROOT / "bench" / "tracing_cost.py")
    done = subprocess.run(
        [sys.executable, script, "--block", "4", "--rounds", "2"],
        env=environ,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    rows = {
        line.split("|")[1].strip(): line
        for line in done.stdout.splitlines()
        if line.startswith("| POST")
    }
    assert set(rows) == {"POST /context", "POST /turns"}
    for row in rows.values():
        ratios = re.findall(r"\*\*(\d+\.\d\d)\*\*", row)
        assert len(ratios) == 3  # 0 %, 10 % and always, each against off
    exports = re.search(r"OTLP sink: (\d+) exports, ([\d,]+) bytes", done.stdout)
    assert exports is not None, done.stdout
    assert int(exports.group(1)) > 0
