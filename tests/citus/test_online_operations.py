"""Online operations on the Citus cluster under load: the runbook's shard move, rebalance after
adding a node and tenant isolation (docs/scaling.md, run from its blocks by
`tests/helpers/runbook.py`), each while clients save turns over HTTP to `python -m app serve`
and two `python -m app worker` processes consolidate them with the stub model
(`tests/helpers/llm_stub.py`), claiming through the cluster's claim (`app/jobs/cluster_claim.py`).

The cluster is this module's own (the folder's shared one stays as its other tests expect it):
a coordinator and two workers, 8 shards per table (Citus's default is 32: 22 co-located tables
of 32 shards would make the rebalance move some 250 shards on two cores), the service on it as
the role that turns a multi-shard statement into an error. The load is that of the failover
tests (`tests/helpers/failover.py`): six clients over three fresh users of one company, each
retrying a save without a 2xx with its `Idempotency-Key` after `Retry-After`. Each operation
holds the loaded company's shards, and afterwards:

- every answer was a 2xx, or a 503 problem with `Retry-After` (counted): never a 500, never none;
- every acknowledged turn is stored exactly once, the turn its answer named, queued in the job
  its answer named, and the turns per (company, user, chat) are as many as were acknowledged;
- every job of those users succeeded, none ran twice.

The figures of each operation are printed (`-s` shows them; docs/scaling.md quotes them): its
duration, the saves in flight while it ran that were acknowledged, the 503s, and the p50, p99
and maximum latency of the saves in flight while it ran.
"""

from __future__ import annotations

import asyncio
import math
import signal
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import asyncpg
import pytest
from sqlalchemy.ext.asyncio import create_async_engine

from app.conversations.repository import lock_user_history
from app.kit.config import PROJECT_ROOT
from app.kit.db.errors import is_database_unavailable
from app.kit.errors import PROBLEM_CONTENT_TYPE
from tests.helpers import runbook
from tests.helpers.apps import COMPANY
from tests.helpers.citus import ClusterDatabase, cluster_database
from tests.helpers.failover import (
    RETRY_AFTER_SECONDS,
    SUCCESS,
    Answer,
    Service,
    TurnLoad,
    assert_each_ack_saved_once,
    assert_each_job_ran_once,
    enabled_users,
    service_env,
    serving,
)
from tests.helpers.llm_stub import StubLLMServer, delay, reply
from tests.helpers.polling import wait_until
from tests.helpers.worker import add_bullet_answer, logged_jobs, start_worker_process

pytestmark = pytest.mark.slow

DATABASE = "cms_online_ops"
SHARD_COUNT = 8
ACKED_AROUND = 20  # saves acknowledged before the operation starts, and again after it ends
ACK_SECONDS = 60.0
MODEL_ANSWERS = 5000  # more than the consolidations of the module ask for; none is left over
MODEL_ANSWER = add_bullet_answer("Identity", "Works with the tools named in the chat.")
MODEL_SECONDS = 0.1  # each answer's delay: a consolidation is seen in its model call
"""Every model call is answered with one added bullet: read as UPDATE by the gate (an answer
longer than a word is), applied by the operations call."""
SERVE_ENV = {
    "LLM_PROVIDER": "openai",
    # the clients save as fast as the service answers: neither the rate limits nor the quota
    # of waiting jobs are what these operations are about (tests/rate_limits, tests/quotas)
    "RATE_LIMIT_TURNS_USER": "off",
    "RATE_LIMIT_TURNS_COMPANY": "off",
    "QUOTA_USER_QUEUED_JOBS": "0",
    "WORKER_ENABLED": "false",  # the worker processes below consolidate
}
WORKER_PROCESSES = 2


@pytest.fixture(scope="module")
def workdir() -> Iterator[Path]:
    (PROJECT_ROOT / "var").mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(dir=PROJECT_ROOT / "var", prefix="citus-ops-") as tmp:
        yield Path(tmp)


@pytest.fixture(scope="module")
async def cluster_db(workdir: Path) -> AsyncIterator[ClusterDatabase]:
    async with cluster_database(workdir, DATABASE, shard_count=SHARD_COUNT) as on:
        yield on


