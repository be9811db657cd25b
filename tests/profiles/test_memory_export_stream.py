"""`GET /v1/me/memory/export` streamed: the same document as the whole `MemoryExportOut` was,
byte for byte; one snapshot; one export of a user at a time (429 for the next, on any replica),
the lock and the connection freed once the snapshot is read, whoever reads the response, and
however the stream ends; and memory that does not grow with the history."""

from __future__ import annotations

import asyncio
import json
import socket
import tracemalloc
from collections.abc import AsyncIterator
from contextlib import aclosing
from datetime import datetime
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from pydantic import TypeAdapter
from sqlalchemy import text

from app.kit.errors import PROBLEM_CONTENT_TYPE
from app.kit.principal import Principal
from app.kit.spool import ReadSlots, Spool
from app.main import create_app
from app.profiles.document import Section
from app.profiles.export import (
    BUSY_RETRY_AFTER_SECONDS,
    DOCUMENT_MEMBERS,
    MemoryExportStream,
    open_export,
)
from app.profiles.schemas import MemoryExportOut
from bench.export_memory import COMPANY, plain_dsn, seed_histories
from tests.helpers.apps import AuthFactory, client_with, make_settings
from tests.helpers.db import admin_fetchval, database_of, rows, sessions, statements
from tests.helpers.memory import ME, create, replace
from tests.helpers.polling import wait_until
from tests.helpers.profiles import memory_md
from tests.helpers.serving import served

EXPORT = f"{ME}/export"
DOCUMENT = TypeAdapter(MemoryExportOut)

# Chats whose first activity ties, and ids whose order differs between collations.
CHAT_SQL = """
INSERT INTO turns (company_id, id, user_id, chat_id, space_id, history_mode, language_model,
                   created_at) VALUES
 ('acme', '00000000-0000-0000-0000-00000000000a', :u, 'chat-b', 'space-1', 'auto', NULL,
  '2026-11-01 10:00:00+00'),
 ('acme', '00000000-0000-0000-0000-00000000000b', :u, 'chat-a', 'space-1', 'full', 'gpt-x',
  '2026-11-01 10:00:00+00'),
 ('acme', '00000000-0000-0000-0000-00000000000c', :u, 'chat.a', 'space-2', 'auto', NULL,
  '2026-11-01 10:00:00+00'),
 ('acme', '00000000-0000-0000-0000-00000000000d', :u, 'Chat-Z', 'space-1', 'auto', NULL,
  '2026-11-01 10:00:00+00'),
 ('acme', '00000000-0000-0000-0000-00000000000e', :u, 'chat-b', 'space-1', 'auto', NULL,
  '2026-11-01 09:00:00.123456+00'),
 ('acme', '00000000-0000-0000-0000-00000000000f', :u, 'chat-late', 'space-1', 'auto', NULL,
  '2026-11-03 10:00:00+00'),
 ('acme', '00000000-0000-0000-0000-000000000010', 'someone-else', 'chat-a', 'space-1', 'auto',
  NULL, '2026-10-01 10:00:00+00');
INSERT INTO chat_messages (company_id, user_id, chat_id, turn_id, role, content, source, tokens,
                           created_at) VALUES
 ('acme', :u, 'chat-b', '00000000-0000-0000-0000-00000000000a', 'user',
  E'quote " backslash \\\\ newline \\n tab \\t ctrl \\x01 emoji \U0001f600 grüße </script> \\u2028',
  'request', 3, '2026-11-01 10:00:01+00'),
 ('acme', :u, 'chat-a', '00000000-0000-0000-0000-00000000000b', 'assistant', 'plain',
  'response', 1, '2026-11-01 10:00:02+00'),
 ('acme', :u, 'chat-late', '00000000-0000-0000-0000-00000000000f', 'user',
  'older than its turn', 'request', 1, '2026-10-01 10:00:00+00'),
 ('acme', :u, 'chat-only-messages', '00000000-0000-0000-0000-0000000000ff', 'system', '',
  'placeholder', 0, '2026-11-02 10:00:00+00'),
 ('acme', :u, 'chat-b', '00000000-0000-0000-0000-00000000000e', 'user', 'later id, older time',
  'request', 1, '2026-11-01 08:00:00+00'),
 ('acme', 'someone-else', 'chat-a', '00000000-0000-0000-0000-000000000010', 'user',
  'not yours', 'request', 1, '2026-10-01 10:00:00+00');
INSERT INTO jobs (company_id, id, user_id, kind, status, outcome, version, max_attempts, payload,
                  created_at, finished_at) VALUES
 ('acme', '00000000-0000-0000-0000-0000000000a1', :u, 'consolidation', 'succeeded', 'updated',
  1, 5, '{"payload": "never exported"}', '2026-11-01 10:00:00+00', '2026-11-01 10:00:05.5+00'),
 ('acme', '00000000-0000-0000-0000-0000000000a2', :u, 'consolidation', 'queued', NULL, NULL, 5,
  '{}', '2026-11-01 10:00:00+00', NULL);
INSERT INTO memory_policy_actions (company_id, user_id, occurred_at, version, reason, category,
                                   kind, action, section, source_turn_ids, job_id) VALUES
 ('acme', :u, '2026-11-01 10:00:00+00', 1, 'consolidation', 'secrets', 'password', 'drop',
  'Identity', '["t1", "t2"]', '00000000-0000-0000-0000-0000000000a1'),
 ('acme', :u, '2026-11-01 10:00:01+00', NULL, 'user_edit', 'retired_category', 'x', 'redact',
  'Work Context', '[]', NULL);
"""


