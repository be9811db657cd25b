"""The schema on the cluster: `python -m app migrate` distributes every company table by
`company_id` in one co-location group and makes the other tables reference tables; running it
again changes nothing; on plain PostgreSQL (and the embedded default) it is a no-op."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import asyncpg
import pytest
from sqlalchemy import BigInteger, Column, MetaData, String, Table, make_url

from app.kit.citus import VERSION_TABLE, company_tables, distribute
from app.kit.config import PROJECT_ROOT
from app.models import metadata
from tests.helpers.citus import CitusCluster
from tests.helpers.db import admin_execute, admin_fetchval, scratch_database

SCRATCH = "cms_citus_migrate"


def _run_app(*args: str, database_url: str | None, cwd: Path) -> str:
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "PYTHONPATH": str(PROJECT_ROOT),
        "ENVIRONMENT": "test",
        "JWT_SECRET": "x" * 40,
        "LOG_LEVEL": "WARNING",
    }
    if database_url is not None:
        env["DATABASE_URL"] = database_url
    done = subprocess.run(
        [sys.executable, "-m", "app", *args],
        cwd=cwd,  # no .env of the project is read
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert done.returncode == 0, f"{args} exited {done.returncode}:\n{done.stdout}{done.stderr}"
    return done.stdout


async def _placement(url: str) -> dict[str, tuple[str, str | None, int]]:
    """Each Citus table: (its method, its distribution column, its co-location group)."""
    conn = await asyncpg.connect(str(make_url(url).set(drivername="postgresql")))
    try:
        rows = await conn.fetch(
            "SELECT logicalrelid::regclass::text AS name, partmethod::text,"
            " column_to_column_name(logicalrelid, partkey) AS column, colocationid"
            " FROM pg_dist_partition"
        )
    finally:
        await conn.close()
    return {r["name"]: (r["partmethod"], r["column"], r["colocationid"]) for r in rows}


def _expect_distributed(placement: dict[str, tuple[str, str | None, int]]) -> None:
    companies = {table.name for table in company_tables(metadata)}
    assert len(companies) >= 22
    others = {t.name for t in metadata.sorted_tables} - companies | {VERSION_TABLE}
    distributed = {name for name, (method, _, _) in placement.items() if method == "h"}
    assert distributed == companies, "every company table distributed, and only those"
    assert {placement[name][1] for name in companies} == {"company_id"}
    assert len({placement[name][2] for name in companies}) == 1, "one co-location group"
    reference = {name for name, (method, _, _) in placement.items() if method == "n"}
    assert reference == others


@pytest.mark.slow
async def test_migrate_distributes_every_company_table_and_is_idempotent(
    cluster: CitusCluster, admin_url: str, tmp_path: Path
) -> None:
    # the session's database was distributed the way the fixture does it
    _expect_distributed(await _placement(admin_url))

    await cluster.create_database(SCRATCH)
    url = cluster.url(SCRATCH)
    try:
        first = await asyncio.to_thread(_run_app, "migrate", database_url=url, cwd=tmp_path)
        assert "migrated DATABASE_URL to head" in first
        assert f"citus: {len(company_tables(metadata))} table(s) distributed by company_id" in (
            first
        )
        placement = await _placement(url)
        _expect_distributed(placement)

        again = await asyncio.to_thread(_run_app, "migrate", database_url=url, cwd=tmp_path)
        assert "citus: 0 table(s) distributed by company_id, 0 made reference tables" in again
        alone = await asyncio.to_thread(_run_app, "distribute", database_url=url, cwd=tmp_path)
        assert "(all were already)" in alone
        assert await _placement(url) == placement

        # a company table added later (by a migration) is distributed by the next run
        await admin_execute(
            url,
            "CREATE TABLE later_things (company_id varchar(128) NOT NULL, id bigint NOT NULL,"
            " PRIMARY KEY (company_id, id))",
        )
        later = MetaData()
        for existing in metadata.sorted_tables:
            existing.to_metadata(later)
        Table(
            "later_things",
            later,
            Column("company_id", String(128), primary_key=True),
            Column("id", BigInteger, primary_key=True),
        )
        outcome = await distribute(url, later)
        assert outcome.distributed == ["later_things"]
        after = await _placement(url)
        assert after["later_things"][0] == "h"
        assert after["later_things"][2] == placement["turns"][2], "co-located with the others"
    finally:
        await cluster.drop_database(SCRATCH)


async def test_migrate_and_distribute_are_a_noop_on_plain_postgresql(
    server_url: str, tmp_path: Path
) -> None:
    """On the run's plain PostgreSQL server (the embedded one unless TEST_DATABASE_URL names
    another) the schema is left as Alembic made it."""
    async with scratch_database(server_url, "cms_nocitus") as url:
        said = await asyncio.to_thread(_run_app, "migrate", database_url=url, cwd=tmp_path)
        assert "migrated DATABASE_URL to head" in said
        assert "citus" not in said
        outcome = await distribute(url, metadata)
        assert (outcome.citus, outcome.distributed, outcome.referenced) == (False, [], [])
        said = await asyncio.to_thread(_run_app, "distribute", database_url=url, cwd=tmp_path)
        assert "no citus extension in the database: nothing to distribute" in said
        query = "SELECT count(*) FROM pg_extension WHERE extname = 'citus'"
        assert await admin_fetchval(url, query) == 0


def test_distribute_without_database_url_leaves_the_embedded_default(tmp_path: Path) -> None:
    said = _run_app("distribute", database_url=None, cwd=tmp_path)
    assert "the embedded database has no Citus, nothing to distribute" in said
