"""The signing keys of trusted OpenID issuers: each issuer's JWKS, fetched with httpx, cached,
refreshed when a token names a key it does not hold, and kept while the provider is down.

Keys are plain JWK dictionaries here; `app/kit/auth/verify.py` (PyJWT) checks that a key fits a
token's algorithm and verifies with it.

Per issuer, one `IssuerKeys`:

- Fetched at start-up (best effort), then kept for the response's `Cache-Control: max-age`
  clamped to [AUTH_JWKS_CACHE_MIN_SECONDS, AUTH_JWKS_CACHE_MAX_SECONDS]. Expired keys are still
  used while a refresh runs in the background (no request waits for a routine refresh).
- A token whose `kid` is not in the set waits for a refresh: all such requests share the fetch
  in flight, and fetches for unknown kids are at most one per
  AUTH_JWKS_REFRESH_INTERVAL_SECONDS, so a flood of invented `kid`s costs one fetch per interval,
  not one per request. That budget is apart from the routine fetches (start-up, expired keys,
  /readyz), and a token that joined a fetch begun before its key was published may start one
  more, so a provider that publishes a key and then signs with it (every provider's rotation)
  causes no 401 however soon after another fetch it happens. The one window left: a new key's
  first token within the interval after a fetch for another unknown `kid`.
- A failed fetch keeps the keys held before; `stale_for()` tells /readyz how long ago the last
  good fetch was.

httpx is imported when `KeyStore.open()` has issuers to fetch from: a service that verifies its
static key only never loads it (with the command-line extras it brings, ~6 MB).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

import orjson

from app.kit.config import IssuerConfig, Settings, is_allowed_url

if TYPE_CHECKING:
    import httpx

logger = logging.getLogger(__name__)

JwkDict = Mapping[str, Any]
FetchObserver = Callable[[str, str], None]
"""Called with (issuer, outcome) after every fetch: `ok`, `error`."""

_MAX_DOCUMENT_BYTES: Final = 256 * 1024
_MAX_KEYS: Final = 64
_SIGNING_KEY_TYPES: Final = frozenset({"RSA", "EC"})
_MAX_AGE = re.compile(r"(?:^|,)\s*max-age\s*=\s*\"?(\d{1,10})\"?\s*(?:,|$)", re.IGNORECASE)
_NO_STORE = re.compile(r"(?:^|,)\s*(?:no-store|no-cache)\s*(?:,|$)", re.IGNORECASE)


class JwksError(Exception):
    """The provider's discovery document or JWKS could not be fetched or read."""


def cache_seconds(cache_control: str | None, *, default: int, lowest: int, highest: int) -> int:
    """How long a JWKS response is kept: its max-age (none for no-store/no-cache) in bounds."""
    seconds = default
    if cache_control:
        if _NO_STORE.search(cache_control):
            seconds = 0
        elif match := _MAX_AGE.search(cache_control):
            seconds = int(match.group(1))
    return max(lowest, min(highest, seconds))


@dataclass(frozen=True, slots=True)
class KeySet:
    """The signing keys of one JWKS response, and until when they are fresh."""

    keys: tuple[JwkDict, ...]
    fetched_at: float
    fresh_until: float

    def matching(self, kid: str | None) -> list[JwkDict]:
        """The keys a token's `kid` names; without a `kid`, every key (the caller then needs
        exactly one that fits the algorithm)."""
        if kid is None:
            return list(self.keys)
        return [key for key in self.keys if key.get("kid") == kid]


def signing_keys(document: object) -> tuple[JwkDict, ...]:
    """The RSA and EC signature keys of a JWKS document; others (encryption keys, symmetric
    keys, unknown types) are skipped, a document that is not a JWKS is an error."""
    if not isinstance(document, dict) or not isinstance(document.get("keys"), list):
        raise JwksError("not a JWK set")
    keys: list[JwkDict] = []
    for key in document["keys"][:_MAX_KEYS]:
        if not isinstance(key, dict) or key.get("kty") not in _SIGNING_KEY_TYPES:
            continue
        if key.get("use", "sig") != "sig":
            continue
        ops = key.get("key_ops")
        if ops is not None and (not isinstance(ops, list) or "verify" not in ops):
            continue
        kid = key.get("kid")
        if kid is not None and not isinstance(kid, str):
            continue
        keys.append(key)
    return tuple(keys)