async def seed_everything(client: httpx.AsyncClient, app: FastAPI, headers: dict[str, str]) -> str:
    """Settings changed twice, two versions with text JSON escapes, chats, jobs and policy
    actions of every shape; returns the user's id."""
    user = "exporter"
    for on in (False, True):
        response = await client.patch(
            "/v1/me/settings", json={"context_memory": on}, headers=headers
        )
        assert response.status_code == 200, response.text
    work = ['Zoë "Z" Ünal \U0001f600 uses C:\\paths']
    assert (await create(client, headers, memory_md({Section.WORK: work}))).status_code == 201
    second = await replace(client, headers, memory_md({Section.WORK: [*work, "second"]}), 1)
    assert second.status_code == 200, second.text
    async with sessions(app)() as session, session.begin():
        for statement in CHAT_SQL.split(";\n"):
            if statement.strip():
                await session.execute(text(statement), {"u": user})
    return user


def chats_as_they_were_grouped(
    turns: list[dict[str, Any]], messages: list[dict[str, Any]]
) -> list[tuple[str, list[str], list[int]]]:
    """(chat id, turn ids, message ids) as the export grouped them before it streamed: in Python,
    by first activity then id, from turns ordered by (created_at, id) and messages by id."""
    first: dict[str, datetime] = {}
    for row in [*turns, *messages]:
        at = row["created_at"]
        first[row["chat_id"]] = min(first.get(row["chat_id"], at), at)
    return [
        (
            chat_id,
            [str(t["id"]) for t in turns if t["chat_id"] == chat_id],
            [m["id"] for m in messages if m["chat_id"] == chat_id],
        )
        for chat_id in sorted(first, key=lambda chat_id: (first[chat_id], chat_id))
    ]


async def test_the_stream_is_the_documents_own_json_byte_for_byte(
    client: httpx.AsyncClient, auth: AuthFactory, app: FastAPI
) -> None:
    user = await seed_everything(client, app, auth("exporter"))

    response = await client.get(EXPORT, headers=auth(user))

    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    body = response.content
    # what FastAPI wrote for a returned MemoryExportOut: pydantic's JSON of the whole document
    assert DOCUMENT.dump_json(DOCUMENT.validate_json(body)) == body
    export = json.loads(body)
    assert tuple(export) == DOCUMENT_MEMBERS == tuple(MemoryExportOut.model_fields)
    assert [v["version"] for v in export["versions"]] == [1, 2]
    assert export["profile"]["version"] == 2
    assert '"Z" Ünal \U0001f600' in export["profile"]["content"]
    assert [a["category"] for a in export["policy_actions"]] == ["secrets", "retired_category"]
    assert [j["id"][-2:] for j in export["jobs"]] == ["a1", "a2"]
    assert "never exported" not in response.text
    assert [e["action"] for e in export["audit_events"]] == ["user_settings.update"] * 2

    owned = "WHERE company_id = 'acme' AND user_id = :u"
    turns = await rows(app, f"SELECT * FROM turns {owned} ORDER BY created_at, id", u=user)  # noqa: S608
    messages = await rows(app, f"SELECT * FROM chat_messages {owned} ORDER BY id", u=user)  # noqa: S608
    expected = chats_as_they_were_grouped(
        [dict(t._mapping) for t in turns], [dict(m._mapping) for m in messages]
    )
    streamed = [
        (chat["chat_id"], [t["id"] for t in chat["turns"]], [m["id"] for m in chat["messages"]])
        for chat in export["chats"]
    ]
    assert streamed == expected
    assert [chat_id for chat_id, _, _ in streamed] == [
        "chat-late",
        "chat-b",
        "Chat-Z",
        "chat-a",
        "chat.a",
        "chat-only-messages",
    ]
    assert "not yours" not in response.text


