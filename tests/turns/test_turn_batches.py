"""Group commit of the common turn-save (app/turns/batching.py): the batch statement decides and
writes each of its turns exactly as the one-turn statement does, over every case the one-turn
statement tells apart; concurrent batches over the same chats never deadlock; a failing batch
costs only its failing turn; batches form under a flood of concurrent turn-saves, never larger
than `TURN_BATCH_MAX`, and lose no turn."""

from __future__ import annotations

import asyncio
import json
import re
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import replace
from types import SimpleNamespace
from typing import Any, cast

import asyncpg
import httpx
import pytest
from fastapi import FastAPI

from app.consolidation.kinds import CONSOLIDATION, consolidation_payload
from app.conversations.modes import Role
from app.conversations.repository import NewMessage, NewTurn, chat_lock_key
from app.enablement.models import DEFAULT_LANGUAGE_MODEL
from app.jobs.enqueue import NewJob
from app.quotas.rule import QuotaLimits, WaitingJobs
from app.turns import repository
from app.turns.batching import ALONE, Connect, TurnBatcher
from tests.helpers.apps import COMPANY, SPACE, AuthFactory, client_of
from tests.helpers.apps import app_with as app_with_settings
from tests.helpers.db import admin_connect, rows
from tests.helpers.on_citus import ON_CITUS, not_on_citus
from tests.helpers.polling import wait_until
from tests.helpers.settings import enable_company, patch_space, patch_user_settings
from tests.helpers.turns import save_turn, user

# u-on reaches 5 waiting jobs when its turns are saved one after the other; u-full has 6
LIMITS = QuotaLimits(user_queued_jobs=6, job_max_turns=5, user_history_messages=10)
_BOGUS_ROLE = cast(Role, SimpleNamespace(value="bogus"))  # refused by ck_chat_messages_role


async def on_citus() -> bool:
    """The batcher's question, answered by the run: the statements' form for the cluster."""
    return ON_CITUS


TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
SPACE_OFF = "space-off"


async def _connect(database_url: str) -> asyncpg.Connection:
    return await admin_connect(database_url)


def _turn(
    user_id: str,
    chat_id: str,
    *,
    company: str = COMPANY,
    space_id: str = SPACE,
    model: str | None = None,
    traced: bool = False,
    refuse_skipped: bool = False,
    role: Role = Role.USER,
) -> repository.CommonTurn:
    turn = NewTurn(uuid.uuid4(), company, user_id, chat_id, space_id, "auto", model)
    messages = [
        NewMessage(role, f"{user_id} says hi", "request"),
        NewMessage(Role.ASSISTANT, f"hello {user_id}", "response"),
    ]
    job = NewJob(
        CONSOLIDATION,
        consolidation_payload(str(turn.id), space_id, None),
        3,
        trace_parent=TRACEPARENT if traced else None,
    )
    return repository.CommonTurn(turn, messages, job, model, refuse_skipped)


async def _written(conn: asyncpg.Connection, turns: Sequence[repository.CommonTurn]) -> Any:
    """What the statement stored for `turns`, by each turn's position: its row, its messages in
    id order, and its job."""
    position = {t.turn.id: n for n, t in enumerate(turns)}
    job_position = {t.job.id: n for n, t in enumerate(turns)}
    stored = await conn.fetch(
        "SELECT id, user_id, chat_id, space_id, history_mode, language_model FROM turns"
        " WHERE company_id = $1 AND id = ANY($2::uuid[])",
        COMPANY,
        list(position),
    )
    messages = await conn.fetch(
        "SELECT turn_id, chat_id, role, content, source FROM chat_messages"
        " WHERE company_id = $1 AND turn_id = ANY($2::uuid[]) ORDER BY id",
        COMPANY,
        list(position),
    )
    jobs = await conn.fetch(
        "SELECT id, user_id, kind, status, payload, max_attempts, trace_context FROM jobs"
        " WHERE company_id = $1 AND id = ANY($2::uuid[])",
        COMPANY,
        list(job_position),
    )
    return (
        {position[r["id"]]: dict(r) for r in stored},
        [(position[m["turn_id"]], m["chat_id"], m["role"], m["content"]) for m in messages],
        {job_position[j["id"]]: dict(j) | {"payload": json.loads(j["payload"])} for j in jobs},
    )


