"""A small OpenID issuer for the verifier's own tests: discovery and a JWKS served over real HTTP
on 127.0.0.1 by the standard library's server, with keys the test adds and withdraws, every
request counted, and a switch that makes it answer 503 (the provider down).

The proof against a provider the project did not write is `tests/identity/` (oidc-provider);
this one exists to set what a real provider cannot be made to do on demand (a hostile JWKS,
an outage, a given Cache-Control).
"""

from __future__ import annotations

import base64
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import orjson
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature
from jwt.algorithms import ECAlgorithm, RSAAlgorithm

AUDIENCE = "context-memory"
_HASHES: dict[str, hashes.HashAlgorithm] = {
    "256": hashes.SHA256(),
    "384": hashes.SHA384(),
    "512": hashes.SHA512(),
}
_CURVES: dict[str, ec.EllipticCurve] = {
    "ES256": ec.SECP256R1(),
    "ES384": ec.SECP384R1(),
    "ES512": ec.SECP521R1(),
}


@dataclass
class SigningKey:
    """A private key, its `kid` and algorithm, and the public JWK the issuer publishes."""

    kid: str
    alg: str
    private_pem: str
    public_pem: str
    public_jwk: dict[str, Any]

    @classmethod
    def generate(
        cls, alg: str = "RS256", kid: str | None = None, *, rsa_bits: int = 2048
    ) -> SigningKey:
        if alg.startswith("RS"):
            private: Any = rsa.generate_private_key(public_exponent=65537, key_size=rsa_bits)
        else:
            private = ec.generate_private_key(_CURVES[alg])
        private_pem = private.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ).decode()
        public_pem = (
            private.public_key()
            .public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            )
            .decode()
        )
        as_jwk = RSAAlgorithm.to_jwk if alg.startswith("RS") else ECAlgorithm.to_jwk
        public_jwk = dict(as_jwk(private.public_key(), as_dict=True))
        kid = kid or f"{alg.lower()}-{time.monotonic_ns()}"
        public_jwk.update({"kid": kid, "use": "sig", "alg": alg})
        return cls(kid, alg, private_pem, public_pem, public_jwk)

    def sign(self, claims: dict[str, Any], **headers: Any) -> str:
        """A compact JWS of `claims` with `alg`, `typ` and `kid` (overridable) and `headers`.

        Signed here with `cryptography`, not by a JWT library, which refuses to write some of
        the hostile tokens the tests need: a `kid` that is no string, an ES256 signature by a
        P-384 key."""
        header = {"alg": self.alg, "typ": "JWT", "kid": self.kid, **headers}
        signing_input = f"{_b64(orjson.dumps(header))}.{_b64(orjson.dumps(claims))}".encode()
        private: Any = serialization.load_pem_private_key(self.private_pem.encode(), None)
        digest = _HASHES[self.alg[2:]]
        if self.alg.startswith("RS"):
            signature = private.sign(signing_input, padding.PKCS1v15(), digest)
        else:
            r, s = decode_dss_signature(private.sign(signing_input, ec.ECDSA(digest)))
            size = (private.curve.key_size + 7) // 8
            signature = r.to_bytes(size, "big") + s.to_bytes(size, "big")
        return f"{signing_input.decode()}.{_b64(signature)}"


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


@dataclass
class FakeIssuer:
    """The issuer's state, read by the HTTP handler on every request."""

    url: str = ""
    keys: list[dict[str, Any]] = field(default_factory=list)
    cache_control: str | None = "max-age=300"
    down: bool = False
    discovery_issuer: str | None = None  # what discovery claims to be; default: `url`
    requests: Counter[str] = field(default_factory=Counter)
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def jwks_uri(self) -> str:
        return f"{self.url}/jwks"

    @property
    def jwks_fetches(self) -> int:
        return self.requests["/jwks"]

    def publish(self, key: SigningKey) -> SigningKey:
        with self.lock:
            self.keys.append(key.public_jwk)
        return key

    def withdraw(self, key: SigningKey) -> None:
        with self.lock:
            self.keys = [k for k in self.keys if k.get("kid") != key.kid]

    def claims(self, **overrides: Any) -> dict[str, Any]:
        """Valid claims of this issuer for `alice`; an override of `None` removes a claim."""
        now = int(time.time())
        base: dict[str, Any] = {
            "iss": self.url,
            "sub": "alice",
            "aud": AUDIENCE,
            "iat": now,
            "exp": now + 600,
        }
        base.update(overrides)
        return {name: value for name, value in base.items() if value is not None}

    def entry(self, **overrides: Any) -> dict[str, Any]:
        """An AUTH_ISSUERS entry trusting this issuer (fixed company `acme` unless overridden)."""
        base: dict[str, Any] = {
            "issuer": self.url,
            "audiences": [AUDIENCE],
            "algorithms": ["RS256", "ES256"],
            "company": "acme",
        }
        base.update(overrides)
        return {name: value for name, value in base.items() if value is not None}


def _handler(issuer: FakeIssuer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            with issuer.lock:
                issuer.requests[self.path] += 1
                down, keys = issuer.down, list(issuer.keys)
            if down:
                self._send(503, b"{}")
            elif self.path == "/.well-known/openid-configuration":
                document = {
                    "issuer": issuer.discovery_issuer or issuer.url,
                    "jwks_uri": issuer.jwks_uri,
                }
                self._send(200, orjson.dumps(document))
            elif self.path == "/jwks":
                self._send(200, orjson.dumps({"keys": keys}), issuer.cache_control)
            else:
                self._send(404, b"{}")

        def _send(self, status: int, body: bytes, cache_control: str | None = None) -> None:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            if cache_control:
                self.send_header("Cache-Control", cache_control)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler


@contextmanager
def fake_issuer() -> Iterator[FakeIssuer]:
    """A FakeIssuer served on a free port of 127.0.0.1 for the life of the block."""
    issuer = FakeIssuer()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(issuer))
    server.daemon_threads = True
    issuer.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield issuer
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
