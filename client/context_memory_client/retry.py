"""When to try a request again and how long to wait first: exponential backoff with full jitter,
or the server's `Retry-After` when it sent one."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime


@dataclass(frozen=True)
class RetryPolicy:
    """Retries for requests that are safe to repeat (reads, conditional and set-style writes,
    and turn-saves, which always carry an `Idempotency-Key`).

    A request is tried at most `max_attempts` times in all. It is retried on a status in
    `retry_statuses`, on a 409 whose problem says `"retryable": true` (a `conflict-retry`,
    unless `retry_conflicts` is false) and on connection errors and timeouts. Before attempt
    n+1 the client waits
    `Retry-After` when the answer carried one (capped at `max_retry_after`, plus up to `jitter`
    of it), otherwise a random time in [0, min(backoff_max, backoff_base * 2**(n-1))].
    """

    max_attempts: int = 4
    backoff_base: float = 0.25
    backoff_max: float = 8.0
    max_retry_after: float = 30.0
    jitter: float = 0.1
    retry_statuses: frozenset[int] = field(default_factory=lambda: frozenset({429, 503}))
    retry_conflicts: bool = True

    def delay(self, attempt: int, retry_after: float | None) -> float:
        """Seconds to wait after failed attempt number `attempt` (1-based)."""
        if retry_after is not None:
            wait = min(max(retry_after, 0.0), self.max_retry_after)
            return wait + random.uniform(0.0, wait * self.jitter)  # noqa: S311 - not crypto
        ceiling = min(self.backoff_max, self.backoff_base * 2 ** (attempt - 1))
        return random.uniform(0.0, ceiling)  # noqa: S311 - jitter, not crypto


NO_RETRIES = RetryPolicy(max_attempts=1)
"""Try once; every failure is raised at once."""


def parse_retry_after(value: str | None, now: datetime | None = None) -> float | None:
    """`Retry-After` in seconds (delta-seconds or an HTTP date), or None if absent or unreadable."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - (now or datetime.now(UTC))).total_seconds())
