"""Hostile tokens at an app that trusts OpenID issuers: forged algorithms and keys, headers that
say where a key is, claims that are not what they look like, companies another issuer owns.
Every one is the same opaque 401, the service fetches keys only from the trusted issuer, and a
flood of invented `kid`s costs at most one JWKS fetch."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import secrets
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, replace
from typing import Any

import httpx
import jwt
import orjson
import pytest

from tests.helpers import bad_tokens
from tests.helpers.apps import client_with
from tests.helpers.jwks_server import FakeIssuer, SigningKey, fake_issuer


@dataclass(frozen=True)
class Scene:
    """Two trusted issuers, an attacker's server, and a client of the app that trusts the two.

    `trusted` owns company `acme` and publishes `rsa` and `ec` (its signing keys), `rsa_twin`
    (a second RS256 key), `p384` (a P-384 key that says ES256), `rs512` (an RSA key that says
    RS512) and `enc` (an RSA key for encryption). `claimed` reads the company from `org` and the
    roles from `roles`. `attacker` is trusted by nobody and serves `forged`, which nobody
    publishes.
    """

    trusted: FakeIssuer
    claimed: FakeIssuer
    attacker: FakeIssuer
    rsa: SigningKey
    ec: SigningKey
    p384: SigningKey
    rs512: SigningKey
    enc: SigningKey
    claimed_key: SigningKey
    forged: SigningKey
    http: httpx.AsyncClient


@pytest.fixture(scope="module")
async def scene(database_url: str) -> AsyncIterator[Scene]:
    rsa = SigningKey.generate("RS256", "rsa")
    ec = SigningKey.generate("ES256", "ec")
    rsa_twin = SigningKey.generate("RS256", "rsa-twin")
    p384 = SigningKey.generate("ES384", "p384")
    p384 = replace(p384, alg="ES256", public_jwk={**p384.public_jwk, "alg": "ES256"})
    rs512 = SigningKey.generate("RS256", "rs512")
    rs512 = replace(rs512, public_jwk={**rs512.public_jwk, "alg": "RS512"})
    enc = SigningKey.generate("RS256", "enc")
    enc = replace(enc, public_jwk={**enc.public_jwk, "use": "enc"})
    claimed_key = SigningKey.generate("RS256", "claimed")
    forged = SigningKey.generate("RS256", "forged")
    with fake_issuer() as trusted, fake_issuer() as claimed, fake_issuer() as attacker:
        for key in (rsa, ec, rsa_twin, p384, rs512, enc):
            trusted.publish(key)
        claimed.publish(claimed_key)
        attacker.publish(forged)
        issuers = [
            trusted.entry(),
            claimed.entry(company=None, company_claim="org", roles_claim="roles"),
        ]
        async with client_with(
            database_url, auth_issuers=issuers, auth_jwks_refresh_interval_seconds=3600
        ) as http:
            yield Scene(
                trusted, claimed, attacker, rsa, ec, p384, rs512, enc, claimed_key, forged, http
            )


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def hmac_signed(claims: dict[str, Any], secret: bytes, kid: str) -> str:
    """An HS256 token signed by hand (PyJWT refuses a public key as an HMAC secret)."""
    header = {"alg": "HS256", "typ": "JWT", "kid": kid}
    signing_input = f"{b64(orjson.dumps(header))}.{b64(orjson.dumps(claims))}"
    digest = hmac.new(secret, signing_input.encode(), hashlib.sha256).digest()
    return f"{signing_input}.{b64(digest)}"


def unsigned(claims: dict[str, Any], kid: str) -> str:
    header = {"alg": "none", "typ": "JWT", "kid": kid}
    return f"{b64(orjson.dumps(header))}.{b64(orjson.dumps(claims))}."


def signed_payload(key: SigningKey, payload: bytes) -> str:
    """A token over exactly `payload` (JSON that Python would not write, such as `1e400`)."""
    return jwt.api_jws.encode(payload, key.private_pem, algorithm=key.alg, headers={"kid": key.kid})


def with_literal(claims: dict[str, Any], name: str, literal: bytes) -> bytes:
    """`claims` as JSON with `name` set to the raw JSON `literal`."""
    rest = orjson.dumps({key: value for key, value in claims.items() if key != name})
    return b'{"' + name.encode() + b'":' + literal + b"," + rest[1:]


def without_kid(key: SigningKey, claims: dict[str, Any]) -> str:
    return jwt.encode(claims, key.private_pem, algorithm=key.alg)


def invented_kid(claims: dict[str, Any]) -> str:
    """An RS256 token naming a random `kid`, with random bytes for a signature."""
    header = {"alg": "RS256", "typ": "JWT", "kid": f"invented-{secrets.token_hex(8)}"}
    signature = secrets.token_bytes(256)
    return f"{b64(orjson.dumps(header))}.{b64(orjson.dumps(claims))}.{b64(signature)}"


def trusted_rsa(**claims: Any) -> Callable[[Scene], str]:
    """A token the trusted issuer's own RSA key signs, with `claims` changed."""
    return lambda s: s.rsa.sign(s.trusted.claims(**claims))


