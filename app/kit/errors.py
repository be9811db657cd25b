"""Typed domain errors, free of the web framework (the worker raises and reads them too): the
generic classes, each a status and problem type, and the named failures of the shared plumbing
(a domain's own are in its `errors.py`); `app/kit/problems.py` renders them as RFC 9457
problem+json."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import ClassVar, NamedTuple

PROBLEM_CONTENT_TYPE = "application/problem+json"
PROBLEM_BASE = "urn:context-memory:problem:"


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
        retry_after_seconds: int | None = None,
    ) -> None:
        """`retry_after_seconds`: when the same request may be sent again, as `Retry-After`."""
        super().__init__(detail)
        self.detail = detail
        self.errors = list(errors) if errors else None
        self.headers = dict(headers) if headers else {}
        if retry_after_seconds is not None:
            self.headers["Retry-After"] = str(retry_after_seconds)


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
        super().__init__(detail, retry_after_seconds=retry_after_seconds)


class SettingChanged(RetryableConflict):
    """A save of an audited company setting lost a race with another save of it and found its
    row gone again on the second round (`app/kit/audited_setting.py`); nothing was written."""

    def __init__(self) -> None:
        super().__init__("The setting changed while saving; retry the request.")


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


# --- the named failures of the shared plumbing (a domain's own are in its `errors.py`) --------


class InvalidRequest(Unprocessable):
    """A request the framework's validation refuses (body, query, path or header fields)."""

    def __init__(self, errors: Sequence[Mapping[str, object]]) -> None:
        super().__init__(
            "The request is invalid; see errors for the offending fields.", errors=errors
        )


class NoSuchResource(NotFound):
    """A path no route serves."""

    def __init__(self) -> None:
        super().__init__("No such resource.")


class DatabaseUnavailable(ServiceUnavailable):
    """A request met a database that is down or refuses to write (answered by the last
    resort, whatever the route)."""

    def __init__(self, retry_after_seconds: int) -> None:
        super().__init__(
            "The database is unavailable; retry later.",
            retry_after_seconds=retry_after_seconds,
        )


class RoleRequired(Forbidden):
    """The token holds none of the roles the operation needs."""

    def __init__(self, *roles: str) -> None:
        super().__init__(f"This operation needs the {' or '.join(roles)} role.")


class ForeignCompany(NotFound):
    """A caller whose role reaches only their own company named another: answered as if it did
    not exist, so nobody learns which companies do."""

    def __init__(self) -> None:
        super().__init__("No such company.")


class BodyTooLarge(PayloadTooLarge):
    """The request's body is over the route's limit (MAX_BODY_BYTES, IMPORT_MAX_BYTES)."""

    def __init__(self, max_bytes: int) -> None:
        super().__init__(f"The request body exceeds the limit of {max_bytes} bytes.")


class CompanyExportsBusy(TooManyRequests):
    """Every read slot of the caller's company holds an export being sent."""

    def __init__(self, per_company: int, retry_after_seconds: int) -> None:
        super().__init__(
            f"{per_company} exports of your company are being read right now; retry "
            "when one is done.",
            retry_after_seconds=retry_after_seconds,
        )


class ExportsBusy(ServiceUnavailable):
    """Every read slot of the process holds an export being sent."""

    def __init__(self, retry_after_seconds: int) -> None:
        super().__init__(
            "The service is reading as many exports as it reads at once; retry shortly.",
            retry_after_seconds=retry_after_seconds,
        )


class DatabaseUnreachable(ServiceUnavailable):
    """Readiness: the database does not answer."""

    def __init__(self, retry_after_seconds: int) -> None:
        super().__init__("The database is unreachable.", retry_after_seconds=retry_after_seconds)


class IssuerKeysStale(ServiceUnavailable):
    """Readiness: the keys of trusted issuers were not fetched recently."""

    def __init__(self, issuers: Sequence[str], retry_after_seconds: int) -> None:
        super().__init__(
            f"No keys fetched recently from the trusted issuer(s) {', '.join(issuers)}.",
            retry_after_seconds=retry_after_seconds,
        )


class SchemaNotMigrated(ServiceUnavailable):
    """Readiness: the database schema is not at the revision this code expects."""

    def __init__(
        self, revision: str | None, expected: str | None, retry_after_seconds: int
    ) -> None:
        super().__init__(
            f"Database schema is at {revision}, expected {expected}; run `python -m app migrate`.",
            retry_after_seconds=retry_after_seconds,
        )


INTERNAL_ERROR = ProblemType(500, "Internal server error", "internal")
METHOD_NOT_ALLOWED = ProblemType(405, "Method not allowed", "method-not-allowed")
HTTP_ERROR = ProblemType(400, "HTTP error", "http")
"""Any other error the framework raises (a body it cannot parse: 400), with that error's status."""
OTHER_PROBLEMS = (INTERNAL_ERROR, METHOD_NOT_ALLOWED, HTTP_ERROR)
"""The problem types rendered besides those of `DomainError` and its subclasses."""
