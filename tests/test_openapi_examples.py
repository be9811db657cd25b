"""The examples Swagger UI's "Try it out" is pre-filled with work as they are: every example of
every request body, with the example path, query and header values, is sent to the app on real
PostgreSQL as the development token `make run` prints (alice of acme, operator and space
admin), in the order a newcomer would need them, and each answers 2xx."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
from fastapi import FastAPI

from tests.helpers.apps import TokenFactory

Operation = tuple[str, str]

# The order the examples depend on one another: the company flag and the space come first (memory
# is off until both say on), the memory policy before any profile is written (its last example
# is the defaults), the profile is created before any turn could consolidate one, and an
# explicit consolidation needs memory active. Every operation with a request body is here.
ORDER: list[Operation] = [
    ("POST", "/v1/companies"),
    ("PUT", "/v1/companies/{company_id}/feature-flags/{flag}"),
    ("POST", "/v1/companies/{company_id}/import"),
    ("PUT", "/v1/companies/{company_id}/memory-policy"),
    ("PUT", "/v1/companies/{company_id}/model-budget"),
    ("PUT", "/v1/companies/{company_id}/rate-limits"),
    ("PATCH", "/v1/spaces/{space_id}"),
    ("PUT", "/v1/companies/{company_id}/spaces/{space_id}/settings"),
    ("PATCH", "/v1/me/settings"),
    ("PUT", "/v1/me/memory"),
    ("POST", "/v1/me/memory/import"),
    ("POST", "/v1/chats/{chat_id}/context"),
    ("POST", "/v1/chats/{chat_id}/turns"),
    ("POST", "/v1/me/memory/consolidations"),
]

# Path parameters with no example that could work as-is: the id only exists once a job does.
NO_EXAMPLE = {"job_id": "a job's id comes from a saved turn or a consolidation request"}


def _operations(spec: dict[str, Any]) -> Iterator[tuple[Operation, dict[str, Any]]]:
    for path, item in spec["paths"].items():
        for method, operation in item.items():
            yield (method.upper(), path), operation


def _body(operation: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """(media type, content) of the operation's one request body: JSON, or another text such
    as an NDJSON stream, which is sent as it is."""
    ((media_type, content),) = operation["requestBody"]["content"].items()
    return media_type, content


def _first_example(parameter: dict[str, Any]) -> Any:
    examples = parameter.get("examples") or {}
    return next(iter(examples.values()))["value"] if examples else None


def _request(path: str, operation: dict[str, Any]) -> tuple[str, dict[str, str], dict[str, str]]:
    """(URL, query, headers) with every example value of the operation's parameters."""
    query: dict[str, str] = {}
    headers: dict[str, str] = {}
    for parameter in operation.get("parameters", ()):
        value = _first_example(parameter)
        if value is None:
            assert not parameter.get("required"), f"{path}: {parameter['name']} has no example"
            continue
        where, name = parameter["in"], parameter["name"]
        if where == "path":
            path = path.replace(f"{{{name}}}", str(value))
        elif where == "query":
            query[name] = str(value)
        elif where == "header":
            headers[name] = str(value)
    return path, query, headers


def test_every_operation_with_a_body_has_its_place_and_an_example(app: FastAPI) -> None:
    with_body = {
        key: _body(operation)[1]
        for key, operation in _operations(app.openapi())
        if "requestBody" in operation
    }

    assert sorted(with_body) == sorted(ORDER)
    for key, content in with_body.items():
        assert content.get("examples"), f"{key}: the request body has no example"


def test_every_path_parameter_has_an_example(app: FastAPI) -> None:
    for key, operation in _operations(app.openapi()):
        for parameter in operation.get("parameters", ()):
            if parameter["in"] == "path" and parameter["name"] not in NO_EXAMPLE:
                assert _first_example(parameter) is not None, (key, parameter["name"])


async def test_every_request_example_works_as_it_is(
    app: FastAPI, client: httpx.AsyncClient, make_token: TokenFactory
) -> None:
    token = make_token("alice", "acme", ("operator", "space_admin"))
    operations = dict(_operations(app.openapi()))
    sent: list[str] = []

    for method, template in ORDER:
        operation = operations[(method, template)]
        path, query, headers = _request(template, operation)
        media_type, content = _body(operation)
        is_json = media_type == "application/json"
        for name, example in content["examples"].items():
            response = await client.request(
                method,
                path,
                params=query,
                json=example["value"] if is_json else None,
                content=None if is_json else example["value"],
                headers={
                    **headers,
                    "Content-Type": media_type,
                    "Authorization": f"Bearer {token}",
                },
            )

            assert 200 <= response.status_code < 300, (
                f"{method} {path} with the example {name!r} ({headers}): "
                f"{response.status_code} {response.text}"
            )
            sent.append(f"{method} {path} {name}")

    # what the sequence set up is what the examples say: memory active, the profile injected
    context = await client.post(
        "/v1/chats/chat-1/context",
        json=operations[("POST", "/v1/chats/{chat_id}/context")]["requestBody"]["content"][
            "application/json"
        ]["examples"]["first_turn"]["value"],
        headers={"Authorization": f"Bearer {token}"},
    )
    assert context.json()["memory"]["injected"] is True, context.text
    assert len(sent) >= len(ORDER)
