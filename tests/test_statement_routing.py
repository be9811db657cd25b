"""Every SQL statement the service sends filters each company table by `company_id`: a parsed
check of the whole run, beside the real proof.

The proof that the service runs on a distributed cluster is `tests/citus/`: the service on a
real Citus cluster whose sessions turn every multi-shard statement into an error. This module
checks a model of Citus's rules, not Citus: it accepted statements Citus refused (an outer join
pinned through another table's `company_id`, INSERTs inside CTEs, `now()` in `DO UPDATE SET`,
a recursive walk over a distributed table), so passing here says nothing about what Citus
plans. It is kept for what the cluster tests do not see: it reads every statement of every
suite of the run, so a statement in a part of the service no cluster test drives that filters
a company table by nothing at all still fails here.

`tests/helpers/statement_log.py` records the service's distinct statements during the whole
run; this module runs last (the plugin orders it so) and parses each one with PostgreSQL's own
parser (`tests/helpers/statement_routing.py`). It first drives a tour of the API itself (turns,
context, memory, versions, settings, chats, a worker's run with its housekeeping, export and
import, erasure, the operator's routes), so that run alone it still checks the statements of
every part of the service. A company-owned table that a statement does not pin to one company
fails the test, unless `EXEMPTIONS` names the statement with its reason.

Under pytest-xdist (`make test`) every worker is a process of its own with its own log, and this
module runs on one of them: its tests see the statements of that worker (the tour's included).
The statements of the others are checked too: each worker hands its log to the controller when
it ends, and the controller runs `RUN_WIDE_CHECKS` (the same `routing_failures`) over the merged
logs of every worker after the last test; a finding fails the run as the failed test
`tests/test_statement_routing.py::statements of every worker`, naming each statement's first
test and its worker. A check over the log that must see the whole run belongs in
`RUN_WIDE_CHECKS` too.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from fastapi import FastAPI

from app.kit.llm import ChatUsage
from app.kit.observability import Metrics
from app.models import metadata
from app.usage.recorder import BudgetWatch, UsageRecorder
from tests.helpers.apps import COMPANY, SPACE, USER, AuthFactory, app_with
from tests.helpers.db import admin_fetchval, database_of
from tests.helpers.memory import ME
from tests.helpers.portability import export_of, import_into, operator, records, seed_company
from tests.helpers.session_state import (
    RESTORED_BY_THE_DRIVER,
    TRANSACTION_LOCAL_ON_CITUS,
    session_state,
)
from tests.helpers.settings import enable_company
from tests.helpers.statement_log import (
    LOG,
    Sighting,
    StatementLog,
    WorkerLog,
    merge,
    run_wide_failures,
)
from tests.helpers.statement_routing import Finding, unrouted
from tests.helpers.turns import context, new_chat, save_turn, turn_body, user
from tests.helpers.worker import wait_for


@dataclass(frozen=True)
class Exemption:
    """Statements allowed to reach several companies: those `pattern` finds (a regular
    expression searched in the whitespace-normalised statement), for `tables` only."""

    pattern: str
    tables: frozenset[str]
    reason: str


def _exempt(pattern: str, *tables: str, reason: str) -> Exemption:
    return Exemption(pattern, frozenset(tables), reason)


EXEMPTIONS: tuple[Exemption, ...] = (
    _exempt(
        r"^SELECT companies\.company_id, companies\.display_name, companies\.origin,"
        r" companies\.created_at\s+FROM companies\s",
        "companies",
        reason="a platform operator's list of every company, a page in the order of their ids "
        "(GET /v1/companies); each company's summary then reads that company's shard only",
    ),
    _exempt(
        r"^(EXPLAIN \([A-Z, ]+\) )?WITH RECURSIVE pending_companies\(company_id\)",
        "jobs",
        "job_company_claims",
        reason="the queue's claim picks the company served least recently among all those "
        "with work waiting (fair claims, app/jobs/queue.py); on a cluster the claim of "
        "app/jobs/cluster_claim.py does, see docs/scaling.md",
    ),
    _exempt(
        r"^SELECT p\.company_id FROM \(SELECT DISTINCT j\.company_id FROM jobs j ",
        "jobs",
        "job_company_claims",
        reason="the cluster claim's company pick (app/jobs/cluster_claim.py, on Citus only): "
        "the companies with a claimable job, served least recently first, over every shard",
    ),
    _exempt(
        r"^SELECT jobs\.status, count\(\*\)|^SELECT EXTRACT\(epoch FROM now\(\) - min\(",
        "jobs",
        reason="the queue's depth and oldest wait for /metrics: a gauge of the whole instance",
    ),
    _exempt(
        r"^SELECT company_rate_limits\.company_id, company_rate_limits\.limits "
        r"FROM company_rate_limits$",
        "company_rate_limits",
        reason="every process keeps all companies' rate-limit overrides in memory and reloads "
        "them every RATE_LIMIT_REFRESH_SECONDS (one row per company with an override)",
    ),
    _exempt(
        r"^DELETE FROM idempotency_keys WHERE expires_at <= now\(\)$",
        "idempotency_keys",
        reason="housekeeping: expired idempotency records of every company, one sweep",
    ),
    _exempt(
        r"^DELETE FROM chat_messages WHERE \(company_id, id\) IN \( SELECT company_id, id "
        r"FROM chat_messages WHERE created_at < now\(\)"
        r"|^DELETE FROM turns t WHERE t\.created_at < now\(\)",
        "chat_messages",
        "turns",
        reason="housekeeping: CHAT_RETENTION_DAYS is one setting for the instance, applied to "
        "every company's history by age",
    ),
    _exempt(
        r"^SELECT company_id, user_id FROM memory_files WHERE \(company_id, user_id\) > ",
        "memory_files",
        reason="housekeeping: memory retention walks every company's memories in key order, "
        "a page at a time; each memory is then handled with its company pinned",
    ),
    _exempt(
        r"^SELECT company_id, user_id, count\(\*\) AS used FROM chat_messages GROUP BY"
        r"|^SELECT company_id, sum\(bytes\)::bigint AS used FROM \("
        r"|^DELETE FROM user_quota_marks m WHERE m\.quota = "
        r"|^DELETE FROM company_quota_marks WHERE quota = "
        r"|^INSERT INTO company_quota_marks .* FROM unnest\(",
        "chat_messages",
        "memory_versions",
        "user_quota_marks",
        "company_quota_marks",
        reason="housekeeping: the quota check counts every company's stored history and "
        "storage (grouped by company) and replaces the set of marks over a quota",
    ),
    _exempt(
        r"^UPDATE (audit_events|company_feature_flags|space_settings|company_memory_policies"
        r"|company_rate_limits) SET (actor_id|updated_by)=\$1::VARCHAR WHERE "
        r"\1\.(actor_company_id|updated_by_company_id) = ",
        "audit_events",
        "company_feature_flags",
        "space_settings",
        "company_memory_policies",
        "company_rate_limits",
        reason="erasure anonymises the erased user's edits wherever they are: an operator's "
        "are in other companies; found by the actor (indexed), rare",
    ),
)

# The checker itself: statements it must reject, with the table it must name, and their scoped
# forms, which it must pass.
UNSCOPED = [
    ("SELECT content FROM chat_messages WHERE user_id = $1", "chat_messages"),
    ("UPDATE jobs SET status = 'dead' WHERE id = $1", "jobs"),
    ("DELETE FROM memory_versions WHERE user_id = $1 AND version < $2", "memory_versions"),
    (
        "SELECT t.id, m.content FROM turns t JOIN chat_messages m ON m.turn_id = t.id"
        " WHERE t.company_id = $1",
        "chat_messages",
    ),
    (
        "INSERT INTO turns (company_id, id, user_id) SELECT company_id, turn_id, user_id"
        " FROM chat_messages WHERE user_id = $1",
        "chat_messages",
    ),
    (
        "INSERT INTO turns (company_id, id, user_id) SELECT m.company_id, m.turn_id, $2"
        " FROM chat_messages m JOIN turns t ON t.company_id = $1 AND t.id = m.turn_id",
        "turns",
    ),
    ("SELECT id FROM jobs WHERE company_id = ANY($1::varchar[])", "jobs"),
    ("SELECT id FROM jobs WHERE company_id = $1 OR user_id = $2", "jobs"),
    (
        "SELECT t.id FROM turns t WHERE t.company_id = $1 AND EXISTS"
        " (SELECT 1 FROM chat_messages m WHERE m.turn_id = t.id)",
        "chat_messages",
    ),
    (
        "SELECT * FROM turns t, LATERAL (SELECT content FROM chat_messages m"
        " WHERE m.turn_id = t.id LIMIT 1) last WHERE t.company_id = $1",
        "chat_messages",
    ),
    (
        "WITH mine AS (SELECT company_id, id FROM turns WHERE user_id = $1)"
        " SELECT m.content FROM chat_messages m JOIN mine ON m.company_id = mine.company_id",
        "turns",
    ),
    (
        "SELECT f.id FROM folders f LEFT JOIN folder_acl a ON f.company_id = $1"
        " AND a.company_id = f.company_id AND a.folder_id = f.id",
        "folders",
    ),
    (
        "UPDATE jobs j SET run_after = now() FROM (VALUES ($1, $2), ($3, $4)) AS v(company_id, id)"
        " WHERE j.company_id = v.company_id AND j.id = v.id",
        "jobs",
    ),
    ("INSERT INTO user_settings (user_id, context_memory) VALUES ($1, $2)", "user_settings"),
    ("TRUNCATE chat_messages", "chat_messages"),
    ("EXPLAIN ANALYZE SELECT id FROM jobs WHERE status = 'queued'", "jobs"),
]

SCOPED = [
    "SELECT content FROM chat_messages WHERE company_id = $1 AND user_id = $2",
    "SELECT m.content FROM chat_messages m WHERE m.company_id = $1::VARCHAR AND m.user_id = $2",
    "UPDATE jobs SET status = 'dead' WHERE jobs.company_id = $1 AND jobs.id = $2",
    "DELETE FROM memory_versions WHERE (company_id, user_id) = ($1, $2) AND version < $3",
    "SELECT t.id, m.content FROM turns t JOIN chat_messages m"
    " ON m.company_id = t.company_id AND m.turn_id = t.id WHERE t.company_id = $1",
    "SELECT t.id FROM turns t LEFT JOIN chat_messages m"
    " ON m.company_id = t.company_id AND m.turn_id = t.id WHERE t.company_id = $1",
    "INSERT INTO turns (company_id, id, user_id) SELECT m.company_id, m.turn_id, m.user_id"
    " FROM chat_messages m WHERE m.company_id = $1 AND m.user_id = $2",
    "INSERT INTO turns (company_id, id, user_id) VALUES ($1::VARCHAR, $2, $3) ON CONFLICT DO"
    " NOTHING RETURNING id",
    "SELECT t.id FROM turns t WHERE t.company_id = $1 AND EXISTS"
    " (SELECT 1 FROM chat_messages m WHERE m.company_id = t.company_id AND m.turn_id = t.id)",
    "SELECT * FROM turns t, LATERAL (SELECT content FROM chat_messages m"
    " WHERE m.company_id = t.company_id AND m.turn_id = t.id LIMIT 1) last"
    " WHERE t.company_id = $1",
    "WITH mine AS (SELECT company_id, id FROM turns WHERE company_id = $1 AND user_id = $2)"
    " SELECT m.content FROM chat_messages m JOIN mine ON m.company_id = mine.company_id",
    "WITH RECURSIVE chain AS (SELECT id, parent_id FROM folders WHERE company_id = $1 AND id = $2"
    " UNION ALL SELECT f.id, f.parent_id FROM folders f JOIN chain c ON f.id = c.parent_id"
    " WHERE f.company_id = $1) SELECT id FROM chain",
    "SELECT id FROM jobs WHERE company_id = $1 FOR UPDATE SKIP LOCKED",
    "EXPLAIN (ANALYZE, BUFFERS) SELECT id FROM jobs WHERE company_id = $1",
    "SELECT pg_try_advisory_xact_lock(hashtextextended($1, 0))",
    "SELECT version_num FROM alembic_version LIMIT 1",
    "BEGIN",
]

COMPANY_TABLES = frozenset(
    table.name for table in metadata.sorted_tables if "company_id" in table.columns
)


@pytest.mark.parametrize(("sql", "table"), UNSCOPED)
def test_the_checker_names_the_unscoped_table(sql: str, table: str) -> None:
    assert table in {finding.table for finding in unrouted(sql, COMPANY_TABLES)}


@pytest.mark.parametrize("sql", SCOPED)
def test_the_checker_passes_scoped_statements(sql: str) -> None:
    assert unrouted(sql, COMPANY_TABLES) == []


def test_an_exemption_covers_only_its_statement_and_tables() -> None:
    claim_like = "WITH RECURSIVE pending_companies(company_id) AS (SELECT 1) SELECT 1 FROM jobs"
    other = "SELECT id FROM jobs WHERE user_id = $1"
    assert _exemption_of(claim_like, Finding("jobs", "")) is not None
    assert _exemption_of(claim_like, Finding("chat_messages", "")) is None
    assert _exemption_of(other, Finding("jobs", "")) is None


def test_the_run_wide_check_fails_on_an_unscoped_statement_of_any_worker() -> None:
    """What the controller does under pytest-xdist: the workers' logs merged, then checked."""
    scoped = "SELECT content FROM chat_messages WHERE company_id = $1 AND user_id = $2"
    unscoped = "SELECT content FROM chat_messages WHERE user_id = $1"
    logs = [
        WorkerLog("gw0", True, [(scoped, 3, "tests/a.py::test_one")]),
        WorkerLog(
            "gw1", False, [(scoped, 1, "tests/b.py::test_two"), (unscoped, 2, "tests/b.py::t")]
        ),
    ]
    merged = merge(logs)
    assert merged[scoped] == Sighting(4, "tests/a.py::test_one [gw0]")

    [failure] = run_wide_failures(merged)
    assert "chat_messages" in failure
    assert "first sent in tests/b.py::t [gw1] (2 time(s))" in failure
    assert run_wide_failures(merge(logs[:1])) == []


