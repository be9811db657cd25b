"""`LeanRoute`: a FastAPI route whose parameters are resolved by a small fixed plan instead of
FastAPI's generic request handler, for the two calls of every chat turn.

FastAPI still reads the endpoint's signature, so routing, OpenAPI and the documented
parameters are unchanged. At request time the plan, built once per route, does only this:

1. each dependency, by the provider registered for it in `providers` (a route whose endpoint
   declares a dependency without a provider fails when the app is built, not at request time);
2. path parameters, validated by FastAPI's own parameter fields (`ModelField.validate`);
3. the one body model, parsed once from the raw bytes (`model_validate_json`), with FastAPI's
   rules for the content type (JSON or `+json`; none at all is refused);
4. the endpoint, which returns a ready `Response` (no response model re-validation, no
   `jsonable_encoder`).

Errors keep FastAPI's shapes: providers raise their own (401 first, as a dependency would),
and path and body problems are one `RequestValidationError` (path first, then body) with the
same `loc`s, rendered by the app's problem+json handler.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine, Mapping
from typing import Any, ClassVar, cast

from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from pydantic import BaseModel, ValidationError
from starlette.requests import Request
from starlette.responses import Response

Provider = Callable[[Request], Awaitable[object]]


class LeanRoute(APIRoute):
    """Serve the route with a fixed plan; subclasses name the `providers` of their dependencies
    (dependency callable -> `async (request) -> value`)."""

    providers: ClassVar[Mapping[Callable[..., Any], Provider]] = {}

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        dependant = self.dependant
        unsupported = dependant.query_params or dependant.header_params or dependant.cookie_params
        if unsupported or len(dependant.body_params) != 1:
            raise TypeError(f"{self.path}: a LeanRoute takes path parameters and one body model")
        resolvers: list[tuple[str, Provider]] = []
        for sub in dependant.dependencies:
            provider = self.providers.get(sub.call) if sub.call is not None else None
            if provider is None or sub.name is None:
                raise TypeError(f"{self.path}: no provider for the dependency {sub.call!r}")
            resolvers.append((sub.name, provider))
        path_fields = [(field.alias, field) for field in dependant.path_params]
        body_field = dependant.body_params[0]
        body_name = body_field.name
        model = cast(type[BaseModel], body_field.field_info.annotation)
        endpoint = cast(Callable[..., Awaitable[Response]], dependant.call)

        async def handle(request: Request) -> Response:
            values: dict[str, object] = {}
            for name, provide in resolvers:
                values[name] = await provide(request)
            errors: list[dict[str, Any]] = []
            for alias, field in path_fields:  # present: the route matched
                value, field_errors = field.validate(
                    request.path_params[alias], loc=("path", alias)
                )
                values[field.name] = value
                errors.extend(field_errors)
            body, body_errors = await _parsed_body(request, model)
            errors.extend(body_errors)
            if errors:
                raise RequestValidationError(errors)
            values[body_name] = body
            return await endpoint(**values)

        return handle


async def _parsed_body(
    request: Request, model: type[BaseModel]
) -> tuple[BaseModel | None, list[dict[str, Any]]]:
    raw = await request.body()
    if not raw:
        return None, [{"type": "missing", "loc": ("body",), "msg": "Field required", "input": None}]
    if not _is_json(request.headers.get("content-type")):
        return None, [
            {
                "type": "model_attributes_type",
                "loc": ("body",),
                "msg": "Input should be a valid JSON object sent as application/json",
                "input": None,
            }
        ]
    try:
        return model.model_validate_json(raw), []
    except ValidationError as exc:
        return None, [
            {**error, "loc": ("body", *error["loc"])}
            for error in exc.errors(include_url=False, include_context=False, include_input=False)
        ]


def _is_json(content_type: str | None) -> bool:
    """FastAPI's rule: `application/json` or `application/<anything>+json`, parameters aside."""
    if not content_type:
        return False
    media_type = content_type.partition(";")[0].strip().lower()
    main, _, sub = media_type.partition("/")
    return main == "application" and (sub == "json" or sub.endswith("+json"))
