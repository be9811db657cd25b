"""`POST /v1/me/memory/consolidations`: one exchange consolidated on request, async or waited."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from tests.helpers.apps import SPACE, USER, AuthFactory, client_with
from tests.helpers.settings import enable_company

URL = "/v1/me/memory/consolidations"
FACT = {"space_id": SPACE, "user": "I work as a data engineer at Acme", "assistant": "Noted."}


@pytest.fixture
async def worker_client(database_url: str, tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    """An app whose in-process worker runs (the default test app has none)."""
    async with client_with(
        database_url,
        worker_enabled=True,
        worker_poll_seconds=0.05,
        worker_heartbeat_file=tmp_path / "heartbeat",
    ) as client:
        yield client


async def test_disabled_memory_is_409_and_stores_nothing(
    client: httpx.AsyncClient, auth: AuthFactory
) -> None:
    response = await client.post(URL, json=FACT, headers=auth(USER))
    assert response.status_code == 409
    assert "FEATURE_FLAG_ENABLE_CONTEXT_MEMORY_UN_22033" in response.json()["detail"]
    messages = await client.get("/v1/chats/_memory-consolidations/messages", headers=auth(USER))
    assert messages.status_code == 404  # nothing stored: the reserved chat does not exist


async def test_queued_without_wait(client: httpx.AsyncClient, auth: AuthFactory) -> None:
    await enable_company(client, auth)
    response = await client.post(URL, json=FACT, headers=auth(USER))
    assert response.status_code == 202
    job = response.json()
    assert (job["status"], job["outcome"], job["version"]) == ("queued", None, None)
    assert response.headers["location"] == f"/v1/jobs/{job['id']}"
    polled = await client.get(response.headers["location"], headers=auth(USER))
    assert polled.json()["status"] == "queued"
    # the exchange is kept (and exported) as a turn of the reserved chat
    stored = await client.get("/v1/chats/_memory-consolidations/messages", headers=auth(USER))
    assert [m["content"] for m in stored.json()["items"]] == [FACT["user"], FACT["assistant"]]


async def test_wait_returns_the_finished_result(
    worker_client: httpx.AsyncClient, auth: AuthFactory
) -> None:
    await enable_company(worker_client, auth)
    response = await worker_client.post(
        URL, params={"wait": "true", "timeout": "20"}, json=FACT, headers=auth(USER)
    )
    assert response.status_code == 200, response.text
    job = response.json()
    assert (job["status"], job["outcome"], job["version"]) == ("succeeded", "updated", 1)
    memory = await worker_client.get("/v1/me/memory", headers=auth(USER))
    assert "Works at Acme." in memory.json()["content"]

    small_talk = {"space_id": SPACE, "user": "thanks, that's all!", "assistant": "Bye!"}
    noop = await worker_client.post(
        URL, params={"wait": "true"}, json=small_talk, headers=auth(USER)
    )
    assert (noop.status_code, noop.json()["outcome"], noop.json()["version"]) == (200, "noop", None)


async def test_a_wait_that_times_out_answers_202(
    client: httpx.AsyncClient, auth: AuthFactory
) -> None:
    await enable_company(client, auth)  # no worker runs in this app: the job stays queued
    response = await client.post(
        URL, params={"wait": "true", "timeout": "0.3"}, json=FACT, headers=auth(USER)
    )
    assert response.status_code == 202
    assert response.json()["status"] == "queued"


@pytest.mark.parametrize(
    "body",
    [
        {"space_id": SPACE, "user": "hi"},
        {**FACT, "user_id": "mallory"},
        {**FACT, "space_id": "bad space"},
        {**FACT, "user": "nul\x00byte"},
    ],
)
async def test_bad_bodies_are_422(
    client: httpx.AsyncClient, auth: AuthFactory, body: dict[str, str]
) -> None:
    response = await client.post(URL, json=body, headers=auth(USER))
    assert response.status_code == 422
