"""docs/scaling.md's Citus runbook is what the tests run: every fenced block of it is named and
run by a test (`tests/helpers/runbook.py`), and the blocks no other test runs are run here: the
install, and the distribution of a fresh database with the service's own commands."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from app.kit.config import PROJECT_ROOT
from app.models import metadata
from tests.helpers import runbook
from tests.helpers.citus import CitusCluster, citus_missing
from tests.helpers.db import admin_fetchval

RUNS_A_BLOCK = re.compile(r"runbook\.(psql|shell|settings)\(")


def _sources_that_run_blocks() -> list[str]:
    sources = (path.read_text(encoding="utf-8") for path in (PROJECT_ROOT / "tests").rglob("*.py"))
    return [source for source in sources if RUNS_A_BLOCK.search(source)]


def test_every_block_of_the_runbook_is_named_and_run_by_a_test() -> None:
    blocks = runbook.blocks()
    assert len(blocks) >= 10, blocks  # the section was found, with its blocks
    unnamed = [block.text for block in blocks if block.name is None]
    assert unnamed == [], f"blocks without `runbook=<name>` in docs/scaling.md: {unnamed}"
    names = [block.name for block in blocks]
    assert len(names) == len(set(names)), names
    sources = _sources_that_run_blocks()
    not_run = [name for name in names if not any(f'"{name}"' in source for source in sources)]
    assert not_run == [], f"runbook blocks that no test runs: {not_run}"


@pytest.mark.slow
async def test_the_install_block_finds_citus_installed() -> None:
    """`.ci/install-citus` where Citus is installed: nothing to do (where it is not, it would
    build it, minutes long: the cluster tests skip instead, and so does this one)."""
    missing = citus_missing()
    if missing:
        pytest.skip(missing)
    assert await runbook.shell("install", {}) == ""


@pytest.mark.slow
async def test_the_distribute_block_distributes_a_fresh_database(cluster: CitusCluster) -> None:
    """`python -m app migrate` and `python -m app distribute` on a database of the cluster with
    nothing in it but the extension: every company table distributed by `company_id`, in one
    co-location group, the other tables copied to every node."""
    name = "cms_runbook"
    await cluster.create_database(name)
    try:
        path = f"{Path(sys.executable).parent}:{PROJECT_ROOT / '.venv' / 'bin'}"
        env = {"DATABASE_URL": cluster.url(name), "PATH": f"{path}:/usr/bin:/bin"}
        out = await runbook.shell("distribute", env)
        assert "migrated DATABASE_URL to head" in out, out
        url = cluster.url(name)
        company_tables = sum("company_id" in table.c for table in metadata.sorted_tables)
        distributed = "SELECT count(*) FROM pg_dist_partition WHERE partmethod = 'h'"
        assert await admin_fetchval(url, distributed) == company_tables
        groups = "SELECT count(DISTINCT colocationid) FROM pg_dist_partition WHERE partmethod = 'h'"
        assert await admin_fetchval(url, groups) == 1
        reference = "SELECT count(*) FROM pg_dist_partition WHERE partmethod = 'n'"
        # alembic_version and the tables without a company_id (the platform's)
        others = sum("company_id" not in table.c for table in metadata.sorted_tables)
        assert await admin_fetchval(url, reference) == others + 1
    finally:
        await cluster.drop_database(name)