def of_claimed(**claims: Any) -> Callable[[Scene], str]:
    """A token the company-claim issuer signs for `alice` of `globex`, with `claims` changed."""
    return lambda s: s.claimed_key.sign(s.claimed.claims(**{"org": "globex", **claims}))


CASES: list[tuple[str, Callable[[Scene], str]]] = [
    (
        "HS256 signed with the issuer's RSA public key PEM",
        lambda s: hmac_signed(s.trusted.claims(), s.rsa.public_pem.encode(), s.rsa.kid),
    ),
    (
        "HS256 signed with the issuer's public JWK as JSON",
        lambda s: hmac_signed(s.trusted.claims(), orjson.dumps(s.rsa.public_jwk), s.rsa.kid),
    ),
    ("alg none with the issuer's iss", lambda s: unsigned(s.trusted.claims(), s.rsa.kid)),
    (
        "signed by an unpublished key naming a published kid",
        lambda s: s.forged.sign(s.trusted.claims(), kid=s.rsa.kid),
    ),
    (
        "RS256 whose kid names the EC key",
        lambda s: s.rsa.sign(s.trusted.claims(), kid=s.ec.kid),
    ),
    ("ES256 whose kid names a P-384 key", lambda s: s.p384.sign(s.trusted.claims())),
    ("RS256 with a key whose JWK says RS512", lambda s: s.rs512.sign(s.trusted.claims())),
    ("RS256 with a key published for encryption", lambda s: s.enc.sign(s.trusted.claims())),
    (
        "jku naming the attacker's server that serves the signing key",
        lambda s: s.forged.sign(s.trusted.claims(), jku=s.attacker.jwks_uri),
    ),
    (
        "x5u naming the attacker's server",
        lambda s: s.forged.sign(s.trusted.claims(), x5u=f"{s.attacker.url}/cert.pem"),
    ),
    (
        "embedded jwk carrying the attacker's key",
        lambda s: s.forged.sign(s.trusted.claims(), jwk=s.forged.public_jwk),
    ),
    (
        "jku naming the trusted issuer's own JWKS",
        lambda s: s.rsa.sign(s.trusted.claims(), jku=s.trusted.jwks_uri),
    ),
    (
        "x5u on a token the issuer signed",
        lambda s: s.rsa.sign(s.trusted.claims(), x5u=f"{s.trusted.url}/cert.pem"),
    ),
    (
        "embedded jwk of the issuer's own key",
        lambda s: s.rsa.sign(s.trusted.claims(), jwk=s.rsa.public_jwk),
    ),
    ("crit header", lambda s: s.rsa.sign(s.trusted.claims(), crit=["exp"])),
    ("kid that is not a string", lambda s: s.rsa.sign(s.trusted.claims(), kid=7)),
    (
        "no kid while two published keys fit the algorithm",
        lambda s: without_kid(s.rsa, s.trusted.claims()),
    ),
    ("wrong audience", trusted_rsa(aud="someone-else")),
    ("no aud", trusted_rsa(aud=None)),
    ("aud list without ours", trusted_rsa(aud=["someone-else", "another"])),
    ("expired", lambda s: s.rsa.sign(s.trusted.claims(exp=int(time.time()) - 10))),
    (
        "exp 1e400",
        lambda s: signed_payload(s.rsa, with_literal(s.trusted.claims(), "exp", b"1e400")),
    ),
    (
        "nbf 1e400",
        lambda s: signed_payload(s.rsa, with_literal(s.trusted.claims(), "nbf", b"1e400")),
    ),
    (
        "exp of four hundred digits",
        lambda s: signed_payload(s.rsa, with_literal(s.trusted.claims(), "exp", b"9" * 400)),
    ),
    ("exp as a string", trusted_rsa(exp="9999999999")),
    ("exp true", trusted_rsa(exp=True)),
    (
        "iss of the trusted issuer with a trailing slash",
        lambda s: s.rsa.sign(s.trusted.claims(iss=f"{s.trusted.url}/")),
    ),
    ("iss that is a list", lambda s: s.rsa.sign(s.trusted.claims(iss=[s.trusted.url]))),
    ("iss that is an object", lambda s: s.rsa.sign(s.trusted.claims(iss={"url": "x"}))),
    ("missing user claim", trusted_rsa(sub=None)),
    ("empty user claim", trusted_rsa(sub="")),
    ("non-string user claim", trusted_rsa(sub=42)),
    ("user claim of 257 characters", trusted_rsa(sub="u" * 257)),
    ("company claim owned by another issuer", of_claimed(org="acme")),
    ("company claim that is a number", of_claimed(org=42)),
    ("company claim that is a list", of_claimed(org=["globex"])),
    ("company claim that is an object", of_claimed(org={"id": "globex"})),
    ("roles claim that is a number", of_claimed(roles=7)),
    (
        "static HS256 token for a company an issuer owns",
        lambda s: bad_tokens.signed(bad_tokens.claims()),
    ),
]
"""(case, token factory): each factory builds its token when called, so `exp` is relative to the
moment of the request."""


