"""The user's export (`GET /v1/me/memory/export`): the one JSON document `MemoryExportOut`
describes, written as it is read from one snapshot, a batch of rows at a time, and one export of
a user at a time.

The snapshot is a REPEATABLE READ, READ ONLY transaction on a connection of its own (see
`app.kit.snapshots`), begun before the response starts, so that a refusal (another export of the
user running: 429) or a database outage (503) is still a problem+json answer. Every part of the
document is read through it, so the document shows the user at one instant whatever is written
meanwhile. Each kind of row is read with a server-side cursor, `TEXT_BATCH` rows of user text
(versions, messages) or `SMALL_BATCH` small rows at a time, and the JSON is written in chunks of
about `CHUNK_BYTES` into a spool (`app.kit.spool`), which the response sends at the client's
pace: memory holds a batch and a chunk, never the history, and the connection is given back as
soon as the snapshot is read, however slowly the client reads.

The bytes are the ones the route wrote when it returned the whole `MemoryExportOut`: the same
members in the same order, each value serialized by its own pydantic schema
(`tests/profiles/test_memory_export_stream.py` holds the two equal).

One export per user: while its snapshot is read, the transaction holds the user's export lock
(`export_repository.try_lock_export`, taken without waiting), on whichever replica it runs; the
lock goes with the transaction, which `MemoryExportStream.close` ends. While its file is sent,
the process sending it refuses another export of the user (`ReadSlots.sending`).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Callable
from contextlib import aclosing, asynccontextmanager
from dataclasses import dataclass
from typing import Any, Final

import anyio
import pydantic_core
from sqlalchemy import Row, Select
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncResult, AsyncSession

from app.enablement.audit import AuditRecord
from app.folders import service as folders
from app.folders.acl import Permission
from app.kit.db.engine import Database
from app.kit.errors import NotFound
from app.kit.principal import Principal
from app.kit.snapshots import begin_snapshot, end_snapshot
from app.kit.spool import ReadSlot, ReadSlots, Spool
from app.profiles import export_repository, repository
from app.profiles.errors import ExportInProgress
from app.profiles.export_repository import JobRecord, MessageRecord, TurnRecord
from app.profiles.policy_actions import PolicyActionRecord, every_policy_action
from app.profiles.schemas import (
    AuditEventOut,
    ChatMessageOut,
    ExportSettingsOut,
    JobOut,
    MemoryOut,
    PolicyActionOut,
    TurnOut,
    VersionOut,
)

TEXT_BATCH: Final = 50
"""Rows holding user text (versions, messages) fetched at a time: memory holds this many of the
largest such rows (a message is at most MAX_MESSAGE_CHARS)."""
SMALL_BATCH: Final = 1000
"""Rows of the small kinds (chat ids, turns, jobs, audit events, policy actions) at a time."""
CHUNK_BYTES: Final = 256 * 1024
"""The document is handed to the response in chunks of about this size (and one row more)."""
BUSY_RETRY_AFTER_SECONDS: Final = 5
"""`Retry-After` of the 429 when another export of the user is running: how long that one takes
is unknown here; a few seconds is what a large history needs."""

DOCUMENT_MEMBERS: Final = (
    "user_id",
    "company_id",
    "exported_at",
    "settings",
    "profile",
    "versions",
    "chats",
    "jobs",
    "audit_events",
    "policy_actions",
)
"""The document's members in the order written: `MemoryExportOut`'s fields, in their order."""


def _json(value: object) -> bytes:
    """`value` as pydantic writes it (a schema instance by its own schema), compact UTF-8."""
    return pydantic_core.to_json(value)


def _member(name: str) -> bytes:
    return _json(name) + b":"


class _Chunks:
    """The document's bytes not yet handed out, handed out once there are `CHUNK_BYTES`."""

    def __init__(self, start: bytes = b"") -> None:
        self._pending = bytearray(start)

    def write(self, data: bytes) -> None:
        self._pending += data

    def full(self) -> bool:
        return len(self._pending) >= CHUNK_BYTES

    def take(self) -> bytes:
        data = bytes(self._pending)
        self._pending.clear()
        return data


