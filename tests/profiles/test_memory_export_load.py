"""Ten users export a 40 MiB chat history each at the same time from a real `python -m app serve`
process: its resident set stays within a fixed bound of where it started (bench/export_memory.py
is the same harness, with a report)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from bench.export_memory import (
    bearer,
    export_at_once,
    plain_dsn,
    seed_histories,
    served,
    user_id,
)
from tests.helpers.db import scratch_database

USERS = 10
MIB_PER_USER = 40
RSS_GROWTH_BOUND = 64 * 2**20
"""What ten concurrent exports may add to the process's resident set (VmRSS) at its peak: each
holds a batch of rows, a chunk and the transport's buffer, a few MiB; measured +24 MiB. Before
the export streamed, the same run added 970 MiB (the documents and their Python objects)."""


@pytest.fixture
async def export_database(server_url: str) -> AsyncIterator[str]:
    async with scratch_database(server_url, "cms_export_load") as url:
        yield url


@pytest.mark.slow
async def test_ten_large_exports_at_once_keep_the_resident_set_bounded(
    export_database: str, tmp_path: Path
) -> None:
    users = [user_id(n) for n in range(1, USERS + 1)]
    await seed_histories(plain_dsn(export_database), ["warm-up"], mib_per_user=0.05)
    await seed_histories(plain_dsn(export_database), users, mib_per_user=MIB_PER_USER)
    tokens = bearer([*users, "warm-up"])

    async with served(export_database, tmp_path) as process:
        run = await export_at_once(process, [tokens[user] for user in users], tokens["warm-up"])

    mib = 2**20
    assert run.statuses == [200] * USERS
    assert min(run.sizes) > MIB_PER_USER * mib
    report = (
        f"RSS {run.baseline_rss / mib:.0f} -> {run.peak_rss / mib:.0f} MiB for {USERS} exports of "
        f"{min(run.sizes) / mib:.0f} MiB"
    )
    assert run.growth < RSS_GROWTH_BOUND, report
