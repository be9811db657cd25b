"""The company functions on the cluster (`app.kit.citus.on_company_node`): every hot statement
of the request path has one, distributed by its company argument in the company tables'
co-location group, and Citus sends a call of each whole to the node holding the company's
shards (one task). The distribution step creates a function once and drops those of
statements that are gone."""

from __future__ import annotations

import asyncpg
import pytest
from sqlalchemy import make_url

from app.enablement.repository import enablement_params
from app.kit.citus import CompanyStatement, company_statements, distribute
from app.kit.db.driver_pool import positional
from app.models import metadata
from app.turns import repository
from tests.helpers.apps import COMPANY, USER

pytestmark = pytest.mark.slow

_DISTRIBUTED = (
    "SELECT p.proname::text, d.distribution_argument_index, d.force_delegation,"
    " d.colocationid = (SELECT colocationid FROM pg_dist_partition"
    "                   WHERE logicalrelid = 'turns'::regclass) AS colocated"
    " FROM pg_dist_object d JOIN pg_proc p ON p.oid = d.objid"
    " WHERE d.classid = 'pg_proc'::regclass AND p.proname LIKE 'cms_company_%'"
)


async def _connect(url: str) -> asyncpg.Connection:
    return await asyncpg.connect(str(make_url(url).set(drivername="postgresql")))


async def test_every_hot_statement_runs_as_one_task_on_the_companys_node(
    admin_url: str, database_url: str
) -> None:
    statements = {statement.function: statement for statement in company_statements()}
    labels = {statement.label for statement in statements.values()}
    assert {"context", "turn_settings", "common_turn_save", "common_turns_save"} <= labels
    assert {"turn_write_new", "lock_user_history"} <= labels
    admin = await _connect(admin_url)
    try:
        rows = await admin.fetch(_DISTRIBUTED)
        node = await admin.fetchval(
            "SELECT nodeport FROM pg_dist_shard_placement"
            " WHERE shardid = get_shard_id_for_distribution_column('turns', $1::varchar)",
            COMPANY,
        )
    finally:
        await admin.close()
    found = {row["proname"]: row for row in rows}
    assert set(found) == set(statements), "exactly the registered statements' functions"
    for name, statement in statements.items():
        row = found[name]
        assert row["colocated"], f"{name}: co-located with the company tables"
        assert row["distribution_argument_index"] == statement.arguments.index("company_id")
        assert row["force_delegation"] == statement.in_transactions, name
    service = await _connect(database_url)  # as the service's role: one shard or an error
    try:
        for name, statement in statements.items():
            arguments = ", ".join(
                "$1::varchar" if argument == "company_id" else "NULL"
                for argument in statement.arguments
            )
            plan = "\n".join(
                row[0]
                for row in await service.fetch(
                    f"EXPLAIN SELECT * FROM {name}({arguments})",  # noqa: S608 - our names
                    COMPANY,
                )
            )
            assert "Task Count: 1" in plan, f"{name}:\n{plan}"
            assert f"port={node}" in plan, f"{name} not sent to the company's node:\n{plan}"
            assert f"Function Scan on {name}" in plan, plan
    finally:
        await service.close()


async def test_distribute_creates_a_function_once_and_drops_a_stale_one(admin_url: str) -> None:
    probe = CompanyStatement(
        "probe_turns",
        *positional("SELECT count(*) AS turns FROM turns WHERE company_id = :company_id"),
    )
    every = [*company_statements(), probe]
    assert (await distribute(admin_url, metadata, every)).functions == [probe.function]
    assert (await distribute(admin_url, metadata, every)).functions == []
    admin = await _connect(admin_url)
    try:
        counted = await admin.fetchval(f"SELECT turns FROM {probe.function}($1)", COMPANY)  # noqa: S608
        assert counted == 0
        assert (await distribute(admin_url, metadata)).functions == []  # the probe is gone
        gone = await admin.fetchval(
            "SELECT count(*) FROM pg_proc WHERE proname = $1", probe.function
        )
        assert gone == 0
    finally:
        await admin.close()


async def test_a_call_citus_does_not_delegate_runs_the_statement_through_citus(
    admin_url: str,
) -> None:
    """Inside a transaction block Citus runs a company function where it is called (the
    coordinator here, which holds no shard): the function then runs its statement as it is,
    through Citus, and answers what the statement answers."""
    sql, names = repository._CONTEXT_WITH_HISTORY
    call, call_names = repository._CONTEXT_WITH_HISTORY_CALL
    assert call_names == names
    params = enablement_params(COMPANY, USER, "default") | {"chat_id": "c", "history_limit": 20}
    arguments = [params[name] for name in names]
    admin = await _connect(admin_url)
    try:
        async with admin.transaction():
            await admin.execute(
                "INSERT INTO chat_messages (company_id, user_id, chat_id, turn_id, role, content,"
                " source) VALUES ($1, $2, 'c', gen_random_uuid(), 'user', 'hello', 'request')",
                COMPANY,
                USER,
            )
            plan = "\n".join(r[0] for r in await admin.fetch(f"EXPLAIN {call}", *arguments))
            assert "Task Count" not in plan, f"delegated inside a transaction block:\n{plan}"
            through_function = dict(await admin.fetchrow(call, *arguments))
            assert dict(await admin.fetchrow(sql, *arguments)) == through_function
            assert through_function["history_contents"] == ["hello"]
            raise _RollBack
    except _RollBack:
        pass
    finally:
        await admin.close()


class _RollBack(Exception):
    """Leaves the test's transaction without a trace."""
