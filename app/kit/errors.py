"""Typed domain errors and the one renderer of RFC 9457 problem+json responses."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar, NamedTuple

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.routing import iter_route_contexts
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response
from starlette.routing import compile_path

from app.kit.db import is_database_unavailable
from app.kit.observability import current_request_id
from app.kit.tracing import trace_ids

PROBLEM_CONTENT_TYPE = "application/problem+json"
PROBLEM_BASE = "urn:context-memory:problem:"

logger = logging.getLogger("app.kit.errors")


class ProblemType(NamedTuple):
    """A kind of problem: its status, its human title and the slug of its `type` URI; and,
    rendered on a 409 only (`retryable` of the body), whether the same request sent again can
    succeed without anything else changing first."""

    status: int
    title: str
    slug: str
    retryable: bool = False


class DomainError(Exception):
    """An error the client caused or can act on; carries its HTTP status and problem type."""

    status: ClassVar[int] = 400
    title: ClassVar[str] = "Bad request"
    slug: ClassVar[str] = "bad-request"
    retryable: ClassVar[bool] = False

    @classmethod
    def problem_type(cls) -> ProblemType:
        return ProblemType(cls.status, cls.title, cls.slug, cls.retryable)

    def __init__(
        self,
        detail: str,
        *,
        errors: Sequence[Mapping[str, object]] | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(detail)
        self.detail = detail
        self.errors = list(errors) if errors else None
        self.headers = dict(headers) if headers else {}


class Unauthorized(DomainError):
    status = 401
    title = "Unauthorized"
    slug = "unauthorized"

    def __init__(self, detail: str = "invalid token", *, challenge: str = "Bearer") -> None:
        """`challenge`: the `WWW-Authenticate` value (RFC 6750), plain `Bearer` but where a
        route names more, such as `/mcp` its resource metadata (RFC 9728 §5.1)."""
        super().__init__(detail, headers={"WWW-Authenticate": challenge})


class Forbidden(DomainError):
    status = 403
    title = "Forbidden"
    slug = "forbidden"


class NotFound(DomainError):
    status = 404
    title = "Not found"
    slug = "not-found"


class Conflict(DomainError):
    """The request contradicts what is stored (memory turned off, a job that is not dead, a
    company that holds data): sending it again fails the same way until that changes."""

    status = 409
    title = "Conflict"
    slug = "conflict"


class RetryableConflict(Conflict):
    """The request met a concurrent one (its Idempotency-Key in flight, a race it lost) and
    nothing of it was written: the same request, sent again after `Retry-After` seconds, can
    succeed as it is."""

    title = "Conflict, retry"
    slug = "conflict-retry"
    retryable = True

    def __init__(self, detail: str, *, retry_after_seconds: int = 1) -> None:
        super().__init__(detail, headers={"Retry-After": str(retry_after_seconds)})


class QuotaExceeded(DomainError):
    """A stored amount reached its quota (history, storage, users with memory): nothing of the
    request was written; it succeeds again once something is deleted or the quota raised."""

    status = 409
    title = "Quota exceeded"
    slug = "quota-exceeded"


class RequestTimeout(DomainError):
    """The request's body did not arrive in time (REQUEST_BODY_TIMEOUT_SECONDS)."""

    status = 408
    title = "Request timeout"
    slug = "request-timeout"


class PreconditionFailed(DomainError):
    status = 412
    title = "Precondition failed"
    slug = "precondition-failed"


class PayloadTooLarge(DomainError):
    status = 413
    title = "Payload too large"
    slug = "payload-too-large"


class Unprocessable(DomainError):
    status = 422
    title = "Unprocessable content"
    slug = "validation"

    @classmethod
    def field(cls, field: str, message: str) -> Unprocessable:
        """A 422 naming one offending field (dotted path, as in validation errors)."""
        return cls(message, errors=[{"field": field, "message": message}])


class PreconditionRequired(DomainError):
    status = 428
    title = "Precondition required"
    slug = "precondition-required"


class HeaderFieldsTooLarge(DomainError):
    """Too many request header fields, or too many bytes of them (RFC 6585 §5)."""

    status = 431
    title = "Request header fields too large"
    slug = "header-fields-too-large"


class TooManyRequests(DomainError):
    """Over a rate limit or a concurrency limit: retry after `Retry-After` seconds."""

    status = 429
    title = "Too many requests"
    slug = "rate-limited"


class ServiceUnavailable(DomainError):
    status = 503
    title = "Service unavailable"
    slug = "unavailable"


INTERNAL_ERROR = ProblemType(500, "Internal server error", "internal")
METHOD_NOT_ALLOWED = ProblemType(405, "Method not allowed", "method-not-allowed")
HTTP_ERROR = ProblemType(400, "HTTP error", "http")
"""Any other error the framework raises (a body it cannot parse: 400), with that error's status."""
OTHER_PROBLEMS = (INTERNAL_ERROR, METHOD_NOT_ALLOWED, HTTP_ERROR)
"""The problem types rendered besides those of `DomainError` and its subclasses."""


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


_HTTP_PROBLEMS = {404: NotFound.problem_type(), 405: METHOD_NOT_ALLOWED}


def render_unexpected_error(
    exc: BaseException, *, retry_after_seconds: int, on_unavailable: Callable[[], None]
) -> Response:
    """The last resort (called by the request middleware, so the request id header and the
    metrics cover it): 503 + Retry-After when the database is unreachable, else an opaque 500."""
    if is_database_unavailable(exc):
        on_unavailable()
        logger.warning("database unavailable: %s", type(exc).__name__)
        return problem_response(
            ServiceUnavailable.problem_type(),
            "The database is unavailable; retry later.",
            headers={"Retry-After": str(retry_after_seconds)},
        )
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
        return problem_response(
            exc.problem_type(), exc.detail, errors=exc.errors, headers=exc.headers
        )

    async def validation_error(_: Request, exc: Exception) -> Response:
        assert isinstance(exc, RequestValidationError)
        return problem_response(
            Unprocessable.problem_type(),
            "The request is invalid; see errors for the offending fields.",
            errors=_validation_errors(exc),
        )

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, StarletteHTTPException)
        problem = _HTTP_PROBLEMS.get(exc.status_code, HTTP_ERROR._replace(status=exc.status_code))
        detail = exc.detail if isinstance(exc.detail, str) else problem.title
        if exc.status_code == 404:
            detail = "No such resource."
        headers = dict(exc.headers or {})
        if exc.status_code == 405:
            headers["Allow"] = _allowed_methods(request)
        return problem_response(problem, detail, headers=headers)

    app.add_exception_handler(DomainError, domain_error)
    app.add_exception_handler(RequestValidationError, validation_error)
    app.add_exception_handler(StarletteHTTPException, http_error)
