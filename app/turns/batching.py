"""Group commit for the common turn-save: the turn-saves that concurrent requests hand in while
the database is busy are written together, in one statement (`repository.save_common_turns`).

A turn-save's database cost is mostly fixed per statement (docs/benchmarks.md): written eight
at a time, a turn costs about half the database CPU it costs alone. The batcher adds no wait of
its own: a turn handed in while no statement of this process runs goes at once (alone, in the
one-turn statement); while one runs, turns gather, and the next statement to start takes the
longest-waiting one and the others of its company (up to `TURN_BATCH_MAX`). It starts when the
running one ends, or beside it once a quarter of `TURN_BATCH_MAX` turns wait, as long as fewer
than `TURN_BATCH_IN_FLIGHT` run. A statement beside the running one lets the process prepare
and answer one batch while the database writes the other (at 16 requests in flight, 1.2-1.4x
the turn-saves per second of one statement at a time, in the same runs); waiting for a quarter
batch keeps it from being a statement of a turn or two, which costs the database nearly what a
full one costs. And a statement that waits for a lock (an erasure of one of its users) does not
hold up every turn-save of the process. So batches form exactly when the database is the
bottleneck, and grow with the load. A batch holds one company's turns: every table its statement
touches is pinned to that company, as on a cluster distributed by company (docs/scaling.md).

A batch is one transaction: all its turns are written, or none. When its statement fails, each
of its turns is written again on its own by its own request (`ALONE`), so a failure is met only
by the turn that causes it, with the error its request would have met alone.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from enum import Enum
from typing import Final, Literal

import asyncpg

from app.quotas.rule import QuotaLimits
from app.turns.repository import CommonTurn, CommonTurnSave, save_common_turn, save_common_turns


class Alone(Enum):
    ALONE = "the batch failed: save the turn on its own"


ALONE: Final = Alone.ALONE

Connect = Callable[[], AbstractAsyncContextManager[asyncpg.Connection]]


@dataclass
class _Waiting:
    turn: CommonTurn
    done: asyncio.Future[CommonTurnSave | Literal[Alone.ALONE]]


class TurnBatcher:
    """Writes the common turn-saves handed to `save`, several to a statement while the database
    is busy; `connect` opens a driver connection (`DriverPool.connection`)."""

    def __init__(  # noqa: PLR0913 - the connection and limits, then keyword options
        self,
        connect: Connect,
        limits: QuotaLimits,
        *,
        max_batch: int,
        in_flight: int,
        observe: Callable[[int], None] | None = None,
        citus: Callable[[], Awaitable[bool]] | None = None,
    ) -> None:
        if max_batch < 1 or in_flight < 1:
            raise ValueError("a batch holds at least one turn, and one may be in flight")
        self.observe = observe
        """Called with the number of turns of each statement as it starts (a metric)."""
        self._connect = connect
        self._citus = citus
        """Whether the database is a Citus coordinator (asked at the first batch, then known):
        both statements have a form for it."""
        self._limits = limits
        self._max_batch = max_batch
        self._max_in_flight = in_flight
        self._beside = max(1, max_batch // 4)  # see the module's docstring
        self._waiting: deque[_Waiting] = deque()
        self._running: set[asyncio.Task[None]] = set()

    async def save(self, turn: CommonTurn) -> CommonTurnSave | Literal[Alone.ALONE]:
        """What `save_common_turn` answers for `turn`, written with the turns handed in beside
        it; `ALONE` when their statement failed: nothing of it was written, and the caller
        saves the turn on its own."""
        done: asyncio.Future[CommonTurnSave | Literal[Alone.ALONE]]
        done = asyncio.get_running_loop().create_future()
        self._waiting.append(_Waiting(turn, done))
        self._start()
        return await done

    def _start(self) -> None:
        while self._waiting and len(self._running) < self._max_in_flight:
            if self._running and len(self._waiting) < self._beside:
                return
            batch = self._next_batch()
            if self.observe is not None:
                self.observe(len(batch))
            task = asyncio.create_task(self._write(batch))
            self._running.add(task)
            task.add_done_callback(self._finished)

    def _next_batch(self) -> list[_Waiting]:
        """The longest-waiting turn and those of its company handed in after it, up to the
        limit; the others keep their places."""
        company = self._waiting[0].turn.turn.company_id
        batch: list[_Waiting] = []
        others: list[_Waiting] = []
        while self._waiting and len(batch) < self._max_batch:
            waiting = self._waiting.popleft()
            (batch if waiting.turn.turn.company_id == company else others).append(waiting)
        self._waiting.extendleft(reversed(others))
        return batch

    def _finished(self, task: asyncio.Task[None]) -> None:
        self._running.discard(task)
        self._start()

    async def _write(self, batch: list[_Waiting]) -> None:
        turns = [waiting.turn for waiting in batch]
        try:
            citus = self._citus is not None and await self._citus()
            async with self._connect() as conn:
                if len(turns) == 1:
                    results = [
                        await save_common_turn(conn, turns[0], limits=self._limits, citus=citus)
                    ]
                else:
                    results = await save_common_turns(conn, turns, limits=self._limits, citus=citus)
            for waiting, result in zip(batch, results, strict=True):
                _settle(waiting.done, result)
        except Exception as error:  # each request meets its own error alone
            if len(batch) == 1:
                _settle(batch[0].done, error)
        finally:  # failed, or cancelled with the process: whoever still waits saves alone
            for waiting in batch:
                _settle(waiting.done, ALONE)


def _settle(
    done: asyncio.Future[CommonTurnSave | Literal[Alone.ALONE]],
    outcome: CommonTurnSave | Literal[Alone.ALONE] | Exception,
) -> None:
    """Hand a request its outcome, unless it stopped waiting (its client went away)."""
    if done.done():
        return
    if isinstance(outcome, Exception):
        done.set_exception(outcome)
    else:
        done.set_result(outcome)
