"""The rate limit of a route: a dependency that takes a token from the caller's and the
company's bucket of the route's class, and refuses the request (429) when one is empty.

Every answer of a limited route carries `RateLimit-Policy` and `RateLimit`: the dependency
leaves them in the ASGI scope (`RATE_LIMIT_HEADERS_KEY`) and the request middleware
(`app.kit.observability.RequestContextMiddleware`) adds them to whatever the route answers, a 2xx,
a problem or the 429 itself. Runs right after the token is verified, before the body is read.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable
from typing import Final

from fastapi import Request

from app.kit.auth.dependencies import PrincipalDep, principal_of
from app.kit.contract import RATE_LIMITS
from app.kit.observability import RATE_LIMIT_HEADERS_KEY, Metrics
from app.kit.principal import Principal
from app.rate_limits.errors import RateLimited
from app.rate_limits.limiter import RateLimiter
from app.rate_limits.policy import RouteClass

PRINCIPAL_SCOPE_KEY: Final = "context_memory.principal"


async def enforce(request: Request, principal: Principal, route_class: RouteClass) -> None:
    """Count the request against the limits of `route_class` (429 when over one of them).

    A refused request is answered after a pause (`RATE_LIMIT_REFUSAL_DELAY_SECONDS`, at most
    its `Retry-After`): a client that retries in a tight loop over a few connections then sends
    a few requests a second, instead of keeping the service busy answering 429s while other
    companies wait their turn on the same event loop. The pause holds a coroutine, no
    connection of the database and no token."""
    limiter: RateLimiter = request.app.state.rate_limiter
    verdict = limiter.check(route_class, principal.company_id, principal.user_id)
    if not verdict.checks:
        return
    request.scope[RATE_LIMIT_HEADERS_KEY] = verdict.header_fields()
    if verdict.allowed:
        return
    metrics: Metrics = request.app.state.metrics
    for check in verdict.checks:
        if not check.allows:
            metrics.rate_limited.labels(check.name).inc()
    retry_after = verdict.retry_after_seconds
    pause = min(limiter.refusal_delay_seconds, float(retry_after))
    if pause > 0:
        await asyncio.sleep(pause)
    wait = max(1, math.ceil(retry_after - pause))
    refused = ", ".join(check.name for check in verdict.checks if not check.allows)
    raise RateLimited(refused, wait)


def rate_limited(route_class: RouteClass) -> Callable[..., Awaitable[None]]:
    """The dependency that limits a route as `route_class` (after the caller's token)."""

    async def limit(request: Request, principal: PrincipalDep) -> None:
        await enforce(request, principal, route_class)

    limit.__name__ = f"rate_limit_{route_class.value}"
    RATE_LIMITS.add(limit)
    return limit


def lean_provider(route_class: RouteClass) -> Callable[[Request], Awaitable[object]]:
    """The same for a `LeanRoute`: the caller is the one its principal provider verified
    (`remember_principal`), else verified here."""

    async def provide(request: Request) -> object:
        principal = request.scope.get(PRINCIPAL_SCOPE_KEY)
        if not isinstance(principal, Principal):
            principal = await principal_of(request)
        await enforce(request, principal, route_class)
        return None

    return provide


def remember_principal(request: Request, principal: Principal) -> Principal:
    """Keep the verified caller for the lean rate-limit provider of the same request."""
    request.scope[PRINCIPAL_SCOPE_KEY] = principal
    return principal
