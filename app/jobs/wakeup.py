"""Waking idle workers when work arrives, instead of leaving it queued until their next poll.

The API side (`JobSignal`): a request that queued a job calls `poke()`, which costs nothing on
the request's path. One task per process sends `NOTIFY context_memory_jobs` on a connection
of its own, at most once every `JOB_NOTIFY_INTERVAL_MS`: however many turn-saves queue jobs in
that time, they cost one statement, and no commit of a turn-save takes PostgreSQL's
notification-queue lock (a trigger on `jobs` would, on every turn-save, serialising them).

The worker side (`JobWakeups`): one connection of its own, outside any pool, LISTENs on the
channel; a notification wakes every idle slot of the process at once, and they claim. Polling
every `WORKER_POLL_SECONDS` stays underneath: for the jobs no request pokes for (retries,
scheduled ones, a job queued by another route), for a notification lost with its connection,
and while the listening connection is down (it reconnects every few seconds, and wakes the
slots once it is back, for what it may have missed). LISTEN needs a session of its own: behind
PgBouncer in transaction mode, the worker listens on `DATABASE_LISTEN_URL` (the database
itself), and without one it only polls.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from typing import Final

import asyncpg

logger = logging.getLogger("app.worker")

CHANNEL: Final = "context_memory_jobs"
NOTIFY: Final = f"NOTIFY {CHANNEL}"
RECONNECT_SECONDS: Final = 5.0
PING_SECONDS: Final = 30.0


class JobSignal:
    """Tells the workers that jobs were queued: `poke()` after the write committed; the
    notification follows within `interval_seconds` (0: it is never sent, workers poll). It is
    sent on a connection of its own (`connect_kwargs`, opened at the first and kept), so it
    never takes one the requests wait for."""

    def __init__(self, connect_kwargs: Mapping[str, object], interval_seconds: float) -> None:
        self._connect_kwargs = dict(connect_kwargs)
        self._interval = interval_seconds
        self._pending = False
        self._task: asyncio.Task[None] | None = None
        self._conn: asyncpg.Connection | None = None
        self.sent = 0

    @property
    def sending(self) -> bool:
        """A notification is on its way (or its interval not over)."""
        return self._task is not None

    def poke(self) -> None:
        if self._interval <= 0:
            return
        self._pending = True
        if self._task is None:
            self._task = asyncio.create_task(self._send(), name="job-signal")

    async def _send(self) -> None:
        try:
            while self._pending:
                self._pending = False
                try:
                    if self._conn is None or self._conn.is_closed():
                        self._conn = await asyncpg.connect(**self._connect_kwargs)
                    await self._conn.execute(NOTIFY)
                    self.sent += 1
                except Exception:  # the workers' polling finds the jobs all the same
                    logger.debug("job notification not sent", exc_info=True)
                    self._drop_connection()
                await asyncio.sleep(self._interval)
        finally:
            self._task = None

    def _drop_connection(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None and not conn.is_closed():
            conn.terminate()

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        conn, self._conn = self._conn, None
        if conn is not None and not conn.is_closed():
            with contextlib.suppress(Exception):
                await conn.close(timeout=1)


class JobWakeups:
    """The worker's ear on `CHANNEL`: `armed()` before a claim, then wait on what it returned
    when the claim found nothing; it is set by the next notification (also one that arrived
    during the claim, so none falls between the claim and the wait)."""

    def __init__(
        self, connect_kwargs: Mapping[str, object], *, reconnect_seconds: float = RECONNECT_SECONDS
    ) -> None:
        self._connect_kwargs = dict(connect_kwargs)
        self._reconnect_seconds = reconnect_seconds
        self._event = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.listening = False
        self.notifications = 0

    def armed(self) -> asyncio.Event:
        return self._event

    def wake(self) -> None:
        """Wake every slot waiting on an armed event."""
        event, self._event = self._event, asyncio.Event()
        event.set()

    def start(self) -> None:
        self._task = asyncio.create_task(self._listen(), name="job-wakeups")

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def _notified(self, *_: object) -> None:
        self.notifications += 1
        self.wake()

    async def _listen(self) -> None:
        warned = False
        while True:
            try:
                await self._listen_once(warned=warned)
            except asyncio.CancelledError:
                raise
            except Exception:
                if not warned:
                    logger.warning(
                        "cannot listen for queued jobs; polling every WORKER_POLL_SECONDS "
                        "meanwhile",
                        exc_info=True,
                    )
                warned = True
            else:
                warned = False
            await asyncio.sleep(self._reconnect_seconds)

    async def _listen_once(self, *, warned: bool) -> None:
        """Listen until the session ends (returns) or fails (raises)."""
        lost = asyncio.Event()
        conn = await asyncpg.connect(**self._connect_kwargs)
        try:
            conn.add_termination_listener(lambda _conn: lost.set())
            await conn.add_listener(CHANNEL, self._notified)
            self.listening = True
            if warned:
                logger.info("listening for queued jobs again")
            self.wake()  # what was queued while nobody listened
            while not lost.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(lost.wait(), PING_SECONDS)
                if not lost.is_set():  # a link that died silently sends no FIN
                    await conn.fetchval("SELECT 1", timeout=PING_SECONDS)
        finally:
            self.listening = False
            if not conn.is_closed():
                conn.terminate()
