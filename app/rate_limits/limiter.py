"""The per-process rate limiter: token buckets in memory, a share of every limit each.

Why per process, not shared state in PostgreSQL: the two limited hot calls take 1-3 ms, and a
shared bucket is a write per request on a row that every user of a company updates: a round
trip, and a row lock that serialises a company's requests. Instead each API process enforces
`1/N` of every limit (N = `RATE_LIMIT_REPLICAS` x the processes of `serve`), with no I/O at
all: together the processes never allow more than the limit, and a load balancer that spreads
requests (round robin, least connections) lets a client reach it. A client pinned to one
process is held to its share, so the error is on the strict side. The operators' overrides are
read from the database by a background refresh (`refresh_overrides`), never on a request.

Memory is bounded: a bucket that has refilled completely is the same as no bucket, so when
there are more than `max_buckets` those are dropped first, then the ones closest to full.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Final, NamedTuple

from app.rate_limits.policy import (
    Bucket,
    Checked,
    ClassLimits,
    Limit,
    RouteClass,
    Scope,
    in_force,
    policy_field,
    policy_name,
    state_field,
)

MAX_BUCKETS: Final = 200_000

BucketKey = tuple[RouteClass, bool, str, str]
"""(route class, per user?, company, user or "" for the company's bucket)"""

Overrides = Mapping[RouteClass, Mapping[Scope, Limit | None]]
"""A company's overrides: per class, per scope, a limit or None for none; a scope left out
keeps the service's default."""


class Verdict(NamedTuple):
    """The limits that applied to one request (`checks`, with their `RateLimit-Policy` field);
    `allowed` unless one of them had no token."""

    checks: tuple[Checked, ...]
    policy: bytes = b""

    @property
    def allowed(self) -> bool:
        return all(check.allows for check in self.checks)

    @property
    def retry_after_seconds(self) -> int:
        return max((c.retry_after_seconds for c in self.checks if not c.allows), default=1)

    def header_fields(self) -> list[tuple[bytes, bytes]]:
        """`RateLimit-Policy` and `RateLimit` of the request."""
        return [(b"ratelimit-policy", self.policy), (b"ratelimit", state_field(self.checks))]


class _Plan(NamedTuple):
    """(per user?, policy name, this process's share) per limit of a class and company."""

    shares: tuple[tuple[bool, str, Limit], ...]
    policy: bytes


_UNLIMITED: Final = Verdict(())
NO_LIMITS: Final = ClassLimits(None, None)


class _Slot(Bucket):
    """A bucket, the limit it counts for, and the instant it will be full again (eviction)."""

    __slots__ = ("full_at", "limit")

    def __init__(self, tokens: float, at: float, limit: Limit, full_at: float) -> None:
        super().__init__(tokens, at)
        self.limit = limit
        self.full_at = full_at

    def tokens_under(self, limit: Limit, now: float) -> float:
        """The tokens at `now` under `limit`; when the limit changed (an override), the
        requests already counted stay counted: the new quota less them."""
        if limit == self.limit:
            return self.refill(limit, now)
        used = self.limit.quota - self.refill(self.limit, now)
        return max(0.0, limit.quota - used)


class RateLimiter:
    """The buckets of this process, its share of the limits and the companies' overrides."""

    def __init__(
        self,
        defaults: Mapping[RouteClass, ClassLimits],
        *,
        processes: int = 1,
        refusal_delay_seconds: float = 0.0,
        max_buckets: int = MAX_BUCKETS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if processes < 1:
            raise ValueError("processes must be at least 1")
        self.defaults = dict(defaults)
        self.processes = processes
        self.refusal_delay_seconds = refusal_delay_seconds
        self.max_buckets = max_buckets
        self._clock = clock
        self._overrides: dict[str, Overrides] = {}
        self._buckets: dict[BucketKey, _Slot] = {}
        self._plans: dict[tuple[RouteClass, str], _Plan] = {}

    # --- limits -------------------------------------------------------------------------------

    def limits(self, route_class: RouteClass, company_id: str) -> ClassLimits:
        """The limits in force for the company (its overrides over the defaults), whole."""
        default = self.defaults.get(route_class, NO_LIMITS)
        return in_force(default, self._overrides.get(company_id, {}).get(route_class))

    def replace_overrides(self, overrides: Mapping[str, Overrides]) -> None:
        """Every company's overrides, as the database holds them now."""
        self._overrides = {company: dict(classes) for company, classes in overrides.items()}
        self._plans.clear()

    def set_overrides(self, company_id: str, overrides: Overrides) -> None:
        """One company's overrides (empty: back to the defaults), as just saved here."""
        if overrides:
            self._overrides[company_id] = dict(overrides)
        else:
            self._overrides.pop(company_id, None)
        self._plans.clear()

    def _plan(self, route_class: RouteClass, company_id: str) -> _Plan:
        """This process's share of the limits of `route_class` for the company, each with its
        policy name, and their `RateLimit-Policy` field: what every request of that class and
        company checks, worked out once (until the overrides change)."""
        limits = self.limits(route_class, company_id)
        scoped = []
        for scope in (Scope.USER, Scope.COMPANY):
            limit = limits.of(scope)
            if limit is not None:
                scoped.append((scope is Scope.USER, policy_name(route_class, scope), limit))
        shares = tuple(
            (per_user, name, limit.share(self.processes)) for per_user, name, limit in scoped
        )
        plan = _Plan(shares, policy_field(tuple((name, limit) for _, name, limit in shares)))
        if len(self._plans) >= self.max_buckets:
            self._plans.clear()
        self._plans[(route_class, company_id)] = plan
        return plan

    # --- requests -----------------------------------------------------------------------------

    def check(self, route_class: RouteClass, company_id: str, user_id: str) -> Verdict:
        """Take a token from the caller's and the company's bucket of `route_class`, or from
        neither when one of them is empty (the request is refused)."""
        plan = self._plans.get((route_class, company_id)) or self._plan(route_class, company_id)
        if not plan.shares:
            return _UNLIMITED
        now = self._clock()
        buckets = self._buckets
        found: list[tuple[BucketKey, _Slot | None, str, Limit, float]] = []
        allowed = True
        for per_user, name, limit in plan.shares:
            key = (route_class, per_user, company_id, user_id if per_user else "")
            slot = buckets.get(key)
            tokens = float(limit.quota) if slot is None else slot.tokens_under(limit, now)
            if tokens < 1.0:
                allowed = False
            found.append((key, slot, name, limit, tokens))
        checks = []
        for key, slot, name, limit, tokens in found:
            left = tokens - 1.0 if allowed else tokens
            full_at = now + (limit.quota - left) * limit.window_seconds / limit.quota
            if slot is None:
                if len(buckets) >= self.max_buckets:
                    self._evict(now)
                buckets[key] = _Slot(left, now, limit, full_at)
            else:
                slot.tokens, slot.at, slot.limit, slot.full_at = left, now, limit, full_at
            checks.append(Checked(name, limit, left, tokens >= 1.0))
        return Verdict(tuple(checks), plan.policy)

    def bucket_count(self) -> int:
        return len(self._buckets)

    def reset(self) -> None:
        """Every bucket full and no override (as a freshly started process)."""
        self._buckets.clear()
        self._overrides.clear()
        self._plans.clear()

    def _evict(self, now: float) -> None:
        """Drop the full buckets; if that is not a quarter of them, the closest to full."""
        buckets = self._buckets
        for key in [key for key, slot in buckets.items() if slot.full_at <= now]:
            del buckets[key]
        target = self.max_buckets * 3 // 4
        if len(buckets) > target:
            by_full = sorted(buckets, key=lambda key: buckets[key].full_at)
            for key in by_full[: len(buckets) - target]:
                del buckets[key]
