"""The bounds on exports (the user's and the company's), which are read into a temporary file
and sent from it: how many snapshots are read at once (per process, per company; past them a
429 or a 503 with `Retry-After`, nothing read or audited), and the send deadline (a client that
takes nothing for that long is cut off, its body cut, its file deleted)."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import tempfile
from collections.abc import AsyncIterator
from contextlib import aclosing

import httpx
import pytest
from fastapi import FastAPI
from pydantic import ValidationError

from app.kit.errors import PROBLEM_CONTENT_TYPE
from app.kit.observability import _DropLoggedErrors
from app.kit.spool import (
    READ_BUSY_RETRY_AFTER_SECONDS,
    ClientTooSlow,
    ReadSlots,
    Spool,
    SpoolCut,
)
from app.main import create_app
from app.portability.export import CompanySnapshot
from app.profiles.export import MemoryExportStream
from bench.export_memory import plain_dsn, seed_histories
from tests.helpers.apps import AuthFactory, make_settings
from tests.helpers.db import admin_fetchval, database_of
from tests.helpers.memory import ME
from tests.helpers.polling import wait_until
from tests.helpers.portability import operator
from tests.helpers.serving import served

EXPORT = f"{ME}/export"
AUDITED_EXPORTS = "SELECT count(*) FROM audit_events WHERE action = 'company.exported'"


def slots_of(app: FastAPI) -> ReadSlots:
    slots: ReadSlots = app.state.export_slots
    return slots


@pytest.fixture
def paused_reads(monkeypatch: pytest.MonkeyPatch) -> asyncio.Event:
    """Both exports stop reading their snapshot after its first chunk until the event is set:
    their read slots stay taken meanwhile."""
    resume = asyncio.Event()

    async def write_then_wait(self: MemoryExportStream | CompanySnapshot, spool: Spool) -> None:
        body = self.chunks() if isinstance(self, MemoryExportStream) else self.lines()
        async with aclosing(body) as chunks:
            async for chunk in chunks:
                spool.write(chunk)
                await resume.wait()

    monkeypatch.setattr(MemoryExportStream, "write_to", write_then_wait)
    monkeypatch.setattr(CompanySnapshot, "write_to", write_then_wait)
    return resume


@pytest.fixture
async def capped(database_url: str) -> AsyncIterator[tuple[FastAPI, str]]:
    """Served for real: two snapshots read at once, one of them per company."""
    settings = make_settings(
        database_url, export_read_concurrency=2, export_read_company_concurrency=1
    )
    application = create_app(settings)
    async with served(application) as base_url:
        yield application, base_url


def _assert_refused(response: httpx.Response, status: int, detail: str) -> None:
    assert response.status_code == status, f"{response.status_code}: {response.text[:300]}"
    assert response.headers["content-type"] == PROBLEM_CONTENT_TYPE
    assert response.headers["retry-after"] == str(READ_BUSY_RETRY_AFTER_SECONDS)
    assert detail in response.json()["detail"]


async def test_snapshots_read_at_once_are_capped_per_company_and_per_process(
    capped: tuple[FastAPI, str], auth: AuthFactory, database_url: str, paused_reads: asyncio.Event
) -> None:
    application, base_url = capped
    async with httpx.AsyncClient(base_url=base_url, timeout=30) as http:
        audited = await admin_fetchval(database_url, AUDITED_EXPORTS)
        async with http.stream("GET", EXPORT, headers=auth("alice", "acme")) as first:
            assert first.status_code == 200
            first_chunks = first.aiter_raw()  # held: closing it would close the connection
            first_body = await anext(first_chunks)  # its snapshot is being read (paused)
            assert slots_of(application).taken == 1

            # the company has its one: another of its users, and its company export, wait
            company_busy = "exports of your company are being read"
            _assert_refused(await http.get(EXPORT, headers=auth("bob", "acme")), 429, company_busy)
            company_export = await http.get("/v1/companies/acme/export", headers=operator(auth))
            _assert_refused(company_export, 429, company_busy)
            assert await admin_fetchval(database_url, AUDITED_EXPORTS) == audited  # not audited

            # another company still has its own, until the process has none left
            async with http.stream("GET", EXPORT, headers=auth("carol", "globex")) as second:
                assert second.status_code == 200
                second_chunks = second.aiter_raw()
                second_body = await anext(second_chunks)
                third = await http.get(EXPORT, headers=auth("dave", "initech"))
                _assert_refused(third, 503, "as many exports as it reads at once")
                assert third.json()["type"] == "urn:context-memory:problem:unavailable"
                paused_reads.set()
                second_body += b"".join([chunk async for chunk in second_chunks])
            first_body += b"".join([chunk async for chunk in first_chunks])
        assert json.loads(first_body)["user_id"] == "alice"
        assert json.loads(second_body)["user_id"] == "carol"

        async def free() -> bool:
            return slots_of(application).taken == 0

        await wait_until(free, 5, what="every read slot given back")
        assert (await http.get(EXPORT, headers=auth("bob", "acme"))).status_code == 200
        company_export = await http.get("/v1/companies/acme/export", headers=operator(auth))
        assert company_export.status_code == 200
        assert await admin_fetchval(database_url, AUDITED_EXPORTS) == audited + 1


def _spool_files() -> int:
    """Open files of this process in the temporary directory (a spool rolled over to disk)."""
    directory = tempfile.gettempdir()
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        count += target.startswith(directory)
    return count


async def _drained(chunks: AsyncIterator[bytes]) -> int:
    received = 0
    async for chunk in chunks:
        received += len(chunk)
    return received


async def test_a_client_that_takes_nothing_past_the_send_deadline_is_cut_off(
    database_url: str, auth: AuthFactory
) -> None:
    await seed_histories(plain_dsn(database_url), ["stalled"], mib_per_user=16)
    application = create_app(make_settings(database_url, export_send_timeout_seconds=1.0))
    window = [(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)]
    transport = httpx.AsyncHTTPTransport(socket_options=window)
    async with (
        served(application) as base_url,
        httpx.AsyncClient(base_url=base_url, timeout=30, transport=transport) as http,
    ):
        before = _spool_files()
        async with http.stream("GET", EXPORT, headers=auth("stalled")) as response:
            assert response.status_code == 200
            chunks = response.aiter_raw()
            received = len(await anext(chunks))

            async def read_to_disk() -> bool:
                return slots_of(application).taken == 0 and _spool_files() == before + 1

            await wait_until(read_to_disk, 10, what="the snapshot read into a file on disk")
            owner = ("user-memory-export", "acme", "stalled")

            async def cut_off() -> bool:
                return not slots_of(application).sending(owner)

            await wait_until(cut_off, 10, what="the stalled client cut off")
            assert _spool_files() == before  # the file deleted
            assert database_of(application).engine.pool.checkedout() == 0  # type: ignore[attr-defined]
            with pytest.raises(httpx.RemoteProtocolError):  # the body ends cut, never complete
                received += await _drained(chunks)
        assert received < 16 * 2**20
        again = await http.get(EXPORT, headers=auth("stalled"))
    assert again.status_code == 200
    assert len(again.content) > 16 * 2**20


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("export_read_concurrency", 0),
        ("export_read_company_concurrency", -1),
        ("export_send_timeout_seconds", 0),
        ("export_send_timeout_seconds", "soon"),
        ("db_idle_in_transaction_timeout_seconds", -5),
        ("db_worker_pool_size", 10_000),
    ],
)
def test_a_hostile_bound_is_refused_naming_the_setting(
    database_url: str, field: str, value: object
) -> None:
    with pytest.raises(ValidationError) as refused:
        make_settings(database_url, **{field: value})
    assert [error["loc"] for error in refused.value.errors()] == [(field,)]


def test_the_servers_traceback_of_a_cut_off_client_is_dropped_its_own_warning_kept() -> None:
    """A client cut off by the send deadline ends its response by an exception the server logs
    with a traceback; the spool logged it already, as a warning, so the server's line goes."""
    drop = _DropLoggedErrors()

    def record(error: BaseException) -> logging.LogRecord:
        return logging.LogRecord(
            "uvicorn.error",
            logging.ERROR,
            __file__,
            1,
            "Exception in ASGI application",
            (),
            (type(error), error, None),
        )

    assert not drop.filter(record(ClientTooSlow("a user's memory export")))
    assert not drop.filter(record(SpoolCut()))
    assert drop.filter(record(RuntimeError("anything else keeps its traceback")))