@pytest.fixture(scope="module")
async def model() -> AsyncIterator[StubLLMServer]:
    async with StubLLMServer() as stub:
        stub.script(*[delay(MODEL_SECONDS, reply(MODEL_ANSWER))] * MODEL_ANSWERS)
        yield stub
        assert stub.pending > 0, "the stub model ran out of answers"


@pytest.fixture(scope="module")
async def service(
    cluster_db: ClusterDatabase, model: StubLLMServer, workdir: Path
) -> AsyncIterator[Service]:
    env = SERVE_ENV | {"OPENAI_BASE_URL": model.base_url}
    (workdir / "serve").mkdir()
    async with (
        serving(cluster_db.url, workdir / "serve", env) as served,
        worker_processes(cluster_db.url, workdir, env),
    ):
        yield served


@asynccontextmanager
async def worker_processes(
    database_url: str, workdir: Path, env: dict[str, str]
) -> AsyncIterator[None]:
    """`WORKER_PROCESSES` processes of `python -m app worker` on the cluster until the block
    ends; then each must have finished jobs: both claimed, side by side, through every
    operation."""
    logs, processes = [], []
    try:
        for n in range(WORKER_PROCESSES):
            own = workdir / f"worker-{n}"
            own.mkdir()
            worker_env = service_env(database_url, own) | env | {"LOG_LEVEL": "INFO"}
            logs.append(own / "worker.log")
            processes.append(await start_worker_process(worker_env, logs[-1]))
        yield
    finally:
        for process in processes:
            if process.returncode is None:
                process.send_signal(signal.SIGTERM)
        for process in processes:
            await asyncio.wait_for(process.wait(), 30)
    finished = [len(logged_jobs(log)) for log in logs]
    print(f"jobs finished per worker process: {finished}")
    assert all(finished), finished


# --- the operations, as the runbook writes them ------------------------------------------------


async def _admin(cluster_db: ClusterDatabase) -> asyncpg.Connection:
    node = cluster_db.cluster.coordinator
    return await asyncpg.connect(
        user="postgres", database=DATABASE, host="127.0.0.1", port=node.port, timeout=10
    )


async def company_shard(cluster_db: ClusterDatabase) -> tuple[int, int]:
    """The shard of `turns` holding the loaded company, and the port of the node it is on."""
    conn = await _admin(cluster_db)
    try:
        row = await conn.fetchrow(
            "SELECT shardid, nodeport FROM citus_shards"
            " WHERE shardid = get_shard_id_for_distribution_column('turns', $1::text)",
            COMPANY,
        )
    finally:
        await conn.close()
    assert row is not None
    return int(row["shardid"]), int(row["nodeport"])


async def shards_per_node(cluster_db: ClusterDatabase) -> dict[int, int]:
    """The runbook's `placements`: the distributed tables' shards per node port."""
    out = await runbook.psql(cluster_db.cluster.coordinator, DATABASE, "placements")
    rows = (line.split("|") for line in out.splitlines() if line.strip())
    return {int(port): int(count) for _, port, count in rows}


# --- the load around an operation --------------------------------------------------------------


@dataclass(frozen=True)
class Measured:
    """What the clients saw while an operation ran (`began` to `ended`, the test's clock)."""

    name: str
    began: float
    ended: float
    load: TurnLoad
    consolidations: int  # model calls made while the operation ran

    def overlapping(self) -> list[Answer]:
        """The save attempts in flight at some moment while the operation ran: those it may
        have held up or failed."""
        return [a for a in self.load.answers if a.started <= self.ended and a.ended >= self.began]

    @property
    def during(self) -> list[float]:
        """The latency of every save attempt in flight while the operation ran."""
        return sorted(a.ended - a.started for a in self.overlapping())

    @property
    def before(self) -> list[float]:
        """The latency of every save attempt answered before the operation began."""
        return sorted(a.ended - a.started for a in self.load.answers if a.ended < self.began)

    @staticmethod
    def percentile(latencies: list[float], share: float) -> float:
        return latencies[max(0, math.ceil(share * len(latencies)) - 1)]

    def summary(self) -> str:
        acked = sum(a.status in SUCCESS for a in self.overlapping())
        unavailable = sum(a.status == 503 for a in self.load.answers)
        return (
            f"{self.name}: {self.ended - self.began:.1f} s under load; {acked} saves acknowledged"
            f" during it ({len(self.load.acks)} in all), {unavailable} answered 503;"
            f" latency while it ran p50 {self.percentile(self.during, 0.5) * 1000:.0f} ms,"
            f" p99 {self.percentile(self.during, 0.99) * 1000:.0f} ms,"
            f" max {self.during[-1] * 1000:.0f} ms"
            f" (before it: p50 {self.percentile(self.before, 0.5) * 1000:.0f} ms,"
            f" p99 {self.percentile(self.before, 0.99) * 1000:.0f} ms);"
            f" {self.consolidations} model calls while it ran"
        )


