"""Counting usage without a database write per request: `UsageBuffer` adds counts in memory;
its `flush` adds them to the tables in one short transaction (one statement in autocommit when
only counts or only model calls are pending).

`UsageMeter` is the API process's buffer for the hot path (turns saved, contexts served): the
two routes count in memory (`turn_saved`, `context_served`, no await), and a background task
started by the lifespan flushes every `USAGE_FLUSH_SECONDS` and once more at shutdown. A flush
that fails keeps its counts for the next one. The bound: a process that dies without its
shutdown loses at most the counts of its last flush interval; nothing is counted twice (a flush
either commits or gives its counts back).

The worker uses a `UsageBuffer` of its own to record each answered model call right after the
call (`app.usage.recorder`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from datetime import UTC, date, datetime

from app.kit.db.engine import Database
from app.usage import repository
from app.usage.repository import CallKey, CallTotals, CountKey

logger = logging.getLogger("app.usage")

TURNS_SAVED = "turns_saved"
CONTEXTS_SERVED = "contexts_served"


def _utc_today() -> date:
    return datetime.now(UTC).date()


class UsageBuffer:
    """Counts and model-call totals not yet written, keyed by company and UTC day.

    Adding is synchronous and never fails. `flush` takes everything pending at once (a swap,
    so what is added meanwhile waits for the next flush), writes it in one transaction (or
    one statement) and, if that fails, gives it back to be written by a later flush.
    """

    def __init__(self, database: Database) -> None:
        self.database = database
        self._counts: dict[CountKey, int] = {}
        self._calls: dict[CallKey, CallTotals] = {}

    @property
    def pending(self) -> bool:
        return bool(self._counts or self._calls)

    def add_count(self, company_id: str, day: date, counter: str, n: int = 1) -> None:
        key = (company_id, day, counter)
        self._counts[key] = self._counts.get(key, 0) + n

    def add_call(self, key: CallKey, totals: CallTotals) -> None:
        held = self._calls.get(key)
        self._calls[key] = totals if held is None else held + totals

    async def flush(self) -> bool:
        """Write what is pending; False (counts kept) when the database refused."""
        counts, self._counts = self._counts, {}
        calls, self._calls = self._calls, {}
        if not counts and not calls:
            return True
        try:
            async with self.database.engine.connect() as conn:
                if counts and calls:
                    async with conn.begin():
                        await repository.add_counts(conn, counts)
                        await repository.add_model_calls(conn, calls)
                else:  # one statement, atomic on its own: no BEGIN and COMMIT around it
                    writer = await conn.execution_options(isolation_level="AUTOCOMMIT")
                    await repository.add_counts(writer, counts)
                    await repository.add_model_calls(writer, calls)
        except Exception:
            for (company, day, counter), n in counts.items():
                self.add_count(company, day, counter, n)
            for key, totals in calls.items():
                self.add_call(key, totals)
            logger.warning("usage counts not written; kept for the next flush", exc_info=True)
            return False
        return True


class UsageMeter:
    """The hot path's counts (see the module docstring); one per process, on `app.state`."""

    def __init__(
        self,
        database: Database,
        flush_seconds: float,
        *,
        on_flush_failure: Callable[[], None] = lambda: None,
        today: Callable[[], date] = _utc_today,
    ) -> None:
        self.buffer = UsageBuffer(database)
        self.flush_seconds = flush_seconds
        self.on_flush_failure = on_flush_failure
        self.today = today
        self._task: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()

    def context_served(self, company_id: str) -> None:
        """A `/context` answered 200."""
        self.buffer.add_count(company_id, self.today(), CONTEXTS_SERVED)

    def turn_saved(self, company_id: str, *, replayed: bool) -> None:
        """A `/turns` answered 2xx; a replayed idempotent answer saved nothing new."""
        if not replayed:
            self.buffer.add_count(company_id, self.today(), TURNS_SAVED)

    async def flush(self) -> bool:
        flushed = await self.buffer.flush()
        if not flushed:
            self.on_flush_failure()
        return flushed

    def start(self) -> None:
        self._stopping.clear()
        self._task = asyncio.create_task(self._flush_periodically(), name="usage-meter")

    async def stop(self) -> None:
        """Stop the periodic flush and flush what is left. The task is never cancelled in
        the middle of a flush (whose commit could then not be told from a failure)."""
        self._stopping.set()
        if self._task is not None:
            await self._task
            self._task = None
        await self.flush()

    async def _flush_periodically(self) -> None:
        while not self._stopping.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), self.flush_seconds)
            await self.flush()
