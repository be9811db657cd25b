"""The company memory policy's retention on the worker: Recent Topics older than the company's
`recent_topics_days` leave the head profile in a `retention` version, and memories idle longer
than its `inactive_memory_days` are erased as an opt-out erases them, setting untouched.

The steps run on a frozen clock; idleness is made by moving a user's rows into the past."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from app.detectors import Category
from app.enablement.memory_policy import DEFAULT_ACTIONS
from app.kit.observability import Metrics
from app.profiles import retention_repository
from app.profiles.document import Profile, Section, parse
from app.profiles.expiry import retention_cutoff
from app.profiles.profile import topic_prefix
from app.profiles.retention import (
    RETENTION_ACTOR,
    RETENTION_LIMIT,
    RETENTION_WINDOW,
    memory_retention_steps,
)
from app.profiles.retention_repository import START
from app.profiles.service import load_profile, save_consolidation
from app.profiles.switch import lock_user_memory
from app.profiles.versions import ExpectedHead, VersionPolicy, VersionSource
from tests.helpers.apps import COMPANY, OPERATOR, USER, AuthFactory, app_with
from tests.helpers.db import admin_execute, rows, scalar
from tests.helpers.memory import head_content, memory_counts, seed_memory, seed_profile, versions
from tests.helpers.metrics import sample
from tests.helpers.profiles import STORED_COUNTER
from tests.helpers.settings import enable_company, register_company
from tests.helpers.turns import save_turn, user
from tests.helpers.worker import wait_for

GLOBEX = "globex"
INITECH = "initech"


@pytest.fixture
def now() -> datetime:
    """The frozen clock of the steps (and of the versions they write)."""
    return datetime.now(UTC).replace(microsecond=0)


def topic(now: datetime, days_ago: float, text: str) -> str:
    return topic_prefix(now - timedelta(days=days_ago)) + text


class Retention:
    """The two retention steps on the app's database and a frozen clock, with their metrics."""

    def __init__(
        self,
        engine: AsyncEngine,
        now: datetime,
        *,
        window: int = RETENTION_WINDOW,
        limit: int = RETENTION_LIMIT,
    ) -> None:
        self.engine, self.now, self.metrics = engine, now, Metrics()
        self.policy = VersionPolicy(STORED_COUNTER, keep=50, clock=lambda: now)
        self._erase, self._expire = memory_retention_steps(
            self.policy, self.metrics, window=window, limit=limit
        )

    async def erase(self) -> int:
        return await self._erase(self.engine)

    async def expire(self) -> int:
        return await self._expire(self.engine)

    def count(self, kind: str) -> float:
        return sample(self.metrics, "memory_retention_total", kind=kind)


@pytest.fixture
def retention(engine: AsyncEngine, now: datetime) -> Retention:
    return Retention(engine, now)


async def set_retention(
    client: httpx.AsyncClient,
    auth: AuthFactory,
    company: str,
    *,
    recent_topics_days: int = 90,
    inactive_memory_days: int = 0,
) -> None:
    """The company's memory policy, as its operator saves it: default actions, these days."""
    body: dict[str, Any] = {category.value: DEFAULT_ACTIONS[category] for category in Category}
    body |= {"recent_topics_days": recent_topics_days, "inactive_memory_days": inactive_memory_days}
    await register_company(client, auth, company)
    response = await client.put(
        f"/v1/companies/{company}/memory-policy",
        json=body,
        headers=auth("olga", "platform", OPERATOR),
    )
    assert response.status_code == 200, response.text


async def reasons(app: FastAPI, user_id: str, company: str = COMPANY) -> list[str]:
    found = await rows(
        app,
        "SELECT reason FROM memory_versions WHERE company_id = :c AND user_id = :u"
        " ORDER BY version",
        c=company,
        u=user_id,
    )
    return [row.reason for row in found]


def section(content: str | None, name: Section) -> tuple[str, ...]:
    assert content is not None
    return parse(content).bullets(name)