@asynccontextmanager
async def _rolled_back(database_url: str) -> AsyncIterator[asyncpg.Connection]:
    conn = await _connect(database_url)
    try:
        transaction = conn.transaction()
        await transaction.start()
        try:
            yield conn
        finally:
            await transaction.rollback()
    finally:
        await conn.close()


async def _scenarios(client: httpx.AsyncClient, auth: AuthFactory, app: FastAPI) -> None:
    """Users in every state the one-turn statement tells apart."""
    await enable_company(client, auth)
    await patch_space(client, auth, SPACE_OFF, {"context_memory": False}, expect=200)
    for sub in ("u-on", "u-off", "u-full", "u-over"):  # their first turns create their folders
        await save_turn(client, auth, "chat-0", [user("I work in Berlin.")], "Noted.", sub=sub)
    for n in range(5):  # six waiting jobs in all
        await save_turn(client, auth, "chat-0", [user(f"I like tea {n}.")], "Ok.", sub="u-full")
    await patch_user_settings(client, auth, {"context_memory": False}, "u-off", expect=200)
    async with _connected(app) as conn:
        await conn.execute(
            "INSERT INTO user_quota_marks (company_id, user_id, quota, used, quota_limit)"
            " VALUES ($1, 'u-over', 'user_history_messages', 11, 10)",
            COMPANY,
        )


def _first_held(app: FastAPI, held: asyncio.Event, stuck: asyncio.Event) -> Connect:
    """The app's driver connections, the first one handed over only once `held` is set: its
    statement waits as one stuck behind a lock would (`stuck` is set then), and the turns
    handed in meanwhile wait."""
    first = True

    @asynccontextmanager
    async def connect() -> AsyncIterator[asyncpg.Connection]:
        nonlocal first
        holding, first = first, False
        async with app.state.database.driver.connection() as conn:
            if holding:
                stuck.set()
                await held.wait()
            yield conn

    return connect


async def _waiting_in(batcher: TurnBatcher, count: int) -> None:
    """Until `count` turns wait in `batcher` for a statement to take them (the batcher has
    no public count of them: its queue is read)."""
    await wait_until(
        lambda: len(batcher._waiting) == count,
        what=lambda: f"{count} turns waiting for a statement ({len(batcher._waiting)} were)",
    )


@asynccontextmanager
async def _connected(app: FastAPI) -> AsyncIterator[asyncpg.Connection]:
    async with app.state.database.driver.connection() as conn:
        yield conn


def _batch() -> list[repository.CommonTurn]:
    return [
        _turn("u-on", "chat-1"),  # queued
        _turn("u-on", "chat-1"),  # the same chat again: queued, after the first
        _turn("u-on", "chat-2", model="orchestrator-model", traced=True),  # its model, traced
        _turn("u-on", "chat-3", space_id=SPACE_OFF),  # memory off for the space: saved, no job
        _turn("u-on", "chat-4", space_id=SPACE_OFF, refuse_skipped=True),  # nothing written
        _turn("u-off", "chat-1"),  # opted out: saved, no job
        _turn("u-new", "chat-1"),  # no folder yet: the general plan's
        _turn("u-full", "chat-1"),  # two waiting jobs, the quota: the general plan's
        _turn("u-over", "chat-1"),  # over the history quota: the general plan's
        _turn("u-on", "chat-5", model=""),  # no model named: the default's
    ]