class _ChatRows:
    """The rows of a result ordered chat by chat (as `export_repository.chat_ids`), read one
    ahead: `next_of(chat)` is the next row if it belongs to that chat."""

    def __init__(self, result: AsyncResult[Any]) -> None:
        self._result = result
        self._ahead: Row[Any] | None = None
        self._started = False

    async def next_of(self, chat_id: str) -> Row[Any] | None:
        if not self._started:
            self._ahead = await self._result.fetchone()
            self._started = True
        row = self._ahead
        if row is None or row.chat_id != chat_id:
            return None
        self._ahead = await self._result.fetchone()
        return row

    async def exhausted(self) -> bool:
        """True when every row was taken (else the orders disagreed: a bug, not data)."""
        if self._started:
            return self._ahead is None
        return await self._result.fetchone() is None


@dataclass
class MemoryExportStream:
    """An open export: `chunks()` writes the document from the snapshot, `close()` ends the
    snapshot and with it the user's export lock (always call it, also when the client went
    away half-way)."""

    connection: AsyncConnection
    company_id: str
    user_id: str
    head: bytes
    """The document up to its first list: the members read when the export was opened."""
    memory_readable: bool
    """The access check allowed reading the memory: else versions and policy actions are empty,
    as the profile is null."""
    _closed: bool = False

    async def chunks(self) -> AsyncGenerator[bytes]:
        """The document, in chunks of about `CHUNK_BYTES`.

        A failure half-way ends the stream before the document does (the status was sent
        already): a reader sees JSON cut short, never a complete document missing rows.
        """
        lists: tuple[tuple[str, Callable[[_Chunks], AsyncGenerator[bytes]]], ...] = (
            ("versions", self._versions),
            ("chats", self._chats),
            ("jobs", self._jobs),
            ("audit_events", self._audit_events),
            ("policy_actions", self._policy_actions),
        )
        out = _Chunks(self.head)
        for name, write in lists:
            out.write(b"," + _member(name) + b"[")
            async with aclosing(write(out)) as written:
                async for chunk in written:
                    yield chunk
            out.write(b"]")
        out.write(b"}")
        yield out.take()

    async def write_to(self, spool: Spool) -> None:
        """The whole document into `spool` (see `chunks`)."""
        await spool.write_all(self.chunks())

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        await end_snapshot(self.connection)

    async def _rows(self, statement: Select[Any], batch: int) -> AsyncResult[Any]:
        result: AsyncResult[Any] = await self.connection.stream(
            statement, execution_options={"yield_per": batch}
        )
        return result

    async def _items(
        self,
        out: _Chunks,
        statement: Select[Any],
        batch: int,
        encode: Callable[[Row[Any]], bytes],
    ) -> AsyncGenerator[bytes]:
        """Each row of `statement` encoded, comma-separated, into `out`; its full chunks."""
        separator = b""
        async for row in await self._rows(statement, batch):
            out.write(separator)
            out.write(encode(row))
            separator = b","
            if out.full():
                yield out.take()

    def _versions(self, out: _Chunks) -> AsyncGenerator[bytes]:
        if not self.memory_readable:
            return _nothing()
        statement = repository.every_version(self.company_id, self.user_id)
        return self._items(out, statement, TEXT_BATCH, _version_json)

    def _jobs(self, out: _Chunks) -> AsyncGenerator[bytes]:
        statement = export_repository.jobs(self.company_id, self.user_id)
        return self._items(out, statement, SMALL_BATCH, _job_json)

    def _audit_events(self, out: _Chunks) -> AsyncGenerator[bytes]:
        statement = export_repository.audit_events(self.company_id, self.user_id)
        return self._items(out, statement, SMALL_BATCH, _audit_event_json)

    def _policy_actions(self, out: _Chunks) -> AsyncGenerator[bytes]:
        if not self.memory_readable:
            return _nothing()
        statement = every_policy_action(self.company_id, self.user_id)
        return self._items(out, statement, SMALL_BATCH, _policy_action_json)

    async def _chats(self, out: _Chunks) -> AsyncGenerator[bytes]:
        """`ChatOut`s by first activity: three cursors in the same chat order (the chats, the
        turns, the messages), the turns and messages of each chat taken as its entry is written."""
        company_id, user_id = self.company_id, self.user_id
        chats = await self._rows(export_repository.chat_ids(company_id, user_id), SMALL_BATCH)
        turns = _ChatRows(
            await self._rows(export_repository.chat_turns(company_id, user_id), SMALL_BATCH)
        )
        messages = _ChatRows(
            await self._rows(export_repository.chat_messages(company_id, user_id), TEXT_BATCH)
        )
        separator = b""
        async for chat_id in chats.scalars():
            out.write(separator + b'{"chat_id":' + _json(chat_id) + b',"turns":[')
            separator = b","
            inner = b""
            while (row := await turns.next_of(chat_id)) is not None:
                out.write(inner + _turn_json(row))
                inner = b","
                if out.full():
                    yield out.take()
            out.write(b'],"messages":[')
            inner = b""
            while (row := await messages.next_of(chat_id)) is not None:
                out.write(inner + _message_json(row))
                inner = b","
                if out.full():
                    yield out.take()
            out.write(b"]}")
        if not (await turns.exhausted() and await messages.exhausted()):
            raise RuntimeError("the export's chat, turn and message orders disagree")