async def age(database_url: str, user_id: str, days: int, company: str = COMPANY) -> None:
    """Move everything the user's memory was touched by `days` days into the past: the
    memory.md, its versions, the user's jobs and turns. The days are taken off in UTC (`AT TIME
    ZONE`, each step immutable): a Citus cluster refuses an UPDATE whose new value comes from
    a stable function of a column, as `timestamptz - interval` is."""

    def shifted(column: str) -> str:
        return f"({column} AT TIME ZONE 'UTC' - make_interval(days => {days})) AT TIME ZONE 'UTC'"

    owner = f"company_id = '{company}' AND user_id = '{user_id}'"
    await admin_execute(
        database_url,
        f"UPDATE memory_files SET created_at = {shifted('created_at')},"  # noqa: S608
        f" updated_at = {shifted('updated_at')} WHERE {owner}",
        *(
            f"UPDATE {table} SET created_at = {shifted('created_at')} WHERE {owner}"  # noqa: S608
            for table in ("memory_versions", "jobs", "turns")
        ),
    )


# --- Recent Topics ------------------------------------------------------------------------------


async def test_recent_topics_older_than_the_bound_leave_the_head_in_a_retention_version(
    app: FastAPI, retention: Retention, client: httpx.AsyncClient, auth: AuthFactory
) -> None:
    now = retention.now
    await set_retention(client, auth, COMPANY, recent_topics_days=30)
    old_work = topic(now, 400, "dated like a topic, but work context")
    await seed_profile(
        app,
        USER,
        {
            Section.IDENTITY: ["likes green tea"],
            Section.WORK: [old_work],
            Section.RECENT: [
                topic(now, 40, "kubernetes upgrade"),
                topic(now, 29, "quarterly report"),
                topic(now, 31, "hiring plan"),
                "an undated topic",
            ],
        },
    )
    await seed_profile(app, "bob", {Section.RECENT: [topic(now, 2, "budget review")]})

    assert await retention.expire() == 1

    assert await reasons(app, USER) == ["consolidation", "retention"]
    head = await head_content(app)
    assert section(head, Section.RECENT) == (topic(now, 29, "quarterly report"), "an undated topic")
    assert section(head, Section.IDENTITY) == ("likes green tea",)
    assert section(head, Section.WORK) == (old_work,)
    written = (await versions(app))[-1]
    assert [(op["op"], op["section"]) for op in written.operations] == [
        ("DELETE", "Recent Topics"),
        ("DELETE", "Recent Topics"),
    ]
    assert parse(written.content).frontmatter.turn_count == 1  # retention is no consolidation
    assert await reasons(app, "bob") == ["consolidation"]  # nothing expired: no version
    assert retention.count("topics_dropped") == 2
    assert retention.count("versions_written") == 1

    assert await retention.expire() == 0  # idempotent: nothing more to drop, no empty version
    assert await reasons(app, USER) == ["consolidation", "retention"]
    assert retention.count("versions_written") == 1


async def test_each_company_has_its_own_bound_and_zero_keeps_recent_topics_forever(
    app: FastAPI, retention: Retention, client: httpx.AsyncClient, auth: AuthFactory
) -> None:
    now = retention.now
    await set_retention(client, auth, GLOBEX, recent_topics_days=0)
    younger = topic(now, 80, "younger")
    topics = {Section.RECENT: [topic(now, 3000, "ancient"), topic(now, 100, "older"), younger]}
    await seed_profile(app, USER, topics, company=GLOBEX)
    await seed_profile(app, USER, topics, company=INITECH)  # no policy saved: 90 days

    assert await retention.expire() == 1

    assert await reasons(app, USER, GLOBEX) == ["consolidation"]
    assert await reasons(app, USER, INITECH) == ["consolidation", "retention"]
    initech = await rows(
        app,
        "SELECT content FROM memory_versions WHERE company_id = :c ORDER BY version DESC",
        c=INITECH,
    )
    assert section(initech[0].content, Section.RECENT) == (younger,)


async def test_the_candidate_query_finds_only_heads_with_an_expired_recent_topic(
    app: FastAPI, sessions: async_sessionmaker[AsyncSession], now: datetime
) -> None:
    old, young = topic(now, 100, "old"), topic(now, 1, "young")
    await seed_profile(app, "ann", {Section.RECENT: [young, old]})
    await seed_profile(app, "ben", {Section.WORK: [old], Section.FOLLOWUPS: [old]})
    await seed_profile(app, "cid", {Section.RECENT: [young, "2020-01-01 no prefix"]})
    await seed_profile(app, "dee", {Section.RECENT: [old]}, version=4)
    cutoff = retention_cutoff(now, 90)
    assert cutoff is not None

    async with sessions() as session:
        window = await retention_repository.select_window(session, START, 10)
        assert window is not None
        select = retention_repository.select_expiring_heads
        found = await select(session, window, COMPANY, cutoff, 10)
        first = await select(session, window, COMPANY, cutoff, 1)

    assert [(head.key.user_id, head.version) for head in found] == [("ann", 1), ("dee", 4)]
    assert [head.key.user_id for head in first] == ["ann"]