def _decided(done: repository.CommonTurnSave) -> repository.CommonTurnSave:
    """What a turn-save decided, read and wrote, but for its count of the waiting jobs."""
    if done.settings is None:
        return done
    return replace(done, settings=replace(done.settings, waiting=None))


def _settings(done: repository.CommonTurnSave) -> repository.TurnSettingsRow:
    assert done.settings is not None
    return done.settings


async def test_a_batch_decides_and_writes_each_turn_as_its_own_statement_does(
    app: FastAPI, client: httpx.AsyncClient, auth: AuthFactory, database_url: str
) -> None:
    await _scenarios(client, auth, app)
    turns = _batch()
    async with _rolled_back(database_url) as conn:
        alone = [
            await repository.save_common_turn(conn, t, limits=LIMITS, citus=ON_CITUS) for t in turns
        ]
        written_alone = await _written(conn, turns)
    async with _rolled_back(database_url) as conn:
        together = await repository.save_common_turns(conn, turns, limits=LIMITS, citus=ON_CITUS)
        written_together = await _written(conn, turns)

    # the same decisions and the same rows; what differs is the snapshot: each lone statement
    # counts the jobs the turns before it queued, the batch counts what was there before it
    assert [_decided(r) for r in together] == [_decided(r) for r in alone]
    assert written_together == written_alone
    assert _settings(alone[3]).waiting == WaitingJobs(4, None)  # u-on's 1 and 3 more before
    assert _settings(together[3]).waiting == WaitingJobs(1, None)
    assert [r.settings is None for r in together] == [r.queued for r in together]
    outcomes = [(r.gated, r.written, r.queued) for r in together]
    assert outcomes == [
        (True, True, True),
        (True, True, True),
        (True, True, True),
        (True, True, False),
        (False, False, False),
        (True, True, False),
        (False, False, False),
        (False, False, False),
        (False, False, False),
        (True, True, True),
    ]
    assert not _settings(together[6]).user_folder_exists
    waiting = _settings(together[7]).waiting
    assert waiting is not None
    assert waiting.count == 6
    assert _settings(together[8]).usage.user_history_messages == 11
    turn_rows, messages, jobs = written_together
    assert sorted(turn_rows) == [0, 1, 2, 3, 5, 9]
    assert [m[0] for m in messages] == [0, 0, 1, 1, 2, 2, 3, 3, 5, 5, 9, 9]  # each turn whole
    assert sorted(jobs) == [0, 1, 2, 9]
    assert {n: jobs[n]["payload"]["model"] for n in jobs} == {
        0: DEFAULT_LANGUAGE_MODEL,
        1: DEFAULT_LANGUAGE_MODEL,
        2: "orchestrator-model",
        9: DEFAULT_LANGUAGE_MODEL,
    }
    assert [jobs[n]["trace_context"] for n in sorted(jobs)] == [None, None, [TRACEPARENT], None]