class IssuerKeys:
    """The cached JWKS of one issuer (see the module's docstring)."""

    def __init__(
        self,
        config: IssuerConfig,
        settings: Settings,
        http: httpx.AsyncClient,
        *,
        clock: Callable[[], float] = time.monotonic,
        on_fetch: FetchObserver | None = None,
    ) -> None:
        self.issuer = config.issuer
        self._jwks_uri = config.jwks_uri
        self._http = http
        self._clock = clock
        self._on_fetch = on_fetch
        self._allow_http = settings.auth_allow_http_issuers
        self._interval = settings.auth_jwks_refresh_interval_seconds
        self._default_seconds = settings.auth_jwks_cache_default_seconds
        self._min_seconds = settings.auth_jwks_cache_min_seconds
        self._max_seconds = settings.auth_jwks_cache_max_seconds
        self._keys: KeySet | None = None
        self._last_kid_fetch = -math.inf
        self._last_failure = -math.inf
        self._in_flight: asyncio.Task[None] | None = None

    def stale_for(self) -> float:
        """Seconds since the last good fetch (infinite before the first)."""
        keys = self._keys
        return math.inf if keys is None else self._clock() - keys.fetched_at

    async def keys_for(self, kid: str | None) -> list[JwkDict]:
        """The keys that may have signed a token with `kid`: from the cache, else after a
        refresh (shared, at most one per interval for unknown kids); empty when none fits."""
        keys = self._keys
        if keys is None or self._clock() >= keys.fresh_until:
            self._start_fetch(for_kid=False)  # in the background while the held keys serve
        found = keys.matching(kid) if keys is not None else []
        if found:
            return found
        in_flight = self._in_flight
        if in_flight is not None:
            # a fetch that began before the key was published may not hold it: after it, this
            # token may still start one of its own (within the unknown-kid budget)
            found = await self._after(in_flight, kid)
            if found:
                return found
        task = self._start_fetch(for_kid=True)
        return await self._after(task, kid) if task is not None else []

    async def refresh(self) -> None:
        """Fetch now unless a fetch is in flight or one failed within the interval (start-up,
        readyz)."""
        task = self._start_fetch(for_kid=False)
        if task is not None:
            with contextlib.suppress(Exception):
                await asyncio.shield(task)

    async def _after(self, task: asyncio.Task[None], kid: str | None) -> list[JwkDict]:
        with contextlib.suppress(Exception):
            await asyncio.shield(task)
        keys = self._keys
        return keys.matching(kid) if keys is not None else []

    def _start_fetch(self, *, for_kid: bool) -> asyncio.Task[None] | None:
        """Join the fetch in flight, or start one if its budget allows: fetches for unknown
        kids at most one per interval (a flood of invented kids costs one), routine ones (keys
        expired, start-up, readyz) again only an interval after a failed one."""
        if self._in_flight is not None:
            return self._in_flight
        now = self._clock()
        if for_kid:
            if now - self._last_kid_fetch < self._interval:
                return None
            self._last_kid_fetch = now
        elif now - self._last_failure < self._interval:
            return None
        task = asyncio.get_running_loop().create_task(self._fetch())
        self._in_flight = task
        task.add_done_callback(self._fetched)
        return task

    def _fetched(self, task: asyncio.Task[None]) -> None:
        self._in_flight = None
        if not task.cancelled():
            task.exception()  # retrieved: a failure was logged and counted in _fetch

    async def _fetch(self) -> None:
        import httpx  # noqa: PLC0415 - loaded by KeyStore.open() already

        try:
            uri = self._jwks_uri or await self._discover()
            response = await self._get(uri)
            keys = signing_keys(_json(response))
        except (JwksError, httpx.HTTPError) as exc:
            logger.warning("JWKS of %s: %s", self.issuer, exc or type(exc).__name__)
            self._last_failure = self._clock()
            self._observe("error")
            raise
        now = self._clock()
        lifetime = cache_seconds(
            response.headers.get("cache-control"),
            default=self._default_seconds,
            lowest=self._min_seconds,
            highest=self._max_seconds,
        )
        self._jwks_uri = uri
        self._keys = KeySet(keys=keys, fetched_at=now, fresh_until=now + lifetime)
        self._observe("ok")

    async def _discover(self) -> str:
        url = self.issuer.rstrip("/") + "/.well-known/openid-configuration"
        document = _json(await self._get(url))
        if not isinstance(document, dict) or document.get("issuer") != self.issuer:
            raise JwksError("the discovery document names another issuer")
        uri = document.get("jwks_uri")
        if not isinstance(uri, str):
            raise JwksError("the discovery document has no jwks_uri")
        return uri

    async def _get(self, url: str) -> httpx.Response:
        import httpx  # noqa: PLC0415 - loaded by KeyStore.open() already

        if not is_allowed_url(url, allow_http=self._allow_http):
            raise JwksError(f"refused URL {url!r}: https is required")
        async with self._http.stream("GET", url, headers={"Accept": "application/json"}) as reply:
            if reply.status_code != httpx.codes.OK:
                raise JwksError(f"{url} answered {reply.status_code}")
            body = bytearray()
            async for chunk in reply.aiter_bytes():
                body += chunk
                if len(body) > _MAX_DOCUMENT_BYTES:
                    raise JwksError(f"{url} sent more than {_MAX_DOCUMENT_BYTES} bytes")
        return httpx.Response(reply.status_code, headers=reply.headers, content=bytes(body))

    def _observe(self, outcome: str) -> None:
        if self._on_fetch is not None:
            self._on_fetch(self.issuer, outcome)

    async def close(self) -> None:
        task = self._in_flight
        if task is not None:
            task.cancel()
            with contextlib.suppress(BaseException):
                await task


