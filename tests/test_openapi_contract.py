"""The published OpenAPI, read directly: one problem schema for every error, 401 and 403
declared where they can happen, headers and path values with their real constraints, and the
schema following the settings. schemathesis runs against it in tests/openapi_fuzz/.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from app.enablement.decision import KNOWN_FLAGS
from app.kit.auth.mint import issue_token
from app.kit.principal import Principal
from tests.helpers.apps import COMPANY, SPACE, SPACE_ADMIN, AuthFactory, app_with, client_of
from tests.helpers.settings import patch_space

# --- what the published schema says, read directly ------------------------------------------

PROBLEM = {"$ref": "#/components/schemas/Problem"}


def _operations(app: FastAPI) -> Iterator[tuple[str, str, dict[str, Any]]]:
    for path, item in app.openapi()["paths"].items():
        for method, operation in item.items():
            yield method.upper(), path, operation


def test_every_error_is_declared_as_the_one_problem_schema(app: FastAPI) -> None:
    spec = app.openapi()
    errors = [
        (method, path, status, response)
        for method, path, operation in _operations(app)
        for status, response in operation["responses"].items()
        if int(status) >= 400
    ]

    assert {"HTTPValidationError", "ValidationError"}.isdisjoint(spec["components"]["schemas"])
    assert errors
    for method, path, status, response in errors:
        assert response["content"] == {"application/problem+json": {"schema": PROBLEM}}, (
            method,
            path,
            status,
        )


def test_every_v1_operation_declares_401_and_every_admin_one_403(app: FastAPI) -> None:
    """The spec's rule: every `/v1` route needs a token; `/v1/spaces` and `/v1/companies` (the
    list included) need a role (a plain user gets 403); the operations endpoints need neither."""
    for method, path, operation in _operations(app):
        declared = operation["responses"].keys()
        admin = path.startswith(("/v1/spaces/", "/v1/companies/")) or path == "/v1/companies"
        assert ("401" in declared) is path.startswith("/v1/"), (method, path)
        assert ("403" in declared) is admin, (method, path)
        if path.startswith("/v1/"):
            assert operation["responses"]["401"]["headers"]["WWW-Authenticate"]["required"]


def test_headers_and_path_values_carry_their_real_constraints(app: FastAPI) -> None:
    parameters = {
        (path, parameter["name"]): parameter["schema"]
        for _, path, operation in _operations(app)
        for parameter in operation.get("parameters", ())
    }
    key = parameters[("/v1/chats/{chat_id}/turns", "Idempotency-Key")]
    flag = parameters[("/v1/companies/{company_id}/feature-flags/{flag}", "flag")]

    assert (key["type"], key["minLength"], key["maxLength"], key["pattern"]) == (
        "string",
        1,
        255,
        "^[ -~]+$",
    )
    assert flag["enum"] == list(KNOWN_FLAGS)


async def test_the_idempotency_key_schema_follows_its_setting(database_url: str) -> None:
    async with app_with(database_url, idempotency_key_max_length=64) as small:
        operation = small.openapi()["paths"]["/v1/chats/{chat_id}/turns"]["post"]
        (key,) = [p for p in operation["parameters"] if p["name"] == "Idempotency-Key"]
        too_long = await _save_turn_with_key(small, "k" * 65)

    assert key["schema"]["maxLength"] == 64
    assert too_long.status_code == 422


async def _save_turn_with_key(app: FastAPI, key: str) -> httpx.Response:
    async with client_of(app) as http:
        return await http.post(
            "/v1/chats/c1/turns",
            json={
                "space_id": SPACE,
                "messages": [{"role": "user", "content": "Hi"}],
                "response": {"content": "Hello"},
            },
            headers={"Idempotency-Key": key, **_auth_header(app)},
        )


def _auth_header(app: FastAPI) -> dict[str, str]:
    token = issue_token(app.state.settings, Principal("alice", COMPANY, frozenset()))
    return {"Authorization": f"Bearer {token}"}


@pytest.mark.parametrize(("max_tokens", "status"), [(859.0, 200), (859.5, 422), ("859", 422)])
async def test_an_integral_float_is_an_integer_as_the_schema_says(
    client: httpx.AsyncClient, auth: AuthFactory, max_tokens: object, status: int
) -> None:
    response = await patch_space(client, auth, SPACE, {"user_memory": {"max_tokens": max_tokens}})

    assert response.status_code == status, response.text
    if status == 200:
        assert response.json()["user_memory"]["max_tokens"] == 859


async def test_a_405_names_every_method_of_the_path(
    client: httpx.AsyncClient, auth: AuthFactory
) -> None:
    response = await client.post("/v1/spaces/space-1", headers=auth("sam", COMPANY, SPACE_ADMIN))

    assert response.status_code == 405
    assert response.headers["allow"] == "GET, PATCH"
