"""The SQL statements the consolidation worker sends per consolidation, counted in process.

The measured worker of bench/worker_bench.py is a child process, out of reach of SQLAlchemy's
events; this runs the same `Worker` and pipeline (offline engine, the app's default settings but
WORKER_CONCURRENCY) inside the harness, on its own engine, and counts every statement it executes:
those sent through SQLAlchemy (`before_cursor_execute`) and those the worker sends straight on the
asyncpg connection under a pooled one (asyncpg's query logger, which also sees every BEGIN,
COMMIT and ROLLBACK: those are counted as transactions, not statements). The claim's look for
the next owner in fair order (with its advisory-lock attempt) is counted apart: it repeats when
concurrent slots race for the same owners.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

from pydantic import SecretStr
from sqlalchemy import event

from app.consolidation.kinds import KINDS
from app.consolidation.pipeline import make_consolidation_handler
from app.consolidation.runner import worker_config
from app.jobs.worker import Worker
from app.kit.config import Settings, to_asyncpg_url
from app.kit.db.engine import create_database
from app.kit.observability import Metrics
from app.kit.tokens import TokenCounters
from bench.worker_drain import JWT_SECRET, PENDING_JOBS, POLL_SECONDS, TurnQueue

OWNER_QUERY = "owner query"
TRANSACTION = "transaction"
OTHER = "other"
_ENDS = ("COMMIT", "ROLLBACK", "RELEASE", "SAVEPOINT")


def statement_kind(statement: str) -> str | None:
    """What one statement counts as; None for the end of a transaction (not counted)."""
    words = " ".join(statement.split()).upper()
    if words.startswith("BEGIN"):
        return TRANSACTION
    if words.startswith(_ENDS):
        return None
    if words.startswith("WITH RECURSIVE PENDING_COMPANIES"):
        return OWNER_QUERY
    return OTHER


@dataclass(frozen=True)
class StatementCount:
    concurrency: int
    claims: int
    seconds: float
    cpu_seconds: float
    """Of the whole harness process over the drain (its polling is a small part of it)."""
    statements: Counter[str]

    def per_claim(self, kind: str | None = None) -> float:
        """Statements (all but transactions, or those of `kind`) per consolidation."""
        if kind is None:
            count = self.statements.total() - self.statements[TRANSACTION]
        else:
            count = self.statements[kind]
        return count / self.claims if self.claims else 0.0


async def count_statements(
    database_url: str, queue: TurnQueue, db: Any, *, tag: str, users: int, concurrency: int
) -> StatementCount:
    """Queue one turn for each of `users` new users, drain them with an in-process worker of
    `concurrency` slots, and count its statements."""
    await queue.queue(tag, users, 1)
    await db.execute("VACUUM ANALYZE")  # as run_drain does
    settings = Settings(
        _env_file=None,
        environment="test",
        database_url=database_url,
        jwt_secret=SecretStr(JWT_SECRET),
        llm_provider="rules",
        worker_concurrency=concurrency,
    )
    database = create_database(to_asyncpg_url(database_url), settings)
    metrics = Metrics()
    handler = make_consolidation_handler(database, settings, None, metrics, TokenCounters())
    worker = Worker(
        database.engine, dict.fromkeys(KINDS, handler), worker_config(settings), metrics
    )
    counts: Counter[str] = Counter()

    def count(statement: str) -> None:
        kind = statement_kind(statement)
        if kind is not None:
            counts[kind] += 1

    def count_cursor(_conn: Any, _cursor: Any, statement: str, *_rest: Any) -> None:
        count(statement)

    def log_driver(_connection: Any, record: Any) -> None:
        record.driver_connection.add_query_logger(lambda logged: count(logged.query))

    event.listen(database.engine.sync_engine, "before_cursor_execute", count_cursor)
    event.listen(database.engine.sync_engine.pool, "connect", log_driver)
    started, cpu_before = time.perf_counter(), time.process_time()
    running = asyncio.create_task(worker.run())
    try:
        pending = True
        while pending:
            await asyncio.sleep(POLL_SECONDS)
            pending = bool(await db.fetchval(PENDING_JOBS))
        seconds, cpu_seconds = time.perf_counter() - started, time.process_time() - cpu_before
    finally:
        worker.stop()
        await running
        event.remove(database.engine.sync_engine, "before_cursor_execute", count_cursor)
        await database.dispose()
    claims = await db.fetchval(
        "SELECT count(DISTINCT (user_id, finished_at)) FROM jobs"
        " WHERE company_id = $1 AND user_id LIKE $2 AND status = 'succeeded'",
        queue.company,
        f"{tag}-u%",
    )
    return StatementCount(concurrency, claims, seconds, cpu_seconds, counts)