async def under_load(
    service: Service, model: StubLLMServer, name: str, operation: Callable[[], Awaitable[None]]
) -> Measured:
    """`operation` run while the load saves turns: saves flowing before it starts and again
    after it ends, and a consolidation in its model call when it starts."""
    load = TurnLoad(service, await enabled_users(service))
    async with load.running():
        await load.acked(ACKED_AROUND, ACK_SECONDS)
        await wait_until(
            lambda: len(model.requests) > len(model.answers),
            ACK_SECONDS,
            what="a consolidation asking the model",
            every=0.005,
        )
        asked = len(model.requests)
        began = time.monotonic()
        await operation()
        ended = time.monotonic()
        consolidations = len(model.requests) - asked
        await load.acked(len(load.acks) + ACKED_AROUND, ACK_SECONDS)
    measured = Measured(name, began, ended, load, consolidations)
    print(measured.summary())
    return measured


async def assert_nothing_lost_or_doubled(cluster_db: ClusterDatabase, measured: Measured) -> None:
    load = measured.load
    unanswered = [a for a in load.answers if a.status is None]
    assert not unanswered, unanswered[:5]
    statuses = Counter(a.status for a in load.answers)
    assert set(statuses) <= SUCCESS | {503}, f"{statuses}:\n{load.service.log_tail()}"
    for answer in load.answers:
        if answer.status == 503:
            assert answer.retry_after == str(RETRY_AFTER_SECONDS), answer
            assert answer.content_type == PROBLEM_CONTENT_TYPE, answer
    assert measured.during, f"no save was in flight during the {measured.name}"
    conn = await _admin(cluster_db)
    try:
        await assert_each_ack_saved_once(conn, load)
        per_chat = await conn.fetch(
            "SELECT company_id, user_id, chat_id, count(*) AS turns FROM turns"
            " WHERE company_id = $1 AND user_id = ANY($2::text[])"
            " GROUP BY company_id, user_id, chat_id",
            COMPANY,
            list(load.users),
        )
        acked = Counter((COMPANY, ack.user) for ack in load.acks)
        assert {(r["company_id"], r["user_id"]): r["turns"] for r in per_chat} == acked
        assert len(per_chat) == len(load.users)  # one chat per user: the load's
        await assert_each_job_ran_once(conn, load.users)
    finally:
        await conn.close()


# --- the tests ---------------------------------------------------------------------------------


async def test_a_company_shard_group_moves_to_another_node_under_load(
    cluster_db: ClusterDatabase, service: Service, model: StubLLMServer
) -> None:
    cluster = cluster_db.cluster
    shard, source = await company_shard(cluster_db)
    target = next(worker for worker in cluster.workers if worker.port != source)

    async def move() -> None:
        await runbook.psql(
            cluster.coordinator,
            DATABASE,
            "move-shard",
            company=COMPANY,
            target_host="127.0.0.1",
            target_port=target.port,
        )

    measured = await under_load(service, model, "shard move", move)
    assert await company_shard(cluster_db) == (shard, target.port)
    await assert_nothing_lost_or_doubled(cluster_db, measured)


async def test_a_rebalance_onto_an_added_node_under_load(
    cluster_db: ClusterDatabase, service: Service, model: StubLLMServer
) -> None:
    cluster = cluster_db.cluster
    before = await shards_per_node(cluster_db)
    added: list[int] = []

    async def add_and_rebalance() -> None:
        worker = await cluster.add_worker(DATABASE)
        added.append(worker.port)
        await runbook.psql(cluster.coordinator, DATABASE, "rebalance")

    measured = await under_load(service, model, "rebalance", add_and_rebalance)
    after = await shards_per_node(cluster_db)
    group = sum(before.values()) // SHARD_COUNT  # the shards of one group: one per table
    assert sum(after.values()) == sum(before.values())
    assert after.get(added[0], 0) > 0, after  # shards moved onto the new node
    assert max(after.values()) - min(after.values()) <= group, after  # even to a group
    await assert_nothing_lost_or_doubled(cluster_db, measured)