async def test_every_statement_of_the_service_is_routable_by_company(
    app: FastAPI,
    client: httpx.AsyncClient,
    auth: AuthFactory,
    database_url: str,
    tmp_path: Path,
) -> None:
    await _tour(app, client, auth, database_url, tmp_path)
    company_tables = frozenset(
        await admin_fetchval(
            database_url,
            "SELECT array_agg(table_name::text) FROM information_schema.columns"
            " WHERE table_schema = 'public' AND column_name = 'company_id'",
        )
    )
    assert company_tables == COMPANY_TABLES  # the migrated schema is the models'

    failures = routing_failures(LOG.sightings, company_tables)
    touched = {
        table
        for statement in LOG.sightings
        for table in company_tables
        if re.search(rf"\b{table}\b", statement)
    }
    assert not failures, (
        f"{len(failures)} statement(s) of {len(LOG.sightings)} cannot be routed by company_id"
        " (scope them, or add an exemption with its reason):\n\n" + "\n\n".join(failures)
    )
    # the capture saw the service: the tour alone reaches every company-owned table
    assert touched == company_tables, sorted(company_tables - touched)


def routing_failures(
    sightings: Mapping[str, Sighting], company_tables: frozenset[str] = COMPANY_TABLES
) -> list[str]:
    """One report per statement and company-owned table it does not pin (and per statement
    the parser refuses), unless an exemption covers it."""
    failures: list[str] = []
    for statement, sighting in sightings.items():
        try:
            findings = unrouted(statement, company_tables)
        except Exception as error:
            failures.append(_report(statement, sighting, f"not parsed: {error}"))
            continue
        failures += [
            _report(statement, sighting, f"{finding.table}: {finding.reason}")
            for finding in findings
            if _exemption_of(statement, finding) is None
        ]
    return failures


