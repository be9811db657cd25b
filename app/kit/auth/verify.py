"""A bearer token verified into a `Principal`, free of the web framework.

Identity comes only from a verified token. A token is routed to its verifier by `iss` before
any signature work: a trusted OpenID issuer of AUTH_ISSUERS (keys from its JWKS, claims read
with its paths), or the static key (JWT_SECRET / JWT_PUBLIC_KEY with JWT_ISSUER). Both are
confined the same way: a fixed company or a company claim, a role map, and `operator` only
from a platform verifier (`platform`, JWT_PLATFORM for the static key). Every decode pins the
algorithm and requires `exp`, `aud` and `iss`; any failure is the same opaque 401. A verified
token is remembered until its `exp` (bounded LRU), so the orchestrator's two calls per turn do
not verify the same signature again; a token that failed is never remembered.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import logging
import math
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import Any, Final

import jwt
import orjson

from app.kit.config import IssuerConfig, Settings
from app.kit.errors import Unauthorized
from app.kit.jwks import JwkDict, KeyStore
from app.kit.principal import KNOWN_ROLES, PLATFORM_ROLE, Principal

logger = logging.getLogger(__name__)

# what a decode may raise for a token it refuses (PyJWT's own, and what a malformed key or
# claim raises inside it)
_DECODE_ERRORS: Final = (jwt.PyJWTError, ValueError, TypeError, KeyError, OverflowError)
_MAX_PREPARED_KEYS: Final = 256
_FROM_URLSAFE: Final = str.maketrans("-_", "+/")
_MAX_ID_LENGTH = 256  # user ids: the width of the user_id columns
_MAX_COMPANY_ID_LENGTH = 128  # the width of the company_id columns
# RFC 8725 3.10 / RFC 7515 4.1.11: a token may not say where its key is, carry its own key, or
# require extensions this verifier does not know
_REFUSED_HEADERS: Final = frozenset({"jku", "x5u", "jwk", "crit"})
# algorithm -> (the JWK `kty` it needs, the JWK `crv` it needs)
_KEY_TYPES: Final[dict[str, tuple[str, str | None]]] = {
    "RS256": ("RSA", None),
    "RS384": ("RSA", None),
    "RS512": ("RSA", None),
    "ES256": ("EC", "P-256"),
    "ES384": ("EC", "P-384"),
    "ES512": ("EC", "P-521"),
}

RoleDropObserver = Callable[[str, str], None]
"""Called with (issuer, role) for a role an issuer may not grant (`operator` of a company
issuer, or of the static key when it is not platform), which the principal does not get; the
static key's issuer is JWT_ISSUER."""