@pytest.mark.parametrize(("case", "token"), CASES, ids=[case for case, _ in CASES])
async def test_a_hostile_token_is_the_same_opaque_401(
    scene: Scene, case: str, token: Callable[[Scene], str]
) -> None:
    response = await scene.http.get("/v1/me", headers=bearer(token(scene)))

    assert response.status_code == 401, (case, response.text)
    assert response.headers["www-authenticate"] == "Bearer"
    assert response.headers["content-type"] == "application/problem+json"
    assert response.json()["detail"] == "invalid token"
    assert sum(scene.attacker.requests.values()) == 0  # never fetched from where a token says


async def test_tokens_the_trusted_issuer_signs_with_either_key_pass(scene: Scene) -> None:
    for key in (scene.rsa, scene.ec):
        response = await scene.http.get("/v1/me", headers=bearer(key.sign(scene.trusted.claims())))
        assert response.status_code == 200, response.text
        assert response.json() == {"user_id": "alice", "company_id": "acme", "roles": []}


async def test_a_user_claim_of_256_characters_passes(scene: Scene) -> None:
    token = scene.rsa.sign(scene.trusted.claims(sub="u" * 256))

    response = await scene.http.get("/v1/me", headers=bearer(token))

    assert response.status_code == 200, response.text
    assert response.json()["user_id"] == "u" * 256


async def test_a_company_claim_no_issuer_owns_passes(scene: Scene) -> None:
    token = scene.claimed_key.sign(scene.claimed.claims(org="globex", roles=["space_admin"]))

    response = await scene.http.get("/v1/me", headers=bearer(token))

    assert response.status_code == 200, response.text
    assert response.json() == {"user_id": "alice", "company_id": "globex", "roles": ["space_admin"]}


async def test_a_static_token_for_a_company_no_issuer_owns_passes(scene: Scene) -> None:
    token = bad_tokens.signed(bad_tokens.claims(company_id="globex"))

    response = await scene.http.get("/v1/me", headers=bearer(token))

    assert response.status_code == 200, response.text
    assert response.json()["company_id"] == "globex"


async def test_a_flood_of_invented_kids_costs_at_most_one_jwks_fetch_and_each_is_refused(
    database_url: str,
) -> None:
    key = SigningKey.generate("RS256", "real")
    with fake_issuer() as issuer:
        issuer.publish(key)
        async with client_with(
            database_url,
            auth_issuers=[issuer.entry()],
            auth_jwks_refresh_interval_seconds=3600,
        ) as http:
            before = issuer.jwks_fetches
            tokens = [invented_kid(issuer.claims()) for _ in range(300)]
            responses = await asyncio.gather(
                *(http.get("/v1/me", headers=bearer(t)) for t in tokens)
            )
            after_flood = issuer.jwks_fetches
            valid = await http.get("/v1/me", headers=bearer(key.sign(issuer.claims())))

    assert before == 1  # the start-up fetch
    assert Counter(response.status_code for response in responses) == {401: 300}
    assert after_flood - before <= 1
    assert valid.status_code == 200, valid.text
