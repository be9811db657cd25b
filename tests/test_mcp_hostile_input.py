"""Hostile arguments to the MCP tools, over real HTTP through the SDK's client: what the REST
routes refuse with a 422 (a NUL in the profile, a profile past its length, a version number
past its column, a tampered cursor) a tool refuses with an error naming the argument, and
nothing is written."""

from __future__ import annotations

import base64

import httpx
import orjson
import pytest

from app.profiles.document import Section
from app.profiles.schemas import MAX_CONTENT_CHARS
from tests.helpers.apps import AuthFactory, TokenFactory
from tests.helpers.profiles import memory_md
from tests.test_mcp import (  # noqa: F401 - `base_url` and `mcp_url` are fixtures
    base_url,
    bearer,
    call,
    connect,
    mcp_url,
    refusal,
)

ME = "/v1/me/memory"
WITH_NUL = memory_md({Section.IDENTITY: ["Known as heron"]}).replace("heron", "heron\x00admin")
TOO_LONG = memory_md({Section.WORK: ["Writes reports."]}) + "\n" * MAX_CONTENT_CHARS


def profile(phase: int) -> str:
    return memory_md({Section.IDENTITY: ["Known as heron"], Section.WORK: [f"Phase {phase}"]})


async def rest_put(
    client: httpx.AsyncClient, auth: AuthFactory, content: str, condition: dict[str, str]
) -> httpx.Response:
    return await client.put(ME, json={"content": content}, headers={**auth("alice"), **condition})


@pytest.mark.parametrize(
    ("content", "reason"),
    [(WITH_NUL, "must not contain NUL characters"), (TOO_LONG, "at most 200000 characters")],
    ids=["nul", "too-long"],
)
async def test_content_rest_refuses_is_refused_by_edit_memory_naming_it_and_nothing_is_written(
    mcp_url: str,  # noqa: F811
    make_token: TokenFactory,
    client: httpx.AsyncClient,
    auth: AuthFactory,
    *,
    content: str,
    reason: str,
) -> None:
    over_rest = await rest_put(client, auth, content, {"If-None-Match": "*"})
    assert over_rest.status_code == 422
    assert [e["field"] for e in over_rest.json()["errors"]] == ["body.content"]
    assert reason in over_rest.json()["errors"][0]["message"]

    async with connect(mcp_url, bearer(make_token("alice"))) as mcp:
        created = await refusal(mcp, "edit_memory", content=content, expected_version=None)
        assert "nothing was written. (content: " in created
        assert reason in created
        assert "heron\x00admin" not in created  # the user's text is not echoed back
        assert (await call(mcp, "read_memory"))["version"] is None

        await call(mcp, "edit_memory", content=profile(1), expected_version=None)
        replaced = await refusal(mcp, "edit_memory", content=content, expected_version=1)
        assert reason in replaced
        head = await call(mcp, "read_memory")
        assert head["version"] == 1
        assert "Phase 1" in head["content"]
        assert await call(mcp, "list_memory_versions") == {
            "items": [await only_version(client, auth)],
            "next_cursor": None,
        }


async def only_version(client: httpx.AsyncClient, auth: AuthFactory) -> object:
    page = (await client.get(f"{ME}/versions", headers=auth("alice"))).json()
    [item] = page["items"]
    return item


async def test_version_numbers_past_the_column_are_refused_naming_the_argument(
    mcp_url: str,  # noqa: F811
    make_token: TokenFactory,
    client: httpx.AsyncClient,
    auth: AuthFactory,
) -> None:
    too_big = 2**31
    over_rest = await client.get(
        f"{ME}/versions/1/diff", params={"against": too_big}, headers=auth("alice")
    )
    assert over_rest.status_code == 422
    assert [e["field"] for e in over_rest.json()["errors"]] == ["query.against"]

    async with connect(mcp_url, bearer(make_token("alice"))) as mcp:
        await call(mcp, "edit_memory", content=profile(1), expected_version=None)
        against = await refusal(mcp, "diff_memory_versions", version=1, against=too_big)
        assert "against" in against
        version = await refusal(mcp, "diff_memory_versions", version=too_big)
        assert "version" in version
        stale = await refusal(mcp, "edit_memory", content=profile(2), expected_version=too_big)
        assert "expected_version" in stale
        assert (await call(mcp, "read_memory"))["version"] == 1


@pytest.mark.parametrize(
    "position",
    [{"version": 2**63}, {"version": 2**31}, {"version": True}, {"version": "2"}, {}],
    ids=["past-bigint", "past-integer", "boolean", "text", "empty"],
)
async def test_a_tampered_cursor_is_refused_by_list_memory_versions_naming_it(
    mcp_url: str,  # noqa: F811
    make_token: TokenFactory,
    position: dict[str, object],
) -> None:
    cursor = base64.urlsafe_b64encode(orjson.dumps(position)).decode().rstrip("=")
    async with connect(mcp_url, bearer(make_token("alice"))) as mcp:
        await call(mcp, "edit_memory", content=profile(1), expected_version=None)
        message = await refusal(mcp, "list_memory_versions", cursor=cursor)
        assert "cursor: The cursor is not valid." in message
        assert "query.cursor" not in message
