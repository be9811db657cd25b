"""The service through failovers that a real failover manager carries out: pg_auto_failover
(a monitor and two data nodes), the service on a DATABASE_URL naming both nodes with
`target_session_attrs=read-write`, keyed turn-saves all along (`make test-long`).

The primary node fails as a machine does (`pg_autoctl stop --immediate`: keeper and PostgreSQL
gone at once); the monitor promotes the secondary. The failed node then comes back, rejoins as
the new primary's secondary, and the new primary fails in turn. Nothing acknowledged is lost or
saved twice, the service saves turns again within seconds of each promotion without a restart,
/readyz says what is true throughout, and every job runs to exactly one outcome.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from functools import partial
from pathlib import Path

import pytest

from app.kit.config import PROJECT_ROOT, to_asyncpg_url
from app.kit.db.migrations import run_migrations
from tests.helpers.auto_failover import START_TIMEOUT_SECONDS, Formation, Keeper, formation
from tests.helpers.failover import (
    CLIENTS,
    KEY_RETRY_BUDGET_SECONDS,
    SERVED_AGAIN_SECONDS,
    Answer,
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

FAILOVERS = 2  # node1 -> node2, then (node1 back as secondary) node2 -> node1
PROMOTION_SECONDS = 30.0  # from the crash to a writable new primary, generously
POLL_SECONDS = 0.05


async def _fail_over(made: Formation, failing: Keeper, surviving: Keeper) -> Failover:
    """Crash `failing` (the primary) and wait until the monitor made `surviving` writable."""
    began = time.monotonic()
    await asyncio.to_thread(made.crash, failing)
    lost = last_read_only = time.monotonic()
    while True:
        checked = time.monotonic()
        if await surviving.writable():
            return Failover(began, lost, last_read_only, primary_from=time.monotonic())
        last_read_only = checked  # not writable then, so not before either
        if checked - lost > PROMOTION_SECONDS:
            pytest.fail(f"no writable primary {PROMOTION_SECONDS} s on:\n{made.log_tails()}")
        await asyncio.sleep(POLL_SECONDS)


def _between(answers: list[Answer], start: float, end: float) -> list[Answer]:
    return [a for a in answers if a.started >= start and a.ended <= end]


@pytest.mark.slow
@pytest.mark.long
async def test_turn_saves_survive_pg_auto_failover_failovers_without_loss_or_duplicates() -> None:
    (PROJECT_ROOT / "var").mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(dir=PROJECT_ROOT / "var", prefix="autofailover-") as tmp:
        workdir = Path(tmp)
        async with formation(workdir) as made:
            await asyncio.to_thread(run_migrations, to_asyncpg_url(made.url))
            async with serving(made.url, workdir) as service:
                load = TurnLoad(service, await enabled_users(service))
                probe = ReadinessProbe(service)
                failovers: list[Failover] = []
                ready_at = [0.0]  # from when /readyz must have said 200, per failover
                async with probe.running(), load.running():
                    await load.acked(2 * CLIENTS, KEY_RETRY_BUDGET_SECONDS)  # flowing
                    failing, surviving = made.nodes
                    for cycle in range(FAILOVERS):
                        failover = await _fail_over(made, failing, surviving)
                        failovers.append(failover)
                        await load.acked(len(load.acks) + 2 * CLIENTS, SERVED_AGAIN_SECONDS)
                        ready_at.append(
                            await wait_until(
                                partial(probe.saw, 200, since=failover.primary_from),
                                "/readyz ready",
                                SERVED_AGAIN_SECONDS,
                            )
                        )
                        if cycle + 1 == FAILOVERS:
                            break
                        # the failed node comes back: rewound, it follows the new primary
                        await asyncio.to_thread(made.run_node, failing)
                        await made.wait_for_states(
                            {surviving.name: "primary", failing.name: "secondary"},
                            START_TIMEOUT_SECONDS,
                        )
                        await load.acked(len(load.acks) + 2 * CLIENTS, SERVED_AGAIN_SECONDS)
                        failing, surviving = surviving, failing

                for number, failover in enumerate(failovers):
                    assert_saves_answered_truthfully(load, failover)
                    until = (
                        failovers[number + 1].began if number + 1 < FAILOVERS else time.monotonic()
                    )
                    assert_readiness_truthful(
                        _between(probe.answers, ready_at[number], until), failover
                    )
                conn = await surviving.connect()
                try:
                    await assert_each_ack_saved_once(conn, load)
                    await assert_each_job_ran_once(conn, load.users)
                finally:
                    await conn.close()
