"""What the async and the sync client share: the settings, the request a `Call` becomes, and the
reading of an answer (a result, an error to raise, or a retry to wait for)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from http import HTTPStatus
from importlib import metadata
from typing import Any, TypeVar

import httpx

from context_memory_client.calls import Call
from context_memory_client.errors import TransportError, problem_from_response, says_retryable
from context_memory_client.retry import RetryPolicy, parse_retry_after

T = TypeVar("T")
TokenSource = str | Callable[[], str] | None
"""A bearer token, or a callable asked for one before every attempt (so it may refresh)."""

DISTRIBUTION = "context-memory-client"


def _installed_version() -> str:
    """The version client/pyproject.toml gave the installed package: one number, not a copy."""
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:  # imported from a source tree without installing it
        return "0+unknown"


VERSION = _installed_version()
USER_AGENT = f"{DISTRIBUTION}/{VERSION}"
RETRYABLE_TRANSPORT_ERRORS: tuple[type[Exception], ...] = (
    httpx.TimeoutException,
    httpx.NetworkError,
    httpx.RemoteProtocolError,
)
TERMINAL_JOB_STATUSES = frozenset({"succeeded", "dead"})


@dataclass(frozen=True)
class Request:
    method: str
    url: str
    params: dict[str, Any]
    headers: dict[str, str]
    json: Any
    content: bytes | None


class ClientCore:
    """The settings of one client and the decisions that do not depend on async or sync."""

    def __init__(self, base_url: str, token: TokenSource, retry: RetryPolicy) -> None:
        self.base_url = base_url.rstrip("/")
        self.token = token
        self.retry = retry

    def request(self, call: Call[Any]) -> Request:
        headers = {"Accept": "application/json", "User-Agent": USER_AGENT, **call.headers}
        token = self.token() if callable(self.token) else self.token
        if token:
            headers["Authorization"] = f"Bearer {token}"
        params = {
            k: ("true" if v is True else "false" if v is False else v)
            for k, v in call.params.items()
        }
        return Request(
            call.method, self.base_url + call.path, params, headers, call.json, call.content
        )

    def may_retry(self, call: Call[Any], attempt: int) -> bool:
        return call.retryable and attempt < self.retry.max_attempts

    def retry_delay(self, call: Call[Any], response: httpx.Response, attempt: int) -> float | None:
        """Seconds to wait before trying `call` again after `response`, or None to not retry."""
        if not self.may_retry(call, attempt) or not self.worth_repeating(response):
            return None
        return self.retry.delay(attempt, parse_retry_after(response.headers.get("retry-after")))

    def worth_repeating(self, response: httpx.Response) -> bool:
        """Whether the same request may get a better answer later: a status of the policy's
        (429, 503), or a 409 whose problem says it is retryable (`conflict-retry`)."""
        if response.status_code in self.retry.retry_statuses:
            return True
        return (
            response.status_code == HTTPStatus.CONFLICT
            and self.retry.retry_conflicts
            and says_retryable(response)
        )

    def transport_retry_delay(self, call: Call[Any], exc: Exception, attempt: int) -> float:
        """Seconds to wait after a connection error or timeout; raises when out of retries."""
        if not self.may_retry(call, attempt):
            raise TransportError(f"{call.method} {call.path}: {exc!r}") from exc
        return self.retry.delay(attempt, None)

    @staticmethod
    def result(call: Call[T], response: httpx.Response) -> T:
        if response.status_code >= 400:
            retry_after = parse_retry_after(response.headers.get("retry-after"))
            raise problem_from_response(response, retry_after)
        return call.parse(response)