def session_state_failures(sightings: Mapping[str, Sighting]) -> list[str]:
    """One report per statement that leaves state on its session (`session_state`), and per
    statement the parser refuses. `DriverPool` skips asyncpg's session reset on the rule that
    the hot path leaves none; the log does not say which pool sent a statement, so this holds
    every statement of the service to it (the engine's pool only rolls a connection back too).
    """
    failures: list[str] = []
    for statement, sighting in sightings.items():
        if statement in RESTORED_BY_THE_DRIVER or statement in TRANSACTION_LOCAL_ON_CITUS:
            continue
        try:
            found = session_state(statement)
        except Exception as error:
            failures.append(_report(statement, sighting, f"not parsed: {error}"))
            continue
        failures += [_report(statement, sighting, f"leaves {what}") for what in found]
    return failures


def test_the_session_check_catches_a_recorded_set_search_path() -> None:
    log = StatementLog()
    log.current_test = "tests/turns/test_x.py::test_y"
    log.record("SELECT id FROM jobs WHERE company_id = $1")
    log.record("SET  search_path TO other, public")
    [failure] = session_state_failures(log.sightings)
    assert "leaves a setting (SET/RESET): search_path" in failure
    assert "first sent in tests/turns/test_x.py::test_y" in failure
    assert "SET search_path TO other, public" in failure


