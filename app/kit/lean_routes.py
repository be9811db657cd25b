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

The plan never reads `app.dependency_overrides`, so an override of a lean route's dependency
would be ignored there while every other route obeys it. `guard_dependency_overrides` turns that
into an error (`IgnoredOverride`), at no cost per request: see its docstring.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Self, cast

from fastapi import FastAPI
from fastapi.dependencies.models import Dependant
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from pydantic import BaseModel, ValidationError
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute

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


class IgnoredOverride(TypeError):
    """An `app.dependency_overrides` entry that a lean route of the app would ignore."""


@dataclass(frozen=True)
class _Served:
    """A dependency (or one of its own dependencies) that a lean route resolves itself."""

    route: str  # "POST /v1/chats/{chat_id}/turns"
    dependency: Callable[..., Any]  # the route's dependency whose provider covers it
    provider: Provider


class GuardedOverrides(dict[Callable[..., Any], Callable[..., Any]]):
    """`app.dependency_overrides` that refuses a key a lean route resolves by its provider."""

    def __init__(self, lean: Mapping[Callable[..., Any], tuple[_Served, ...]]) -> None:
        super().__init__()
        self._lean = lean

    def __setitem__(self, key: Callable[..., Any], value: Callable[..., Any]) -> None:
        served = self._lean.get(key)
        if served:
            raise IgnoredOverride(_ignored(key, served))
        super().__setitem__(key, value)

    def update(self, *args: Any, **kwargs: Any) -> None:
        for key, value in dict(*args, **kwargs).items():
            self[key] = value

    def setdefault(self, key: Callable[..., Any], default: Any = None) -> Any:
        if key not in self:
            self[key] = default
        return self[key]

    def __ior__(self, other: Any) -> Self:  # type: ignore[override,misc]  # dict has overloads
        self.update(other)
        return self


def guard_dependency_overrides(app: FastAPI) -> None:
    """Make every override of a dependency that a lean route of `app` resolves by its provider
    (that dependency, or any dependency of its own, such as the bearer scheme under the
    principal) an `IgnoredOverride` naming the routes, the dependency and the provider.

    Nothing is checked per request: the check runs when an override is set. `app`'s
    `dependency_overrides` becomes a `GuardedOverrides`, which refuses such a key on
    `[key] = ...`, `update`, `setdefault` and `|=`, at any time; the overrides already there are
    checked now. The app factory calls this once its routes are installed, and the lifespan
    again at start-up, which catches a plain dict assigned to `app.dependency_overrides` in
    between (and guards it in turn). A plain dict assigned after start-up is not seen.
    """
    lean: dict[Callable[..., Any], tuple[_Served, ...]] = {}
    for route in _lean_routes(app.router.routes):
        label = f"{','.join(sorted(route.methods or ()))} {route.path}"
        for sub in route.dependant.dependencies:
            if sub.call is None:
                continue
            served = _Served(label, sub.call, route.providers[sub.call])
            for call in {*_calls(sub)}:
                lean[call] = (*lean.get(call, ()), served)
    guarded = GuardedOverrides(lean)
    guarded.update(app.dependency_overrides)
    app.dependency_overrides = guarded


def _lean_routes(routes: Iterable[BaseRoute]) -> Iterator[LeanRoute]:
    """The lean routes among `routes`, those of included routers too."""
    for route in routes:
        if isinstance(route, LeanRoute):
            yield route
        included = getattr(route, "original_router", None)  # FastAPI's included router
        if included is not None:
            yield from _lean_routes(included.routes)


def _calls(dependant: Dependant) -> Iterator[Callable[..., Any]]:
    if dependant.call is not None:
        yield dependant.call
    for sub in dependant.dependencies:
        yield from _calls(sub)


def _ignored(key: Callable[..., Any], served: tuple[_Served, ...]) -> str:
    routes = ", ".join(sorted({s.route for s in served}))
    providers = ", ".join(
        sorted(
            {
                f"{_name(s.provider)} (the provider of {_name(s.dependency)}"
                + (")" if s.dependency is key else ", which depends on it)")
                for s in served
            }
        )
    )
    return (
        f"app.dependency_overrides[{_name(key)}] would be ignored by the lean route(s) "
        f"{routes}, which resolve it with {providers} and never read the overrides: "
        "change what the provider reads (app.state, the settings) instead"
    )


def _name(call: object) -> str:
    name = getattr(call, "__name__", None) or type(call).__name__
    return f"{getattr(call, '__module__', None) or type(call).__module__}.{name}"


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