async def test_a_large_company_is_isolated_to_its_own_shards_under_load(
    cluster_db: ClusterDatabase, service: Service, model: StubLLMServer
) -> None:
    shard, _ = await company_shard(cluster_db)

    async def isolate() -> None:
        await runbook.psql(
            cluster_db.cluster.coordinator, DATABASE, "isolate-tenant", company=COMPANY
        )

    measured = await under_load(service, model, "tenant isolation", isolate)
    isolated, _ = await company_shard(cluster_db)
    assert isolated != shard
    conn = await _admin(cluster_db)
    try:
        bounds = await conn.fetchrow(
            "SELECT shardminvalue, shardmaxvalue FROM pg_dist_shard WHERE shardid = $1", isolated
        )
    finally:
        await conn.close()
    assert bounds is not None
    assert bounds["shardminvalue"] == bounds["shardmaxvalue"]  # one hash value: the company's
    await assert_nothing_lost_or_doubled(cluster_db, measured)


_LOCK_WAITS = (
    "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a USING (pid)"
    " WHERE l.locktype = 'advisory' AND NOT l.granted AND a.datname = current_database()"
)


async def _lock_waits(cluster_db: ClusterDatabase) -> int:
    """Advisory locks (Citus's shard metadata locks among them) waited for, on every node."""
    waits = 0
    for node in cluster_db.cluster.nodes:
        conn = await asyncpg.connect(
            user="postgres", database=DATABASE, host="127.0.0.1", port=node.port, timeout=10
        )
        try:
            waits += int(await conn.fetchval(_LOCK_WAITS))
        finally:
            await conn.close()
    return waits


async def test_a_shard_move_waits_for_an_erasure_holding_its_user_lock(
    cluster_db: ClusterDatabase,
) -> None:
    """The erasure's lock of a user's history, held on the company's node (its lock function),
    holds a move of the company's shards at its switch-over until the erasure's transaction
    ends: a turn-save on the new node can never take the key the erasure still holds on the
    old one."""
    cluster = cluster_db.cluster
    shard, source = await company_shard(cluster_db)
    target = next(w for w in (*cluster.workers, *cluster.added) if w.port != source)
    engine = create_async_engine(cluster_db.url)
    try:
        async with engine.connect() as conn, conn.begin():
            await lock_user_history(conn, COMPANY, "erased-user")
            move = asyncio.create_task(
                runbook.psql(
                    cluster.coordinator,
                    DATABASE,
                    "move-shard",
                    company=COMPANY,
                    target_host="127.0.0.1",
                    target_port=target.port,
                )
            )

            async def held_or_done() -> bool:
                return move.done() or await _lock_waits(cluster_db) > 0

            await wait_until(held_or_done, ACK_SECONDS, what="the move waiting for a lock")
            assert not move.done(), "the move switched over under a held user lock"
        await move
    finally:
        await engine.dispose()
    assert await company_shard(cluster_db) == (shard, target.port)


@pytest.mark.parametrize(
    ("message", "unavailable"),
    [("could not find valid entry for shard 102065", True), ("cache lookup failed", False)],
)
async def test_only_a_switched_shard_among_internal_errors_is_a_retryable_unavailability(
    cluster_db: ClusterDatabase, message: str, unavailable: bool
) -> None:
    """Citus's error for a statement whose shard switched under it is answered 503; any other
    internal error (SQLSTATE XX000) stays a 500."""
    conn = await _admin(cluster_db)
    try:
        with pytest.raises(asyncpg.InternalServerError) as raised:
            await conn.execute(
                f"DO $$ BEGIN RAISE EXCEPTION '{message}' USING ERRCODE = 'XX000'; END $$"
            )
    finally:
        await conn.close()
    assert is_database_unavailable(raised.value) is unavailable
