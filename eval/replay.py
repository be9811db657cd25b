"""Replaying the corpus through the real service: a scratch database on a real PostgreSQL, the
app (with its consolidation worker) served by uvicorn on an ephemeral port, and the corpus's
turns sent over HTTP as an orchestrator sends them (`/context`, then `/turns`).

Paced turns wait for the consolidation of everything saved before them; a burst turn is saved
straight after the previous one, so the worker may coalesce the burst into one claim. After a
user's last turn the replay waits until the company's queue is empty (condensations included),
then reads the final profile and its version.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import secrets
import socket
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import asyncpg
import httpx
import uvicorn
from pydantic import SecretStr
from sqlalchemy import make_url

from app.enablement.decision import FLAG_CONTEXT_MEMORY
from app.kit.auth.mint import issue_token
from app.kit.config import PROJECT_ROOT, Settings, to_asyncpg_url
from app.kit.db.migrations import run_migrations
from app.kit.embedded_pg import EmbeddedPostgres
from app.kit.principal import Principal
from app.main import create_app
from app.profiles.document import SECTIONS, Section, parse
from eval.corpus import UserScript

COMPANY: Final = "eval-co"
SPACE: Final = "eval-space"
OPERATOR: Final = "eval-operator"
SPACE_ADMIN: Final = "eval-admin"
SYSTEM_PROMPT: Final = "You are a helpful assistant."
FINISHED: Final = frozenset({"succeeded", "dead"})
POLL_SECONDS: Final = 0.05
RUN_LIMIT: Final = "off"
EMBEDDED_DIR: Final = PROJECT_ROOT / "var" / "eval-pg"
_SAMPLE = re.compile(r"^(?P<name>[a-zA-Z_:][\w:]*)(?P<labels>\{[^}]*\})? (?P<value>\S+)$")


class ReplayError(RuntimeError):
    """The service refused a call or a job did not finish in time."""


@dataclass
class UserRun:
    """What replaying one user produced: the final profile, versions and job results."""

    user: UserScript
    profile: dict[Section, tuple[str, ...]] = field(default_factory=dict)
    versions_written: int = 0
    jobs: dict[str, int] = field(default_factory=dict)  # outcome or "dead:<error class>"
    seconds: float = 0.0


# --- PostgreSQL ---------------------------------------------------------------------------------


def server_url() -> tuple[str, EmbeddedPostgres | None]:
    """`EVAL_DATABASE_URL`, `DATABASE_URL` or `TEST_DATABASE_URL` (a server the eval may create
    a database on), else the embedded PostgreSQL in var/eval-pg (returned to be stopped)."""
    for name in ("EVAL_DATABASE_URL", "DATABASE_URL", "TEST_DATABASE_URL"):
        configured = os.environ.get(name)
        if configured:
            return to_asyncpg_url(configured), None
    embedded = EmbeddedPostgres(EMBEDDED_DIR)
    return to_asyncpg_url(embedded.start()), embedded


@contextlib.asynccontextmanager
async def scratch_database(server: str) -> AsyncIterator[str]:
    """A fresh database on `server`, migrated to head by Alembic, dropped afterwards."""
    name = f"cms_eval_{uuid.uuid4().hex[:12]}"
    await _admin(server, f'CREATE DATABASE "{name}"')
    url = make_url(server).set(database=name).render_as_string(hide_password=False)
    try:
        await asyncio.to_thread(run_migrations, url)
        yield url
    finally:
        await _admin(server, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


async def connect_database(url: str) -> asyncpg.Connection:
    """A plain asyncpg connection to the database of `url` (an SQLAlchemy URL)."""
    parsed = make_url(url)
    return await asyncpg.connect(
        user=parsed.username or "postgres",
        password=parsed.password or None,
        database=parsed.database or "postgres",
        host=parsed.query.get("host") or parsed.host or "127.0.0.1",
        port=parsed.port or 5432,
    )


async def _admin(url: str, statement: str) -> None:
    conn = await connect_database(url)
    try:
        await conn.execute(statement)
    finally:
        await conn.close()


# --- the service --------------------------------------------------------------------------------


def eval_settings(database_url: str, **model: Any) -> Settings:
    """The service's settings for a run: the environment's (so knobs such as
    `CONSOLIDATION_STRATEGY` apply), with the scratch database, a private signing key, an
    in-process worker that polls often, and the model settings of the engine."""
    return Settings(
        _env_file=None,
        environment="development",
        database_url=database_url,
        jwt_secret=SecretStr(secrets.token_urlsafe(32)),
        worker_enabled=True,
        worker_poll_seconds=POLL_SECONDS,
        # A measurement, not a load test: the policy figures write and export more per minute
        # (and read more exports of one company at once) than a company's limits allow.
        rate_limit_memory_writes_user=RUN_LIMIT,
        rate_limit_memory_writes_company=RUN_LIMIT,
        rate_limit_exports_user=RUN_LIMIT,
        rate_limit_exports_company=RUN_LIMIT,
        export_read_concurrency=64,
        export_read_company_concurrency=64,
        **model,
    )


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


@contextlib.asynccontextmanager
async def served(settings: Settings) -> AsyncIterator[str]:
    """The app (lifespan and worker included) on 127.0.0.1; yields its base URL."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(
        create_app(settings),
        log_config=None,
        access_log=False,
        lifespan="on",
        ws="none",
        timeout_graceful_shutdown=5,
        # longer than any pause of the replay's client (a worker drained on a loaded machine):
        # a keep-alive connection the server closes as the client reuses it is a ReadError
        timeout_keep_alive=120,
    )
    server = _Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        while not server.started:
            if task.done():
                task.result()
                raise ReplayError("the service exited during startup")
            await asyncio.sleep(0.01)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        await task
        sock.close()


