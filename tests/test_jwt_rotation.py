"""JWT key rotation as docs/operations.md describes it: one key per family, so a new HMAC secret
refuses the old one's tokens at once, while an allowlist of both families accepts an old HMAC
token and a new public-key token side by side until the old algorithm is dropped."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
from asgi_lifespan import LifespanManager
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from pydantic import SecretStr

from app.main import create_app
from tests.helpers.apps import TEST_JWT_SECRET, client_of, make_settings
from tests.helpers.bad_tokens import claims, header_for, signed

NEW_SECRET = "rotated-secret-" + "y" * 32


def key_pair() -> tuple[str, str]:
    """(private PEM, public PEM) of a fresh RSA key."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    private = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()
    public = (
        key.public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        .decode()
    )
    return private, public


@asynccontextmanager
async def replica(database_url: str, **overrides: Any) -> AsyncIterator[httpx.AsyncClient]:
    """An API process started with these JWT settings (a restart, as a rotation needs)."""
    application = create_app(make_settings(database_url, **overrides))
    async with LifespanManager(application), client_of(application) as http:
        yield http


async def status_of(http: httpx.AsyncClient, token: str) -> int:
    return (await http.get("/v1/me", headers=header_for(token))).status_code


async def test_a_new_hmac_secret_refuses_tokens_of_the_old_one(database_url: str) -> None:
    old_token = signed(claims(), key=TEST_JWT_SECRET)
    new_token = signed(claims(), key=NEW_SECRET)
    async with replica(database_url) as before:
        assert await status_of(before, old_token) == 200
        assert await status_of(before, new_token) == 401
    async with replica(database_url, jwt_secret=SecretStr(NEW_SECRET)) as after:
        assert await status_of(after, old_token) == 401
        assert await status_of(after, new_token) == 200


async def test_both_families_overlap_until_the_old_algorithm_is_dropped(database_url: str) -> None:
    private_pem, public_pem = key_pair()
    other_private_pem, _ = key_pair()
    old_hmac_token = signed(claims(), key=TEST_JWT_SECRET)
    new_rsa_token = signed(claims(), key=private_pem, alg="RS256")
    async with replica(
        database_url, jwt_algorithms=["HS256", "RS256"], jwt_public_key=SecretStr(public_pem)
    ) as overlapping:
        assert await status_of(overlapping, old_hmac_token) == 200
        assert await status_of(overlapping, new_rsa_token) == 200
        # still one key per family: another key pair's token is refused
        foreign = signed(claims(), key=other_private_pem, alg="RS256")
        assert await status_of(overlapping, foreign) == 401
    async with replica(
        database_url, jwt_algorithms=["RS256"], jwt_public_key=SecretStr(public_pem)
    ) as rotated:
        assert await status_of(rotated, old_hmac_token) == 401
        assert await status_of(rotated, new_rsa_token) == 200
