"""Verified tokens are remembered until their `exp`, by their exact bytes, in a bounded LRU; a
token that fails is never remembered."""

from __future__ import annotations

import time

import pytest
from pydantic import SecretStr

from app.kit.auth.mint import issue_token
from app.kit.auth.verify import TokenVerifier
from app.kit.config import Settings
from app.kit.errors import Unauthorized
from app.kit.principal import Principal
from tests.helpers.apps import TEST_JWT_SECRET


class Clock:
    """The verifier's clock for cache expiry (PyJWT still checks `exp` against real time)."""

    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


def settings(**overrides: object) -> Settings:
    values: dict[str, object] = {"environment": "test", "jwt_secret": SecretStr(TEST_JWT_SECRET)}
    values.update(overrides)
    return Settings(_env_file=None, **values)  # type: ignore[arg-type]


def token(sub: str = "alice", ttl: int = 600) -> str:
    return issue_token(settings(), Principal(sub, "acme", frozenset()), ttl_seconds=ttl)


async def test_a_verified_token_is_answered_from_the_cache() -> None:
    verifier = TokenVerifier(settings())
    tok = token()
    first = await verifier.verify(tok)
    assert first.user_id == "alice"
    assert await verifier.verify(tok) is first
    assert verifier.cached_tokens == 1


async def test_a_cached_token_expires_with_its_exp() -> None:
    clock = Clock()
    verifier = TokenVerifier(settings(), clock=clock)
    tok = token(ttl=60)
    cached = await verifier.verify(tok)
    clock.now += 30
    assert await verifier.verify(tok) is cached
    clock.now += 31  # past exp by the verifier's clock: verified from scratch, not served
    assert await verifier.verify(tok) is not cached


async def test_a_token_that_fails_is_never_cached() -> None:
    verifier = TokenVerifier(settings())
    good = token()
    forged = good[:-2] + ("AA" if not good.endswith("AA") else "BB")
    await verifier.verify(good)
    for _ in range(2):
        with pytest.raises(Unauthorized):
            await verifier.verify(forged)
    assert verifier.cached_tokens == 1


async def test_a_token_differing_in_one_byte_is_not_the_cached_one() -> None:
    verifier = TokenVerifier(settings())
    good = token()
    await verifier.verify(good)
    header, _, signature = good.split(".")
    other_claims = issue_token(settings(), Principal("mallory", "acme", frozenset())).split(".")[1]
    with pytest.raises(Unauthorized):
        await verifier.verify(f"{header}.{other_claims}.{signature}")


async def test_the_cache_keeps_the_most_recently_used_tokens() -> None:
    verifier = TokenVerifier(settings(jwt_cache_size=2))
    a, b, c = token("a"), token("b"), token("c")
    principal_a = await verifier.verify(a)
    principal_b = await verifier.verify(b)
    assert await verifier.verify(a) is principal_a  # a is now the most recent
    await verifier.verify(c)  # evicts b, the least recently used
    assert verifier.cached_tokens == 2
    assert await verifier.verify(a) is principal_a
    assert await verifier.verify(b) is not principal_b


async def test_a_cache_size_of_zero_verifies_every_time() -> None:
    verifier = TokenVerifier(settings(jwt_cache_size=0))
    tok = token()
    assert await verifier.verify(tok) is not (await verifier.verify(tok))
    assert verifier.cached_tokens == 0
