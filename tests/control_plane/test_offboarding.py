"""Offboarding over the whole schema: after `DELETE /v1/companies/{company_id}`, a sweep of every
table of the schema finds no row of the company (by `company_id`, or its id anywhere in a row)
but the platform log and the receipt, which name it on purpose; another company, seeded the same
way, is untouched row for row; the receipt counts exactly the rows there were. The job is
durable: stopped half-way (a table that fails), it leaves its counts of the tables done, and
the worker's step finishes it without counting anything twice.

The tables are discovered from `information_schema`, so a table added later is swept too.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any, Final

import httpx
import pytest
from fastapi import FastAPI
from sqlalchemy.exc import DBAPIError

from app.control_plane.offboarding import Offboarder
from app.enablement.decision import FLAG_CONTEXT_MEMORY
from app.quotas.maintenance import quota_check_step
from tests.helpers.apps import OPERATOR, SPACE_ADMIN, AuthFactory
from tests.helpers.db import database_of
from tests.helpers.settings import memory_policy_body, register_company
from tests.helpers.sweep import every_count as scalar
from tests.helpers.sweep import every_row as rows
from tests.helpers.sweep import schema_columns
from tests.helpers.worker import make_handler, make_worker

PLATFORM: Final = ("olga", "platform", OPERATOR)
PLATFORM_TABLES: Final = {"platform_events", "company_offboardings"}
"""Where a company is named after it is gone, on purpose (`subject_company`)."""
NOT_SEEDED: Final = {"model_budget_crossings", "usage_daily_model_calls"}
"""Company tables the seed leaves empty (both need a model's calls; the tests run the offline
engine)."""


@dataclass(frozen=True)
class Table:
    name: str
    columns: tuple[tuple[str, str], ...]

    @property
    def of_company(self) -> bool:
        return any(name == "company_id" for name, _ in self.columns)

    @property
    def as_text(self) -> str:
        parts = [
            f"encode(\"{name}\", 'escape')" if kind == "bytea" else f'"{name}"::text'
            for name, kind in self.columns
        ]
        return f"concat_ws(chr(31), {', '.join(parts)})"


async def discover(app: FastAPI) -> list[Table]:
    return [Table(name, columns) for name, columns in (await schema_columns(app)).items()]


async def rows_of(app: FastAPI, table: Table, company: str) -> int:
    """Rows of `company` in `table`: by `company_id`, or naming it anywhere."""
    where = f"position('{company}' IN {table.as_text}) > 0"
    if table.of_company:
        where = f"company_id = '{company}' OR {where}"
    found: int = await scalar(app, f'SELECT count(*) FROM "{table.name}" WHERE {where}')  # noqa: S608
    return found


async def digest(app: FastAPI, tables: list[Table], company: str) -> dict[str, tuple[int, str]]:
    """Per company table: the company's rows and a digest of their whole text."""
    found = {}
    for table in (t for t in tables if t.of_company):
        row = (
            await rows(
                app,
                f"SELECT count(*) AS n, md5(coalesce(string_agg({table.as_text}, chr(30)"  # noqa: S608
                f" ORDER BY {table.as_text}), '')) AS d FROM \"{table.name}\""
                f" WHERE company_id = '{company}'",
            )
        )[0]
        found[table.name] = (row.n, row.d)
    return found