@not_on_citus(
    "the test's holder takes the chat's lock in a statement of its own, on the coordinator, and"
    " counts the waits there; the batch's company function takes its locks on the company's"
    " worker, where the same statement orders them alike"
)
async def test_batches_over_the_same_chats_in_opposite_orders_never_deadlock(
    app: FastAPI, client: httpx.AsyncClient, auth: AuthFactory, database_url: str
) -> None:
    """Each batch takes its turns' locks sorted by key: two batches holding turns of the same
    chats, handed in in opposite orders, wait for each other in turn, never in a cycle. A third
    session holds the lock of a chat both batches write to, so that both wait for it with some
    of their locks taken: in hand-in order, each would then hold a lock the other needs."""
    await enable_company(client, auth)
    subs = [f"u-{n}" for n in range(6)]
    for sub in subs:
        await save_turn(client, auth, "chat-0", [user("I work in Berlin.")], "Noted.", sub=sub)
    holder, first, second = [await _connect(database_url) for _ in range(3)]
    try:
        forward = [_turn(sub, "chat-a") for sub in subs]
        backward = [_turn(sub, "chat-a") for sub in subs][::-1]
        transaction = holder.transaction()
        await transaction.start()
        await holder.execute(
            "SELECT pg_advisory_xact_lock(hashtextextended($1, 0))",
            chat_lock_key(COMPANY, "u-2", "chat-a"),
        )
        saving = asyncio.gather(
            repository.save_common_turns(first, forward, limits=QuotaLimits(), citus=ON_CITUS),
            repository.save_common_turns(second, backward, limits=QuotaLimits(), citus=ON_CITUS),
        )

        async def both_wait_for_a_lock() -> bool:
            waiting = await holder.fetchval(
                "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid"
                " WHERE l.locktype = 'advisory' AND NOT l.granted"
                " AND a.datname = current_database()"
            )
            return bool(waiting == 2)

        await wait_until(both_wait_for_a_lock, what="both batches waiting for a lock")
        await transaction.commit()
        results = await asyncio.wait_for(saving, timeout=30)
    finally:
        for conn in (holder, first, second):
            await conn.close()
    assert all(r.written and r.queued for batch in results for r in batch)
    [count] = await rows(app, "SELECT count(*) AS n FROM turns WHERE chat_id = 'chat-a'")
    assert count.n == 12


async def test_a_failing_batch_leaves_each_turn_to_its_own_statement(
    app: FastAPI, client: httpx.AsyncClient, auth: AuthFactory, database_url: str
) -> None:
    """A batch whose statement fails writes nothing: every turn in it is handed back (`ALONE`)
    to be saved on its own, so the turn that broke it fails alone and the others are saved."""
    await enable_company(client, auth)
    for sub in ("u-a", "u-b"):
        await save_turn(client, auth, "chat-0", [user("I work in Berlin.")], "Noted.", sub=sub)
    good, bad = _turn("u-a", "chat-1"), _turn("u-b", "chat-1", role=_BOGUS_ROLE)
    held, stuck = asyncio.Event(), asyncio.Event()  # the batch forms behind the first statement
    batcher = TurnBatcher(
        _first_held(app, held, stuck), QuotaLimits(), max_batch=8, in_flight=1, citus=on_citus
    )
    lone = asyncio.create_task(batcher.save(_turn("u-a", "chat-2")))
    await wait_until(stuck.is_set, what="the first statement held")
    together = [asyncio.create_task(batcher.save(t)) for t in (good, bad)]
    await _waiting_in(batcher, 2)
    held.set()
    first = await lone
    assert first is not ALONE
    assert first.written
    assert await together[0] is ALONE
    assert await together[1] is ALONE
    async with _connected(app) as conn:
        assert (
            await repository.save_common_turn(conn, good, limits=QuotaLimits(), citus=ON_CITUS)
        ).written
        with pytest.raises(asyncpg.CheckViolationError):
            await repository.save_common_turn(conn, bad, limits=QuotaLimits(), citus=ON_CITUS)
    stored = await rows(app, "SELECT user_id, chat_id FROM turns WHERE chat_id <> 'chat-0'")
    assert sorted((r.user_id, r.chat_id) for r in stored) == [("u-a", "chat-1"), ("u-a", "chat-2")]


