"""The JWT rejection table: every malformed, forged or incomplete token is the same opaque 401."""

from __future__ import annotations

from collections.abc import Callable

import httpx
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from app.kit.auth.mint import issue_token
from app.kit.config import Settings
from app.kit.principal import Principal
from tests.helpers.bad_tokens import CASES, claims, header_for, hmac_signed_with, signed


@pytest.mark.parametrize(("case", "headers"), CASES, ids=[case for case, _ in CASES])
async def test_rejected_with_opaque_401(
    client: httpx.AsyncClient, case: str, headers: Callable[[], dict[str, str]]
) -> None:
    response = await client.get("/v1/me", headers=headers())
    assert response.status_code == 401, case
    assert response.headers["www-authenticate"] == "Bearer"
    assert response.headers["content-type"] == "application/problem+json"
    body = response.json()
    assert body["detail"] == "invalid token"
    assert set(body) == {"type", "title", "status", "detail", "request_id"}


async def test_a_valid_token_passes(client: httpx.AsyncClient) -> None:
    response = await client.get("/v1/me", headers=header_for(signed(claims())))
    assert response.status_code == 200


async def test_rs256_with_public_key(database_url: str) -> None:
    """The RS256 path verifies with the configured public key and rejects HS tokens."""
    from asgi_lifespan import LifespanManager  # noqa: PLC0415

    from app.main import create_app  # noqa: PLC0415
    from tests.helpers.apps import make_settings  # noqa: PLC0415

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    private_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()
    public_pem = (
        key.public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        .decode()
    )
    settings: Settings = make_settings(
        database_url,
        jwt_algorithms=["RS256"],
        jwt_public_key=public_pem,
        jwt_private_key=private_pem,
    )
    app = create_app(settings)
    async with LifespanManager(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
            good = issue_token(settings, Principal("alice", "acme", frozenset()))
            assert (await http.get("/v1/me", headers=header_for(good))).status_code == 200
            hs = signed(claims())  # HS256 with the test secret: not in this allowlist
            assert (await http.get("/v1/me", headers=header_for(hs))).status_code == 401
            # algorithm confusion: the public key used as an HMAC secret
            confused = hmac_signed_with(public_pem)
            assert (await http.get("/v1/me", headers=header_for(confused))).status_code == 401
