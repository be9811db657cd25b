"""The orchestrator's two calls are served by `LeanRoute`'s fixed plan: the answers keep the
documented shapes, and bad requests get the same problem+json a FastAPI route would give."""

from __future__ import annotations

from typing import Annotated, Any

import httpx
import pytest
from fastapi import Depends, FastAPI, Response
from pydantic import BaseModel

from app.kit.db.driver_pool import positional
from app.kit.lean_routes import LeanRoute
from app.profiles.document import Section
from app.turns.schemas import ContextResponse, TurnSaved
from tests.helpers.apps import AuthFactory
from tests.helpers.memory import seed_profile
from tests.helpers.settings import enable_company
from tests.helpers.turns import context as load
from tests.helpers.turns import new_chat, save_turn, turn_body, user


@pytest.mark.parametrize("debug", [False, True])
async def test_the_context_answer_is_exactly_the_documented_shape(
    app: FastAPI, client: httpx.AsyncClient, auth: AuthFactory, debug: bool
) -> None:
    """Built as plain values for speed, the answer must still be what `ContextResponse`
    documents: nothing missing, nothing extra, every value of the documented type."""
    await enable_company(client, auth)
    await seed_profile(app, "alice", {Section.IDENTITY: ["Alice is a data engineer"]})
    chat = new_chat()
    await save_turn(client, auth, chat, [user("Q0")], "R0")

    answer = await load(client, auth, chat, [user("Q1")], debug=debug)

    assert ContextResponse.model_validate(answer).model_dump(mode="json") == answer
    assert answer["memory"]["injected"] is True
    assert (answer["debug"] is not None) is debug


async def test_the_turn_answer_is_exactly_the_documented_shape(
    client: httpx.AsyncClient, auth: AuthFactory
) -> None:
    response = await save_turn(client, auth, new_chat(), [user("Q")], "R")
    answer = response.json()
    assert TurnSaved.model_validate(answer).model_dump(mode="json") == answer


@pytest.mark.parametrize("path", ["context", "turns"])
@pytest.mark.parametrize(
    ("content", "content_type", "field"),
    [
        (b"", "application/json", "body"),
        (b"{not json", "application/json", "body"),
        (b'{"space_id": "space-1"}', "text/plain", "body"),
        (b'{"space_id": "space-1"}', None, "body"),
        (b"[]", "application/json", "body"),
    ],
    ids=["empty", "malformed", "text-plain", "no-content-type", "not-an-object"],
)
async def test_unreadable_bodies_are_422_naming_the_body(
    client: httpx.AsyncClient,
    auth: AuthFactory,
    *,
    path: str,
    content: bytes,
    content_type: str | None,
    field: str,
) -> None:
    headers = auth("alice")
    if content_type is not None:
        headers["content-type"] = content_type
    response = await client.post(f"/v1/chats/c1/{path}", content=content, headers=headers)
    assert response.status_code == 422, response.text
    assert response.headers["content-type"] == "application/problem+json"
    assert [e["field"] for e in response.json()["errors"]] == [field]


async def test_a_json_subtype_is_read_as_json(client: httpx.AsyncClient, auth: AuthFactory) -> None:
    body = turn_body([user("Q")], "R")
    headers = auth("alice") | {"content-type": "application/vnd.api+json; charset=utf-8"}
    response = await client.post(f"/v1/chats/{new_chat()}/turns", json=body, headers=headers)
    assert response.status_code == 201, response.text


async def test_a_bad_path_is_reported_before_the_body(
    client: httpx.AsyncClient, auth: AuthFactory
) -> None:
    response = await client.post(
        "/v1/chats/bad chat/context", json={"messages": []}, headers=auth("alice")
    )
    fields = [e["field"] for e in response.json()["errors"]]
    assert response.status_code == 422
    assert fields[0] == "path.chat_id"
    assert "body.space_id" in fields


async def test_no_token_is_401_before_any_validation(client: httpx.AsyncClient) -> None:
    response = await client.post("/v1/chats/bad chat/context", content=b"{not json")
    assert response.status_code == 401


class _Body(BaseModel):
    x: int


async def _unknown_dependency() -> int:
    return 1


def test_a_lean_route_refuses_a_dependency_it_has_no_provider_for() -> None:
    async def endpoint(body: _Body, value: Annotated[int, Depends(_unknown_dependency)]) -> Any:
        return Response()

    with pytest.raises(TypeError, match="no provider"):
        LeanRoute("/x", endpoint, methods=["POST"])


def test_a_lean_route_refuses_query_parameters() -> None:
    async def endpoint(body: _Body, q: int = 0) -> Any:
        return Response()

    with pytest.raises(TypeError, match="path parameters and one body"):
        LeanRoute("/x", endpoint, methods=["POST"])


@pytest.mark.parametrize(
    ("sql", "expected", "names"),
    [
        ("SELECT :a, :b", "SELECT $1, $2", ("a", "b")),
        ("SELECT :a WHERE x = :a AND y = :b", "SELECT $1 WHERE x = $1 AND y = $2", ("a", "b")),
        ("SELECT NULL::text[], CAST(:a AS uuid)", "SELECT NULL::text[], CAST($1 AS uuid)", ("a",)),
        ("SELECT make_interval(hours => :h)", "SELECT make_interval(hours => $1)", ("h",)),
        (
            "SELECT coalesce(:now::timestamptz, now()) WHERE id = ANY(:ids::uuid[])",
            "SELECT coalesce($1::timestamptz, now()) WHERE id = ANY($2::uuid[])",
            ("now", "ids"),
        ),
        ("SELECT '10:30', 'key: value', :a", "SELECT '10:30', 'key: value', $1", ("a",)),
        (r"SELECT '\:at', :a", "SELECT ':at', $1", ("a",)),
        ("SELECT 'at :a'", "SELECT 'at $1'", ("a",)),
        ("SELECT x FROM t WHERE y LIKE '%s%%'", "SELECT x FROM t WHERE y LIKE '%s%%'", ()),
    ],
    ids=[
        "in-order",
        "a-name-twice",
        "casts",
        "named-argument",
        "parameter-casts",
        "colons-in-literals",
        "escaped-colon",
        "a-name-in-a-literal-is-a-parameter",
        "percent-signs",
    ],
)
def test_positional_numbers_named_parameters_in_order(
    sql: str, expected: str, names: tuple[str, ...]
) -> None:
    assert positional(sql) == (expected, names)
