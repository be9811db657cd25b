"""Turn-saves under database faults: nothing acknowledged is lost, nothing is saved twice.

`python -m app serve` (the API and its in-process worker, as deployed) runs against a private
embedded PostgreSQL while client tasks save turns over HTTP on loopback, each retrying anything
but a 2xx with the same `Idempotency-Key`, honouring `Retry-After`. Meanwhile PostgreSQL is
stopped in immediate mode and started again, or the service's connections are terminated.
Every request is bounded by a client timeout: a hang fails the test as a 500 does. The service,
the load and the checks are those of the failover tests (`tests/helpers/failover.py`).
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from app.kit.config import PROJECT_ROOT
from app.kit.errors import PROBLEM_CONTENT_TYPE
from tests.helpers.failover import (
    CLIENTS,
    REQUEST_TIMEOUT_SECONDS,
    RETRY_AFTER_SECONDS,
    Service,
    TurnLoad,
    assert_answers_well_formed,
    assert_each_ack_saved_once,
    assert_each_job_ran_once,
    enabled_users,
    serving,
)
from tests.helpers.polling import wait_until
from tests.helpers.private_pg import PrivatePostgres

RECOVERY_SECONDS = 20.0  # "by itself, within seconds", generously for a loaded machine
APPLICATION_NAME = "context-memory"  # what the service's connections call themselves
ABANDON_EVERY = 3  # every third key's first attempt is given up on within 30 ms (`TurnLoad`)
FAULTS_ENV = {
    # the clients save as fast as the service answers, retries included, faster than the
    # worker consolidates: the per-user rate limit would answer some of them 429 and the
    # quota of waiting jobs 409 (queue full), which is not what these faults are about (both
    # are proven in tests/rate_limits and tests/quotas)
    "RATE_LIMIT_TURNS_USER": "off",
    "RATE_LIMIT_TURNS_COMPANY": "off",
    "QUOTA_USER_QUEUED_JOBS": "0",
}


@dataclass(frozen=True)
class Served:
    pg: PrivatePostgres
    service: Service

    @property
    def http(self) -> httpx.AsyncClient:
        return self.service.http

    def load(self, users: tuple[str, ...]) -> TurnLoad:
        return TurnLoad(self.service, users, abandon_every=ABANDON_EVERY)


@pytest.fixture(scope="module")
async def served() -> AsyncIterator[Served]:
    (PROJECT_ROOT / "var").mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(dir=PROJECT_ROOT / "var", prefix="faults-") as tmp:
        workdir = Path(tmp)
        async with (
            PrivatePostgres(workdir / "pg") as pg,
            serving(pg.url, workdir, FAULTS_ENV) as service,
        ):
            yield Served(pg, service)


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


async def assert_nothing_lost_or_doubled(served: Served, load: TurnLoad) -> None:
    """Each acknowledged key is one turn in one job, as its answer named, and nothing else is
    stored (`assert_each_ack_saved_once`); some retries met a turn the service had saved while
    its client was gone; every job ran to exactly one outcome within `RECOVERY_SECONDS`."""
    conn = await served.pg.connect()
    try:
        await assert_each_ack_saved_once(conn, load)
        assert any(ack.replayed for ack in load.acks)
        await assert_each_job_ran_once(conn, load.users, RECOVERY_SECONDS)
    finally:
        await conn.close()


# --- the faults --------------------------------------------------------------------------------


@pytest.mark.slow
async def test_turn_saves_through_an_immediate_postgres_restart_lose_and_duplicate_nothing(
    served: Served,
) -> None:
    load = served.load(await enabled_users(served.service))
    async with load.running():
        await load.acked(2 * CLIENTS, RECOVERY_SECONDS)  # the load is flowing

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
        await load.acked(len(load.acks) + 2 * CLIENTS, RECOVERY_SECONDS)  # all served again
        served_again = time.monotonic() - up

    assert not_ready.status_code == 503, not_ready.text
    assert not_ready.headers["content-type"] == PROBLEM_CONTENT_TYPE
    assert not_ready.headers["retry-after"] == str(RETRY_AFTER_SECONDS)
    during_outage = [a for a in load.answers if down <= a.started and a.ended <= restarting]
    assert len(during_outage) >= CLIENTS
    assert {a.status for a in during_outage} == {503}
    assert_answers_well_formed(load)
    assert ready_after < RECOVERY_SECONDS
    assert served_again < RECOVERY_SECONDS
    await assert_nothing_lost_or_doubled(served, load)
    assert (await _readiness(served.http)).status_code == 200


@pytest.mark.slow
async def test_turn_saves_while_the_services_connections_are_terminated_lose_and_duplicate_nothing(
    served: Served,
) -> None:
    load = served.load(await enabled_users(served.service))
    terminated = 0
    async with load.running():
        await load.acked(2 * CLIENTS, RECOVERY_SECONDS)
        start = time.monotonic()
        for cut in range(40):  # until the cuts hit requests in flight a few times
            terminated += await served.pg.terminate_backends(APPLICATION_NAME)
            await asyncio.sleep(0.1)
            if cut >= 3 and load.unavailable_since(start) >= 3:
                break
        await load.acked(len(load.acks) + 2 * CLIENTS, RECOVERY_SECONDS)  # without a restart

    assert terminated > 0
    assert load.unavailable_since(start) >= 3
    assert_answers_well_formed(load)
    await assert_nothing_lost_or_doubled(served, load)
    assert (await _readiness(served.http)).status_code == 200


LONG_CYCLES = 8


@pytest.mark.slow
@pytest.mark.long
async def test_turn_saves_through_repeated_restarts_and_cuts_lose_and_duplicate_nothing(
    served: Served,
) -> None:
    """The two faults above, over and over under one load (`make test-long`, about a minute):
    outages of one to three seconds, each followed by a volley of terminated connections."""
    load = served.load(await enabled_users(served.service))
    async with load.running():
        for cycle in range(LONG_CYCLES):
            await load.acked(len(load.acks) + 2 * CLIENTS, RECOVERY_SECONDS)
            await served.pg.crash()
            await asyncio.sleep(1 + cycle % 3)  # clients meet the outage meanwhile
            await served.pg.start_again()
            await _ready_within(served.http, RECOVERY_SECONDS)
            await load.acked(len(load.acks) + 2 * CLIENTS, RECOVERY_SECONDS)
            for _ in range(5):
                await served.pg.terminate_backends(APPLICATION_NAME)
                await asyncio.sleep(0.2)

    assert load.unavailable_since(0.0) >= LONG_CYCLES
    assert_answers_well_formed(load)
    await assert_nothing_lost_or_doubled(served, load)
    assert (await _readiness(served.http)).status_code == 200
