"""A 409 says whether sending the request again can help: `conflict-retry` (with `Retry-After`
and `retryable: true`) where the request lost a race and nothing of it was written, `conflict`
and `quota-exceeded` (`retryable: false`) where something must change first.

Each race is provoked for real, on the test database: a trigger makes the write the request
depends on come to nothing, the way a concurrent request would, and is dropped afterwards, when
the very same request succeeds.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager

import httpx
import orjson
import pytest
from fastapi import FastAPI

from app.kit.contract import PROBLEM_SCHEMAS
from app.kit.errors import Conflict, DomainError, RetryableConflict
from app.kit.problems import problem_response
from app.profiles.document import Section
from tests.helpers.apps import AuthFactory
from tests.helpers.db import admin_execute, scalar
from tests.helpers.memory import create
from tests.helpers.profiles import memory_md
from tests.helpers.settings import enable_company, patch_space, patch_user_settings
from tests.helpers.turns import new_chat, turn_body, user

RETRY = "urn:context-memory:problem:conflict-retry"
BODY = turn_body([user("Please remember I use Vim.")], "Noted.")


@asynccontextmanager
async def trigger(
    database_url: str, name: str, table: str, how: str, body: str
) -> AsyncIterator[None]:
    """`CREATE TRIGGER name how ON table` running the PL/pgSQL `body`, dropped on the way out."""
    await admin_execute(
        database_url,
        f"CREATE FUNCTION {name}() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN {body} END $$",
        f"CREATE TRIGGER {name} {how} ON {table} FOR EACH ROW EXECUTE FUNCTION {name}()",
    )
    try:
        yield
    finally:
        await admin_execute(
            database_url, f"DROP TRIGGER {name} ON {table}", f"DROP FUNCTION {name}()"
        )


def assert_retryable(response: httpx.Response) -> None:
    assert response.status_code == 409, response.text
    assert response.headers["content-type"] == "application/problem+json"
    problem = response.json()
    assert (problem["type"], problem["title"], problem["retryable"]) == (
        RETRY,
        "Conflict, retry",
        True,
    )
    assert response.headers["retry-after"] == "1"


async def test_a_key_whose_record_appears_meanwhile_is_a_retryable_conflict(
    app: FastAPI, client: httpx.AsyncClient, auth: AuthFactory, database_url: str
) -> None:
    """The turn's idempotency record is not stored (as when one with the key appeared
    although the request holds the key's lock): nothing is saved, and the retry succeeds."""
    chat, headers = new_chat(), auth("alice") | {"Idempotency-Key": "key-raced"}
    async with trigger(
        database_url, "test_skip_record", "idempotency_keys", "BEFORE INSERT", "RETURN NULL;"
    ):
        raced = await client.post(f"/v1/chats/{chat}/turns", json=BODY, headers=headers)

    assert_retryable(raced)
    assert "concurrently" in raced.json()["detail"]
    assert await scalar(app, "SELECT count(*) FROM turns") == 0
    again = await client.post(f"/v1/chats/{chat}/turns", json=BODY, headers=headers)
    assert again.status_code == 201, again.text


async def test_a_turn_whose_memory_goes_at_every_plan_is_a_retryable_conflict(
    app: FastAPI, client: httpx.AsyncClient, auth: AuthFactory, database_url: str
) -> None:
    """The user's memory folder is deleted as soon as it is created (as by an erasure racing
    each plan of the turn): after the last plan the turn is refused, nothing saved."""
    await enable_company(client, auth)
    chat = new_chat()
    # deferred: the folder is there while it is created and gone once that commits
    await admin_execute(
        database_url,
        "CREATE FUNCTION test_erase_folder() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
        "DELETE FROM folders WHERE id = NEW.id; RETURN NULL; END $$",
        "CREATE CONSTRAINT TRIGGER test_erase_folder AFTER INSERT ON folders "
        "DEFERRABLE INITIALLY DEFERRED FOR EACH ROW "
        "WHEN (NEW.path LIKE 'user-memory/%') EXECUTE FUNCTION test_erase_folder()",
    )
    try:
        raced = await client.post(f"/v1/chats/{chat}/turns", json=BODY, headers=auth("alice"))
    finally:
        await admin_execute(
            database_url,
            "DROP TRIGGER test_erase_folder ON folders",
            "DROP FUNCTION test_erase_folder()",
        )

    assert_retryable(raced)
    assert "nothing was saved" in raced.json()["detail"]
    assert await scalar(app, "SELECT count(*) FROM turns") == 0
    assert await scalar(app, "SELECT count(*) FROM jobs") == 0
    again = await client.post(f"/v1/chats/{chat}/turns", json=BODY, headers=auth("alice"))
    assert again.status_code == 202, again.text


async def test_a_space_save_that_loses_every_race_is_a_retryable_conflict(
    app: FastAPI, client: httpx.AsyncClient, auth: AuthFactory, database_url: str
) -> None:
    """The first save of a space finds no row, and its insert finds one (as when a concurrent
    first save won, then the row went): after two rounds the save is refused, nothing audited."""
    async with trigger(
        database_url, "test_skip_space", "space_settings", "BEFORE INSERT", "RETURN NULL;"
    ):
        raced = await patch_space(client, auth, "space-raced", {"context_memory": True})

    assert_retryable(raced)
    assert await scalar(app, "SELECT count(*) FROM audit_events") == 0
    await patch_space(client, auth, "space-raced", {"context_memory": True}, expect=200)


async def test_a_conflict_that_a_retry_cannot_mend_says_so(
    client: httpx.AsyncClient, auth: AuthFactory
) -> None:
    """An opted-out user's write stays refused however often it is sent."""
    await patch_user_settings(client, auth, {"context_memory": False}, expect=200)
    for _ in range(2):
        written = await create(client, auth("alice"), memory_md({Section.WORK: ["Report."]}))
        assert written.status_code == 409, written.text
        problem = written.json()
        assert (problem["type"], problem["retryable"]) == (
            "urn:context-memory:problem:conflict",
            False,
        )
        assert "retry-after" not in written.headers


def domain_errors(cls: type[DomainError] = DomainError) -> Iterator[type[DomainError]]:
    yield cls
    for sub in cls.__subclasses__():
        yield from domain_errors(sub)


@pytest.mark.parametrize("error", list(domain_errors()), ids=lambda error: error.__name__)
def test_every_409_and_only_a_409_says_whether_it_is_retryable(
    error: type[DomainError],
) -> None:
    body = orjson.loads(problem_response(error.problem_type(), "detail").body)
    if error.status == Conflict.status:
        assert body["retryable"] is issubclass(error, RetryableConflict)
    else:
        assert "retryable" not in body


def test_a_retryable_conflict_always_carries_retry_after() -> None:
    assert RetryableConflict("again").headers == {"Retry-After": "1"}
    assert RetryableConflict("again", retry_after_seconds=7).headers == {"Retry-After": "7"}


def test_the_published_problem_schema_has_retryable() -> None:
    schema = PROBLEM_SCHEMAS["Problem"]
    assert schema["properties"]["retryable"]["type"] == "boolean"
    assert "retryable" not in schema["required"]
