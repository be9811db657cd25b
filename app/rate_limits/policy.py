"""The rate-limit rule (pure): route classes, limits, token buckets and the IETF headers.

A limit is `quota` requests per `window_seconds`, kept as a token bucket: it holds at most
`quota` tokens, refills at `quota / window_seconds` tokens a second, and a request takes one.
So a quiet client may burst up to `quota` at once, and a steady one gets `quota` per window.

The answer carries the `RateLimit-Policy` and `RateLimit` fields of the IETF httpapi draft
(draft-ietf-httpapi-ratelimit-headers, structured-field lists): one policy item per limit that
applies (the caller's own, then the company's), with `q` (quota) and `w` (window), and its state
with `r` (requests remaining now) and `t` (seconds until the bucket is full again).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Final, NamedTuple


class RouteClass(StrEnum):
    """The routes limited together."""

    CONTEXT = "context"  # POST /v1/chats/{chat_id}/context
    TURNS = "turns"  # POST /v1/chats/{chat_id}/turns
    CONSOLIDATIONS = "consolidations"  # explicit consolidations
    EXPORTS = "exports"  # the user's and the company's exports
    MEMORY_WRITES = "memory_writes"  # edits, restores, clears and imports of memories


class Scope(StrEnum):
    """Whose requests one bucket counts."""

    USER = "user"  # one (company, user)
    COMPANY = "company"  # every user of one company together


MAX_WINDOW_SECONDS: Final = 86_400
MAX_QUOTA: Final = 10_000_000


@dataclass(frozen=True)
class Limit:
    """`quota` requests per `window_seconds`."""

    quota: int
    window_seconds: int

    def __post_init__(self) -> None:
        if not 1 <= self.quota <= MAX_QUOTA:
            raise ValueError(f"a quota is 1 to {MAX_QUOTA} requests")
        if not 1 <= self.window_seconds <= MAX_WINDOW_SECONDS:
            raise ValueError(f"a window is 1 to {MAX_WINDOW_SECONDS} seconds")

    @classmethod
    def parse(cls, text: str) -> Limit | None:
        """`"120/60"` (120 requests per 60 s); `"off"` or `"0"` for no limit (None)."""
        value = text.strip().lower()
        if value in {"off", "0"}:
            return None
        quota, slash, window = value.partition("/")
        if not slash or not quota.isdigit() or not window.isdigit():
            raise ValueError("a rate limit is QUOTA/WINDOW_SECONDS, such as 120/60, or off")
        return cls(int(quota), int(window))

    def __str__(self) -> str:
        return f"{self.quota}/{self.window_seconds}"

    def share(self, parts: int) -> Limit:
        """The part of this limit one of `parts` processes enforces: the quota divided (at
        least 1), the window kept, so that all of them together never allow more."""
        return Limit(max(1, self.quota // parts), self.window_seconds)


@dataclass(frozen=True)
class ClassLimits:
    """The limits of one route class: per user and per company; None is no limit."""

    user: Limit | None
    company: Limit | None

    def of(self, scope: Scope) -> Limit | None:
        return self.user if scope is Scope.USER else self.company


def in_force(default: ClassLimits, override: Mapping[Scope, Limit | None] | None) -> ClassLimits:
    """A class's limits with a company's override over the default, scope by scope (a scope
    the override leaves out keeps the default; None in it is no limit)."""
    if not override:
        return default
    return ClassLimits(
        user=override.get(Scope.USER, default.user),
        company=override.get(Scope.COMPANY, default.company),
    )


class Bucket:
    """A token bucket's state: `tokens` at monotonic instant `at`."""

    __slots__ = ("at", "tokens")

    def __init__(self, tokens: float, at: float) -> None:
        self.tokens = tokens
        self.at = at

    def refill(self, limit: Limit, now: float) -> float:
        """The tokens at `now` (not stored)."""
        rate = limit.quota / limit.window_seconds
        return min(float(limit.quota), self.tokens + max(0.0, now - self.at) * rate)


class Checked(NamedTuple):
    """One limit's verdict on a request: its name, the limit, the tokens left after the
    request (or before it, when refused) and whether it lets the request through."""

    name: str
    limit: Limit
    tokens: float
    allows: bool

    @property
    def remaining(self) -> int:
        return max(0, math.floor(self.tokens))

    @property
    def reset_seconds(self) -> int:
        """Seconds until the bucket is full again."""
        missing = self.limit.quota - self.tokens
        return max(0, math.ceil(missing * self.limit.window_seconds / self.limit.quota))

    @property
    def retry_after_seconds(self) -> int:
        """Seconds until one request is allowed again (at least 1)."""
        missing = 1.0 - self.tokens
        return max(1, math.ceil(missing * self.limit.window_seconds / self.limit.quota))


def policy_name(route_class: RouteClass, scope: Scope) -> str:
    return f"{route_class.value}-{scope.value}"


def policy_field(limits: tuple[tuple[str, Limit], ...]) -> bytes:
    """`RateLimit-Policy` of the named limits (the same for every request they apply to)."""
    return ", ".join(
        f'"{name}";q={limit.quota};w={limit.window_seconds}' for name, limit in limits
    ).encode()


def state_field(checks: tuple[Checked, ...]) -> bytes:
    """`RateLimit`: each limit's state after the request."""
    return ", ".join(f'"{c.name}";r={c.remaining};t={c.reset_seconds}' for c in checks).encode()
