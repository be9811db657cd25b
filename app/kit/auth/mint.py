"""A token signed with the configured key, for development, the tests and the `token` command."""

from __future__ import annotations

import time
from typing import Any

import jwt

from app.kit.config import Settings
from app.kit.principal import Principal


def issue_token(
    settings: Settings,
    principal: Principal,
    *,
    ttl_seconds: int = 3600,
    now: float | None = None,
    extra_claims: dict[str, Any] | None = None,
) -> str:
    """Sign a token for `principal` with the configured key (development, tests and the `token`
    command)."""
    issued = int(now if now is not None else time.time())
    claims: dict[str, Any] = {
        "sub": principal.user_id,
        "company_id": principal.company_id,
        "roles": sorted(principal.roles),
        "iss": settings.jwt_issuer,
        "aud": settings.jwt_audience,
        "iat": issued,
        "exp": issued + ttl_seconds,
    }
    claims.update(extra_claims or {})
    algorithm = settings.jwt_algorithms[0]
    if algorithm.startswith("HS"):
        key = settings.jwt_secret.get_secret_value()
    elif settings.jwt_private_key is not None:
        key = settings.jwt_private_key.get_secret_value()
    else:
        raise ValueError(f"signing with {algorithm} needs JWT_PRIVATE_KEY")
    return str(jwt.encode(claims, key, algorithm=algorithm))