async def test_a_run_handles_a_bounded_number_in_order_and_the_next_run_continues(
    app: FastAPI, engine: AsyncEngine, now: datetime
) -> None:
    users = [f"user-{n}" for n in range(5)]
    for name in users:
        await seed_profile(app, name, {Section.RECENT: [topic(now, 200, f"{name}'s old topic")]})
    retention = Retention(engine, now, window=3, limit=2)  # examines 3, writes at most 2

    assert await retention.expire() == 2
    assert [len(await reasons(app, name)) for name in users] == [2, 2, 1, 1, 1]
    assert await retention.expire() == 2  # from user-2 on, not from the window's end
    assert [len(await reasons(app, name)) for name in users] == [2, 2, 2, 2, 1]
    assert await retention.expire() == 1  # the end: the next run starts over
    assert await retention.expire() == 0
    assert [await reasons(app, name) for name in users] == [["consolidation", "retention"]] * 5


async def waiting_for_a_memory_lock(app: FastAPI) -> bool:
    waiting: int = await scalar(
        app,
        "SELECT count(*) FROM pg_locks l JOIN pg_database d ON d.oid = l.database"
        " WHERE l.locktype = 'advisory' AND NOT l.granted AND d.datname = current_database()",
    )
    return waiting > 0


async def test_a_write_racing_the_retention_wins_and_its_topics_expire_on_the_next_pass(
    app: FastAPI, retention: Retention, sessions: async_sessionmaker[AsyncSession]
) -> None:
    old = topic(retention.now, 100, "migration to postgres")
    young = topic(retention.now, 1, "vacation planning")
    await seed_profile(app, USER, {Section.RECENT: [old, young]})

    async with sessions() as session, session.begin():  # a consolidation, committed late
        await lock_user_memory(session, COMPANY, USER)
        profile, version = await load_profile(session, COMPANY, USER)
        learned = dict(profile.sections) | {Section.SKILLS: ("writes Rust",)}
        consolidated = Profile.from_sections(profile.frontmatter, learned)
        head = ExpectedHead(COMPANY, USER, version)
        source = VersionSource("consolidation")
        assert await save_consolidation(session, head, consolidated, source, retention.policy)
        racing = asyncio.create_task(retention.expire())
        await wait_for(lambda: waiting_for_a_memory_lock(app), seconds=10)

    assert await racing == 0  # its compare-and-set lost: nothing written
    assert await reasons(app, USER) == ["consolidation", "consolidation"]
    assert section(await head_content(app), Section.SKILLS) == ("writes Rust",)

    assert await retention.expire() == 1
    head_now = await head_content(app)
    assert section(head_now, Section.SKILLS) == ("writes Rust",)  # the racing write is kept
    assert section(head_now, Section.RECENT) == (young,)
    assert retention.count("versions_written") == 1


# --- idle memories ------------------------------------------------------------------------------


