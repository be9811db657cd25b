"""`CITUS_WORKER_READS` on the cluster: `/context`'s read goes to the worker node holding the
company's shards, gives the same answer as through the coordinator, still answers right when the
route is stale (the company's shards elsewhere: Citus on that worker sends the call on), and goes
through the coordinator when the worker cannot be reached (app/kit/citus_reads.py)."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator

import httpx
import pytest
from asgi_lifespan import LifespanManager
from fastapi import FastAPI

from app.kit.citus_reads import WorkerReads
from app.main import create_app
from tests.helpers.apps import COMPANY, AuthFactory, client_of, make_settings
from tests.helpers.citus import CitusCluster
from tests.helpers.db import admin_fetchval, database_of
from tests.helpers.settings import enable_company
from tests.helpers.turns import context, new_chat, save_turn, user

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
async def reads_app(database_url: str) -> AsyncIterator[FastAPI]:
    application = create_app(make_settings(database_url, citus_worker_reads=True))
    async with LifespanManager(application):
        yield application


@pytest.fixture
async def reads_client(reads_app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    async with client_of(reads_app) as http:
        yield http


def reads_of(app: FastAPI) -> WorkerReads:
    reads = database_of(app).worker_reads
    assert reads is not None
    return reads


async def company_node(admin_url: str) -> tuple[str, int]:
    port = await admin_fetchval(
        admin_url,
        "SELECT nodeport FROM citus_shards"
        " WHERE shardid = get_shard_id_for_distribution_column('turns', $1::varchar)",
        COMPANY,
    )
    return ("127.0.0.1", int(port))


async def saved_chat(client: httpx.AsyncClient, auth: AuthFactory) -> str:
    await enable_company(client, auth)
    chat = new_chat()
    saved = await save_turn(client, auth, chat, [user("I live in Lisbon.")], "Noted.")
    assert saved.status_code == 202, saved.text
    return chat


async def loaded(client: httpx.AsyncClient, auth: AuthFactory, chat: str) -> list[str]:
    answer = await context(client, auth, chat, [user("Where do I live?")])
    return [m["content"] for m in answer["messages"]]


async def test_a_context_read_goes_to_the_worker_holding_the_company(
    client: httpx.AsyncClient,
    reads_client: httpx.AsyncClient,
    reads_app: FastAPI,
    auth: AuthFactory,
    admin_url: str,
) -> None:
    chat = await saved_chat(client, auth)
    reads = reads_of(reads_app)
    before = dict(reads.served)
    through_coordinator = await loaded(client, auth, chat)
    assert through_coordinator[:2] == ["I live in Lisbon.", "Noted."]
    assert await loaded(reads_client, auth, chat) == through_coordinator
    assert reads.served["worker"] == before["worker"] + 1
    assert reads.served["coordinator"] == before["coordinator"]
    assert await reads._node(COMPANY) == await company_node(admin_url)


@pytest.fixture
async def other_worker(admin_url: str, cluster: CitusCluster) -> tuple[str, int]:
    """The worker that does not hold the company's shards."""
    holder = await company_node(admin_url)
    return next(("127.0.0.1", w.port) for w in cluster.workers if w.port != holder[1])


async def test_a_stale_route_still_reads_the_company(
    client: httpx.AsyncClient,
    reads_client: httpx.AsyncClient,
    reads_app: FastAPI,
    auth: AuthFactory,
    other_worker: tuple[str, int],
) -> None:
    """As after a shard move the route has not seen yet: the other worker gets the read."""
    chat = await saved_chat(client, auth)
    reads = reads_of(reads_app)
    reads.route(COMPANY, other_worker)
    before = reads.served["worker"]
    assert (await loaded(reads_client, auth, chat))[:2] == ["I live in Lisbon.", "Noted."]
    assert reads.served["worker"] == before + 1


async def test_an_unreachable_worker_is_left_for_the_coordinator(
    client: httpx.AsyncClient,
    reads_client: httpx.AsyncClient,
    reads_app: FastAPI,
    auth: AuthFactory,
) -> None:
    chat = await saved_chat(client, auth)
    with socket.socket() as closed:  # a port nothing listens on
        closed.bind(("127.0.0.1", 0))
        nowhere = ("127.0.0.1", closed.getsockname()[1])
    reads = reads_of(reads_app)
    reads.route(COMPANY, nowhere)
    before = dict(reads.served)
    assert (await loaded(reads_client, auth, chat))[:2] == ["I live in Lisbon.", "Noted."]
    assert reads.served == {"worker": before["worker"], "coordinator": before["coordinator"] + 1}
    assert await reads._node(COMPANY) is None  # forgotten for the company, for a while
