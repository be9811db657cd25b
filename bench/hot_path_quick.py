"""Quick, in-process look at the two hot-path calls: N sequential requests through
`httpx.ASGITransport` (no network, no uvicorn) against raw asyncpg running the same SQL.

    .venv/bin/python bench/hot_path_quick.py [--requests 500]

Uses DATABASE_URL when set, else the embedded PostgreSQL (var/pg). Creates a scratch database,
migrates it, seeds one user (flags on, a ~1,000-token profile, 20 stored messages) and drops it
at the end. Sequential latency only: it shows where the time of one request goes, not
throughput; `make bench` (wrk, uvicorn) is the real comparison, see docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import asyncpg
import httpx
from asgi_lifespan import LifespanManager
from sqlalchemy import Dialect, TextClause, make_url, text

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from app.auth import Principal, issue_token
from app.config import PROJECT_ROOT, Settings, to_asyncpg_url
from app.db import run_migrations
from app.embedded_pg import EmbeddedPostgres
from app.enablement.decision import FLAG_CONTEXT_MEMORY
from app.folders import service as folders
from app.main import create_app
from app.profiles.document import Frontmatter, Profile, Section, render, render_body
from app.profiles.versions import STORED_TOKEN_COUNTER
from app.turns import repository as turns_repository

COMPANY, USER, SPACE, CHAT = "bench-co", "bench-user", "space-1", "bench-chat"


def asyncpg_params(url: str, database: str | None = None) -> dict[str, Any]:
    parsed = make_url(url)
    return {
        "user": parsed.username or "postgres",
        "password": parsed.password or None,
        "database": database or parsed.database or "postgres",
        "host": parsed.query.get("host") or parsed.host or "127.0.0.1",
        "port": parsed.port or 5432,
    }


def positional(
    statement: TextClause, params: dict[str, Any], dialect: Dialect
) -> tuple[str, list[Any]]:
    """The statement as asyncpg takes it ($1, $2, ...) with its arguments in order."""
    compiled = statement.compile(dialect=dialect)
    order = compiled.positiontup or []
    return compiled.string, [params[name] for name in order]


def profile_document() -> tuple[str, int]:
    bullets = {
        section: [
            f"{section.value} note {n}: prefers concise answers about topic {n}" for n in range(8)
        ]
        for section in (Section.IDENTITY, Section.COMMUNICATION, Section.WORK, Section.SKILLS)
    }
    profile = Profile.from_sections(Frontmatter(user_id=USER, turn_count=3), bullets)
    return render(profile), STORED_TOKEN_COUNTER.count(render_body(profile))


async def seed(app: Any, client: httpx.AsyncClient, headers: dict[str, str]) -> None:
    document, tokens = profile_document()
    principal = Principal(user_id=USER, company_id=COMPANY, roles=frozenset())
    async with app.state.database.sessionmaker() as session, session.begin():
        await session.execute(
            text(
                "INSERT INTO company_feature_flags (company_id, flag, enabled, updated_by)"
                " VALUES (:c, :f, true, 'bench')"
            ),
            {"c": COMPANY, "f": FLAG_CONTEXT_MEMORY},
        )
        folder_id, _ = await folders.ensure_user_folder(session, principal)
        await folders.ensure_memory_file(session, COMPANY, USER, folder_id)
        await session.execute(
            text(
                "INSERT INTO memory_versions (company_id, user_id, version, content, sha256,"
                " tokens, reason) VALUES (:c, :u, 1, :d, :s, :t, 'consolidation')"
            ),
            {"c": COMPANY, "u": USER, "d": document, "s": "0" * 64, "t": tokens},
        )
        await session.execute(
            text("UPDATE memory_files SET head_version = 1 WHERE company_id = :c AND user_id = :u"),
            {"c": COMPANY, "u": USER},
        )
    for n in range(10):
        body = {
            "space_id": SPACE,
            "messages": [{"role": "user", "content": f"question {n} " + "lorem ipsum " * 40}],
            "response": {"role": "assistant", "content": f"answer {n} " + "dolor sit " * 40},
        }
        response = await client.post(f"/v1/chats/{CHAT}/turns", json=body, headers=headers)
        assert response.status_code == 202, response.text


async def timed(label: str, requests: int, call: Callable[[], Awaitable[None]]) -> float:
    for _ in range(min(50, requests)):
        await call()
    samples = []
    for _ in range(requests):
        started = time.perf_counter()
        await call()
        samples.append((time.perf_counter() - started) * 1000)
    samples.sort()
    mean = statistics.fmean(samples)
    p99 = samples[int(len(samples) * 0.99) - 1]
    print(
        f"  {label:<52} mean {mean:6.3f} ms  p50 {samples[len(samples) // 2]:6.3f}  p99 {p99:6.3f}"
    )
    return mean


async def run(server_url: str, requests: int) -> None:
    name = f"cms_bench_{uuid.uuid4().hex[:8]}"
    admin = await asyncpg.connect(**asyncpg_params(server_url))
    await admin.execute(f'CREATE DATABASE "{name}"')
    url = make_url(server_url).set(database=name).render_as_string(hide_password=False)
    try:
        await asyncio.to_thread(run_migrations, url)
        settings = Settings(
            _env_file=None, database_url=url, worker_enabled=False, llm_provider="rules"
        )
        app = create_app(settings)
        token = issue_token(settings, sub=USER, company_id=COMPANY)
        headers = {"Authorization": f"Bearer {token}"}
        async with LifespanManager(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://bench") as client:
                await seed(app, client, headers)
                await compare(client, headers, url, requests, app.state.database.engine.dialect)
    finally:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()


async def compare(
    client: httpx.AsyncClient, headers: dict[str, str], url: str, requests: int, dialect: Dialect
) -> None:
    context_body = {"space_id": SPACE, "messages": [{"role": "user", "content": "Hi there"}]}
    turn_body = context_body | {"response": {"role": "assistant", "content": "Hello!"}}

    async def context_call() -> None:
        response = await client.post(
            f"/v1/chats/{CHAT}/context", json=context_body, headers=headers
        )
        assert response.status_code == 200
        assert response.json()["memory"]["injected"]

    async def turn_call() -> None:
        response = await client.post(f"/v1/chats/{CHAT}-t/turns", json=turn_body, headers=headers)
        assert response.status_code == 202

    params = turns_repository._settings_params(COMPANY, USER, SPACE) | {
        "chat_id": CHAT,
        "history_limit": 50,
    }
    sql, args = positional(turns_repository._CONTEXT_WITH_HISTORY, params, dialect)
    pool = await asyncpg.create_pool(**asyncpg_params(url), min_size=2, max_size=2)
    assert pool is not None

    async def raw_select() -> None:
        async with pool.acquire() as conn:
            await conn.fetchrow(sql, *args)

    async def raw_select_in_transaction() -> None:
        async with pool.acquire() as conn, conn.transaction():
            await conn.fetchrow(sql, *args)

    async def healthz() -> None:
        assert (await client.get("/healthz")).status_code == 200

    async def who_am_i() -> None:
        assert (await client.get("/v1/me", headers=headers)).status_code == 200

    print(f"{requests} sequential requests each (after 50 warm-up), in-process:")
    await timed("GET /healthz (ASGITransport floor: no auth, no DB)", requests, healthz)
    await timed("GET /v1/me (floor + token verification)", requests, who_am_i)
    ours = await timed("POST /context (ASGITransport, full stack)", requests, context_call)
    raw = await timed("raw asyncpg: the same SELECT", requests, raw_select)
    raw_tx = await timed(
        "raw asyncpg: BEGIN + the same SELECT + COMMIT", requests, raw_select_in_transaction
    )
    await timed("POST /turns (ASGITransport, full stack)", requests, turn_call)
    await pool.close()
    print(f"  /context / raw SELECT = {ours / raw:.1f}x;", end=" ")
    print(f"/context / raw SELECT in a transaction = {ours / raw_tx:.1f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--requests", type=int, default=500)
    args = parser.parse_args()
    configured = os.environ.get("DATABASE_URL")
    embedded = None if configured else EmbeddedPostgres(PROJECT_ROOT / "var" / "pg")
    server_url = to_asyncpg_url(configured) if configured else to_asyncpg_url(embedded.start())  # type: ignore[union-attr]
    try:
        asyncio.run(run(server_url, args.requests))
    finally:
        if embedded is not None:
            embedded.stop()


if __name__ == "__main__":
    main()