async def _nothing() -> AsyncGenerator[bytes]:
    return
    yield  # an async generator that yields nothing


def _version_json(row: Row[Any]) -> bytes:
    return _json(VersionOut.model_validate(repository.version_row(row)))


def _turn_json(row: Row[Any]) -> bytes:
    return _json(TurnOut.model_validate(TurnRecord(**row._mapping)))


def _message_json(row: Row[Any]) -> bytes:
    return _json(ChatMessageOut.model_validate(MessageRecord(**row._mapping)))


def _job_json(row: Row[Any]) -> bytes:
    return _json(JobOut.model_validate(JobRecord(**row._mapping)))


def _audit_event_json(row: Row[Any]) -> bytes:
    return _json(AuditEventOut.model_validate(AuditRecord(**row._mapping)))


def _policy_action_json(row: Row[Any]) -> bytes:
    return _json(PolicyActionOut.of(PolicyActionRecord(**row._mapping)))


def take_slot(slots: ReadSlots, principal: Principal) -> ReadSlot:
    """The export's read slot, its user counted as sending until the slot ends. Raises
    `ExportInProgress` when an export of the user is still sent by this process,
    `CompanyExportsBusy` when the company has all its read slots, `ExportsBusy` when the
    process has none left."""
    owner = ("user-memory-export", principal.company_id, principal.user_id)
    if slots.sending(owner):
        raise ExportInProgress(BUSY_RETRY_AFTER_SECONDS)
    return slots.take(principal.company_id, owner)


async def open_export(database: Database, principal: Principal) -> MemoryExportStream:
    """Begin the caller's export: the snapshot, the user's export lock, and the document's
    members before its lists, all filtered by the token's (company, user).

    Raises `ExportInProgress` (with `Retry-After`) when another export of the user holds the
    lock. The profile, versions and the memory policy's actions come only through the access
    check; a caller without a memory folder (never used, or opted out) still gets settings,
    chats and jobs, with `profile` null. The caller must `close()` the stream.
    """
    company_id, user_id = principal.company_id, principal.user_id
    connection = await begin_snapshot(database)
    try:
        async with _session_on(connection) as session:
            exported_at = await export_repository.snapshot_time(session, company_id, user_id)
            if not await export_repository.try_lock_export(session, company_id, user_id):
                raise ExportInProgress(BUSY_RETRY_AFTER_SECONDS)
            profile = None
            try:
                await folders.authorize_memory_access(session, principal, Permission.READ)
            except NotFound:
                readable = False
            else:
                readable = True
                profile = await repository.read_head(session, company_id, user_id)
            setting = await repository.select_user_setting(session, company_id, user_id)
    except BaseException:
        await end_snapshot(connection)
        raise
    members: dict[str, object] = {
        "user_id": user_id,
        "company_id": company_id,
        "exported_at": exported_at,
        "settings": ExportSettingsOut(context_memory=setting is not False),
        "profile": None if profile is None else MemoryOut.of(profile),
    }
    head = b"{" + b",".join(_member(name) + _json(value) for name, value in members.items())
    return MemoryExportStream(connection, company_id, user_id, head, readable)


@asynccontextmanager
async def _session_on(connection: AsyncConnection) -> AsyncIterator[AsyncSession]:
    """A session on the snapshot's connection, for the services that take one. It joins the
    connection's transaction and leaves it (and its lock) as it is when closed."""
    session = AsyncSession(bind=connection)
    try:
        yield session
    finally:
        with anyio.CancelScope(shield=True):
            await session.close()