async def test_memories_idle_longer_than_the_bound_are_erased_as_an_opt_out_erases_them(
    app: FastAPI,
    retention: Retention,
    client: httpx.AsyncClient,
    auth: AuthFactory,
    database_url: str,
) -> None:
    await set_retention(client, auth, COMPANY, inactive_memory_days=30)
    for name in ("ida", "rita", "wendy", "tom", "jay"):
        await seed_memory(app, name)
        await age(database_url, name, 40)
    await seed_memory(app, "alice")  # written today
    await seed_memory(app, "gina", GLOBEX)  # no policy saved: never erased
    await age(database_url, "gina", 4000, GLOBEX)
    # recent: a version the retention wrote (no use), a user's edit, a turn, a finished job
    await admin_execute(
        database_url,
        "UPDATE memory_versions SET reason = 'retention', created_at = now()"
        " WHERE user_id = 'rita' AND version = 3",
        "UPDATE memory_versions SET reason = 'user_edit', created_at = now()"
        " WHERE user_id = 'wendy' AND version = 3",
        "INSERT INTO turns (company_id, id, user_id, chat_id, space_id, history_mode)"
        " VALUES ('acme', gen_random_uuid(), 'tom', 'chat', 'space-1', 'auto')",
        "UPDATE jobs SET created_at = now() WHERE user_id = 'jay' AND status = 'succeeded'",
    )

    assert await retention.erase() == 2

    gone = {"folders": 0, "acl": 0, "files": 0, "versions": 0, "pending_jobs": 0}
    for name in ("ida", "rita"):
        assert await memory_counts(app, name) == gone | {"finished_jobs": 2}
    kept = {"folders": 1, "acl": 2, "files": 1, "versions": 3, "pending_jobs": 3}
    for name in ("wendy", "tom", "jay", "alice"):
        assert await memory_counts(app, name) == kept | {"finished_jobs": 2}
    assert await memory_counts(app, "gina", GLOBEX) == kept | {"finished_jobs": 2}
    events = await rows(
        app,
        "SELECT actor_id, action, target_id, new FROM audit_events"
        " WHERE target_kind = 'user' ORDER BY target_id",
    )
    assert [(e.actor_id, e.action, e.target_id) for e in events] == [
        (RETENTION_ACTOR, "user_memory.deleted", "ida"),
        (RETENTION_ACTOR, "user_memory.deleted", "rita"),
    ]
    assert events[0].new == {
        "profile": True,
        "versions": 3,
        "jobs": 3,
        "folder": True,
        "inactive_memory_days": 30,
    }
    assert retention.count("memories_erased") == 2

    assert await retention.erase() == 0  # idempotent
    assert retention.count("memories_erased") == 2


async def test_an_erased_user_keeps_their_setting_and_memory_restarts_at_the_next_turn(
    app: FastAPI,
    retention: Retention,
    client: httpx.AsyncClient,
    auth: AuthFactory,
    database_url: str,
) -> None:
    await enable_company(client, auth)
    await set_retention(client, auth, COMPANY, inactive_memory_days=30)
    await seed_memory(app, USER, job_statuses=())
    await age(database_url, USER, 31)

    assert await retention.erase() == 1

    assert (await client.get("/v1/me/memory", headers=auth())).status_code == 404
    setting = await client.get("/v1/me/settings", headers=auth())
    assert setting.json()["context_memory"] is True
    turn = await save_turn(client, auth, "chat-1", [user("I am a data engineer")], "Noted.")
    assert turn.json()["consolidation"]["status"] == "queued"
    assert (await memory_counts(app, USER))["folders"] == 1


async def test_a_company_that_never_erases_idle_memories_keeps_them(
    app: FastAPI, retention: Retention, database_url: str
) -> None:
    await seed_memory(app, USER)
    await age(database_url, USER, 10_000)

    assert await retention.erase() == 0

    assert (await memory_counts(app, USER))["versions"] == 3


# --- on the service's worker --------------------------------------------------------------------


async def test_the_service_worker_applies_each_companys_retention(
    app: FastAPI,
    client: httpx.AsyncClient,
    auth: AuthFactory,
    database_url: str,
) -> None:
    now = datetime.now(UTC)
    await seed_profile(
        app, USER, {Section.RECENT: [topic(now, 200, "old news"), topic(now, 1, "fresh")]}
    )
    await set_retention(client, auth, GLOBEX, inactive_memory_days=30)
    await seed_memory(app, "ida", GLOBEX)
    await age(database_url, "ida", 31, GLOBEX)

    async with app_with(database_url, worker_enabled=True) as service:

        async def both_applied() -> bool:
            erased = (await memory_counts(app, "ida", GLOBEX))["files"] == 0
            return erased and await reasons(app, USER) == ["consolidation", "retention"]

        await wait_for(both_applied, seconds=10)
        metrics: Metrics = service.state.metrics
        assert sample(metrics, "memory_retention_total", kind="topics_dropped") == 1
        assert sample(metrics, "memory_retention_total", kind="memories_erased") == 1

    assert section(await head_content(app), Section.RECENT) == (topic(now, 1, "fresh"),)
