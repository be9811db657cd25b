"""Quick, in-process look at the two hot-path calls: N sequential requests handed straight to
the ASGI app (no network, no uvicorn, no HTTP client) against raw asyncpg running the same SQL,
with the CPU time per request.

    .venv/bin/python bench/hot_path_quick.py [--requests 500] [--profile]

Uses DATABASE_URL when set, else the embedded PostgreSQL (var/pg). Creates two scratch
databases, ours (migrated; one user: flags on, a ~1,000-token profile, 20 stored messages) and
the reference app's (its docstring's seed at 100 users), runs `bench/reference_app.py`
in-process beside the service, and drops both at the end. Sequential latency and CPU only: it
shows where the time of one request goes, not throughput; `make bench` (wrk, uvicorn) is the
real comparison, see docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import importlib.util
import os
import pstats
import statistics
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import orjson
from asgi_lifespan import LifespanManager
from sqlalchemy import make_url, text

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from app.enablement.decision import FLAG_CONTEXT_MEMORY
from app.enablement.repository import enablement_params
from app.folders import service as folders
from app.kit.auth.mint import issue_token
from app.kit.config import PROJECT_ROOT, Settings, to_asyncpg_url
from app.kit.db.migrations import run_migrations
from app.kit.embedded_pg import EmbeddedPostgres
from app.kit.observability import configure_logging
from app.kit.principal import Principal
from app.kit.tokens import TokenCounters
from app.main import create_app
from app.profiles import service as profiles
from app.profiles.document import Frontmatter, Profile, Section, render, render_body
from app.turns import repository as turns_repository
from bench.run_bench import REFERENCE_APP, TURN_TEXT, plain_dsn, seed_reference

STORED = TokenCounters().stored

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


def profile_document() -> tuple[str, int]:
    bullets = {
        section: [
            f"{section.value} note {n}: prefers concise answers about topic {n}" for n in range(8)
        ]
        for section in (Section.IDENTITY, Section.COMMUNICATION, Section.WORK, Section.SKILLS)
    }
    profile = Profile.from_sections(Frontmatter(user_id=USER, turn_count=3), bullets)
    return render(profile), STORED.count(render_body(profile))


async def seed(app: Any, client: httpx.AsyncClient, headers: dict[str, str]) -> None:
    document, tokens = profile_document()
    principal = Principal(user_id=USER, company_id=COMPANY, roles=frozenset())
    async with app.state.database.sessionmaker() as session, session.begin():
        await session.execute(
            text(
                "INSERT INTO company_feature_flags"
                " (company_id, flag, enabled, updated_by_company_id, updated_by)"
                " VALUES (:c, :f, true, :c, 'bench')"
            ),
            {"c": COMPANY, "f": FLAG_CONTEXT_MEMORY},
        )
        folder_id, _ = await folders.ensure_user_folder(session, principal)
        await profiles.ensure_memory_file(session, COMPANY, USER, folder_id)
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


def bench_settings(database_url: str) -> Settings:
    """The app's settings for an in-process bench: one user sends every request, so rate limits
    it never reaches, as in `make bench`, and no quota of waiting jobs (no worker drains them
    here; one user would reach it at once)."""
    never_reached = {
        f"rate_limit_{route_class}_{scope}": "10000000/1"
        for route_class in ("context", "turns", "consolidations", "exports", "memory_writes")
        for scope in ("user", "company")
    }
    return Settings(
        _env_file=None,
        database_url=database_url,
        worker_enabled=False,
        llm_provider="rules",
        quota_user_queued_jobs=0,
        **never_reached,  # type: ignore[arg-type]
    )


class AsgiCaller:
    """Calls the ASGI app with a prepared scope: the cheapest way in, so the CPU per request is
    the app's own (plus one asyncio task)."""

    def __init__(self, app: Any, headers: dict[str, str]) -> None:
        self.app = app
        self.headers = [(k.lower().encode(), v.encode()) for k, v in headers.items()]

    async def __call__(self, method: str, path: str, body: bytes = b"") -> tuple[int, bytes]:
        headers = [*self.headers, (b"content-type", b"application/json")]
        headers.append((b"content-length", str(len(body)).encode()))
        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": method,
            "scheme": "http",
            "path": path,
            "raw_path": path.encode(),
            "query_string": b"",
            "root_path": "",
            "headers": headers,
            "client": ("127.0.0.1", 1),
            "server": ("127.0.0.1", 80),
            "state": {},
        }
        sent = False
        status = 0
        chunks: list[bytes] = []

        async def receive() -> dict[str, Any]:
            nonlocal sent
            if sent:
                return {"type": "http.disconnect"}
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}

        async def send(message: dict[str, Any]) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            elif message["type"] == "http.response.body":
                chunks.append(message.get("body", b""))

        await self.app(scope, receive, send)
        return status, b"".join(chunks)


async def timed(label: str, requests: int, call: Callable[[], Awaitable[None]]) -> float:
    for _ in range(min(50, requests)):
        await call()
    samples = []
    cpu_started = time.process_time()
    for _ in range(requests):
        started = time.perf_counter()
        await call()
        samples.append((time.perf_counter() - started) * 1000)
    cpu_us = (time.process_time() - cpu_started) / requests * 1e6
    samples.sort()
    mean = statistics.fmean(samples)
    p99 = samples[int(len(samples) * 0.99) - 1]
    print(
        f"  {label:<52} mean {mean:6.3f} ms  p50 {samples[len(samples) // 2]:6.3f}  p99 {p99:6.3f}"
        f"  CPU {cpu_us:5.0f} µs"
    )
    return mean