class TokenVerifier:
    """Token -> Principal, with the verified tokens of the last `JWT_CACHE_SIZE` callers kept
    until their `exp`.

    The cache is keyed by the SHA-256 of the token's exact bytes: a token that differs in any
    byte (another signature, another claim) is verified from scratch. Entries end at `exp`
    (the leeway is not extended to cached tokens) and the least recently used one is dropped
    when the cache is full. Settings (keys, audiences, issuers) are fixed for the life of the
    verifier, so a cached answer is the answer a decode would give again; a key that its
    issuer withdraws does not end the tokens it signed before their `exp`.
    """

    def __init__(
        self,
        settings: Settings,
        clock: Callable[[], float] = time.time,
        *,
        keys: KeyStore | None = None,
        on_role_dropped: RoleDropObserver | None = None,
    ) -> None:
        self._algorithms = list(settings.jwt_algorithms)
        self._audience = settings.jwt_audience
        self._issuer = settings.jwt_issuer
        self._max_bytes = settings.jwt_max_token_bytes
        self._leeway = settings.jwt_leeway_seconds
        self._hmac_key = (
            settings.jwt_secret.get_secret_value() if settings.static_hmac_enabled else None
        )
        self._public_keys = _prepared_public_keys(settings)
        self._jwks_keys: dict[bytes, Any] = {}  # a JWK (JSON, alg) -> its key, prepared once
        self._issuers = {entry.issuer: entry for entry in settings.auth_issuers}
        self._static = settings.static_issuer
        self._owned_companies = settings.owned_companies
        self._keys = keys if keys is not None else KeyStore(settings)
        self._on_role_dropped = on_role_dropped
        self._clock = clock
        self._cache_size = settings.jwt_cache_size
        self._cache: OrderedDict[bytes, tuple[Principal, float]] = OrderedDict()

    @property
    def cached_tokens(self) -> int:
        return len(self._cache)

    @property
    def keys(self) -> KeyStore:
        return self._keys

    async def verify(self, token: str) -> Principal:
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
        principal, expires_at = await self._decode(token)
        if self._cache_size and self._clock() < expires_at:
            self._cache[key] = (principal, expires_at)
            if len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        return principal

    async def _decode(self, token: str) -> tuple[Principal, float]:
        """Route by `iss`, verify the signature and the claims: (principal, exp)."""
        if token.count(".") != 2:
            raise Unauthorized  # not a JWS compact token (a JWE has 5 segments)
        try:
            header, unverified = _unverified(token)
        except (binascii.Error, ValueError, RecursionError) as exc:
            raise Unauthorized from exc
        if not isinstance(header, dict) or _REFUSED_HEADERS & header.keys():
            raise Unauthorized
        if not isinstance(unverified, dict) or not _finite_times(unverified):
            raise Unauthorized
        algorithm = header.get("alg")
        iss = unverified.get("iss")
        issuer = self._issuers.get(iss) if isinstance(iss, str) else None
        if issuer is not None:
            return await self._decode_issued(token, header, issuer)
        if unverified.get("iss") != self._issuer or algorithm not in self._algorithms:
            raise Unauthorized
        key = (
            self._hmac_key
            if str(algorithm).startswith("HS")
            else self._public_keys.get(str(algorithm))
        )
        if key is None:
            raise Unauthorized
        claims = self._checked(token, key, str(algorithm), self._issuer, require_sub=True)
        if not _has_audience(claims, (self._audience,)):
            raise Unauthorized
        roles = claims.get("roles", [])
        if not isinstance(roles, list) or not all(isinstance(role, str) for role in roles):
            raise Unauthorized  # a static token's roles are a list, nothing else
        return self._principal_of_issuer(claims, self._static), float(claims["exp"])

    async def _decode_issued(
        self, token: str, header: dict[str, Any], issuer: IssuerConfig
    ) -> tuple[Principal, float]:
        algorithm = header.get("alg")
        if algorithm not in issuer.algorithms:  # asymmetric only: never HMAC from a JWKS
            raise Unauthorized
        kid = header.get("kid")
        if kid is not None and not isinstance(kid, str):
            raise Unauthorized
        issuer_keys = self._keys.of(issuer.issuer)
        if issuer_keys is None:
            raise Unauthorized
        candidates = [key for key in await issuer_keys.keys_for(kid) if _fits(key, str(algorithm))]
        if len(candidates) != 1:
            raise Unauthorized  # no key, or (without a kid) no single key to try
        key = self._jwk_key(candidates[0], str(algorithm))
        claims = self._checked(token, key, str(algorithm), issuer.issuer, require_sub=False)
        if not _has_audience(claims, issuer.audiences):
            raise Unauthorized
        return self._principal_of_issuer(claims, issuer), float(claims["exp"])

    def _jwk_key(self, jwk: JwkDict, algorithm: str) -> Any:
        """The verification key of a JWKS key, built once per key and algorithm (the cache is
        emptied when it reaches _MAX_PREPARED_KEYS: keys come only from trusted JWKS)."""
        name = orjson.dumps([algorithm, jwk], option=orjson.OPT_SORT_KEYS)
        key = self._jwks_keys.get(name)
        if key is None:
            try:
                key = jwt.PyJWK(dict(jwk), algorithm).key
            except _DECODE_ERRORS as exc:
                raise Unauthorized from exc
            if len(self._jwks_keys) >= _MAX_PREPARED_KEYS:
                self._jwks_keys.clear()
            self._jwks_keys[name] = key
        return key

    def _checked(
        self,
        token: str,
        key: Any,
        algorithm: str,
        issuer: str,
        *,
        require_sub: bool,
    ) -> dict[str, Any]:
        """The claims of `token` once its signature (with `key`, `algorithm` only), `exp`,
        `nbf` and `iss` are checked. `iat` is not compared with the clock (a provider's clock a
        second ahead would refuse its fresh tokens); `_finite_times` checked it is a number.
        Keys shorter than RFC 7518 and NIST ask for (an HMAC secret shorter than its hash, an
        RSA key under 2048 bits) are refused, not warned about."""
        try:
            claims: dict[str, Any] = jwt.decode(
                token,
                key,
                algorithms=[algorithm],
                issuer=issuer,
                leeway=self._leeway,
                options={
                    "verify_aud": False,  # checked by _has_audience: a list of audiences
                    "verify_iat": False,
                    "require": ["exp", "iss", "sub"] if require_sub else ["exp", "iss"],
                    "enforce_minimum_key_length": True,
                },
            )
        except _DECODE_ERRORS as exc:
            raise Unauthorized from exc
        return claims

    def _principal_of_issuer(self, claims: dict[str, Any], issuer: IssuerConfig) -> Principal:
        """The principal a token of `issuer` (an AUTH_ISSUERS entry, or the static key's rule)
        names, confined to what that issuer may grant."""
        user = claim_at(claims, issuer.user_claim)
        if issuer.company is not None:
            company: object = issuer.company
        else:
            company = claim_at(claims, issuer.company_claim or "")
            if not _is_identifier(company, _MAX_COMPANY_ID_LENGTH):
                raise Unauthorized
            if company in self._owned_companies:
                raise Unauthorized  # a company another issuer owns accepts only that issuer
        if not _is_identifier(user) or not _is_identifier(company, _MAX_COMPANY_ID_LENGTH):
            raise Unauthorized
        roles = self._granted_roles(claims, issuer)
        return Principal(user_id=str(user), company_id=str(company), roles=_shared(roles))

    def _granted_roles(self, claims: dict[str, Any], issuer: IssuerConfig) -> frozenset[str]:
        if issuer.roles_claim is None:
            return frozenset()
        names = role_names(claim_at(claims, issuer.roles_claim))
        if names is None:
            raise Unauthorized
        granted: set[str]
        if issuer.role_map is not None:
            granted = {issuer.role_map[name] for name in names if name in issuer.role_map}
        else:
            granted = set(names) & KNOWN_ROLES
        if PLATFORM_ROLE in granted and not issuer.platform:
            granted.discard(PLATFORM_ROLE)
            if self._on_role_dropped is not None:
                self._on_role_dropped(issuer.issuer, PLATFORM_ROLE)
        return frozenset(granted)


