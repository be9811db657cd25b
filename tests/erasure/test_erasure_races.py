"""An erasure racing the consolidation worker: the worker read the memory and is waiting for the
model when the user erases; afterwards nothing of the user exists, and the worker's write is
refused (its job is gone, and the folder a version needs is gone)."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from fastapi import FastAPI
from sqlalchemy.ext.asyncio import AsyncEngine

from app.kit.errors import NotFound
from app.kit.llm import OpenAIChatModel
from app.profiles import service as profiles
from app.profiles.versions import (
    ExpectedHead,
    VersionPolicy,
    VersionSource,
    parse_user_profile,
)
from tests.helpers.apps import AuthFactory
from tests.helpers.db import scalar, sessions
from tests.helpers.jobs import claim_one
from tests.helpers.llm_stub import StubLLMServer, delay, reply
from tests.helpers.memory import memory_counts, put_memory
from tests.helpers.settings import enable_company
from tests.helpers.turns import queue_turn
from tests.helpers.worker import make_handler, wait_for

PROFILE = """# User Memory

## Identity
- Works as a data engineer.

## Communication Preferences

## Work Context

## Skills & Expertise
- Knows Python.

## Recent Topics

## Open Questions / Follow-ups
"""
ADD_RUST = json.dumps(
    {
        "decision": "UPDATE",
        "operations": [{"op": "ADD", "section": "Skills & Expertise", "text": "Learning Rust."}],
    }
)


async def rows_of_alice(app: FastAPI) -> dict[str, int]:
    counts = await memory_counts(app, "alice")
    for table in ("turns", "chat_messages", "jobs", "user_settings"):
        counts[table] = await scalar(
            app,
            f"SELECT count(*) FROM {table} WHERE company_id = 'acme' AND user_id = 'alice'",  # noqa: S608
        )
    return counts


async def test_a_consolidation_in_flight_during_an_erasure_writes_nothing(
    app: FastAPI,
    *,
    engine: AsyncEngine,
    client: httpx.AsyncClient,
    auth: AuthFactory,
    chat_model: OpenAIChatModel,
    llm_stub: StubLLMServer,
) -> None:
    await enable_company(client, auth)
    await put_memory(client, auth, PROFILE)
    await queue_turn(client, auth, "I picked up Rust.")
    llm_stub.script(reply("UPDATE"), delay(1.0, reply(ADD_RUST)))
    handler, _, _ = make_handler(app, chat_model)
    claimed = await claim_one(engine)

    async def consolidate() -> str:
        return await handler(claimed, asyncio.Event())

    consolidation = asyncio.create_task(consolidate())

    async def operations_call_in_flight() -> bool:
        return len(llm_stub.requests) >= 2

    await wait_for(operations_call_in_flight)
    response = await client.delete("/v1/me", headers=auth("alice", "acme"))
    assert response.status_code == 200, response.text
    deleted = response.json()["deleted"]
    assert (deleted["profile"], deleted["versions"], deleted["jobs"]) == (True, 1, 1)
    assert not consolidation.done()  # the model has not answered yet

    assert await consolidation == "lease_lost"  # the version write was refused, the job gone
    assert set((await rows_of_alice(app)).values()) == {0}


async def test_a_worker_write_after_the_erasure_is_refused(
    app: FastAPI, client: httpx.AsyncClient, auth: AuthFactory
) -> None:
    """The worker read version 1 before the erasure; its compare-and-set write after it finds no
    folder to write in and is refused, creating nothing (not even a memory.md row)."""
    await enable_company(client, auth)
    await put_memory(client, auth, PROFILE)
    response = await client.delete("/v1/me", headers=auth("alice", "acme"))
    assert response.status_code == 200, response.text

    policy = VersionPolicy(app.state.tokens.stored, keep=10)
    with pytest.raises(NotFound):
        async with sessions(app)() as session, session.begin():
            await profiles.save_consolidation(
                session,
                ExpectedHead("acme", "alice", 1),
                parse_user_profile(PROFILE.replace("Python.", "Python.\n- Knows Rust."), "alice"),
                VersionSource("consolidation"),
                policy,
            )
    assert set((await rows_of_alice(app)).values()) == {0}