class Service:
    """The HTTP calls of the replay, each with a token minted for its caller."""

    def __init__(self, http: httpx.AsyncClient, settings: Settings, job_timeout: float) -> None:
        self.http = http
        self.settings = settings
        self.job_timeout = job_timeout

    def auth(self, user: str, *roles: str, company: str = COMPANY) -> dict[str, str]:
        token = issue_token(self.settings, Principal(user, company, frozenset(roles)))
        return {"Authorization": f"Bearer {token}"}

    async def call(self, method: str, path: str, auth: dict[str, str], **kw: Any) -> Any:
        response = await self.http.request(method, path, headers=auth, **kw)
        if response.status_code == 404 and method == "GET":
            return None
        if response.is_error:
            raise ReplayError(f"{method} {path}: {response.status_code} {response.text[:300]}")
        return response.json()

    async def enable(self, model: str) -> None:
        """The company's context-memory flag on; the space on, without web search, consolidating
        with `model`."""
        operator = self.auth(OPERATOR, "operator")
        flag = f"/v1/companies/{COMPANY}/feature-flags/{FLAG_CONTEXT_MEMORY}"
        await self.call("PUT", flag, operator, json={"enabled": True})
        space = {
            "context_memory": True,
            "web_search": False,
            "user_memory": {"language_model": model},
        }
        admin = self.auth(SPACE_ADMIN, "space_admin")
        await self.call("PATCH", f"/v1/spaces/{SPACE}", admin, json=space)

    async def replay(self, script: UserScript) -> UserRun:
        """Every turn of `script` in one chat, then the final profile (see the module doc)."""
        started = time.monotonic()
        auth = self.auth(script.id)
        run = UserRun(script)
        head = await self.call("GET", "/v1/me/memory", auth)
        first_version = 0 if head is None else int(head["version"])
        chat = f"eval-{script.id}-{uuid.uuid4().hex[:6]}"
        pending: list[str] = []
        for number, turn in enumerate(script.turns, 1):
            if not turn.burst:
                await self._finish(pending, auth, run)
            messages = [{"role": "user", "content": turn.user}]
            await self.call(
                "POST",
                f"/v1/chats/{chat}/context",
                auth,
                json={"space_id": SPACE, "system_prompt": SYSTEM_PROMPT, "messages": messages},
            )
            saved = await self.call(
                "POST",
                f"/v1/chats/{chat}/turns",
                {**auth, "Idempotency-Key": str(uuid.uuid4())},
                json={
                    "space_id": SPACE,
                    "messages": messages,
                    "response": {"content": turn.assistant},
                },
            )
            job = saved["consolidation"]["job_id"]
            if job is None:
                why = saved["consolidation"]["reason"]
                raise ReplayError(f"{script.id} turn {number}: no consolidation queued ({why})")
            pending.append(job)
        await self._finish(pending, auth, run)
        await self._queue_idle()
        head = await self.call("GET", "/v1/me/memory", auth)
        if head is not None:
            profile = parse(head["content"])
            run.profile = {section: profile.bullets(section) for section in SECTIONS}
            run.versions_written = int(head["version"]) - first_version
        run.seconds = time.monotonic() - started
        return run

    async def model_metrics(self) -> dict[str, float]:
        """The service's own model accounting from `/metrics`: every `model_*` counter, summed
        over its labels (`model_tokens_total{direction="in"}` is kept apart as `..._in`)."""
        response = await self.http.get("/metrics")
        response.raise_for_status()
        totals: dict[str, float] = {}
        for line in response.text.splitlines():
            found = _SAMPLE.match(line)
            if found is None or not found["name"].startswith("model_"):
                continue
            if found["name"].endswith("_created"):  # when the counter was created, not a count
                continue
            name = found["name"]
            direction = re.search(r'direction="(\w+)"', found["labels"] or "")
            if direction is not None:
                name = f"{name}_{direction[1]}"
            totals[name] = totals.get(name, 0.0) + float(found["value"])
        return totals

    async def _finish(self, pending: list[str], auth: dict[str, str], run: UserRun) -> None:
        """Wait for every pending job; count how each ended."""
        for job_id in pending:
            path = f"/v1/jobs/{job_id}"

            async def read(path: str = path) -> Any:
                return await self.call("GET", path, auth)

            job = await self._wait(read)
            if job["status"] == "succeeded":
                key = str(job["outcome"])
            else:
                key = f"dead:{(job['error'] or {}).get('class')}"
            run.jobs[key] = run.jobs.get(key, 0) + 1
        pending.clear()

    async def _queue_idle(self) -> None:
        operator = self.auth(OPERATOR, "operator")

        async def busy() -> Any:
            for status in ("queued", "running", "retrying"):
                page = await self.call(
                    "GET", f"/v1/companies/{COMPANY}/jobs", operator, params={"status": status}
                )
                if page["items"]:
                    return {"status": status}
            return {"status": "succeeded"}

        await self._wait(busy)

    async def _wait(self, read: Callable[[], Awaitable[Any]]) -> Any:
        deadline = time.monotonic() + self.job_timeout
        while True:
            job = await read()
            if job is not None and job["status"] in FINISHED:
                return job
            if time.monotonic() > deadline:
                raise ReplayError(f"a job did not finish within {self.job_timeout:g} s: {job}")
            await asyncio.sleep(POLL_SECONDS)


def project_path(path: Path) -> str:
    with contextlib.suppress(ValueError):
        return str(path.resolve().relative_to(PROJECT_ROOT))
    return str(path)
