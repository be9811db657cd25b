"""Where the database time of a turn-save goes: PostgreSQL CPU per statement of the common
turn-save (`app.turns.repository.save_common_turn`'s one statement), sent from one connection
one after the other, with the backend's own CPU read from /proc around each block.

    .venv/bin/python bench/turn_save_pg_cost.py [--users 2000] [--block 1500] [--rounds 4]

With the admin connection DATABASE_URL (default postgresql://postgres@127.0.0.1:5432/postgres,
which must run on this machine: its backend's CPU is read from /proc) it creates the scratch
database `cms_pg_cost`, seeds it as `make bench` seeds ours (bench/seed.py), and measures:

1. the statement as the app sends it, against the same statement without its job insert (the
   job's parameters still bound, its row never written), in alternating blocks of `--block`
   turn-saves spread over the users; before each block the queue is emptied and vacuumed;
2. the statement again after dropping the CHECK constraints of `jobs` and `chat_messages`;
3. and after dropping, besides, the three secondary indexes of `jobs` that a queued job is
   entered in beyond its primary key, the claim's and the quota's (`ix_jobs_claimable`,
   `ix_jobs_owner_status`, `ix_jobs_company_created`).

Steps 2 and 3 change the scratch schema only, to price what each costs; the service needs them.
Each figure is the median over the rounds, in µs of backend CPU per statement (the clock ticks
of /proc are 10 ms: a block of 1,500 resolves ~7 µs). The database is dropped at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import uuid
from collections.abc import Sequence
from pathlib import Path

import asyncpg
from pydantic import SecretStr

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from app.consolidation.kinds import CONSOLIDATION, consolidation_payload
from app.conversations.modes import Role
from app.conversations.repository import NewMessage, NewTurn
from app.jobs.enqueue import NewJob
from app.kit.config import Settings
from app.quotas.rule import QuotaLimits
from app.turns import repository
from bench.run_bench import (
    DEFAULT_ADMIN_URL,
    drop_databases,
    plain_dsn,
    process_cpu_seconds,
    recreate_databases,
)
from bench.seed import COMPANY, SPACE, seed_ours, turns_chat, user_id

DATABASE = "cms_pg_cost"
TEXT = "x" * 500
CHECKS = (
    ("jobs", "ck_jobs_kind"),
    ("jobs", "ck_jobs_outcome"),
    ("jobs", "ck_jobs_status"),
    ("chat_messages", "ck_chat_messages_role"),
    ("chat_messages", "ck_chat_messages_source"),
)
SECONDARY_JOB_INDEXES = ("ix_jobs_claimable", "ix_jobs_owner_status", "ix_jobs_company_created")
LIMITS = QuotaLimits(user_queued_jobs=20, job_max_turns=25)


JOB_PARAMETERS = (
    ("job_id", "uuid"),
    ("job_kind", "text"),
    ("job_payload", "jsonb"),
    ("job_max_attempts", "int"),
)


def without_job_insert(sql: str, names: Sequence[str]) -> str:
    """The statement with its `job` entry taken out and the job's parameters still bound (in a
    column that is always NULL), so both forms take the same arguments."""
    start, end = sql.index(", job AS ("), sql.index("\nSELECT st.*")
    column = " AND ".join(
        f"CAST(${names.index(name) + 1} AS {kind}) IS NULL" for name, kind in JOB_PARAMETERS
    )
    return sql[:start] + sql[end:].replace("SELECT st.*", f"SELECT st.*, ({column}) AS unbound", 1)


def arguments(user: int, names: Sequence[str]) -> list[object]:
    turn = NewTurn(
        id=uuid.uuid4(),
        company_id=COMPANY,
        user_id=user_id(user),
        chat_id=turns_chat(user),
        space_id=SPACE,
        history_mode="auto",
        language_model=None,
    )
    messages = [
        NewMessage(Role.USER, TEXT, "request"),
        NewMessage(Role.ASSISTANT, TEXT, "response"),
    ]
    payload = consolidation_payload(str(turn.id), SPACE, None)
    common = repository.CommonTurn(turn, messages, NewJob(CONSOLIDATION, payload, 3), None, False)
    params = repository.common_turn_params(common, LIMITS)
    return [params[name] for name in names]


async def block(
    conn: asyncpg.Connection, sql: str, names: Sequence[str], *, n: int, users: int, start: int
) -> float:
    """Backend CPU µs per statement over `n` turn-saves from an empty, vacuumed queue."""
    pid = conn.get_server_pid()
    await conn.execute("DELETE FROM jobs")
    await conn.execute("VACUUM jobs")
    before = backend_cpu_seconds(pid)
    for i in range(n):
        await conn.fetchrow(sql, *arguments(1 + (start + i * 7919) % users, names))
    return (backend_cpu_seconds(pid) - before) * 1e6 / n


def backend_cpu_seconds(pid: int) -> float:
    """The backend's CPU seconds, as the bench reads a server's (`process_cpu_seconds`)."""
    seconds = process_cpu_seconds(pid)
    if seconds is None:
        raise RuntimeError("the database must run on this machine: its backend's /proc is read")
    return seconds


async def measure(dsn: str, users: int, n: int, rounds: int) -> list[tuple[str, float]]:
    sql, names = repository._COMMON_TURN_SAVE[False]  # the app's own statement
    forms = {"as sent": sql, "without the job insert": without_job_insert(sql, names)}
    conn = await asyncpg.connect(dsn)
    try:
        for form in forms.values():  # warm: prepared, plans cached
            await block(conn, form, names, n=50, users=users, start=0)
        figures: dict[str, list[float]] = {name: [] for name in forms}
        for r in range(rounds):
            order = list(forms.items()) if r % 2 == 0 else list(forms.items())[::-1]
            for name, form in order:
                figures[name].append(await block(conn, form, names, n=n, users=users, start=r * n))
        result = [(name, statistics.median(values)) for name, values in figures.items()]
        for table, check in CHECKS:
            await conn.execute(f"ALTER TABLE {table} DROP CONSTRAINT {check}")
        values = [
            await block(conn, sql, names, n=n, users=users, start=r * n) for r in range(rounds)
        ]
        result.append(("as sent, without the CHECK constraints", statistics.median(values)))
        for index in SECONDARY_JOB_INDEXES:
            await conn.execute(f"DROP INDEX {index}")
        values = [
            await block(conn, sql, names, n=n, users=users, start=r * n) for r in range(rounds)
        ]
        result.append(("... and without 3 secondary indexes of jobs", statistics.median(values)))
        return result
    finally:
        await conn.close()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--users", type=int, default=2000)
    parser.add_argument("--block", type=int, default=1500, help="turn-saves per block")
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args(argv)
    admin_dsn = plain_dsn(os.environ.get("DATABASE_URL") or DEFAULT_ADMIN_URL)
    dsn = plain_dsn(admin_dsn, DATABASE)
    settings = Settings(
        _env_file=None,
        database_url=dsn,
        environment="test",
        jwt_secret=SecretStr("turn-save-pg-cost-only-secret-not-a-default"),
        worker_enabled=False,
    )
    asyncio.run(recreate_databases(admin_dsn, [DATABASE]))
    try:
        asyncio.run(seed_ours(dsn, settings, args.users))
        result = asyncio.run(measure(dsn, args.users, args.block, args.rounds))
    finally:
        asyncio.run(drop_databases(admin_dsn, [DATABASE]))
    print("\n| the common turn-save statement | PostgreSQL CPU µs per statement |")
    print("|---|---:|")
    for name, value in result:
        print(f"| {name} | {value:,.0f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