async def seed(app: FastAPI, client: httpx.AsyncClient, auth: AuthFactory, company: str) -> None:
    """What a company leaves in every table: its registration, flags, memory policy, rate
    limits, model budget, a space, users' settings and profiles (a redacted value), keyed turns,
    an explicit consolidation the worker ran, usage counted, quota marks."""
    operator = auth(*PLATFORM)
    await register_company(client, auth, company)
    for path, body in (
        (f"feature-flags/{FLAG_CONTEXT_MEMORY}", {"enabled": True}),
        ("memory-policy", memory_policy_body(phone_numbers="allow")),
        ("rate-limits", {"turns": {"user": {"quota": 500, "window_seconds": 60}}}),
        ("model-budget", {"monthly_tokens": 1_000_000, "when_spent": "offline"}),
    ):
        response = await client.put(f"/v1/companies/{company}/{path}", json=body, headers=operator)
        assert response.status_code == 200, response.text
    admin = auth("sam", company, SPACE_ADMIN)
    response = await client.patch(
        "/v1/spaces/space-1", json={"context_memory": True}, headers=admin
    )
    assert response.status_code == 200, response.text
    for user in ("ann", "ben"):
        me = auth(user, company)
        for switch in (False, True):  # a stored setting, back on
            response = await client.patch(
                "/v1/me/settings", json={"context_memory": switch}, headers=me
            )
            assert response.status_code == 200, response.text
        profile = (
            "# User Memory\n\n## Identity\n- Reach me at ann@example.com.\n\n"
            "## Communication Preferences\n\n## Work Context\n\n## Skills & Expertise\n\n"
            "## Recent Topics\n\n## Open Questions / Follow-ups\n"
        )
        response = await client.put(
            "/v1/me/memory", json={"content": profile}, headers=me | {"If-None-Match": "*"}
        )
        assert response.status_code == 201, response.text
        turn: dict[str, Any] = {
            "space_id": "space-1",
            "messages": [{"role": "user", "content": f"I work at {company} Labs."}],
            "response": {"role": "assistant", "content": "Noted."},
        }
        response = await client.post(
            "/v1/chats/chat-1/turns", json=turn, headers=me | {"Idempotency-Key": f"k-{user}"}
        )
        assert response.status_code == 202, response.text
    handler, metrics, _ = make_handler(app)
    assert await make_worker(app, handler, metrics).run_once() is not None
    await app.state.usage_meter.flush()
    check = quota_check_step(user_history_messages=1, company_storage_bytes=1, interval_seconds=0)
    assert await check(database_of(app).engine) > 0


@dataclass(frozen=True)
class World:
    tables: list[Table]
    leaving: str
    staying: str
    before: dict[str, tuple[int, str]]  # the leaving company's rows per table
    staying_before: dict[str, tuple[int, str]]


@pytest.fixture
async def world(app: FastAPI, client: httpx.AsyncClient, auth: AuthFactory) -> World:
    tag = uuid.uuid4().hex[:8]
    leaving, staying = f"leaving-{tag}", f"staying-{tag}"
    for company in (leaving, staying):
        await seed(app, client, auth, company)
    tables = await discover(app)
    before = await digest(app, tables, leaving)
    company_tables = {t.name for t in tables if t.of_company}
    assert {name for name, (n, _) in before.items() if n} == company_tables - NOT_SEEDED
    return World(tables, leaving, staying, before, await digest(app, tables, staying))


async def left_of(app: FastAPI, world: World) -> dict[str, int]:
    """Rows naming the leaving company, per table, beyond the platform log and receipts'
    `subject_company`."""
    found = {}
    for table in world.tables:
        if table.name in PLATFORM_TABLES:
            n: int = await scalar(
                app,
                f'SELECT count(*) FROM "{table.name}" WHERE subject_company <> :c'  # noqa: S608
                f" AND position(:c IN {table.as_text}) > 0",
                c=world.leaving,
            )
        else:
            n = await rows_of(app, table, world.leaving)
        if n:
            found[table.name] = n
    return found


def expected_counts(world: World) -> dict[str, int]:
    return {name: n for name, (n, _) in world.before.items() if n}


async def test_an_offboarded_company_leaves_nothing_but_its_receipt_and_log(
    app: FastAPI, client: httpx.AsyncClient, auth: AuthFactory, world: World
) -> None:
    operator = auth(*PLATFORM)

    response = await client.delete(f"/v1/companies/{world.leaving}", headers=operator)

    assert response.status_code == 202, response.text
    accepted = response.json()
    assert accepted["status"] == "queued"
    assert accepted["erased"] == {"companies": 1}
    assert await left_of(app, world) == {}
    assert await digest(app, world.tables, world.staying) == world.staying_before
    receipt = await client.get(f"/v1/companies/{world.leaving}/offboarding", headers=operator)
    assert receipt.status_code == 200, receipt.text
    done = receipt.json()
    assert done["offboarding_id"] == accepted["offboarding_id"]
    assert done["status"] == "done"
    assert done["erased"] == expected_counts(world)
    assert done["erased_rows"] == sum(expected_counts(world).values())
    assert done["finished_at"] >= done["started_at"] >= done["requested_at"]
    events = await rows(
        app,
        "SELECT action, actor_company_id, actor_id, detail FROM platform_events"
        " WHERE subject_company = :c ORDER BY id",
        c=world.leaving,
    )
    assert [e.action for e in events] == [
        "company.registered",
        "company.offboarding_requested",
        "company.offboarded",
    ]
    assert (events[1].actor_company_id, events[1].actor_id) == ("platform", "olga")
    assert events[2].detail["erased"] == done["erased"]


