"""A database outage is a 503 with Retry-After, and the service recovers by itself.

Runs against a private embedded PostgreSQL that the test really stops and starts again.
"""

from __future__ import annotations

import asyncio
import re
import tempfile
from pathlib import Path

import httpx
import pytest
from asgi_lifespan import LifespanManager
from sqlalchemy import text

from app.kit.auth.mint import issue_token
from app.kit.config import PROJECT_ROOT, to_asyncpg_url
from app.kit.db.migrations import run_migrations
from app.kit.deps import SessionDep
from app.kit.embedded_pg import EmbeddedPostgres
from app.kit.principal import Principal
from app.main import create_app
from tests.helpers.apps import make_settings


@pytest.mark.slow
async def test_outage_gives_503_then_recovers() -> None:
    (PROJECT_ROOT / "var").mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(dir=PROJECT_ROOT / "var", prefix="outage-") as tmp:
        data_dir = Path(tmp) / "pg"
        server = EmbeddedPostgres(data_dir)
        url = to_asyncpg_url(await asyncio.to_thread(server.start))
        await asyncio.to_thread(run_migrations, url)
        settings = make_settings(url, db_connect_timeout_seconds=1.0)
        app = create_app(settings)
        token = issue_token(settings, Principal("alice", "acme", frozenset()))
        context_body = {"space_id": "s1", "messages": [{"role": "user", "content": "Hi"}]}
        bearer = {"Authorization": f"Bearer {token}"}

        async def load_context(http: httpx.AsyncClient) -> httpx.Response:
            """The hot path, on the driver pool rather than the session's."""
            return await http.post("/v1/chats/c1/context", json=context_body, headers=bearer)

        @app.get("/_probe/count")
        async def count(session: SessionDep) -> dict[str, int]:
            return {"one": int((await session.execute(text("SELECT 1"))).scalar_one())}

        try:
            async with LifespanManager(app):
                transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
                async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
                    assert (await http.get("/_probe/count")).json() == {"one": 1}
                    assert (await load_context(http)).status_code == 200  # driver pool

                    await asyncio.to_thread(server.stop)
                    down = await http.get("/_probe/count")
                    assert down.status_code == 503
                    assert down.headers["retry-after"] == "5"
                    assert down.headers["content-type"] == "application/problem+json"
                    hot_down = await http.post(
                        "/v1/chats/c1/context", json=context_body, headers=bearer
                    )
                    assert hot_down.status_code == 503
                    assert hot_down.headers["retry-after"] == "5"
                    assert (await http.get("/readyz")).status_code == 503
                    assert (await http.get("/healthz")).status_code == 200  # alive, not ready

                    server = EmbeddedPostgres(data_dir)
                    await asyncio.to_thread(server.start)
                    # a pooled connection from before the restart may answer one more 503;
                    # that error recycles the pool, and the next request is served
                    statuses = [(await http.get("/_probe/count")).status_code for _ in range(3)]
                    assert statuses[-1] == 200, statuses
                    assert set(statuses) <= {200, 503}
                    assert statuses.count(503) <= 1
                    hot = [
                        (
                            await http.post(
                                "/v1/chats/c1/context", json=context_body, headers=bearer
                            )
                        ).status_code
                        for _ in range(3)
                    ]
                    assert hot[-1] == 200, hot
                    assert set(hot) <= {200, 503}
                    assert hot.count(503) <= 1
                    assert (await http.get("/readyz")).status_code == 200
                    metrics = (await http.get("/metrics")).text
                    counted = re.search(r"^database_unavailable_total (\S+)$", metrics, re.M)
                    assert counted is not None
                    assert float(counted.group(1)) == 2 + statuses.count(503) + hot.count(503)
        finally:
            await asyncio.to_thread(server.stop)