async def test_a_caller_without_memory_gets_the_rest_with_empty_memory_lists(
    client: httpx.AsyncClient, auth: AuthFactory, app: FastAPI
) -> None:
    await seed_everything(client, app, auth("exporter"))
    response = await client.get(EXPORT, headers=auth("someone-else"))

    export = response.json()
    assert DOCUMENT.dump_json(DOCUMENT.validate_json(response.content)) == response.content
    assert (export["profile"], export["versions"], export["policy_actions"]) == (None, [], [])
    assert [[m["content"] for m in chat["messages"]] for chat in export["chats"]] == [["not yours"]]


async def test_the_export_is_one_snapshot_whatever_is_written_meanwhile(
    app: FastAPI, client: httpx.AsyncClient, auth: AuthFactory
) -> None:
    user = await seed_everything(client, app, auth("exporter"))
    stream = await open_export(database_of(app), Principal(user, COMPANY, frozenset()))
    try:
        isolation = await stream.connection.execute(text("SHOW transaction_isolation"))
        read_only = await stream.connection.execute(text("SHOW transaction_read_only"))
        assert (isolation.scalar_one(), read_only.scalar_one()) == ("repeatable read", "on")
        async with sessions(app)() as session, session.begin():
            await session.execute(
                text(
                    "INSERT INTO chat_messages (company_id, user_id, chat_id, turn_id, role,"
                    " content, source, tokens) VALUES ('acme', :u, 'chat-new',"
                    " '00000000-0000-0000-0000-000000000099', 'user', 'during the export',"
                    " 'request', 1)"
                ),
                {"u": user},
            )
        third = await replace(client, auth(user), memory_md({Section.WORK: ["third"]}), 2)
        assert third.status_code == 200, third.text
        body = b"".join([chunk async for chunk in stream.chunks()])
    finally:
        await stream.close()

    export = json.loads(body)
    assert b"during the export" not in body
    assert "chat-new" not in [chat["chat_id"] for chat in export["chats"]]
    assert [v["version"] for v in export["versions"]] == [1, 2]
    assert export["profile"]["version"] == 2


async def test_the_exports_first_statement_reads_a_table_of_the_company(app: FastAPI) -> None:
    """On a Citus cluster the snapshot on the node holding the company starts with the first
    statement that reaches it: the export's first one reads the user's settings row, so the
    document shows that node as of the export's opening, not of a later read (the export lock,
    taken next, runs on the coordinator)."""
    with statements(app) as seen:
        stream = await open_export(database_of(app), Principal("reader", COMPANY, frozenset()))
        await stream.close()
    assert "FROM user_settings" in seen[0], seen[:3]
    assert "pg_try_advisory_xact_lock" in seen[1], seen[:3]


# --- one export of a user at a time ------------------------------------------------------------


def _assert_busy(response: httpx.Response) -> None:
    assert response.status_code == 429, f"{response.status_code}: {response.text[:300]}"
    assert response.headers["content-type"] == PROBLEM_CONTENT_TYPE
    assert response.headers["retry-after"] == str(BUSY_RETRY_AFTER_SECONDS)
    problem = response.json()
    assert (problem["status"], problem["type"]) == (429, "urn:context-memory:problem:rate-limited")
    assert problem["detail"].startswith("Another export of your memory is running")


