"""Advisory locks on the cluster: every holder of one key takes it on the same node, so holders
exclude each other there as on one PostgreSQL. The turn-save's keys (the user's history, the
chat) are taken on the node holding the company's shards: the turn-save runs there whole (its
company function), and the erasure and the quota marks take the user's key there through a lock
function of the same company. Every other key (the claim's owner, idempotency keys, folders,
exports) is taken on the coordinator. A holder on another node never sees the lock: these tests
fail then (the second holder gets through)."""

from __future__ import annotations

import asyncio

import asyncpg
import httpx
import pytest
from fastapi import FastAPI
from sqlalchemy import make_url

from app.conversations.repository import lock_user_history
from app.jobs.queue import LOCK_NAMESPACE
from app.quotas.repository import UserUsage, mark_users
from app.quotas.rule import Quota
from tests.citus.conftest import DATABASE
from tests.helpers.apps import COMPANY, USER, AuthFactory
from tests.helpers.citus import CitusCluster
from tests.helpers.db import admin_fetchval, database_of, sessions
from tests.helpers.polling import wait_until
from tests.helpers.settings import enable_company
from tests.helpers.turns import new_chat, queue_turn, turn_body, user
from tests.helpers.worker import make_handler, make_worker

pytestmark = pytest.mark.slow

WAIT_SECONDS = 15.0
_WAITING = (
    "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a USING (pid)"
    " WHERE l.locktype = 'advisory' AND NOT l.granted AND a.datname = current_database()"
)
_COMPANY_NODE = (
    "SELECT nodeport FROM pg_dist_shard_placement"
    " WHERE shardid = get_shard_id_for_distribution_column('turns', $1::varchar)"
)


async def _waiting_by_node(cluster: CitusCluster) -> dict[int, int]:
    """Advisory locks waited for, by node (its port)."""
    counts = {}
    for node in cluster.nodes:
        conn = await asyncpg.connect(
            user="postgres", database=DATABASE, host="127.0.0.1", port=node.port
        )
        try:
            counts[node.port] = int(await conn.fetchval(_WAITING))
        finally:
            await conn.close()
    return counts


async def test_turn_saves_wait_for_an_erasure_lock_of_their_user(
    app: FastAPI,
    client: httpx.AsyncClient,
    auth: AuthFactory,
    admin_url: str,
    cluster: CitusCluster,
) -> None:
    """The erasure's lock of the user's history (its lock function, on the company's node)
    held: the turn-saves of that user (the lock taken inside their company function, with an
    Idempotency-Key too) wait for it on that node, alone, in a batch and keyed, and are written
    once it is released."""
    await enable_company(client, auth)
    company_node = int(await admin_fetchval(admin_url, _COMPANY_NODE, COMPANY))
    assert company_node != cluster.coordinator.port, "the company's shards are on a worker"
    chats = [new_chat() for _ in range(3)]
    stored = "SELECT count(*) FROM turns WHERE company_id = $1"
    async with sessions(app)() as session, session.begin():
        await lock_user_history(session, COMPANY, USER)

        async def save(chat: str, key: str | None = None) -> httpx.Response:
            body = turn_body([user(f"I said it in {chat}.")], "Noted.")
            headers = auth() | ({"Idempotency-Key": key} if key else {})
            return await client.post(f"/v1/chats/{chat}/turns", json=body, headers=headers)

        saving = [asyncio.create_task(save(chat)) for chat in chats]
        saving.append(asyncio.create_task(save(new_chat(), key="keyed-while-erasing")))

        async def waiting() -> bool:
            done = [task for task in saving if task.done()]
            assert not done, f"a turn-save got past the erasure's lock: {done[0].result().text}"
            by_node = await _waiting_by_node(cluster)
            elsewhere = {port: n for port, n in by_node.items() if port != company_node and n}
            assert not elsewhere, f"advisory locks waited for off the company's node: {by_node}"
            return by_node[company_node] >= 2

        await wait_until(waiting, WAIT_SECONDS, what="turn-saves waiting on the company's node")
        assert await admin_fetchval(admin_url, stored, COMPANY) == 0
        assert not any(task.done() for task in saving)
    answers = await asyncio.gather(*saving)
    assert {answer.status_code for answer in answers} == {202}, [a.text for a in answers]
    assert await admin_fetchval(admin_url, stored, COMPANY) == len(saving)


async def test_a_quota_mark_waits_for_an_erasure_lock_of_its_user(
    app: FastAPI,
    client: httpx.AsyncClient,
    auth: AuthFactory,
    admin_url: str,
    cluster: CitusCluster,
) -> None:
    """The quota check marks a user holding the user's history lock shared (its lock function,
    on the company's node): while the erasure's lock is held there, the mark waits for it."""
    await enable_company(client, auth)
    await queue_turn(client, auth, "I know Python")
    engine = database_of(app).engine
    company_node = int(await admin_fetchval(admin_url, _COMPANY_NODE, COMPANY))
    marks = "SELECT count(*) FROM user_quota_marks WHERE company_id = $1"
    async with sessions(app)() as session, session.begin():
        await lock_user_history(session, COMPANY, USER)
        over = [UserUsage(COMPANY, USER, 99)]
        marking = asyncio.create_task(mark_users(engine, Quota.USER_HISTORY_MESSAGES, 1, over))

        async def waiting() -> bool:
            assert not marking.done(), "the quota mark got past the erasure's lock"
            return (await _waiting_by_node(cluster))[company_node] >= 1

        await wait_until(waiting, WAIT_SECONDS, what="the quota mark waiting on the company's node")
        assert await admin_fetchval(admin_url, marks, COMPANY) == 0
    assert await marking == 1
    assert await admin_fetchval(admin_url, marks, COMPANY) == 1


async def test_a_claim_passes_over_a_user_whose_lock_is_held(
    app: FastAPI, client: httpx.AsyncClient, auth: AuthFactory, admin_url: str
) -> None:
    """The claim's lock of (company, user), held by another session on the coordinator: a
    worker claims none of that user's jobs, and claims it once the lock is released."""
    await enable_company(client, auth)
    await queue_turn(client, auth, "I know Python")
    handler, metrics, _ = make_handler(app)
    worker = make_worker(app, handler, metrics)
    dsn = make_url(admin_url).set(drivername="postgresql").render_as_string(hide_password=False)
    holder = await asyncpg.connect(dsn)
    try:
        async with holder.transaction():
            held = await holder.fetchval(
                "SELECT pg_try_advisory_xact_lock(hashtext($1 || $2), hashtext($3))",
                LOCK_NAMESPACE,
                COMPANY,
                USER,
            )
            assert held
            assert await worker.run_once() is None, "claimed a job whose user's lock was held"
        claimed = await worker.run_once()
        assert claimed is not None
        assert (claimed.company_id, claimed.user_id) == (COMPANY, USER)
    finally:
        await holder.close()
