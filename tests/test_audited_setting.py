"""The one way to change a company setting (`app.kit.audited_setting`), on tables of its own:
the changed fields old -> new in one audit event, nothing for no change, concurrent saves one
after the other (first saves included), the editor forgotten on erasure, and every audited
setting of the service in the erasure's list."""

from __future__ import annotations

import asyncio
import importlib
import pkgutil
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, replace
from typing import Any

import pytest
from fastapi import FastAPI
from sqlalchemy import Column, DateTime, Identity, Integer, MetaData, String, Table, Text, func
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.schema import CreateTable

import app as app_package
from app.erasure.service import AUDITED_SETTINGS
from app.kit.audited_setting import (
    Actor,
    AuditedSetting,
    AuditLog,
    Saved,
    SettingTable,
    changed_fields,
)
from app.kit.errors import SettingChanged, Unprocessable
from tests.helpers.db import (
    admin_execute,
    backend_pid,
    database_of,
    rows,
    sessions,
    sessions_blocked_by,
)
from tests.helpers.polling import wait_until

ALICE = Actor("acme", "alice")
OLGA = Actor("platform", "olga")

probe_metadata = MetaData()  # not the service's: the suite's table cleaning leaves these alone
PROBES = Table(
    "audited_setting_probes",
    probe_metadata,
    Column("company_id", String(128), primary_key=True),
    Column("name", String(64), primary_key=True),
    Column("amount", Integer, nullable=False),
    Column("label", Text, nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("updated_by_company_id", String(128), nullable=False),
    Column("updated_by", String(256), nullable=False),
)
QUIET_PROBES = Table(  # a setting whose row names no editor (as the model budget's)
    "audited_setting_quiet_probes",
    probe_metadata,
    Column("company_id", String(128), primary_key=True),
    Column("amount", Integer, nullable=False),
    Column("label", Text, nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
)
EVENTS = Table(
    "audited_setting_probe_events",
    probe_metadata,
    Column("company_id", String(128), primary_key=True),
    Column("id", Integer, Identity(always=True), primary_key=True),
    Column("occurred_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("actor_company_id", String(128), nullable=False),
    Column("actor_id", String(256), nullable=False),
    Column("action", String(64), nullable=False),
    Column("target_kind", String(32), nullable=False),
    Column("target_id", String(256), nullable=False),
    Column("old", JSONB),
    Column("new", JSONB),
)

TABLES = (PROBES, QUIET_PROBES, EVENTS)


@dataclass(frozen=True)
class Quota:
    amount: int = 0
    label: str = "none"


def _columns(quota: Quota) -> dict[str, object]:
    return {"amount": quota.amount, "label": quota.label}


def _quota(row: Any) -> Quota:
    return Quota(row["amount"], row["label"])


LOG = AuditLog(EVENTS)
QUOTAS = SettingTable[Quota](
    PROBES, key=("name",), columns=("amount", "label"), to_row=_columns, of_row=_quota
)
QUIET_QUOTAS = SettingTable[Quota](
    QUIET_PROBES, columns=("amount", "label"), to_row=_columns, of_row=_quota, editor=None
)


def audited(table: SettingTable[Quota]) -> AuditedSetting[Quota]:
    return AuditedSetting(
        table,
        LOG,
        action="quota.set",
        target_kind="quota",
        default=Quota(),
        audited=_columns,
    )


QUOTA, QUIET_QUOTA = audited(QUOTAS), audited(QUIET_QUOTAS)


@pytest.fixture(autouse=True)
async def _probe_tables(app: FastAPI, database_url: str) -> AsyncIterator[None]:
    tables = ", ".join(table.name for table in TABLES)
    await admin_execute(database_url, f"DROP TABLE IF EXISTS {tables}")
    dialect = database_of(app).engine.dialect
    created = (str(CreateTable(table).compile(dialect=dialect)) for table in TABLES)
    await admin_execute(database_url, *created)
    yield
    await admin_execute(database_url, f"DROP TABLE {tables}")


async def save(
    app: FastAPI,
    change: Callable[[Quota], Quota],
    *,
    editor: Actor = ALICE,
    company: str = "acme",
    name: str = "q",
    setting: AuditedSetting[Quota] = QUOTA,
) -> Saved[Quota]:
    key = (name,) if setting is QUOTA else ()
    async with sessions(app)() as session, session.begin():
        return await setting.save(session, editor, company, *key, change=change)


def to(quota: Quota) -> Callable[[Quota], Quota]:
    return lambda _: quota


async def stored(app: FastAPI) -> list[tuple[Any, ...]]:
    sql = (
        "SELECT company_id, name, amount, label, updated_by_company_id, updated_by"
        " FROM audited_setting_probes ORDER BY company_id, name"
    )
    return [tuple(row) for row in await rows(app, sql)]


async def events(app: FastAPI) -> list[tuple[Any, ...]]:
    sql = (
        "SELECT company_id, actor_company_id, actor_id, action, target_kind, target_id, old, new"
        " FROM audited_setting_probe_events ORDER BY id"
    )
    return [tuple(row) for row in await rows(app, sql)]


def test_only_the_changed_fields_are_kept_nested_ones_included() -> None:
    assert changed_fields({"a": 1, "b": {"c": 2, "d": 3}}, {"a": 1, "b": {"c": 2, "d": 4}}) == (
        {"b": {"d": 3}},
        {"b": {"d": 4}},
    )
    assert changed_fields({"a": 1, "b": {"c": 2}}, {"a": 1, "b": {"c": 2}}) == ({}, {})
    assert changed_fields({"a": None}, {"a": 0}) == ({"a": None}, {"a": 0})


async def test_a_first_save_stores_the_value_and_records_the_fields_it_changed(
    app: FastAPI,
) -> None:
    saved = await save(app, to(Quota(5, "none")))

    assert saved.changed
    assert saved.stored is not None
    assert (saved.stored.value, saved.stored.updated_by_company_id, saved.stored.updated_by) == (
        Quota(5, "none"),
        "acme",
        "alice",
    )
    assert await stored(app) == [("acme", "q", 5, "none", "acme", "alice")]
    assert await events(app) == [
        ("acme", "acme", "alice", "quota.set", "quota", "q", {"amount": 0}, {"amount": 5})
    ]


async def test_a_later_save_diffs_against_the_stored_value_and_names_its_editor(
    app: FastAPI,
) -> None:
    await save(app, to(Quota(5, "small")))
    saved = await save(app, lambda quota: replace(quota, label="large"), editor=OLGA)

    assert saved.stored is not None
    assert saved.stored.value == Quota(5, "large")
    assert await stored(app) == [("acme", "q", 5, "large", "platform", "olga")]
    assert (await events(app))[1] == (
        "acme",
        "platform",
        "olga",
        "quota.set",
        "quota",
        "q",
        {"label": "small"},
        {"label": "large"},
    )


async def test_a_save_that_changes_nothing_writes_and_records_nothing(app: FastAPI) -> None:
    unsaved = await save(app, to(Quota()))
    assert (unsaved.stored, unsaved.changed) == (None, False)

    first = await save(app, to(Quota(3, "x")))
    again = await save(app, to(Quota(3, "x")), editor=OLGA)

    assert not again.changed
    assert again.stored == first.stored  # who saved it last is still alice
    assert await stored(app) == [("acme", "q", 3, "x", "acme", "alice")]
    assert len(await events(app)) == 1


async def test_a_change_that_refuses_writes_nothing(app: FastAPI) -> None:
    def refuse(_: Quota) -> Quota:
        raise Unprocessable("no")

    with pytest.raises(Unprocessable):
        await save(app, refuse)

    assert await stored(app) == []
    assert await events(app) == []


async def test_a_save_whose_insert_finds_a_row_each_round_is_a_retryable_conflict(
    app: FastAPI, database_url: str
) -> None:
    """As when a concurrent first save won and its row went again: two rounds, then the
    setting's `lost_race`, nothing recorded."""
    await admin_execute(
        database_url,
        "CREATE FUNCTION audited_setting_skip() RETURNS trigger LANGUAGE plpgsql"
        " AS $$ BEGIN RETURN NULL; END $$",
        "CREATE TRIGGER audited_setting_skip BEFORE INSERT ON audited_setting_probes"
        " FOR EACH ROW EXECUTE FUNCTION audited_setting_skip()",
    )
    try:
        with pytest.raises(SettingChanged):
            await save(app, to(Quota(1, "a")))
    finally:
        await admin_execute(
            database_url,
            "DROP TRIGGER audited_setting_skip ON audited_setting_probes",
            "DROP FUNCTION audited_setting_skip()",
        )

    assert await events(app) == []


async def test_settings_are_kept_per_company_and_key(app: FastAPI) -> None:
    await save(app, to(Quota(1, "a")))
    await save(app, to(Quota(2, "b")), name="r")
    await save(app, to(Quota(3, "c")), company="globex")

    assert [row[:4] for row in await stored(app)] == [
        ("acme", "q", 1, "a"),
        ("acme", "r", 2, "b"),
        ("globex", "q", 3, "c"),
    ]
    assert [(event[0], event[5]) for event in await events(app)] == [
        ("acme", "q"),
        ("acme", "r"),
        ("globex", "q"),
    ]


@pytest.mark.parametrize("saved_before", [False, True], ids=["first saves", "later saves"])
async def test_concurrent_saves_apply_one_after_the_other_and_none_is_lost(
    app: FastAPI, saved_before: bool
) -> None:
    if saved_before:
        await save(app, to(Quota(0, "start")))

    def add_one(quota: Quota) -> Quota:
        return replace(quota, amount=quota.amount + 1)

    results = await asyncio.gather(*(save(app, add_one) for _ in range(5)))

    assert sorted(r.stored.value.amount for r in results if r.stored is not None) == [1, 2, 3, 4, 5]
    assert [row[2] for row in await stored(app)] == [5]
    steps = [(event[6]["amount"], event[7]["amount"]) for event in (await events(app))[-5:]]
    assert steps == [(0, 1), (1, 2), (2, 3), (3, 4), (4, 5)]


@pytest.mark.parametrize("saved_before", [False, True], ids=["first save", "later save"])
async def test_a_save_waits_for_the_lock_of_a_concurrent_one_and_applies_over_it(
    app: FastAPI, database_url: str, saved_before: bool
) -> None:
    """While one transaction's save is uncommitted, another save of the same setting waits
    for it, then applies its change to what the first one left (and diffs against it)."""
    if saved_before:
        await save(app, to(Quota(1, "start")))
    async with sessions(app)() as first, first.begin():
        await QUOTA.save(first, OLGA, "acme", "q", change=to(Quota(10, "olga")))
        second = asyncio.create_task(save(app, lambda quota: replace(quota, label="alice")))
        pid = await backend_pid(first)

        async def second_waits() -> bool:
            return second.done() or await sessions_blocked_by(database_url, pid) > 0

        await wait_until(second_waits, 10, what="the second save waiting for the lock")
        assert not second.done()

    saved = await second
    assert saved.stored is not None
    assert saved.stored.value == Quota(10, "alice")
    assert (await events(app))[-1][2:] == (
        "alice",
        "quota.set",
        "quota",
        "q",
        {"label": "olga"},
        {"label": "alice"},
    )


async def test_an_erasure_forgets_the_editor_in_rows_and_events_of_every_company(
    app: FastAPI,
) -> None:
    await save(app, to(Quota(1, "a")))
    await save(app, to(Quota(2, "b")), company="globex")  # alice of acme, as an operator
    await save(app, to(Quota(3, "c")), editor=Actor("globex", "alice"), name="r")  # another alice
    await save(app, to(Quota(4, "d")), editor=OLGA, name="s")

    async with sessions(app)() as session, session.begin():
        rows_changed = await QUOTAS.anonymise_editor(session, ALICE, "erased-user")
        events_changed = await LOG.anonymise_actor(
            session, ALICE, "erased-user", sparing="quota.kept"
        )

    assert (rows_changed, events_changed) == (2, 2)
    assert [row[1:] for row in await stored(app)] == [
        ("q", 1, "a", "acme", "erased-user"),
        ("r", 3, "c", "globex", "alice"),
        ("s", 4, "d", "platform", "olga"),
        ("q", 2, "b", "acme", "erased-user"),
    ]
    assert [(event[0], event[1], event[2]) for event in await events(app)] == [
        ("acme", "acme", "erased-user"),
        ("globex", "acme", "erased-user"),
        ("acme", "globex", "alice"),
        ("acme", "platform", "olga"),
    ]


async def test_events_of_the_spared_action_keep_their_actor(app: FastAPI) -> None:
    await save(app, to(Quota(1, "a")))
    async with sessions(app)() as session, session.begin():
        assert await LOG.anonymise_actor(session, ALICE, "erased-user", sparing="quota.set") == 0
    assert (await events(app))[0][2] == "alice"


async def test_a_setting_whose_row_names_no_editor_is_audited_all_the_same(app: FastAPI) -> None:
    saved = await save(app, to(Quota(7, "none")), setting=QUIET_QUOTA)

    assert saved.stored is not None
    assert (saved.stored.updated_by_company_id, saved.stored.updated_by) == (None, None)
    assert await events(app) == [
        ("acme", "acme", "alice", "quota.set", "quota", "acme", {"amount": 0}, {"amount": 7})
    ]
    async with sessions(app)() as session, session.begin():
        assert await QUIET_QUOTAS.anonymise_editor(session, ALICE, "erased-user") == 0
        again = await QUIET_QUOTAS.select(session, "acme")
    assert again is not None
    assert again.value == Quota(7, "none")


def test_every_audited_setting_of_the_service_is_in_the_erasures_list() -> None:
    """A new setting's table that the erasure does not know would keep an erased user's id."""
    found: set[str] = set()
    for module in pkgutil.walk_packages(app_package.__path__, "app."):
        if module.name.endswith("__main__"):
            continue
        for value in vars(importlib.import_module(module.name)).values():
            if isinstance(value, SettingTable):
                found.add(value.table.name)
    assert found == {table.table.name for table in AUDITED_SETTINGS}
    assert len(found) == 5
