"""The service survives losing its PostgreSQL primary: a real primary and a synchronous
standby of the test's own, the service on a DATABASE_URL naming both with
`target_session_attrs=read-write`, keyed turn-saves all along; the primary is stopped in
immediate mode and the standby promoted (`pg_ctl promote`), as a failover manager would.

Nothing acknowledged is lost or saved twice, the service saves turns again within seconds of
the promotion without a restart, /readyz says what is true throughout, and every job queued
runs to exactly one outcome on the new primary.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from app.kit.config import PROJECT_ROOT, to_asyncpg_url
from app.kit.db.migrations import run_migrations
from tests.helpers.failover import (
    CLIENTS,
    KEY_RETRY_BUDGET_SECONDS,
    SERVED_AGAIN_SECONDS,
    Failover,
    ReadinessProbe,
    TurnLoad,
    assert_each_ack_saved_once,
    assert_each_job_ran_once,
    assert_readiness_truthful,
    assert_saves_answered_truthfully,
    enabled_users,
    serving,
    wait_until,
)
from tests.helpers.replicated_pg import ReplicatedPair, replicated_pair

OUTAGE_SEEN_SECONDS = 15.0  # the clients and /readyz meet the lost primary


def _query_form(pair: ReplicatedPair) -> str:
    """The same two servers as `host=` parameters, the URL form the service is given here
    (the migrations take the host list form, so both are exercised)."""
    return (
        f"postgresql://postgres@/postgres?host={pair.primary.address},{pair.standby.address}"
        "&target_session_attrs=read-write"
    )


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        (
            "postgresql://u@h1:5433,h2:5434/db?target_session_attrs=read-write",
            "postgresql+asyncpg://u@/db?target_session_attrs=read-write&host=h1:5433&host=h2:5434",
        ),
        (
            "postgresql://u@/db?host=h1:5433,h2:5434&target_session_attrs=read-write",
            "postgresql+asyncpg://u@/db?target_session_attrs=read-write&host=h1:5433&host=h2:5434",
        ),
        (
            "postgres://u:p%40ss@/db?host=h1,h2&port=5433,5434",
            "postgresql+asyncpg://u:p%40ss@/db?host=h1:5433&host=h2:5434",
        ),
        ("postgresql://u@h1,h2/db", "postgresql+asyncpg://u@/db?host=h1:5432&host=h2:5432"),
        # one host: spelled as given
        ("postgresql://u@h1:5433/db", "postgresql+asyncpg://u@h1:5433/db"),
        ("postgresql://u@/db?host=/run/pg", "postgresql+asyncpg://u@/db?host=/run/pg"),
    ],
)
def test_multi_host_urls_are_spelled_for_the_driver(url: str, expected: str) -> None:
    assert to_asyncpg_url(url) == expected


async def _crash_and_promote(
    pair: ReplicatedPair, load: TurnLoad, probe: ReadinessProbe
) -> Failover:
    """The primary stopped in immediate mode (as by a crash), then the standby promoted."""
    began = time.monotonic()
    await asyncio.to_thread(pair.primary.stop_immediately)
    return await _promote_once_seen(pair, load, probe, began, time.monotonic())


async def _fence_and_promote(
    pair: ReplicatedPair, load: TurnLoad, probe: ReadinessProbe
) -> Failover:
    """The primary left running but set read-only (as a manager fences a primary it demotes:
    the service's pooled connections stay open and every write on them fails with SQLSTATE
    25006), then the standby promoted.

    A session takes the new setting only after its next command, so a transaction begun then
    may still write (and is replicated like any other): the primary counts as lost once both
    of the service's pools met the fence (a save and /readyz answered 503), after which each
    has dropped every connection to it."""
    fencing = time.monotonic()
    conn = await pair.primary.connect()
    try:
        await conn.execute("ALTER SYSTEM SET default_transaction_read_only = on")
        await conn.execute("SELECT pg_reload_conf()")
    finally:
        await conn.close()
    lost = await wait_until(
        lambda: load.unavailable_since(fencing) > 0 and probe.saw(503, since=fencing),
        "the service meeting the fenced primary",
        OUTAGE_SEEN_SECONDS,
    )
    return await _promote_once_seen(pair, load, probe, fencing, lost)


async def _promote_once_seen(
    pair: ReplicatedPair, load: TurnLoad, probe: ReadinessProbe, began: float, lost: float
) -> Failover:
    """Once every client and /readyz met the primary's loss, the standby promoted."""
    await wait_until(
        lambda: load.unavailable_since(lost) >= CLIENTS and probe.saw(503, since=lost),
        "the clients and /readyz meeting the lost primary",
        OUTAGE_SEEN_SECONDS,
    )
    promoting = time.monotonic()
    await asyncio.to_thread(pair.standby.promote)
    return Failover(began, lost, no_primary_until=promoting, primary_from=time.monotonic())


@pytest.mark.slow
@pytest.mark.parametrize("fault", [_crash_and_promote, _fence_and_promote], ids=["crash", "fence"])
async def test_turn_saves_survive_a_promoted_standby_without_loss_or_duplicates(
    fault: Callable[[ReplicatedPair, TurnLoad, ReadinessProbe], Awaitable[Failover]],
) -> None:
    (PROJECT_ROOT / "var").mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(dir=PROJECT_ROOT / "var", prefix="failover-") as tmp:
        workdir = Path(tmp)
        async with replicated_pair(workdir) as pair:
            await asyncio.to_thread(run_migrations, to_asyncpg_url(pair.url))
            async with serving(_query_form(pair), workdir) as service:
                load = TurnLoad(service, await enabled_users(service))
                probe = ReadinessProbe(service)
                async with probe.running(), load.running():
                    await load.acked(2 * CLIENTS, KEY_RETRY_BUDGET_SECONDS)  # flowing
                    failover = await fault(pair, load, probe)
                    await load.acked(len(load.acks) + 2 * CLIENTS, SERVED_AGAIN_SECONDS)
                    await wait_until(
                        lambda: probe.saw(200, since=failover.primary_from),
                        "/readyz ready",
                        SERVED_AGAIN_SECONDS,
                    )

                assert_saves_answered_truthfully(load, failover)
                assert_readiness_truthful(probe.answers, failover)
                conn = await pair.standby.connect()
                try:
                    await assert_each_ack_saved_once(conn, load)
                    await assert_each_job_ran_once(conn, load.users)
                finally:
                    await conn.close()