def _unverified(token: str) -> tuple[object, object]:
    """The header and claims of a compact JWS, read without any check, to route it by `iss`:
    the decode that follows reads the same bytes again, strictly, and verifies them."""
    header, payload, _ = token.split(".")
    return _segment(header), _segment(payload)


def _segment(part: str) -> object:
    padded = part.translate(_FROM_URLSAFE) + "=" * (-len(part) % 4)
    return json.loads(base64.b64decode(padded, validate=True))


def _prepared_public_keys(settings: Settings) -> dict[str, Any]:
    """JWT_PUBLIC_KEY read once for each `RS*`/`ES*` algorithm it fits (parsing the PEM per
    token would double the cost of a verification); an algorithm it does not fit has no key,
    and its tokens are a 401."""
    if settings.jwt_public_key is None:
        return {}
    pem = settings.jwt_public_key.get_secret_value()
    keys: dict[str, Any] = {}
    for algorithm in settings.jwt_algorithms:
        if algorithm.startswith("HS"):
            continue
        try:
            keys[algorithm] = jwt.get_algorithm_by_name(algorithm).prepare_key(pem)
        except _DECODE_ERRORS:
            logger.warning(
                "JWT_PUBLIC_KEY is no %s key: %s tokens are refused", algorithm, algorithm
            )
    return keys


def claim_at(claims: dict[str, Any], path: str) -> object:
    """The claim at `path`: a key that is the whole path first (`urn:zitadel:...:roles`,
    `https://example.com/roles`), else the dotted path through nested objects
    (`realm_access.roles`); `None` when absent."""
    if path in claims:
        return claims[path]
    node: object = claims
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def role_names(value: object) -> list[str] | None:
    """The role names of a roles claim: a list of strings, an object whose keys are the roles,
    or one string; none when absent; `None` for anything else (the token is refused)."""
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [str(name) for name in value]
    if isinstance(value, list) and all(isinstance(name, str) for name in value):
        return list(value)
    return None


def _fits(key: JwkDict, algorithm: str) -> bool:
    """RFC 8725 3.1: the key must be one for this algorithm (type, curve, its own `alg`)."""
    kty, crv = _KEY_TYPES[algorithm]
    return (
        key.get("kty") == kty
        and (crv is None or key.get("crv") == crv)
        and key.get("alg", algorithm) == algorithm
    )


def _finite_times(claims: dict[str, Any]) -> bool:
    """`exp`, `nbf` and `iat`, where present, are finite numbers (`1e400` parses as infinity)."""
    for name in ("exp", "nbf", "iat"):
        value = claims.get(name, 0)
        if isinstance(value, bool) or not isinstance(value, int | float):
            return False
        try:
            if not math.isfinite(float(value)):
                return False
        except OverflowError:
            return False
    return True


def _has_audience(claims: dict[str, Any], audiences: Iterable[str]) -> bool:
    aud = claims.get("aud")
    if isinstance(aud, str):
        return aud in audiences
    if isinstance(aud, list) and all(isinstance(item, str) for item in aud):
        return not set(aud).isdisjoint(audiences)
    return False


# the few distinct role sets, shared by every cached principal
_ROLE_SETS: dict[frozenset[str], frozenset[str]] = {}


def _shared(roles: frozenset[str]) -> frozenset[str]:
    return _ROLE_SETS.setdefault(roles, roles)


def _is_identifier(value: object, max_length: int = _MAX_ID_LENGTH) -> bool:
    return (
        isinstance(value, str)
        and 0 < len(value) <= max_length
        and value.isprintable()
        and value.strip() == value
    )