async def test_a_second_export_of_the_same_user_is_refused_on_any_replica_others_run(
    app: FastAPI, client: httpx.AsyncClient, auth: AuthFactory, database_url: str
) -> None:
    running = await open_export(database_of(app), Principal("busy-user", COMPANY, frozenset()))
    try:
        _assert_busy(await client.get(EXPORT, headers=auth("busy-user")))
        async with client_with(database_url) as other_replica:
            _assert_busy(await other_replica.get(EXPORT, headers=auth("busy-user")))
        assert (await client.get(EXPORT, headers=auth("other-user"))).status_code == 200
        elsewhere = await client.get(EXPORT, headers=auth("busy-user", "globex"))
        assert elsewhere.status_code == 200
    finally:
        await running.close()

    assert (await client.get(EXPORT, headers=auth("busy-user"))).status_code == 200


async def _export_lock_holders(database_url: str) -> int:
    """Backends of the test database holding an advisory lock (only exports take one here)."""
    count: int = await admin_fetchval(
        database_url,
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted"
        " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
    )
    return count


async def _settled(app: FastAPI, database_url: str) -> None:
    """Wait (at most 5 s) until no export holds a lock, a pooled connection or a read slot."""
    pool = database_of(app).engine.pool

    async def settled() -> bool:
        connections: int = pool.checkedout()  # type: ignore[attr-defined]
        idle = read_slots_of(app).taken == 0 and connections == 0
        return idle and await _export_lock_holders(database_url) == 0

    await wait_until(settled, 5, what="no export holding its lock, its connection or its slot")


def read_slots_of(app: FastAPI) -> ReadSlots:
    slots: ReadSlots = app.state.export_slots
    return slots


def _small_window_client(base_url: str) -> httpx.AsyncClient:
    """A client whose sockets take at most 64 KiB before it reads (no receive-buffer
    autotuning, which on loopback would take tens of MiB): the server is still mid-stream
    after the first chunk for as long as the client does not read on."""
    window = [(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)]
    transport = httpx.AsyncHTTPTransport(socket_options=window)
    return httpx.AsyncClient(base_url=base_url, timeout=60, transport=transport)


@pytest.fixture
async def served_app(database_url: str) -> AsyncIterator[tuple[FastAPI, str]]:
    """The app served for real (uvicorn on 127.0.0.1), so a client can go away mid-stream."""
    application = create_app(make_settings(database_url))
    async with served(application) as base_url:
        yield application, base_url


@pytest.fixture
def paused_read(monkeypatch: pytest.MonkeyPatch) -> asyncio.Event:
    """Exports read from then on stop reading their snapshot after its first chunk, until the
    event is set: the test acts while a snapshot is being read."""
    resume = asyncio.Event()

    async def write_then_wait(self: MemoryExportStream, spool: Spool) -> None:
        async with aclosing(self.chunks()) as chunks:
            async for chunk in chunks:
                spool.write(chunk)
                await resume.wait()

    monkeypatch.setattr(MemoryExportStream, "write_to", write_then_wait)
    return resume


async def test_a_client_that_stops_reading_holds_no_connection_nor_lock(
    served_app: tuple[FastAPI, str], auth: AuthFactory, database_url: str
) -> None:
    await seed_histories(plain_dsn(database_url), ["slow"], mib_per_user=16)
    application, base_url = served_app
    async with _small_window_client(base_url) as http:
        async with http.stream("GET", EXPORT, headers=auth("slow")) as response:
            assert response.status_code == 200
            chunks = response.aiter_raw()  # held: closing it would close the connection
            assert await anext(chunks)  # the first chunk; 16 MiB are still to come
            # the snapshot is read to its end while the client reads nothing more: its
            # connection, lock and read slot are free, the export still being sent
            await _settled(application, database_url)
            _assert_busy(await http.get(EXPORT, headers=auth("slow")))  # still one at a time
            received = len(await anext(chunks))
            async for chunk in chunks:
                received += len(chunk)
        assert received > 15 * 2**20

        again = await http.get(EXPORT, headers=auth("slow"))
    assert again.status_code == 200
    assert len(json.loads(again.content)["chats"]) == 40