def _json(response: httpx.Response) -> object:
    try:
        return orjson.loads(response.content)
    except orjson.JSONDecodeError as exc:
        raise JwksError("not JSON") from exc


class KeyStore:
    """The `IssuerKeys` of every trusted issuer, over one HTTP client (created in the lifespan)."""

    def __init__(
        self,
        settings: Settings,
        *,
        clock: Callable[[], float] = time.monotonic,
        on_fetch: FetchObserver | None = None,
    ) -> None:
        self._settings = settings
        self._clock = clock
        self._on_fetch = on_fetch
        self._http: httpx.AsyncClient | None = None
        self._issuers: dict[str, IssuerKeys] = {}
        self.max_stale_seconds = settings.auth_jwks_max_stale_seconds

    @property
    def issuers(self) -> Sequence[IssuerKeys]:
        return tuple(self._issuers.values())

    def of(self, issuer: str) -> IssuerKeys | None:
        return self._issuers.get(issuer)

    async def open(self) -> None:
        """Create the HTTP client and fetch every issuer's keys (failures are logged: the
        provider may come back before the first token arrives)."""
        if not self._settings.auth_issuers:
            return
        import httpx  # noqa: PLC0415 - only where there are keys to fetch

        timeout = self._settings.auth_jwks_timeout_seconds
        self._http = httpx.AsyncClient(
            timeout=httpx.Timeout(timeout), follow_redirects=False, trust_env=False
        )
        self._issuers = {
            entry.issuer: IssuerKeys(
                entry, self._settings, self._http, clock=self._clock, on_fetch=self._on_fetch
            )
            for entry in self._settings.auth_issuers
        }
        await asyncio.gather(*(keys.refresh() for keys in self._issuers.values()))

    async def close(self) -> None:
        for keys in self._issuers.values():
            await keys.close()
        self._issuers = {}
        if self._http is not None:
            await self._http.aclose()
            self._http = None

    async def stale_issuers(self) -> list[str]:
        """Issuers whose last good fetch is older than AUTH_JWKS_MAX_STALE_SECONDS, after one
        refresh attempt (itself rate-limited) for each of them."""
        bound = self.max_stale_seconds
        stale = [keys for keys in self._issuers.values() if keys.stale_for() > bound]
        await asyncio.gather(*(keys.refresh() for keys in stale))
        return [keys.issuer for keys in stale if keys.stale_for() > bound]
