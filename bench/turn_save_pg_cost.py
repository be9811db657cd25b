"""Where the database time of a turn-save goes: PostgreSQL CPU per statement of the common
turn-save (`app.turns.repository.save_common_turn`'s one statement), sent from one connection
one after the other, with the backend's own CPU read from /proc around each block.

    .venv/bin/python bench/turn_save_pg_cost.py [--users 2000] [--block 1500] [--rounds 4]

With the admin connection DATABASE_URL (default postgresql://postgres@127.0.0.1:5432/postgres,
which must run on this machine: its backend's CPU is read from /proc) it creates the scratch
database `cms_pg_cost`, seeds it as `make bench` seeds ours (bench/seed.py), and measures:

1. the statement as the app sends it, against forms of it that leave one part out, each bound
   with the same arguments (a part's parameters stay bound, in a column that is always NULL):
   without its job insert (the job's row never written); without the two advisory locks of the
   turn (the user's history lock, shared, and the chat's); without the key-share lock on the
   user's memory folder; and its three inserts alone (turn, messages, job: no settings read, no
   gate, no lock). In alternating blocks of `--block` turn-saves spread over the users; before
   each block the queue is emptied and vacuumed;
2. the statement as sent, 1, 4 and 16 turn-saves to a transaction (BEGIN ... COMMIT around
   them): what a commit of its own costs each turn-save on one connection; and the batch
   statement of the group commit (`repository.save_common_turns`), 1, 4, 8, 16 and 32 turns to a
   statement, per turn;
3. the write alone (`write_turn`'s statement, no settings read), queuing a new job against
   appending the turn to a queued job of its user (the coalescing past the quota of waiting
   jobs): one queued job per user before each block, in a `jobs` table at its default fill
   factor and at 50 (room for heap-only updates);
4. the statement again after dropping the CHECK constraints of `jobs` and `chat_messages`;
5. and after dropping, besides, the three secondary indexes of `jobs` that a queued job is
   entered in beyond its primary key, the claim's and the quota's (`ix_jobs_claimable`,
   `ix_jobs_owner_status`, `ix_jobs_company_created`).

Steps 3 to 5 change the scratch schema only, to price what each costs; the service needs them.
Each figure is the median over the rounds, in µs of backend CPU per statement (the clock ticks
of /proc are 10 ms: a block of 1,500 resolves ~7 µs). The database is dropped at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import statistics
import sys
import uuid
from collections.abc import Sequence
from pathlib import Path

import asyncpg
import orjson
from pydantic import SecretStr

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from app.consolidation.kinds import CONSOLIDATION, consolidation_payload
from app.conversations.modes import Role
from app.conversations.repository import NewMessage, NewTurn, turn_params
from app.folders.acl import user_folder_path
from app.jobs.enqueue import CoalescedItem, NewJob, coalesce_params, enqueue_params
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
PER_COMMIT = (1, 4, 16)
PER_BATCH = (1, 4, 8, 16, 32)
MESSAGES = (NewMessage(Role.USER, TEXT, "request"), NewMessage(Role.ASSISTANT, TEXT, "response"))
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


_ADVISORY_LOCK = re.compile(r"pg_advisory_xact_lock(?:_shared)?\(hashtextextended\((\$\d+), 0\)\)")


def without_advisory_locks(sql: str) -> str:
    """The statement with both advisory locks of the turn replaced by a check that their keys
    are bound (the same column, never NULL), so the form takes the same arguments."""
    unlocked, count = _ADVISORY_LOCK.subn(r"(CAST(\1 AS text) IS NOT NULL)", sql)
    if count != 2:
        raise ValueError(f"expected the user's and the chat's advisory locks, found {count}")
    return unlocked


def without_key_share(sql: str) -> str:
    """The statement with the memory folder read as a plain (snapshot) read, not locked."""
    if sql.count("FOR KEY SHARE OF fo") != 1:
        raise ValueError("expected one key-share lock on the memory folder")
    return sql.replace("FOR KEY SHARE OF fo", "")


def inserts_alone(sql: str, types: Sequence[str]) -> str:
    """The statement's three inserts (turn, messages, job) as the statement writes them, with
    its settings read, gate and locks left out: `planned` and `held` are one row; every
    parameter the inserts leave unused is still bound (`types`: each parameter's type)."""
    rows = sql[sql.index("), turn AS (") + 1 : sql.index("\nSELECT st.*")]
    used = set(re.findall(r"\$(\d+)\b", rows))
    bound = " AND ".join(
        f"CAST(${n} AS {kind}) IS NOT NULL"
        for n, kind in enumerate(types, start=1)
        if str(n) not in used
    )
    return (
        f"WITH planned AS (SELECT 1 WHERE {bound}), held AS (SELECT 1 FROM planned),"  # noqa: S608
        f" gate AS (SELECT CAST(NULL AS text) AS model){rows}\nSELECT 1"
    )


def new_turn(user: int) -> NewTurn:
    return NewTurn(
        id=uuid.uuid4(),
        company_id=COMPANY,
        user_id=user_id(user),
        chat_id=turns_chat(user),
        space_id=SPACE,
        history_mode="auto",
        language_model=None,
    )


def new_job(turn: NewTurn) -> NewJob:
    """The consolidation job a turn-save queues for `turn`."""
    return NewJob(CONSOLIDATION, consolidation_payload(str(turn.id), SPACE, None), 3)


def arguments(user: int, names: Sequence[str]) -> list[object]:
    turn = new_turn(user)
    common = repository.CommonTurn(turn, MESSAGES, new_job(turn), None, False)
    params = repository.common_turn_params(common, LIMITS)
    return [params[name] for name in names]


async def block(
    conn: asyncpg.Connection,
    sql: str,
    names: Sequence[str],
    *,
    n: int,
    users: int,
    start: int,
    per_commit: int = 1,
) -> float:
    """Backend CPU µs per statement over `n` turn-saves from an empty, vacuumed queue; with
    `per_commit` > 1, that many statements to a transaction."""
    pid = conn.get_server_pid()
    await conn.execute("DELETE FROM jobs")
    await conn.execute("VACUUM jobs")
    before = backend_cpu_seconds(pid)
    for first in range(0, n, per_commit):
        users_of = [
            1 + (start + i * 7919) % users for i in range(first, min(n, first + per_commit))
        ]
        async with conn.transaction() if per_commit > 1 else contextlib.nullcontext():
            for user in users_of:
                await conn.fetchrow(sql, *arguments(user, names))
    return (backend_cpu_seconds(pid) - before) * 1e6 / n


async def batch_block(
    conn: asyncpg.Connection, *, n: int, users: int, start: int, size: int
) -> float:
    """Backend CPU µs per turn over `n` turn-saves from an empty, vacuumed queue, written `size`
    to a statement by the group commit's batch statement."""
    pid = conn.get_server_pid()
    await conn.execute("DELETE FROM jobs")
    await conn.execute("VACUUM jobs")
    before = backend_cpu_seconds(pid)
    for first in range(0, n, size):
        commons = []
        for i in range(first, min(n, first + size)):
            turn = new_turn(1 + (start + i * 7919) % users)
            commons.append(repository.CommonTurn(turn, MESSAGES, new_job(turn), None, False))
        saved = await repository.save_common_turns(conn, commons, limits=LIMITS)
        if not all(done.queued for done in saved):
            raise RuntimeError("a turn of the batch was not written with its job")
    return (backend_cpu_seconds(pid) - before) * 1e6 / n


async def queue_one_job_per_user(
    conn: asyncpg.Connection, users: int, fillfactor: int
) -> dict[int, uuid.UUID]:
    """Empty `jobs` at `fillfactor`, then one queued consolidation job per user; their ids."""
    await conn.execute("DELETE FROM jobs")
    await conn.execute(f"ALTER TABLE jobs SET (fillfactor = {fillfactor})")
    await conn.execute("VACUUM FULL jobs")
    jobs = {user: uuid.uuid4() for user in range(1, users + 1)}
    await conn.executemany(
        "INSERT INTO jobs (company_id, id, user_id, kind, status, payload, attempts, max_attempts)"
        " VALUES ($1, $2, $3, $4, 'queued', $5::jsonb, 0, 3)",
        [
            (
                COMPANY,
                job,
                user_id(user),
                CONSOLIDATION,
                orjson.dumps({"turn_id": str(uuid.uuid4())}).decode(),  # an earlier turn's
            )
            for user, job in jobs.items()
        ],
    )
    await conn.execute("VACUUM ANALYZE jobs")
    return jobs


async def write_block(
    conn: asyncpg.Connection, jobs: dict[int, uuid.UUID] | None, *, n: int, users: int, start: int
) -> float:
    """Backend CPU µs per `write_turn` statement over `n` turns: each with a new job, or (given
    `jobs`) appended to its user's queued job."""
    mode = repository.NEW_JOB if jobs is None else repository.COALESCED
    sql, names = repository._TURN_WRITE[(mode, False, False)]  # the app's own statement
    pid = conn.get_server_pid()
    before = backend_cpu_seconds(pid)
    for i in range(n):
        user = 1 + (start + i * 7919) % users
        turn = new_turn(user)
        params = turn_params(turn, MESSAGES) | {"folder_path": user_folder_path(turn.user_id)}
        if jobs is None:
            params |= enqueue_params(new_job(turn))
        else:
            params |= coalesce_params(CoalescedItem(jobs[user], str(turn.id), 10 * n))
        row = await conn.fetchrow(sql, *[params[name] for name in names])
        if not row["planned"]:
            raise RuntimeError(f"the write of user {user}'s turn stored nothing")
    return (backend_cpu_seconds(pid) - before) * 1e6 / n


async def measure_joining(
    conn: asyncpg.Connection, users: int, n: int, rounds: int
) -> list[tuple[str, float]]:
    """Step 3: the write with a new job against the write appended to a queued job."""
    result = []
    for name, appended, fillfactor in (
        ("a new job", False, 100),
        ("appended to a queued job", True, 100),
        ("appended to a queued job, jobs at fill factor 50", True, 50),
    ):
        values = []
        for r in range(rounds):
            jobs = await queue_one_job_per_user(conn, users, fillfactor)
            queued = jobs if appended else None
            await write_block(conn, queued, n=50, users=users, start=n * rounds)  # warm
            values.append(await write_block(conn, queued, n=n, users=users, start=r * n))
        result.append((f"the write alone, {name}", statistics.median(values)))
    await conn.execute("ALTER TABLE jobs RESET (fillfactor)")
    await conn.execute("DELETE FROM jobs")
    await conn.execute("VACUUM FULL jobs")
    return result


def backend_cpu_seconds(pid: int) -> float:
    """The backend's CPU seconds, as the bench reads a server's (`process_cpu_seconds`)."""
    seconds = process_cpu_seconds(pid)
    if seconds is None:
        raise RuntimeError("the database must run on this machine: its backend's /proc is read")
    return seconds


async def measure(dsn: str, users: int, n: int, rounds: int) -> list[tuple[str, float]]:
    sql, names = repository._COMMON_TURN_SAVE[False]  # the app's own statement
    conn = await asyncpg.connect(dsn)
    try:
        types = [t.name for t in (await conn.prepare(sql)).get_parameters()]
        forms = {
            "as sent": sql,
            "without the job insert": without_job_insert(sql, names),
            "without the two advisory locks": without_advisory_locks(sql),
            "without the memory folder's key-share lock": without_key_share(sql),
            "its three inserts alone (no settings read, gate or lock)": inserts_alone(sql, types),
        }
        for form in forms.values():  # warm: prepared, plans cached
            await block(conn, form, names, n=50, users=users, start=0)
        figures: dict[str, list[float]] = {name: [] for name in forms}
        for r in range(rounds):
            order = list(forms.items()) if r % 2 == 0 else list(forms.items())[::-1]
            for name, form in order:
                figures[name].append(await block(conn, form, names, n=n, users=users, start=r * n))
        result = [(name, statistics.median(values)) for name, values in figures.items()]
        commits: dict[int, list[float]] = {size: [] for size in PER_COMMIT}
        for r in range(rounds):
            for size in PER_COMMIT:
                commits[size].append(
                    await block(conn, sql, names, n=n, users=users, start=r * n, per_commit=size)
                )
        result += [
            (f"as sent, {size} to a transaction", statistics.median(values))
            for size, values in commits.items()
        ]
        batches: dict[int, list[float]] = {size: [] for size in PER_BATCH}
        for r in range(rounds):
            for size in PER_BATCH:
                value = await batch_block(conn, n=n, users=users, start=r * n, size=size)
                batches[size].append(value)
        result += [
            (f"the batch statement, {size} to a statement, per turn", statistics.median(values))
            for size, values in batches.items()
        ]
        result += await measure_joining(conn, users, n, rounds)
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
