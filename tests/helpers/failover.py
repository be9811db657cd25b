"""The service through a fault of its database (a failover of its PostgreSQL primary, a crash
and restart, its connections cut): `python -m app serve` (API and worker, as deployed), a
steady load of keyed turn-saves, /readyz polled all along, and what must hold afterwards.

Each client retries a save that got no 2xx with the same `Idempotency-Key` (honouring
`Retry-After`) until it is acknowledged, as the Python client does. Every request is bounded by
a client timeout: a hang fails the test as a 500 does.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import asyncpg
import httpx
import pytest

from app.kit.auth.mint import issue_token
from app.kit.config import PROJECT_ROOT
from app.kit.errors import PROBLEM_CONTENT_TYPE
from app.kit.principal import Principal
from tests.helpers import polling
from tests.helpers.apps import COMPANY, SPACE, TEST_JWT_SECRET, make_settings
from tests.helpers.replicated_pg import free_port
from tests.helpers.settings import enable_company

CLIENTS = 6  # concurrent client tasks, two per user
USERS = 3
REQUEST_TIMEOUT_SECONDS = 10.0  # the client's bound on one request, answer included
RETRY_AFTER_SECONDS = 1  # the service's DB_UNAVAILABLE_RETRY_AFTER_SECONDS here
KEY_RETRY_BUDGET_SECONDS = 40.0  # one key is retried at most this long
SERVED_AGAIN_SECONDS = 10.0  # from the promotion to the first turn saved again
JOBS_DONE_SECONDS = 30.0  # a job cut short waits out its lease (5 s) before it runs again
START_TIMEOUT_SECONDS = 90.0
PROBE_INTERVAL_SECONDS = 0.05
SUCCESS = frozenset({201, 202})


def service_env(database_url: str, workdir: Path) -> dict[str, str]:
    """The environment of a `python -m app serve` (or `worker`) these tests start on
    `database_url`: the static test key, the offline rules, fast polls, a 5 s lease."""
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "PYTHONPATH": str(PROJECT_ROOT),
        "ENVIRONMENT": "test",
        "JWT_SECRET": TEST_JWT_SECRET,
        "JWT_PLATFORM": "true",  # the operator enables memory with a static token
        "LLM_PROVIDER": "rules",
        "LOG_LEVEL": "WARNING",
        "DATABASE_URL": database_url,
        "DB_POOL_SIZE": "5",
        "DB_HOT_POOL_SIZE": "5",
        "DB_MAX_OVERFLOW": "5",
        "DB_CONNECT_TIMEOUT_SECONDS": "2",
        "DB_STATEMENT_TIMEOUT_MS": "5000",
        "DB_UNAVAILABLE_RETRY_AFTER_SECONDS": str(RETRY_AFTER_SECONDS),
        "WORKER_ENABLED": "true",
        "WORKER_POLL_SECONDS": "0.1",
        "WORKER_HEARTBEAT_FILE": str(workdir / "worker.heartbeat"),
        "JOB_LEASE_SECONDS": "5",
        "JOB_MAX_ATTEMPTS": "10",  # attempts cut short by the failover never dead-letter a job
    }


@dataclass(frozen=True)
class Service:
    http: httpx.AsyncClient
    process: asyncio.subprocess.Process
    log: Path

    def log_tail(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]

    def bearer(
        self, user: str, company: str = COMPANY, roles: tuple[str, ...] = ()
    ) -> dict[str, str]:
        settings = make_settings("postgresql://unused/unused")  # the service's signing key
        token = issue_token(settings, Principal(user, company, frozenset(roles)))
        return {"Authorization": f"Bearer {token}"}


@contextlib.asynccontextmanager
async def serving(
    database_url: str, workdir: Path, env: Mapping[str, str] | None = None
) -> AsyncIterator[Service]:
    """`python -m app serve` on `database_url` until the block ends, ready when yielded;
    `env` on top of the environment of these tests (e.g. a model to consolidate with)."""
    port = free_port()
    log = workdir / "serve.log"
    with log.open("wb") as out:
        process = await asyncio.create_subprocess_exec(
            *(sys.executable, "-m", "app", "serve", "--port", str(port)),
            cwd=workdir,  # no .env of the project is read
            env=service_env(database_url, workdir) | dict(env or {}),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        timeout = httpx.Timeout(REQUEST_TIMEOUT_SECONDS)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=timeout) as http:
            service = Service(http, process, log)
            await _wait_until_ready(service)
            yield service
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(process.wait(), 30)
        except TimeoutError:
            process.kill()
            await process.wait()


async def _wait_until_ready(service: Service) -> None:
    async def ready() -> bool:
        assert service.process.returncode is None, f"serve exited:\n{service.log_tail()}"
        with contextlib.suppress(httpx.TransportError):
            return (await service.http.get("/readyz")).status_code == 200
        return False

    await polling.wait_until(
        ready, START_TIMEOUT_SECONDS, what=lambda: f"serve ready:\n{service.log_tail()}", every=0.1
    )


async def enabled_users(service: Service) -> tuple[str, ...]:
    """Fresh users of a company with context memory on."""

    def auth(
        sub: str = "alice", company: str = COMPANY, roles: tuple[str, ...] = ()
    ) -> dict[str, str]:
        return service.bearer(sub, company, roles)

    await enable_company(service.http, auth)
    run = uuid.uuid4().hex[:6]
    return tuple(f"user-{run}-{n}" for n in range(USERS))


# --- what the clients saw ----------------------------------------------------------------------


@dataclass(frozen=True)
class Answer:
    """One attempt or probe as the client saw it; `status` None when no answer came."""

    key: str
    started: float
    ended: float
    status: int | None
    error: str | None = None
    retry_after: str | None = None
    content_type: str | None = None
    abandoned: bool = False  # the client gave up on it on purpose (see `TurnLoad`)


@dataclass(frozen=True)
class Ack:
    """A turn the service acknowledged (2xx), and what it said it saved and queued;
    `replayed` when the answer was the one stored for its key (an earlier attempt saved it)."""

    user: str
    key: str
    turn_id: str
    job_id: str
    replayed: bool = False


@dataclass
class TurnLoad:
    """`CLIENTS` tasks saving turns until stopped; each key is retried until a 2xx.

    With `abandon_every`, every so many keys' first attempt is abandoned within 30 ms of being
    sent, as by a client whose connection dropped: the service may or may not have saved it
    (it does not stop a request whose client left), so the retry must neither lose it nor save
    it twice; meanwhile it answers 409 to the same key.
    """

    service: Service
    users: tuple[str, ...]
    abandon_every: int | None = None
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

    async def acked(self, count: int, seconds: float) -> None:
        """Wait until `count` turns in all were acknowledged."""
        await polling.wait_until(
            lambda: len(self.acks) >= count,
            seconds,
            what=lambda: (
                f"{count} turns acknowledged ({len(self.acks)} were); "
                f"the service logged:\n{self.service.log_tail()}"
            ),
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

    def first_success_since(self, instant: float) -> float | None:
        """When the first save sent after `instant` was acknowledged."""
        ends = [a.ended for a in self.answers if a.started >= instant and a.status in SUCCESS]
        return min(ends, default=None)

    async def _client(self, number: int) -> None:
        user = self.users[number % len(self.users)]
        headers = self.service.bearer(user)
        sequence = 0
        abandon_after = random.Random(number).uniform
        while not self._stopping.is_set():
            key = f"{user}-c{number}-{sequence}"
            abandoning = self.abandon_every is not None and sequence % self.abandon_every == 0
            sequence += 1
            abandon = abandon_after(0.0, 0.03) if abandoning else None
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
                    response = await self.service.http.post(
                        "/v1/chats/failover/turns", json=body, headers=keyed
                    )
            except (TimeoutError, httpx.TransportError) as error:
                if abandon is not None and isinstance(error, TimeoutError):
                    self.answers.append(
                        Answer(key, started, time.monotonic(), None, abandoned=True)
                    )
                    abandon = None
                    continue  # sent again at once, as by a client that reconnected
                self.answers.append(Answer(key, started, time.monotonic(), None, repr(error)))
                await asyncio.sleep(0.2)  # a client's pause before it reconnects
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


@dataclass
class ReadinessProbe:
    """/readyz polled every `PROBE_INTERVAL_SECONDS` until stopped, every answer kept."""

    service: Service
    answers: list[Answer] = field(default_factory=list)

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[ReadinessProbe]:
        task = asyncio.create_task(self._poll())
        try:
            yield self
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def saw(self, status: int, since: float) -> bool:
        return any(a.status == status and a.started >= since for a in self.answers)

    async def _poll(self) -> None:
        while True:
            started = time.monotonic()
            try:
                async with asyncio.timeout(REQUEST_TIMEOUT_SECONDS):
                    response = await self.service.http.get("/readyz")
            except (TimeoutError, httpx.TransportError) as error:
                self.answers.append(Answer("readyz", started, time.monotonic(), None, repr(error)))
            else:
                self.answers.append(
                    Answer(
                        "readyz",
                        started,
                        time.monotonic(),
                        response.status_code,
                        retry_after=response.headers.get("retry-after"),
                        content_type=response.headers.get("content-type"),
                    )
                )
            await asyncio.sleep(PROBE_INTERVAL_SECONDS)


async def wait_until(condition: Callable[[], bool], what: str, seconds: float) -> float:
    """Poll `condition()` until it holds (`tests/helpers/polling.py`); when it did."""
    await polling.wait_until(condition, seconds, what=what)
    return time.monotonic()


# --- what must hold ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Failover:
    """The instants that bound the failover, by the test's monotonic clock: the fault began
    at `began` (until then the primary was there); the old primary took no writes from `lost`
    on; no server was writable until at least `no_primary_until`; the new primary accepted
    writes from `primary_from`."""

    began: float
    lost: float
    no_primary_until: float
    primary_from: float


def assert_answers_well_formed(load: TurnLoad) -> None:
    """Every attempt was answered in time, with a 2xx or a 503 problem carrying Retry-After
    (or, for a key whose earlier attempt the client abandoned, a 409 problem carrying one)."""
    unanswered = [a for a in load.answers if a.status is None and not a.abandoned]
    assert not unanswered, unanswered[:5]
    abandoned = {a.key for a in load.answers if a.abandoned}
    statuses = {a.status for a in load.answers if not a.abandoned}
    assert statuses <= SUCCESS | {409, 503}, f"{statuses}:\n{load.service.log_tail()}"
    for answer in load.answers:
        assert answer.ended - answer.started < REQUEST_TIMEOUT_SECONDS, answer
        if answer.status == 409:
            assert answer.key in abandoned, answer
        if answer.status in {409, 503}:
            assert answer.retry_after is not None, answer
            assert answer.content_type == PROBLEM_CONTENT_TYPE, answer
        if answer.status == 503:
            assert answer.retry_after == str(RETRY_AFTER_SECONDS), answer


def assert_saves_answered_truthfully(load: TurnLoad, failover: Failover) -> None:
    """Every save was answered well (`assert_answers_well_formed`); none was acknowledged
    while there was no primary; the service saved turns again within `SERVED_AGAIN_SECONDS`
    of the promotion, without a restart."""
    assert_answers_well_formed(load)
    outage = [
        a
        for a in load.answers
        if a.started >= failover.lost and a.ended <= failover.no_primary_until
    ]
    assert outage, "no save was attempted while there was no primary"
    assert {a.status for a in outage} == {503}, outage
    served_again = load.first_success_since(failover.primary_from)
    assert served_again is not None
    assert served_again - failover.primary_from < SERVED_AGAIN_SECONDS, served_again
    assert load.service.process.returncode is None  # the same process, never restarted


def assert_readiness_truthful(answers: Sequence[Answer], failover: Failover) -> None:
    """/readyz (`answers`: the probes from a time the service was ready until the next fault,
    if any) said 200 before the failover, 503 (with Retry-After) while no server could write,
    and from the first 200 after the promotion (within `SERVED_AGAIN_SECONDS`) on, 200 only."""
    assert all(a.status in {200, 503} for a in answers), [
        a for a in answers if a.status not in {200, 503}
    ]
    before = [a.status for a in answers if a.ended <= failover.began]
    assert before, "/readyz was not polled before the failover"
    assert set(before) == {200}, before
    during = [
        a for a in answers if a.started >= failover.lost and a.ended <= failover.no_primary_until
    ]
    assert during, "/readyz was not polled while there was no primary"
    assert {a.status for a in during} == {503}, during
    assert all(a.retry_after == str(RETRY_AFTER_SECONDS) for a in during), during
    after = [a for a in answers if a.started >= failover.primary_from]
    first_ready = next((n for n, a in enumerate(after) if a.status == 200), None)
    assert first_ready is not None, "/readyz never answered 200 after the promotion"
    assert after[first_ready].ended - failover.primary_from < SERVED_AGAIN_SECONDS
    assert {a.status for a in after[first_ready:]} == {200}, after[first_ready:]


async def assert_each_ack_saved_once(conn: asyncpg.Connection, load: TurnLoad) -> None:
    """On the new primary each acknowledged key is exactly one turn, the one its answer named,
    queued in the job its answer named (its own, or the one it was coalesced into); and no
    turn is there that nobody acknowledged twice over."""
    acks = {ack.key: ack for ack in load.acks}
    assert len(acks) == len(load.acks)  # the load never reuses a key for another request
    saved = await conn.fetch(
        "SELECT t.id::text AS turn_id, m.content FROM turns t"
        " JOIN chat_messages m"
        " ON m.company_id = t.company_id AND m.turn_id = t.id AND m.role = 'user'"
        " WHERE t.company_id = $1 AND t.user_id = ANY($2::text[])",
        COMPANY,
        list(load.users),
    )
    turns_by_key: dict[str, list[str]] = {}
    for row in saved:
        key = row["content"].removeprefix("I know tool ")
        turns_by_key.setdefault(key, []).append(row["turn_id"])
    expected = {key: [ack.turn_id] for key, ack in acks.items()}
    assert turns_by_key == expected, differences(turns_by_key, expected)
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
    assert sorted((row["job_id"], row["turn_id"]) for row in jobs) == sorted(
        (ack.job_id, ack.turn_id) for ack in acks.values()
    )


def differences(saved: dict[str, list[str]], acked: dict[str, list[str]]) -> str:
    """What tells `saved` (turn ids per key, as stored) from `acked` (as answered): the keys
    acknowledged and not stored, stored and never acknowledged, and stored otherwise."""
    lost = sorted(acked.keys() - saved.keys())
    unacked = sorted(saved.keys() - acked.keys())
    both = sorted(saved.keys() & acked.keys())
    other = {k: (saved[k], acked[k]) for k in both if saved[k] != acked[k]}
    return (
        f"{len(lost)} acknowledged and not stored: {lost[:10]};"
        f" {len(unacked)} stored, never acknowledged: {unacked[:10]};"
        f" {len(other)} stored otherwise (stored, acknowledged): {list(other.items())[:10]}"
    )


async def assert_each_job_ran_once(
    conn: asyncpg.Connection, users: tuple[str, ...], seconds: float = JOBS_DONE_SECONDS
) -> None:
    """The worker recovered by itself: every job of `users` succeeded (on the new primary,
    after a failover) within `seconds`; and none ran to a second version. A run that updates
    the memory writes one version, naming the newest job of its claim, and marks its claim's
    jobs succeeded with that version in the same transaction: so each version of a
    consolidation names a distinct job, of the claim marked with that version, and each version
    the jobs were marked with exists once."""
    statuses: dict[str, int] = {}

    async def all_succeeded() -> bool:
        found = await conn.fetch(
            "SELECT status, count(*) FROM jobs"
            " WHERE company_id = $1 AND user_id = ANY($2::text[]) GROUP BY status",
            COMPANY,
            list(users),
        )
        statuses.clear()
        statuses.update((str(row[0]), int(row[1])) for row in found)
        return set(statuses) == {"succeeded"}

    await polling.wait_until(
        all_succeeded,
        seconds,
        what=lambda: f"every job done {seconds:g} s after the load: {statuses}",
        every=0.2,
    )
    versions = await conn.fetch(
        "SELECT user_id, version, job_id::text AS job_id FROM memory_versions"
        " WHERE company_id = $1 AND user_id = ANY($2::text[]) AND job_id IS NOT NULL",
        COMPANY,
        list(users),
    )
    marked = await conn.fetch(
        "SELECT user_id, version, id::text AS job_id FROM jobs"
        " WHERE company_id = $1 AND user_id = ANY($2::text[]) AND outcome = 'updated'",
        COMPANY,
        list(users),
    )
    assert marked, "no job updated a memory: nothing shows whether one ran twice"
    job_ids = [row["job_id"] for row in versions]
    assert len(job_ids) == len(set(job_ids)), "a job wrote two versions"
    claims = {(row["user_id"], row["version"]) for row in marked}
    assert {(row["user_id"], row["version"]) for row in versions} == claims
    claim_of = {row["job_id"]: (row["user_id"], row["version"]) for row in marked}
    for row in versions:
        assert claim_of.get(row["job_id"]) == (row["user_id"], row["version"]), row