async def test_no_statement_sent_through_the_driver_pool_leaves_session_state(
    app: FastAPI, client: httpx.AsyncClient, auth: AuthFactory
) -> None:
    """The driver pool's statements while both hot routes serve their variants (memory on, a
    job queued, history loaded, a keyed turn and its replay), seen by a query logger on the
    pool itself; then every statement of the service this process recorded."""
    sent = StatementLog()
    sent.current_test = "the requests below"
    driver = database_of(app).driver

    def record(query: Any) -> None:
        sent.record(str(query.query))

    driver.add_query_logger(record)
    try:
        await _hot_path(client, auth)
    finally:
        driver.remove_query_logger(record)
    assert "BEGIN;" in sent.sightings, sorted(sent.sightings)  # the keyed turn's transaction
    assert len(sent.sightings) >= 5, sorted(sent.sightings)
    failures = session_state_failures(sent.sightings)
    assert not failures, "sent through the driver pool:\n\n" + "\n\n".join(failures)
    failures = session_state_failures(LOG.sightings)
    assert not failures, "sent by the service:\n\n" + "\n\n".join(failures)


async def _hot_path(client: httpx.AsyncClient, auth: AuthFactory) -> None:
    await enable_company(client, auth)
    chat = new_chat()
    await context(client, auth, chat, [user("Where do I work?")])
    await save_turn(client, auth, chat, [user("I work in Basel.")], "Noted.")
    keyed = auth() | {"Idempotency-Key": "session-state-1"}
    for _ in range(2):  # the second is a replay
        response = await client.post(
            f"/v1/chats/{chat}/turns",
            json=turn_body([user("I like tea.")], "Noted."),
            headers=keyed,
        )
        assert response.status_code in (201, 202), response.text
    await context(client, auth, chat, [user("What do I like?")], debug=True)


