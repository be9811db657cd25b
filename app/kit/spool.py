"""Long responses that hold no database connection while the client reads: the snapshot is
read into a temporary file as fast as the database serves it, and the file is sent at the
client's pace.

A `SpooledResponse` starts a reader task when the response starts: it reads the snapshot (its
`fill` writes the body into a `Spool`) and then ends the snapshot (`release`), which gives the
connection back. Meanwhile the response sends what the file holds so far, waiting for more when
it has caught up. A client that reads slowly, or not at all, holds a file (in memory up to
`SPOOL_MEMORY_BYTES`, on disk beyond it), never a connection nor a transaction: the connection
is held as long as the database takes to read the snapshot, whoever reads the response.

Bounds:

- `ReadSlots`: at most so many snapshots read at once per process, and fewer for one company;
  past either the export is refused before it starts (503 for the process's, 429 for the
  company's: it is that company's own load), with `Retry-After`. So concurrent exports cannot
  take the pool that serves everything else either.
- The send deadline: a client that does not take each piece sent (`SEND_CHUNK_BYTES`, and
  what the server buffers) within `send_timeout` seconds, i.e. one that stalls or reads slower
  than about `SEND_CHUNK_BYTES / send_timeout`, is cut off (the connection closed mid-body,
  so it reads as cut, never as complete), and the file deleted.
- A failure of the reader half-way ends the body where the file ends: a cut body, never a
  complete one missing rows.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import tempfile
import weakref
from collections.abc import (
    AsyncGenerator,
    AsyncIterable,
    AsyncIterator,
    Awaitable,
    Callable,
    Mapping,
)
from typing import Final

import anyio
from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.types import Message, Receive, Scope, Send

from app.kit.errors import CompanyExportsBusy, ExportsBusy

logger = logging.getLogger("app.kit.spool")

SPOOL_MEMORY_BYTES: Final = 1024 * 1024
"""A spool's bytes kept in memory; beyond them the spool is a file on disk (the process's
resident set does not grow with the body)."""
SEND_CHUNK_BYTES: Final = 256 * 1024
"""Bytes handed to the server in one send."""
READ_BUSY_RETRY_AFTER_SECONDS: Final = 5
"""`Retry-After` when every read slot (of the process or of the company) is taken: reading a
snapshot takes seconds, not minutes."""


class ReadSlots:
    """How many snapshots are read into spools at once in this process: at most `total`, and
    at most `per_company` of one company. Taken without waiting (a full house is a refusal, not a
    queue of requests each holding a socket), given back when the snapshot is read."""

    def __init__(self, total: int, per_company: int) -> None:
        self.total = total
        self.per_company = per_company
        self._by_company: dict[str, int] = {}
        self._owners: set[object] = set()

    @property
    def taken(self) -> int:
        return sum(self._by_company.values())

    def sending(self, owner: object) -> bool:
        """A response taken for `owner` (see `take`) has not ended yet in this process."""
        return owner in self._owners

    def take(self, company_id: str, owner: object = None) -> ReadSlot:
        """A slot for one snapshot of `company_id`; raises `CompanyExportsBusy` when the company
        has all of its own, `ExportsBusy` when the process has none left. `owner` (if
        given) counts as `sending` until the slot's `end()`."""
        if self._by_company.get(company_id, 0) >= self.per_company:
            raise CompanyExportsBusy(self.per_company, READ_BUSY_RETRY_AFTER_SECONDS)
        if self.taken >= self.total:
            raise ExportsBusy(READ_BUSY_RETRY_AFTER_SECONDS)
        self._by_company[company_id] = self._by_company.get(company_id, 0) + 1
        if owner is not None:
            self._owners.add(owner)
        return ReadSlot(self, company_id, owner)

    def _give_back(self, company_id: str) -> None:
        left = self._by_company[company_id] - 1
        if left:
            self._by_company[company_id] = left
        else:
            del self._by_company[company_id]


def read_slots(request: Request) -> ReadSlots:
    """The process's `ReadSlots` (made by the app factory)."""
    slots: ReadSlots = request.app.state.export_slots
    return slots


def send_timeout(request: Request) -> float:
    """EXPORT_SEND_TIMEOUT_SECONDS of the app serving `request`."""
    seconds: float = request.app.state.settings.export_send_timeout_seconds
    return seconds


class ReadSlot:
    """One snapshot's place among the `ReadSlots`: `release()` when it is read, `end()` when its
    response has ended (releasing it too, if it was not yet)."""

    def __init__(self, slots: ReadSlots, company_id: str, owner: object) -> None:
        self._slots = slots
        self._company_id = company_id
        self._owner = owner
        self._reading = True

    def release(self) -> None:
        """The snapshot is read: give its place back (once; later calls do nothing)."""
        if self._reading:
            self._reading = False
            self._slots._give_back(self._company_id)

    def end(self) -> None:
        """The response has ended: its owner is no longer `sending`."""
        self.release()
        if self._owner is not None:
            self._slots._owners.discard(self._owner)
            self._owner = None


class SpoolCut(Exception):
    """The reader of a spool failed before the body was complete (logged by the reader with its
    cause; the server's traceback of this one, which only ends the response, is dropped)."""

    logged = True


