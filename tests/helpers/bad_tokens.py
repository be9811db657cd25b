"""The JWT rejection table: bearer headers a caller must not get past authentication with
(malformed, forged, expired, incomplete), and the token-building pieces they are made of. Every
well-formed claim set names `alice` of `acme`, so a token that got through would act as her."""

from __future__ import annotations

import base64
import hashlib
import hmac
import time
import warnings
from collections.abc import Callable
from typing import Any

import jwt
import orjson
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from tests.helpers.apps import TEST_JWT_SECRET

ISSUER, AUDIENCE = "context-memory-dev", "context-memory"


def claims(**overrides: Any) -> dict[str, Any]:
    """Valid claims for alice of acme; an override of `None` removes the claim."""
    now = int(time.time())
    base: dict[str, Any] = {
        "sub": "alice",
        "company_id": "acme",
        "iss": ISSUER,
        "aud": AUDIENCE,
        "iat": now,
        "exp": now + 600,
    }
    for key, value in overrides.items():
        if value is None:
            base.pop(key, None)
        else:
            base[key] = value
    return base


def signed(payload: dict[str, Any], key: str = TEST_JWT_SECRET, alg: str = "HS256") -> str:
    with warnings.catch_warnings():
        # a test secret shorter than HS384/HS512 ask for still signs (the verifier refuses it)
        warnings.simplefilter("ignore", jwt.InsecureKeyLengthWarning)
        return jwt.encode(payload, key, algorithm=alg)


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def unsigned_none_token() -> str:
    header = b64(orjson.dumps({"alg": "none", "typ": "JWT"}))
    return f"{header}.{b64(orjson.dumps(claims()))}."


def rsa_token() -> str:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()
    return signed(claims(), key=pem, alg="RS256")


def hmac_signed_with(secret: str) -> str:
    """An HS256 token signed by hand (PyJWT itself refuses a PEM as an HMAC secret)."""
    signing_input = (
        f"{b64(orjson.dumps({'alg': 'HS256', 'typ': 'JWT'}))}.{b64(orjson.dumps(claims()))}"
    )
    digest = hmac.new(secret.encode(), signing_input.encode(), hashlib.sha256).digest()
    return f"{signing_input}.{b64(digest)}"


def header_for(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


CASES: list[tuple[str, Callable[[], dict[str, str]]]] = [
    ("no header", dict),
    ("malformed: not bearer", lambda: {"Authorization": "Basic YWxpY2U6c2VjcmV0"}),
    ("malformed: bearer without token", lambda: {"Authorization": "Bearer"}),
    ("malformed: two tokens", lambda: {"Authorization": "Bearer a.b.c d.e.f"}),
    ("malformed: garbage", lambda: header_for("not-a-jwt")),
    ("malformed: bad base64", lambda: header_for("@@@.###.$$$")),
    ("alg none", lambda: header_for(unsigned_none_token())),
    ("alg outside allowlist (HS512)", lambda: header_for(signed(claims(), alg="HS512"))),
    ("alg outside allowlist (RS256)", lambda: header_for(rsa_token())),
    ("wrong key", lambda: header_for(signed(claims(), key="another-secret-" + "y" * 32))),
    ("expired", lambda: header_for(signed(claims(exp=int(time.time()) - 10)))),
    ("nbf in the future", lambda: header_for(signed(claims(nbf=int(time.time()) + 600)))),
    ("missing exp", lambda: header_for(signed(claims(exp=None)))),
    ("missing aud", lambda: header_for(signed(claims(aud=None)))),
    ("wrong aud", lambda: header_for(signed(claims(aud="someone-else")))),
    ("missing iss", lambda: header_for(signed(claims(iss=None)))),
    ("wrong iss", lambda: header_for(signed(claims(iss="evil-issuer")))),
    ("missing sub", lambda: header_for(signed(claims(sub=None)))),
    ("missing company_id", lambda: header_for(signed(claims(company_id=None)))),
    ("empty sub", lambda: header_for(signed(claims(sub="")))),
    ("non-string company_id", lambda: header_for(signed(claims(company_id=42)))),
    ("company_id over 128 chars", lambda: header_for(signed(claims(company_id="c" * 129)))),
    ("roles not a list", lambda: header_for(signed(claims(roles="operator")))),
    ("JWE (5 segments)", lambda: header_for("eyJhbGciOiJSU0EtT0FFUCJ9.a.b.c.d")),
    ("over 8 KiB", lambda: header_for(signed(claims(padding="x" * 9000)))),
]
"""(case, headers factory): each factory builds its headers when called, so `expired` and
`nbf` are relative to the moment of the request."""