# What the controller runs over every worker's statements under pytest-xdist (module docstring)
RUN_WIDE_CHECKS: tuple[Callable[[Mapping[str, Sighting]], list[str]], ...] = (
    routing_failures,
    session_state_failures,
)


def _exemption_of(statement: str, finding: Finding) -> Exemption | None:
    for exemption in EXEMPTIONS:
        if finding.table in exemption.tables and re.search(exemption.pattern, statement):
            return exemption
    return None


def _report(statement: str, sighting: Sighting, problem: str) -> str:
    return (
        f"- {problem}\n  first sent in {sighting.first_test} ({sighting.count} time(s))\n"
        f"  {statement}"
    )


async def _tour(
    app: FastAPI,
    client: httpx.AsyncClient,
    auth: AuthFactory,
    database_url: str,
    tmp_path: Path,
) -> None:
    """What a company, its users and the operator do: every part of the service runs its
    statements at least once."""
    await seed_company(app, client, auth, COMPANY, "Routing")
    alice = auth(USER, COMPANY)
    chat = new_chat()
    await context(client, auth, chat, [user("What do I do?")])
    keyed = await client.post(
        f"/v1/chats/{chat}/turns",
        json={
            "space_id": SPACE,
            "messages": [user("I moved to Basel.")],
            "response": {"role": "assistant", "content": "Noted."},
        },
        headers=alice | {"Idempotency-Key": "routing-tour-1"},
    )
    assert keyed.status_code in (201, 202), keyed.text
    await save_turn(client, auth, chat, [user("I like tea.")], "Noted.")
    for path in (
        ME,
        f"{ME}/versions",
        f"{ME}/versions/2",
        f"{ME}/versions/2/diff",
        f"{ME}/policy-actions",
        f"{ME}/export",
        f"{ME}/enablement?space_id={SPACE}",
        "/v1/me/settings",
        f"/v1/chats/{chat}/messages",
    ):
        response = await client.get(path, headers=alice)
        assert response.status_code == 200, (path, response.text)

    company = f"/v1/companies/{COMPANY}"
    today = datetime.now(UTC).date()
    budget = await client.put(
        f"{company}/model-budget",
        json={"monthly_tokens": 1, "when_spent": "defer"},
        headers=operator(auth),
    )
    assert budget.status_code == 200, budget.text
    limits = await client.put(
        f"{company}/rate-limits",
        json={"turns": {"user": {"quota": 100, "window_seconds": 10}}},
        headers=operator(auth),
    )
    assert limits.status_code == 200, limits.text
    for path in (
        "feature-flags",
        "memory-policy",
        "audit-events",
        "rate-limits",
        "folders/user-memory",
        "jobs",
        f"usage?from={today - timedelta(days=30)}&to={today}",
        "model-budget",
    ):
        response = await client.get(f"{company}/{path}", headers=operator(auth))
        assert response.status_code == 200, (path, response.text)
    assert (await client.get("/metrics")).status_code == 200

    async with app_with(
        database_url,
        worker_enabled=True,
        worker_poll_seconds=0.05,
        worker_heartbeat_file=tmp_path / "heartbeat",
        chat_retention_days=30,
        quota_user_history_messages=1,
        quota_company_storage_bytes=1,
    ):

        async def worked() -> bool:
            pending = await admin_fetchval(
                database_url,
                "SELECT count(*) FROM jobs WHERE status IN ('queued', 'retrying', 'running')",
            )
            marks = await admin_fetchval(database_url, "SELECT count(*) FROM company_quota_marks")
            return bool(pending == 0 and marks > 0)

        await wait_for(worked, seconds=30)
    await app.state.usage_meter.flush()
    # what the worker records of a model call, past the company's budget of one token
    database = database_of(app)
    await UsageRecorder(database).model_call(
        COMPANY, today, "operations", ChatUsage("gpt-4o-mini", 50, 5)
    )
    assert await BudgetWatch(database, Metrics()).check(COMPANY, today) is not None

    header, *lines = records(await export_of(client, auth, COMPANY))
    copy = [header | {"company_id": "routing-copy"}, *lines]
    imported = await import_into(client, auth, "routing-copy", _ndjson(copy))
    assert imported.status_code == 201, imported.text
    assert (await client.delete(f"/v1/chats/{chat}", headers=alice)).status_code == 204
    assert (await client.delete("/v1/me", headers=alice)).status_code == 200


def _ndjson(lines: list[dict[str, Any]]) -> bytes:
    return b"".join(orjson.dumps(line) + b"\n" for line in lines)