class Spool:
    """A body written by one reader task and sent by one response, each at its own pace: in
    memory up to `SPOOL_MEMORY_BYTES`, in an unnamed temporary file beyond (deleted when closed,
    or when the process ends)."""

    def __init__(self) -> None:
        self._file = tempfile.SpooledTemporaryFile(max_size=SPOOL_MEMORY_BYTES)  # noqa: SIM115
        self._size = 0
        self._done = False
        self._failed = False
        self._grown = asyncio.Event()

    @property
    def size(self) -> int:
        return self._size

    def write(self, data: bytes) -> None:
        if data:
            self._file.seek(0, 2)
            self._file.write(data)
            self._size += len(data)
            self._grown.set()

    async def write_all(self, chunks: AsyncGenerator[bytes]) -> None:
        """Every chunk of `chunks`, written as it comes; the generator is closed however this
        ends (its snapshot's cursors with it)."""
        async with contextlib.aclosing(chunks) as pieces:
            async for chunk in pieces:
                self.write(chunk)

    def finish(self, *, failed: bool = False) -> None:
        """Nothing more will be written; `failed`: the body is incomplete."""
        self._done = True
        self._failed = failed
        self._grown.set()

    async def read(self, offset: int, limit: int) -> bytes:
        """Up to `limit` bytes from `offset`, waiting until there are some; b"" at the end of a
        complete body. Raises `SpoolCut` at the end of an incomplete one."""
        while True:
            if offset < self._size:
                self._file.seek(offset)
                return self._file.read(min(limit, self._size - offset))
            if self._done:
                if self._failed:
                    raise SpoolCut
                return b""
            self._grown.clear()
            await self._grown.wait()

    def close(self) -> None:
        self._file.close()


class ClientTooSlow(Exception):
    """The client did not take a piece of the body within the send deadline. Logged here, once,
    as a warning; the server's own traceback of it is dropped (`app.kit.observability`)."""

    logged = True


class SpooledResponse(StreamingResponse):
    """A body written by `fill` into a spool by a task of its own, sent from the spool.

    `release` (ending the snapshot, giving its read slot back) is awaited as soon as `fill`
    returns or fails, or the response ends first (the client gone, or too slow), shielded from
    cancellation; the spool is deleted when the response ends, however it ends.

    Build it last in a route, right before returning it: the slot and the snapshot are the
    response's to end from then on."""

    def __init__(  # noqa: PLR0913 - all but the first three by keyword
        self,
        fill: Callable[[Spool], Awaitable[None]],
        release: Callable[[], Awaitable[None]],
        slot: ReadSlot,
        *,
        send_timeout: float,
        what: str,
        media_type: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        """`slot` is released with the snapshot and ended with the response; `what` names the
        body in the log lines."""
        self._fill = fill
        self._release = release
        self._slot = slot
        self._released = False
        # a response never sent (e.g. the request's commit failed after the route returned)
        # still gives its slot back when it is collected
        weakref.finalize(self, slot.end)
        self._send_timeout = send_timeout
        self._what = what
        self._spool = Spool()
        super().__init__(self._sent(), media_type=media_type, headers=headers)

    async def _sent(self) -> AsyncGenerator[bytes]:
        offset = 0
        while chunk := await self._spool.read(offset, SEND_CHUNK_BYTES):
            offset += len(chunk)
            yield chunk
        self._slot.end()  # before the body's end is sent: its reader may ask again at once

    async def _read(self) -> None:
        failed = True
        try:
            await self._fill(self._spool)
            failed = False
        except Exception:
            logger.exception("reading %s failed half-way; its body is cut there", self._what)
        finally:
            try:
                await self._release_once()
            finally:  # after the release: a client that has the whole body finds it done
                self._spool.finish(failed=failed)

    async def _release_once(self) -> None:
        """End the snapshot and give its read slot back, once, shielded from cancellation."""
        if self._released:
            return
        self._released = True
        with anyio.CancelScope(shield=True):
            try:
                await self._release()
            finally:
                self._slot.release()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        reader = asyncio.create_task(self._read(), name=f"spool {self._what}")
        try:
            await super().__call__(scope, receive, self._send_within_deadline(send))
        finally:
            with anyio.CancelScope(shield=True):
                reader.cancel()  # a client gone: the snapshot is not read on for nobody
                with contextlib.suppress(asyncio.CancelledError):
                    await reader
                await self._release_once()  # a reader cancelled before it began
                self._spool.close()
                self._slot.end()

    def _send_within_deadline(self, send: Send) -> Send:
        async def send_within_deadline(message: Message) -> None:
            try:
                async with asyncio.timeout(self._send_timeout):
                    await send(message)
            except TimeoutError:
                logger.warning(
                    "a client took too little of %s in %s s; cut off",
                    self._what,
                    self._send_timeout,
                )
                raise ClientTooSlow(self._what) from None

        return send_within_deadline


@contextlib.asynccontextmanager
async def spooled_body(body: AsyncIterable[bytes]) -> AsyncIterator[AsyncIterator[bytes]]:
    """A request body received whole into a temporary file (in memory up to
    `SPOOL_MEMORY_BYTES`, on disk beyond) before it is handed on, then read back in
    `SEND_CHUNK_BYTES` pieces: so a route that loads a body in one transaction opens it only
    once a slow sender has sent everything. The body's own limits (size, time per piece) apply
    as it is received; the file is deleted when the block ends."""
    with tempfile.SpooledTemporaryFile(max_size=SPOOL_MEMORY_BYTES) as file:
        async for chunk in body:
            file.write(chunk)
        file.seek(0)

        async def pieces() -> AsyncIterator[bytes]:
            while piece := file.read(SEND_CHUNK_BYTES):
                yield piece

        yield pieces()
