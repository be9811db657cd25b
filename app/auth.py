"""Bearer-token authentication: the only importer of python-jose.

Identity comes only from a verified token. Every decode pins the algorithm allowlist and
requires `exp`, `aud`, `iss`, `sub` and `company_id`; any failure is the same opaque 401.
A verified token is remembered until its `exp` (bounded LRU), so the orchestrator's two calls
per turn do not verify the same signature again; a token that failed is never remembered.
"""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Annotated, Any, TypeVar

from fastapi import APIRouter, Depends, Request, Security
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from jose import jwt
from jose.exceptions import JOSEError
from pydantic import BaseModel

from app.api_tags import USER
from app.config import Settings
from app.errors import Forbidden, NotFound, Unauthorized

KNOWN_ROLES = frozenset({"space_admin", "operator"})
_REQUIRED_CLAIMS = ("exp", "aud", "iss", "sub", "company_id")
_MAX_ID_LENGTH = 256  # user ids: the width of the user_id columns
_MAX_COMPANY_ID_LENGTH = 128  # the width of the company_id columns


@dataclass(frozen=True, slots=True)
class Principal:
    """Who the verified token says the caller is."""

    user_id: str
    company_id: str
    roles: frozenset[str]

    def has_role(self, role: str) -> bool:
        return role in self.roles


class TokenVerifier:
    """Token -> Principal, with the verified tokens of the last `JWT_CACHE_SIZE` callers kept
    until their `exp`.

    The cache is keyed by the SHA-256 of the token's exact bytes: a token that differs in any
    byte (another signature, another claim) is verified from scratch. Entries end at `exp`
    (the leeway is not extended to cached tokens) and the least recently used one is dropped
    when the cache is full. Settings (keys, audience, issuer) are fixed for the life of the
    verifier, so a cached answer is the answer `jwt.decode` would give again.
    """

    def __init__(self, settings: Settings, clock: Callable[[], float] = time.time) -> None:
        self._algorithms = list(settings.jwt_algorithms)
        self._audience = settings.jwt_audience
        self._issuer = settings.jwt_issuer
        self._max_bytes = settings.jwt_max_token_bytes
        self._leeway = settings.jwt_leeway_seconds
        self._hmac_key = settings.jwt_secret.get_secret_value()
        self._public_key = (
            settings.jwt_public_key.get_secret_value() if settings.jwt_public_key else None
        )
        self._clock = clock
        self._cache_size = settings.jwt_cache_size
        self._cache: OrderedDict[bytes, tuple[Principal, float]] = OrderedDict()

    @property
    def cached_tokens(self) -> int:
        return len(self._cache)

    def verify(self, token: str) -> Principal:
        """Return the principal of a valid token; raise `Unauthorized` for anything else."""
        raw = token.encode()
        if len(raw) > self._max_bytes:
            raise Unauthorized
        key = hashlib.sha256(raw).digest()
        cached = self._cache.get(key)
        if cached is not None:
            principal, expires_at = cached
            if self._clock() < expires_at:
                self._cache.move_to_end(key)
                return principal
            del self._cache[key]
        principal, expires_at = self._decode(token)
        if self._cache_size and self._clock() < expires_at:
            self._cache[key] = (principal, expires_at)
            if len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        return principal

    def _decode(self, token: str) -> tuple[Principal, float]:
        """Verify the signature and the claims: (principal, exp)."""
        if token.count(".") != 2:
            raise Unauthorized  # oversized, or not a JWS compact token (a JWE has 5 segments)
        try:
            header = jwt.get_unverified_header(token)
            algorithm = header.get("alg")
            if algorithm not in self._algorithms:
                raise Unauthorized
            key = self._hmac_key if str(algorithm).startswith("HS") else self._public_key
            if key is None:
                raise Unauthorized
            claims = jwt.decode(
                token,
                key,
                algorithms=[algorithm],
                audience=self._audience,
                issuer=self._issuer,
                options={
                    "require_exp": True,
                    "require_aud": True,
                    "require_iss": True,
                    "require_sub": True,
                    "require_nbf": False,
                    "leeway": self._leeway,
                },
            )
        except (JOSEError, ValueError, TypeError, KeyError) as exc:
            raise Unauthorized from exc
        return _principal_from_claims(claims), float(claims["exp"])


