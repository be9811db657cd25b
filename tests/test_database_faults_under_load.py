"""Turn-saves under database faults: nothing acknowledged is lost, nothing is saved twice.

`python -m app serve` (the API and its in-process worker, as deployed) runs against a private
embedded PostgreSQL while client tasks save turns over HTTP on loopback, each retrying anything
but a 2xx with the same `Idempotency-Key`, honouring `Retry-After`. Meanwhile PostgreSQL is
stopped in immediate mode and started again, or the service's connections are terminated.
Every request is bounded by a client timeout: a hang fails the test as a 500 does.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import asyncpg
import httpx
import pytest

from app.kit.auth.mint import issue_token
from app.kit.config import PROJECT_ROOT, Settings
from app.kit.errors import PROBLEM_CONTENT_TYPE
from app.kit.principal import Principal
from tests.helpers.apps import COMPANY, SPACE, TEST_JWT_SECRET, make_settings
from tests.helpers.polling import wait_until
from tests.helpers.private_pg import PrivatePostgres
from tests.helpers.settings import enable_company

CLIENTS = 6  # concurrent client tasks, two per user: keys are scoped to their user
USERS_PER_TEST = 3
REQUEST_TIMEOUT_SECONDS = 10.0  # the client's bound on one request, answer included
RETRY_AFTER_SECONDS = 1  # the service's DB_UNAVAILABLE_RETRY_AFTER_SECONDS in these tests
KEY_RETRY_BUDGET_SECONDS = 30.0  # one key is retried at most this long
RECOVERY_SECONDS = 20.0  # "by itself, within seconds", generously for a loaded machine
APPLICATION_NAME = "context-memory"  # what the service's connections call themselves
SUCCESS = frozenset({201, 202})
ABANDON_EVERY = 3  # every third key's first attempt is given up on within 30 ms (see TurnLoad)
START_TIMEOUT_SECONDS = 90.0


# --- the service under test --------------------------------------------------------------------


@dataclass(frozen=True)
class Served:
    pg: PrivatePostgres
    http: httpx.AsyncClient
    settings: Settings  # the service's signing key and database, for tokens and checks
    log: Path

    def log_tail(self) -> str:
        return _tail(self.log)

    def bearer(self, user: str, roles: tuple[str, ...] = ()) -> dict[str, str]:
        token = issue_token(self.settings, Principal(user, COMPANY, frozenset(roles)))
        return {"Authorization": f"Bearer {token}"}


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _serve_env(database_url: str, workdir: Path) -> dict[str, str]:
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "PYTHONPATH": str(PROJECT_ROOT),
        "ENVIRONMENT": "test",
        "JWT_SECRET": TEST_JWT_SECRET,
        "JWT_PLATFORM": "true",  # the operator enables memory with a static token
        "LLM_PROVIDER": "rules",
        "LOG_LEVEL": "WARNING",
        "DATABASE_URL": database_url,
        "DB_CONNECT_TIMEOUT_SECONDS": "2",
        "DB_STATEMENT_TIMEOUT_MS": "5000",
        "DB_UNAVAILABLE_RETRY_AFTER_SECONDS": str(RETRY_AFTER_SECONDS),
        "WORKER_ENABLED": "true",
        "WORKER_POLL_SECONDS": "0.1",
        "WORKER_HEARTBEAT_FILE": str(workdir / "worker.heartbeat"),
        "JOB_LEASE_SECONDS": "5",
        # a job whose attempt a fault cut short runs again; enough attempts that repeated cuts
        # cannot dead-letter it (dead-lettering itself is proven in tests/consolidation)
        "JOB_MAX_ATTEMPTS": "10",
        # the clients save as fast as the service answers, retries included, faster than the
        # worker consolidates: the per-user rate limit would answer some of them 429 and the
        # quota of waiting jobs 409 (queue full), which is not what these faults are about (both
        # are proven in tests/rate_limits and tests/quotas)
        "RATE_LIMIT_TURNS_USER": "off",
        "RATE_LIMIT_TURNS_COMPANY": "off",
        "QUOTA_USER_QUEUED_JOBS": "0",
    }


@pytest.fixture(scope="module")
async def served() -> AsyncIterator[Served]:
    (PROJECT_ROOT / "var").mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(dir=PROJECT_ROOT / "var", prefix="faults-") as tmp:
        workdir = Path(tmp)
        async with PrivatePostgres(workdir / "pg") as pg:
            port = _free_port()
            log = workdir / "serve.log"
            with log.open("wb") as out:
                process = await asyncio.create_subprocess_exec(
                    *(sys.executable, "-m", "app", "serve", "--port", str(port)),
                    cwd=workdir,  # no .env of the project is read
                    env=_serve_env(pg.url, workdir),
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                )
            try:
                timeout = httpx.Timeout(REQUEST_TIMEOUT_SECONDS)
                async with httpx.AsyncClient(
                    base_url=f"http://127.0.0.1:{port}", timeout=timeout
                ) as http:
                    await _wait_until_ready(http, process, log)
                    yield Served(pg, http, make_settings(pg.url), log)
            finally:
                process.send_signal(signal.SIGTERM)
                try:
                    await asyncio.wait_for(process.wait(), 30)
                except TimeoutError:
                    process.kill()
                    await process.wait()


async def _wait_until_ready(
    http: httpx.AsyncClient, process: asyncio.subprocess.Process, log: Path
) -> None:
    async def ready() -> bool:
        assert process.returncode is None, f"serve exited:\n{_tail(log)}"
        with contextlib.suppress(httpx.TransportError):
            return (await http.get("/readyz")).status_code == 200
        return False

    await wait_until(
        ready, START_TIMEOUT_SECONDS, what=lambda: f"serve ready:\n{_tail(log)}", every=0.1
    )


def _tail(log: Path) -> str:
    return log.read_text(errors="replace")[-4000:]


async def _readiness(http: httpx.AsyncClient) -> httpx.Response:
    async with asyncio.timeout(REQUEST_TIMEOUT_SECONDS):
        return await http.get("/readyz")


async def _ready_within(http: httpx.AsyncClient, seconds: float) -> float:
    """Seconds until /readyz answers 200 (polled); fails after `seconds`."""
    started = time.monotonic()

    async def ready() -> bool:
        return (await _readiness(http)).status_code == 200

    await wait_until(ready, seconds, what="/readyz ready after the database came back", every=0.1)
    return time.monotonic() - started


# --- the load ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Answer:
    """One attempt as the client saw it; `status` None when no answer came (transport error or
    the client's timeout, named in `error`)."""

    key: str
    started: float
    ended: float
    status: int | None
    error: str | None = None
    retry_after: str | None = None
    content_type: str | None = None
    abandoned: bool = False


@dataclass(frozen=True)
class Ack:
    """A turn the service acknowledged (2xx), and what it said it saved and queued."""

    user: str
    key: str
    turn_id: str
    job_id: str
    replayed: bool


@dataclass
class TurnLoad:
    """`CLIENTS` tasks saving turns until stopped; each key is retried until a 2xx.

    Every `ABANDON_EVERY`th key's first attempt is abandoned a few milliseconds after it was
    sent, as by a client whose connection dropped: the service may or may not have saved it
    (it does not stop a request whose client left), so the retry must neither lose it nor save
    it twice; meanwhile it answers 409 to the same key.
    """

    served: Served
    users: tuple[str, ...]
    answers: list[Answer] = field(default_factory=list)
    acks: list[Ack] = field(default_factory=list)
    _stopping: asyncio.Event = field(default_factory=asyncio.Event)

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[TurnLoad]:
        tasks = [asyncio.create_task(self._client(n)) for n in range(CLIENTS)]
        try:
            yield self
        except BaseException:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise
        self._stopping.set()  # each client finishes the key it holds
        done = await asyncio.gather(*tasks, return_exceptions=True)
        failed = [result for result in done if isinstance(result, BaseException)]
        if failed:
            raise failed[0]

    async def acked(self, count: int, *, seconds: float = RECOVERY_SECONDS) -> None:
        """Wait until `count` turns in all were acknowledged."""
        await wait_until(
            lambda: len(self.acks) >= count,
            seconds,
            what=lambda: f"{count} turns acknowledged ({len(self.acks)} were)",
            every=0.05,
        )

    def unavailable_since(self, instant: float) -> int:
        return sum(a.status == 503 for a in self.answers if a.started >= instant)

    def clients_unavailable_since(self, instant: float) -> int:
        """How many clients met a 503 since `instant` (a key less its number names its client)."""
        return len(
            {
                a.key.rsplit("-", 1)[0]
                for a in self.answers
                if a.started >= instant and a.status == 503
            }
        )

    async def _client(self, number: int) -> None:
        user = self.users[number % len(self.users)]
        headers = self.served.bearer(user)
        sequence = 0
        abandon_after = random.Random(number).uniform
        while not self._stopping.is_set():
            key = f"{user}-c{number}-{sequence}"
            abandon = abandon_after(0.0, 0.03) if sequence % ABANDON_EVERY == 0 else None
            sequence += 1
            self.acks.append(await self._save(user, key, headers, abandon))

    async def _save(
        self, user: str, key: str, headers: dict[str, str], abandon: float | None
    ) -> Ack:
        body = {
            "space_id": SPACE,
            "messages": [{"role": "user", "content": f"I know tool {key}"}],
            "response": {"role": "assistant", "content": "Noted."},
        }
        keyed = headers | {"Idempotency-Key": key}
        deadline = time.monotonic() + KEY_RETRY_BUDGET_SECONDS
        while time.monotonic() < deadline:
            started = time.monotonic()
            try:
                async with asyncio.timeout(abandon or REQUEST_TIMEOUT_SECONDS):
                    response = await self.served.http.post(
                        "/v1/chats/faults/turns", json=body, headers=keyed
                    )
            except TimeoutError:
                self.answers.append(
                    Answer(key, started, time.monotonic(), None, abandoned=abandon is not None)
                )
                abandon = None
                continue
            except httpx.TransportError as error:
                self.answers.append(Answer(key, started, time.monotonic(), None, repr(error)))
                await asyncio.sleep(0.2)
                continue
            retry_after = response.headers.get("retry-after")
            self.answers.append(
                Answer(
                    key,
                    started,
                    time.monotonic(),
                    response.status_code,
                    retry_after=retry_after,
                    content_type=response.headers.get("content-type"),
                )
            )
            abandon = None
            if response.status_code in SUCCESS:
                saved = response.json()
                replayed = response.headers.get("idempotent-replayed") == "true"
                job_id = saved["consolidation"]["job_id"]
                return Ack(user, key, saved["turn_id"], job_id, replayed)
            wait = float(retry_after) if retry_after and retry_after.isdigit() else 0.2
            await asyncio.sleep(min(wait, 2.0))
        pytest.fail(f"{key} was not acknowledged in {KEY_RETRY_BUDGET_SECONDS} s")


# --- what must hold ----------------------------------------------------------------------------


def assert_only_well_formed_unavailability(served: Served, answers: list[Answer]) -> None:
    """Every attempt was answered in time, with a 2xx or a 503 problem carrying Retry-After
    (or, for a key whose earlier attempt the client abandoned, a 409 carrying one)."""
    unanswered = [a for a in answers if a.status is None and not a.abandoned]
    assert not unanswered, unanswered[:5]
    abandoned = {a.key for a in answers if a.abandoned}
    statuses = {a.status for a in answers if not a.abandoned}
    assert statuses <= SUCCESS | {409, 503}, f"{statuses}; the service logged:\n{served.log_tail()}"
    for answer in answers:
        assert answer.ended - answer.started < REQUEST_TIMEOUT_SECONDS, answer
        if answer.status == 409:
            assert answer.key in abandoned, answer
        if answer.status in {409, 503}:
            assert answer.retry_after is not None, answer
            assert answer.content_type == PROBLEM_CONTENT_TYPE, answer
        if answer.status == 503:
            assert answer.retry_after == str(RETRY_AFTER_SECONDS), answer


async def assert_each_ack_saved_once(served: Served, load: TurnLoad) -> None:
    """Each key, acknowledged, is exactly one turn (with its message) in exactly one queued job
    (its own, or the one it was coalesced into) in the database, the ones its acknowledgement
    named; no turn or job without a key."""
    acks = {ack.key: ack for ack in load.acks}
    assert len(acks) == len(load.acks)  # the load never reuses a key for another request
    conn = await asyncpg.connect(
        user="postgres", database="postgres", host=served.pg.socket_dir, timeout=10
    )
    try:
        saved = await conn.fetch(
            "SELECT t.id::text AS turn_id, m.content FROM turns t"
            " JOIN chat_messages m ON m.turn_id = t.id AND m.role = 'user'"
            " WHERE t.company_id = $1 AND t.user_id = ANY($2::text[])",
            COMPANY,
            list(load.users),
        )
        # a job's own turn, and the turns coalesced into it past the quota of waiting jobs
        jobs = await conn.fetch(
            "SELECT j.id::text AS job_id, t.turn_id FROM jobs j, LATERAL ("
            "  SELECT j.payload->>'turn_id' AS turn_id"
            "  UNION ALL SELECT jsonb_array_elements_text(j.payload->'turn_ids')"
            "  WHERE jsonb_typeof(j.payload->'turn_ids') = 'array') t"
            " WHERE j.company_id = $1 AND j.user_id = ANY($2::text[])"
            " AND j.kind = 'consolidation' AND t.turn_id IS NOT NULL",
            COMPANY,
            list(load.users),
        )
    finally:
        await conn.close()
    turns_by_key: dict[str, list[str]] = {}
    for row in saved:
        turns_by_key.setdefault(row["content"].removeprefix("I know tool "), []).append(
            row["turn_id"]
        )
    assert turns_by_key == {key: [ack.turn_id] for key, ack in acks.items()}
    assert sorted((row["job_id"], row["turn_id"]) for row in jobs) == sorted(
        (ack.job_id, ack.turn_id) for ack in acks.values()
    )
    # some retries met a turn the service had saved while its client was gone
    assert any(ack.replayed for ack in load.acks)


async def assert_consolidated_within(
    served: Served, users: tuple[str, ...], seconds: float
) -> None:
    """The worker recovered by itself: every queued job of `users` succeeded."""
    statuses: dict[str, int] = {}

    async def consolidated() -> bool:
        conn = await asyncpg.connect(
            user="postgres", database="postgres", host=served.pg.socket_dir, timeout=10
        )
        try:
            found = await conn.fetch(
                "SELECT status, count(*) FROM jobs"
                " WHERE company_id = $1 AND user_id = ANY($2::text[]) GROUP BY status",
                COMPANY,
                list(users),
            )
        finally:
            await conn.close()
        statuses.clear()
        statuses.update((str(row[0]), int(row[1])) for row in found)
        return set(statuses) == {"succeeded"}

    await wait_until(
        consolidated, seconds, what=lambda: f"every job consolidated: {statuses}", every=0.2
    )


async def _enabled_users(served: Served) -> tuple[str, ...]:
    def auth(
        sub: str = "alice", company: str = COMPANY, roles: tuple[str, ...] = ()
    ) -> dict[str, str]:
        return served.bearer(sub, roles)

    await enable_company(served.http, auth)
    run = uuid.uuid4().hex[:6]
    return tuple(f"user-{run}-{n}" for n in range(USERS_PER_TEST))


# --- the faults --------------------------------------------------------------------------------


@pytest.mark.slow
async def test_turn_saves_through_an_immediate_postgres_restart_lose_and_duplicate_nothing(
    served: Served,
) -> None:
    load = TurnLoad(served, await _enabled_users(served))
    async with load.running():
        await load.acked(2 * CLIENTS)  # the load is flowing

        await served.pg.crash()
        down = time.monotonic()
        not_ready = await _readiness(served.http)

        async def every_client_met_the_outage() -> bool:
            return load.clients_unavailable_since(down) == CLIENTS

        await wait_until(every_client_met_the_outage, RECOVERY_SECONDS)
        restarting = time.monotonic()
        await served.pg.start_again()
        ready_after = await _ready_within(served.http, RECOVERY_SECONDS)
        up = time.monotonic()
        await load.acked(len(load.acks) + 2 * CLIENTS)  # every client is served again
        served_again = time.monotonic() - up

    assert not_ready.status_code == 503, not_ready.text
    assert not_ready.headers["content-type"] == PROBLEM_CONTENT_TYPE
    assert not_ready.headers["retry-after"] == str(RETRY_AFTER_SECONDS)
    during_outage = [a for a in load.answers if down <= a.started and a.ended <= restarting]
    assert len(during_outage) >= CLIENTS
    assert {a.status for a in during_outage} == {503}
    assert_only_well_formed_unavailability(served, load.answers)
    assert ready_after < RECOVERY_SECONDS
    assert served_again < RECOVERY_SECONDS
    await assert_each_ack_saved_once(served, load)
    await assert_consolidated_within(served, load.users, RECOVERY_SECONDS)
    assert (await _readiness(served.http)).status_code == 200


@pytest.mark.slow
async def test_turn_saves_while_the_services_connections_are_terminated_lose_and_duplicate_nothing(
    served: Served,
) -> None:
    load = TurnLoad(served, await _enabled_users(served))
    terminated = 0
    async with load.running():
        await load.acked(2 * CLIENTS)
        start = time.monotonic()
        for cut in range(40):  # until the cuts hit requests in flight a few times
            terminated += await served.pg.terminate_backends(APPLICATION_NAME)
            await asyncio.sleep(0.1)
            if cut >= 3 and load.unavailable_since(start) >= 3:
                break
        await load.acked(len(load.acks) + 2 * CLIENTS)  # served again, without a restart

    assert terminated > 0
    assert load.unavailable_since(start) >= 3
    assert_only_well_formed_unavailability(served, load.answers)
    await assert_each_ack_saved_once(served, load)
    await assert_consolidated_within(served, load.users, RECOVERY_SECONDS)
    assert (await _readiness(served.http)).status_code == 200


LONG_CYCLES = 8


@pytest.mark.slow
@pytest.mark.long
async def test_turn_saves_through_repeated_restarts_and_cuts_lose_and_duplicate_nothing(
    served: Served,
) -> None:
    """The two faults above, over and over under one load (`make test-long`, about a minute):
    outages of one to three seconds, each followed by a volley of terminated connections."""
    load = TurnLoad(served, await _enabled_users(served))
    async with load.running():
        for cycle in range(LONG_CYCLES):
            await load.acked(len(load.acks) + 2 * CLIENTS)
            await served.pg.crash()
            await asyncio.sleep(1 + cycle % 3)  # clients meet the outage meanwhile
            await served.pg.start_again()
            await _ready_within(served.http, RECOVERY_SECONDS)
            await load.acked(len(load.acks) + 2 * CLIENTS)
            for _ in range(5):
                await served.pg.terminate_backends(APPLICATION_NAME)
                await asyncio.sleep(0.2)

    assert load.unavailable_since(0.0) >= LONG_CYCLES
    assert_only_well_formed_unavailability(served, load.answers)
    await assert_each_ack_saved_once(served, load)
    await assert_consolidated_within(served, load.users, RECOVERY_SECONDS)
    assert (await _readiness(served.http)).status_code == 200
