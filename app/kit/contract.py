"""The published OpenAPI contract: every operation declares each error status it can answer,
rendered by the one problem+json schema, and `JsonInt`, an integer as JSON Schema means it.

FastAPI documents a route's own responses; this module adds what routes do not say themselves,
derived once from each route, so a route added later is covered without a line here:

- 401 (`WWW-Authenticate: Bearer`) when a dependency resolves the caller (`current_principal`);
- 403 when a dependency is a role check (`app.kit.auth.dependencies.role_check`);
- 429 (`Retry-After`) when a dependency is a rate limit (`RATE_LIMITS`), and the
  `RateLimit-Policy` and `RateLimit` header fields on every response of such an operation;
- 400 and 413 when the operation takes a body (not JSON text; over the size limit), 422 when it
  takes any input;
- 503 (`Retry-After`) unless the operation never touches the database.

Every 4xx/5xx response, declared by a route or added here, gets the `Problem` schema under
`application/problem+json`, which is what `app.kit.errors` renders; FastAPI's `HTTPValidationError`
components are gone, since no response of the service has that shape.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Annotated, Any, Final

from fastapi import FastAPI
from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute, iter_route_contexts
from pydantic import BeforeValidator, StrictInt
from starlette.routing import BaseRoute

from app.kit.auth.dependencies import ROLE_CHECKS, current_principal
from app.kit.errors import PROBLEM_CONTENT_TYPE

OpenAPI = dict[str, Any]

PROBLEM_REF: Final = "#/components/schemas/Problem"
_FASTAPI_VALIDATION_SCHEMAS = ("HTTPValidationError", "ValidationError")

# Operations that never open a connection, so the database being down cannot answer 503.
NO_DATABASE: Final = frozenset({("GET", "/healthz"), ("GET", "/metrics"), ("GET", "/v1/me")})

PROBLEM_SCHEMAS: Final[Mapping[str, OpenAPI]] = {
    "Problem": {
        "type": "object",
        "title": "Problem",
        "description": "An RFC 9457 problem: every error response of the service.",
        "required": ["type", "title", "status", "detail"],
        "properties": {
            "type": {"type": "string", "description": "urn:context-memory:problem:<slug>"},
            "title": {"type": "string"},
            "status": {"type": "integer", "minimum": 400, "maximum": 599},
            "detail": {"type": "string"},
            "request_id": {"type": "string", "description": "Quote it when reporting a problem"},
            "trace_id": {
                "type": "string",
                "pattern": "^[0-9a-f]{32}$",
                "description": "The request's trace (W3C trace id), when tracing is on and the "
                "request was sampled",
            },
            "errors": {
                "type": "array",
                "items": {"$ref": "#/components/schemas/ProblemField"},
                "description": "The offending fields, for invalid requests",
            },
            "retryable": {
                "type": "boolean",
                "description": "Present on every 409, on no other status: true when the same "
                "request, sent again after `Retry-After` seconds, can succeed as it is "
                "(`conflict-retry`); false when something must change first (`conflict`, "
                "`quota-exceeded`)",
            },
        },
        "additionalProperties": False,
    },
    "ProblemField": {
        "type": "object",
        "title": "ProblemField",
        "required": ["field", "message"],
        "properties": {
            "field": {
                "type": "string",
                "description": "Dotted location, e.g. `body.messages.0.content`",
            },
            "message": {"type": "string"},
            "type": {"type": "string", "description": "The kind of validation error"},
        },
        "additionalProperties": False,
    },
}

_GENERIC: Final[Mapping[int, str]] = {
    400: "The body could not be read as JSON text (e.g. it is not UTF-8)",
    401: "Missing, malformed, expired or invalid bearer token",
    403: "The token lacks the role this operation needs",
    413: "The request body is over the size limit",
    422: "The request is invalid; `errors` names the offending fields",
    429: "Over a rate limit; retry after `Retry-After` seconds",
    503: "The database is unavailable; retry after `Retry-After` seconds",
}
_RETRY_AFTER: Final[OpenAPI] = {
    "Retry-After": {
        "required": True,
        "description": "Seconds to wait before retrying",
        "schema": {"type": "string", "pattern": "^[0-9]+$"},
    }
}
_HEADERS: Final[Mapping[int, OpenAPI]] = {
    401: {"WWW-Authenticate": {"required": True, "schema": {"type": "string", "enum": ["Bearer"]}}},
    409: {
        "Retry-After": {
            **_RETRY_AFTER["Retry-After"],
            "required": False,
            "description": "Seconds to wait before sending the request again: on every "
            "`conflict-retry`, and on a `quota-exceeded` while the user's waiting jobs are full",
        }
    },
    429: _RETRY_AFTER,
    503: _RETRY_AFTER,
}
RATE_LIMIT_HEADERS: Final[Mapping[str, OpenAPI]] = {
    "RateLimit-Policy": {
        "description": 'The limits that apply (IETF httpapi draft), e.g. `"turns-user";q=120;'
        'w=60, "turns-company";q=3000;w=60`: quota `q` requests per window `w` seconds, as '
        "this process enforces them",
        "schema": {"type": "string"},
    },
    "RateLimit": {
        "description": 'Their state, e.g. `"turns-user";r=119;t=1`: `r` requests remaining, '
        "`t` seconds until the quota is whole again",
        "schema": {"type": "string"},
    },
}

RATE_LIMITS: set[Callable[..., Any]] = set()
"""Dependencies that count a request against rate limits (they raise 429); the published
contract says so for every route that depends on one."""


def _whole_number(value: object) -> object:
    """JSON Schema's integer: `859.0` is the integer 859 (strings and booleans stay refused)."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


