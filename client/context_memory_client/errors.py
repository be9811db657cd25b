"""The client's exceptions: every problem+json answer becomes a `ProblemError` subclass chosen by
its status; a request that never got an answer (after retries) is a `TransportError`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx


class MemoryClientError(Exception):
    """Base of everything this client raises."""


@dataclass(frozen=True)
class ProblemField:
    """One invalid input named by a 422 (`errors[]` of the problem document)."""

    field: str
    message: str
    type: str | None = None


class ProblemError(MemoryClientError):
    """An error answer from the service (RFC 9457 problem+json).

    `request_id` is the id to quote when reporting the failure (the `request_id` member, or the
    `X-Request-ID` header when the body has none); `retry_after` is the server's `Retry-After`
    in seconds when it sent one.
    """

    def __init__(  # noqa: PLR0913 - the members of a problem document, keyword-only
        self,
        status: int,
        title: str,
        detail: str,
        *,
        type: str = "about:blank",
        request_id: str | None = None,
        errors: tuple[ProblemField, ...] = (),
        retry_after: float | None = None,
    ) -> None:
        super().__init__(f"{status} {title}: {detail}" + (f" [{request_id}]" if request_id else ""))
        self.status = status
        self.title = title
        self.detail = detail
        self.type = type
        self.request_id = request_id
        self.errors = errors
        self.retry_after = retry_after


class BadRequest(ProblemError):
    """400: the request could not be read (malformed JSON, say)."""


class Unauthorized(ProblemError):
    """401: no token, or a token the service does not accept."""


class Forbidden(ProblemError):
    """403: the token is valid but lacks the role the route needs."""


class NotFound(ProblemError):
    """404: the thing does not exist, or the caller may not see it."""


class Conflict(ProblemError):
    """409: the request conflicts with the current state (memory off, key reused, ...)."""


class PreconditionFailed(ProblemError):
    """412: `If-Match` does not name the current version (re-read and retry)."""


class PayloadTooLarge(ProblemError):
    """413: the body is over the service's size limit."""


class Unprocessable(ProblemError):
    """422: the input is invalid; `errors` names each field."""


class PreconditionRequired(ProblemError):
    """428: a write that needs `If-Match` (or `If-None-Match: *`) was sent without it."""


class TooManyRequests(ProblemError):
    """429: slow down; `retry_after` says for how long."""


class ServerError(ProblemError):
    """A 5xx other than 503."""


class ServiceUnavailable(ServerError):
    """503: the service (usually its database) is unavailable for now; `retry_after` says when
    to come back."""


class TransportError(MemoryClientError):
    """No answer: the connection failed or the request timed out (after the retries allowed).
    The httpx exception is the `__cause__`."""


_BY_STATUS: dict[int, type[ProblemError]] = {
    400: BadRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    412: PreconditionFailed,
    413: PayloadTooLarge,
    422: Unprocessable,
    428: PreconditionRequired,
    429: TooManyRequests,
    503: ServiceUnavailable,
}


def problem_from_response(response: httpx.Response, retry_after: float | None) -> ProblemError:
    """The typed exception for an error answer, problem+json or not."""
    body: dict[str, Any] = {}
    try:
        parsed = response.json()
        if isinstance(parsed, dict):
            body = parsed
    except ValueError:
        pass
    status = response.status_code
    cls = _BY_STATUS.get(status) or (ServerError if status >= 500 else ProblemError)
    raw_errors = body.get("errors")
    errors = tuple(
        ProblemField(str(e.get("field", "")), str(e.get("message", "")), e.get("type"))
        for e in (raw_errors if isinstance(raw_errors, list) else [])
        if isinstance(e, dict)
    )
    return cls(
        status,
        str(body.get("title") or response.reason_phrase or "Error"),
        str(body.get("detail") or response.text[:500]),
        type=str(body.get("type") or "about:blank"),
        request_id=body.get("request_id") or response.headers.get("x-request-id"),
        errors=errors,
        retry_after=retry_after,
    )