def _principal_from_claims(claims: dict[str, Any]) -> Principal:
    if any(name not in claims for name in _REQUIRED_CLAIMS):
        raise Unauthorized
    sub, company = claims["sub"], claims["company_id"]
    if not _is_identifier(sub) or not _is_identifier(company, _MAX_COMPANY_ID_LENGTH):
        raise Unauthorized
    roles = claims.get("roles", [])
    if not isinstance(roles, list) or not all(isinstance(role, str) for role in roles):
        raise Unauthorized
    known = frozenset(roles) & KNOWN_ROLES
    return Principal(user_id=sub, company_id=company, roles=_ROLE_SETS.setdefault(known, known))


# the few distinct role sets, shared by every cached principal
_ROLE_SETS: dict[frozenset[str], frozenset[str]] = {}


def _is_identifier(value: object, max_length: int = _MAX_ID_LENGTH) -> bool:
    return (
        isinstance(value, str)
        and 0 < len(value) <= max_length
        and value.isprintable()
        and value.strip() == value
    )


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


def _bearer_token(request: Request) -> str:
    header = request.headers.get("authorization")
    if not header:
        raise Unauthorized
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token or " " in token.strip():
        raise Unauthorized
    return token.strip()


_bearer_scheme = HTTPBearer(
    auto_error=False,
    bearerFormat="JWT",
    description="A JWT issued by your identity provider, with `sub`, `company_id`, `exp`, `iss` "
    "and `aud` (and optional `roles`). In Swagger UI's Authorize, paste the token alone, "
    "without `Bearer `; `make run` prints a development one.",
)


def principal_of(request: Request) -> Principal:
    """The verified caller of `request` (401 for a missing, malformed or invalid token)."""
    verifier: TokenVerifier = request.app.state.token_verifier
    return verifier.verify(_bearer_token(request))


async def current_principal(
    request: Request,
    _documented: Annotated[HTTPAuthorizationCredentials | None, Security(_bearer_scheme)],
) -> Principal:
    """The verified caller. The header is parsed here, strictly; HTTPBearer only documents it."""
    return principal_of(request)


PrincipalDep = Annotated[Principal, Depends(current_principal)]


ROLE_CHECKS: set[Callable[..., Any]] = set()
"""Dependencies that may refuse the caller's role (403); the published contract says so for
every route that depends on one."""

_Dependency = TypeVar("_Dependency", bound=Callable[..., Any])


def role_check(dependency: _Dependency) -> _Dependency:
    """Register `dependency` as a role check (it raises `Forbidden`)."""
    ROLE_CHECKS.add(dependency)
    return dependency


def require_role(role: str) -> Callable[[Principal], Coroutine[Any, Any, Principal]]:
    """Dependency: the caller must hold `role` (403 otherwise)."""

    @role_check
    async def dependency(principal: PrincipalDep) -> Principal:
        if not principal.has_role(role):
            raise Forbidden(f"This operation needs the {role} role.")
        return principal

    return dependency


def require_operator_or_company_admin(
    principal: Principal, company_id: str, *, space_admin_may_read: bool = False
) -> None:
    """Company routes: operators may act on any company; a space admin only reads their own.

    A space admin naming another company gets 404 (no existence oracle).
    """
    if principal.has_role("operator"):
        return
    if space_admin_may_read and principal.has_role("space_admin"):
        if principal.company_id != company_id:
            raise NotFound("No such company.")
        return
    raise Forbidden("This operation needs the operator role.")


# --- who am I ---------------------------------------------------------------------------------

router = APIRouter(tags=[USER])  # full paths, no prefix: metrics label by template


class Me(BaseModel):
    user_id: str
    company_id: str
    roles: list[str]


@router.get(
    "/v1/me",
    summary="Who the bearer token says the caller is",
    description="Called by anyone holding a token, first of all to check it: the user, company "
    "and known roles the service reads from it, without touching the database. Every refused "
    "token is the same 401, which does not say why.",
)
async def who_am_i(principal: PrincipalDep) -> Me:
    return Me(
        user_id=principal.user_id, company_id=principal.company_id, roles=sorted(principal.roles)
    )
