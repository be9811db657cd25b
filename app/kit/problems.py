"""The one renderer of RFC 9457 problem+json responses, and the app's error handlers: a
`DomainError` (app/kit/errors.py), a request FastAPI refuses, an HTTP error of the router, and
the last resort for anything unexpected."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.routing import iter_route_contexts
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response
from starlette.routing import compile_path

from app.kit.db.errors import is_database_unavailable
from app.kit.errors import (
    HTTP_ERROR,
    INTERNAL_ERROR,
    METHOD_NOT_ALLOWED,
    PROBLEM_BASE,
    PROBLEM_CONTENT_TYPE,
    Conflict,
    DatabaseUnavailable,
    DomainError,
    InvalidRequest,
    NoSuchResource,
    ProblemType,
)
from app.kit.observability import current_request_id
from app.kit.tracing import trace_ids

logger = logging.getLogger("app.kit.errors")


def problem_response(
    problem: ProblemType,
    detail: str,
    *,
    errors: Sequence[Mapping[str, object]] | None = None,
    headers: Mapping[str, str] | None = None,
) -> Response:
    """The one renderer: RFC 9457 problem+json with the request id, the trace id (when the
    request is traced and sampled) and the offending fields; on every 409, `retryable`, so a
    client tells a conflict worth sending again from one that is not without knowing types."""
    status = problem.status
    body: dict[str, Any] = {
        "type": PROBLEM_BASE + problem.slug,
        "title": problem.title,
        "status": status,
        "detail": detail,
    }
    if status == Conflict.status:
        body["retryable"] = problem.retryable
    request_id = current_request_id()
    if request_id:
        body["request_id"] = request_id
    traced = trace_ids()
    if traced is not None:
        body["trace_id"] = traced[0]
    if errors:
        body["errors"] = list(errors)
    return Response(
        orjson.dumps(body), status_code=status, media_type=PROBLEM_CONTENT_TYPE, headers=headers
    )


def _validation_errors(exc: RequestValidationError) -> list[dict[str, object]]:
    """Offending fields without echoing the input back (it may be user text)."""
    out: list[dict[str, object]] = []
    for err in exc.errors():
        loc = [str(part) for part in err.get("loc", ())]
        out.append(
            {"field": ".".join(loc), "message": str(err.get("msg", "")), "type": err.get("type")}
        )
    return out


def render(error: DomainError) -> Response:
    """The problem+json of `error`: its type, detail, offending fields and header fields."""
    return problem_response(
        error.problem_type(), error.detail, errors=error.errors, headers=error.headers
    )


_HTTP_PROBLEMS = {404: NoSuchResource.problem_type(), 405: METHOD_NOT_ALLOWED}


def render_unexpected_error(
    exc: BaseException, *, retry_after_seconds: int, on_unavailable: Callable[[], None]
) -> Response:
    """The last resort (called by the request middleware, so the request id header and the
    metrics cover it): 503 + Retry-After when the database is unreachable, else an opaque 500."""
    if is_database_unavailable(exc):
        on_unavailable()
        logger.warning("database unavailable: %s", type(exc).__name__)
        return render(DatabaseUnavailable(retry_after_seconds))
    logger.error("unhandled error", exc_info=exc)
    return problem_response(
        INTERNAL_ERROR, "An unexpected error occurred; quote the request id when reporting it."
    )


def _allowed_methods(request: Request) -> str:
    """Every method of every route of the request's path: Starlette's 405 names only the
    methods of the first route that matched the path (`GET` and `PATCH` are two routes)."""
    path = request.scope.get("path", "")
    methods: set[str] = set()
    for context in iter_route_contexts(request.app.routes):
        route_methods = getattr(context.original_route, "methods", None)
        if context.path and route_methods and compile_path(context.path)[0].match(path):
            methods |= set(route_methods)
    return ", ".join(sorted(methods))


def install_error_handlers(app: FastAPI) -> None:
    async def domain_error(_: Request, exc: Exception) -> Response:
        assert isinstance(exc, DomainError)
        return render(exc)

    async def validation_error(_: Request, exc: Exception) -> Response:
        assert isinstance(exc, RequestValidationError)
        return render(InvalidRequest(_validation_errors(exc)))

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, StarletteHTTPException)
        problem = _HTTP_PROBLEMS.get(exc.status_code, HTTP_ERROR._replace(status=exc.status_code))
        detail = exc.detail if isinstance(exc.detail, str) else problem.title
        if exc.status_code == 404:
            detail = NoSuchResource().detail
        headers = dict(exc.headers or {})
        if exc.status_code == 405:
            headers["Allow"] = _allowed_methods(request)
        return problem_response(problem, detail, headers=headers)

    app.add_exception_handler(DomainError, domain_error)
    app.add_exception_handler(RequestValidationError, validation_error)
    app.add_exception_handler(StarletteHTTPException, http_error)