def load_reference_app(dsn: str) -> Any:
    """bench/reference_app.py as a module, reading `PG_DSN` at import as it does under uvicorn."""
    os.environ["PG_DSN"] = dsn
    spec = importlib.util.spec_from_file_location("reference_app", REFERENCE_APP)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.app


async def run(server_url: str, requests: int, *, profile: bool) -> None:
    name = f"cms_bench_{uuid.uuid4().hex[:8]}"
    reference_db = f"{name}_ref"
    admin = await asyncpg.connect(**asyncpg_params(server_url))
    await admin.execute(f'CREATE DATABASE "{name}"')
    await admin.execute(f'CREATE DATABASE "{reference_db}"')
    url = make_url(server_url).set(database=name).render_as_string(hide_password=False)
    reference_dsn = plain_dsn(url, reference_db)
    try:
        await seed_reference(reference_dsn, 100)
        await asyncio.to_thread(run_migrations, url)
        settings = bench_settings(url)
        app = create_app(settings)
        # after the app (the MCP server's setup gives the root logger a console handler at
        # INFO): a log line per request would be most of what is measured
        configure_logging("WARNING")
        token = issue_token(settings, Principal(USER, COMPANY, frozenset()))
        headers = {"Authorization": f"Bearer {token}"}
        reference = load_reference_app(reference_dsn)
        async with LifespanManager(app), LifespanManager(reference):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://bench") as client:
                await seed(app, client, headers)
                await compare(
                    AsgiCaller(app, headers),
                    AsgiCaller(reference, {}),
                    url,
                    requests,
                    profile=profile,
                )
    finally:
        for database in (name, reference_db):
            await admin.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
        await admin.close()


async def compare(
    call: AsgiCaller,
    reference: AsgiCaller,
    url: str,
    requests: int,
    *,
    profile: bool = False,
) -> None:
    context_body = orjson.dumps(
        {"space_id": SPACE, "messages": [{"role": "user", "content": "Hi there"}]}
    )
    turn_body = orjson.dumps(  # the sizes `make bench` sends, on both sides
        {
            "space_id": SPACE,
            "messages": [{"role": "user", "content": TURN_TEXT}],
            "response": {"role": "assistant", "content": TURN_TEXT},
        }
    )
    reference_turn_body = orjson.dumps({"user": TURN_TEXT, "assistant": TURN_TEXT})

    async def context_call() -> None:
        status, body = await call("POST", f"/v1/chats/{CHAT}/context", context_body)
        assert status == 200, body
        assert orjson.loads(body)["memory"]["injected"]

    async def turn_call() -> None:
        status, body = await call("POST", f"/v1/chats/{CHAT}-t/turns", turn_body)
        assert status == 202, body

    params = enablement_params(COMPANY, USER, SPACE) | {"chat_id": CHAT, "history_limit": 50}
    sql, names = turns_repository._CONTEXT_WITH_HISTORY
    args = [params[name] for name in names]
    pool = await asyncpg.create_pool(**asyncpg_params(url), min_size=2, max_size=2)
    assert pool is not None

    async def raw_select() -> None:
        async with pool.acquire() as conn:
            await conn.fetchrow(sql, *args)

    async def healthz() -> None:
        assert (await call("GET", "/healthz"))[0] == 200

    async def reference_inject() -> None:
        assert (await reference("GET", "/apg/inject/7"))[0] == 200

    async def reference_turn() -> None:
        assert (await reference("POST", "/apg/turn/107", reference_turn_body))[0] == 200

    async def reference_const() -> None:
        assert (await reference("GET", "/const"))[0] == 200

    async def who_am_i() -> None:
        assert (await call("GET", "/v1/me"))[0] == 200

    print(f"{requests} sequential requests each (after 50 warm-up), in-process:")
    await timed("GET /healthz (the floor: no auth, no DB)", requests, healthz)
    await timed("reference GET /const", requests, reference_const)
    await timed("GET /v1/me (floor + a cached token)", requests, who_am_i)
    ours = await timed("POST /context (full stack)", requests, context_call)
    await timed("reference GET /apg/inject", requests, reference_inject)
    raw = await timed("raw asyncpg: the same SELECT (pool acquire + reset)", requests, raw_select)
    await timed("POST /turns (full stack)", requests, turn_call)
    await timed("reference POST /apg/turn", requests, reference_turn)
    await pool.close()
    print(f"  /context / raw SELECT = {ours / raw:.1f}x (wall time)")
    if profile:
        for label, request in (("POST /context", context_call), ("POST /turns", turn_call)):
            profiler = cProfile.Profile()
            profiler.enable()
            for _ in range(requests):
                await request()
            profiler.disable()
            print(f"\n{label}: top functions by own time, {requests} requests under cProfile")
            pstats.Stats(profiler).sort_stats("tottime").print_stats(25)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--requests", type=int, default=500)
    parser.add_argument(
        "--profile", action="store_true", help="then cProfile both calls, top 25 by own time"
    )
    args = parser.parse_args()
    configured = os.environ.get("DATABASE_URL")
    embedded = None if configured else EmbeddedPostgres(PROJECT_ROOT / "var" / "pg")
    server_url = to_asyncpg_url(configured) if configured else to_asyncpg_url(embedded.start())  # type: ignore[union-attr]
    try:
        asyncio.run(run(server_url, args.requests, profile=args.profile))
    finally:
        if embedded is not None:
            embedded.stop()


if __name__ == "__main__":
    main()