WHOLE_NUMBER: Final = BeforeValidator(_whole_number)
"""Put it last in an `Annotated[StrictInt, Field(ge=..., le=...), WHOLE_NUMBER]`: after the
constraints, so they stay `minimum`/`maximum` in the schema."""

JsonInt = Annotated[StrictInt, WHOLE_NUMBER]
"""An integer as the published schema says it: any JSON number without a fraction; never a
string or a boolean. Use it (or `WHOLE_NUMBER`) for every integer a request body takes."""

NUL_FREE_PATTERN: Final = r"^[^\x00]*$"
"""The schema of text that refuses NUL characters (as `Field(json_schema_extra=...)`)."""


def install_contract(app: FastAPI, *, header_max_lengths: Mapping[str, int] | None = None) -> None:
    """Publish the app's OpenAPI with the statuses above; `header_max_lengths` are limits that
    come from settings (header name -> max length), written into the header's schema."""
    limits = dict(header_max_lengths or {})

    def openapi() -> OpenAPI:
        if app.openapi_schema is None:
            spec = FastAPI.openapi(app)  # builds and caches app.openapi_schema
            declare_problems(spec, _api_routes(app.routes), limits)
        return app.openapi_schema  # type: ignore[return-value]  # set by FastAPI.openapi

    # FastAPI's documented way to customise the schema: replace the app's `openapi` callable.
    app.openapi = openapi  # type: ignore[method-assign]


def declare_problems(
    spec: OpenAPI, routes: Iterator[tuple[str, APIRoute]], header_max_lengths: Mapping[str, int]
) -> None:
    """Rewrite `spec` in place: generic statuses, problem+json everywhere, parameter schemas."""
    schemas = spec.setdefault("components", {}).setdefault("schemas", {})
    for name in _FASTAPI_VALIDATION_SCHEMAS:
        schemas.pop(name, None)
    schemas.update(PROBLEM_SCHEMAS)
    spec["components"].setdefault("headers", {}).update(copy.deepcopy(RATE_LIMIT_HEADERS))
    for path, route in routes:
        for method in sorted((route.methods or set()) - {"HEAD"}):
            operation = spec["paths"].get(path, {}).get(method.lower())
            if operation is not None:
                _declare(operation, _generic_statuses(route, (method, path), operation))
                _tidy_parameters(operation, header_max_lengths)


def _api_routes(routes: Sequence[BaseRoute]) -> Iterator[tuple[str, APIRoute]]:
    """(published path, route) of every documented API route, included routers' too."""
    for context in iter_route_contexts(routes):
        route = context.original_route
        if isinstance(route, APIRoute) and route.include_in_schema and context.path_format:
            yield context.path_format, route


def _generic_statuses(route: APIRoute, key: tuple[str, str], operation: OpenAPI) -> set[int]:
    calls = set(_dependency_calls(route.dependant))
    statuses: set[int] = set()
    if current_principal in calls:
        statuses.add(401)
    if calls & ROLE_CHECKS:
        statuses.add(403)
    if calls & RATE_LIMITS:
        statuses.add(429)
    if "requestBody" in operation:
        statuses |= {400, 413, 422}
    if operation.get("parameters"):
        statuses.add(422)
    if key not in NO_DATABASE:
        statuses.add(503)
    return statuses


def _dependency_calls(dependant: Dependant) -> Iterator[Callable[..., Any]]:
    for sub in dependant.dependencies:
        if sub.call is not None:
            yield sub.call
        yield from _dependency_calls(sub)


def _declare(operation: OpenAPI, generic: set[int]) -> None:
    responses: OpenAPI = operation.setdefault("responses", {})
    for status in generic:
        responses.setdefault(str(status), {"description": _GENERIC[status]})
    for key, response in responses.items():
        status = int(key)
        if status < 400:
            continue
        if response.get("description") in (None, "", "Validation Error"):
            response["description"] = _GENERIC.get(status, "See the problem's detail")
        response["content"] = {PROBLEM_CONTENT_TYPE: {"schema": {"$ref": PROBLEM_REF}}}
        if status in _HEADERS:
            response["headers"] = copy.deepcopy(_HEADERS[status])  # no YAML aliases
    if 429 in generic:
        for response in responses.values():
            response.setdefault("headers", {}).update(
                {name: {"$ref": f"#/components/headers/{name}"} for name in RATE_LIMIT_HEADERS}
            )
    operation["responses"] = dict(sorted(responses.items()))


def _tidy_parameters(operation: OpenAPI, header_max_lengths: Mapping[str, int]) -> None:
    """A path, query or header value is text on the wire, never JSON `null`: an optional one is
    documented by `required: false`, so the `null` branch of its schema goes."""
    for parameter in operation.get("parameters", ()):
        schema: OpenAPI = parameter["schema"]
        options = schema.get("anyOf")
        if isinstance(options, list):
            kept = [option for option in options if option != {"type": "null"}]
            if len(kept) == 1:
                rest = {key: value for key, value in schema.items() if key != "anyOf"}
                schema = {**kept[0], **rest}
        limit = header_max_lengths.get(parameter["name"])
        if parameter["in"] == "header" and limit is not None:
            schema = {**schema, "maxLength": limit}
        parameter["schema"] = schema