async def test_a_batch_holds_the_turns_of_one_company(
    app: FastAPI, client: httpx.AsyncClient, auth: AuthFactory, database_url: str
) -> None:
    """Turns of two companies handed in together are written in one batch per company (every
    table the statement touches pinned to one company), the longest-waiting company first; a
    batch of two companies is refused before anything is sent."""
    for company in (COMPANY, "beta"):
        await enable_company(client, auth, company)
        await save_turn(client, auth, "chat-0", [user("Hi.")], "Hi.", sub="u-a", company=company)
    held, stuck = asyncio.Event(), asyncio.Event()
    batches: list[int] = []
    batcher = TurnBatcher(
        _first_held(app, held, stuck), QuotaLimits(), max_batch=8, in_flight=1, citus=on_citus
    )
    batcher.observe = batches.append
    lone = asyncio.create_task(batcher.save(_turn("u-a", "chat-1")))
    await wait_until(stuck.is_set, what="the first statement held")
    companies = ["beta", COMPANY, "beta", COMPANY, "beta"]
    saving = [
        asyncio.create_task(batcher.save(_turn("u-a", f"chat-{n}", company=company)))
        for n, company in enumerate(companies, start=2)
    ]
    await _waiting_in(batcher, len(companies))
    held.set()
    results = [await lone] + [await task for task in saving]
    assert all(r is not ALONE and r.written and r.queued for r in results)
    assert batches == [1, 3, 2]
    stored = await rows(app, "SELECT company_id, count(*) AS n FROM turns GROUP BY company_id")
    assert {(r.company_id, r.n) for r in stored} == {(COMPANY, 4), ("beta", 4)}
    async with _connected(app) as conn:
        mixed = [_turn("u-a", "chat-9"), _turn("u-a", "chat-9", company="beta")]
        with pytest.raises(ValueError, match="share every parameter"):
            await repository.save_common_turns(conn, mixed, limits=QuotaLimits(), citus=ON_CITUS)


async def test_a_lone_turn_meets_its_own_error(database_url: str) -> None:
    """A batch of one is the one-turn statement: its error is the request's, not `ALONE`."""
    async with app_with_settings(database_url) as app:
        batcher = TurnBatcher(
            app.state.database.driver.connection,
            QuotaLimits(),
            max_batch=8,
            in_flight=1,
            citus=on_citus,
        )
        with pytest.raises(asyncpg.CheckViolationError):
            await batcher.save(_turn("u-b", "chat-1", role=_BOGUS_ROLE))


@pytest.mark.parametrize("max_batch", [4])
async def test_a_flood_of_turn_saves_is_written_in_batches_no_larger_than_the_limit(
    database_url: str, auth: AuthFactory, max_batch: int
) -> None:
    """200 turn-saves of 20 users handed in at once, over HTTP: every one answered 202 and
    stored once, each turn's messages contiguous within its chat; the statements held more
    than one turn, and never more than `TURN_BATCH_MAX`."""
    async with (
        app_with_settings(database_url, turn_batch_max=max_batch, turn_batch_in_flight=1) as app,
        client_of(app) as client,
    ):
        await enable_company(client, auth)
        subs = [f"flood-{n}" for n in range(20)]
        for sub in subs:
            await save_turn(client, auth, "chat-0", [user("I work in Berlin.")], "Noted.", sub=sub)
        sizes: list[int] = []
        app.state.turn_batcher.observe = sizes.append

        async def one(n: int) -> httpx.Response:
            sub = subs[n % len(subs)]
            return await save_turn(
                client, auth, f"chat-{'abc'[n % 3]}", [user(f"message {n}")], f"answer {n}", sub=sub
            )

        responses = await asyncio.gather(*(one(n) for n in range(200)))
        assert [r.status_code for r in responses] == [202] * 200
        assert sum(sizes) == 200
        assert 1 < max(sizes) <= max_batch
        stored = await rows(
            app,
            "SELECT user_id, chat_id, turn_id, content FROM chat_messages"
            " WHERE chat_id <> 'chat-0' ORDER BY id",
        )
    assert len(stored) == 400
    assert len({r.turn_id for r in stored}) == 200
    by_chat: dict[tuple[str, str], list[Any]] = {}
    for r in stored:
        by_chat.setdefault((r.user_id, r.chat_id), []).append(r)
    for messages in by_chat.values():
        for question, answer in zip(messages[::2], messages[1::2], strict=True):
            assert question.turn_id == answer.turn_id
            n = question.content.removeprefix("message ")
            assert answer.content == f"answer {n}"