async def test_a_second_delete_answers_the_same_receipt_and_writes_nothing(
    app: FastAPI, client: httpx.AsyncClient, auth: AuthFactory, world: World
) -> None:
    operator = auth(*PLATFORM)
    first = await client.delete(f"/v1/companies/{world.leaving}", headers=operator)
    done = (await client.get(f"/v1/companies/{world.leaving}/offboarding", headers=operator)).json()
    events: int = await scalar(app, "SELECT count(*) FROM platform_events")

    again = await client.delete(f"/v1/companies/{world.leaving}", headers=operator)

    assert first.status_code == again.status_code == 202
    assert again.json() == done
    assert await scalar(app, "SELECT count(*) FROM platform_events") == events
    gone = await client.get(f"/v1/companies/{world.leaving}", headers=operator)
    assert gone.status_code == 404
    write = await client.put(
        f"/v1/companies/{world.leaving}/feature-flags/{FLAG_CONTEXT_MEMORY}",
        json={"enabled": True},
        headers=operator,
    )
    assert write.status_code == 404
    assert "POST /v1/companies" in write.json()["detail"]


class _Idle:
    """An offboarder that runs nothing when the request asks it to (the process "crashed")."""

    async def run_after_answer(self, *_: Any) -> None:
        return None


async def test_an_offboarding_stopped_half_way_is_finished_by_the_worker_counting_once(
    app: FastAPI, client: httpx.AsyncClient, auth: AuthFactory, world: World
) -> None:
    tables: tuple[str, ...] = app.state.offboarder.tables
    engine = database_of(app).engine
    app.state.offboarder = _Idle()
    response = await client.delete(f"/v1/companies/{world.leaving}", headers=auth(*PLATFORM))
    assert response.status_code == 202, response.text
    offboarding = uuid.UUID(response.json()["offboarding_id"])
    done_first, rest = tables[:6], tables[6:]

    with pytest.raises(DBAPIError):  # a table that fails: the run stops there
        await Offboarder((*done_first, "no_such_table", *rest)).run(engine, offboarding)

    (record,) = await rows(
        app, "SELECT status, erased FROM company_offboardings WHERE id = :i", i=offboarding
    )
    assert record.status == "running"
    counted = {name: n for name, n in expected_counts(world).items() if name in done_first}
    assert record.erased == {"companies": 1} | counted
    left = {t.name: await rows_of(app, t, world.leaving) for t in world.tables if t.of_company}
    assert not any(left[name] for name in done_first)
    assert any(left[name] for name in rest)

    assert await Offboarder(tables).resume_step(engine) == 1

    receipt = await client.get(
        f"/v1/companies/{world.leaving}/offboarding", headers=auth(*PLATFORM)
    )
    assert receipt.json()["status"] == "done"
    assert receipt.json()["erased"] == expected_counts(world)
    assert await left_of(app, world) == {}
    assert await digest(app, world.tables, world.staying) == world.staying_before
    assert await Offboarder(tables).resume_step(engine) == 0  # nothing left to resume


async def test_only_platform_operators_offboard_and_an_unknown_company_is_a_404(
    client: httpx.AsyncClient, auth: AuthFactory
) -> None:
    await register_company(client, auth, "acme")
    for headers, status in (
        (auth("cora", "acme", ("company_operator",)), 403),
        (auth("sam", "acme", SPACE_ADMIN), 403),
        (auth("alice", "acme"), 403),
    ):
        response = await client.delete("/v1/companies/acme", headers=headers)
        assert response.status_code == status, response.text
        assert response.headers["content-type"] == "application/problem+json"
    for company, status in (("never-registered", 404), ("c" * 129, 422), ("a%00b", 422)):
        response = await client.delete(f"/v1/companies/{company}", headers=auth(*PLATFORM))
        assert response.status_code == status, (company, response.text)
        assert response.headers["content-type"] == "application/problem+json"
    receipt = await client.get("/v1/companies/acme/offboarding", headers=auth(*PLATFORM))
    assert receipt.status_code == 404
    listed = await client.get("/v1/companies/acme", headers=auth(*PLATFORM))
    assert listed.status_code == 200  # still registered: nothing was offboarded
