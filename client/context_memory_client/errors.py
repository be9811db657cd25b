"""The client's exceptions: every problem+json answer becomes a `ProblemError` subclass chosen by
its status (and, for a conflict worth sending again, its type); a request that never got an
answer (after retries) is a `TransportError`; a success answer that is not what the API
promises is an `UnexpectedResponse`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import httpx

CONFLICT_RETRY_TYPE = "urn:context-memory:problem:conflict-retry"
"""The problem type of a 409 that the same request, sent again after `Retry-After`, can get past."""


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
    in seconds when it sent one. `retryable` says whether the same request, sent again later,
    can succeed as it is: the problem's `retryable` member where the service sends one (on every
    409), otherwise true for a 429, a 503 or a `RetryableConflict` only.
    """

    retryable_by_default: ClassVar[bool] = False

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
        retryable: bool | None = None,
    ) -> None:
        super().__init__(f"{status} {title}: {detail}" + (f" [{request_id}]" if request_id else ""))
        self.status = status
        self.title = title
        self.detail = detail
        self.type = type
        self.request_id = request_id
        self.errors = errors
        self.retry_after = retry_after
        self.retryable = self.retryable_by_default if retryable is None else retryable


class BadRequest(ProblemError):
    """400: the request could not be read (malformed JSON, say)."""


class Unauthorized(ProblemError):
    """401: no token, or a token the service does not accept."""


class Forbidden(ProblemError):
    """403: the token is valid but lacks the role the route needs."""


class NotFound(ProblemError):
    """404: the thing does not exist, or the caller may not see it."""


class Conflict(ProblemError):
    """409: the request conflicts with the current state (memory off, key reused, a quota
    reached, ...); `retryable` is false unless it is a `RetryableConflict`."""


class RetryableConflict(Conflict):
    """409 `conflict-retry`: the request met a concurrent one and nothing of it was written; the
    same request, sent again after `retry_after` seconds, can succeed. Retried like a 429 where
    the call is safe to repeat, so it is raised only past the last attempt or for a call that is
    never repeated."""

    retryable_by_default = True


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

    retryable_by_default = True


class ServerError(ProblemError):
    """A 5xx other than 503."""


class ServiceUnavailable(ServerError):
    """503: the service (usually its database) is unavailable for now; `retry_after` says when
    to come back."""

    retryable_by_default = True


class TransportError(MemoryClientError):
    """No answer: the connection failed or the request timed out (after the retries allowed).
    The httpx exception is the `__cause__`."""


class UnexpectedResponse(MemoryClientError):
    """A success answer whose body is not what the API promises (not JSON, not an object, a
    required member missing): this client and the service disagree on the contract."""


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
_BY_TYPE: dict[tuple[int, str], type[ProblemError]] = {
    (409, CONFLICT_RETRY_TYPE): RetryableConflict
}


def problem_body(response: httpx.Response) -> dict[str, Any]:
    """The members of an error answer's problem document ({} when its body is not one)."""
    try:
        parsed = response.json()
    except ValueError:
        return {}
    return parsed if isinstance(parsed, dict) else {}


def says_retryable(response: httpx.Response) -> bool:
    """Whether an error answer's problem says the same request can succeed if sent again: its
    `retryable` member is true (the service sends it on every 409: true on a `conflict-retry`,
    false on a plain `conflict` or a `quota-exceeded`, whatever `Retry-After` it carries)."""
    return problem_body(response).get("retryable") is True


def problem_from_response(response: httpx.Response, retry_after: float | None) -> ProblemError:
    """The typed exception for an error answer, problem+json or not."""
    body = problem_body(response)
    status = response.status_code
    problem_type = str(body.get("type") or "about:blank")
    cls = (
        _BY_TYPE.get((status, problem_type))
        or _BY_STATUS.get(status)
        or (ServerError if status >= 500 else ProblemError)
    )
    retryable = body.get("retryable")
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
        type=problem_type,
        request_id=body.get("request_id") or response.headers.get("x-request-id"),
        errors=errors,
        retry_after=retry_after,
        retryable=retryable if isinstance(retryable, bool) else None,
    )
