"""Both clients call every operation of `openapi.yaml`, and each says which one it calls.

The Python client: each call function of `calls.py` declares its operation with
`@operation(method, path)` (collected in `calls.OPERATIONS`), and `AsyncMemoryClient` (which the
blocking client is generated from) has a method that sends it. The TypeScript client: each
request of `clients/typescript/src/client.ts` is built by `route("METHOD /path/{name}")`, whose
argument `tsc` checks against the contract's paths. An operation without a call in either
client fails here, named with the client it lacks, unless `EXCLUDED` gives the reason it has
none.
"""

from __future__ import annotations

import ast
import re
from typing import Any

import yaml
from context_memory_client import calls

from app.kit.config import PROJECT_ROOT
from tests.client.test_models_match_openapi import CALLS, _sample

OPENAPI: dict[str, Any] = yaml.safe_load((PROJECT_ROOT / "openapi.yaml").read_text("utf-8"))
ASYNC_CLIENT = PROJECT_ROOT / "client" / "context_memory_client" / "async_client.py"
TS_CLIENT = PROJECT_ROOT / "clients" / "typescript" / "src" / "client.ts"
METHODS = ("get", "put", "post", "delete", "patch")
Operation = tuple[str, str]

EXCLUDED: dict[Operation, str] = {
    ("GET", "/metrics"): "Prometheus's scrape (text exposition format), not an API call",
}
"""Operations of openapi.yaml that the clients do not call, each with its reason."""

TS_ROUTE = re.compile(r'\broute\(\s*"(GET|PUT|POST|PATCH|DELETE) (/[^"]*)"')


def contract_operations() -> set[Operation]:
    return {
        (method.upper(), path)
        for path, item in OPENAPI["paths"].items()
        for method in item
        if method in METHODS
    }


def python_operations(source: str) -> dict[Operation, list[str]]:
    """Each operation that `AsyncMemoryClient` (in `source`) sends, with the methods sending it:
    those that use a call function `calls.X` whose `@operation` declares it."""
    cls = next(
        node
        for node in ast.parse(source).body
        if isinstance(node, ast.ClassDef) and node.name == "AsyncMemoryClient"
    )
    found: dict[Operation, list[str]] = {}
    for method in cls.body:
        if not isinstance(method, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        for node in ast.walk(method):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id == "calls"
                and node.attr in calls.OPERATIONS
            ):
                found.setdefault(calls.OPERATIONS[node.attr], []).append(method.name)
    return found


def typescript_operations(source: str) -> set[Operation]:
    return {(method, path) for method, path in TS_ROUTE.findall(source)}


def missing_calls(
    operations: set[Operation], python: set[Operation], typescript: set[Operation]
) -> list[str]:
    """One line per operation and client that lacks its call."""
    lines = []
    for method, path in sorted(operations - EXCLUDED.keys(), key=lambda o: (o[1], o[0])):
        if (method, path) not in python:
            lines.append(
                f"{method} {path}: no call in the Python client (a function of "
                "client/context_memory_client/calls.py with @operation"
                f'("{method}", "{path}"), sent by a method of AsyncMemoryClient)'
            )
        if (method, path) not in typescript:
            lines.append(
                f"{method} {path}: no call in the TypeScript client (a method of "
                f'clients/typescript/src/client.ts building its request with route("{method} '
                f'{path}", ...))'
            )
    return lines


def test_every_operation_has_a_call_in_the_python_and_the_typescript_client() -> None:
    python = set(python_operations(ASYNC_CLIENT.read_text("utf-8")))
    typescript = typescript_operations(TS_CLIENT.read_text("utf-8"))
    missing = missing_calls(contract_operations(), python, typescript)
    assert not missing, "operations of openapi.yaml without a client call:\n" + "\n".join(missing)


def test_every_exclusion_is_an_operation_of_the_contract_with_a_reason() -> None:
    operations = contract_operations()
    for operation, reason in EXCLUDED.items():
        assert operation in operations, f"{operation} is excluded but not in openapi.yaml"
        assert len(reason.split()) >= 3, f"{operation}: say why it has no call"


def test_every_declared_operation_is_in_the_contract_and_is_what_its_call_sends() -> None:
    """A declaration cannot lie: the request each call function builds (with a placeholder for
    every argument) has the declared method, and a path its template matches."""
    operations = contract_operations()
    undeclared = sorted(set(CALLS) - set(calls.OPERATIONS))
    assert not undeclared, f"call functions of calls.py without @operation(...): {undeclared}"
    for name, (method, path) in calls.OPERATIONS.items():
        assert (method, path) in operations, f"{name}: {method} {path} is not in openapi.yaml"
        call = _sample(CALLS[name])
        template = re.sub(r"\\\{[^/]+?\\\}", "[^/]+", re.escape(path))
        assert call.method == method, f"{name} declares {method}, sends {call.method}"
        assert re.fullmatch(template, call.path), f"{name} declares {path}, sends {call.path}"


def test_the_typescript_client_builds_every_request_with_a_route() -> None:
    """No request of client.ts names its method or path but through `route(...)`, so the routes
    this test reads are all the routes it calls."""
    source = TS_CLIENT.read_text("utf-8")
    assert len(typescript_operations(source)) >= 40
    unrouted = re.findall(r'\bmethod:\s*"[A-Z]+"\s*[,}].*|\bpath:\s*[`"].*', source)
    assert not unrouted, f"requests of client.ts built without route(...): {unrouted}"


def test_a_missing_call_is_named_with_the_client_that_lacks_it() -> None:
    """What the failure says when a route is added to the contract without its calls."""
    added = ("DELETE", "/v1/companies/{company_id}/users/{user_id}")
    only_python = ("GET", "/v1/companies/{company_id}/spaces")
    lines = missing_calls({added, only_python, *EXCLUDED}, {only_python}, set())
    assert lines == [
        "GET /v1/companies/{company_id}/spaces: no call in the TypeScript client (a method of "
        'clients/typescript/src/client.ts building its request with route("GET '
        '/v1/companies/{company_id}/spaces", ...))',
        "DELETE /v1/companies/{company_id}/users/{user_id}: no call in the Python client (a "
        'function of client/context_memory_client/calls.py with @operation("DELETE", '
        '"/v1/companies/{company_id}/users/{user_id}"), sent by a method of AsyncMemoryClient)',
        "DELETE /v1/companies/{company_id}/users/{user_id}: no call in the TypeScript client (a "
        'method of clients/typescript/src/client.ts building its request with route("DELETE '
        '/v1/companies/{company_id}/users/{user_id}", ...))',
    ]


def test_a_call_function_no_client_method_sends_does_not_count() -> None:
    source = (
        "class AsyncMemoryClient:\n"
        "    async def get_me(self):\n"
        "        return await self.send(calls.get_me())\n"
        "def elsewhere():\n"
        "    return calls.erase_me()\n"
    )
    assert python_operations(source) == {("GET", "/v1/me"): ["get_me"]}