@pytest.mark.parametrize("plan_mode", ["force_custom_plan", "force_generic_plan"])
async def test_a_turn_save_counts_the_users_waiting_jobs_over_the_owners_index(
    app: FastAPI, client: httpx.AsyncClient, auth: AuthFactory, database_url: str, plan_mode: str
) -> None:
    """After a VACUUM that found the queue empty the planner believes every partial index of
    waiting jobs empty; with a backlog queued since, the count of the user's waiting jobs (in the
    one-turn and in the batch statement, planned for its values or generic) must still read the
    owner's index, not every waiting job of every company through the claim's."""
    await enable_company(client, auth)
    await save_turn(client, auth, "chat-0", [user("I work in Berlin.")], "Noted.", sub="u-a")
    conn = await _connect(database_url)
    try:
        insert = (
            "INSERT INTO jobs (company_id, id, user_id, kind, status, payload, attempts,"
            " max_attempts) SELECT $1, gen_random_uuid(), 'backlog-' || n % 500, 'consolidation',"
            " $2, '{}', 0, 3 FROM generate_series(1, $3) n"
        )
        await conn.execute(insert, COMPANY, "queued", 20_000)  # a drained backlog, as after a run
        await conn.execute("UPDATE jobs SET status = 'succeeded'")
        await conn.execute("VACUUM ANALYZE jobs")
        await conn.execute(insert, COMPANY, "queued", 2_000)
        await conn.execute(f"SET plan_cache_mode = {plan_mode}")
        one = _turn("u-a", "chat-1")
        single_sql, single_names = repository._COMMON_TURN_SAVE[False]
        single = repository.common_turn_params(one, LIMITS)
        batch_sql, batch_names = repository._COMMON_TURNS_SAVE
        batch = repository.common_turns_params([one, _turn("u-a", "chat-2")], LIMITS)
        for sql, names, params in (
            (single_sql, single_names, single),
            (batch_sql, batch_names, batch),
        ):
            explain = await conn.prepare(f"EXPLAIN {sql}")
            plan = "\n".join(r[0] for r in await explain.fetch(*[params[n] for n in names]))
            assert re.search(r"ix_jobs_waiting_owner(_\d+)? on jobs(_\d+)? wj", plan), plan
            assert "ix_jobs_claimable" not in plan, plan
    finally:
        await conn.close()


async def test_a_second_statement_starts_beside_a_running_one_with_a_quarter_batch(
    app: FastAPI, client: httpx.AsyncClient, auth: AuthFactory
) -> None:
    """While a statement runs, the turns handed in wait for it, until a quarter of
    `TURN_BATCH_MAX` of them wait: then a second one goes beside it (here the first waits as a
    statement stuck behind a lock would), as long as `TURN_BATCH_IN_FLIGHT` allows."""
    await enable_company(client, auth)
    await save_turn(client, auth, "chat-0", [user("I work in Berlin.")], "Noted.", sub="u-a")
    held, stuck = asyncio.Event(), asyncio.Event()
    batches: list[int] = []
    batcher = TurnBatcher(
        _first_held(app, held, stuck), QuotaLimits(), max_batch=8, in_flight=2, citus=on_citus
    )
    batcher.observe = batches.append
    saving = [asyncio.create_task(batcher.save(_turn("u-a", "chat-1")))]
    await wait_until(stuck.is_set, what="the first statement held")
    saving.append(asyncio.create_task(batcher.save(_turn("u-a", "chat-2"))))
    await _waiting_in(batcher, 1)
    assert batches == [1]  # one turn waits: less than a quarter batch
    saving.append(asyncio.create_task(batcher.save(_turn("u-a", "chat-3"))))
    done, _ = await asyncio.wait(saving[1:], timeout=5)
    assert batches == [1, 2]
    assert len(done) == 2  # written beside the held statement
    held.set()
    results = [await task for task in saving]
    assert all(r is not ALONE and r.written for r in results)