async def test_a_client_gone_mid_stream_frees_the_lock_and_the_connection(
    served_app: tuple[FastAPI, str],
    auth: AuthFactory,
    database_url: str,
    paused_read: asyncio.Event,
) -> None:
    await seed_histories(plain_dsn(database_url), ["leaver"], mib_per_user=16)
    application, base_url = served_app
    async with _small_window_client(base_url) as http:
        async with http.stream("GET", EXPORT, headers=auth("leaver")) as response:
            assert response.status_code == 200
            chunks = response.aiter_raw()
            assert await anext(chunks)  # its snapshot is still being read (paused)
            _assert_busy(await http.get(EXPORT, headers=auth("leaver")))
            assert await _export_lock_holders(database_url) == 1
            assert read_slots_of(application).taken == 1
        # gone without reading on: the connection closes mid-stream, mid-read
        await _settled(application, database_url)

        paused_read.set()
        again = await http.get(EXPORT, headers=auth("leaver"))
    assert again.status_code == 200
    assert len(json.loads(again.content)["chats"]) == 40


async def _read_and_cut(
    http: httpx.AsyncClient, headers: dict[str, str], database_url: str, resume: asyncio.Event
) -> bytes:
    """Read an export, terminating the backend that holds its lock while its snapshot is read
    (after the first chunk); what arrived before the stream broke."""
    received = bytearray()
    try:
        async with http.stream("GET", EXPORT, headers=headers) as response:
            assert response.status_code == 200
            async for chunk in response.aiter_raw():
                if not received:
                    terminated = await admin_fetchval(
                        database_url,
                        "SELECT count(pg_terminate_backend(pid)) FROM pg_locks"
                        " WHERE locktype = 'advisory' AND granted AND database ="
                        " (SELECT oid FROM pg_database WHERE datname = current_database())",
                    )
                    assert terminated == 1
                    resume.set()
                received += chunk
    except httpx.RemoteProtocolError:
        return bytes(received)
    pytest.fail(f"the stream ended normally after {len(received)} bytes")


async def test_a_stream_cut_by_the_database_frees_the_lock_and_reads_as_cut(
    served_app: tuple[FastAPI, str],
    auth: AuthFactory,
    database_url: str,
    paused_read: asyncio.Event,
) -> None:
    await seed_histories(plain_dsn(database_url), ["cut-off"], mib_per_user=16)
    application, base_url = served_app
    async with _small_window_client(base_url) as http:
        received = await _read_and_cut(http, auth("cut-off"), database_url, paused_read)
        await _settled(application, database_url)
        again = await http.get(EXPORT, headers=auth("cut-off"))

    assert 0 < len(received) < len(again.content)
    with pytest.raises(json.JSONDecodeError):
        json.loads(received)  # cut short, never a complete document missing rows
    assert again.status_code == 200
    assert DOCUMENT.validate_json(again.content).user_id == "cut-off"


# --- memory ------------------------------------------------------------------------------------

PEAK_BOUND = 8 * 2**20
"""What one export may allocate at its peak (Python heap, server and client in this process),
whatever the history: a batch of TEXT_BATCH messages, a chunk of CHUNK_BYTES and their copies
in the transport, measured at about 3 MiB; the whole document was 10x the history before."""


async def _export_peak(http: httpx.AsyncClient, headers: dict[str, str]) -> tuple[int, int]:
    """(bytes received, peak traced allocation) of one export read as it arrives."""
    received = 0
    tracemalloc.start()
    try:
        async with http.stream("GET", EXPORT, headers=headers) as response:
            assert response.status_code == 200
            async for chunk in response.aiter_raw():
                received += len(chunk)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return received, peak


async def test_an_exports_memory_does_not_grow_with_the_history(
    served_app: tuple[FastAPI, str], auth: AuthFactory, database_url: str
) -> None:
    await seed_histories(plain_dsn(database_url), ["small"], mib_per_user=2)
    await seed_histories(plain_dsn(database_url), ["large"], mib_per_user=20)
    _, base_url = served_app
    async with httpx.AsyncClient(base_url=base_url, timeout=120) as http:
        await _export_peak(http, auth("small"))  # the first request of the process warms it up
        small, small_peak = await _export_peak(http, auth("small"))
        large, large_peak = await _export_peak(http, auth("large"))

    mib = 2**20
    assert small > 2 * mib
    assert large > 20 * mib
    report = f"peaks {small_peak / mib:.1f} MiB for {small / mib:.0f} MiB, "
    report += f"{large_peak / mib:.1f} MiB for {large / mib:.0f} MiB"
    assert large_peak < PEAK_BOUND, report
    assert large_peak < small_peak + 2 * mib, report  # 10x the history, the same peak
